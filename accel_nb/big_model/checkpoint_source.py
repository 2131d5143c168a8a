"""Where a checkpoint's tensors come from, before anything is read: safetensors (memory-mapped, indexed
by name) or torch pickle files (read here with ``torch.load(weights_only=True)``, torch's restricted
unpickler, unless the caller passes ``weights_only=False``).

    source, pickled = open_source("ckpt_dir", allow_pickle=True, weights_only=True)
    source.file_of["head.weight"], source.shapes["head.weight"]

A pickle checkpoint is one file, or shards named by an index: transformers' ``{"weight_map": ...}`` or
the reference's bare ``{name: file}`` mapping, given as the index file or its folder.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from ..serialization import CheckpointError, CheckpointIndex, index_checkpoint, tensor_info

__all__ = [
    "CheckpointLoadError",
    "CheckpointSource",
    "PICKLE_SUFFIXES",
    "open_source",
    "pickle_files",
    "pickle_index",
]

PICKLE_SUFFIXES = (".bin", ".pt", ".pth")


class CheckpointLoadError(CheckpointError):
    """The checkpoint does not fit the model (missing/unexpected keys, shapes, unassigned modules)."""


@dataclass
class CheckpointSource:
    files: list[str]
    names_in: dict[str, list[str]]  # file -> saved names
    aliases: dict[str, str]  # alias -> saved name
    shapes: dict[str, tuple[int, ...]]
    dtypes: dict[str, torch.dtype]
    file_of: dict[str, str]
    safetensors: bool


def pickle_index(index_file: str) -> list[str]:
    folder = os.path.dirname(index_file)
    try:
        with open(index_file, encoding="utf-8") as f:
            index = json.load(f)
        # {"weight_map": {name: file}, ...} as transformers writes it, or the bare mapping (the reference
        # reads both)
        weight_map = index["weight_map"] if "weight_map" in index else index
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise ValueError("not a mapping of tensor names to shard files")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointLoadError(
            f"{index_file} is not a valid checkpoint index ({exc}); re-save the checkpoint"
        ) from None
    return [os.path.join(folder, x) for x in dict.fromkeys(weight_map.values())]


def pickle_files(checkpoint: str) -> list[str] | None:
    if os.path.isfile(checkpoint) and checkpoint.endswith(".index.json"):
        return None if checkpoint.endswith(".safetensors.index.json") else pickle_index(checkpoint)
    if os.path.isfile(checkpoint):
        return [checkpoint] if checkpoint.endswith(PICKLE_SUFFIXES) else None
    if os.path.isdir(checkpoint):
        entries = sorted(os.listdir(checkpoint))
        if any(e.endswith(".safetensors") or e.endswith(".safetensors.index.json") for e in entries):
            return None
        idx = [e for e in entries if e.endswith(".index.json")]  # no safetensors: an index of pickle shards
        if len(idx) == 1:
            return pickle_index(os.path.join(checkpoint, idx[0]))
        pickles = [e for e in entries if e.endswith(PICKLE_SUFFIXES)]
        if len(pickles) == 1:
            return [os.path.join(checkpoint, pickles[0])]
    return None


def open_source(
    checkpoint: str, allow_pickle: bool, weights_only: bool
) -> tuple[CheckpointSource, dict[str, dict]]:
    """Index the checkpoint; pickle files are loaded (mmap) here and returned as state dicts."""
    pickles = pickle_files(checkpoint)
    if pickles is None:
        index: CheckpointIndex = index_checkpoint(checkpoint)
        names_in: dict[str, list[str]] = defaultdict(list)
        for name, f in index.weight_map.items():
            names_in[f].append(name)
        shapes, dtypes = {}, {}
        for name in index.weight_map:
            dtypes[name], shape = tensor_info(index, name)
            shapes[name] = tuple(shape)
        return CheckpointSource(
            index.files, dict(names_in), dict(index.aliases), shapes, dtypes, dict(index.weight_map), True
        ), {}
    if not allow_pickle:
        raise CheckpointLoadError(
            f"{checkpoint} is a pickle checkpoint ({', '.join(os.path.basename(p) for p in pickles[:3])}) and "
            "allow_pickle=False refuses pickle files; convert it to safetensors, or drop allow_pickle=False (it "
            "is then read with torch.load(weights_only=True), which builds tensors only)"
        )
    loaded: dict[str, dict] = {}
    src = CheckpointSource(pickles, {}, {}, {}, {}, {}, False)
    for path in pickles:
        if not os.path.isfile(path):
            raise CheckpointLoadError(
                f"shard {path} named by the index is missing; copy the complete checkpoint"
            )
        try:
            sd = torch.load(path, map_location="cpu", weights_only=weights_only, mmap=True)
        except Exception as exc:  # noqa: BLE001 - name the file and the way out
            raise CheckpointLoadError(
                f"cannot read {path} with torch.load(weights_only={weights_only}): {type(exc).__name__}: {exc}. "
                "If you trust the file, pass weights_only=False; better, convert it to safetensors"
            ) from None
        if isinstance(sd, Mapping) and "state_dict" in sd and isinstance(sd["state_dict"], Mapping):
            sd = sd["state_dict"]
        loaded[path] = sd
        src.names_in[path] = list(sd)
        for k, v in sd.items():
            src.shapes[k] = tuple(v.shape)
            src.dtypes[k] = v.dtype
            src.file_of[k] = path
    return src, loaded
