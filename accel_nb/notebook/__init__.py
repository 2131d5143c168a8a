"""The notebook face: ``notebook_launcher``, the ``%%accelerate`` magics and the widgets.

Modules are imported on use; importing this package pulls in neither IPython nor ipywidgets.
"""
