"""What to quantize and how: bitsandbytes (8-bit LLM.int8, 4-bit NF4/FP4) or torchao (weight-only int8/int4).

    BnbQuantizationConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype="bf16")
    TorchAoQuantizationConfig("int8")
Every field is checked when the config is made; a bad value raises QuantizationError naming the
field, what it got and what it takes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
_DTYPE_NAMES = "'fp32', 'fp16', 'bf16' or a torch.dtype"


class QuantizationError(ValueError):
    """A quantized load cannot be done as asked (bad settings, model or checkpoint, or a missing library)."""


def _float_dtype(value: Any, what: str) -> torch.dtype:
    if isinstance(value, str) and value in _DTYPES:
        return _DTYPES[value]
    if isinstance(value, torch.dtype) and value.is_floating_point:
        return value
    raise QuantizationError(f"{what} must be {_DTYPE_NAMES}, got {value!r}")


def _names(value: Any, what: str) -> list[str] | None:
    if value is None:
        return None
    if isinstance(value, (str, bytes)) or not all(isinstance(v, str) for v in value):
        raise QuantizationError(f"{what} must be a list of module names (e.g. ['lm_head']), got {value!r}")
    return list(value)


def _flag(value: Any, what: str) -> bool:
    if not isinstance(value, bool):
        raise QuantizationError(f"{what} must be True or False, got {value!r}")
    return value


@dataclass
class BnbQuantizationConfig:
    """bitsandbytes settings, with the reference library's names and meanings.

        BnbQuantizationConfig(load_in_8bit=True)                        # LLM.int8, outliers above 6.0
        BnbQuantizationConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4")
    ``torch_dtype`` is the dtype of the layers that stay unquantized (default: float16 for 8-bit,
    the compute dtype for 4-bit); ``skip_modules`` stay in ``torch_dtype`` (default: the output
    head and tied weights); ``keep_in_fp32_modules`` stay in float32.
    """

    load_in_8bit: bool = False
    llm_int8_threshold: float = 6.0
    load_in_4bit: bool = False
    bnb_4bit_quant_type: str = "fp4"
    bnb_4bit_use_double_quant: bool = False
    bnb_4bit_compute_dtype: Any = "fp16"
    torch_dtype: Any = None
    skip_modules: list[str] | None = None
    keep_in_fp32_modules: list[str] | None = None
    target_dtype: Any = field(init=False, repr=False, default=None)

    def __post_init__(self) -> None:
        _flag(self.load_in_8bit, "load_in_8bit")
        _flag(self.load_in_4bit, "load_in_4bit")
        if self.load_in_8bit == self.load_in_4bit:
            raise QuantizationError(
                "BnbQuantizationConfig needs exactly one of load_in_8bit=True or load_in_4bit=True "
                f"(got load_in_8bit={self.load_in_8bit}, load_in_4bit={self.load_in_4bit})"
            )
        if isinstance(self.llm_int8_threshold, bool) or not isinstance(self.llm_int8_threshold, (int, float)):
            raise QuantizationError(
                f"llm_int8_threshold must be a number (e.g. 6.0), got {self.llm_int8_threshold!r}"
            )
        if self.bnb_4bit_quant_type not in ("fp4", "nf4"):
            raise QuantizationError(
                f"bnb_4bit_quant_type must be 'nf4' or 'fp4', got {self.bnb_4bit_quant_type!r}"
            )
        _flag(self.bnb_4bit_use_double_quant, "bnb_4bit_use_double_quant")
        self.bnb_4bit_compute_dtype = _float_dtype(self.bnb_4bit_compute_dtype, "bnb_4bit_compute_dtype")
        if self.torch_dtype is None:
            self.torch_dtype = torch.float16 if self.load_in_8bit else self.bnb_4bit_compute_dtype
        self.torch_dtype = _float_dtype(self.torch_dtype, "torch_dtype")
        self.skip_modules = _names(self.skip_modules, "skip_modules")
        self.keep_in_fp32_modules = _names(self.keep_in_fp32_modules, "keep_in_fp32_modules")
        self.target_dtype = torch.int8 if self.load_in_8bit else "int4"

    @property
    def method(self) -> str:
        """'bnb-int8', 'bnb-nf4' or 'bnb-fp4': the storage format, as checkpoints record it."""
        return "bnb-int8" if self.load_in_8bit else f"bnb-{self.bnb_4bit_quant_type}"

    @property
    def library(self) -> str:
        return "bitsandbytes"


@dataclass
class TorchAoQuantizationConfig:
    """torchao weight-only quantization: ``"int8"`` (per output row) or ``"int4"`` (per group).

        TorchAoQuantizationConfig("int8")
        TorchAoQuantizationConfig("int4", group_size=128)
    ``torch_dtype`` is the dtype of everything else and of the activations (default float32;
    int4 needs bfloat16, its only CPU kernel's dtype). ``skip_modules``/``keep_in_fp32_modules``
    as for :class:`BnbQuantizationConfig`.
    """

    weight: str = "int8"
    group_size: int = 128
    torch_dtype: Any = None
    skip_modules: list[str] | None = None
    keep_in_fp32_modules: list[str] | None = None

    def __post_init__(self) -> None:
        if self.weight not in ("int8", "int4"):
            raise QuantizationError(
                f"TorchAoQuantizationConfig weight must be 'int8' or 'int4', got {self.weight!r}"
            )
        if self.group_size not in (32, 64, 128, 256):
            raise QuantizationError(f"group_size must be 32, 64, 128 or 256, got {self.group_size!r}")
        if self.torch_dtype is None:
            self.torch_dtype = torch.bfloat16 if self.weight == "int4" else torch.float32
        self.torch_dtype = _float_dtype(self.torch_dtype, "torch_dtype")
        if self.weight == "int4" and self.torch_dtype != torch.bfloat16:
            raise QuantizationError(
                f"torchao int4 weight-only runs in bfloat16 only; got torch_dtype={self.torch_dtype}. "
                "Pass torch_dtype=torch.bfloat16 (the default for int4) or use weight='int8'"
            )
        self.skip_modules = _names(self.skip_modules, "skip_modules")
        self.keep_in_fp32_modules = _names(self.keep_in_fp32_modules, "keep_in_fp32_modules")

    @property
    def method(self) -> str:
        return f"torchao-{self.weight}"

    @property
    def library(self) -> str:
        return "torchao"


QuantizationConfig = BnbQuantizationConfig | TorchAoQuantizationConfig
