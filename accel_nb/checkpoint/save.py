"""``save_state``: write every rank's part into a temp folder, then publish it with a manifest.

Every file goes into ``.tmp-<name>-<pid>`` beside the target; the manifest (sizes and digests of
every file) is written last and the folder is renamed into place, so a save killed half-way
leaves the previous checkpoint untouched.

    path = save_accelerator_state(accelerator, "ckpt")   # == accelerator.save_state("ckpt")
"""

from __future__ import annotations

import json
import os
import shutil
import time
import warnings
from typing import Any

import torch

from ..serialization import CheckpointError, fsync_path, save_sharded_safetensors
from .callers import main_process_guard
from .folders import (
    CHECKPOINT_DIR,
    MANIFEST_NAME,
    commit_dir,
    is_complete_checkpoint,
    list_checkpoints,
    next_iteration,
    remove_stale_temps,
)
from .layout import (
    FORMAT,
    FORMAT_VERSION,
    ProjectConfiguration,
    file_digest,
    file_suffix,
    project_config,
    unwrapped,
)
from .rng import rng_state

__all__ = ["save_accelerator_state"]


def _is_writer(accelerator: Any) -> bool:
    if project_config(accelerator).save_on_each_node:
        return bool(getattr(accelerator, "is_local_main_process", True))
    return bool(getattr(accelerator, "is_main_process", True))


def _torch_save(obj: Any, path: str) -> None:
    from ..xla.training import host_copy  # XLA tensors are written as CPU tensors (loadable anywhere)

    torch.save(host_copy(obj), path)  # fsynced with every other file before the manifest is written


def _rotate(config: ProjectConfiguration) -> None:
    if not config.total_limit or config.checkpoints_dir is None:
        return
    complete = list_checkpoints(config.checkpoints_dir)
    for path in complete[: max(len(complete) - int(config.total_limit), 0)]:
        shutil.rmtree(path, ignore_errors=True)


def _resolve_output_dir(accelerator: Any, output_dir: str | None) -> tuple[str, bool]:
    config = project_config(accelerator)
    if output_dir is not None:
        return os.path.abspath(os.fspath(output_dir)), False
    if config.automatic_checkpoint_naming and config.project_dir:
        root = config.checkpoints_dir
        os.makedirs(root, exist_ok=True)
        return os.path.abspath(
            os.path.join(root, f"checkpoint_{next_iteration(root, config.iteration)}")
        ), True
    raise CheckpointError(
        "save_state() needs a folder: pass output_dir, or create the Accelerator with "
        "project_config=ProjectConfiguration(project_dir=..., automatic_checkpoint_naming=True)"
    )


def _check_replaceable(final: str) -> None:
    if os.path.isdir(final) and os.listdir(final) and not is_complete_checkpoint(final):
        raise CheckpointError(
            f"refusing to replace {final}: it holds files but is not an accel_nb checkpoint (no "
            f"{MANIFEST_NAME}); save into a new or empty folder"
        )
    if os.path.exists(final) and not os.path.isdir(final):
        raise CheckpointError(f"{final} is a file; save_state needs a folder path")


def _all_ok(error: str | None, what: str) -> None:
    """Barrier that also shares failures: every rank raises if any rank failed."""
    from ..ops import gather_object

    errors = gather_object([error])
    bad = [(r, e) for r, e in enumerate(errors) if e]
    if bad:
        raise CheckpointError(f"{what} failed on " + "; ".join(f"rank {r}: {e}" for r, e in bad))


def save_accelerator_state(
    accelerator: Any, output_dir: str | None = None, safe_serialization: bool = True
) -> str:
    """Save everything needed to resume: weights, optimizers, schedulers, scaler, every rank's RNG,
    data loader positions, the step and registered objects. Call it on every process; called under
    ``if accelerator.is_main_process:`` (read from the caller's code: ``callers.py``) the main process
    writes it alone without waiting (not with FSDP, DeepSpeed, tensor parallelism or XLA: refused at once).

        path = save_accelerator_state(accelerator, "ckpt")   # == accelerator.save_state("ckpt")
    """
    if int(getattr(accelerator, "num_processes", 1)) > 1:
        guard = main_process_guard()
        if guard is not None:  # the others are not coming: never wait for them
            return _save_alone(accelerator, output_dir, safe_serialization, guard)
    config = project_config(accelerator)
    writer = _is_writer(accelerator)
    rank = int(getattr(accelerator, "process_index", 0))
    final, automatic, pid = _agree_on_folder(accelerator, output_dir)
    parent, name = os.path.split(final)
    tmp = os.path.join(parent, f".tmp-{name}-{pid}")

    error = None
    if writer:
        try:
            os.makedirs(parent, exist_ok=True)
            remove_stale_temps(parent, name)
            os.makedirs(tmp)
        except Exception as exc:  # noqa: BLE001
            error = f"{type(exc).__name__}: {exc}"
    _all_ok(error, f"save_state({final})")

    counts: dict[str, int] = {}
    error = None
    try:
        weights = _weights_after_hooks(accelerator, tmp)
        # what the training back-end writes itself: FSDP/tensor-parallel shards, DeepSpeed engines' checkpoints
        overrides = accelerator.backend.save_parts(tmp, weights)
        if writer:
            counts = _write_shared(accelerator, tmp, safe_serialization, weights, overrides)
        _torch_save(
            {"rng": rng_state(), "dataloaders": _loader_states(accelerator)},
            os.path.join(tmp, f"rank_{rank}.pt"),
        )
    except Exception as exc:  # noqa: BLE001
        error = f"{type(exc).__name__}: {exc}"
    try:
        _all_ok(error, f"save_state({final})")
    except CheckpointError:
        if writer:
            shutil.rmtree(tmp, ignore_errors=True)
        raise

    error = None
    if writer:
        try:
            _publish(accelerator, tmp, final, counts, safe_serialization)
            if automatic:
                _rotate(config)
        except Exception as exc:  # noqa: BLE001 - shared with every rank below
            error = f"{type(exc).__name__}: {exc}"
            shutil.rmtree(tmp, ignore_errors=True)
    _all_ok(error, f"save_state({final})")
    if automatic:
        config.iteration = int(CHECKPOINT_DIR.match(name).group(1)) + 1
    return final


def _save_alone(accelerator: Any, output_dir: str | None, safe_serialization: bool, guard: str) -> str:
    """``save_state`` run by one process only (under ``if accelerator.is_main_process:``): it writes the whole
    checkpoint itself, as atomically as ever, without waiting for the others (the reference's meaning).

    The other ranks' random states are not in it: on ``load_state`` they keep theirs (and take this
    process's data loader positions, the same on every rank of a data-parallel run)."""
    held = accelerator.backend.needs_every_rank()  # each process holds a part of the state
    if held is not None:
        raise CheckpointError(
            f"save_state is called on one process only ({guard}), but with {held} it needs every process; "
            "the others would never join it. Call accelerator.save_state(folder) on every process (outside "
            "the main-process block): the main process writes the shared files itself. Nothing was saved"
        )
    config = project_config(accelerator)
    rank = int(getattr(accelerator, "process_index", 0))
    final, automatic = _resolve_output_dir(accelerator, output_dir)
    _check_replaceable(final)
    parent, name = os.path.split(final)
    tmp = os.path.join(parent, f".tmp-{name}-{os.getpid()}")
    os.makedirs(parent, exist_ok=True)
    remove_stale_temps(parent, name)
    os.makedirs(tmp)
    try:
        weights = _weights_after_hooks(accelerator, tmp)
        counts = _write_shared(accelerator, tmp, safe_serialization, weights)
        _torch_save(
            {"rng": rng_state(), "dataloaders": _loader_states(accelerator)},
            os.path.join(tmp, f"rank_{rank}.pt"),
        )
        _publish(accelerator, tmp, final, counts, safe_serialization, alone=rank)
        if automatic:
            _rotate(config)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if automatic:
        config.iteration = int(CHECKPOINT_DIR.match(name).group(1)) + 1
    return final


def _agree_on_folder(accelerator: Any, output_dir: str | None) -> tuple[str, bool, int]:
    """Process 0 picks the folder (and whether it was named automatically); every rank gets its choice."""
    from ..ops import broadcast_object_list

    asked = None if output_dir is None else os.path.abspath(os.fspath(output_dir))
    plan: list[Any] = [None, None, None, None, asked]
    if getattr(accelerator, "is_main_process", True):
        try:
            final, automatic = _resolve_output_dir(accelerator, output_dir)
            _check_replaceable(final)
            plan = [final, automatic, os.getpid(), None, asked]
        except Exception as exc:  # noqa: BLE001 - shared with every rank below
            plan = [None, None, None, f"{type(exc).__name__}: {exc}", asked]
    broadcast_object_list(plan, from_process=0)
    if plan[3]:
        raise CheckpointError(f"save_state: {plan[3]}")
    if asked is not None and plan[4] is not None and asked != plan[4]:
        # the reference writes this rank's RNG file into its own folder (which its load_state
        # cannot resume from); here the checkpoint is one folder, the main process's
        warnings.warn(
            f"save_state: rank {getattr(accelerator, 'process_index', 0)} was given {asked} but the main "
            f"process {plan[4]}; the checkpoint is one folder, written to {plan[0]} (this rank's state "
            "included). Pass the same folder on every rank, and load_state from it on every rank",
            stacklevel=4,  # the caller of Accelerator.save_state
        )
    return plan[0], plan[1], plan[2]


def _publish(
    accelerator: Any,
    tmp: str,
    final: str,
    counts: dict[str, int],
    safe_serialization: bool,
    alone: int | None = None,
) -> None:
    """Fsync every file, write the manifest (sizes and digests) last, then rename the folder into place."""
    files = {}
    for root, dirs, names in os.walk(tmp):  # a save pre-hook may have written sub-folders
        dirs.sort()
        for name in sorted(names):
            path = os.path.join(root, name)
            fsync_path(path)
            entry = os.path.relpath(path, tmp).replace(os.sep, "/")
            files[entry] = {"size": os.path.getsize(path), "digest": file_digest(path)}
    manifest = {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "world_size": int(getattr(accelerator, "num_processes", 1)),
        "step": int(getattr(accelerator, "step", 0) or 0),
        "counts": counts,
        "safe_serialization": bool(safe_serialization),
        "save_on_each_node": bool(project_config(accelerator).save_on_each_node),
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "files": files,
    }
    if alone is not None:  # saved by this process only: the other ranks' files are not expected
        manifest["saved_by"] = alone
    with open(os.path.join(tmp, MANIFEST_NAME), "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    commit_dir(tmp, final)


def _weights_after_hooks(accelerator: Any, tmp: str) -> list[dict[str, Any]]:
    """Each prepared model's state dict, after the save pre-hooks (which may pop the ones they save).

    Called on every process, like the hooks; they get the user's modules (unwrapped, as the
    reference's hooks do, so ``model.save_pretrained`` works) and the folder being written (``tmp``,
    renamed into place when the save completes), so what they write there is part of the checkpoint.
    """
    from ..accelerator.weights import run_save_hooks
    from ..fsdp.checkpointing import model_weights

    models = list(getattr(accelerator, "_models", []))
    from ..xla.training import host_copy  # XLA tensors are written as CPU tensors (loadable anywhere)

    plain = [unwrapped(accelerator, model) for model in models]  # the reference's _models: the user's modules
    weights = [host_copy(model_weights(accelerator, module)) for module in plain]
    run_save_hooks(accelerator, plain, weights, tmp)
    return weights


def _write_shared(
    accelerator: Any,
    tmp: str,
    safe_serialization: bool,
    weights: list[Any],
    overrides: dict[int, Any] | None = None,
) -> dict[str, int]:
    models = weights
    overrides = overrides or {}
    for i, state in enumerate(weights):
        if state is None:  # an FSDP model's shards, already written by every rank
            continue
        if safe_serialization:
            save_sharded_safetensors(state, tmp, weights_name=f"model{file_suffix(i)}.safetensors")
        else:
            _torch_save(state, os.path.join(tmp, f"pytorch_model{file_suffix(i)}.bin"))
    optimizers = list(getattr(accelerator, "_optimizers", []))
    for i, opt in enumerate(optimizers):
        if i in overrides and overrides[i] is None:
            continue  # its shards are in fsdp_optimizer<i>/
        state = overrides[i] if i in overrides else opt.state_dict()
        _torch_save(state, os.path.join(tmp, f"optimizer{file_suffix(i)}.bin"))
    schedulers = list(getattr(accelerator, "_schedulers", []))
    for i, sched in enumerate(schedulers):
        _torch_save(sched.state_dict(), os.path.join(tmp, f"scheduler{file_suffix(i)}.bin"))
    scaler = getattr(accelerator, "scaler", None)
    if scaler is not None:
        _torch_save(scaler.state_dict(), os.path.join(tmp, "scaler.pt"))
    customs = list(getattr(accelerator, "_custom_objects", []))
    for i, obj in enumerate(customs):
        _torch_save(obj.state_dict(), os.path.join(tmp, f"custom_checkpoint_{i}.bin"))
    return {
        "models": len(models),
        "optimizers": len(optimizers),
        "schedulers": len(schedulers),
        "scaler": int(scaler is not None),
        "custom_objects": len(customs),
        "dataloaders": len(list(getattr(accelerator, "_dataloaders", []))),
    }


def _loader_states(accelerator: Any) -> list[Any]:
    return [
        dl.state_dict() if hasattr(dl, "state_dict") else None
        for dl in getattr(accelerator, "_dataloaders", [])
    ]
