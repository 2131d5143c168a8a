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

_LOCK = threading.RLock()


@contextlib.contextmanager
def init_on_device(device: torch.device | str, include_buffers: bool = True) -> Iterator[None]:
    """Create every parameter (and buffer, unless ``include_buffers=False``) on ``device``.

    with init_on_device("meta"):
        layer = torch.nn.Linear(8192, 8192)   # layer.weight.device == meta

    With ``include_buffers`` every tensor made inside the block without an explicit ``device=``
    is made on ``device`` (torch's device context, as in the reference): buffers and constants
    built in ``__init__`` cost no memory either, while a parameter wrapped around a tensor made
    before the block stays where that tensor is.
    """
    device = torch.device(device)
    if include_buffers:
        with device:
            yield
        return
    with _LOCK:
        # the functions seen on entry are the ones restored on exit, so nested contexts unwind
        # exactly in reverse order and leave nn.Module as it was found
        old_register_parameter = nn.Module.register_parameter

        def register_parameter(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
            old_register_parameter(module, name, param)
            if param is not None and param.device != device:
                kwargs = dict(getattr(param, "__dict__", {}))
                kwargs.pop("_is_hf_initialized", None)
                new = type(param)(param.to(device), requires_grad=param.requires_grad)
                new.__dict__.update(kwargs)
                module._parameters[name] = new

        nn.Module.register_parameter = register_parameter  # type: ignore[method-assign]
    try:
        yield
    finally:
        with _LOCK:
            nn.Module.register_parameter = old_register_parameter  # type: ignore[method-assign]


@contextlib.contextmanager
def init_empty_weights(include_buffers: bool = False) -> Iterator[None]:
    """Build a model of any size instantly: parameters go to the ``meta`` device (no storage).

        with init_empty_weights():
            model = transformers.GPT2LMHeadModel(config)
        device_map = infer_auto_device_map(model, max_memory={"cpu": "2GiB"})

    Buffers stay real unless ``include_buffers=True`` (small, and often not in checkpoints).
    """
    with init_on_device("meta", include_buffers=include_buffers):
        yield
