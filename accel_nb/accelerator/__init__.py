"""The Accelerator and its parts; ``accel_nb.accelerator`` is also the reference's ``accelerate.accelerator`` path.

Names resolve lazily, so importing one part (``accel_nb.accelerator.optim``) does not import the
Accelerator and all it needs. Mixed precision is ``accel_nb.precision``, torch.compile
``accel_nb.compile`` (a back-end behind ``prepare`` like ``fsdp/`` and ``deepspeed/``).

- ``accelerator``: the ``Accelerator`` class, the training core (prepare, backward, accumulate, …)
- ``options``: its constructor options (kwargs handlers, project configuration)
- ``views``: what it shows of the shared state (process index, device, main_process_first, …)
- ``weights``: ``get_state_dict`` and the save/load pre-hooks
- ``sync_contexts``: ``trigger_sync_in_backward``, ``join_uneven_inputs``
- ``resources``: ``free_memory`` and ``profile``
- ``reporting``: collectives (``gather``, ``gather_for_metrics``, ``reduce``, …), ``log`` and the trackers
- ``backends``: the training back-ends (DDP, FSDP2, DeepSpeed, the TP/CP/PP layout, XLA), one module each,
  chosen once per Accelerator (``accelerator.backend``); docs/backends.md says how one is added
- ``model_wrapping`` / ``unwrap``: the "prepared" mark and the autocast forward, and how ``unwrap_model`` undoes prepare
- ``optim``: prepared optimizers and LR schedulers
- ``gradient_state``: ``GradientState``, the shared state of gradient accumulation (``accel_nb.state`` exports it)

    from accel_nb.accelerator import Accelerator
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..lazy_exports import lazy_exports
from ..reexports import reexports

_EXPORTS: dict[str, str] = {
    "Accelerator": ".accelerator",
    "AcceleratedOptimizer": ".optim",
    "AcceleratedScheduler": ".optim",
    # the reference's accelerate.accelerator has the state classes in its namespace too
    "AcceleratorState": "..state",
    "DistributedType": "..state",
    "GradientState": "..state",
    "PartialState": "..state",
}

__all__ = ["Accelerator", "AcceleratedOptimizer", "AcceleratedScheduler"]

__getattr__, __dir__ = lazy_exports(globals(), {**reexports(__name__), **_EXPORTS})

if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from .accelerator import Accelerator
    from .optim import AcceleratedOptimizer, AcceleratedScheduler
