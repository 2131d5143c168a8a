"""Shard a model with torch's ``fully_shard`` (FSDP2) as ``FSDPOptions`` say, and re-point an
optimizer created before the sharding at the new (DTensor) parameters.

    swap = shard_model(model, options, mixed_precision="bf16", device=torch.device("cpu"),
                       num_processes=2, local_processes=2)
    repoint_optimizer(optimizer, swap)      # its param groups now hold the sharded parameters
"""

from __future__ import annotations

import contextlib
import sys
import weakref
from collections.abc import Iterator
from typing import Any

import torch

from .options import FSDPOptions

__all__ = [
    "is_fsdp_model",
    "is_sharded_model",
    "no_gradient_sync",
    "repoint_optimizer",
    "shard_model",
    "local_shard_bytes",
]

# id(old) -> (weakref to old, weakref to new): held by the Accelerator, it keeps neither parameter alive
ParamSwap = dict[int, tuple[Any, Any]]


def is_fsdp_model(model: Any) -> bool:
    """True when ``model`` (or its root) was sharded with ``fully_shard``; never imports FSDP itself."""
    fsdp = sys.modules.get("torch.distributed.fsdp")
    model = getattr(model, "_orig_mod", model)  # torch.compile's wrapper
    return bool(fsdp is not None and isinstance(model, fsdp.FSDPModule))


def is_sharded_model(model: Any) -> bool:
    """True when ``model``'s parameters are DTensors: sharded with ``fully_shard``, split by tensor
    parallel, or both (their state dicts go through torch.distributed.checkpoint's functions)."""
    if is_fsdp_model(model):
        return True
    tensor = sys.modules.get("torch.distributed.tensor")
    model = getattr(model, "_orig_mod", model)
    return bool(
        tensor is not None
        and isinstance(model, torch.nn.Module)
        and any(isinstance(p, tensor.DTensor) for p in model.parameters())
    )


def _targets(model: torch.nn.Module, options: FSDPOptions) -> list[torch.nn.Module]:
    """The submodules that become their own FSDP unit, children before parents (the root comes last)."""
    chosen: list[torch.nn.Module] = []
    if options.auto_wrap_classes:
        present = {type(m).__name__ for m in model.modules()}
        missing = [name for name in options.auto_wrap_classes if name not in present]
        if missing:
            raise ValueError(
                f"auto_wrap_classes: {missing[0]!r} is not a class in this {type(model).__name__}; its module "
                f"classes are {', '.join(sorted(present))}"
            )
        wanted = set(options.auto_wrap_classes)
        chosen = [m for m in model.modules() if type(m).__name__ in wanted and m is not model]
    if options.min_num_params:
        chosen_ids = {id(m) for m in chosen}

        def own_count(module: torch.nn.Module) -> int:
            """Parameters of ``module`` not already inside a chosen descendant (post-order)."""
            total = sum(p.numel() for p in module.parameters(recurse=False))
            for child in module.children():
                inner = own_count(child)
                if id(child) not in chosen_ids:
                    total += inner
            if module is not model and id(module) not in chosen_ids and total >= options.min_num_params:
                chosen.append(module)
                chosen_ids.add(id(module))
            return total

        own_count(model)
    order = {id(m): i for i, m in enumerate(model.modules())}
    return sorted(chosen, key=lambda m: -order[id(m)])  # deepest (latest in pre-order) first


def _mesh(options: FSDPOptions, device: torch.device, num_processes: int, local_processes: int) -> Any:
    from torch.distributed.device_mesh import init_device_mesh

    if options.sharding_strategy == "hybrid":
        shard = max(local_processes, 1)
        if num_processes % shard:
            raise ValueError(
                f"sharding_strategy='hybrid' shards within a machine ({shard} processes) but {num_processes} "
                "processes do not divide evenly into machines"
            )
        return init_device_mesh(
            device.type, (num_processes // shard, shard), mesh_dim_names=("replicate", "shard")
        )
    if options.sharding_strategy == "no_shard":
        return init_device_mesh(device.type, (num_processes, 1), mesh_dim_names=("replicate", "shard"))
    return init_device_mesh(device.type, (num_processes,))


def _policies(options: FSDPOptions, mixed_precision: str, device: torch.device) -> dict[str, Any]:
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy

    kwargs: dict[str, Any] = {"reshard_after_forward": options.reshards_after_forward}
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(mixed_precision)
    if dtype is not None:
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
    elif mixed_precision not in ("no", None, "fp8"):  # fp8: fp32 parameters, float8 layers, bf16 autocast
        raise ValueError(
            f"FSDP with mixed_precision={mixed_precision!r} is not supported; use 'no', 'bf16', 'fp16' or 'fp8'"
        )
    if options.cpu_offload:
        if device.type == "cpu":
            raise ValueError(
                "FSDPOptions(cpu_offload=True) needs a GPU run: on the CPU the parameters already live in host "
                "memory (torch's CPUOffloadPolicy refuses to run without an accelerator); set cpu_offload=False"
            )
        kwargs["offload_policy"] = CPUOffloadPolicy()
    return kwargs


def shard_model(
    model: torch.nn.Module,
    options: FSDPOptions,
    mixed_precision: str,
    device: torch.device,
    num_processes: int = 1,
    local_processes: int = 1,
    mesh: Any = None,
) -> ParamSwap:
    """Apply activation checkpointing, then ``fully_shard`` to the chosen blocks and the root, in place.

    ``mesh``: the device mesh to shard over (a ParallelismConfig's ``dp_shard_cp`` dimension); by
    default one the options' strategy builds over all ``num_processes``.
    Returns what each original parameter became, for :func:`repoint_optimizer`.
    """
    from torch.distributed.fsdp import fully_shard

    if is_fsdp_model(model):
        raise ValueError(
            f"this {type(model).__name__} is already sharded with fully_shard; pass it unsharded"
        )
    kwargs = _policies(options, mixed_precision, device)
    targets = _targets(model, options)
    # checks (like the two calls above) come before the first collective
    _checkpoint_activations(model, options)
    kwargs["mesh"] = mesh if mesh is not None else _mesh(options, device, num_processes, local_processes)
    before = [
        (module, name, param)
        for module in model.modules()
        for name, param in module._parameters.items()
        if param is not None
    ]
    for module in targets:
        fully_shard(module, **kwargs)
    fully_shard(model, **kwargs)
    swap: ParamSwap = {}
    for module, name, old in before:
        new = module._parameters.get(name)
        if new is not None and new is not old:
            swap[id(old)] = (weakref.ref(old), weakref.ref(new))
    return swap


def _checkpoint_activations(model: torch.nn.Module, options: FSDPOptions) -> None:
    """Recompute the activations of the chosen classes in backward (torch's composable ``checkpoint``).

    The composable form keeps the module tree and parameter names as they are.
    """
    names = options.checkpointed_classes
    if not names:
        return
    from torch.distributed._composable import checkpoint

    present = {type(m).__name__ for m in model.modules()}
    missing = [name for name in names if name not in present]
    if missing:
        raise ValueError(
            f"activation_checkpointing: {missing[0]!r} is not a class in this {type(model).__name__}; its module "
            f"classes are {', '.join(sorted(present))}"
        )
    for module in [m for m in model.modules() if type(m).__name__ in set(names) and m is not model]:
        checkpoint(module)


def _replacement(param: torch.Tensor, swap: ParamSwap) -> torch.Tensor:
    """What ``param`` became, following replacements of replacements (FP8's new weight, then its shard)."""
    for _ in range(len(swap) + 1):
        entry = swap.get(id(param))
        new = entry[1]() if entry is not None and entry[0]() is param else None
        if new is None or new is param:
            return param
        param = new
    return param


def repoint_optimizer(optimizer: torch.optim.Optimizer, swap: ParamSwap) -> int:
    """Replace, in ``optimizer``'s param groups, each parameter the sharding replaced; returns how many.

    Raises a clear error when the optimizer already has state (it would belong to the unsharded
    parameters).
    """
    hits = 0
    for group in optimizer.param_groups:
        params = list(group["params"])
        for i, p in enumerate(params):
            new = _replacement(p, swap)
            if new is not p:
                params[i] = new
                hits += 1
        group["params"] = params
    if hits and optimizer.state:
        raise ValueError(
            "this optimizer already has state (it stepped, or a state was loaded) for the unsharded parameters; "
            "create it fresh, prepare it together with the model, and restore its state afterwards with "
            "accelerator.load_state()"
        )
    return hits


def check_optimizer_params(optimizer: torch.optim.Optimizer) -> None:
    """A clear error when ``optimizer`` still holds plain parameters of a model FSDP sharded."""
    from torch.distributed.tensor import DTensor

    params = [p for group in optimizer.param_groups for p in group["params"]]
    if any(isinstance(p, DTensor) for p in params) or not params:
        return
    raise ValueError(
        "this optimizer holds no sharded parameter of a model prepared with FSDP (it was created over other "
        "tensors, or over a copy of the model); create it from model.parameters() of the model you prepare, and "
        "pass both to accelerator.prepare(model, optimizer)"
    )


@contextlib.contextmanager
def no_gradient_sync(model: Any) -> Iterator[None]:
    """Accumulate gradients locally: no reduce-scatter, and no resharding after each micro-batch's backward."""
    model.set_requires_gradient_sync(False)
    model.set_reshard_after_backward(False)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)
        model.set_reshard_after_backward(True)


def local_shard_bytes(tensors: Any) -> int:
    """Bytes this rank holds of ``tensors`` (a DTensor counts its local shard only)."""
    from torch.distributed.tensor import DTensor

    total = 0
    for t in tensors:
        local = t.to_local() if isinstance(t, DTensor) else t
        total += local.numel() * local.element_size()
    return total
