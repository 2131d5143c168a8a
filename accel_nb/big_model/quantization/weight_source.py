"""Where ``load_and_quantize_model`` reads float weights from: the model's tensors, and a checkpoint's.

``model_tensors`` lists a model's tensors (tied names share one ``ModelTensor``); ``WeightSource`` is a
safetensors checkpoint (each shard memory-mapped, its tensors viewed in place: no float copy on the heap)
or, without ``weights_location``, the model's own tensors; ``release_freed_memory`` hands the heap pages the
quantization kernels freed back to the OS.

    source = WeightSource(model, "ckpt_dir", model_tensors(model))
    for name, tensor in source.read(path, wanted, extra): ...
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ...serialization import CheckpointError, index_checkpoint, tensor_info
from .config import QuantizationError

__all__ = ["ModelTensor", "WeightSource", "mapped_tensors", "model_tensors", "release_freed_memory"]


@dataclass(eq=False)
class ModelTensor:
    """One model tensor (tied names share one): every owner that holds it."""

    names: list[str]
    owners: list[tuple[nn.Module, str, bool]] = field(default_factory=list)
    tensor: torch.Tensor | None = None


def model_tensors(model: nn.Module) -> dict[str, ModelTensor]:
    by_id: dict[int, ModelTensor] = {}
    out: dict[str, ModelTensor] = {}
    for mname, owner in model.named_modules(remove_duplicate=False):
        items = [(a, p, True) for a, p in owner._parameters.items()]
        items += [
            (a, b, False) for a, b in owner._buffers.items() if a not in owner._non_persistent_buffers_set
        ]
        for attr, t, is_param in items:
            if t is None:
                continue
            name = f"{mname}.{attr}" if mname else attr
            entry = by_id.setdefault(id(t), ModelTensor([], tensor=t))
            entry.names.append(name)
            entry.owners.append((owner, attr, is_param))
            out[name] = entry
    return out


# -- the source of float weights: a safetensors checkpoint, or the model's own tensors ---------------------
class WeightSource:
    """The float weights to quantize: a safetensors checkpoint, or the model's own tensors."""

    def __init__(self, model: nn.Module, weights_location: Any, tensors: dict[str, ModelTensor]) -> None:
        self.in_memory = weights_location is None
        if self.in_memory:
            if any(e.tensor.device.type == "meta" for e in tensors.values()):
                raise QuantizationError(
                    f"{type(model).__name__} has empty (meta) weights and no weights_location was given; pass "
                    "weights_location='checkpoint_dir' (a safetensors file, folder or index) to load them"
                )
            entries = list(dict.fromkeys(tensors.values()))
            self.files = ["(model)"]
            self.names_in = {"(model)": [e.names[0] for e in entries]}
            self.dtype = {e.names[0]: e.tensor.dtype for e in entries}
            self.shape = {e.names[0]: tuple(e.tensor.shape) for e in entries}
            self.aliases: dict[str, str] = {}
            self.where = f"the weights of {type(model).__name__}"
            return
        location = os.fspath(weights_location)
        try:
            index = index_checkpoint(location)
        except CheckpointError as exc:
            raise QuantizationError(
                f"cannot use weights_location={location!r}: {exc}. load_and_quantize_model reads safetensors "
                "checkpoints (a file, a shard folder or an *.index.json); convert pickle checkpoints first"
            ) from None
        self.index = index
        self.files = list(index.files)
        self.names_in = {f: [] for f in self.files}
        for name, f in index.weight_map.items():
            self.names_in[f].append(name)
        self.dtype, self.shape = {}, {}
        for name in index.weight_map:
            self.dtype[name], shape = tensor_info(index, name)
            self.shape[name] = tuple(shape)
        self.aliases = dict(index.aliases)
        self.where = f"checkpoint {location}"

    def saved_name(self, name: str) -> str | None:
        if name in self.dtype:
            return name
        alias = self.aliases.get(name)
        return alias if alias in self.dtype else None

    def read(self, path: str, wanted: Mapping[str, list[ModelTensor]], extra: Mapping[str, Any]):
        """Yield (saved name, tensor as saved) for the wanted (and ``extra``) tensors of one shard, on the CPU."""
        names = [n for n in self.names_in[path] if n in wanted or n in extra]
        if self.in_memory:
            for name in names:
                yield name, wanted[name][0].tensor.detach()
            return
        yield from mapped_tensors(path, names, self.index.headers[path], self.dtype)


def mapped_tensors(
    path: str, names: list[str], headers: Mapping[str, Any], dtypes: Mapping[str, torch.dtype]
):
    """Yield (name, tensor) viewing the memory-mapped file: no heap copy of the float weights.

    The pages read count once (the shard); they are released when the last view is dropped, so
    callers copy what they keep (a dtype conversion or a quantization does).
    """
    import mmap
    import struct

    with open(path, "rb") as f:
        (header_len,) = struct.unpack("<Q", f.read(8))
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    start = 8 + header_len
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*not writable.*")  # read-only views; never written
        for name in names:
            header = headers[name]
            begin, end = header.offsets
            numel = 1
            for d in header.shape:
                numel *= d
            if numel == 0:
                yield name, torch.empty(header.shape, dtype=dtypes[name])
                continue
            flat = torch.frombuffer(mapped, dtype=dtypes[name], count=numel, offset=start + begin)
            yield name, flat.view(header.shape)
    del mapped  # unmapped once no view is left


_LIBC: list = []


def release_freed_memory() -> None:
    """Give the heap pages the quantization kernels just freed back to the OS (glibc's malloc_trim).

    bitsandbytes' CPU kernels allocate several times a weight's size as scratch; glibc keeps such
    freed blocks in the heap (its mmap threshold grows after the first large free), so without
    this the process would keep growing by scratch space between kept quantized tensors.
    Elsewhere (no glibc) this does nothing.
    """
    if not _LIBC:
        try:
            import ctypes

            libc = ctypes.CDLL("libc.so.6")
            _LIBC.append(libc.malloc_trim)
        except (OSError, AttributeError):
            _LIBC.append(None)
    if _LIBC[0] is not None:
        _LIBC[0](0)
