"""Quantized big-model loading: bitsandbytes 8-bit/4-bit and torchao weight-only, planned by quantized size.

    from accel_nb.big_model.quantization import BnbQuantizationConfig, load_and_quantize_model
    model = load_and_quantize_model(empty_model, BnbQuantizationConfig(load_in_4bit=True),
                                    weights_location="ckpt", device_map="auto")
bitsandbytes and torchao are optional (``pip install "accel_nb[quantization]"``); they are imported
only when a quantized load runs.
"""

from .config import BnbQuantizationConfig, QuantizationError, TorchAoQuantizationConfig
from .layers import get_keys_to_not_convert, get_parameter_device, has_4bit_bnb_layers
from .loader import get_quantized_model_device_map, load_and_quantize_model
from .sizes import (
    mark_quantized_sizes,
    quantized_weight_bytes,
    storage_format,
    tensor_storage,
    unmark_quantized_sizes,
)

__all__ = [
    "BnbQuantizationConfig",
    "QuantizationError",
    "TorchAoQuantizationConfig",
    "get_keys_to_not_convert",
    "get_parameter_device",
    "get_quantized_model_device_map",
    "has_4bit_bnb_layers",
    "load_and_quantize_model",
    "mark_quantized_sizes",
    "quantized_weight_bytes",
    "storage_format",
    "tensor_storage",
    "unmark_quantized_sizes",
]
