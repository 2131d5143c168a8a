"""Build models without allocating their weights: parameters (and optionally buffers) on ``meta``.

with init_empty_weights():
    model = MyBigModel(config)        # instant, no memory; shapes and dtypes are real
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import torch
from torch import nn

from ..environment import parse_flag_from_env

_LOCK = threading.RLock()
# the reference's switch: include_buffers=None reads it (default False)
ENV_INIT_INCLUDE_BUFFERS = "ACCELERATE_INIT_INCLUDE_BUFFERS"


def _include_buffers(value: bool | None) -> bool:
    return parse_flag_from_env(ENV_INIT_INCLUDE_BUFFERS, False) if value is None else bool(value)


def _on_device(param: nn.Parameter, device: torch.device) -> nn.Parameter:
    """``param`` again on ``device``, of the same class, built as the reference builds it: the class called
    with the tensor, ``requires_grad`` and the parameter's attributes (how bitsandbytes' parameters keep their
    quantization settings); ``_is_hf_initialized`` is set on the new parameter afterwards. A class whose
    constructor does not take its attributes gets them copied over instead."""
    attrs = dict(getattr(param, "__dict__", {}))
    hf_initialized = attrs.pop("_is_hf_initialized", None)
    try:
        new = type(param)(param.to(device), requires_grad=param.requires_grad, **attrs)
    except TypeError:
        new = type(param)(param.to(device), requires_grad=param.requires_grad)
        new.__dict__.update(attrs)
    if hf_initialized is not None:
        new._is_hf_initialized = hf_initialized
    return new


@contextlib.contextmanager
def init_on_device(device: torch.device | str, include_buffers: bool | None = None) -> Iterator[None]:
    """Create every parameter (and, with ``include_buffers=True``, every buffer) on ``device``.

    with init_on_device("meta"):
        layer = torch.nn.Linear(8192, 8192)   # layer.weight.device == meta

    With ``include_buffers`` every tensor made inside the block without an explicit ``device=``
    is made on ``device`` (torch's device context, as in the reference): buffers and constants
    built in ``__init__`` cost no memory either, while a parameter wrapped around a tensor made
    before the block stays where that tensor is. ``include_buffers=None`` (the default) reads
    ``ACCELERATE_INIT_INCLUDE_BUFFERS`` (false unless set), as in the reference.
    """
    device = torch.device(device)
    if _include_buffers(include_buffers):
        with device:
            yield
        return
    with _LOCK:
        # the functions seen on entry are the ones restored on exit, so nested contexts unwind
        # exactly in reverse order and leave nn.Module as it was found
        old_register_parameter = nn.Module.register_parameter

        def register_parameter(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
            old_register_parameter(module, name, param)
            if param is not None and param.device != device:  # one already there keeps its ties
                module._parameters[name] = _on_device(module._parameters[name], device)

        nn.Module.register_parameter = register_parameter  # type: ignore[method-assign]
    try:
        yield
    finally:
        with _LOCK:
            nn.Module.register_parameter = old_register_parameter  # type: ignore[method-assign]


@contextlib.contextmanager
def init_empty_weights(include_buffers: bool | None = None) -> Iterator[None]:
    """Build a model of any size instantly: parameters go to the ``meta`` device (no storage).

        with init_empty_weights():
            model = transformers.GPT2LMHeadModel(config)
        device_map = infer_auto_device_map(model, max_memory={"cpu": "2GiB"})

    Buffers stay real unless ``include_buffers=True`` (small, and often not in checkpoints);
    ``include_buffers=None`` (the default) reads ``ACCELERATE_INIT_INCLUDE_BUFFERS``, as in the reference.
    """
    with init_on_device("meta", include_buffers=include_buffers):
        yield
