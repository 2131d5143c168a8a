"""Single saves beside checkpoints: ``save_model`` (HF-layout weights), ``save`` (one object), and
the check that ``register_for_checkpointing`` gets objects with ``state_dict`` / ``load_state_dict``.

    save_model(accelerator, model, "out", max_shard_size="2GB")
    save_object(accelerator, {"step": 3}, "extra.pt")
"""

from __future__ import annotations

import os
from typing import Any

import torch

from ..serialization import CheckpointError, save_sharded_safetensors
from .layout import unwrapped

__all__ = ["checkpointable", "save_model", "save_object"]


def checkpointable(objects: tuple[Any, ...]) -> tuple[Any, ...]:
    """``objects`` when each has ``state_dict()`` and ``load_state_dict()``; a clear error otherwise."""
    bad = [
        f"\n\t- Item at index {i}, `{type(o).__qualname__}`"
        for i, o in enumerate(objects)
        if not (callable(getattr(o, "state_dict", None)) and callable(getattr(o, "load_state_dict", None)))
    ]
    if bad:
        raise ValueError(
            "All `objects` must include a `state_dict` and `load_state_dict` function to be stored. The "
            f"following inputs are invalid:{''.join(bad)}\nWrap each in a class that provides both methods."
        )
    return objects


# -- save_model / save ---------------------------------------------------------------------------------
def save_model(
    accelerator: Any,
    model: torch.nn.Module,
    save_directory: str,
    max_shard_size: int | str = "10GB",
    safe_serialization: bool = True,
) -> list[str]:
    """Save the unwrapped model's weights in the Hugging Face layout (main process only).

        accelerator.save_model(model, "out", max_shard_size="2GB")
        # out/model.safetensors, or out/model-0000i-of-0000N.safetensors + model.safetensors.index.json

    Tied weights are written once and re-tied (or filled) on load. A model whose weights were
    offloaded to CPU or disk by dispatch (its parameters on ``meta``) is saved from the offloaded
    weights. Returns the files written (an empty list on the other processes).
    """
    if os.path.isfile(save_directory):
        raise CheckpointError(f"save_model needs a folder, but {save_directory} is a file")
    inner = unwrapped(accelerator, model)
    # spread over the ranks (FSDP shards, a ZeRO-3 engine): every rank takes part in gathering the full weights
    state = accelerator.backend.gathered_weights(inner)
    sharded = state is not None
    if not getattr(accelerator, "is_main_process", True):
        return []
    if not sharded:
        from ..xla.training import host_copy  # XLA tensors are written as CPU tensors

        state = host_copy(inner.state_dict())
    if any(t.device.type == "meta" for t in state.values()):
        from ..big_model.module_helpers import get_state_dict_offloaded_model

        state = get_state_dict_offloaded_model(inner)
    return save_sharded_safetensors(
        state, save_directory, max_shard_size=max_shard_size, safe_serialization=safe_serialization
    )


def save_object(accelerator: Any, obj: Any, f: Any, safe_serialization: bool = False) -> None:
    """``accelerator.save(obj, f)``: write ``obj`` once (main process), atomically to a path.

    ``safe_serialization=True`` writes a dict of tensors as safetensors; otherwise ``torch.save``
    (into ``f`` itself when it is a buffer: nothing to make atomic).
    """
    if not getattr(accelerator, "is_main_process", True):
        return
    from ..xla.training import host_copy  # XLA tensors are written as CPU tensors

    obj = host_copy(obj)
    if not isinstance(f, (str, os.PathLike)):
        torch.save(obj, f)
        return
    from ..serialization.files import atomic_save_file, atomic_torch_save

    if safe_serialization:
        atomic_save_file(dict(obj), os.fspath(f), {"format": "pt"})
    else:
        atomic_torch_save(obj, os.fspath(f))
