"""What save and load agree on: the project layout, the manifest format, file names and digests.

Example:
    config = ProjectConfiguration("runs/a", automatic_checkpoint_naming=True, total_limit=3)
    file_suffix(0), file_suffix(2)      # "", "_2": model.safetensors, model_2.safetensors
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from typing import Any

import torch

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "ProjectConfiguration",
    "project_config",
    "unwrapped",
    "file_suffix",
    "file_digest",
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


def project_config(accelerator: Any) -> ProjectConfiguration:
    """The accelerator's ProjectConfiguration (a default one when it has none)."""
    config = getattr(accelerator, "project_configuration", None)
    return config if config is not None else ProjectConfiguration()


def unwrapped(accelerator: Any, model: torch.nn.Module) -> torch.nn.Module:
    """The user's module inside ``model`` (through the accelerator's ``unwrap_model`` when it has one)."""
    unwrap = getattr(accelerator, "unwrap_model", None)
    if unwrap is not None:
        try:
            return unwrap(model, keep_torch_compile=False)  # plain parameter names, not "_orig_mod."
        except TypeError:  # an unwrap_model without that keyword
            return unwrap(model)
    while hasattr(model, "module") and isinstance(model.module, torch.nn.Module):
        model = model.module
    return getattr(model, "_orig_mod", model)


def file_suffix(i: int) -> str:
    """The suffix of the i-th object's files: "" for the first, "_i" after."""
    return "" if i == 0 else f"_{i}"


def file_digest(path: str) -> str:
    """Hash of the first and last 64 KiB and the size: catches truncation and most overwrites cheaply."""
    size = os.path.getsize(path)
    h = hashlib.blake2b(str(size).encode(), digest_size=16)
    with open(path, "rb") as f:
        h.update(f.read(_DIGEST_SPAN))
        if size > _DIGEST_SPAN:
            f.seek(max(size - _DIGEST_SPAN, _DIGEST_SPAN))
            h.update(f.read())
    return h.hexdigest()
