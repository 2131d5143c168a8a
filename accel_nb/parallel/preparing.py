"""What ``Accelerator`` does with a ``ParallelismConfig``: check it against the run, build the mesh,
and in ``prepare`` split a model with its tensor-parallel plan, then shard it with FSDP2 over the
data-parallel shard dimension joined with the context-parallel one (``dp_shard_cp``; the sequence
split itself happens in ``accelerator.maybe_context_parallel``: accel_nb.parallel.context_parallel).

    layout = resolve_layout(config, num_processes=4, device=torch.device("cpu"), fsdp_options=None)
    swap = parallelize(model, layout, mixed_precision="no")   # TP over mesh["tp"], FSDP2 over mesh["dp_shard_cp"]
"""

from __future__ import annotations

import re
import weakref
from dataclasses import dataclass
from typing import Any

import torch

from ..fsdp.options import FSDPOptions
from .config import ParallelismConfig, parallelism_from_env

__all__ = ["ParallelLayout", "parallelize", "resolve_layout"]


@dataclass
class ParallelLayout:
    """A checked ``ParallelismConfig`` with its mesh, and the FSDP settings that shard over it."""

    config: ParallelismConfig
    mesh: Any
    fsdp: FSDPOptions | None
    rank: int

    @property
    def tp_enabled(self) -> bool:
        return self.config.tp_enabled

    @property
    def data_parallel_size(self) -> int:
        return self.config.data_parallel_size

    @property
    def data_parallel_rank(self) -> int:
        return self.config.data_parallel_rank(self.rank)

    def fsdp_mesh(self) -> Any:
        """The mesh ``fully_shard`` gets: ``dp_shard_cp``, or ``(dp_replicate, dp_shard_cp)`` for HSDP."""
        return self.config.submesh(*self.config.fsdp_dim_names)


def resolve_layout(
    config: Any, num_processes: int, rank: int, device: torch.device, fsdp_options: FSDPOptions | None
) -> ParallelLayout | None:
    """The run's layout: ``config``, else the launcher's (``--parallelism_config_*``), else None.

    Checks, before any collective: the sizes multiply to ``num_processes``; FSDP settings fit
    (``dp_shard_size``/``cp_size`` above 1 shard with FSDP2, the default ``FSDPOptions()`` unless given).
    """
    if config is None:
        config = parallelism_from_env()
        if config is None:
            return None
    if not isinstance(config, ParallelismConfig):
        raise TypeError(f"parallelism_config must be a ParallelismConfig(...), got {type(config).__name__}")
    if config.total_size == 1 and num_processes > 1:  # no sizes given: plain replicated data parallel
        config.dp_replicate_size = num_processes
    if (
        config.cp_enabled
        and config.cp_handler is not None
        and config.cp_handler.cp_comm_strategy != "allgather"
    ):
        raise ValueError(
            f"cp_comm_strategy={config.cp_handler.cp_comm_strategy!r}: accel_nb's context parallel all-gathers the "
            "keys and values (cp_comm_strategy='allgather'); the all-to-all exchange is not built"
        )
    config.check_world_size(num_processes)
    if config.shards_with_fsdp:
        fsdp_options = fsdp_options if fsdp_options is not None else FSDPOptions()
        if fsdp_options.sharding_strategy not in ("full", "shard_grad_op"):
            raise ValueError(
                f"FSDPOptions(sharding_strategy={fsdp_options.sharding_strategy!r}) with a ParallelismConfig: the "
                "config's sizes say what is replicated and what is sharded; use sharding_strategy='full' (or "
                "'shard_grad_op') and set dp_replicate_size for hybrid sharding"
            )
    elif fsdp_options is not None:
        raise ValueError(
            f"FSDP is enabled but ParallelismConfig({config.describe()}) has no dimension for it to shard over; "
            "set dp_shard_size > 1 (e.g. dp_shard_size=2, tp_size=2 on 4 processes) or drop the FSDP setting"
        )
    mesh = config.get_device_mesh(device.type) if num_processes > 1 else None
    return ParallelLayout(config=config, mesh=mesh, fsdp=fsdp_options, rank=rank)


def parallelize(
    model: torch.nn.Module,
    layout: ParallelLayout,
    mixed_precision: str,
    device: torch.device,
) -> dict[int, tuple[Any, Any]]:
    """Split ``model`` with its tensor-parallel plan over ``mesh["tp"]``, then shard it with FSDP2 over
    the data-parallel shard dimension, in place.

    Returns what each original parameter became (for re-pointing optimizers created before).
    The plan is checked before anything is split (a clear error for a missing module).
    """
    from .tensor_parallel import apply_plan, resolve_plan  # deferred: torch.distributed.tensor

    before = [
        (module, name, param)
        for module in model.modules()
        for name, param in module._parameters.items()
        if param is not None
    ]
    config = layout.config
    if config.cp_enabled:
        from .context_parallel import check_attention_implementation, check_recurrent_layers  # deferred

        check_attention_implementation(model)
        check_recurrent_layers(model)
    if config.tp_enabled and not _already_split(model, config.tp_size):
        plan = resolve_plan(model, config.tp_plan, config.tp_size)
        if layout.mesh is not None:
            apply_plan(model, plan, config.submesh("tp"))
    if layout.fsdp is not None and layout.mesh is not None:
        from ..fsdp.sharding import shard_model  # deferred: torch.distributed.fsdp

        shard_model(model, layout.fsdp, mixed_precision, device, mesh=layout.fsdp_mesh())
        if config.tp_enabled:
            _quiet_the_tensor_parallel_output_warning(model)
    swap: dict[int, tuple[Any, Any]] = {}
    for module, name, old in before:
        new = module._parameters.get(name)
        if new is not None and new is not old:
            swap[id(old)] = (weakref.ref(old), weakref.ref(new))
    return swap


def _quiet_the_tensor_parallel_output_warning(model: torch.nn.Module) -> None:
    """No FSDP2 "returned a view tensor ... will silently drop the pre-backward hook" warning for this root.

    A tensor-parallel model's outputs (the logits) leave its last planned layer through DTensor's
    ``to_local``, a view made inside an autograd Function, so FSDP2 warns on every rank at the first
    forward that an in-place op on it would silently drop its pre-backward hook. It cannot: autograd
    refuses any in-place op on such a view, or on a view of it, with a RuntimeError ("... is a view
    and is being modified inplace. This view was created inside a custom Function ..."), and without
    one the gradients are the one-process run's (tests/test_parallel_tp.py checks both). Nothing in it
    is for the user to act on, so it is not shown for this root module (its class, named as FSDP2
    names it); other modules' warnings still are.
    """
    import warnings

    warnings.filterwarnings(
        "ignore",
        message=rf"FSDP2-wrapped module \({re.escape(type(model).__name__)}\) returned a view tensor",
        category=UserWarning,
    )


def _already_split(model: torch.nn.Module, tp_size: int) -> bool:
    """True when ``model`` arrived tensor-parallel already (e.g. ``from_pretrained(tp_plan="auto")``).

    Its DTensor parameters must live on a mesh of ``tp_size`` processes (a clear error otherwise).
    """
    from torch.distributed.tensor import DTensor  # deferred: torch.distributed

    meshes = {p.device_mesh.size() for p in model.parameters() if isinstance(p, DTensor)}
    if not meshes:
        return False
    if meshes != {tp_size}:
        raise ValueError(
            f"this {type(model).__name__} was split over {sorted(meshes)} processes before prepare, but tp_size="
            f"{tp_size} (transformers' from_pretrained(tp_plan='auto') splits over every process); load it without "
            "tp_plan and let prepare apply the model's plan over the tp dimension"
        )
    return True
