"""Checkpoints that never lose a run: save_state / load_state / save_model behind ``Accelerator``.

A checkpoint is a folder written atomically: every file goes into ``.tmp-<name>-<pid>`` beside
the target, is fsynced, a manifest (``checkpoint.json``) is written last, and only then is the
folder renamed into place. A save killed half-way leaves the previous checkpoint untouched, and
a folder without a manifest is never loaded.

    accelerator = Accelerator(project_config=ProjectConfiguration("runs/a", automatic_checkpoint_naming=True,
                                                                    total_limit=3))
    accelerator.save_state()            # runs/a/checkpoints/checkpoint_0, _1, ... (3 kept)
    accelerator.load_state()            # the newest complete one

Loading never unpickles arbitrary objects unless asked: tensors come from safetensors and the
small state files go through ``torch.load(weights_only=True)``; ``load_state(dir,
weights_only=False)`` opts in for checkpoints you trust.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import re
import shutil
import time
import warnings
from dataclasses import dataclass
from typing import Any

import torch

from .checkpoint_folders import (
    CHECKPOINT_DIR,
    MANIFEST_NAME,
    commit_dir,
    is_complete_checkpoint,
    list_checkpoints,
    next_iteration,
    remove_stale_temps,
)
from .rng import rng_state, set_rng_state
from .serialization import (
    CheckpointError,
    check_against,
    fsync_path,
    index_checkpoint,
    load_safetensors_into,
    save_sharded_safetensors,
)

__all__ = [
    "CheckpointError",
    "ProjectConfiguration",
    "MANIFEST_NAME",
    "save_accelerator_state",
    "load_accelerator_state",
    "save_model",
    "save_object",
    "list_checkpoints",
    "is_complete_checkpoint",
]

FORMAT = "accel_nb.checkpoint"
FORMAT_VERSION = 1
_DIGEST_SPAN = 64 * 1024


@dataclass
class ProjectConfiguration:
    """Where a run keeps its checkpoints and logs, and how many checkpoints it keeps.

        ProjectConfiguration(project_dir="runs/a", automatic_checkpoint_naming=True, total_limit=3)

    With ``automatic_checkpoint_naming``, ``save_state()`` writes
    ``<project_dir>/checkpoints/checkpoint_<iteration>`` and, after each complete save, removes the
    oldest complete checkpoints beyond ``total_limit``.
    """

    project_dir: str | None = None
    logging_dir: str | None = None
    automatic_checkpoint_naming: bool = False
    total_limit: int | None = None
    iteration: int = 0
    save_on_each_node: bool = False

    def __post_init__(self) -> None:
        if self.logging_dir is None:
            self.logging_dir = self.project_dir
        if self.total_limit is not None and int(self.total_limit) < 1:
            raise ValueError(
                f"total_limit={self.total_limit} must be at least 1 (or None to keep every checkpoint)"
            )

    def set_directories(self, project_dir: str | None = None) -> None:
        """Point the project (and, unless set, the logs) at ``project_dir``."""
        self.project_dir = project_dir
        if self.logging_dir is None:
            self.logging_dir = project_dir

    @property
    def checkpoints_dir(self) -> str | None:
        return None if self.project_dir is None else os.path.join(self.project_dir, "checkpoints")


# -- small helpers ----------------------------------------------------------------------------------
def _config(accelerator: Any) -> ProjectConfiguration:
    config = getattr(accelerator, "project_configuration", None)
    return config if config is not None else ProjectConfiguration()


def _is_writer(accelerator: Any) -> bool:
    if _config(accelerator).save_on_each_node:
        return bool(getattr(accelerator, "is_local_main_process", True))
    return bool(getattr(accelerator, "is_main_process", True))


def _unwrap(accelerator: Any, model: torch.nn.Module) -> torch.nn.Module:
    unwrap = getattr(accelerator, "unwrap_model", None)
    if unwrap is not None:
        return unwrap(model)
    while hasattr(model, "module") and isinstance(model.module, torch.nn.Module):
        model = model.module
    return getattr(model, "_orig_mod", model)


def _suffix(i: int) -> str:
    return "" if i == 0 else f"_{i}"


def _digest(path: str) -> str:
    """Hash of the first and last 64 KiB and the size: catches truncation and most overwrites cheaply."""
    size = os.path.getsize(path)
    h = hashlib.blake2b(str(size).encode(), digest_size=16)
    with open(path, "rb") as f:
        h.update(f.read(_DIGEST_SPAN))
        if size > _DIGEST_SPAN:
            f.seek(max(size - _DIGEST_SPAN, _DIGEST_SPAN))
            h.update(f.read())
    return h.hexdigest()


def _torch_save(obj: Any, path: str) -> None:
    with open(path, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())


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


def _rotate(config: ProjectConfiguration) -> None:
    if not config.total_limit or config.checkpoints_dir is None:
        return
    complete = list_checkpoints(config.checkpoints_dir)
    for path in complete[: max(len(complete) - int(config.total_limit), 0)]:
        shutil.rmtree(path, ignore_errors=True)


def _resolve_output_dir(accelerator: Any, output_dir: str | None) -> tuple[str, bool]:
    config = _config(accelerator)
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
    from .ops import gather_object

    errors = gather_object([error])
    bad = [(r, e) for r, e in enumerate(errors) if e]
    if bad:
        raise CheckpointError(f"{what} failed on " + "; ".join(f"rank {r}: {e}" for r, e in bad))


# -- save ---------------------------------------------------------------------------------------------
def save_accelerator_state(
    accelerator: Any, output_dir: str | None = None, safe_serialization: bool = True
) -> str:
    """Save everything needed to resume: weights, optimizers, schedulers, scaler, every rank's RNG,
    data loader positions, the step and registered objects. Call it on every process.

        path = save_accelerator_state(accelerator, "ckpt")   # == accelerator.save_state("ckpt")
    """
    from .ops import broadcast_object_list

    config = _config(accelerator)
    writer = _is_writer(accelerator)
    rank = int(getattr(accelerator, "process_index", 0))
    world = int(getattr(accelerator, "num_processes", 1))
    plan: list[Any] = [None, None, None, None]
    if getattr(accelerator, "is_main_process", True):
        try:
            final, automatic = _resolve_output_dir(accelerator, output_dir)
            _check_replaceable(final)
            plan = [final, automatic, os.getpid(), None]
        except Exception as exc:  # noqa: BLE001 - shared with every rank below
            plan = [None, None, None, f"{type(exc).__name__}: {exc}"]
    broadcast_object_list(plan, from_process=0)
    if plan[3]:
        raise CheckpointError(f"save_state: {plan[3]}")
    final, automatic, pid = plan[0], plan[1], plan[2]
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
        if writer:
            counts = _write_shared(accelerator, tmp, safe_serialization)
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
            files = {}
            for entry in sorted(os.listdir(tmp)):
                path = os.path.join(tmp, entry)
                fsync_path(path)
                files[entry] = {"size": os.path.getsize(path), "digest": _digest(path)}
            manifest = {
                "format": FORMAT,
                "version": FORMAT_VERSION,
                "world_size": world,
                "step": int(getattr(accelerator, "step", 0) or 0),
                "counts": counts,
                "safe_serialization": bool(safe_serialization),
                "save_on_each_node": bool(config.save_on_each_node),
                "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "files": files,
            }
            with open(os.path.join(tmp, MANIFEST_NAME), "w", encoding="utf-8") as f:
                json.dump(manifest, f, indent=1)
                f.flush()
                os.fsync(f.fileno())
            commit_dir(tmp, final)
            if automatic:
                _rotate(config)
        except Exception as exc:  # noqa: BLE001
            error = f"{type(exc).__name__}: {exc}"
            shutil.rmtree(tmp, ignore_errors=True)
    _all_ok(error, f"save_state({final})")
    if automatic:
        config.iteration = int(CHECKPOINT_DIR.match(name).group(1)) + 1
    return final


def _write_shared(accelerator: Any, tmp: str, safe_serialization: bool) -> dict[str, int]:
    models = list(getattr(accelerator, "_models", []))
    for i, model in enumerate(models):
        state = _unwrap(accelerator, model).state_dict()
        if safe_serialization:
            save_sharded_safetensors(state, tmp, weights_name=f"model{_suffix(i)}.safetensors")
        else:
            _torch_save(state, os.path.join(tmp, f"pytorch_model{_suffix(i)}.bin"))
    optimizers = list(getattr(accelerator, "_optimizers", []))
    for i, opt in enumerate(optimizers):
        _torch_save(opt.state_dict(), os.path.join(tmp, f"optimizer{_suffix(i)}.bin"))
    schedulers = list(getattr(accelerator, "_schedulers", []))
    for i, sched in enumerate(schedulers):
        _torch_save(sched.state_dict(), os.path.join(tmp, f"scheduler{_suffix(i)}.bin"))
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


# -- load ---------------------------------------------------------------------------------------------
def _resolve_input_dir(accelerator: Any, input_dir: str | None) -> str:
    config = _config(accelerator)
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
    rank_files = [e for e in manifest["files"] if re.match(r"^rank_\d+\.pt$", e)]
    if rank_files and len(rank_files) != saved_world and not _is_node_local(manifest):
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
        if _digest(file) != info["digest"]:
            raise CheckpointError(f"{file} does not match its checksum in {MANIFEST_NAME}: it is corrupted")
    if f"rank_{rank}.pt" not in manifest["files"]:
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
    models = list(getattr(accelerator, "_models", []))
    optimizers = list(getattr(accelerator, "_optimizers", []))
    schedulers = list(getattr(accelerator, "_schedulers", []))
    customs = list(getattr(accelerator, "_custom_objects", []))
    loaders = list(getattr(accelerator, "_dataloaders", []))
    if counts:
        _count_check(path, "model(s)", counts["models"], len(models))
        _count_check(path, "optimizer(s)", counts["optimizers"], len(optimizers))
        _count_check(path, "scheduler(s)", counts["schedulers"], len(schedulers))
        _count_check(path, "registered object(s)", counts["custom_objects"], len(customs))

    model_sources = []
    for i, model in enumerate(models):
        module = _unwrap(accelerator, model)
        if manifest.get("safe_serialization", True):
            index_file = os.path.join(path, f"model{_suffix(i)}.safetensors.index.json")
            index = index_checkpoint(
                index_file
                if os.path.exists(index_file)
                else os.path.join(path, f"model{_suffix(i)}.safetensors")
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
                (module, _torch_load(os.path.join(path, f"pytorch_model{_suffix(i)}.bin"), weights_only))
            )
    opt_states = [
        _torch_load(os.path.join(path, f"optimizer{_suffix(i)}.bin"), weights_only)
        for i in range(len(optimizers))
    ]
    sched_states = [
        _torch_load(os.path.join(path, f"scheduler{_suffix(i)}.bin"), weights_only)
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
    rank_state = _torch_load(os.path.join(path, f"rank_{rank}.pt"), weights_only)
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
        "rng": rank_state["rng"],
    }


def load_accelerator_state(
    accelerator: Any, input_dir: str | None = None, strict: bool = True, weights_only: bool = True
) -> str:
    """Restore what ``save_accelerator_state`` wrote, on every process; returns the folder used.

        load_accelerator_state(accelerator, "ckpt")     # == accelerator.load_state("ckpt")

    Everything is read and checked first, on every rank (manifest, world size, file sizes and
    checksums, tensor names and shapes, state files); only when every rank succeeded are the model,
    optimizers, ... updated, so a bad checkpoint changes nothing anywhere.
    """
    from .ops import gather_object

    failure: BaseException | None = None
    try:
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
    path, manifest = plan["path"], plan["manifest"]
    model_sources = plan["models"]
    scaler, scaler_state = plan["scaler"]

    for module, source in model_sources:
        if isinstance(source, dict):
            module.load_state_dict(source, strict=strict)
        else:
            load_safetensors_into(module, source, strict=strict)
    for i, (opt, state) in enumerate(plan["optimizers"]):
        _apply(opt.load_state_dict, state, os.path.join(path, f"optimizer{_suffix(i)}.bin"), f"optimizer {i}")
    for i, (sched, state) in enumerate(plan["schedulers"]):
        _apply(
            sched.load_state_dict, state, os.path.join(path, f"scheduler{_suffix(i)}.bin"), f"scheduler {i}"
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
    config = _config(accelerator)
    m = CHECKPOINT_DIR.match(os.path.basename(path))
    if (
        config.automatic_checkpoint_naming
        and m
        and os.path.dirname(path) == os.path.abspath(config.checkpoints_dir or "")
    ):
        config.iteration = max(config.iteration, int(m.group(1)) + 1)
    set_rng_state(plan["rng"])  # last: nothing above may consume randomness afterwards
    return path


def _apply(load: Any, state: Any, file: str, what: str) -> None:
    try:
        load(state)
    except (ValueError, KeyError, RuntimeError, TypeError) as exc:
        raise CheckpointError(
            f"{file} does not fit {what} ({type(exc).__name__}: {exc}); create it with the same parameters "
            "and settings as the run that saved it"
        ) from exc


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

    Tied weights are written once and re-tied (or filled) on load. Returns the files written
    (an empty list on the other processes).
    """
    if os.path.isfile(save_directory):
        raise CheckpointError(f"save_model needs a folder, but {save_directory} is a file")
    if not getattr(accelerator, "is_main_process", True):
        return []
    state = _unwrap(accelerator, model).state_dict()
    return save_sharded_safetensors(
        state, save_directory, max_shard_size=max_shard_size, safe_serialization=safe_serialization
    )


def save_object(accelerator: Any, obj: Any, f: str, safe_serialization: bool = False) -> None:
    """``accelerator.save(obj, f)``: write ``obj`` once (main process), atomically.

    ``safe_serialization=True`` writes a dict of tensors as safetensors; otherwise ``torch.save``.
    """
    if not getattr(accelerator, "is_main_process", True):
        return
    from .serialization.files import atomic_save_file, atomic_torch_save

    if safe_serialization:
        atomic_save_file(dict(obj), os.fspath(f), {"format": "pt"})
    else:
        atomic_torch_save(obj, os.fspath(f))
