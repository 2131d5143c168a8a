"""How big each module is, how much each device can hold, and which parameters are tied.

sizes = compute_module_sizes(model, dtype=torch.float16)   # {"": total, "h.0": ..., ...}
budget = get_max_memory({0: "20GiB", "cpu": "64GiB"})      # {0: 21474836480, "cpu": ...}
"""

from __future__ import annotations

import enum
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import nn

from ...byte_sizes import parse_size

Device = int | str

# A tensor carrying this attribute counts as that many bytes (a weight that will be quantized when
# loaded: set by accel_nb.big_model.quantization, read by compute_module_sizes and so the planner).
QUANTIZED_BYTES_ATTR = "accel_nb_quantized_bytes"


def parse_memory(value: int | float | str) -> int:
    """'10GiB' -> 10737418240, '500MB' -> 500000000, 1024 -> 1024."""
    return parse_size(value, what="memory budget")


def normalize_device(device: Any) -> Device:
    """0, 'cuda:0', torch.device('cuda', 0) -> 0; 'cpu' -> 'cpu'; 'disk' -> 'disk'; 'mps' stays."""
    if isinstance(device, bool):
        raise ValueError(f"{device!r} is not a device")
    if isinstance(device, int):
        return device
    if isinstance(device, torch.device):
        if device.type == "cuda":
            return device.index or 0
        return device.type
    text = str(device).strip().lower()
    if text.isdigit():
        return int(text)
    if text == "cuda":
        return 0
    if text.startswith("cuda:") and text[5:].isdigit():
        return int(text[5:])
    if text in ("cpu", "disk", "meta", "mps") or ":" in text:
        return text
    raise ValueError(f"unknown device {device!r}; use a GPU index (0, 'cuda:1'), 'cpu' or 'disk'")


def torch_device(device: Device) -> torch.device:
    """The torch.device a normalized device runs on (GPU indices become cuda:i)."""
    return torch.device("cuda", device) if isinstance(device, int) else torch.device(device)


def device_order(device: Device) -> tuple[int, int]:
    """Sort key: GPUs by index, then other accelerators, then cpu, then disk."""
    if isinstance(device, int):
        return (0, device)
    return ({"cpu": 2, "disk": 3}.get(device, 1), 0)


def device_name(device: Device) -> str:
    """How messages name a device: 0 -> 'GPU 0', 'cpu' -> 'cpu'."""
    return f"GPU {device}" if isinstance(device, int) else str(device)


class CustomDtype(enum.Enum):
    """Storage formats torch has no dtype for, usable wherever the planner takes a dtype.

        infer_auto_device_map(model, max_memory, special_dtypes={"lm_head.weight": CustomDtype.INT4})
    ``FP8`` counts one byte per element, ``INT4`` half a byte, ``INT2`` a quarter (the reference's
    ``accelerate.utils.dataclasses.CustomDtype``, same members and values).
    """

    FP8 = "fp8"
    INT4 = "int4"
    INT2 = "int2"


_CUSTOM_SIZES = {CustomDtype.FP8: 1, CustomDtype.INT4: 0.5, CustomDtype.INT2: 0.25}


def dtype_size(dtype: torch.dtype | CustomDtype) -> float:
    """Bytes per element (bool 1, float16 2, CustomDtype.INT4 0.5, ...)."""
    if isinstance(dtype, CustomDtype):
        return _CUSTOM_SIZES[dtype]
    if dtype == torch.bool:
        return 1
    return torch.empty((), dtype=dtype, device="meta").element_size()


def tensor_bytes(
    t: torch.Tensor, dtype: torch.dtype | None = None, special: torch.dtype | None = None
) -> int:
    """Bytes of ``t`` once loaded: floating tensors in ``dtype`` (if given), ``special`` overrides all.

    A weight tagged with its quantized size (QUANTIZED_BYTES_ATTR) counts as that size unless ``special`` is given.
    """
    if special is None and hasattr(t, QUANTIZED_BYTES_ATTR):
        return int(getattr(t, QUANTIZED_BYTES_ATTR))
    use = (
        special if special is not None else dtype if dtype is not None and t.is_floating_point() else t.dtype
    )
    return int(t.numel() * dtype_size(use))


def named_tensors(module: nn.Module, recurse: bool = True) -> Iterable[tuple[str, torch.Tensor]]:
    """Parameters then buffers, each tensor once (tied ones under their first name)."""
    seen: set[int] = set()
    for name, t in list(module.named_parameters(recurse=recurse)) + list(
        module.named_buffers(recurse=recurse)
    ):
        if id(t) not in seen:
            seen.add(id(t))
            yield name, t


def compute_module_sizes(
    model: nn.Module,
    dtype: torch.dtype | str | None = None,
    special_dtypes: Mapping[str, torch.dtype | str] | None = None,
    buffers_only: bool = False,
) -> dict[str, int]:
    """Bytes held by every module and tensor path ('' is the whole model); tied tensors count once.

    compute_module_sizes(model)["transformer.h.0"]   # bytes of block 0
    ``dtype`` counts floating tensors as if they were converted to it (e.g. torch.float16);
    ``special_dtypes`` overrides that per tensor name ({"lm_head.weight": torch.float32});
    ``buffers_only`` counts the buffers alone (as the reference's argument of that name).
    """
    dtype = as_dtype(dtype)
    special = {k: as_dtype(v) for k, v in (special_dtypes or {}).items()}
    sizes: dict[str, int] = defaultdict(int)
    for name, t in model.named_buffers() if buffers_only else named_tensors(model):
        n = tensor_bytes(t, dtype, special.get(name))
        parts = name.split(".")
        for i in range(len(parts) + 1):
            sizes[".".join(parts[:i])] += n
    for name, _ in model.named_modules():
        sizes.setdefault(name, 0)
    return dict(sizes)


def as_dtype(dtype: torch.dtype | CustomDtype | str | None) -> torch.dtype | CustomDtype | None:
    """'float16' / 'fp16' / torch.float16 -> torch.float16; a CustomDtype stays as it is."""
    if dtype is None or isinstance(dtype, (torch.dtype, CustomDtype)):
        return dtype
    text = str(dtype).replace("torch.", "")
    aliases = {
        "fp16": "float16",
        "half": "float16",
        "bf16": "bfloat16",
        "fp32": "float32",
        "float": "float32",
    }
    value = getattr(torch, aliases.get(text, text), None)
    if not isinstance(value, torch.dtype):
        raise ValueError(f"unknown dtype {dtype!r}; use e.g. torch.float16 or 'bfloat16'")
    return value


def tied_parameter_groups(model: nn.Module) -> list[list[str]]:
    """Names that share one tensor, e.g. [['transformer.wte.weight', 'lm_head.weight']]."""
    by_id: dict[int, list[str]] = defaultdict(list)
    for name, p in model.named_parameters(remove_duplicate=False):
        by_id[id(p)].append(name)
    return [names for names in by_id.values() if len(names) > 1]


def is_no_split(module: nn.Module, no_split_module_classes: Iterable[str | type] | None) -> bool:
    """True when the module's class is one that must stay whole on one device."""
    for cls in no_split_module_classes or ():
        if isinstance(cls, type) and isinstance(module, cls):
            return True
        if isinstance(cls, str) and type(module).__name__ == cls:
            return True
    return False


def layer_sizes(
    model: nn.Module,
    no_split_module_classes: Iterable[str | type] | None = None,
    dtype: torch.dtype | None = None,
    special_dtypes: Mapping[str, torch.dtype | str] | None = None,
    sizes: Mapping[str, int] | None = None,
) -> dict[str, int]:
    """The units that always move whole: no-split blocks and leaf modules with weights."""
    if sizes is None:
        sizes = compute_module_sizes(model, dtype, special_dtypes)
    out: dict[str, int] = {}
    stack = [("", model)]
    while stack:
        name, module = stack.pop()
        children = list(module.named_children())
        if (name and is_no_split(module, no_split_module_classes)) or not children:
            if sizes.get(name, 0):
                out[name] = sizes[name]
            continue
        prefix = f"{name}." if name else ""
        direct = sum(sizes.get(prefix + n, 0) for n, _ in named_tensors(module, recurse=False))
        if direct:
            out[name] = direct
        stack.extend((f"{name}.{c}" if name else c, m) for c, m in children)
    return out


# -- device budgets ---------------------------------------------------------------------------------
def get_max_memory(
    max_memory: Mapping[Any, int | str] | None = None, init_cuda: bool = True
) -> dict[Device, int]:
    """What each device may hold, in bytes: GPUs (free memory) and the CPU (available RAM).

        get_max_memory()                                 # {0: free bytes on GPU 0, ..., "cpu": ...}
        get_max_memory({0: "10GiB", "cpu": "30GB"})      # user budgets, parsed
    GPU memory is read with torch.cuda.mem_get_info only when CUDA is available;
    ``init_cuda=False`` (used by the device-map view) reads NVML totals instead unless CUDA is
    already initialised, so merely planning never creates a CUDA context (which would force the
    next notebook launch to spawn instead of fork).
    """
    if max_memory is None:
        budgets: dict[Device, int] = {}
        if not init_cuda and not torch.cuda.is_initialized():
            # planning only (the device-map view): NVML totals, no CUDA context in this process
            from ...hardware import gpu_info

            for gpu in gpu_info():
                budgets[gpu.index] = int(gpu.total_memory)
        elif torch.cuda.is_available():
            for i in range(torch.cuda.device_count()):
                budgets[i] = int(torch.cuda.mem_get_info(i)[0])
        import psutil

        budgets["cpu"] = int(psutil.virtual_memory().available)
        return budgets
    budgets = {}
    for key, value in max_memory.items():
        dev = normalize_device(key)
        if dev in budgets:
            raise ValueError(f"max_memory names device {dev!r} twice (as {key!r}); give each device once")
        budgets[dev] = parse_memory(value)
        if budgets[dev] < 0:
            raise ValueError(f"max_memory[{key!r}] is negative ({value!r})")
    if any(isinstance(d, int) for d in budgets) and torch.cuda.is_available():
        n = torch.cuda.device_count()
        missing = [d for d in budgets if isinstance(d, int) and d >= n]
        if missing:
            raise ValueError(f"max_memory names GPU(s) {missing} but this machine has {n} GPU(s)")
    return dict(sorted(budgets.items(), key=lambda kv: device_order(kv[0])))


def get_balanced_memory(
    model: nn.Module,
    max_memory: Mapping[Any, int | str] | None = None,
    no_split_module_classes: Iterable[str | type] | None = None,
    dtype: torch.dtype | str | None = None,
    special_dtypes: Mapping[str, torch.dtype | str] | None = None,
    low_zero: bool = False,
) -> dict[Device, int]:
    """GPU budgets that spread the model evenly over all GPUs instead of filling GPU 0 first.

        device_map = infer_auto_device_map(model, max_memory=get_balanced_memory(model))
    Each GPU gets an equal share of the model plus room for its largest layer (never more than
    it has). ``low_zero=True`` keeps GPU 0 nearly empty (for generate() outputs and the like).
    """
    budgets = get_max_memory(max_memory)
    gpus = [d for d in budgets if isinstance(d, int) and budgets[d] > 0]
    if len(gpus) <= 1:
        return budgets
    dtype = as_dtype(dtype)
    total = compute_module_sizes(model, dtype, special_dtypes)[""]
    layers = layer_sizes(model, no_split_module_classes, dtype, special_dtypes)
    largest = max(layers.values(), default=0)
    share_over = gpus[1:] if low_zero else gpus
    share = total // len(share_over) + largest
    out = dict(budgets)
    for i, gpu in enumerate(gpus):
        if low_zero and i == 0:
            out[gpu] = min(budgets[gpu], largest)
        else:
            out[gpu] = min(budgets[gpu], share)
    return out


def check_tied_parameters_in_config(model: nn.Module) -> bool:
    """True when a transformers model's config or modules say some weights are tied (tied word embeddings
    with an output embedding, a tied encoder-decoder, or a module with ``_tie_weights``); False for any
    other model."""
    if "PreTrainedModel" not in [c.__name__ for c in type(model).__mro__]:
        return False
    config = getattr(model, "config", None)
    decoder_config = None
    if config is not None:
        decoder_config = (
            config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
        )
    tied_embeddings = bool(
        decoder_config is not None
        and getattr(decoder_config, "tie_word_embeddings", False)
        and model.get_output_embeddings()
    )
    tied_encoder_decoder = bool(
        config is not None
        and getattr(config, "is_encoder_decoder", False)
        and getattr(config, "tie_encoder_decoder", False)
    )
    return tied_embeddings or tied_encoder_decoder or any(hasattr(m, "_tie_weights") for m in model.modules())
