"""One tensor of a module by its dotted name: move or replace it, list them, find ties, read a weights file.

    set_module_tensor_to_device(model, "lm_head.weight", "cpu", value=torch.zeros(10, 4))
    find_tied_parameters(model)            # [['embed.weight', 'lm_head.weight']]

Served at the reference's ``accelerate.utils.modeling`` path by ``accel_nb.utils.modeling``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import nn

from .planning.sizes import normalize_device, tied_parameter_groups, torch_device

__all__ = [
    "find_tied_parameters",
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
            raise ValueError(
                f"{type(module).__name__} has no submodule {path!r} (looking up {tensor_name!r})"
            )
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
        raise ValueError(
            f"{tensor_name!r} is on the meta device (no data); pass value= to put it on {target}"
        )
    if tied_params_map is not None and old.device.type != "meta":
        reuse = tied_params_map.get(old.data_ptr(), {}).get(target)
        if reuse is not None and value is None:
            _install(owner, attr, is_param, old, reuse)
            return
    if value is not None:
        value = torch.as_tensor(value)
        if value.shape != old.shape:
            error = ValueError(  # the reference's words, with the attribute's name (code matches on them)
                f'Trying to set a tensor of shape {value.shape} in "{attr}" (which has shape {old.shape}), '
                "this looks incorrect."
            )
            error.add_note(
                f"{tensor_name!r}: pass a tensor of the module's shape (a checkpoint for another configuration "
                "of the model gives such shapes)"
            )
            raise error
        if dtype is not None:
            from .planning.sizes import as_dtype

            if value.is_floating_point():
                value = value.to(as_dtype(dtype))
        else:
            value = value.to(old.dtype)
    source = old if value is None else value
    with torch.no_grad():
        new = source.to(target, non_blocking=non_blocking)
    _install(owner, attr, is_param, old, new)
    if tied_params_map is not None and old.device.type != "meta" and old.data_ptr() in tied_params_map:
        tied_params_map[old.data_ptr()][target] = (
            owner._parameters[attr] if is_param else owner._buffers[attr]
        )
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
    module: nn.Module,
    include_buffers: bool = True,
    recurse: bool = False,
    remove_non_persistent: bool = False,
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
    allow_pickle: bool = True,
) -> dict[str, torch.Tensor]:
    """Read one weights file (safetensors, or a torch pickle) into a dict.

    With ``device_map`` each tensor goes to the device of the module that holds it ('disk' means
    CPU here). Pickle files are read as the reference reads them, with ``torch.load(weights_only=True)``
    (torch's restricted unpickler: tensors and plain containers, no other object);
    ``allow_pickle=False`` refuses them.

        state = load_state_dict("model.safetensors", device_map={"": "cpu"})
    """
    path = os.fspath(checkpoint_file)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path} is not a file; pass the path of one .safetensors (or .bin) file")
    if path.endswith(".safetensors"):
        from ..serialization import load_safetensors_state_dict

        state = load_safetensors_state_dict(path)
    elif path.endswith(_PICKLE_SUFFIXES):
        if not allow_pickle:
            raise ValueError(
                f"{path} is a pickle file and allow_pickle=False refuses pickle files; convert it to "
                "safetensors, or drop allow_pickle=False (it is then read with torch.load(weights_only=True))"
            )
        state = torch.load(path, map_location="cpu", weights_only=True)
    else:
        raise ValueError(
            f"{path}: unknown weights format; use a .safetensors file (or a .bin/.pt/.pth torch pickle)"
        )
    if device_map is None:
        return state
    return {name: t.to(_device_for(device_map, name)) for name, t in state.items()}
