"""Helpers over a model's tensors that libraries call: move one tensor, list tensors, find ties,
read a weights file, collect an offloaded model's state dict.

    set_module_tensor_to_device(model, "lm_head.weight", "cpu", value=torch.zeros(10, 4))
    find_tied_parameters(model)            # [['embed.weight', 'lm_head.weight']]
    state = get_state_dict_offloaded_model(dispatched_model)
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import nn

from .big_model.sizes import normalize_device, tied_parameter_groups, torch_device

__all__ = [
    "align_module_device",
    "check_device_same",
    "clean_device_map",
    "compute_module_total_buffer_size",
    "convert_file_size_to_int",
    "dtype_byte_size",
    "get_module_leaves",
    "get_module_size_with_ties",
    "get_non_persistent_buffers",
    "has_offloaded_params",
    "id_tensor_storage",
    "retie_parameters",
    "find_tied_parameters",
    "get_state_dict_offloaded_model",
    "load_state_dict",
    "named_module_tensors",
    "set_module_tensor_to_device",
]

_PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt")


def _owner(module: nn.Module, tensor_name: str) -> tuple[nn.Module, str]:
    """The submodule holding ``tensor_name`` and the tensor's attribute name in it."""
    path, _, attr = tensor_name.rpartition(".")
    owner = module
    for part in path.split(".") if path else []:
        child = getattr(owner, part, None)
        if not isinstance(child, nn.Module):
            raise ValueError(f"{type(module).__name__} has no submodule {path!r} (looking up {tensor_name!r})")
        owner = child
    if attr not in owner._parameters and attr not in owner._buffers:
        raise ValueError(f"{type(module).__name__} has no parameter or buffer named {tensor_name!r}")
    return owner, attr


def set_module_tensor_to_device(
    module: nn.Module,
    tensor_name: str,
    device: int | str | torch.device,
    value: torch.Tensor | None = None,
    dtype: str | torch.dtype | None = None,
    fp16_statistics: torch.Tensor | None = None,
    tied_params_map: dict[int, dict[torch.device, torch.Tensor]] | None = None,
    non_blocking: bool = False,
    clear_cache: bool = True,
) -> None:
    """Put one parameter or buffer (by full name) on ``device``, optionally with a new ``value``.

    Moving a parameter with ``.to()`` would make a new tensor the module does not hold; this
    replaces it in the module, keeping its ``Parameter`` type and ``requires_grad``. Without
    ``dtype`` the ``value`` takes the current tensor's dtype; with it, a floating ``value`` is cast
    to ``dtype`` (integer and bool values keep theirs). ``tied_params_map`` (data
    pointer -> {device: tensor}) reuses a tensor already placed for a tied weight.

        with init_empty_weights():
            model = nn.Linear(4, 2)
        set_module_tensor_to_device(model, "weight", "cpu", value=torch.ones(2, 4))
    """
    if fp16_statistics is not None:
        raise NotImplementedError("fp16_statistics (8-bit serialization) is not supported by accel_nb")
    owner, attr = _owner(module, tensor_name)
    is_param = attr in owner._parameters
    old = owner._parameters[attr] if is_param else owner._buffers[attr]
    target = torch_device(normalize_device(device))
    if old is None:
        raise ValueError(f"{tensor_name!r} is None in the module; there is no tensor to move")
    if old.device.type == "meta" and value is None and target.type != "meta":
        raise ValueError(f"{tensor_name!r} is on the meta device (no data); pass value= to put it on {target}")
    if tied_params_map is not None and old.device.type != "meta":
        reuse = tied_params_map.get(old.data_ptr(), {}).get(target)
        if reuse is not None and value is None:
            _install(owner, attr, is_param, old, reuse)
            return
    if value is not None:
        value = torch.as_tensor(value)
        if value.shape != old.shape:
            raise ValueError(
                f"value for {tensor_name!r} has shape {tuple(value.shape)} but the module's tensor has shape "
                f"{tuple(old.shape)}; pass a tensor of the module's shape"
            )
        if dtype is not None:
            from .big_model.sizes import as_dtype

            if value.is_floating_point():
                value = value.to(as_dtype(dtype))
        else:
            value = value.to(old.dtype)
    source = old if value is None else value
    with torch.no_grad():
        new = source.to(target, non_blocking=non_blocking)
    _install(owner, attr, is_param, old, new)
    if tied_params_map is not None and old.device.type != "meta" and old.data_ptr() in tied_params_map:
        tied_params_map[old.data_ptr()][target] = owner._parameters[attr] if is_param else owner._buffers[attr]
    if clear_cache and target.type == "cuda":
        torch.cuda.empty_cache()


def _install(owner: nn.Module, attr: str, is_param: bool, old: torch.Tensor, new: torch.Tensor) -> None:
    if is_param:
        if not isinstance(new, nn.Parameter):
            cls = type(old) if isinstance(old, nn.Parameter) else nn.Parameter
            new = cls(new, requires_grad=old.requires_grad)
        owner._parameters[attr] = new
    else:
        owner._buffers[attr] = new


def named_module_tensors(
    module: nn.Module, include_buffers: bool = True, recurse: bool = False, remove_non_persistent: bool = False
) -> Iterator[tuple[str, torch.Tensor]]:
    """The module's parameters, then (``include_buffers``) its buffers, as ``(name, tensor)``.

    ``recurse=False`` lists only the module's own tensors; ``remove_non_persistent`` skips buffers
    that are not saved in the state dict.

        dict(named_module_tensors(model, recurse=True))
    """
    yield from module.named_parameters(recurse=recurse)
    if not include_buffers:
        return
    skipped: set[str] = set()
    if remove_non_persistent:
        for prefix, sub in module.named_modules() if recurse else [("", module)]:
            skipped.update(f"{prefix}.{b}" if prefix else b for b in sub._non_persistent_buffers_set)
    for name, buffer in module.named_buffers(recurse=recurse):
        if name not in skipped:
            yield name, buffer


def find_tied_parameters(model: nn.Module, **kwargs: Any) -> list[list[str]]:
    """Groups of parameter names that share one tensor, each group sorted.

    model.lm_head.weight = model.embed.weight
    find_tied_parameters(model)   # [['embed.weight', 'lm_head.weight']]
    """
    if kwargs:
        raise TypeError(f"find_tied_parameters() takes only the model; got {sorted(kwargs)}")
    return sorted(sorted(group) for group in tied_parameter_groups(model))


def _device_for(device_map: Mapping[str, Any], name: str) -> torch.device:
    best = None
    for key in device_map:
        if key == "" or name == key or name.startswith(key + "."):
            if best is None or len(key) > len(best):
                best = key
    if best is None:
        raise ValueError(f"device_map does not place {name!r}; add its module (or '') to the map")
    device = normalize_device(device_map[best])
    return torch.device("cpu") if device == "disk" else torch_device(device)


def load_state_dict(
    checkpoint_file: str | os.PathLike,
    device_map: Mapping[str, Any] | None = None,
    *,
    allow_pickle: bool = False,
) -> dict[str, torch.Tensor]:
    """Read one weights file (safetensors, or with ``allow_pickle=True`` a torch pickle) into a dict.

    With ``device_map`` each tensor goes to the device of the module that holds it ('disk' means
    CPU here). Pickle files run code when read, so they need ``allow_pickle=True`` and are read
    with ``torch.load(weights_only=True)``.

        state = load_state_dict("model.safetensors", device_map={"": "cpu"})
    """
    path = os.fspath(checkpoint_file)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path} is not a file; pass the path of one .safetensors (or .bin) file")
    if path.endswith(".safetensors"):
        from .serialization import load_safetensors_state_dict

        state = load_safetensors_state_dict(path)
    elif path.endswith(_PICKLE_SUFFIXES):
        if not allow_pickle:
            raise ValueError(
                f"{path} is a pickle file; pickle can run code when loaded, so pass allow_pickle=True to read it "
                "(with torch.load(weights_only=True)), or convert it to safetensors"
            )
        state = torch.load(path, map_location="cpu", weights_only=True)
    else:
        raise ValueError(f"{path}: unknown weights format; use a .safetensors file (or .bin/.pt with allow_pickle=True)")
    if device_map is None:
        return state
    return {name: t.to(_device_for(device_map, name)) for name, t in state.items()}


def _offloaded_tensors(model: nn.Module) -> dict[str, torch.Tensor]:
    """Full name -> CPU copy of every weight that lives off the module between forwards."""
    from .big_model.hooks import _ATTR as DISPATCH_HOOK  # accel_nb's own dispatch (dispatch_model, offload)
    from .hooks import AlignDevicesHook, iter_hooks

    found: dict[str, torch.Tensor] = {}
    seen_units: set[int] = set()
    for prefix, module in model.named_modules():
        dispatch_hook = getattr(module, DISPATCH_HOOK, None)
        for unit in getattr(dispatch_hook, "units", []):
            if id(unit) in seen_units:
                continue
            seen_units.add(id(unit))
            engine = dispatch_hook.engine
            engine.before_forward(unit)  # the same path a forward takes: the weights appear on the module
            try:
                for slot in unit.slots:
                    tensor = slot.owner._parameters[slot.attr] if slot.is_param else slot.owner._buffers[slot.attr]
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
    """
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
            names |= {f"{prefix}.{b}" for b in sub._non_persistent_buffers_set} if fqns else set(
                sub._non_persistent_buffers_set
            )
    return names


def compute_module_total_buffer_size(
    model: nn.Module, dtype: str | torch.dtype | None = None, special_dtypes: Mapping[str, Any] | None = None
) -> int:
    """Bytes of all buffers of ``model`` (floating ones counted in ``dtype`` when given)."""
    from .big_model.sizes import as_dtype, tensor_bytes

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
    children = {".".join(k.split(".")[:depth]) for k in device_map if k.startswith(prefix) and len(k) > len(module_name)}
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
    from .big_model.hooks import _ATTR as DISPATCH_HOOK
    from .hooks import AlignDevicesHook, iter_hooks

    if getattr(getattr(module, DISPATCH_HOOK, None), "units", None):
        return True
    return any(isinstance(h, AlignDevicesHook) and h.offload for h in iter_hooks(module))


@contextlib.contextmanager
def align_module_device(module: nn.Module, execution_device: Any = None) -> Iterator[None]:
    """Within the block the module's weights are real tensors: offloaded ones brought in as for a forward,
    or, with ``execution_device``, its own parameters moved there (and back afterwards).

        with align_module_device(layer):
            print(layer.weight.sum())      # readable although layer is offloaded
    """
    from .big_model.hooks import _ATTR as DISPATCH_HOOK
    from .hooks import AlignDevicesHook, iter_hooks

    dispatch_hook = getattr(module, DISPATCH_HOOK, None)
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
            hook.execution_device = torch.device(execution_device) if not isinstance(execution_device, int) else (
                torch.device("cuda", execution_device)
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
