"""accel_nb on XLA devices (TPU cores, or XLA's CPU backend for tests) through torch_xla.

Nothing here imports torch_xla at import time: ``runtime`` is read by ``accel_nb.state`` on every
run, and torch_xla is imported only once ``PartialState`` chooses XLA devices
(``runtime.use_xla``). ``collectives`` maps accel_nb's ops onto XLA collectives, ``loader`` feeds
prepared data loaders through torch_xla's parallel loader, ``training`` holds the optimizer-step
and checkpoint helpers. Install with ``pip install accel_nb[xla]`` (torch_xla pins its torch).

    from accel_nb.xla import runtime
    runtime.in_use()      # False unless this run's PartialState is on XLA devices
"""
