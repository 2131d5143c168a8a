"""DeepSpeed ZeRO through ``Accelerator.prepare`` (the ``deepspeed`` package is an optional extra).

``plugin`` holds the settings (imports nothing heavy); ``preparing`` builds the engine;
``wrappers`` are what ``prepare`` returns; ``training`` and ``checkpointing`` serve the
Accelerator's calls. Nothing here imports ``deepspeed`` until ``prepare`` needs it.

    accelerator = Accelerator(deepspeed_plugin=DeepSpeedPlugin(zero_stage=3, gradient_clipping=1.0))
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
"""

from __future__ import annotations

from .plugin import DeepSpeedPlugin, plugin_from_env, plugin_from_launch_settings
from .preparing import zero3_init
from .wrappers import (
    DeepSpeedEngineWrapper,
    DeepSpeedOptimizerWrapper,
    DeepSpeedSchedulerWrapper,
    DummyOptim,
    DummyScheduler,
)

__all__ = [
    "DeepSpeedPlugin",
    "DeepSpeedEngineWrapper",
    "DeepSpeedOptimizerWrapper",
    "DeepSpeedSchedulerWrapper",
    "DummyOptim",
    "DummyScheduler",
    "plugin_from_env",
    "plugin_from_launch_settings",
    "zero3_init",
]
