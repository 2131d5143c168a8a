"""Which training back-end an Accelerator runs: decided once, in its constructor, from its arguments and the launch.

The order: Megatron-LM (``megatron_lm_plugin``), else DeepSpeed (``deepspeed_plugin``), else the TP/CP/PP layout
(``parallelism_config``), else FSDP2 (``fsdp``/``fsdp_plugin``), else XLA devices, else DDP (one process
included). Each setting also comes from the launch (the config's sections, through the environment) when the
argument is not given.

    backend = choose_backend(accelerator, fsdp=None, fsdp_plugin=None, parallelism_config=None, explicit_steps=False)
"""

from __future__ import annotations

from typing import Any

from ...fsdp.options import resolve_fsdp_options
from ...parallel.preparing import resolve_layout
from ...parallel.roles import announce_mesh_role
from ...state import DistributedType, PartialState
from .base import TrainingBackend, backend_named, conversions_for

__all__ = ["choose_backend"]


def _refuse_combinations(accelerator: Any, on_xla: bool) -> None:
    if on_xla and accelerator.compile_options is not None:
        raise ValueError(
            "torch.compile (compile=/dynamo_backend=/dynamo_plugin=/dynamo_config) is not supported on XLA "
            "devices (TPU cores): torch_xla already compiles every step's graph; drop the compile setting "
            "(or set dynamo_backend: 'no' in the launch config) for TPU runs"
        )
    if accelerator.compile_options is not None:
        accelerator.compile_options.check_backend()  # an unknown backend fails here, not at the first forward


def choose_backend(
    accelerator: Any, fsdp: Any, fsdp_plugin: Any, parallelism_config: Any, explicit_steps: bool
) -> TrainingBackend:
    """The back-end of ``accelerator`` (whose state, precision and compile options exist already).

    Sets what the Accelerator shows of it: ``fsdp_options``, ``parallel_layout``, ``state.distributed_type``
    (FSDP, DEEPSPEED or the launch's), and the model conversions the run asks for (``conversions``).
    """
    state = accelerator.state
    launched = PartialState().distributed_type
    on_xla = launched == DistributedType.XLA
    _refuse_combinations(accelerator, on_xla)
    deepspeed = accelerator.deepspeed_plugin is not None
    # FSDP2 sharding of prepared models: fsdp=/fsdp_plugin=, else the launch config (accel_nb.fsdp)
    accelerator.fsdp_options = resolve_fsdp_options(fsdp, fsdp_plugin, state.num_processes, on_xla=on_xla)
    # tensor parallel x FSDP2 on one device mesh: parallelism_config=, else the launch (accel_nb.parallel)
    layout = resolve_layout(
        parallelism_config, state.num_processes, state.process_index, state.device, accelerator.fsdp_options
    )
    accelerator.parallel_layout = layout
    if layout is not None:
        if deepspeed:
            raise ValueError(
                "parallelism_config= with DeepSpeed is not supported by accel_nb: use FSDP2 (dp_shard_size) and "
                "tensor parallel (tp_size) through the ParallelismConfig, or DeepSpeed ZeRO alone"
            )
        accelerator.fsdp_options = layout.fsdp
        # the launching notebook's rank rows show each rank's coordinates ("rank 3 [dp 1 · tp 1]")
        announce_mesh_role(layout.config, state.process_index)
    sharded = accelerator.fsdp_options is not None
    state.distributed_type = DistributedType.FSDP if sharded else launched
    if deepspeed:
        from ...deepspeed.training import configure

        configure(accelerator, explicit_steps)  # DEEPSPEED, the accumulation steps agreed, no GradScaler
    name = (
        "megatron"
        if getattr(accelerator, "megatron_lm_plugin", None) is not None
        else "deepspeed"
        if deepspeed
        else "layout"
        if layout is not None
        else "fsdp"
        if sharded
        else "xla"
        if on_xla
        else "ddp"
    )
    accelerator.conversions = conversions_for(accelerator)
    return backend_named(name)(accelerator)
