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
in the offload folder, read memory-mapped; "cpu" layers keep the same tensors in (pinned, when the
execution device is a GPU) host memory. Before the layer's forward these tensors are copied to the
execution device and the layer rebuilt from them; after it, the layer's weight is ``None`` again
and bitsandbytes' cached matmul state is dropped, so nothing quantized stays on that device.
The layer's bias (a float tensor) is not part of this: it goes through the ordinary offload
engine with the rest of the block.
"""

from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from .config import QuantizationConfig, QuantizationError
from .prequantized import fill_layer

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


def _layer_kind(layer: nn.Module) -> str:
    name = type(layer).__name__
    if name == "Linear8bitLt":
        return "bnb8"
    if name in ("Linear4bit", "LinearNF4", "LinearFP4"):
        return "bnb4"
    return "torchao"


def _serialize(layer: nn.Module) -> tuple[dict[str, torch.Tensor], Any]:
    """(key -> tensor, torchao rebuild info) of a quantized layer's weight, as stored while offloaded."""
    kind = _layer_kind(layer)
    if kind in ("bnb8", "bnb4"):
        state = layer.state_dict(keep_vars=True)
        parts = {k: v.detach() for k, v in state.items() if k != "bias" and k != "weight_format"}
        parts["weight"] = parts["weight"].as_subclass(torch.Tensor)  # the bytes, not bitsandbytes' wrapper
        return parts, None
    weight = layer.weight
    flatten = getattr(weight, "__tensor_flatten__", None)
    if flatten is None:
        raise QuantizationError(
            f"{type(layer).__name__} holds a {type(weight).__name__} weight, not a quantized one; only "
            "bitsandbytes layers and torchao-quantized weights can be offloaded this way"
        )
    names, ctx = flatten()
    parts = {f"weight.{n}": getattr(weight, n) for n in names if getattr(weight, n) is not None}
    return {k: v.detach() for k, v in parts.items()}, (type(weight), ctx, weight.size(), weight.stride())


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
        self._files: dict[str, Any] = {}
        self.written: list[str] = []

    # -- setup ------------------------------------------------------------------------------------
    def offload(self, name: str, layer: nn.Module, source: str) -> QuantizedLayerStore:
        """Take ``layer``'s quantized weight off it, into RAM (``"cpu"``) or a file (``"disk"``)."""
        if source not in ("cpu", "disk"):
            raise ValueError(f"source must be 'cpu' or 'disk', got {source!r}")
        parts, subclass = _serialize(layer)
        store = QuantizedLayerStore(name, layer, source, list(parts), subclass=subclass)
        store.nbytes = sum(t.numel() * t.element_size() for t in parts.values())
        if source == "disk":
            store.path = self._write(name, parts)
        else:
            pin = self.device.type == "cuda"
            store.host = {
                k: (t.to("cpu", copy=True).pin_memory() if pin else t.to("cpu", copy=True))
                for k, t in parts.items()
            }
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

    def attach(self) -> None:
        """Wrap every offloaded layer's forward (outside any hook already there)."""
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
        self._files.clear()

    # -- the forward protocol -----------------------------------------------------------------------
    def _read(self, store: QuantizedLayerStore) -> dict[str, torch.Tensor]:
        if store.source == "cpu":
            return dict(store.host)
        handle = self._files.get(store.path)
        if handle is None:
            from safetensors import safe_open

            try:
                handle = self._files[store.path] = safe_open(store.path, framework="pt", device="cpu")
            except (OSError, RuntimeError) as exc:
                raise QuantizationError(
                    f"cannot read the offloaded quantized layer {store.name!r} from {store.path}: {exc}. The "
                    "offload folder must stay in place while the model is in use; load the model again"
                ) from None
        return {k: handle.get_tensor(f"{store.name}.{k}") for k in store.keys}

    def before_forward(self, store: QuantizedLayerStore) -> None:
        """Bring the layer's quantized tensors to the execution device and rebuild its weight."""
        store.depth += 1
        if store.depth > 1:
            return
        try:
            parts = {k: t.to(self.device, non_blocking=True) for k, t in self._read(store).items()}
            self.bytes_moved += store.nbytes
            self.forwards += 1
            layer = store.layer
            if store.subclass is not None:
                cls, ctx, size, stride = store.subclass
                inner = {k[len("weight.") :]: v for k, v in parts.items()}
                weight = cls.__tensor_unflatten__(inner, ctx, size, stride)
                layer.weight = nn.Parameter(weight, requires_grad=False)
            else:
                fill_layer(layer, parts, self.config, self.device)
        except BaseException:  # a read error (a file removed, a disk full): the next forward tries again
            store.depth -= 1
            self._release(store)
            raise

    def after_forward(self, store: QuantizedLayerStore) -> None:
        """Drop the layer's weight (and bitsandbytes' cached state of it) from the execution device."""
        store.depth -= 1
        if store.depth == 0:
            self._release(store)

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
