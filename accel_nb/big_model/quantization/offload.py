"""Offloaded quantized layers: their quantized state lives on disk (or in RAM) and comes to the
execution device only for their forward.

    offloader = QuantizedOffloader(torch.device("cpu"), config, offload_folder="offload")
    offloader.offload("model.layers.3.mlp.up_proj", layer, "disk")   # writes its quantized bytes
    offloader.attach()                                                # hooks the layers' forwards
    offloader.bytes_moved                                             # quantized bytes brought in so far

A bitsandbytes layer is stored in the serialized form its ``state_dict`` has (and
``prequantized.fill_layer`` reads): 8-bit ``weight`` (int8) and ``SCB``; 4-bit the packed
``weight`` and its ``weight.absmax``/``weight.quant_map``/... state. A torchao layer is stored as
the inner tensors of its quantized weight (``weight.qdata``, ``weight.scale``, ...); the tensor's
small description (block size, dtype) stays in memory. "disk" layers are one safetensors file each
in the offload folder, read memory-mapped; "cpu" layers keep the same tensors in host memory.
Each offloaded layer is one unit of the float offload engine (``big_model.offload``): on a GPU its
tensors are packed into pinned memory (or read from disk by the engine's worker into pinned
staging), copied on a side stream into the engine's device buffers, and the next layer is
prefetched while one computes, as for float weights. Before the layer's forward the layer is
rebuilt from those device tensors; after it, the layer's weight is ``None`` again and
bitsandbytes' cached matmul state is dropped, so nothing quantized stays on that device (but for a
double-quantized 4-bit layer's 4-byte nested offset).
The layer's bias (a float tensor) is not part of this: it goes through the ordinary offload
engine with the rest of the block.
"""

from __future__ import annotations

import functools
import json
import os
import re
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ..offload import OffloadEngine, OffloadUnit, TensorSlot
from .backends import backend_for_layer
from .config import QuantizationConfig, QuantizationError

QUANTIZED_OFFLOAD_ATTR = "_accel_nb_quantized_offload"  # on a hooked layer: its QuantizedLayerStore
OFFLOADER_ATTR = "_accel_nb_quantized_offloader"  # on the model: its QuantizedOffloader


@dataclass(eq=False)
class QuantizedLayerStore:
    """One offloaded quantized layer: where its quantized tensors are, and how to rebuild it."""

    name: str
    layer: nn.Module
    source: str  # "cpu" | "disk"
    keys: list[str] = field(
        default_factory=list
    )  # keys inside the layer ("weight", "SCB", "weight.absmax", ...)
    host: dict[str, torch.Tensor] = field(default_factory=dict)  # source "cpu"
    path: str | None = None  # source "disk": its safetensors file (tensor names = f"{name}.{key}")
    nbytes: int = 0  # the quantized bytes brought to the execution device per forward
    subclass: Any = None  # torchao: (tensor class, flatten context, size, stride)
    depth: int = 0  # nested forwards in flight (a layer called inside its own forward)
    unit: OffloadUnit | None = None  # its unit in the offload engine (after attach)
    holder: nn.Module | None = None  # where the engine puts the unit's device tensors for a forward
    meta: dict[str, Any] = field(default_factory=dict)  # bnb 4-bit: the quant state's non-tensor items
    offset: torch.Tensor | None = None  # bnb 4-bit double quant: the nested offset, made once on the device
    shapes: dict[str, tuple[torch.dtype, torch.Size]] = field(default_factory=dict)
    backend: Any = None  # its library's QuantizationBackend (rebuilds the weight for a forward)


class QuantizedOffloader:
    """Keeps offloaded quantized layers off ``device`` between their forwards; counts the bytes moved."""

    def __init__(
        self, device: torch.device | str, config: QuantizationConfig, offload_folder: str | None = None
    ) -> None:
        self.device = torch.device(device)
        self.config = config
        self.offload_folder = offload_folder
        self.stores: list[QuantizedLayerStore] = []
        self.bytes_moved = 0
        self.forwards = 0
        self.engine: OffloadEngine | None = None
        self.written: list[str] = []

    # -- setup ------------------------------------------------------------------------------------
    def offload(self, name: str, layer: nn.Module, source: str) -> QuantizedLayerStore:
        """Take ``layer``'s quantized weight off it, into RAM (``"cpu"``) or a file (``"disk"``)."""
        if source not in ("cpu", "disk"):
            raise ValueError(f"source must be 'cpu' or 'disk', got {source!r}")
        backend = backend_for_layer(layer)
        parts, subclass = backend.serialize(layer)
        store = QuantizedLayerStore(name, layer, source, list(parts), subclass=subclass, backend=backend)
        store.shapes = {k: (t.dtype, t.shape) for k, t in parts.items()}
        if source == "disk":  # the file holds the layer's whole serialized form
            store.path = self._write(name, parts)
        # bitsandbytes' packed quant-state description (a JSON string in a uint8 tensor: quant type,
        # block size, dtype, shape, the nested statistics' offset) is read once, here: streamed with the
        # rest it would cost a device-to-host copy (a stream sync) and a parse per forward
        store.meta = {}
        for k in [k for k in parts if ".quant_state." in k]:
            store.meta.update(json.loads(bytes(parts.pop(k).cpu().numpy()).decode("utf-8")))
        store.keys = list(parts)
        store.nbytes = sum(t.numel() * t.element_size() for t in parts.values())
        if source == "cpu":  # the engine packs them into pinned memory when the execution device is a GPU
            store.host = {k: t.to("cpu", copy=True) for k, t in parts.items()}
        del parts
        self._release(store)
        self.stores.append(store)
        return store

    def _write(self, name: str, parts: dict[str, torch.Tensor]) -> str:
        if self.offload_folder is None:
            raise QuantizationError(
                f"{name!r} is mapped to 'disk' but no offload folder was given; pass offload_folder=... "
                "(its quantized bytes are written there). Nothing was loaded"
            )
        from safetensors.torch import save_file

        os.makedirs(self.offload_folder, exist_ok=True)
        path = os.path.join(
            self.offload_folder,
            "accel_nb_quantized_" + re.sub(r"[^A-Za-z0-9_.-]", "_", name) + ".safetensors",
        )
        # written aside, then renamed: a model still reading an older file of that name (open,
        # memory-mapped) keeps its own copy instead of seeing it change under it
        save_file({f"{name}.{k}": t.contiguous().cpu() for k, t in parts.items()}, path + ".tmp")
        os.replace(path + ".tmp", path)
        self.written.append(path)
        return path

    def attach(self, engine: OffloadEngine | None = None) -> None:
        """Make every offloaded layer a unit of ``engine`` (the model's offload engine; a new one on
        this offloader's device when None) and wrap its forward (outside any hook already there)."""
        if engine is None:
            engine = self.engine or OffloadEngine(self.device)
        self.engine = engine
        units = []
        for store in self.stores:
            if store.unit is not None:
                continue
            store.holder = nn.Module()
            store.unit = OffloadUnit(store.name, store.layer, store.source)
            for k in store.keys:
                dtype, shape = store.shapes[k]
                attr = k.replace(".", "__")
                key = f"{store.name}.{k}"
                store.holder._buffers[attr] = placeholder = torch.empty(shape, dtype=dtype, device="meta")
                store.unit.slots.append(TensorSlot(store.holder, attr, False, key, dtype, shape, placeholder))
                if store.source == "disk":
                    store.unit.disk[key] = (store.path, key)
                else:
                    store.unit.host[key] = store.host[k]
            store.host = {}  # the unit holds them now (packed into pinned memory on a GPU)
            units.append(store.unit)
        engine.add_units(units)
        for store in self.stores:
            layer = store.layer
            if getattr(layer, QUANTIZED_OFFLOAD_ATTR, None) is not None:
                continue
            original = layer.forward

            @functools.wraps(original)
            def forward(*args: Any, _store=store, _original=original, **kwargs: Any) -> Any:
                self.before_forward(_store)
                try:
                    return _original(*args, **kwargs)
                finally:
                    self.after_forward(_store)

            layer.forward = forward
            setattr(layer, QUANTIZED_OFFLOAD_ATTR, store)

    def discard(self) -> None:
        """Delete the files this offloader wrote (a load that failed part-way)."""
        self.close()
        for path in self.written:
            try:
                os.remove(path)
            except OSError:
                pass
        self.written.clear()

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()

    # -- the forward protocol -----------------------------------------------------------------------
    def before_forward(self, store: QuantizedLayerStore) -> None:
        """Bring the layer's quantized tensors to the execution device and rebuild its weight."""
        store.depth += 1
        if store.depth > 1:
            return
        fetched = False
        try:
            self.engine.before_forward(store.unit)
            fetched = True
            parts = {k: store.holder._buffers[k.replace(".", "__")] for k in store.keys}
            self.bytes_moved += store.nbytes
            self.forwards += 1
            store.backend.rebuild(store, parts, self.config, self.device)
        except (
            BaseException
        ) as exc:  # a read error (a file removed, a disk full): the next forward tries again
            store.depth -= 1
            self._release(store)
            if fetched:
                self.engine.after_forward(store.unit)
            if isinstance(exc, (OSError, RuntimeError)) and store.source == "disk" and not fetched:
                raise QuantizationError(
                    f"cannot read the offloaded quantized layer {store.name!r} from {store.path}: {exc}. The "
                    "offload folder must stay in place while the model is in use; load the model again"
                ) from None
            raise

    def after_forward(self, store: QuantizedLayerStore) -> None:
        """Drop the layer's weight (and bitsandbytes' cached state of it) from the execution device."""
        store.depth -= 1
        if store.depth == 0:
            self._release(store)
            self.engine.after_forward(store.unit)

    @staticmethod
    def _release(store: QuantizedLayerStore) -> None:
        layer = store.layer
        layer._parameters["weight"] = None
        state = getattr(layer, "state", None)
        if state is not None and hasattr(state, "CB"):
            state.CB = None
            state.SCB = None
        if "quant_state" in layer.__dict__:
            layer.quant_state = None
