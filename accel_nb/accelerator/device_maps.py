"""What ``prepare`` makes of a model that big-model loading already placed (``hf_device_map``): one
spread over several places by its map stays there (``verify_device_map``), and so does an 8-bit or
4-bit model, after the reference's checks (``quantized_model_stays``).
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["is_quantized", "quantized_model_stays", "verify_device_map"]


def verify_device_map(model: torch.nn.Module) -> bool:
    """True when ``model`` or a module inside it has an ``hf_device_map`` of more than one entry (the
    reference's ``Accelerator.verify_device_map``: such a model is not moved to the device)."""
    return any(len(getattr(m, "hf_device_map", None) or {}) > 1 for m in model.modules())


def is_quantized(model: torch.nn.Module) -> bool:
    """Loaded in 8-bit or 4-bit (bitsandbytes, through transformers or ``load_and_quantize_model``)."""
    return bool(getattr(model, "is_loaded_in_8bit", False) or getattr(model, "is_loaded_in_4bit", False))


def quantized_model_stays(model: torch.nn.Module, device: torch.device) -> bool:
    """For an 8-bit or 4-bit model with an ``hf_device_map``: True (prepare must not move it), after the
    reference's checks -- disk offload cannot be trained, nor a model on another GPU than this
    process's. False for any other model.

        quantized_model_stays(model_8bit_on_gpu0, torch.device("cuda", 0))   # True
    """
    device_map: dict[str, Any] | None = getattr(model, "hf_device_map", None)
    if not (is_quantized(model) and device_map):
        return False
    places = set(device_map.values())
    if "disk" in places or ("cpu" in places and not _bnb_trains_on_cpu()):
        raise ValueError(
            "You can't train a model that has been loaded in 8-bit or 4-bit precision with CPU or disk offload. "
            f"Its device map puts modules on {sorted(map(str, places))}: load it without 'disk' in max_memory "
            "(on the GPU, or the GPU and the CPU with a bitsandbytes that runs on the CPU)"
        )
    if len(places) == 1 and device.type != "cpu":  # on the CPU bitsandbytes (>= 0.44) runs any layer
        (place,) = places
        index = place if isinstance(place, int) else torch.device(place).index
        if torch.device(device.type, index) != device and (device.index is not None or index != 0):
            raise ValueError(
                "You can't train a model that has been loaded in 8-bit or 4-bit precision on a different device "
                f"than the one you're training on: it is on {place!r}, this process trains on {device}. Load it "
                "with device_map={'': accelerator.device} (or {'': accelerator.local_process_index})"
            )
    return True


def _bnb_trains_on_cpu() -> bool:
    """The reference's gate for 8-bit/4-bit layers on the CPU: bitsandbytes' multi-backend build, not on XPU.
    Both names are read where the reference's Accelerator module has them (accel_nb.accelerator), so code
    written for it that patches them there is heard."""
    import accel_nb.accelerator as reference_path  # deferred: this module is part of that package

    return reference_path.is_bitsandbytes_multi_backend_available() and not reference_path.is_xpu_available()
