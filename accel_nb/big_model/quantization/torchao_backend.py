"""The torchao back-end: int8 (one scale per output row) and int4 (a scale and a zero per group)
weight-only quantization of linear layers, whose weights become torchao tensor subclasses."""

from __future__ import annotations

import math

import torch
from torch import nn

from ..planning.sizes import dtype_size
from .backends import QuantizationBackend, register
from .config import QuantizationError, TorchAoQuantizationConfig
from .layers import require


def torchao_config(config: TorchAoQuantizationConfig, device: torch.device | str | None = None):
    """The torchao config object for ``config`` (Int8WeightOnlyConfig / Int4WeightOnlyConfig).

    int4 on a CUDA device uses torchao's ``tile_packed_to_4d`` layout, whose matmul kernel
    (tinygemm) ships with torch itself; torchao's default int4 layout needs the separate ``mslk``
    kernel package, which has no release on PyPI for torchao 0.18. Elsewhere torchao's default.
    """
    quant = require("torchao.quantization")
    if config.weight == "int8":
        return quant.Int8WeightOnlyConfig()
    if device is not None and torch.device(device).type == "cuda":
        return quant.Int4WeightOnlyConfig(
            group_size=config.group_size, int4_packing_format="tile_packed_to_4d"
        )
    return quant.Int4WeightOnlyConfig(group_size=config.group_size)


@register
class TorchAoBackend(QuantizationBackend):
    name = "torchao"
    config_class = TorchAoQuantizationConfig

    def weight_bytes(self, in_features: int, out_features: int, config: TorchAoQuantizationConfig) -> int:
        n = in_features * out_features
        scale = dtype_size(config.torch_dtype)
        if config.weight == "int8":
            return n + int(scale * out_features)
        groups = math.ceil(in_features / config.group_size) * out_features
        return math.ceil(n / 2) + int(2 * scale * groups)

    def storage_format(self, config: TorchAoQuantizationConfig) -> str:
        return config.weight

    def make_shell(
        self, in_features: int, out_features: int, has_bias: bool, config: TorchAoQuantizationConfig
    ):
        require("torchao")
        with torch.device("meta"):
            return nn.Linear(in_features, out_features, has_bias)

    def quantize_weight(self, layer, weight, config: TorchAoQuantizationConfig, device) -> None:
        weight = weight.to(device=device, dtype=config.torch_dtype)
        quant = require("torchao.quantization")
        layer.weight = nn.Parameter(weight, requires_grad=False)
        try:
            quant.quantize_(layer, torchao_config(config, weight.device))
        except Exception as exc:  # noqa: BLE001 - torchao says why (a missing kernel, a device); keep its words
            hint = ""
            if config.weight == "int4" and weight.device.type != "cuda":
                hint = (
                    ". torchao's int4 weight-only kernels run on a CUDA GPU (accel_nb uses the tile-packed "
                    "layout there); on a CPU use TorchAoQuantizationConfig('int8') or "
                    "BnbQuantizationConfig(load_in_4bit=True, bnb_4bit_quant_type='nf4')"
                )
            raise QuantizationError(
                f"torchao could not quantize a {tuple(weight.shape)} weight to {config.weight} on {weight.device}: "
                f"{type(exc).__name__}: {exc}{hint}. Nothing was loaded"
            ) from None

    def owns_layer(self, layer: nn.Module) -> bool:
        weight = getattr(layer, "weight", None)
        return hasattr(weight, "__tensor_flatten__") and type(weight).__module__.startswith("torchao")

    def serialize(self, layer: nn.Module):
        weight = layer.weight
        names, ctx = weight.__tensor_flatten__()
        parts = {f"weight.{n}": getattr(weight, n) for n in names if getattr(weight, n) is not None}
        return {k: v.detach() for k, v in parts.items()}, (type(weight), ctx, weight.size(), weight.stride())

    def rebuild(self, store, parts, config, device) -> None:
        cls, ctx, size, stride = store.subclass
        inner = {k[len("weight.") :]: v for k, v in parts.items()}
        store.layer.weight = nn.Parameter(
            cls.__tensor_unflatten__(inner, ctx, size, stride), requires_grad=False
        )

    def offload_refusal(self, config: TorchAoQuantizationConfig) -> str | None:
        if config.weight == "int8":
            return None
        return (
            f"torchao {config.weight} layers cannot be offloaded yet (only int8 weight-only and bitsandbytes "
            "8/4-bit layers can). Give the execution device room for them, or use "
            "TorchAoQuantizationConfig(weight='int8')"
        )
