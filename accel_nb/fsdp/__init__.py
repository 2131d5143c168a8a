"""Sharded data parallelism with torch's ``fully_shard`` (FSDP2) through ``Accelerator.prepare``.

``options`` holds the settings (no torch import); ``sharding`` applies them to a model;
``state_dicts`` saves and loads sharded models and their optimizers with torch.distributed.checkpoint.

    accelerator = Accelerator(mixed_precision="bf16", fsdp=FSDPOptions(auto_wrap_classes=["Block"]))
    model, optimizer = accelerator.prepare(model, optimizer)
"""

from __future__ import annotations

from .options import FSDPOptions, FullyShardedDataParallelPlugin, options_from_config, options_from_env

__all__ = ["FSDPOptions", "FullyShardedDataParallelPlugin", "options_from_config", "options_from_env"]
