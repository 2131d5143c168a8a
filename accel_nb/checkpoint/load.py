"""``load_state``: find, verify and read a checkpoint on every rank, then apply it (all or nothing).

Everything is read and checked first (manifest, world size, file sizes and digests, tensor names
and shapes); only when every rank succeeded are the model, optimizers, ... updated.

    load_accelerator_state(accelerator, "ckpt")     # == accelerator.load_state("ckpt")
"""

from __future__ import annotations

import json
import os
import pickle
import re
import warnings
from typing import Any

import torch

from ..serialization import CheckpointError, check_against, index_checkpoint, load_safetensors_into
from .callers import main_process_guard
from .folders import CHECKPOINT_DIR, MANIFEST_NAME, is_complete_checkpoint, list_checkpoints
from .layout import FORMAT, FORMAT_VERSION, file_digest, file_suffix, project_config, unwrapped
from .rng import set_rng_state

__all__ = ["load_accelerator_state"]


def _torch_load(path: str, weights_only: bool) -> Any:
    try:
        return torch.load(path, map_location="cpu", weights_only=weights_only)
    except pickle.UnpicklingError as exc:
        if not weights_only:
            raise CheckpointError(f"{path} cannot be unpickled ({exc}); the file is corrupted") from exc
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(
            f"{path} holds Python objects that the safe loader refuses ({first}). If you trust this "
            "checkpoint, load it with accelerator.load_state(input_dir, weights_only=False)"
        ) from exc
    except (RuntimeError, EOFError, OSError) as exc:
        raise CheckpointError(
            f"{path} cannot be read ({type(exc).__name__}: {exc}); it is truncated or corrupted"
        ) from exc


def _resolve_input_dir(accelerator: Any, input_dir: str | None) -> str:
    config = project_config(accelerator)
    if input_dir is None:
        if not (config.automatic_checkpoint_naming and config.project_dir):
            raise CheckpointError(
                "load_state() needs a folder: pass input_dir, or use "
                "ProjectConfiguration(project_dir=..., automatic_checkpoint_naming=True) to load the newest"
            )
        complete = list_checkpoints(config.checkpoints_dir)
        if not complete:
            raise CheckpointError(
                f"no complete checkpoint under {config.checkpoints_dir}; save_state() one first"
            )
        return complete[-1]
    path = os.path.abspath(os.fspath(input_dir))
    if is_complete_checkpoint(path):
        return path
    parent, name = os.path.split(path)
    # a crash between the two renames of a replacing save leaves the old checkpoint as .old-<name>-<pid>
    olds = [
        os.path.join(parent, e)
        for e in (os.listdir(parent) if os.path.isdir(parent) else [])
        if re.match(r"^\.old-" + re.escape(name) + r"-\d+$", e)
    ]
    olds = [o for o in olds if is_complete_checkpoint(o)]
    if olds and not os.path.exists(path):
        warnings.warn(f"{path} is missing; loading the checkpoint it replaced, {olds[0]}", stacklevel=3)
        return olds[0]
    if not os.path.exists(path):
        raise CheckpointError(f"checkpoint folder {path} does not exist")
    nearby = list_checkpoints(parent)
    raise CheckpointError(
        f"{path} is not a complete checkpoint (no {MANIFEST_NAME}; its save was interrupted or it was not "
        "written by accel_nb)" + (f"; the newest complete one beside it is {nearby[-1]}" if nearby else "")
    )


def _read_manifest(path: str) -> dict[str, Any]:
    manifest_path = os.path.join(path, MANIFEST_NAME)
    try:
        with open(manifest_path, encoding="utf-8") as f:
            manifest = json.load(f)
        if manifest.get("format") != FORMAT:
            raise ValueError(f"format is {manifest.get('format')!r}")
    except (OSError, ValueError, AttributeError) as exc:
        raise CheckpointError(f"{manifest_path} is unreadable ({exc}); the checkpoint is corrupted") from None
    if int(manifest.get("version", 0)) > FORMAT_VERSION:
        raise CheckpointError(
            f"{manifest_path} has format version {manifest['version']}; upgrade accel_nb to load it"
        )
    return manifest


def _verify_files(path: str, manifest: dict[str, Any], rank: int, world: int) -> None:
    saved_world = int(manifest["world_size"])
    if saved_world != world:
        raise CheckpointError(
            f"{os.path.join(path, MANIFEST_NAME)} was saved by {saved_world} processes but this run has {world}; "
            f"resume with {saved_world} processes, or load only the weights with "
            f"accel_nb.serialization.load_safetensors_into(model, '{os.path.join(path, 'model.safetensors')}')"
        )
    alone = manifest.get("saved_by")  # saved by that process only (under `if is_main_process:`)
    rank_files = [e for e in manifest["files"] if re.match(r"^rank_\d+\.pt$", e)]
    if alone is None and rank_files and len(rank_files) != saved_world and not _is_node_local(manifest):
        raise CheckpointError(
            f"{path} has {len(rank_files)} rank files but its manifest says {saved_world} processes; "
            "the checkpoint is incomplete -- use an earlier one"
        )
    for entry, info in manifest["files"].items():
        file = os.path.join(path, entry)
        if not os.path.isfile(file):
            raise CheckpointError(
                f"{file} is missing from the checkpoint; copy the whole folder or use an earlier one"
            )
        size = os.path.getsize(file)
        if size != int(info["size"]):
            raise CheckpointError(
                f"{file} has {size} bytes but the checkpoint manifest says {info['size']}: it is truncated or was "
                "changed after the save; use an earlier checkpoint"
            )
        if file_digest(file) != info["digest"]:
            raise CheckpointError(f"{file} does not match its checksum in {MANIFEST_NAME}: it is corrupted")
    if f"rank_{rank}.pt" not in manifest["files"] and alone is None:
        raise CheckpointError(f"{path} has no rank_{rank}.pt (this process's RNG and data position)")


def _is_node_local(manifest: dict[str, Any]) -> bool:
    return bool(manifest.get("save_on_each_node"))


def _count_check(path: str, what: str, saved: int, have: int) -> None:
    if saved != have:
        raise CheckpointError(
            f"{path} holds {saved} {what} but this Accelerator has {have}; prepare (and register) the same "
            "objects in the same order as the run that saved it"
        )


def _read_checkpoint(
    accelerator: Any, input_dir: str | None, strict: bool, weights_only: bool
) -> dict[str, Any]:
    """Phase 1 of a load: find, verify and read everything; nothing is changed yet."""
    path = _resolve_input_dir(accelerator, input_dir)
    rank = int(getattr(accelerator, "process_index", 0))
    world = int(getattr(accelerator, "num_processes", 1))
    manifest = _read_manifest(path)
    _verify_files(path, manifest, rank, world)
    counts = manifest.get("counts", {})
    from ..accelerator.weights import run_load_hooks

    # the hooks get the user's modules (as the reference's do) and may pop the ones they load themselves
    models = [unwrapped(accelerator, model) for model in getattr(accelerator, "_models", [])]
    run_load_hooks(accelerator, models, path)
    optimizers = list(getattr(accelerator, "_optimizers", []))
    schedulers = list(getattr(accelerator, "_schedulers", []))
    customs = list(getattr(accelerator, "_custom_objects", []))
    loaders = list(getattr(accelerator, "_dataloaders", []))
    if counts:
        _count_check(path, "model(s)", counts["models"], len(models))
        _count_check(path, "optimizer(s)", counts["optimizers"], len(optimizers))
        _count_check(path, "scheduler(s)", counts["schedulers"], len(schedulers))
        _count_check(path, "registered object(s)", counts["custom_objects"], len(customs))

    from ..deepspeed.checkpointing import engine_source
    from ..fsdp.checkpointing import SHARDED, sharded_folder

    model_sources = []
    for i, model in enumerate(models):
        module = unwrapped(accelerator, model)
        engine = engine_source(accelerator, path, "model", i)
        if engine is not None:  # a DeepSpeed engine restores it (accel_nb.deepspeed.checkpointing)
            model_sources.append((module, engine))
        elif os.path.isdir(sharded_folder(path, "model", i)):
            # FSDP shards: read in load_state's collective phase
            model_sources.append((module, (SHARDED, sharded_folder(path, "model", i))))
        elif manifest.get("safe_serialization", True):
            index_file = os.path.join(path, f"model{file_suffix(i)}.safetensors.index.json")
            index = index_checkpoint(
                index_file
                if os.path.exists(index_file)
                else os.path.join(path, f"model{file_suffix(i)}.safetensors")
            )
            check_against(
                index,
                {k: tuple(v.shape) for k, v in module.state_dict().items()},
                strict=strict,
                what=type(module).__name__,
            )
            model_sources.append((module, index))
        else:
            model_sources.append(
                (module, _torch_load(os.path.join(path, f"pytorch_model{file_suffix(i)}.bin"), weights_only))
            )
    opt_states = [
        engine_source(accelerator, path, "optimizer", i)  # a DeepSpeed engine restores it
        or (
            (SHARDED, sharded_folder(path, "optimizer", i))
            if os.path.isdir(sharded_folder(path, "optimizer", i))
            else _torch_load(os.path.join(path, f"optimizer{file_suffix(i)}.bin"), weights_only)
        )
        for i in range(len(optimizers))
    ]
    sched_states = [
        _torch_load(os.path.join(path, f"scheduler{file_suffix(i)}.bin"), weights_only)
        for i in range(len(schedulers))
    ]
    custom_states = [
        _torch_load(os.path.join(path, f"custom_checkpoint_{i}.bin"), weights_only)
        for i in range(len(customs))
    ]
    scaler = getattr(accelerator, "scaler", None)
    scaler_file = os.path.join(path, "scaler.pt")
    scaler_state = (
        _torch_load(scaler_file, weights_only) if scaler is not None and os.path.exists(scaler_file) else None
    )
    own = f"rank_{rank}.pt" in manifest["files"]
    # saved by one process alone: the others take its data positions (the same on every data-parallel
    # rank) and keep their own random state
    rank_file = f"rank_{rank}.pt" if own else f"rank_{int(manifest['saved_by'])}.pt"
    rank_state = _torch_load(os.path.join(path, rank_file), weights_only)
    loader_states = rank_state.get("dataloaders", [])
    if loaders and len(loader_states) != len(loaders):
        _count_check(path, "data loader position(s)", len(loader_states), len(loaders))

    return {
        "path": path,
        "manifest": manifest,
        "models": model_sources,
        "optimizers": list(zip(optimizers, opt_states)),
        "schedulers": list(zip(schedulers, sched_states)),
        "customs": list(zip(customs, custom_states)),
        "scaler": (scaler, scaler_state),
        "loaders": list(zip(loaders, loader_states)),
        "rng": rank_state["rng"] if own else None,
    }


def _check_same_folder(accelerator: Any, input_dir: str | None) -> CheckpointError | None:
    """On several processes: an error for this rank when it was given another folder than the main process.

    A checkpoint is one folder that every rank reads (``save_state`` writes it to the main
    process's folder), so a folder per rank is refused before anything is read.
    """
    if int(getattr(accelerator, "num_processes", 1)) <= 1:
        return None
    from ..ops import broadcast_object_list

    asked = None if input_dir is None else os.path.abspath(os.fspath(input_dir))
    main = [asked]
    broadcast_object_list(main, from_process=0)
    if asked == main[0]:
        return None
    return CheckpointError(
        f"load_state: rank {getattr(accelerator, 'process_index', 0)} was given {asked} but the main process "
        f"{main[0]}; a checkpoint is one folder that every rank reads (save_state wrote it to the main "
        "process's folder): pass that same folder on every rank"
    )


def load_accelerator_state(
    accelerator: Any, input_dir: str | None = None, strict: bool = True, weights_only: bool = True
) -> str:
    """Restore what ``save_accelerator_state`` wrote, on every process; returns the folder used.

        load_accelerator_state(accelerator, "ckpt")     # == accelerator.load_state("ckpt")

    Everything is read and checked first, on every rank (manifest, world size, file sizes and
    checksums, tensor names and shapes, state files); only when every rank succeeded are the model,
    optimizers, ... updated, so a bad checkpoint changes nothing anywhere.
    """
    from ..ops import gather_object

    if int(getattr(accelerator, "num_processes", 1)) > 1:
        guard = main_process_guard()
        if guard is not None:  # the others are not coming: say so now instead of waiting for them
            raise CheckpointError(
                f"load_state is called on one process only ({guard}); every process restores its own state "
                "(weights, optimizer, random state, data position) and they read the checkpoint together. "
                "Call accelerator.load_state(folder) on every process. Nothing was loaded"
            )
    failure: BaseException | None = _check_same_folder(accelerator, input_dir)
    try:
        if failure is not None:
            raise failure
        plan = _read_checkpoint(accelerator, input_dir, strict, weights_only)
    except Exception as exc:  # noqa: BLE001 - shared with the other ranks below
        failure = exc
    if int(getattr(accelerator, "num_processes", 1)) > 1:
        errors = gather_object([None if failure is None else f"{type(failure).__name__}: {failure}"])
        if failure is not None:
            raise failure
        bad = [(r, e) for r, e in enumerate(errors) if e]
        if bad:
            raise CheckpointError(
                "load_state changed nothing: "
                + "; ".join(f"rank {r} could not use the checkpoint: {e}" for r, e in bad)
            )
    elif failure is not None:
        raise failure
    # every rank: the training back-end restores what it saved itself (FSDP/tensor-parallel shards, DeepSpeed
    # engines) and takes those entries out of the plan; a collective, so only after every rank's checks passed
    accelerator.backend.read_parts(plan)
    path, manifest = plan["path"], plan["manifest"]
    model_sources = plan["models"]
    scaler, scaler_state = plan["scaler"]

    from ..fsdp.checkpointing import apply_optimizer, load_model

    fsdp_models = [module for module, _ in model_sources]
    for module, source in model_sources:
        if load_model(module, source, strict):
            continue  # an FSDP-sharded model: its shards, or the full weights re-sharded
        if isinstance(source, dict):
            module.load_state_dict(source, strict=strict)
        else:
            load_safetensors_into(module, source, strict=strict)
    for i, (opt, state) in enumerate(plan["optimizers"]):
        if apply_optimizer(opt, state, fsdp_models):
            continue
        _apply(
            opt.load_state_dict, state, os.path.join(path, f"optimizer{file_suffix(i)}.bin"), f"optimizer {i}"
        )
    for i, (sched, state) in enumerate(plan["schedulers"]):
        _apply(
            sched.load_state_dict,
            state,
            os.path.join(path, f"scheduler{file_suffix(i)}.bin"),
            f"scheduler {i}",
        )
    for i, (obj, state) in enumerate(plan["customs"]):
        _apply(
            obj.load_state_dict,
            state,
            os.path.join(path, f"custom_checkpoint_{i}.bin"),
            f"registered object {i}",
        )
    if scaler is not None and scaler_state is not None:
        scaler.load_state_dict(scaler_state)
    elif scaler is not None:
        warnings.warn(
            f"{path} has no grad-scaler state (saved without fp16); the scaler starts fresh", stacklevel=2
        )
    for loader, state in plan["loaders"]:
        if state is not None and hasattr(loader, "load_state_dict"):
            loader.load_state_dict(state)
    if hasattr(accelerator, "step"):
        accelerator.step = int(manifest.get("step", 0))
    config = project_config(accelerator)
    m = CHECKPOINT_DIR.match(os.path.basename(path))
    if (
        config.automatic_checkpoint_naming
        and m
        and os.path.dirname(path) == os.path.abspath(config.checkpoints_dir or "")
    ):
        config.iteration = max(config.iteration, int(m.group(1)) + 1)
    if plan["rng"] is not None:
        set_rng_state(plan["rng"])  # last: nothing above may consume randomness afterwards
    else:
        warnings.warn(
            f"load_state: {path} was saved by process {manifest['saved_by']} alone (save_state under "
            f"`if accelerator.is_main_process:`), so process {getattr(accelerator, 'process_index', 0)} keeps "
            "its random state (the rest is restored). Call save_state on every process for an exact resume",
            stacklevel=3,
        )
    return path


def _apply(load: Any, state: Any, file: str, what: str) -> None:
    try:
        load(state)
    except (ValueError, KeyError, RuntimeError, TypeError) as exc:
        raise CheckpointError(
            f"{file} does not fit {what} ({type(exc).__name__}: {exc}); create it with the same parameters "
            "and settings as the run that saved it"
        ) from exc
