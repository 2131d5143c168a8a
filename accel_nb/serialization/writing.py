"""Writing the sharded layout: dedupe shared storage, split into shards, write atomically, index last."""

from __future__ import annotations

import json
import os
import re
import uuid
from collections.abc import Iterable, Mapping

import torch

from .files import (
    ALIASES_KEY,
    SAFE_INDEX_SUFFIX,
    SAFE_WEIGHTS_NAME,
    SAVE_ID_KEY,
    CheckpointError,
    atomic_save_file,
    atomic_torch_save,
    atomic_write_bytes,
    fsync_path,
    parse_size,
)


# -- planning: dedupe shared storage, make tensors writable, split into shards --------------------------
def _storage_key(t: torch.Tensor) -> tuple:
    try:
        ptr = t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):  # tensor subclasses without a storage of their own
        ptr = id(t)
    return (t.device.type, t.device.index, ptr)


def dedupe_shared_tensors(
    state_dict: Mapping[str, torch.Tensor],
) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Split a state dict into tensors to write and aliases (tied name -> first name).

    Exact aliases (same storage, offset, shape, stride, dtype) are kept once; other views that only
    share storage (slices, transposes) are cloned so each is written on its own.
    """
    to_write: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = {}
    exact: dict[tuple, str] = {}
    seen_storage: set[tuple] = set()
    for name, tensor in state_dict.items():
        if not isinstance(tensor, torch.Tensor):
            raise CheckpointError(
                f"state dict entry {name!r} is a {type(tensor).__name__}, not a tensor; safetensors holds "
                "tensors only -- save other values separately (e.g. in a JSON file)"
            )
        if tensor.device.type == "meta":
            raise CheckpointError(
                f"tensor {name!r} is on the meta device (no data); load or materialise the weights "
                "before saving them"
            )
        tensor = tensor.detach()
        if tensor.numel() == 0:
            to_write[name] = tensor.contiguous()
            continue
        skey = _storage_key(tensor)
        key = skey + (tensor.storage_offset(), tuple(tensor.shape), tuple(tensor.stride()), tensor.dtype)
        if key in exact:
            aliases[name] = exact[key]
            continue
        exact[key] = name
        if skey in seen_storage or not tensor.is_contiguous():
            tensor = tensor.contiguous().clone() if tensor.is_contiguous() else tensor.contiguous()
        seen_storage.add(skey)
        to_write[name] = tensor
    # a storage may be shared by a first tensor that is a full view and a later partial one; the
    # first one was not cloned, the later ones were: nothing written twice refers to one storage.
    return to_write, aliases


def plan_shards(sizes: Iterable[tuple[str, int]], max_shard_size: int) -> list[list[str]]:
    """Group names into shards in order, each at most ``max_shard_size`` bytes (one big tensor
    alone in its shard may exceed it)."""
    shards: list[list[str]] = [[]]
    current = 0
    for name, nbytes in sizes:
        if shards[-1] and current + nbytes > max_shard_size:
            shards.append([])
            current = 0
        shards[-1].append(name)
        current += nbytes
    return shards if shards[0] else []


def shard_file_name(weights_name: str, index: int, count: int) -> str:
    """``model.safetensors``, 2, 5 -> ``model-00002-of-00005.safetensors``."""
    stem, dot, ext = weights_name.rpartition(".")
    if not dot:
        stem, ext = weights_name, ""
    return f"{stem}-{index:05d}-of-{count:05d}" + (f".{ext}" if ext else "")


def _remove_stale_shards(save_directory: str, weights_name: str, keep: set[str]) -> None:
    stem, _, ext = weights_name.rpartition(".")
    pattern = re.compile(re.escape(stem) + r"-\d{5}-of-\d{5}\." + re.escape(ext) + "$")
    for entry in os.listdir(save_directory):
        if entry not in keep and pattern.match(entry):
            os.remove(os.path.join(save_directory, entry))


def save_sharded_safetensors(
    state_dict: Mapping[str, torch.Tensor],
    save_directory: str,
    max_shard_size: int | str = "10GB",
    weights_name: str = SAFE_WEIGHTS_NAME,
    metadata: Mapping[str, str] | None = None,
    safe_serialization: bool = True,
) -> list[str]:
    """Write a state dict as one safetensors file or as shards plus an index; returns the paths.

        save_sharded_safetensors(model.state_dict(), "out", max_shard_size="2GB")

    Each file goes through a temp file beside it (fsync, rename); the index is written last and
    shards left over from an earlier save with the same name are removed.
    ``safe_serialization=False`` writes the same layout with ``torch.save`` (``.bin`` names).
    """
    limit = parse_size(max_shard_size)
    if not safe_serialization and weights_name == SAFE_WEIGHTS_NAME:
        weights_name = "pytorch_model.bin"
    os.makedirs(save_directory, exist_ok=True)
    tensors, aliases = dedupe_shared_tensors(state_dict)
    sizes = [(n, t.numel() * t.element_size()) for n, t in tensors.items()]
    shards = plan_shards(sizes, limit) or [[]]
    file_meta = {"format": "pt", **{str(k): str(v) for k, v in (metadata or {}).items()}}
    if aliases:
        file_meta[ALIASES_KEY] = json.dumps(aliases, sort_keys=True)
    index_path = os.path.join(save_directory, weights_name + SAFE_INDEX_SUFFIX)
    single_path = os.path.join(save_directory, weights_name)

    names = (
        [weights_name]
        if len(shards) == 1
        else [shard_file_name(weights_name, i + 1, len(shards)) for i in range(len(shards))]
    )
    save_id = uuid.uuid4().hex
    if len(shards) > 1:
        file_meta[SAVE_ID_KEY] = save_id
    written: list[str] = []
    for file_name, shard in zip(names, shards):
        path = os.path.join(save_directory, file_name)
        part = {n: tensors[n] for n in shard}
        if safe_serialization:
            atomic_save_file(part, path, file_meta)
        else:
            atomic_torch_save(part, path)
        written.append(path)

    if len(shards) == 1:
        for stale in (index_path,):
            if os.path.exists(stale):
                os.remove(stale)
        _remove_stale_shards(save_directory, weights_name, keep=set())
    else:
        weight_map = {n: file_name for file_name, shard in zip(names, shards) for n in shard}
        index = {
            "metadata": {
                "total_size": sum(s for _, s in sizes),
                "save_id": save_id,
                **({"aliases": aliases} if aliases else {}),
            },
            "weight_map": dict(sorted(weight_map.items())),
        }
        atomic_write_bytes(index_path, (json.dumps(index, indent=2) + "\n").encode())
        written.append(index_path)
        if os.path.exists(single_path):
            os.remove(single_path)
        _remove_stale_shards(save_directory, weights_name, keep=set(names))
    fsync_path(save_directory)
    return written
