"""A prepared model's weights as the Accelerator gives them, and the hooks that run before they are saved or loaded.

Mixed into ``Accelerator``; each call has the reference library's name, arguments and meaning.
``save_state`` / ``load_state`` (accel_nb.checkpoint) run the hooks with :func:`run_save_hooks`
and :func:`run_load_hooks`.

    state = accelerator.get_state_dict(model)            # the plain model's weights
    handle = accelerator.register_save_state_pre_hook(lambda models, weights, folder: ...)
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.hooks import RemovableHandle

__all__ = ["ModelWeights", "run_save_hooks", "run_load_hooks"]


def _hooks(accelerator: Any, kind: str) -> collections.OrderedDict:
    name = f"_{kind}_state_pre_hooks"
    table = accelerator.__dict__.get(name)
    if table is None:
        table = accelerator.__dict__[name] = collections.OrderedDict()
    return table


def run_save_hooks(accelerator: Any, models: list[Any], weights: list[dict[str, Any]], folder: str) -> None:
    """Call every save pre-hook with (models, weights, folder); they may pop what they save themselves."""
    for hook in list(_hooks(accelerator, "save").values()):
        hook(models, weights, folder)


def run_load_hooks(accelerator: Any, models: list[Any], folder: str) -> None:
    """Call every load pre-hook with (models, folder); they may pop the models they load themselves."""
    for hook in list(_hooks(accelerator, "load").values()):
        hook(models, folder)


class ModelWeights:
    """``get_state_dict`` and the save/load pre-hooks ``register_save_state_pre_hook``,
    ``register_load_state_pre_hook``."""

    def get_state_dict(self, model: torch.nn.Module, unwrap: bool = True) -> dict[str, Any]:
        """The state dict of a prepared model: of the user's model inside (``unwrap=True``) or of the wrapper.

            weights = accelerator.get_state_dict(model)       # keys as in the plain model

        Under FSDP or DeepSpeed ZeRO-3 call it on every process: the shards are gathered.
        """
        if unwrap:
            model = self.unwrap_model(model)  # type: ignore[attr-defined]
        # FSDP2 / tensor-parallel shards or a ZeRO-3 engine: gathered from every rank (call it on all), the full
        # weights on the main process
        state = self.backend.gathered_weights(model)  # type: ignore[attr-defined]
        if state is not None:
            return state
        return model.state_dict()

    def register_save_state_pre_hook(self, hook: Callable[..., None]) -> RemovableHandle:
        """Call ``hook(models, weights, output_dir)`` in every ``save_state`` before the weights are written.

        ``weights`` holds the state dict of each prepared model (unwrapped); a hook that saves a
        model its own way pops its entry so ``save_state`` skips it. Returns a handle:
        ``handle.remove()`` unregisters the hook.

            def save_hook(models, weights, output_dir):
                for model in models:
                    torch.save(model.config, f"{output_dir}/config.pt")
            handle = accelerator.register_save_state_pre_hook(save_hook)
        """
        table = _hooks(self, "save")
        handle = RemovableHandle(table)
        table[handle.id] = hook
        return handle

    def register_load_state_pre_hook(self, hook: Callable[..., None]) -> RemovableHandle:
        """Call ``hook(models, input_dir)`` in every ``load_state`` before the weights are read.

        A hook that loads a model its own way pops it from ``models`` so ``load_state`` skips it
        (pair it with a save hook that popped the same entry). Returns a removable handle.

            handle = accelerator.register_load_state_pre_hook(lambda models, input_dir: None)
        """
        table = _hooks(self, "load")
        handle = RemovableHandle(table)
        table[handle.id] = hook
        return handle
