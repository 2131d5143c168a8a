"""Reading the sharded layout: headers (cheap), a validated index of every tensor, loading into a model."""

from __future__ import annotations

import json
import os
import re
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from .files import ALIASES_KEY, SAFE_INDEX_SUFFIX, SAFE_WEIGHTS_NAME, SAVE_ID_KEY, CheckpointError

_MAX_HEADER_BYTES = 100 * 1024 * 1024

# safetensors dtype tag -> (torch dtype name, bytes per element)
_DTYPES: dict[str, tuple[str, float]] = {
    "F64": ("float64", 8),
    "F32": ("float32", 4),
    "F16": ("float16", 2),
    "BF16": ("bfloat16", 2),
    "I64": ("int64", 8),
    "I32": ("int32", 4),
    "I16": ("int16", 2),
    "I8": ("int8", 1),
    "U64": ("uint64", 8),
    "U32": ("uint32", 4),
    "U16": ("uint16", 2),
    "U8": ("uint8", 1),
    "BOOL": ("bool", 1),
    "F8_E4M3": ("float8_e4m3fn", 1),
    "F8_E5M2": ("float8_e5m2", 1),
    "F8_E8M0": ("float8_e8m0fnu", 1),
    "C64": ("complex64", 8),
}


# -- reading headers (cheap) ------------------------------------------------------------------------
@dataclass
class TensorHeader:
    dtype: str
    shape: tuple[int, ...]
    offsets: tuple[int, int]


def read_safetensors_header(path: str) -> tuple[dict[str, TensorHeader], dict[str, str]]:
    """Parse and validate a safetensors header without reading tensor data.

    Returns ``(tensors, metadata)``; raises ``CheckpointError`` naming the file when it is
    truncated or corrupted.
    """
    fix = "re-save it or copy it again"
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise CheckpointError(f"{path} is truncated ({size} bytes, not even a header); {fix}")
            (n,) = struct.unpack("<Q", head)
            if n > _MAX_HEADER_BYTES or 8 + n > size:
                raise CheckpointError(
                    f"{path} is truncated or not a safetensors file (header claims {n} bytes, file has "
                    f"{size}); {fix}"
                )
            raw = f.read(n)
    except OSError as exc:
        raise CheckpointError(f"cannot read {path}: {exc}") from exc
    try:
        header = json.loads(raw.decode("utf-8"))
        if not isinstance(header, dict):
            raise ValueError("header is not a JSON object")
    except (UnicodeDecodeError, ValueError) as exc:
        raise CheckpointError(f"{path} has a corrupted safetensors header ({exc}); {fix}") from None
    metadata = header.pop("__metadata__", None) or {}
    tensors: dict[str, TensorHeader] = {}
    data_len = size - 8 - n
    end_max = 0
    for name, info in header.items():
        try:
            dtype = info["dtype"]
            shape = tuple(int(d) for d in info["shape"])
            begin, end = (int(x) for x in info["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise CheckpointError(f"{path}: corrupted header entry for tensor {name!r}; {fix}") from None
        if dtype not in _DTYPES:
            raise CheckpointError(f"{path}: tensor {name!r} has unknown dtype {dtype!r}; {fix}")
        numel = 1
        for d in shape:
            numel *= d
        expected = int(numel * _DTYPES[dtype][1])
        if end < begin or end - begin != expected:
            raise CheckpointError(
                f"{path}: tensor {name!r} ({dtype}{list(shape)}) should take {expected} bytes but its "
                f"offsets {begin}..{end} say {end - begin}; {fix}"
            )
        if end > data_len:
            raise CheckpointError(
                f"{path} is truncated: tensor {name!r} ends at byte {8 + n + end} but the file has only "
                f"{size} bytes; {fix}"
            )
        end_max = max(end_max, end)
        tensors[name] = TensorHeader(dtype, shape, (begin, end))
    if end_max != data_len:
        raise CheckpointError(
            f"{path} has {data_len - end_max} unexpected trailing bytes after its tensors (header says the "
            f"file ends at byte {8 + n + end_max}, it has {size}); the file is corrupted -- {fix}"
        )
    return tensors, {str(k): str(v) for k, v in metadata.items()}


# -- indexing a checkpoint ----------------------------------------------------------------------------
@dataclass
class CheckpointIndex:
    """Where each tensor of a safetensors checkpoint lives (absolute paths), from headers only."""

    files: list[str]
    weight_map: dict[str, str]
    metadata: dict[str, Any] = field(default_factory=dict)
    aliases: dict[str, str] = field(default_factory=dict)
    headers: dict[str, dict[str, TensorHeader]] = field(default_factory=dict, repr=False)
    index_file: str | None = None

    def names(self) -> list[str]:
        """Every tensor name the checkpoint provides: saved ones and tied aliases."""
        return list(self.weight_map) + [a for a in self.aliases if a not in self.weight_map]

    def resolve(self, name: str) -> str:
        """The saved name behind ``name`` (itself, or the tensor an alias is tied to)."""
        return name if name in self.weight_map else self.aliases.get(name, name)

    def file_of(self, name: str) -> str:
        return self.weight_map[self.resolve(name)]

    def __contains__(self, name: object) -> bool:
        return name in self.weight_map or name in self.aliases

    @property
    def total_size(self) -> int:
        return sum(h.offsets[1] - h.offsets[0] for f in self.files for h in self.headers.get(f, {}).values())


def _find_in_folder(folder: str) -> str:
    candidates = [
        os.path.join(folder, SAFE_WEIGHTS_NAME + SAFE_INDEX_SUFFIX),
        os.path.join(folder, SAFE_WEIGHTS_NAME),
    ]
    for c in candidates:
        if os.path.isfile(c):
            return c
    entries = sorted(os.listdir(folder))
    indexes = [e for e in entries if e.endswith(".safetensors" + SAFE_INDEX_SUFFIX)]
    if len(indexes) == 1:
        return os.path.join(folder, indexes[0])
    singles = [e for e in entries if e.endswith(".safetensors") and not re.search(r"-\d{5}-of-\d{5}\.", e)]
    if not indexes and len(singles) == 1:
        return os.path.join(folder, singles[0])
    if len(indexes) > 1 or len(singles) > 1:
        found = indexes if len(indexes) > 1 else singles
        raise CheckpointError(f"{folder} holds several checkpoints ({', '.join(found)}); pass the one to use")
    pickles = [e for e in entries if e.endswith((".bin", ".pt", ".pth"))]
    hint = (
        f" It has pickle files ({', '.join(pickles[:3])}); load those with torch.load(weights_only=True) "
        "or convert them to safetensors."
        if pickles
        else ""
    )
    raise CheckpointError(
        f"no safetensors checkpoint in {folder}: expected {SAFE_WEIGHTS_NAME} or "
        f"{SAFE_WEIGHTS_NAME}{SAFE_INDEX_SUFFIX}.{hint}"
    )


def _aliases_from(metadata: Mapping[str, str], path: str) -> dict[str, str]:
    raw = metadata.get(ALIASES_KEY)
    if not raw:
        return {}
    try:
        value = json.loads(raw)
        return {str(k): str(v) for k, v in value.items()}
    except (ValueError, AttributeError):
        raise CheckpointError(
            f"{path}: metadata {ALIASES_KEY!r} is not a JSON object; re-save the file"
        ) from None


def index_checkpoint(path: str | os.PathLike) -> CheckpointIndex:
    """Index a safetensors checkpoint (file, folder or ``*.index.json``) and validate it cheaply.

        index = index_checkpoint("out/")            # or "out/model.safetensors.index.json"
        index.weight_map["lm_head.weight"]          # -> absolute path of its shard

    Checks, without reading tensor data: every shard exists, every header parses and matches the
    file size, every tensor named by the index is in its shard.
    """
    path = os.path.abspath(os.fspath(path))
    if os.path.isdir(path):
        path = _find_in_folder(path)
    if not os.path.exists(path):
        raise CheckpointError(f"checkpoint {path} does not exist; check the path")
    if path.endswith(".json"):
        return _index_from_json(path)
    tensors, metadata = read_safetensors_header(path)
    return CheckpointIndex(
        files=[path],
        weight_map={name: path for name in tensors},
        metadata=metadata,
        aliases={a: t for a, t in _aliases_from(metadata, path).items() if a not in tensors},
        headers={path: tensors},
    )


def _index_from_json(index_file: str) -> CheckpointIndex:
    try:
        with open(index_file, encoding="utf-8") as f:
            data = json.load(f)
        weight_map = data["weight_map"]
        if not isinstance(weight_map, dict):
            raise TypeError("weight_map is not an object")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(
            f"{index_file} is not a valid checkpoint index ({type(exc).__name__}: {exc}); it needs "
            '{"metadata": {...}, "weight_map": {tensor: file}} -- re-save the checkpoint'
        ) from None
    folder = os.path.dirname(index_file)
    metadata = data.get("metadata") or {}
    files: list[str] = []
    abs_map: dict[str, str] = {}
    for name, rel in weight_map.items():
        full = os.path.join(folder, rel)
        abs_map[name] = full
        if full not in files:
            files.append(full)
    missing = [f for f in files if not os.path.isfile(f)]
    if missing:
        raise CheckpointError(
            f"shard {os.path.basename(missing[0])} named by {index_file} is missing"
            + (
                f" (and {len(missing) - 1} more: {', '.join(os.path.basename(m) for m in missing[1:4])})"
                if len(missing) > 1
                else ""
            )
            + "; copy the complete checkpoint folder"
        )
    headers: dict[str, dict[str, TensorHeader]] = {}
    aliases: dict[str, str] = {}
    for f in files:
        tensors, meta = read_safetensors_header(f)
        headers[f] = tensors
        aliases.update(_aliases_from(meta, f))
        if metadata.get("save_id") and meta.get(SAVE_ID_KEY) != metadata["save_id"]:
            raise CheckpointError(
                f"shard {os.path.basename(f)} does not belong to the save described by {index_file} (a save "
                "into this folder was interrupted, or files from two saves were mixed); save the model again"
            )
    for name, f in abs_map.items():
        if name not in headers[f]:
            raise CheckpointError(
                f"{index_file} says tensor {name!r} is in {os.path.basename(f)}, but that shard has no such "
                "tensor; the index and the shards come from different saves -- re-save the checkpoint"
            )
    aliases.update({str(k): str(v) for k, v in (metadata.get("aliases") or {}).items()})
    aliases = {a: t for a, t in aliases.items() if a not in abs_map}
    return CheckpointIndex(
        files=files,
        weight_map=abs_map,
        metadata=metadata,
        aliases=aliases,
        headers=headers,
        index_file=index_file,
    )


def tensor_info(index: CheckpointIndex, name: str) -> tuple[torch.dtype, tuple[int, ...]]:
    """``(torch dtype, shape)`` of a tensor from the headers (no data read); aliases resolve.

    dtype, shape = tensor_info(index, "lm_head.weight")
    """
    saved = index.resolve(name)
    if saved not in index.weight_map:
        raise CheckpointError(f"tensor {name!r} is not in checkpoint {index.index_file or index.files[0]}")
    header = index.headers[index.weight_map[saved]][saved]
    return getattr(torch, _DTYPES[header.dtype][0]), header.shape


# -- loading ----------------------------------------------------------------------------------------
@dataclass
class LoadResult:
    """What a load matched: keys the target wanted but the checkpoint lacks, and the reverse."""

    missing_keys: list[str]
    unexpected_keys: list[str]


def _as_index(checkpoint: CheckpointIndex | str | os.PathLike) -> CheckpointIndex:
    return checkpoint if isinstance(checkpoint, CheckpointIndex) else index_checkpoint(checkpoint)


def check_against(
    index: CheckpointIndex,
    expected: Mapping[str, torch.Size | tuple[int, ...]],
    strict: bool = True,
    what: str = "model",
) -> LoadResult:
    """Compare a checkpoint with the names and shapes a target expects; one error listing every problem."""
    where = index.index_file or index.files[0]
    available = set(index.names())
    missing = sorted(k for k in expected if k not in available)
    unexpected = sorted(k for k in available if k not in expected)
    mismatched = []
    for name, shape in expected.items():
        if name in available:
            _, saved_shape = tensor_info(index, name)
            if tuple(saved_shape) != tuple(shape):
                mismatched.append(
                    f"{name!r}: checkpoint {list(saved_shape)} in {os.path.basename(index.file_of(name))}, "
                    f"{what} {list(shape)}"
                )
    problems = []
    if mismatched:
        problems.append(f"{len(mismatched)} shape mismatch(es): " + "; ".join(mismatched))
    if strict and missing:
        problems.append(
            f"{len(missing)} missing key(s): "
            + ", ".join(missing[:20])
            + (" ..." if len(missing) > 20 else "")
        )
    if strict and unexpected:
        problems.append(
            f"{len(unexpected)} unexpected key(s): "
            + ", ".join(unexpected[:20])
            + (" ..." if len(unexpected) > 20 else "")
        )
    if problems:
        raise CheckpointError(
            f"checkpoint {where} does not match the {what} (nothing was loaded): "
            + " | ".join(problems)
            + ". Build the same architecture/config that was saved"
            + (
                ""
                if not (missing or unexpected) or not strict
                else ", or pass strict=False to skip missing/unexpected keys"
            )
        )
    return LoadResult(missing, unexpected)


def load_safetensors_into(
    target: torch.nn.Module | dict[str, torch.Tensor],
    checkpoint: CheckpointIndex | str | os.PathLike,
    strict: bool = True,
) -> LoadResult:
    """Load a safetensors checkpoint into a module (or a dict of tensors, in place), file by file.

        load_safetensors_into(model, "out/")     # raises CheckpointError before copying anything

    Names, shapes and aliases are checked first from the headers; only then is each file
    memory-mapped and its tensors copied into place (dtype converted to the target's).
    """
    from safetensors import safe_open

    index = _as_index(checkpoint)
    if isinstance(target, torch.nn.Module):
        current = target.state_dict()
        what = type(target).__name__
    else:
        current = target
        what = "state dict"
    metas = [k for k, v in current.items() if isinstance(v, torch.Tensor) and v.device.type == "meta"]
    if metas:
        raise CheckpointError(
            f"{what} has tensors on the meta device ({', '.join(metas[:5])}); use "
            "accel_nb.load_checkpoint_in_model for models built with init_empty_weights"
        )
    expected = {k: tuple(v.shape) for k, v in current.items() if isinstance(v, torch.Tensor)}
    result = check_against(index, expected, strict=strict, what=what)

    wanted: dict[str, list[str]] = {}  # file -> saved names to read
    for name in expected:
        if name in index:
            saved = index.resolve(name)
            wanted.setdefault(index.weight_map[saved], [])
            if saved not in wanted[index.weight_map[saved]]:
                wanted[index.weight_map[saved]].append(saved)
    users: dict[str, list[str]] = {}  # saved name -> target names filled from it
    for name in expected:
        if name in index:
            users.setdefault(index.resolve(name), []).append(name)

    for file in index.files:
        names = wanted.get(file)
        if not names:
            continue
        with safe_open(file, framework="pt", device="cpu") as f:
            part: dict[str, torch.Tensor] = {}
            for saved in names:
                tensor = f.get_tensor(saved)
                for name in users[saved]:
                    part[name] = tensor
            if isinstance(target, torch.nn.Module):
                target.load_state_dict(part, strict=False)
            else:
                with torch.no_grad():
                    for name, tensor in part.items():
                        target[name].copy_(tensor)
    return result


def load_safetensors_state_dict(
    checkpoint: CheckpointIndex | str | os.PathLike, device: str | torch.device = "cpu"
) -> dict[str, torch.Tensor]:
    """Read a whole safetensors checkpoint into a new state dict; aliases share their tensor."""
    from safetensors import safe_open

    index = _as_index(checkpoint)
    out: dict[str, torch.Tensor] = {}
    for file in index.files:
        with safe_open(file, framework="pt", device=str(device)) as f:
            for name, where in index.weight_map.items():
                if where == file:
                    out[name] = f.get_tensor(name)
    for alias, saved in index.aliases.items():
        if saved in out:
            out[alias] = out[saved]
    return out
