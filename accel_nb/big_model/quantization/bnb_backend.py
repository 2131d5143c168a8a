"""The bitsandbytes back-end: 8-bit (LLM.int8) and 4-bit (nf4/fp4) linear layers.

Byte counts follow bitsandbytes' storage: 8-bit keeps one int8 per weight and one float32 scale
per output row; 4-bit packs two weights per byte plus one float32 absmax per block of 64 (double
quantization: one byte per block, plus a float32 per 256 blocks) and a 16-entry code book.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from .backends import QuantizationBackend, register
from .bnb_layout import keep_portable, portable_state
from .config import BnbQuantizationConfig
from .layers import require
from .prequantized import fill_layer

_BLOCKSIZE = 64
_4BIT_LAYERS = ("Linear4bit", "LinearNF4", "LinearFP4")


@register
class BitsandbytesBackend(QuantizationBackend):
    name = "bitsandbytes"
    config_class = BnbQuantizationConfig

    def weight_bytes(self, in_features: int, out_features: int, config: BnbQuantizationConfig) -> int:
        n = in_features * out_features
        if config.load_in_8bit:
            return n + 4 * out_features
        blocks = math.ceil(n / _BLOCKSIZE)
        stats = blocks + 4 * math.ceil(blocks / 256) + 4 if config.bnb_4bit_use_double_quant else 4 * blocks
        return math.ceil(n / 2) + stats + 16 * 4  # + the 16-entry code book

    def storage_format(self, config: BnbQuantizationConfig) -> str:
        return "int8" if config.load_in_8bit else config.bnb_4bit_quant_type

    def make_shell(self, in_features: int, out_features: int, has_bias: bool, config: BnbQuantizationConfig):
        bnb = require("bitsandbytes")
        with torch.device("meta"):
            if config.load_in_8bit:
                return bnb.nn.Linear8bitLt(
                    in_features,
                    out_features,
                    has_bias,
                    has_fp16_weights=False,
                    threshold=config.llm_int8_threshold,
                )
            layer = bnb.nn.Linear4bit(
                in_features,
                out_features,
                has_bias,
                config.bnb_4bit_compute_dtype,
                compress_statistics=config.bnb_4bit_use_double_quant,
                quant_type=config.bnb_4bit_quant_type,
            )
        keep_portable(layer)  # no bfloat16 CPU repacking: exact numbers, a state_dict that reloads
        return layer

    def float_param(self, layer: nn.Module, weight: torch.Tensor, config: BnbQuantizationConfig):
        """bitsandbytes' parameter holding ``weight`` in float; it quantizes when moved to a device."""
        bnb = require("bitsandbytes")
        if config.load_in_8bit:
            return bnb.nn.Int8Params(weight, requires_grad=False, has_fp16_weights=False)
        return bnb.nn.Params4bit(
            weight,
            requires_grad=False,
            compress_statistics=config.bnb_4bit_use_double_quant,
            quant_type=config.bnb_4bit_quant_type,
            quant_storage=torch.uint8,
            module=layer,
        )

    def quantize_weight(self, layer, weight, config: BnbQuantizationConfig, device) -> None:
        if config.load_in_8bit:
            weight = weight.cpu()  # bitsandbytes quantizes an 8-bit weight when it leaves the CPU (or stays)
        layer.weight = self.float_param(layer, weight, config).to(device)

    def owns_layer(self, layer: nn.Module) -> bool:
        return type(layer).__name__ in ("Linear8bitLt",) + _4BIT_LAYERS

    def serialize(self, layer: nn.Module):
        if type(layer).__name__ in _4BIT_LAYERS:  # never bitsandbytes' state_dict: wrong for a layer
            parts = portable_state(layer)  # repacked for its CPU kernel
            keep_portable(layer)  # rebuilt from these parts for each forward: not repacked each time
            return parts, None
        state = layer.state_dict(keep_vars=True)
        parts = {k: v.detach() for k, v in state.items() if k != "bias" and k != "weight_format"}
        parts["weight"] = parts["weight"].as_subclass(torch.Tensor)  # the bytes, not bitsandbytes' wrapper
        return parts, None

    def rebuild(self, store, parts, config: BnbQuantizationConfig, device) -> None:
        if store.meta:
            self._rebuild_4bit(store, parts, device)
        else:
            fill_layer(store.layer, parts, config, device)

    @staticmethod
    def _rebuild_4bit(store, parts: dict[str, torch.Tensor], device: torch.device) -> None:
        """A 4-bit layer from its device tensors and the description read at offload time, with no
        host-to-device copy: bitsandbytes' own rebuild makes the double quant's offset on the host and
        copies it over, which waits for all work queued on the stream (once per layer per forward);
        here the offset is made on the device once and kept (4 bytes)."""
        bnb = require("bitsandbytes")
        meta = store.meta
        stats = {k[len("weight.") :]: v for k, v in parts.items() if k != "weight" and ".nested_" not in k}
        stats.update({k: v for k, v in meta.items() if not k.startswith("nested_")})
        weight = bnb.nn.Params4bit.from_prequantized(
            data=parts["weight"],
            quantized_stats=stats,
            requires_grad=False,
            device=device,
            module=store.layer,
        )
        if "nested_offset" in meta:
            if store.offset is None:
                store.offset = torch.full(
                    (), float(meta["nested_offset"]), dtype=torch.float32, device=device
                )
            state = weight.quant_state
            state.offset = store.offset
            state.state2 = bnb.functional.QuantState(
                absmax=parts["weight.nested_absmax"],
                blocksize=meta["nested_blocksize"],
                code=parts["weight.nested_quant_map"],
                dtype=getattr(torch, meta["nested_dtype"]),
            )
            state.nested = weight.compress_statistics = True
        store.layer.weight = weight

    def accepts_saved(self, dtypes: dict, config: BnbQuantizationConfig):
        nested = any(n.endswith(".weight.nested_absmax") for n in dtypes)
        if config.load_in_8bit or nested == config.bnb_4bit_use_double_quant:
            return None
        saved = config.method + (" with double quantization" if nested else " without double quantization")
        return saved, f"{config.method} with bnb_4bit_use_double_quant={not nested}"

    def mark_model(self, model: nn.Module, config: BnbQuantizationConfig) -> None:
        model.is_loaded_in_8bit = config.load_in_8bit
        model.is_loaded_in_4bit = config.load_in_4bit
