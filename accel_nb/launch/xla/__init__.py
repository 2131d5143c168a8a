"""Launching on XLA devices: the host process that runs ``torch_xla.launch`` and each ordinal's side.

``launcher`` (parent side: plan choices, the host process), ``ordinal`` (one XLA ordinal's run inside the host).
"""
