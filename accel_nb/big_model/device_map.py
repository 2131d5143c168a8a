"""Decide where every module lives: GPUs in order, then the CPU, then disk.

    device_map = infer_auto_device_map(model, max_memory={0: "10GiB", "cpu": "30GiB"},
                                       no_split_module_classes=["GPT2Block"])
    device_map.plan.explain()      # why each block went where it went

Rules (in this order): modules are taken in definition order; a module that does not fit the
current device is split into its children, unless its class is in ``no_split_module_classes``
or it has no children, in which case the device is closed and the next one is tried. Tied
parameters are placed together with the module that first holds them. When anything has to go
to the CPU or disk, every GPU keeps **headroom** free for its largest layer (activations and
workspace), and the first GPU (the execution device for offloaded layers) keeps a second
layer's worth for the offload engine's prefetch buffer.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ..utils import human_bytes
from .sizes import (
    Device,
    as_dtype,
    compute_module_sizes,
    device_order,
    get_balanced_memory,
    get_max_memory,
    is_no_split,
    layer_sizes,
    named_tensors,
    normalize_device,
    tied_parameter_groups,
)


class DeviceMapError(ValueError):
    """A device map cannot be made or does not fit the model."""


@dataclass
class PlanStep:
    """One decision of the planner, for explanations and the device-map view."""

    module: str
    device: Device
    action: str  # "placed" | "split" | "moved_on" | "tied"
    size: int
    free: int
    reason: str = ""


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

    def explain(self) -> str:
        """Plain-text trace: one line per decision."""
        lines = []
        for s in self.steps:
            lines.append(
                f"{s.action:9s} {s.module or '(model)':40s} -> {_dev_name(s.device):6s} "
                f"{human_bytes(s.size):>10s}  free {human_bytes(s.free):>10s}  {s.reason}".rstrip()
            )
        return "\n".join(lines)

    def moved_on(self) -> list[PlanStep]:
        """The steps where the planner closed a device and went to the next one."""
        return [s for s in self.steps if s.action == "moved_on"]


class DeviceMap(dict):
    """A plain ``{module: device}`` dict that also carries its :class:`DevicePlan` as ``.plan``."""

    plan: DevicePlan | None = None


def _dev_name(device: Device) -> str:
    return f"GPU {device}" if isinstance(device, int) else str(device)


def _children_units(name: str, module: nn.Module) -> list[tuple[str, Any]]:
    """What a module splits into: its direct tensors (as named entries), then its children."""
    prefix = f"{name}." if name else ""
    units: list[tuple[str, Any]] = [(prefix + n, t) for n, t in named_tensors(module, recurse=False)]
    units += [(prefix + n, m) for n, m in module.named_children()]
    return units


def plan_device_map(
    model: nn.Module,
    max_memory: Mapping[Any, int | str] | None = None,
    no_split_module_classes: Iterable[str | type] | None = None,
    dtype: torch.dtype | str | None = None,
    special_dtypes: Mapping[str, torch.dtype | str] | None = None,
) -> DevicePlan:
    """Compute a device map and the trace of how it was found (see the module docstring)."""
    dtype = as_dtype(dtype)
    no_split = list(no_split_module_classes or [])
    budgets = get_max_memory(max_memory)
    devices = sorted(budgets, key=device_order)
    if not devices:
        raise DeviceMapError("max_memory is empty; give at least one device, e.g. {'cpu': '8GiB'}")
    sizes = compute_module_sizes(model, dtype, special_dtypes)
    # tensor sizes too, so that direct parameters can be planned like modules
    layers = layer_sizes(model, no_split, dtype, special_dtypes)
    largest_name, largest = max(layers.items(), key=lambda kv: kv[1], default=("", 0))
    gpus = [d for d in devices if isinstance(d, int)]
    total = sizes[""]
    gpu_room = sum(budgets[g] for g in gpus)
    headroom: dict[Device, int] = {d: 0 for d in devices}
    if gpus and total > gpu_room - largest * len(gpus):
        for g in gpus:
            headroom[g] = largest
        headroom[gpus[0]] += largest  # prefetch buffer of the offload engine on the execution GPU

    modules = dict(model.named_modules(remove_duplicate=False))
    tensor_owner: dict[int, str] = {}
    for pname, p in model.named_parameters(remove_duplicate=False):
        tensor_owner.setdefault(id(p), pname)
    tied_groups = tied_parameter_groups(model)
    tied_partner: dict[str, list[str]] = {}
    for group in tied_groups:
        for n in group:
            tied_partner[n] = [o for o in group if o != n]

    def unit_size(name: str, obj: Any) -> int:
        return sizes.get(name, 0)  # module and tensor paths alike (a tied tensor's second name: 0)

    def owning_unit(param_name: str) -> str:
        """The module that must move with a tied parameter: its owner, or the outermost no-split ancestor."""
        parts = param_name.split(".")[:-1]
        owner = ".".join(parts)
        for i in range(1, len(parts) + 1):
            anc = ".".join(parts[:i])
            if is_no_split(modules[anc], no_split):
                return anc
        return owner

    device_map: dict[str, Device] = {}
    steps: list[PlanStep] = []
    used: dict[Device, int] = {d: 0 for d in devices}
    preplaced: dict[str, Device] = {}
    pending = (
        deque(_children_units("", model)) if model._modules or not sizes.get("") else deque([("", model)])
    )
    if not pending:
        pending = deque([("", model)])
    di = 0

    def covers(prefix: str, name: str) -> bool:
        return prefix == "" or name == prefix or name.startswith(prefix + ".")

    while pending:
        name, obj = pending.popleft()
        if name in preplaced:
            continue
        inside = [p for p in preplaced if covers(name, p) and p != name]
        if inside and isinstance(obj, nn.Module):
            steps.append(
                PlanStep(
                    name,
                    devices[di],
                    "split",
                    sizes.get(name, 0),
                    0,
                    f"holds {inside[0]!r}, already placed with its tied weights",
                )
            )
            pending.extendleft(reversed(_children_units(name, obj)))
            continue
        size = unit_size(name, obj)
        # sizes of preplaced submodules are not part of this unit's cost
        # tied partners that have not been placed yet move with this unit
        partners: list[str] = []
        if isinstance(obj, nn.Module):
            for pname, _ in obj.named_parameters(prefix=name, remove_duplicate=False):
                for other in tied_partner.get(pname, []):
                    if (
                        covers(name, other)
                        or any(covers(p, other) for p in device_map)
                        or any(covers(p, other) for p in preplaced)
                    ):
                        continue
                    unit = owning_unit(other)
                    if unit not in partners and not covers(name, unit):
                        partners.append(unit)
        elif isinstance(obj, torch.Tensor):
            for other in tied_partner.get(name, []):
                if not any(covers(p, other) for p in list(device_map) + list(preplaced)):
                    unit = owning_unit(other)
                    if unit not in partners:
                        partners.append(unit)
        extra = sum(sizes.get(p, 0) for p in partners)
        while True:
            dev = devices[di]
            free = budgets[dev] - headroom[dev] - used[dev]
            if dev == "disk" or size + extra <= free:
                device_map[name] = dev
                used[dev] += size + extra
                steps.append(PlanStep(name, dev, "placed", size, free - size - extra))
                for p in partners:
                    preplaced[p] = dev
                    device_map[p] = dev
                    steps.append(
                        PlanStep(
                            p,
                            dev,
                            "tied",
                            sizes.get(p, 0),
                            free - size - extra,
                            f"shares weights with {name!r}",
                        )
                    )
                break
            splittable = isinstance(obj, nn.Module) and bool(obj._modules) and not is_no_split(obj, no_split)
            if splittable:
                steps.append(
                    PlanStep(
                        name,
                        dev,
                        "split",
                        size,
                        free,
                        f"{human_bytes(size)} does not fit in {human_bytes(max(free, 0))}; placing its children",
                    )
                )
                pending.extendleft(reversed(_children_units(name, obj)))
                break
            why = (
                f"{type(obj).__name__ if isinstance(obj, nn.Module) else 'tensor'} {name!r} needs "
                f"{human_bytes(size + extra)}{' (with tied ' + ', '.join(partners) + ')' if partners else ''}"
                f", {_dev_name(dev)} has {human_bytes(max(free, 0))} left"
                + (f" (after {human_bytes(headroom[dev])} headroom)" if headroom[dev] else "")
            )
            steps.append(PlanStep(name, dev, "moved_on", size + extra, free, why))
            di += 1
            if di == len(devices):
                budget_text = ", ".join(
                    f"{_dev_name(d)}: {human_bytes(budgets[d])}"
                    + (f" (headroom {human_bytes(headroom[d])})" if headroom[d] else "")
                    for d in devices
                )
                raise DeviceMapError(
                    f"the memory budget is too small: {why}. Budgets: {budget_text}; the model needs "
                    f"{human_bytes(total)} in all and its largest layer {largest_name!r} {human_bytes(largest)}. "
                    "Raise max_memory, or allow disk offload with max_memory['disk'] (load_checkpoint_and_dispatch "
                    "does this when you pass offload_folder=...)."
                )
    order = {n: i for i, n in enumerate(dict(model.named_modules(remove_duplicate=False)))}
    order.update(
        {
            n: i
            for i, (n, _) in enumerate(
                list(model.named_parameters(remove_duplicate=False)) + list(model.named_buffers())
            )
        }
    )

    def position(name: str) -> float:
        if name in order:
            return order[name]
        return min((i for n, i in order.items() if covers(name, n)), default=len(order))

    ordered = dict(sorted(device_map.items(), key=lambda kv: position(kv[0])))
    classes = {n: type(modules[n]).__name__ if n in modules else "tensor" for n in ordered}
    return DevicePlan(ordered, sizes, budgets, headroom, used, steps, classes)


def infer_auto_device_map(
    model: nn.Module,
    max_memory: Mapping[Any, int | str] | None = None,
    no_split_module_classes: Iterable[str | type] | None = None,
    dtype: torch.dtype | str | None = None,
    special_dtypes: Mapping[str, torch.dtype | str] | None = None,
    verbose: bool = False,
) -> DeviceMap:
    """Place modules on GPUs in order, then on the CPU, then (if budgeted) on disk.

        with init_empty_weights():
            model = GPT2LMHeadModel(config)
        device_map = infer_auto_device_map(model, max_memory={0: "6GiB", "cpu": "30GiB"},
                                           no_split_module_classes=["GPT2Block"])
    Returns a dict {module path: 0 | 1 | ... | "cpu" | "disk"} with ``.plan`` (sizes, budgets,
    headroom and the trace of decisions; ``.plan.explain()``). Raises DeviceMapError, with the
    sizes, when even the last device cannot take the next block.
    """
    plan = plan_device_map(model, max_memory, no_split_module_classes, dtype, special_dtypes)
    if verbose:
        print(plan.explain())
    out = DeviceMap(plan.device_map)
    out.plan = plan
    return out


def resolve_device_map(
    model: nn.Module,
    device_map: str | Mapping[str, Any],
    max_memory: Mapping[Any, int | str] | None = None,
    no_split_module_classes: Iterable[str | type] | None = None,
    dtype: torch.dtype | str | None = None,
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
        return infer_auto_device_map(model, budgets, no_split_module_classes, dtype)
    normalized = {name: normalize_device(dev) for name, dev in device_map.items()}
    check_device_map(model, normalized)
    return normalized


def device_for(device_map: Mapping[str, Device], name: str) -> Device | None:
    """The device of a tensor or module path: the entry with the longest matching prefix."""
    parts = name.split(".")
    for i in range(len(parts), -1, -1):
        key = ".".join(parts[:i])
        if key in device_map:
            return device_map[key]
    return None


def check_device_map(model: nn.Module, device_map: Mapping[str, Any]) -> None:
    """Raise DeviceMapError naming the modules no entry covers, or entries naming nothing."""
    names = (
        set(dict(model.named_modules()))
        | {n for n, _ in model.named_parameters()}
        | {n for n, _ in model.named_buffers()}
    )
    unknown = [k for k in device_map if k not in names]
    if unknown:
        raise DeviceMapError(
            f"device_map names {unknown[:8]} which are not modules or tensors of "
            f"{type(model).__name__}; check the spelling (module paths look like 'transformer.h.0')"
        )
    uncovered = [n for n, _ in named_tensors(model) if device_for(device_map, n) is None]
    if uncovered:
        # report the outermost modules whose tensors are all unassigned (else the tensors themselves)
        missing = set(uncovered)
        all_names = [n for n, _ in named_tensors(model)]
        top: list[str] = []
        for mname, _ in model.named_modules():
            inside = [n for n in all_names if mname == "" or n.startswith(mname + ".")]
            if not inside or not all(n in missing for n in inside):
                continue
            if any(mname == t or mname.startswith(t + ".") for t in top):
                continue
            top.append(mname)
        covered_by_top = {n for n in missing if any(n.startswith(t + ".") for t in top)}
        top += [n for n in uncovered if n not in covered_by_top]
        raise DeviceMapError(
            f"the device map leaves {len(uncovered)} tensor(s) unassigned, in: {', '.join(top[:12])}"
            f"{' ...' if len(top) > 12 else ''}. Add these modules to the map (e.g. {top[0]!r}: 'cpu') "
            "or use device_map='auto'."
        )
