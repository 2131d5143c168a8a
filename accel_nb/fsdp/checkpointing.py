"""``save_state`` / ``load_state`` for FSDP-sharded models and their optimizers.

With ``state_dict_type="sharded"`` every rank writes its shards into one torch.distributed.checkpoint
folder per object (``fsdp_model_<i>``, ``fsdp_optimizer_<i>`` in the checkpoint); with ``"full"``
the main process writes the gathered weights (``model.safetensors``) and the optimizer state keyed
by parameter names (``optimizer.bin``), which every rank reads back and re-shards. Each call here
runs on every rank (they are collectives).

    weights = [model_weights(accelerator, m) for m in models]     # FSDP-aware state dicts
    overrides = save_sharded_parts(accelerator, tmp, weights)     # DCP folders; full optimizer states
"""

from __future__ import annotations

import os
from typing import Any

import torch

from .sharding import is_sharded_model
from .state_dicts import (
    apply_model_state,
    apply_optimizer_state,
    full_model_state,
    full_optimizer_state,
    owning_model,
    read_sharded,
    read_sharded_optimizer,
)

__all__ = [
    "SHARDED",
    "apply_optimizer",
    "load_model",
    "model_weights",
    "read_sharded_parts",
    "save_sharded_parts",
    "sharded_folder",
    "sharded_mode",
]

SHARDED = "fsdp_sharded"  # marks a part that lives in a DCP folder, read in load_state's collective phase


def sharded_mode(accelerator: Any) -> str | None:
    """How ``save_state`` writes sharded models: ``"sharded"`` or ``"full"`` (FSDP's ``state_dict_type``;
    tensor parallel without FSDP: sharded), None when the run shards nothing."""
    options = getattr(accelerator, "fsdp_options", None)
    if options is not None:
        return options.state_dict_type
    layout = getattr(accelerator, "parallelism_config", None)
    return "sharded" if layout is not None and layout.tp_enabled else None


def sharded_folder(path: str, what: str, i: int) -> str:
    """The DCP folder of the i-th model or optimizer (``what`` is "model" or "optimizer")."""
    return os.path.join(path, f"fsdp_{what}" + ("" if i == 0 else f"_{i}"))


def model_weights(accelerator: Any, module: torch.nn.Module) -> dict[str, Any]:
    """The state dict ``save_state`` writes for ``module``: full (main process) or sharded (DTensors) under FSDP."""
    if not is_sharded_model(module):
        return module.state_dict()
    if sharded_mode(accelerator) == "full":
        if getattr(getattr(accelerator, "project_configuration", None), "save_on_each_node", False):
            raise ValueError(
                "save_on_each_node=True with FSDPOptions(state_dict_type='full') is not supported: the full weights "
                "are gathered on the main process only; use state_dict_type='sharded' on a shared file system"
            )
        return full_model_state(module)
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    return get_model_state_dict(module)


def _is_sharded(state: Any) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(state, dict) and any(isinstance(v, DTensor) for v in state.values())


def save_sharded_parts(accelerator: Any, tmp: str, weights: list[Any], models: list[Any]) -> dict[int, Any]:
    """Write the sharded parts (DCP, every rank) and gather the full optimizer states.

    Sharded model entries of ``weights`` become None (nothing left for the main process to write).
    Returns optimizer index -> what the main process writes instead of ``opt.state_dict()``
    (None: it is in a DCP folder already).
    """
    import torch.distributed.checkpoint as dcp

    for i, state in enumerate(weights):
        if _is_sharded(state):
            dcp.save({"model": state}, checkpoint_id=sharded_folder(tmp, "model", i))
            weights[i] = None
    overrides: dict[int, Any] = {}
    if sharded_mode(accelerator) is None:
        return overrides
    for i, opt in enumerate(getattr(accelerator, "_optimizers", [])):
        inner = getattr(opt, "optimizer", opt)
        owner = owning_model(inner, models)
        if owner is None:
            continue
        if sharded_mode(accelerator) == "full":
            overrides[i] = full_optimizer_state(owner, inner)
        else:
            from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

            dcp.save(
                {"optimizer": get_optimizer_state_dict(owner, inner)},
                checkpoint_id=sharded_folder(tmp, "optimizer", i),
            )
            overrides[i] = None
    return overrides


def read_sharded_parts(plan: dict[str, Any], models: list[Any]) -> None:
    """Read every DCP part the plan marks (collective on all ranks), replacing the marks with the read states."""
    plan["models"] = [
        (module, read_sharded(source[1], module) if _marked(source) else source)
        for module, source in plan["models"]
    ]
    optimizers = []
    for opt, state in plan["optimizers"]:
        if _marked(state):
            inner = getattr(opt, "optimizer", opt)
            state = read_sharded_optimizer(state[1], owning_model(inner, models), inner)
        optimizers.append((opt, state))
    plan["optimizers"] = optimizers


def _marked(source: Any) -> bool:
    return isinstance(source, tuple) and len(source) == 2 and source[0] == SHARDED


def load_model(module: torch.nn.Module, source: Any, strict: bool) -> bool:
    """Load ``source`` into an FSDP-sharded ``module`` (False: not sharded, the caller loads it as usual).

    ``source`` is this rank's shards (read from DCP), a full state dict, or a safetensors index of full weights.
    """
    if not is_sharded_model(module):
        return False
    if isinstance(source, dict):
        apply_model_state(module, source, full=not _is_sharded(source), strict=strict)
    else:
        from ..serialization.reading import load_safetensors_state_dict

        apply_model_state(module, load_safetensors_state_dict(source), full=True, strict=strict)
    return True


def apply_optimizer(opt: Any, state: Any, models: list[Any]) -> bool:
    """Load ``state`` into an optimizer of FSDP-sharded parameters (False: a plain optimizer, loaded as usual)."""
    inner = getattr(opt, "optimizer", opt)
    owner = owning_model(inner, models)
    if owner is None:
        return False
    full = not _is_sharded(state.get("state", {})) and not any(
        _is_sharded(v) for v in state.get("state", {}).values() if isinstance(v, dict)
    )
    apply_optimizer_state(owner, inner, state, full=full)
    return True
