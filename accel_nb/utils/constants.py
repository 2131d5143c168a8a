"""Shim at the reference's ``accelerate.utils.constants`` path: checkpoint file names both libraries use.

    from accel_nb.utils.constants import SAFE_WEIGHTS_NAME, OPTIMIZER_NAME

The values are the file names ``save_model`` and ``save_state`` give the weights, optimizers,
schedulers and scaler. accel_nb keeps RNG and sampler states in ``rank_<i>.pt``, so the reference's
``RNG_STATE_NAME`` / ``SAMPLER_NAME`` are not here; neither are its version gates and launcher
tables (docs/migration.md lists them).
"""

from __future__ import annotations

from ..lazy_exports import lazy_exports

MODEL_NAME = "pytorch_model"
SAFE_MODEL_NAME = "model"
WEIGHTS_NAME = f"{MODEL_NAME}.bin"
WEIGHTS_PATTERN_NAME = "pytorch_model{suffix}.bin"
WEIGHTS_INDEX_NAME = f"{WEIGHTS_NAME}.index.json"
SAFE_WEIGHTS_NAME = f"{SAFE_MODEL_NAME}.safetensors"
SAFE_WEIGHTS_PATTERN_NAME = "model{suffix}.safetensors"
SAFE_WEIGHTS_INDEX_NAME = f"{SAFE_WEIGHTS_NAME}.index.json"
OPTIMIZER_NAME = "optimizer"
SCHEDULER_NAME = "scheduler"
SCALER_NAME = "scaler.pt"
PROFILE_PATTERN_NAME = "profile_{suffix}.json"
TORCH_DYNAMO_MODES = ["default", "reduce-overhead", "max-autotune"]

__all__ = [
    "MODEL_NAME",
    "OPTIMIZER_NAME",
    "PROFILE_PATTERN_NAME",
    "SAFE_MODEL_NAME",
    "SAFE_WEIGHTS_INDEX_NAME",
    "SAFE_WEIGHTS_NAME",
    "SAFE_WEIGHTS_PATTERN_NAME",
    "SCALER_NAME",
    "SCHEDULER_NAME",
    "TORCH_DYNAMO_MODES",
    "WEIGHTS_INDEX_NAME",
    "WEIGHTS_NAME",
    "WEIGHTS_PATTERN_NAME",
]

# the version comparison table is compare_versions' (accel_nb.availability), read on first use
_LAZY = {"STR_OPERATION_TO_FUNC": "accel_nb.availability"}
__all__ += sorted(_LAZY)
__getattr__, __dir__ = lazy_exports(globals(), _LAZY)
