"""Mixed-precision policy: which autocast dtype, whether a grad scaler is needed, on which device.

Everything here is torch's own ``torch.autocast`` and ``torch.amp.GradScaler``; this module only
decides how to use them and says clearly when a device cannot.

    policy = PrecisionPolicy("bf16", torch.device("cpu"))
    with policy.autocast():
        loss = model(x).sum()
"""

from __future__ import annotations

import contextlib
import functools
import types
from typing import Any

import torch

from ..nested import convert_to_fp32
from .setting import validate_mixed_precision

__all__ = ["PrecisionPolicy", "check_mixed_precision_supported"]

# fp8: torchao's Float8Linear layers (accel_nb.precision.fp8), the rest of the forward under bf16 autocast
_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp8": torch.bfloat16}


def check_mixed_precision_supported(mixed_precision: str, device: torch.device) -> None:
    """Raise a clear error when ``device`` cannot run ``mixed_precision``."""
    if mixed_precision != "bf16" or device.type != "cuda":
        return
    if not torch.cuda.is_bf16_supported():
        index = device.index if device.index is not None else torch.cuda.current_device()
        name = torch.cuda.get_device_name(index)
        major, minor = torch.cuda.get_device_capability(index)
        raise ValueError(
            f"mixed_precision='bf16' is not supported by GPU {index} ({name}, compute capability "
            f"{major}.{minor}); use fp16 or no"
        )


class PrecisionPolicy:
    """Autocast and gradient scaling for one run: ``no``, ``fp16``, ``bf16`` or ``fp8`` (bf16 autocast around
    the float8 layers) on one device type."""

    def __init__(
        self, mixed_precision: Any, device: torch.device, autocast_kwargs: dict[str, Any] | None = None
    ) -> None:
        self.mixed_precision = validate_mixed_precision(mixed_precision)
        self.autocast_kwargs = dict(autocast_kwargs or {})  # AutocastKwargs' enabled / cache_enabled
        self.device = torch.device(device)
        check_mixed_precision_supported(self.mixed_precision, self.device)
        self.dtype = _DTYPES.get(self.mixed_precision)

    @property
    def enabled(self) -> bool:
        return self.dtype is not None

    def autocast(self, **kwargs: Any) -> contextlib.AbstractContextManager[Any]:
        """``torch.autocast`` for this device and dtype (a null context for ``no``), with the run's
        ``AutocastKwargs`` unless ``kwargs`` say otherwise."""
        if not self.enabled:
            return contextlib.nullcontext()
        kwargs = {**self.autocast_kwargs, **kwargs}
        kwargs.setdefault("dtype", self.dtype)
        return torch.autocast(device_type=self.device.type, **kwargs)

    def make_grad_scaler(self, **kwargs: Any) -> torch.amp.GradScaler | None:
        """torch's GradScaler for fp16 (None otherwise: bf16 has the range of fp32)."""
        if self.mixed_precision != "fp16":
            return None
        return torch.amp.GradScaler(self.device.type, **kwargs)

    def wrap_forward(self, forward: Any) -> Any:
        """``forward`` run under autocast, with half-precision outputs returned as fp32.

        A bound method stays a method of its module, so ``copy.deepcopy(model)`` gives a copy whose
        forward runs the copy (not the original).
        """
        policy = self
        func = getattr(forward, "__func__", None)
        owner = getattr(forward, "__self__", None)
        if func is not None and owner is not None:

            @functools.wraps(func)
            def method_in_autocast(module: Any, *args: Any, **kwargs: Any) -> Any:
                with policy.autocast():
                    out = func(module, *args, **kwargs)
                return convert_to_fp32(out)

            method_in_autocast._accel_nb_autocast = True  # type: ignore[attr-defined]
            return types.MethodType(method_in_autocast, owner)

        @functools.wraps(forward)
        def forward_in_autocast(*args: Any, **kwargs: Any) -> Any:
            with policy.autocast():
                out = forward(*args, **kwargs)
            return convert_to_fp32(out)

        forward_in_autocast._accel_nb_autocast = True  # type: ignore[attr-defined]
        return forward_in_autocast
