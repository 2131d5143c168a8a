"""A launch's live view in a notebook cell: the progress widget and what it is made of.

``progress_widget`` (``WidgetReporter``: a bar per rank, the aggregate line, failures, output panes),
``progress_html`` (its HTML), ``log_panes`` (the per-rank output panes), ``full_log`` (a kept log shown
whole), ``metric_chart`` (logged metrics as live curves) and ``kernel_restart`` (what the view says
when its kernel restarts or goes away). Modules are imported on use: importing this package pulls
in neither IPython nor ipywidgets.
"""
