"""``save_state``/``load_state`` glue for DeepSpeed engines: each engine writes its own sharded checkpoint
(model, ZeRO optimizer partitions, scheduler) into the checkpoint folder, on every rank.

The checkpoint modules call these beside their usual files (RNG states, loader positions, other
objects), so the manifest and the all-or-nothing publishing cover the engine's files too.

    overrides = save_engines(accelerator, tmp, weights)     # every rank, inside save_state
    load_engines(accelerator, plan)                         # every rank, after every rank's checks passed
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["ENGINE_SOURCE", "engine_folder", "engine_indices", "save_engines", "load_engines"]

ENGINE_SOURCE = "deepspeed-engine"  # marks a model or optimizer restored by its engine in a load plan


def engine_folder(index: int) -> str:
    """The tag (sub-folder) of prepared model ``index``'s engine checkpoint."""
    return "deepspeed_model" if index == 0 else f"deepspeed_model_{index}"


def _is_engine(model: Any) -> bool:
    return type(model).__name__ == "DeepSpeedEngine"


def engine_indices(accelerator: Any) -> tuple[list[int], list[int]]:
    """The indices of the prepared models that are engines, and of the optimizers the engines own."""
    if getattr(accelerator, "deepspeed_plugin", None) is None:
        return [], []
    models = [i for i, m in enumerate(accelerator.prepared("model")) if _is_engine(m)]
    from .wrappers import DeepSpeedOptimizerWrapper

    optimizers = [
        i for i, o in enumerate(accelerator.prepared("optimizer")) if isinstance(o, DeepSpeedOptimizerWrapper)
    ]
    return models, optimizers


def save_engines(accelerator: Any, folder: str, weights: list[Any]) -> dict[int, Any]:
    """Every rank: each engine saves its checkpoint under ``folder``; their models' entries in ``weights``
    become None (not written again) and the returned overrides skip the engines' optimizers."""
    models, optimizers = engine_indices(accelerator)
    for i in models:
        accelerator.prepared("model")[i].save_checkpoint(folder, tag=engine_folder(i), save_latest=False)
        weights[i] = None
    return {i: None for i in optimizers}


def load_engines(accelerator: Any, plan: dict[str, Any]) -> None:
    """Every rank (a collective): each engine loads its checkpoint (weights, optimizer partitions, scheduler);
    the plan keeps only what the usual loader restores."""
    models, optimizers = engine_indices(accelerator)
    if not models:
        return
    for i in models:
        engine = accelerator.prepared("model")[i]
        loaded, _ = engine.load_checkpoint(plan["path"], tag=engine_folder(i))
        if loaded is None:
            raise RuntimeError(f"DeepSpeed could not load {os.path.join(plan['path'], engine_folder(i))}")
    plan["models"] = [
        (m, s) for m, s in plan["models"] if not (isinstance(s, tuple) and s[0] == ENGINE_SOURCE)
    ]
    plan["optimizers"] = [
        (o, s) for o, s in plan["optimizers"] if not (isinstance(s, tuple) and s[0] == ENGINE_SOURCE)
    ]


def engine_source(accelerator: Any, path: str, kind: str, index: int) -> tuple[str, str] | None:
    """The load-plan entry for model/optimizer ``index`` when an engine restores it (None otherwise).

    A missing engine folder is an error naming it (found in the read phase, before anything changes).
    """
    models, optimizers = engine_indices(accelerator)
    if index not in (models if kind == "model" else optimizers):
        return None
    owner = index if kind == "model" else (models[0] if models else index)
    folder = os.path.join(path, engine_folder(owner))
    if not os.path.isdir(folder):
        raise FileNotFoundError(
            f"{folder} is missing: this checkpoint was not saved by a DeepSpeed run; load it with the settings "
            "of the run that saved it (or load the weights with load_checkpoint_in_model)"
        )
    return (ENGINE_SOURCE, folder)
