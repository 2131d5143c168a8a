"""More helpers over a model's tensors and module tree that code written for the reference calls: sizes,
names, device-map cleanup, ties, and reading offloaded weights (hooked or dispatched) in place.

    convert_file_size_to_int("2GiB")              # 2147483648
    clean_device_map({"a.x": 0, "a.y": 0})         # {"a": 0}
    with align_module_device(offloaded_layer):
        print(offloaded_layer.weight.sum())
    state = get_state_dict_offloaded_model(dispatched_model)

Served at the reference's ``accelerate.utils.modeling`` path by ``accel_nb.utils.modeling``.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import nn

from .dispatch_hooks import DISPATCH_HOOK_ATTR
from .model_hooks import AlignDevicesHook, iter_hooks
from .module_tensors import named_module_tensors, set_module_tensor_to_device
from .planning.sizes import CustomDtype, check_tied_parameters_in_config, dtype_size, tied_parameter_groups

__all__ = [
    "align_module_device",
    "calculate_maximum_sizes",
    "get_state_dict_from_offload",
    "load_offloaded_weights",
    "check_device_same",
    "check_tied_parameters_in_config",
    "check_tied_parameters_on_same_device",
    "clean_device_map",
    "compute_module_total_buffer_size",
    "convert_file_size_to_int",
    "dtype_byte_size",
    "get_max_layer_size",
    "get_module_children_bottom_up",
    "get_module_class_from_name",
    "get_module_leaves",
    "get_module_size_with_ties",
    "get_non_persistent_buffers",
    "has_offloaded_params",
    "has_repeated_blocks",
    "is_repeated_blocks",
    "id_tensor_storage",
    "is_peft_model",
    "get_state_dict_offloaded_model",
    "retie_parameters",
]


# -- sizes and names ---------------------------------------------------------------------------------
_DECIMAL = {"GB": 10**9, "MB": 10**6, "KB": 10**3}
_BINARY = {"GIB": 2**30, "MIB": 2**20, "KIB": 2**10}


def convert_file_size_to_int(size: int | str) -> int:
    """Bytes in a size: an int as it is, '5GB' (10**9 based), '2GiB' (2**30 based); '8Gb' (bits) is an eighth.

    convert_file_size_to_int("1MiB")   # 1048576
    """
    error = ValueError(
        f"`size` {size} is not in a valid format. Use an integer for bytes, or a string with an unit (like '5.0GB')."
    )
    if isinstance(size, int):
        result = size
    else:
        upper = size.upper()
        unit = next((u for u in _BINARY if upper.endswith(u)), None) or next(
            (u for u in _DECIMAL if upper.endswith(u)), None
        )
        if unit is None:
            raise error
        try:
            number = float(size[: -len(unit)])
        except ValueError:
            raise error from None
        if unit in _BINARY:
            result = int(number * _BINARY[unit])
        else:
            result = int(number * _DECIMAL[unit])
            if size.endswith("b"):  # bits
                result //= 8
    if result < 0:
        raise error
    return result


def dtype_byte_size(dtype: torch.dtype) -> float:
    """Bytes one element of ``dtype`` takes: 4 for float32, 1/8 for bool (one bit, as the reference counts).

    dtype_byte_size(torch.bfloat16)   # 2
    dtype_byte_size(CustomDtype.INT4)   # 0.5
    """
    if isinstance(dtype, CustomDtype):
        return dtype_size(dtype)
    if dtype == torch.bool:
        return 1 / 8
    if "float8" in str(dtype):
        return 1
    bits = re.search(r"[^\d](\d+)$", str(dtype))
    if bits is None:
        raise ValueError(f"`dtype` is not a valid dtype: {dtype}.")
    return int(bits.group(1)) // 8


def id_tensor_storage(tensor: torch.Tensor) -> tuple[torch.device, int, int]:
    """(device, storage address, storage bytes): equal for tensors that share one storage."""
    try:
        storage = tensor.untyped_storage()
        return tensor.device, storage.data_ptr(), storage.nbytes()
    except (NotImplementedError, RuntimeError):
        return tensor.device, 0, tensor.nelement() * tensor.element_size()


def check_device_same(first_device: torch.device, second_device: torch.device) -> bool:
    """True when both name the same device, counting ``cuda`` and ``cuda:0`` as one."""
    if first_device.type != second_device.type:
        return False

    def indexed(d: torch.device) -> torch.device:
        return torch.device(d.type, 0) if d.type != "cpu" and d.index is None else d

    return indexed(first_device) == indexed(second_device)


def get_non_persistent_buffers(module: nn.Module, recurse: bool = False, fqns: bool = False) -> set[str]:
    """Names of the buffers left out of the state dict (``persistent=False``).

    With ``recurse`` submodules' too, by bare name, or by full dotted name with ``fqns``.
    """
    names = set(module._non_persistent_buffers_set)
    if recurse:
        for prefix, sub in module.named_modules():
            names |= (
                {f"{prefix}.{b}" for b in sub._non_persistent_buffers_set}
                if fqns
                else set(sub._non_persistent_buffers_set)
            )
    return names


def compute_module_total_buffer_size(
    model: nn.Module, dtype: str | torch.dtype | None = None, special_dtypes: Mapping[str, Any] | None = None
) -> int:
    """Bytes of all buffers of ``model`` (floating ones counted in ``dtype`` when given)."""
    from .planning.sizes import as_dtype, tensor_bytes

    dtype = as_dtype(dtype)
    special = {k: as_dtype(v) for k, v in (special_dtypes or {}).items()}
    return sum(tensor_bytes(b, dtype, special.get(name)) for name, b in model.named_buffers())


def get_module_leaves(module_sizes: Mapping[str, int]) -> list[str]:
    """The names in ``module_sizes`` (from ``compute_module_sizes``) that no other name extends."""
    parents = {name.rsplit(".", 1)[0] for name in module_sizes if "." in name}
    return [name for name in module_sizes if name and name not in parents]


def get_module_size_with_ties(
    tied_params: list[str],
    module_size: int,
    module_sizes: Mapping[str, int],
    modules_to_treat: list[tuple[str, nn.Module]],
) -> tuple[int, list[str], list[nn.Module]]:
    """Size of a module together with the modules its ``tied_params`` live in, and those modules.

    Each tied parameter adds its module's size less the parameter itself (counted once already).
    """
    names: list[str] = []
    modules: list[nn.Module] = []
    total = module_size
    for param in tied_params:
        name, module = next((n, m) for n, m in modules_to_treat if param.startswith(n + "."))
        names.append(name)
        modules.append(module)
        total += module_sizes[name] - module_sizes[param]
    return total, names, modules


def clean_device_map(device_map: dict[str, Any], module_name: str = "") -> dict[str, Any]:
    """Merge entries under one module that all go to the same device into one entry (in place; returned).

    clean_device_map({"a.x": 0, "a.y": 0, "b": 1})   # {"b": 1, "a": 0}
    """
    prefix = f"{module_name}." if module_name else ""
    under = [k for k in device_map if k.startswith(prefix)]
    values = [device_map[k] for k in under]
    if len(values) > 1 and len(set(values)) == 1:
        for key in under:
            del device_map[key]
        device_map[module_name] = values[0]
    depth = len(module_name.split(".")) + 1 if module_name else 1
    children = {
        ".".join(k.split(".")[:depth])
        for k in device_map
        if k.startswith(prefix) and len(k) > len(module_name)
    }
    for child in children:
        clean_device_map(device_map, module_name=child)
    return device_map


def retie_parameters(model: nn.Module, tied_params: list[list[str]]) -> None:
    """Make each group of names (from ``find_tied_parameters``) share one parameter again: the first one
    not on the meta device is set under every name of its group."""

    def lookup(name: str) -> tuple[nn.Module, str]:
        path, _, attr = name.rpartition(".")
        return (model.get_submodule(path) if path else model), attr

    for group in tied_params:
        keep = None
        for name in group:
            owner, attr = lookup(name)
            candidate = getattr(owner, attr)
            if candidate.device.type != "meta":
                keep = candidate
                break
        if keep is not None:
            for name in group:
                owner, attr = lookup(name)
                setattr(owner, attr, keep)


# -- offloaded modules -------------------------------------------------------------------------------
def has_offloaded_params(module: nn.Module) -> bool:
    """True when ``module``'s own weights live off it between forwards: an ``AlignDevicesHook(offload=True)``
    or accel_nb's dispatch / ``cpu_offload`` / ``disk_offload`` streaming hook."""

    if getattr(getattr(module, DISPATCH_HOOK_ATTR, None), "units", None):
        return True
    return any(isinstance(h, AlignDevicesHook) and h.offload for h in iter_hooks(module))


@contextlib.contextmanager
def align_module_device(module: nn.Module, execution_device: Any = None) -> Iterator[None]:
    """Within the block the module's weights are real tensors: offloaded ones brought in as for a forward,
    or, with ``execution_device``, its own parameters moved there (and back afterwards).

        with align_module_device(layer):
            print(layer.weight.sum())      # readable although layer is offloaded
    """

    dispatch_hook = getattr(module, DISPATCH_HOOK_ATTR, None)
    if dispatch_hook is not None and dispatch_hook.units:
        entered = []
        try:
            for unit in dispatch_hook.units:
                dispatch_hook.engine.before_forward(unit)
                entered.append(unit)
            yield
        finally:
            for unit in reversed(entered):
                dispatch_hook.engine.after_forward(unit)
        return
    hook = next((h for h in iter_hooks(module) if isinstance(h, AlignDevicesHook) and h.offload), None)
    if hook is not None:
        previous = hook.execution_device
        if execution_device is not None:
            hook.execution_device = (
                torch.device(execution_device)
                if not isinstance(execution_device, int)
                else (torch.device("cuda", execution_device))
            )
        try:
            hook.pre_forward(module)
            yield
        finally:
            hook.post_forward(module, None)
            hook.execution_device = previous
        return
    if execution_device is None:
        yield
        return
    devices = {name: p.device for name, p in module.named_parameters(recurse=False)}
    try:
        for name in devices:
            set_module_tensor_to_device(module, name, execution_device)
        yield
    finally:
        for name, device in devices.items():
            set_module_tensor_to_device(module, name, device)


# -- module tree ---------------------------------------------------------------------------------------
def get_module_class_from_name(module: nn.Module, name: str) -> type[nn.Module] | None:
    """The class called ``name`` of ``module`` or of its first submodule (depth first) that has it, else None.

    get_module_class_from_name(model, "GPT2Block")   # for FSDP wrap policies
    """
    if type(module).__name__ == name:
        return type(module)
    for child in module.children():
        found = get_module_class_from_name(child, name)
        if found is not None:
            return found
    return None


def get_module_children_bottom_up(model: nn.Module, return_fqns: bool = False) -> list[Any]:
    """Every module of ``model`` with children before their parents, ``model`` last (with names if ``return_fqns``)."""
    stack: list[tuple[str, nn.Module]] = [("", model)]
    top_down: list[tuple[str, nn.Module]] = []
    while stack:
        name, current = stack.pop()
        top_down.append((name, current))
        stack.extend((f"{name}.{n}" if name else n, child) for n, child in current.named_children())
    ordered = top_down[::-1]
    return ordered if return_fqns else [m for _, m in ordered]


def get_max_layer_size(
    modules: list[tuple[str, nn.Module]], module_sizes: Mapping[str, int], no_split_module_classes: list[str]
) -> tuple[int, list[str]]:
    """The largest size of one unsplittable layer among ``modules`` (a leaf, or a module of a
    ``no_split_module_classes`` class) and the names of the layers of that size."""
    best, names = 0, []
    pending = list(modules)
    while pending:
        name, module = pending.pop(0)
        children = list(module.named_children()) if isinstance(module, nn.Module) else []
        if not children or type(module).__name__ in no_split_module_classes:
            size = module_sizes[name]
            if size > best:
                best, names = size, [name]
            elif size == best:
                names.append(name)
        else:
            pending = [(f"{name}.{n}", child) for n, child in children] + pending
    return best, names


def check_tied_parameters_on_same_device(tied_params: list[list[str]], device_map: Mapping[str, Any]) -> None:
    """Log a warning for each group of tied parameters that ``device_map`` splits over several devices."""
    import logging

    from .planning.map_checks import device_for

    for group in tied_params:
        devices = {name: device_for(device_map, name) for name in group}
        if len(set(devices.values())) > 1:
            logging.getLogger(__name__).warning(
                f"Tied parameters are on different devices: {devices}. "
                "Please modify your custom device map or set `device_map='auto'`. "
            )


def is_peft_model(model: nn.Module) -> bool:
    """True when ``model`` (once unwrapped from DDP/compile) is a ``peft.PeftModel``; False without peft."""
    from ..availability import is_peft_available

    if not is_peft_available():
        return False
    from peft import PeftModel

    from ..accelerator.unwrap import extract_model_from_parallel

    return isinstance(extract_model_from_parallel(model), PeftModel)


def is_repeated_blocks(module: nn.Module) -> bool:
    """True for a non-empty ``nn.ModuleList`` whose items are all of its first item's class (a stack of blocks)."""
    return (
        isinstance(module, nn.ModuleList)
        and len(module) > 0
        and all(isinstance(m, type(module[0])) for m in module)
    )


def has_repeated_blocks(module: nn.Module) -> bool:
    """True when some submodule of ``module`` (itself included, if it has children) :func:`is_repeated_blocks`."""
    return bool(module._modules) and any(is_repeated_blocks(m) for m in module.modules())


def load_offloaded_weights(model: nn.Module, index: Mapping[str, Any] | None, offload_folder: str) -> None:
    """Put each weight of an offload folder's ``index`` (``accelerate.utils.offload`` format) into ``model``
    on the CPU. 8-bit ``SCB`` statistics entries are skipped (quantized weights: not supported yet)."""
    import os

    from .weight_files import load_offloaded_weight

    for name, info in (index or {}).items():
        if "SCB" in name:
            continue
        value = load_offloaded_weight(os.path.join(offload_folder, f"{name}.dat"), info)
        set_module_tensor_to_device(model, name, "cpu", value=value)


def get_state_dict_from_offload(
    module: nn.Module, module_name: str, state_dict: dict[str, Any], device_to_put_offload: Any = "cpu"
) -> dict[str, Any]:
    """Fill the entries of ``state_dict`` under ``module_name``'s parent with ``module``'s real tensors, bringing
    offloaded ones in (onto ``device_to_put_offload``) for the copy. Returns ``state_dict``."""
    root = module_name[: module_name.rfind(".")]
    device = device_to_put_offload if has_offloaded_params(module) else None
    with align_module_device(module, device):
        for key, value in module.state_dict().items():
            if f"{root}.{key}" in state_dict:
                state_dict[f"{root}.{key}"] = value
    return state_dict


def calculate_maximum_sizes(model: nn.Module) -> tuple[int, tuple[int, list[str]]]:
    """``(total bytes, (bytes of the largest layer, its names))``; layers split at ``model._no_split_modules``."""
    from .planning.sizes import compute_module_sizes

    sizes = compute_module_sizes(model)
    top = (
        list(model.named_parameters(recurse=False))
        + list(model.named_children())
        + list(model.named_buffers(recurse=False))
    )
    return sizes[""], get_max_layer_size(top, sizes, list(getattr(model, "_no_split_modules", None) or []))


def _offloaded_tensors(model: nn.Module) -> dict[str, torch.Tensor]:
    """Full name -> CPU copy of every weight that lives off the module between forwards."""
    found: dict[str, torch.Tensor] = {}
    seen_units: set[int] = set()
    for prefix, module in model.named_modules():
        dispatch_hook = getattr(module, DISPATCH_HOOK_ATTR, None)
        for unit in getattr(dispatch_hook, "units", []):
            if id(unit) in seen_units:
                continue
            seen_units.add(id(unit))
            engine = dispatch_hook.engine
            engine.before_forward(unit)  # the same path a forward takes: the weights appear on the module
            try:
                for slot in unit.slots:
                    tensor = (
                        slot.owner._parameters[slot.attr] if slot.is_param else slot.owner._buffers[slot.attr]
                    )
                    found.setdefault(slot.key, tensor.detach().to("cpu", copy=True))
            finally:
                engine.after_forward(unit)
        for hook in iter_hooks(module):
            if isinstance(hook, AlignDevicesHook) and hook.offload and hook.weights_map is not None:
                for name, _ in named_module_tensors(module, include_buffers=hook.offload_buffers):
                    full = f"{prefix}.{name}" if prefix else name
                    if name in hook.weights_map:
                        found.setdefault(full, hook.weights_map[name].detach().to("cpu", copy=True))
    return found


def get_state_dict_offloaded_model(model: nn.Module) -> dict[str, torch.Tensor]:
    """The model's state dict on CPU, reading weights that dispatch or hooks keep on CPU or disk.

    model = load_checkpoint_and_dispatch(model, "ckpt", device_map={"a": "cpu", "b": "disk"}, ...)
    state = get_state_dict_offloaded_model(model)   # every tensor real, in state_dict order
    """
    offloaded = _offloaded_tensors(model)
    state: dict[str, torch.Tensor] = {}
    missing: list[str] = []
    for name, tensor in model.state_dict(keep_vars=True).items():
        if name in offloaded:
            state[name] = offloaded[name]
        elif tensor.device.type == "meta":
            missing.append(name)
        else:
            state[name] = tensor.detach().to("cpu", copy=True)
    for group in tied_parameter_groups(model):  # a tie offloaded under one name fills the others
        known = next((state[n] for n in group if n in state), None)
        for name in group:
            if name in missing and known is not None:
                state[name] = known
                missing.remove(name)
    if missing:
        raise ValueError(
            f"{len(missing)} tensor(s) have no data anywhere (meta, not offloaded): {missing[:5]}; load the "
            "checkpoint into the model (load_checkpoint_in_model / load_checkpoint_and_dispatch) first"
        )
    return {name: state[name] for name in model.state_dict(keep_vars=True)}
