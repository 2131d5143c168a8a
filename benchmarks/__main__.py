"""``python -m benchmarks run [NAME...] [--quick] [--repeat K] [--markdown docs/benchmarks.md]``."""

import sys

from benchmarks.runner import main

sys.exit(main())
