"""The script face: the ``accel-nb`` command (``main`` parses and dispatches; one module per subcommand).

    accel-nb config | accel-nb env | accel-nb launch --num_processes 2 train.py
    python -m accel_nb.commands launch ...       # the same, without the console script

The core (``accel_nb.config``) holds what both faces use; nothing here is imported by the notebook face.
"""
