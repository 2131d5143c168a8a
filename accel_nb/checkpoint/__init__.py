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

from ..serialization import CheckpointError
from .folders import MANIFEST_NAME, is_complete_checkpoint, list_checkpoints
from .layout import ProjectConfiguration
from .load import load_accelerator_state
from .objects import checkpointable, save_model, save_object
from .save import save_accelerator_state

__all__ = [
    "CheckpointError",
    "ProjectConfiguration",
    "MANIFEST_NAME",
    "save_accelerator_state",
    "load_accelerator_state",
    "save_model",
    "save_object",
    "checkpointable",
    "list_checkpoints",
    "is_complete_checkpoint",
]
