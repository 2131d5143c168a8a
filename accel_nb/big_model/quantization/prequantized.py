"""Checkpoints saved already quantized by bitsandbytes, in the layout transformers writes: detect, check, load.

An 8-bit layer is saved as ``weight`` (int8), ``SCB`` (float32 row scales) and ``weight_format``;
a 4-bit layer as ``weight`` (packed uint8), ``weight.absmax``, ``weight.quant_map``,
``weight.quant_state.bitsandbytes__nf4`` (or ``__fp4``) and, with double quantization,
``weight.nested_absmax`` and ``weight.nested_quant_map``. Such a checkpoint loads without
re-quantizing when the config asks for the same format; any other config is refused.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .backends import backend_for
from .bnb_layout import keep_portable, portable_stats
from .config import BnbQuantizationConfig, QuantizationConfig, QuantizationError
from .layers import QuantTarget, require

_MARKERS = {
    ".SCB": "bnb-int8",
    ".weight_format": "bnb-int8",
    ".quant_state.bitsandbytes__nf4": "bnb-nf4",
    ".quant_state.bitsandbytes__fp4": "bnb-fp4",
}
_KEYS_8BIT = ("weight", "SCB", "weight_format")
_KEYS_4BIT = (
    "weight",
    "weight.absmax",
    "weight.quant_map",
    "weight.nested_absmax",
    "weight.nested_quant_map",
)


def saved_format(
    dtypes: dict[str, torch.dtype], targets: list[QuantTarget], saved_name
) -> tuple[str, str] | None:
    """(format, an example tensor name) of a checkpoint saved quantized, or None for a float one."""
    for name in dtypes:
        for suffix, method in _MARKERS.items():
            if name.endswith(suffix):
                return method, name
    for t in targets:
        saved = saved_name(f"{t.name}.weight")
        if saved is not None and not dtypes[saved].is_floating_point:
            return f"an integer format ({dtypes[saved]})", saved
    return None


def check(where: str, dtypes, targets: list[QuantTarget], saved_name, config: QuantizationConfig) -> bool:
    """True when the checkpoint is quantized in exactly the config's format (load it as is); False when
    it is float; raise QuantizationError when it is quantized otherwise."""
    found = saved_format(dtypes, targets, saved_name)
    if found is None:
        return False
    method, example = found
    if method == config.method:
        mismatch = backend_for(config).accepts_saved(dtypes, config)
        if mismatch is None:
            return True
        return _refuse(where, *mismatch[:1], example, mismatch[1])
    return _refuse(where, method, example, config.method)


def _refuse(where: str, method: str, example: str, asked: str) -> bool:
    raise QuantizationError(
        f"{where} was saved already quantized with other settings ({method}: e.g. {example!r}) than this "
        f"config asks for ({asked}). Quantize from the float checkpoint instead, or use the settings it "
        "was saved with. Nothing was loaded"
    )


def layer_keys(
    where: str, dtypes, targets: list[QuantTarget], config: BnbQuantizationConfig
) -> dict[str, tuple[str, str]]:
    """saved name -> (layer, key inside the layer) for every quantized tensor; raise if a layer lacks one."""
    if config.load_in_8bit:
        need, optional = ("weight", "SCB"), _KEYS_8BIT
    else:
        state = f"weight.quant_state.bitsandbytes__{config.bnb_4bit_quant_type}"
        need = ("weight", "weight.absmax", "weight.quant_map", state)
        optional = _KEYS_4BIT + (state,)
        if config.bnb_4bit_use_double_quant:
            need += ("weight.nested_absmax", "weight.nested_quant_map")
    out: dict[str, tuple[str, str]] = {}
    lacking = []
    for t in targets:
        for key in optional:
            if f"{t.name}.{key}" in dtypes:
                out[f"{t.name}.{key}"] = (t.name, key)
        lacking += [f"{t.name}.{k}" for k in need if f"{t.name}.{k}" not in dtypes]
    if lacking:
        raise QuantizationError(
            f"{where} is saved quantized ({config.method}) but lacks {len(lacking)} tensor(s) of its quantized "
            f"layers: {', '.join(lacking[:6])}. Re-save the checkpoint completely. Nothing was loaded"
        )
    return out


def fill_layer(
    layer: nn.Module,
    parts: dict[str, torch.Tensor],
    config: BnbQuantizationConfig,
    device: Any,
    where: str = "a quantized layer",
) -> None:
    """Put a layer's saved quantized tensors into its shell (from layers.make_shell), on ``device``."""
    bnb = require("bitsandbytes")
    if config.load_in_8bit:
        fmt = parts.get("weight_format")
        if fmt is not None and int(fmt) != 0:
            raise QuantizationError(
                f"8-bit weight format {int(fmt)} is not the row-major format (0) bitsandbytes reads"
            )
        param = bnb.nn.Int8Params(parts["weight"].to(device), requires_grad=False, has_fp16_weights=False)
        param.CB = param.data
        param.SCB = parts["SCB"].to(device)
        layer.weight = param
        return
    stats = {k[len("weight.") :]: v for k, v in parts.items() if k != "weight"}
    stats = portable_stats(stats, where)
    keep_portable(layer)
    layer.weight = bnb.nn.Params4bit.from_prequantized(
        data=parts["weight"], quantized_stats=stats, requires_grad=False, device=device, module=layer
    )
