"""Shim at the reference's ``accelerate.big_modeling`` path; the code lives in ``accel_nb.big_model``.

Build empty, dispatch, offload:

    from accel_nb.big_modeling import init_empty_weights, load_checkpoint_and_dispatch

Nothing is defined here; each name is the one implementation in ``accel_nb.big_model`` (or
``accel_nb.big_model.model_hooks`` for ``cpu_offload_with_hook``), imported on first use.
``attach_layerwise_casting_hooks`` is in ``accel_nb.big_model.layerwise_casting``.
"""

from __future__ import annotations

from typing import Any

from .lazy_exports import lazy_exports
from .reexports import reexports

_EXPORTS = {
    "init_empty_weights": "accel_nb.big_model",
    "init_on_device": "accel_nb.big_model",
    "cpu_offload": "accel_nb.big_model",
    "disk_offload": "accel_nb.big_model",
    "dispatch_model": "accel_nb.big_model",
    "load_checkpoint_and_dispatch": "accel_nb.big_model",
    "cpu_offload_with_hook": "accel_nb.big_model.model_hooks",
    "attach_layerwise_casting_hooks": "accel_nb.big_model.layerwise_casting",
}

__all__ = sorted(_EXPORTS)


def _refuse_recurrent_layers_under_sequence_parallelism(model: Any) -> None:
    """The reference's private check, by its name: ``accel_nb.parallel.context_parallel.check_recurrent_layers``."""
    from .parallel.context_parallel import check_recurrent_layers  # deferred: torch.distributed

    check_recurrent_layers(model)


__getattr__, __dir__ = lazy_exports(globals(), {**reexports(__name__), **_EXPORTS})
