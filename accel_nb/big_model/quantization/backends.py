"""Quantization back-ends: what accel_nb asks of a quantization library, one class per library.

    backend_for(BnbQuantizationConfig(load_in_4bit=True)).weight_bytes(4096, 4096, config)
    backend_for_layer(model.model.layers[0].mlp.up_proj).name      # 'bitsandbytes'
Every place that depends on the library (the planner's byte counts, making and filling a
quantized layer, offloading one, reading a pre-quantized checkpoint) asks the back-end chosen by
the config's type (or, for a layer already built, the back-end that owns it) instead of branching;
a config or a layer no back-end claims is refused by name, never handled as "the other library".

Adding a library: subclass :class:`QuantizationBackend` in a module of its own, give it ``name``
and ``config_class`` (a dataclass with ``method``, ``torch_dtype``, ``skip_modules`` and
``keep_in_fp32_modules``), implement the methods below, and list the module in ``_MODULES``.
The library itself is imported only when a layer is made (``layers.require``).
"""

from __future__ import annotations

import importlib
from typing import Any, ClassVar

import torch
from torch import nn

from .config import QuantizationError

_MODULES = (".bnb_backend", ".torchao_backend")  # each registers its back-end when imported
_BACKENDS: dict[type, QuantizationBackend] = {}


class QuantizationBackend:
    """The parts of quantized loading that depend on the library."""

    name: ClassVar[str]
    config_class: ClassVar[type]

    def weight_bytes(self, in_features: int, out_features: int, config: Any) -> int:
        """Bytes one layer's weight holds once quantized (its bias is counted apart)."""
        raise NotImplementedError

    def storage_format(self, config: Any) -> str:
        """How a quantized weight is stored, as the device-map view writes it ('int8', 'nf4', ...)."""
        raise NotImplementedError

    def make_shell(self, in_features: int, out_features: int, has_bias: bool, config: Any) -> nn.Module:
        """The quantized layer that replaces a linear one, with empty (meta) tensors."""
        raise NotImplementedError

    def quantize_weight(
        self, layer: nn.Module, weight: torch.Tensor, config: Any, device: torch.device
    ) -> None:
        """Fill ``layer`` (from make_shell) with ``weight`` (float, (out, in), contiguous), quantized on ``device``."""
        raise NotImplementedError

    def owns_layer(self, layer: nn.Module) -> bool:
        """True when ``layer`` is one of this library's quantized layers."""
        raise NotImplementedError

    def serialize(self, layer: nn.Module) -> tuple[dict[str, torch.Tensor], Any]:
        """(key -> tensor, rebuild info) of a quantized layer's weight, as stored while it is offloaded."""
        raise NotImplementedError

    def rebuild(self, store: Any, parts: dict[str, torch.Tensor], config: Any, device: torch.device) -> None:
        """Put the weight of an offloaded layer (``store``: a QuantizedLayerStore) back from ``parts`` on ``device``."""
        raise NotImplementedError

    def offload_refusal(self, config: Any) -> str | None:
        """Why layers quantized with ``config`` cannot be offloaded (None: they can)."""
        return None

    def accepts_saved(self, dtypes: dict, config: Any) -> tuple[str, str] | None:
        """A checkpoint saved quantized as ``config.method`` (``dtypes``: its tensor names -> dtypes):
        None to load it as is, or (what it holds, what ``config`` asks) to refuse it naming both."""
        return config.method, config.method  # by default a library's saved layers are not read back

    def mark_model(self, model: nn.Module, config: Any) -> None:
        """Set the attributes other libraries read on a model quantized with ``config``."""


def _load_modules() -> None:
    if not _BACKENDS:
        for module in _MODULES:
            importlib.import_module(module, __package__)


def register(backend_class: type[QuantizationBackend]) -> type[QuantizationBackend]:
    """Class decorator: make ``backend_class`` the back-end of its ``config_class``."""
    _BACKENDS[backend_class.config_class] = backend_class()
    return backend_class


def backends() -> list[QuantizationBackend]:
    _load_modules()
    return list(_BACKENDS.values())


def backend_for(config: Any) -> QuantizationBackend:
    """The back-end of ``config`` (by its type), or QuantizationError naming the configs accel_nb knows."""
    _load_modules()
    backend = _BACKENDS.get(type(config))
    if backend is None:
        known = ", ".join(sorted(c.__name__ for c in _BACKENDS))
        raise QuantizationError(
            f"the quantization config must be a {known.replace(', ', ' or ')}, got {type(config).__name__}"
        )
    return backend


def backend_for_layer(layer: nn.Module) -> QuantizationBackend:
    """The back-end whose quantized layer ``layer`` is, or QuantizationError saying it is none."""
    for backend in backends():
        if backend.owns_layer(layer):
            return backend
    weight = getattr(layer, "weight", None)
    raise QuantizationError(
        f"{type(layer).__name__} holds a {type(weight).__name__} weight, not a quantized one; only "
        + " and ".join(b.name for b in backends())
        + " layers can be offloaded this way"
    )
