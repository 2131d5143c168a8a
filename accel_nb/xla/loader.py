"""Feeding a prepared data loader's batches to an XLA device through torch_xla's parallel loader.

``DataLoaderShard`` (``accel_nb.data``) keeps sharding, resumption and ``end_of_dataloader`` in the
training thread; on an XLA device it hands each pass of host batches to
``torch_xla.distributed.parallel_loader.MpDeviceLoader``, whose background threads upload the
next batches while the device trains on this one.

    for batch in device_feed(iter(host_loader), torch_xla.device()):
        ...                                  # batch is on the XLA device
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from . import runtime

__all__ = ["device_feed"]


class _OnePass:
    """An iterable over one pass that has already started (torch_xla's loader thread calls ``iter`` on it)."""

    def __init__(self, batches: Iterator[Any]) -> None:
        self._batches = batches

    def __iter__(self) -> Iterator[Any]:
        return self._batches


def device_feed(batches: Iterator[Any], device: Any) -> Iterator[Any]:
    """``batches`` (host tensors) uploaded to ``device`` by ``MpDeviceLoader``, in order.

    Before each batch the device's pending graph (the previous step) is compiled and launched
    under the graph lock: the parallel loader marks that step itself, but unlocked, which on XLA's
    CPU backend (devices as threads) could compile a graph with a collective in two threads at
    once. Its own mark then finds nothing left to run.
    """
    from torch_xla.distributed.parallel_loader import MpDeviceLoader

    per_device = iter(MpDeviceLoader(_OnePass(batches), device))
    try:
        while True:
            runtime.sync()
            try:
                batch = next(per_device)
            except StopIteration:
                return
            yield batch
    finally:
        parallel = getattr(per_device, "_loader", None)  # the ParallelLoader: stop its threads
        if parallel is not None and hasattr(parallel, "close"):
            parallel.close()
