"""Bytes each layer holds once quantized, for the planner (``device_map="auto"``).

    quantized_weight_bytes(4096, 4096, BnbQuantizationConfig(load_in_4bit=True))   # ~8.4 MB, not 64 MB
The counts follow each library's storage format; its back-end (``bnb_backend``, ``torchao_backend``)
says how many bytes a layer holds.
"""

from __future__ import annotations

import torch
from torch import nn

from ..planning.sizes import QUANTIZED_BYTES_ATTR, dtype_size, named_tensors
from .backends import backend_for
from .config import QuantizationConfig
from .layers import QuantTarget, find_targets, keeps_fp32


def quantized_weight_bytes(in_features: int, out_features: int, config: QuantizationConfig) -> int:
    """Bytes of one layer's weight after quantization (its bias is counted apart, in torch_dtype)."""
    return backend_for(config).weight_bytes(in_features, out_features, config)


def mark_quantized_sizes(
    model: nn.Module, config: QuantizationConfig, targets: list[QuantTarget] | None = None
) -> list:
    """Tag each weight that will be quantized with its quantized size; compute_module_sizes counts it.

    Returns the tagged tensors (give them to :func:`unmark_quantized_sizes` to undo).
    """
    if targets is None:
        targets = find_targets(model, config)[0]
    marked = []
    for t in targets:
        weight = t.module.weight
        setattr(weight, QUANTIZED_BYTES_ATTR, quantized_weight_bytes(t.in_features, t.out_features, config))
        marked.append(weight)
    return marked


def unmark_quantized_sizes(marked: list) -> None:
    for weight in marked:
        if hasattr(weight, QUANTIZED_BYTES_ATTR):
            delattr(weight, QUANTIZED_BYTES_ATTR)


def special_dtypes_for(
    model: nn.Module, config: QuantizationConfig, fp32_modules: list[str]
) -> dict[str, torch.dtype]:
    """Every floating tensor that stays float, in the dtype it will have: torch_dtype or float32."""
    out = {}
    for name, t in list(model.named_parameters()) + list(model.named_buffers()):
        if t.is_floating_point() and not hasattr(t, QUANTIZED_BYTES_ATTR):
            out[name] = torch.float32 if keeps_fp32(name, fp32_modules) else config.torch_dtype
    return out


def storage_format(config: QuantizationConfig) -> str:
    """How a quantized weight is stored, as the device-map view writes it: 'int8', 'nf4', 'fp4' or 'int4'."""
    return backend_for(config).storage_format(config)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def tensor_storage(
    model: nn.Module, config: QuantizationConfig, float_dtype: torch.dtype | None = None
) -> dict[str, tuple[str, int, int]]:
    """Each tensor once loaded with ``config``: (dtype, bytes, bytes unquantized). Nothing is loaded.

        tensor_storage(empty_llama, TorchAoQuantizationConfig("int8"))["model.layers.0.mlp.up_proj.weight"]
        # ('int8', 2_176, 8_192): one byte per weight + a float32 scale per row, vs 4 bytes per weight
    Works on an empty (meta) model about to be loaded and on a model this package already
    quantized (its layers are still linear layers with the same features). The dtype of a
    quantized weight is :func:`storage_format`; other floating tensors get ``torch_dtype`` (float32
    for ``keep_in_fp32_modules``). "Unquantized" counts every floating tensor in ``float_dtype``
    (default: its own dtype; ``torch_dtype`` for a weight already quantized).
    """
    targets, _skip, fp32 = find_targets(model, config)
    quantized = {id(t.module.weight): t for t in targets}
    label = storage_format(config)
    out = {}
    for name, t in named_tensors(model):
        target = quantized.get(id(t))
        if target is not None:
            numel = target.in_features * target.out_features
            plain = type(t) in (torch.Tensor, nn.Parameter) and t.is_floating_point()
            unq = float_dtype or (t.dtype if plain else config.torch_dtype)
            qbytes = quantized_weight_bytes(target.in_features, target.out_features, config)
            out[name] = (label, qbytes, int(numel * dtype_size(unq)))
        elif t.is_floating_point():
            use = torch.float32 if keeps_fp32(name, fp32) else config.torch_dtype
            unq = float_dtype or t.dtype
            out[name] = (_dtype_name(use), int(t.numel() * dtype_size(use)), int(t.numel() * dtype_size(unq)))
        else:
            nbytes = int(t.numel() * dtype_size(t.dtype))
            out[name] = (_dtype_name(t.dtype), nbytes, nbytes)
    return out
