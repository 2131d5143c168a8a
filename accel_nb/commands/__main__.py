"""``python -m accel_nb.commands``: the ``accel-nb`` command without the console script."""

import sys

from .main import main

sys.exit(main())
