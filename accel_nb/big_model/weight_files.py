"""The reference library's offload folder format: one raw ``<name>.dat`` array per tensor and an
``index.json`` of dtypes and shapes, read back lazily as a mapping.

    offload_state_dict("offload", model.state_dict())          # offload/<name>.dat + offload/index.json
    weights = OffloadedWeightsLoader(save_folder="offload")     # weights["lm_head.weight"] reads one file
    add_hook_to_module(layer, AlignDevicesHook("cpu", offload=True, weights_map=PrefixedDataset(weights, "0.")))

A folder written here reads with the reference's loader and the other way round. accel_nb's own
offloading (``disk_offload``, ``dispatch_model``) keeps safetensors files instead.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from typing import Any

import torch

__all__ = [
    "OffloadedWeightsLoader",
    "PrefixedDataset",
    "extract_submodules_state_dict",
    "load_offloaded_weight",
    "offload_state_dict",
    "offload_weight",
    "save_offload_index",
]

_INDEX = "index.json"


def offload_weight(
    weight: torch.Tensor, weight_name: str, offload_folder: str | os.PathLike, index: dict | None = None
) -> dict | None:
    """Write ``weight`` to ``<offload_folder>/<weight_name>.dat``; record its dtype and shape in ``index``.

    bfloat16 and float8 tensors are stored as their raw 2- or 1-byte integers (numpy has no such
    floats) and named by their torch dtype in the index. Returns ``index``.
    """
    import numpy as np

    dtype_name = None
    if weight.dtype == torch.bfloat16:
        weight, dtype_name = weight.view(torch.int16), "bfloat16"
    elif str(weight.dtype).startswith("torch.float8_"):
        weight, dtype_name = weight.view(torch.int8), str(weight.dtype).split(".")[1]
    array = weight.detach().cpu().numpy()
    if index is not None:
        index[weight_name] = {"dtype": dtype_name or str(array.dtype), "shape": list(array.shape)}
    if array.ndim == 0:  # a memmap needs at least one dimension
        array = array.reshape(1)
    target = np.memmap(
        os.path.join(offload_folder, f"{weight_name}.dat"), dtype=array.dtype, mode="w+", shape=array.shape
    )
    target[:] = array[:]
    target.flush()
    return index


def load_offloaded_weight(weight_file: str | os.PathLike, weight_info: Mapping[str, Any]) -> torch.Tensor:
    """The tensor :func:`offload_weight` wrote to ``weight_file`` (``weight_info`` is its index entry)."""
    import numpy as np

    dtype_name, shape = weight_info["dtype"], tuple(weight_info["shape"])
    stored = (
        "int16" if dtype_name == "bfloat16" else "int8" if dtype_name.startswith("float8_") else dtype_name
    )
    array = np.memmap(weight_file, dtype=stored, shape=shape or (1,), mode="r")
    tensor = torch.tensor(array[0] if not shape else array)
    if dtype_name == "bfloat16" or dtype_name.startswith("float8_"):
        tensor = tensor.view(getattr(torch, dtype_name))
    return tensor


def save_offload_index(index: Mapping[str, Any] | None, offload_folder: str | os.PathLike) -> None:
    """Merge ``index`` into ``<offload_folder>/index.json`` (created if absent); an empty index writes nothing."""
    if not index:
        return
    path = os.path.join(offload_folder, _INDEX)
    merged: dict[str, Any] = {}
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            merged = json.load(f)
    merged.update(index)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(merged, f, indent=2)


def offload_state_dict(save_dir: str | os.PathLike, state_dict: Mapping[str, torch.Tensor]) -> None:
    """Write every tensor of ``state_dict`` to ``save_dir`` (created if needed) with its ``index.json``."""
    os.makedirs(save_dir, exist_ok=True)
    index: dict[str, Any] = {}
    for name, tensor in state_dict.items():
        offload_weight(tensor, name, save_dir, index=index)
    save_offload_index(index, save_dir)


class PrefixedDataset(Mapping):
    """``dataset`` seen from a submodule: ``view["weight"]`` reads ``dataset[prefix + "weight"]``.

    Iterates over the keys that start with ``prefix`` (full names); ``len`` is the whole dataset's,
    as in the reference.
    """

    def __init__(self, dataset: Mapping, prefix: str) -> None:
        self.dataset = dataset
        self.prefix = prefix

    def __getitem__(self, key: str) -> Any:
        return self.dataset[f"{self.prefix}{key}"]

    def __iter__(self) -> Iterator[str]:
        return iter([key for key in self.dataset if key.startswith(self.prefix)])

    def __len__(self) -> int:
        return len(self.dataset)


class OffloadedWeightsLoader(Mapping):
    """Weights by name from a ``state_dict`` in memory and/or a folder of offloaded ones, each read when asked.

    An index entry with ``safetensors_file`` is read from that file (``weight_name`` inside it,
    cast to ``dtype`` if given); others from ``<save_folder>/<name>.dat``. The in-memory
    ``state_dict`` wins over the index.
    """

    def __init__(
        self,
        state_dict: Mapping[str, torch.Tensor] | None = None,
        save_folder: str | os.PathLike | None = None,
        index: Mapping[str, Any] | None = None,
        device: Any = None,
    ) -> None:
        if state_dict is None and save_folder is None and index is None:
            raise ValueError(
                "Need either a `state_dict`, a `save_folder` or an `index` containing offloaded weights."
            )
        self.state_dict = dict(state_dict or {})
        self.save_folder = save_folder
        if index is None and save_folder is not None:
            with open(os.path.join(save_folder, _INDEX), encoding="utf-8") as f:
                index = json.load(f)
        self.index = dict(index or {})
        self.all_keys = list(self.state_dict) + [k for k in self.index if k not in self.state_dict]
        self.device = device

    def __getitem__(self, key: str) -> torch.Tensor:
        if key in self.state_dict:
            return self.state_dict[key]
        info = self.index[key]
        if info.get("safetensors_file") is None:
            return load_offloaded_weight(os.path.join(self.save_folder, f"{key}.dat"), info)
        from safetensors import safe_open

        device = "cpu" if self.device is None else self.device
        with safe_open(info["safetensors_file"], framework="pt", device="cpu") as f:
            tensor = f.get_tensor(info.get("weight_name", key))
        if "dtype" in info:
            tensor = tensor.to(getattr(torch, info["dtype"]))
        return tensor.to(device)

    def __iter__(self) -> Iterator[str]:
        return iter(self.all_keys)

    def __len__(self) -> int:
        return len(self.all_keys)


def extract_submodules_state_dict(
    state_dict: Mapping[str, torch.Tensor], submodule_names: list[str]
) -> dict[str, torch.Tensor]:
    """The entries of ``state_dict`` under any of ``submodule_names`` (``h.1`` takes ``h.1.*``, not ``h.10.*``)."""
    result: dict[str, torch.Tensor] = {}
    for module_name in submodule_names:
        result.update(
            {k: v for k, v in state_dict.items() if k == module_name or k.startswith(module_name + ".")}
        )
    return result
