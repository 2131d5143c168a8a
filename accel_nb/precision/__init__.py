"""Mixed precision: the one rule for a ``mixed_precision`` setting, and the policy that applies it.

- ``setting``: which spellings are accepted and what they mean (no torch: the launch config, the
  launcher's plan and ``AcceleratorState`` read a user's setting through it)
- ``policy``: ``PrecisionPolicy``, which autocast dtype and grad scaler a run uses, on which device
- ``fp8_recipes`` / ``fp8``: the FP8 recipes (``AORecipeKwargs`` ...) and torchao's float8 training

Names resolve lazily, so reading the setting rule does not import torch.

    from accel_nb.precision import PrecisionPolicy, validate_mixed_precision
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..lazy_exports import lazy_exports

_EXPORTS: dict[str, str] = {
    **dict.fromkeys(["PrecisionPolicy", "check_mixed_precision_supported"], ".policy"),
    # the reference's forward wrapper (accel_nb.utils has it too): one function, at home in accel_nb.nested
    "convert_outputs_to_fp32": "..nested",
    **dict.fromkeys(
        [
            "MIXED_PRECISION_CHOICES",
            "bf16_gpu_problem",
            "check_xla_mixed_precision",
            "offered_mixed_precisions",
            "validate_mixed_precision",
        ],
        ".setting",
    ),
}

__all__ = [
    "MIXED_PRECISION_CHOICES",
    "PrecisionPolicy",
    "bf16_gpu_problem",
    "check_mixed_precision_supported",
    "check_xla_mixed_precision",
    "convert_outputs_to_fp32",
    "offered_mixed_precisions",
    "validate_mixed_precision",
]

__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)

if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from ..nested import convert_outputs_to_fp32
    from .policy import PrecisionPolicy, check_mixed_precision_supported
    from .setting import (
        MIXED_PRECISION_CHOICES,
        bf16_gpu_problem,
        check_xla_mixed_precision,
        offered_mixed_precisions,
        validate_mixed_precision,
    )
