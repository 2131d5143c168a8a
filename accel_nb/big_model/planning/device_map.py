"""Decide where every module lives: GPUs in order, then the CPU, then disk.

    device_map = infer_auto_device_map(model, max_memory={0: "10GiB", "cpu": "30GiB"},
                                       no_split_module_classes=["GPT2Block"])
    device_map.plan.explain()      # why each block went where it went

Rules (in this order): modules are taken in definition order; a module that does not fit the
current device is split into its children, unless its class is in ``no_split_module_classes``
or it has no children, in which case the device is closed and the next one is tried. Tied
parameters are planned as one unit with every module that holds them, wherever those sit
(GPT-2's ``lm_head`` with ``wte``; BERT's ``cls.predictions.decoder`` with the word embeddings
and ``cls.predictions.bias``). The map lists its entries in module order; a model that lands
whole on one device gets the one entry ``{"": device}``.

**Headroom.** Nothing is reserved when the whole model fits on the GPUs. Otherwise the GPU that
runs the offloaded blocks (the first GPU of the map) keeps exactly what the offload engine
allocates there: ``num_buffers`` device buffers, each the size of the largest block it streams,
plus the buffers of offloaded modules (they stay on that GPU unless ``offload_buffers=True``).
Those sizes depend on what is offloaded, so the plan is made again with the reservation until
the reservation covers what the map streams (two or three passes; planning is cheap). Budgets
for GPUs need no GPU: plan on a laptop, load on the GPU machine.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ...byte_sizes import human_bytes
from ...counts import is_count
from ..offload import DEFAULT_NUM_BUFFERS
from .greedy_planner import GreedyPlanner, PlanStep, settle_headroom
from .headroom import EngineReservation
from .map_checks import check_device_map, check_devices_exist, device_for, known_entries
from .map_errors import DeviceMapError
from .reference_planning import log_what_did_not_fit, merge_entries
from .sizes import (
    Device,
    as_dtype,
    check_tied_parameters_in_config,
    compute_module_sizes,
    device_name,
    get_balanced_memory,
    get_max_memory,
    normalize_device,
    tensor_bytes,
    tied_parameter_groups,
)

__all__ = [
    "DeviceMap",
    "DeviceMapError",
    "DevicePlan",
    "PlanStep",
    "check_device_map",
    "check_devices_exist",
    "definition_order",
    "device_for",
    "infer_auto_device_map",
    "known_entries",
    "plan_device_map",
    "resolve_device_map",
]

_LOG = logging.getLogger(__name__)


@dataclass
class DevicePlan:
    """A device map with everything needed to explain and draw it."""

    device_map: dict[str, Device]
    sizes: dict[str, int]
    budgets: dict[Device, int]
    headroom: dict[Device, int]
    used: dict[Device, int]
    steps: list[PlanStep] = field(default_factory=list)
    classes: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # the headroom, explained
    kept: dict[Device, int] = field(default_factory=dict)  # room kept free on each device when it was closed

    def explain(self) -> str:
        """Plain-text trace: the headroom, then one line per decision."""
        lines = [f"headroom: {note}" for note in self.notes]
        for s in self.steps:
            lines.append(
                f"{s.action:9s} {s.module or '(model)':40s} -> {device_name(s.device):6s} "
                f"{human_bytes(s.size):>10s}  free {human_bytes(s.free):>10s}  {s.reason}".rstrip()
            )
        return "\n".join(lines)

    def moved_on(self) -> list[PlanStep]:
        """The steps where the planner closed a device and went to the next one."""
        return [s for s in self.steps if s.action == "moved_on"]


class DeviceMap(dict):
    """A plain ``{module: device}`` dict that also carries its :class:`DevicePlan` as ``.plan``."""

    plan: DevicePlan | None = None


def definition_order(model: nn.Module) -> dict[str, int]:
    """Position of every module and tensor path: a module, then its own tensors, then its children."""
    order: dict[str, int] = {}
    for mname, module in model.named_modules(remove_duplicate=False):
        order.setdefault(mname, len(order))
        prefix = f"{mname}." if mname else ""
        for attr, t in list(module._parameters.items()) + list(module._buffers.items()):
            if t is not None:
                order.setdefault(prefix + attr, len(order))
    return order


def plan_device_map(
    model: nn.Module,
    max_memory: Mapping[Any, int | str] | None = None,
    no_split_module_classes: Iterable[str | type] | None = None,
    dtype: torch.dtype | str | None = None,
    special_dtypes: Mapping[str, torch.dtype | str] | None = None,
    *,
    offload_buffers: bool = False,
    num_buffers: int = DEFAULT_NUM_BUFFERS,
    fallback_allocation: bool = False,
) -> DevicePlan:
    """Compute a device map and the trace of how it was found (see the module docstring).

        plan = plan_device_map(model, {0: "6GiB", "cpu": "30GiB"}, ["LlamaDecoderLayer"])
        print(plan.explain())
    ``offload_buffers`` and ``num_buffers`` are the settings ``dispatch_model`` will use; they
    size the GPU headroom for the offload engine. ``fallback_allocation=True``: a device the next
    unit does not fit is not left empty; the first later unit that fits goes there (the reference's mode).
    """
    dtype = as_dtype(dtype)
    if not is_count(num_buffers):
        raise ValueError(
            f"num_buffers must be a positive int (the offload engine's device buffers), got {num_buffers!r}"
        )
    budgets = get_max_memory(max_memory)
    if not budgets:
        raise DeviceMapError("max_memory is empty; give at least one device, e.g. {'cpu': '8GiB'}")
    no_split = list(no_split_module_classes or [])
    sizes = compute_module_sizes(model, dtype, special_dtypes)
    unbudgeted_disk = "disk" not in budgets
    if unbudgeted_disk:  # as the reference: what fits nowhere else goes to disk
        budgets["disk"] = 0
    planner = GreedyPlanner(model, budgets, no_split, sizes, fallback_allocation)
    engine = EngineReservation(model, no_split, dtype, special_dtypes, offload_buffers, num_buffers)
    result, headroom, note = settle_headroom(planner, engine)
    log_what_did_not_fit(planner.left_empty, result.device_map, unbudgeted_disk)
    order = definition_order(model)
    merged = merge_entries(result.device_map)
    ordered = dict(sorted(merged.items(), key=lambda kv: order.get(kv[0], len(order))))
    if len(set(ordered.values())) == 1:  # all on one device: one entry for the whole model
        ordered = {"": next(iter(ordered.values()))}
    classes = {n: type(planner.modules[n]).__name__ if n in planner.modules else "tensor" for n in ordered}
    if unbudgeted_disk:  # the disk the reference adds shows only where something went there
        headroom.pop("disk", None)
        if "disk" not in ordered.values():
            budgets.pop("disk")
            result.used.pop("disk", None)
    plan = DevicePlan(ordered, sizes, budgets, headroom, result.used, result.steps, classes, [note])
    plan.kept = dict(planner.kept)
    return plan


def infer_auto_device_map(
    model: nn.Module,
    max_memory: Mapping[Any, int | str] | None = None,
    no_split_module_classes: Iterable[str | type] | None = None,
    dtype: torch.dtype | str | None = None,
    special_dtypes: Mapping[str, torch.dtype | str] | None = None,
    verbose: bool = False,
    *,
    offload_buffers: bool = False,
    num_buffers: int = DEFAULT_NUM_BUFFERS,
    clean_result: bool = True,
    fallback_allocation: bool = False,
) -> DeviceMap:
    """Place modules on GPUs in order, then on the CPU, then (if budgeted) on disk.

        with init_empty_weights():
            model = GPT2LMHeadModel(config)
        device_map = infer_auto_device_map(model, max_memory={0: "6GiB", "cpu": "30GiB"},
                                           no_split_module_classes=["GPT2Block"])
    Returns a dict {module path: 0 | 1 | ... | "cpu" | "disk"} with ``.plan`` (sizes, budgets,
    headroom and the trace of decisions; ``.plan.explain()``). Raises DeviceMapError, with the
    sizes, when even the last device cannot take the next block. ``offload_buffers`` and
    ``num_buffers`` must match what ``dispatch_model`` will get: they size the GPU headroom.

    ``clean_result=True`` is the reference's default and what this planner does (entries that share a
    device are merged). ``fallback_allocation=True`` is the reference's mode for a device the next
    block does not fit while it is still empty: the first later unit that fits goes there (split in
    module order, no-split classes whole) instead of leaving it empty; later units go on after it.
    """
    if not clean_result:
        raise ValueError(
            "infer_auto_device_map(clean_result=False) is the reference planner's raw output, which accel_nb's "
            "planner does not produce; drop the argument (the map is always merged) or read map.plan.steps for "
            "each decision"
        )
    plan = plan_device_map(
        model,
        max_memory,
        no_split_module_classes,
        dtype,
        special_dtypes,
        offload_buffers=offload_buffers,
        num_buffers=num_buffers,
        fallback_allocation=fallback_allocation,
    )
    _warn_as_the_reference(model, plan, offload_buffers, dtype, special_dtypes)
    if verbose:
        print(plan.explain())
    out = DeviceMap(plan.device_map)
    out.plan = plan
    return out


def _warn_as_the_reference(
    model: nn.Module,
    plan: DevicePlan,
    offload_buffers: bool,
    dtype: torch.dtype | str | None,
    special_dtypes: Mapping[str, torch.dtype | str] | None,
) -> None:
    """The reference planner's two warnings, in the same cases: a transformers model whose config ties
    weights that are not tied (a logged warning), and buffers of offloaded modules that no GPU has room
    for (a UserWarning)."""
    if check_tied_parameters_in_config(model) and not tied_parameter_groups(model):
        _LOG.warning(
            "the model's config ties its weights but the model's weights are not tied: call "
            "model.tie_weights() before infer_auto_device_map, or tied weights may land on different devices"
        )
    gpus = [d for d in plan.budgets if isinstance(d, int)]
    if offload_buffers or not gpus:
        return
    dtype, special = as_dtype(dtype), {k: as_dtype(v) for k, v in (special_dtypes or {}).items()}
    modules = dict(model.named_modules(remove_duplicate=False))
    offloaded = 0
    for name, device in plan.device_map.items():
        if device in ("cpu", "disk") and name in modules:
            prefix = f"{name}." if name else ""
            for bname, b in modules[name].named_buffers():
                offloaded += tensor_bytes(b, dtype, special.get(prefix + bname))
    if offloaded and not any(
        plan.budgets[g] >= offloaded + plan.used.get(g, 0) + plan.kept.get(g, 0) for g in gpus
    ):
        warnings.warn(
            f"the offloaded modules hold {offloaded} bytes of buffers, which go to the GPU that runs them and "
            "seem not to fit next to what the map puts on any GPU; if the GPU runs out of memory, pass "
            "offload_buffers=True (buffers then stream with the weights)",
            UserWarning,
            stacklevel=3,
        )


def resolve_device_map(
    model: nn.Module,
    device_map: str | Mapping[str, Any],
    max_memory: Mapping[Any, int | str] | None = None,
    no_split_module_classes: Iterable[str | type] | None = None,
    dtype: torch.dtype | str | None = None,
    offload_buffers: bool = False,
) -> dict[str, Device]:
    """'auto' | 'balanced' | 'balanced_low_0' | 'sequential' | dict -> a checked device map.

    Without ``no_split_module_classes``, a transformers model's own ``_no_split_modules`` is used.
    """
    if no_split_module_classes is None:
        no_split_module_classes = getattr(model, "_no_split_modules", None)
    if isinstance(device_map, str):
        if device_map not in ("auto", "balanced", "balanced_low_0", "sequential"):
            raise DeviceMapError(
                f"device_map={device_map!r} is not known; use 'auto', 'balanced', "
                "'balanced_low_0', 'sequential' or a dict {module: device}"
            )
        budgets = max_memory
        if device_map != "sequential":
            budgets = get_balanced_memory(
                model, max_memory, no_split_module_classes, dtype, low_zero=device_map == "balanced_low_0"
            )
        return infer_auto_device_map(
            model, budgets, no_split_module_classes, dtype, offload_buffers=offload_buffers
        )
    normalized = {name: normalize_device(dev) for name, dev in device_map.items()}
    check_device_map(model, normalized)
    return known_entries(model, normalized)
