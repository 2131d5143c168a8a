"""Model parallelism beyond data parallel, on torch's own DeviceMesh, DTensor and pipelining.

- ``config``: ``ParallelismConfig`` (dp_replicate × dp_shard × cp × tp sizes) and the device mesh it builds.
- ``tensor_parallel``: a tensor-parallel plan (the model's own or a dict) applied with ``parallelize_module``.
- ``preparing``: what ``Accelerator.prepare`` does with a ParallelismConfig (TP, then FSDP2 over dp_shard × cp).
- ``context_parallel``: the sequence split over the cp ranks, attention over all-gathered keys/values
  (``accelerator.maybe_context_parallel``).
- ``clipping``: gradient-norm clipping over parameters that live on different meshes.
- ``metrics``: ``gather_for_metrics`` keeping each data-parallel group's samples once.
- ``pipeline``: ``prepare_pippy``, pipeline-parallel inference (one stage per process, microbatches through GPipe).
- ``pipeline_training``: ``PipelineTrainer``, pipeline-parallel training (GPipe / 1F1B, per-stage optimizers).
- ``pipeline_split``: where to cut a model into stages (checked names, or balanced by parameter bytes).

    from accel_nb import Accelerator, ParallelismConfig
    accelerator = Accelerator(parallelism_config=ParallelismConfig(dp_shard_size=2, tp_size=2))
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
"""

from __future__ import annotations

from .config import ParallelismConfig, TorchContextParallelConfig, TorchTensorParallelConfig

__all__ = ["ParallelismConfig", "TorchContextParallelConfig", "TorchTensorParallelConfig"]
