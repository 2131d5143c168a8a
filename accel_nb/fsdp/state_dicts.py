"""State dicts of FSDP-sharded models and their optimizers, through torch's
``torch.distributed.checkpoint`` (DCP): full (gathered on the main process) or sharded (each rank
writes and reads its own shards of one DCP folder). Every call here is a collective: run it on all ranks.

    full = full_model_state(model)                       # plain tensors on rank 0, {} elsewhere
    save_sharded(tmp + "/fsdp_model_0", model)           # a DCP folder with every rank's shards
    state = read_sharded(tmp + "/fsdp_model_0", model)   # read (copies); apply_model_state(model, state)
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = [
    "apply_model_state",
    "apply_optimizer_state",
    "full_model_state",
    "full_optimizer_state",
    "owning_model",
    "read_sharded",
    "read_sharded_optimizer",
    "save_sharded",
    "save_sharded_optimizer",
]


def _options(full: bool, **extra: Any) -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=full, cpu_offload=full, **extra)


def full_model_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The whole model's weights as plain CPU tensors on the main process ({} on the others)."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    return get_model_state_dict(model, options=_options(True))


def full_optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The optimizer's whole state keyed by parameter names, on the main process ({} on the others)."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    return get_optimizer_state_dict(model, optimizer, options=_options(True))


def save_sharded(folder: str, model: torch.nn.Module) -> None:
    """Write every rank's shards of ``model`` into the DCP folder ``folder``."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    dcp.save({"model": get_model_state_dict(model)}, checkpoint_id=folder)


def save_sharded_optimizer(folder: str, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Write every rank's shards of ``optimizer``'s state into the DCP folder ``folder``."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    dcp.save({"optimizer": get_optimizer_state_dict(model, optimizer)}, checkpoint_id=folder)


def _copy(tree: Any) -> Any:
    if isinstance(tree, torch.Tensor):
        return tree.detach().clone()
    if isinstance(tree, dict):
        return {k: _copy(v) for k, v in tree.items()}
    if isinstance(tree, list):
        return [_copy(v) for v in tree]
    return tree


def read_sharded(folder: str, model: torch.nn.Module) -> dict[str, Any]:
    """This rank's shards of the model weights in ``folder``, read into copies (the model is unchanged)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    state = {"model": _copy(get_model_state_dict(model))}
    dcp.load(state, checkpoint_id=folder)
    return state["model"]


def read_sharded_optimizer(
    folder: str, model: torch.nn.Module, optimizer: torch.optim.Optimizer
) -> dict[str, Any]:
    """This rank's shards of the optimizer state in ``folder``, read into copies.

    An optimizer that never stepped gets its state tensors created first (DCP reads into them).
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    state = {"optimizer": _copy(get_optimizer_state_dict(model, optimizer))}
    dcp.load(state, checkpoint_id=folder)
    return state["optimizer"]


def apply_model_state(model: torch.nn.Module, state: dict[str, Any], full: bool, strict: bool = True) -> None:
    """Load ``state`` (a full state dict on every rank, or this rank's shards) into the sharded model."""
    from torch.distributed.checkpoint.state_dict import set_model_state_dict

    set_model_state_dict(model, dict(state), options=_options(full, strict=strict))


def apply_optimizer_state(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any], full: bool
) -> None:
    """Load ``state`` (as :func:`full_optimizer_state` or :func:`read_sharded_optimizer` gave it) into ``optimizer``."""
    from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

    if full and not state.get("state") and len(state.get("param_groups", ())) == len(optimizer.param_groups):
        # an optimizer without per-parameter state (SGD without momentum): torch's full-state path
        # infers the device from that state and stops ("Expected device to be set"); only the
        # groups' settings (lr, weight decay, ...) are there to load
        for live, saved in zip(optimizer.param_groups, state["param_groups"]):
            live.update({k: v for k, v in saved.items() if k != "params"})
        return
    set_optimizer_state_dict(model, optimizer, state, options=_options(full))


def owning_model(optimizer: torch.optim.Optimizer, models: list[torch.nn.Module]) -> torch.nn.Module | None:
    """The sharded model among ``models`` whose parameters ``optimizer`` updates (None: a plain optimizer)."""
    from .sharding import is_sharded_model

    ids = {id(p) for group in optimizer.param_groups for p in group["params"]}
    owners = [m for m in models if is_sharded_model(m) and any(id(p) in ids for p in m.parameters())]
    if len(owners) > 1:
        raise ValueError(
            "one optimizer updates the parameters of several FSDP-sharded models; torch's state dict functions "
            "need one model per optimizer: create one optimizer per model"
        )
    return owners[0] if owners else None
