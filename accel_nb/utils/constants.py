"""Shim at the reference's ``accelerate.utils.constants`` path: checkpoint file names both libraries use.

    from accel_nb.utils.constants import SAFE_WEIGHTS_NAME, OPTIMIZER_NAME

The values are the file names ``save_model`` and ``save_state`` give the weights, optimizers,
schedulers and scaler. accel_nb keeps RNG and sampler states in ``rank_<i>.pt``, so the reference's
``RNG_STATE_NAME`` / ``SAMPLER_NAME`` are not here; neither are most of its version gates and launcher
tables (docs/migration.md lists them; the beta-feature gates and the upcasting layers are here).
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
# the reference's version gates of its beta parallelism features, with its values (code written for it
# reads them in skip conditions); accel_nb needs torch 2.9, which passes the torch ones everywhere
BETA_TP_AVAILABLE_PYTORCH_VERSION = "2.3.0"
BETA_TP_AVAILABLE_TRANSFORMERS_VERSION = "4.52.0"
BETA_CP_AVAILABLE_PYTORCH_VERSION = "2.6.0"
BETA_SP_AVAILABLE_DEEPSPEED_VERSION = "0.18.2"

__all__ = [
    "BETA_CP_AVAILABLE_PYTORCH_VERSION",
    "BETA_SP_AVAILABLE_DEEPSPEED_VERSION",
    "BETA_TP_AVAILABLE_PYTORCH_VERSION",
    "BETA_TP_AVAILABLE_TRANSFORMERS_VERSION",
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
_LAZY = {
    "STR_OPERATION_TO_FUNC": "accel_nb.availability",
    # the layers layerwise casting casts (torch.nn classes: read on first use, so this module stays light)
    "SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING": "accel_nb.big_model.layerwise_casting",
}
__all__ += sorted(_LAZY)
__getattr__, __dir__ = lazy_exports(globals(), _LAZY)
