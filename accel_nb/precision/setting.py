"""The one rule for a mixed-precision setting: which spellings are accepted, what they mean.

Light on purpose (no torch): the launch config, the launcher's plan, ``AcceleratorState`` and
``PrecisionPolicy`` all read a user's ``mixed_precision`` through :func:`validate_mixed_precision`.

    validate_mixed_precision("BF16")     # 'bf16'
    validate_mixed_precision(False)      # 'no' (YAML reads an unquoted `no` as False)
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

MIXED_PRECISION_CHOICES = ("no", "fp16", "bf16", "fp8")

# None and False are how "no" arrives from code defaults and from YAML's unquoted `no`
_SPELLINGS: dict[Any, str] = {
    None: "no",
    False: "no",
    "no": "no",
    "fp16": "fp16",
    "bf16": "bf16",
    "fp8": "fp8",
}
_WHY_NOT = {
    "fp32": "full precision is spelled 'no'",
    "none": "no mixed precision is spelled 'no'",
}


def validate_mixed_precision(value: Any) -> str:
    """Normalise a mixed-precision setting to 'no', 'fp16', 'bf16' or 'fp8'; ValueError naming the value otherwise.

    validate_mixed_precision(" fp16 ")   # 'fp16'
    """
    key = value.strip().lower() if isinstance(value, str) else value
    try:
        return _SPELLINGS[key]
    except (KeyError, TypeError):
        pass
    why = _WHY_NOT.get(key) if isinstance(key, str) else None
    raise ValueError(
        f"mixed_precision={value!r} is not supported"
        + (f" ({why})" if why else "")
        + f"; choose one of {', '.join(MIXED_PRECISION_CHOICES)}"
    )


def offered_mixed_precisions() -> tuple[str, ...]:
    """The settings a questionnaire offers on this machine: 'fp8' only where an FP8 library is installed
    (torchao runs it; see docs/fp8.md).

        offered_mixed_precisions()   # ('no', 'fp16', 'bf16', 'fp8') with torchao installed
    """
    from ..availability import is_fp8_available  # deferred: reads package metadata

    return MIXED_PRECISION_CHOICES if is_fp8_available() else MIXED_PRECISION_CHOICES[:-1]


def bf16_gpu_problem(gpus: Iterable[Any]) -> str | None:
    """Why bf16 cannot run on these GPUs (the first one without it), or None when every one has it.

    Each GPU is an ``accel_nb.hardware.GPUInfo`` (``index``, ``name``, ``compute_capability``, ``bf16``).

        bf16_gpu_problem(hardware.gpu_info())   # None on an A100; a sentence naming a T4
    """
    for gpu in gpus:
        if not gpu.bf16:
            major, minor = gpu.compute_capability
            return (
                f"GPU {gpu.index} ({gpu.name}, compute capability {major}.{minor}) does not support bf16; "
                "it needs compute capability 8.0 or newer"
            )
    return None


def check_xla_mixed_precision(mixed_precision: str) -> None:
    """Raise a clear error for a mixed precision XLA devices cannot run (fp16); 'no' and 'bf16' pass.

    check_xla_mixed_precision("bf16")    # fine: autocast to bf16 on the XLA device
    """
    if mixed_precision == "fp8":
        raise ValueError(
            "mixed_precision='fp8' is not supported on XLA devices (TPU cores); use 'bf16' or 'no'"
        )
    if mixed_precision == "fp16":
        raise ValueError(
            "mixed_precision='fp16' is not supported on XLA devices (TPUs compute in bf16, and accel_nb has "
            "no fp16 loss scaling for XLA); use mixed_precision='bf16' (same range as fp32, no scaler) or 'no'"
        )
