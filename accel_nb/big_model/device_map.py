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
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ..byte_sizes import human_bytes
from ..counts import is_count
from .headroom import EngineReservation
from .map_errors import DeviceMapError
from .offload import DEFAULT_NUM_BUFFERS
from .reference_planning import LayerReserve, log_what_did_not_fit, main_devices, merge_entries
from .sizes import (
    Device,
    as_dtype,
    check_tied_parameters_in_config,
    compute_module_sizes,
    device_order,
    get_balanced_memory,
    get_max_memory,
    is_no_split,
    layer_sizes,
    named_tensors,
    normalize_device,
    tensor_bytes,
    tied_parameter_groups,
)

_LOG = logging.getLogger(__name__)


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
    notes: list[str] = field(default_factory=list)  # the headroom, explained
    kept: dict[Device, int] = field(default_factory=dict)  # room kept free on each device when it was closed

    def explain(self) -> str:
        """Plain-text trace: the headroom, then one line per decision."""
        lines = [f"headroom: {note}" for note in self.notes]
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


def _covers(prefix: str, name: str) -> bool:
    return prefix == "" or name == prefix or name.startswith(prefix + ".")


def _children_units(name: str, module: nn.Module) -> list[tuple[str, Any]]:
    """What a module splits into: its direct tensors (as named entries), then its children."""
    prefix = f"{name}." if name else ""
    units: list[tuple[str, Any]] = [(prefix + n, t) for n, t in named_tensors(module, recurse=False)]
    units += [(prefix + n, m) for n, m in module.named_children()]
    return units


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


@dataclass
class _Pass:
    """The result of one greedy pass: the map, bytes used per device, the trace."""

    device_map: dict[str, Device]
    used: dict[Device, int]
    steps: list[PlanStep]


class _Planner:
    """Greedy placement in module order for fixed budgets and headroom (see the module docstring)."""

    def __init__(
        self,
        model: nn.Module,
        budgets: dict[Device, int],
        no_split: list[str | type],
        sizes: dict[str, int],
        fallback: bool = False,
    ) -> None:
        self.model = model
        self.fallback = fallback
        self.budgets = budgets
        self.devices = sorted(budgets, key=device_order)
        self.no_split = no_split
        self.sizes = sizes
        self.modules = dict(model.named_modules(remove_duplicate=False))
        self.main = main_devices(self.devices)  # where the reference keeps a layer's room
        self.tied: dict[str, list[str]] = {}
        for group in tied_parameter_groups(model):
            for n in group:
                self.tied[n] = [o for o in group if o != n]

    def run(self, headroom: dict[Device, int]) -> _Pass:
        """Place every unit; raise DeviceMapError when even the last device cannot take one."""
        self.headroom = headroom
        self.result = _Pass({}, {d: 0 for d in self.devices}, [])
        self.reserve = LayerReserve(self.model, self.no_split, self.sizes)
        self.left_empty: dict[Device, int] = {}  # device -> what the first unit it could not take needed
        self.kept: dict[Device, int] = {}  # device -> room kept free on it when it was closed
        self.di = 0
        root_units = _children_units("", self.model) if self.model._modules else []
        pending = deque(root_units or [("", self.model)])
        while pending:
            name, obj = pending.popleft()
            if self._placed(name):
                continue  # placed earlier with the tensors it shares
            inside = [p for p in self.result.device_map if _covers(name, p) and p != name]
            if inside and isinstance(obj, nn.Module):
                dev = self.devices[self.di]
                free = self.budgets[dev] - self.headroom.get(dev, 0) - self.result.used[dev]
                why = f"holds {inside[0]!r}, placed earlier (tied weights or fallback_allocation)"
                self._step(name, "split", self.sizes.get(name, 0), free, why)
                pending.extendleft(reversed(_children_units(name, obj)))
                continue
            self._place(name, obj, pending)
        return self.result

    # -- one unit ------------------------------------------------------------------------------------
    def _place(self, name: str, obj: Any, pending: deque) -> None:
        partners = self._tie_partners(name)
        size = self.sizes.get(name, 0)
        need = size + sum(self.sizes.get(p, 0) for p in partners)
        while True:
            dev = self.devices[self.di]
            room = self._room(dev, name)
            free = self.budgets[dev] - room - self.result.used[dev]
            if dev == "disk" or need <= free:
                self._commit(name, partners, dev, size, need, free)
                return
            if isinstance(obj, nn.Module) and obj._modules and not is_no_split(obj, self.no_split):
                why = f"{human_bytes(need)} does not fit in {human_bytes(max(free, 0))}; placing its children"
                self._step(name, "split", size, free, why)
                pending.extendleft(reversed(_children_units(name, obj)))
                return
            if (
                self.fallback
                and dev != "disk"
                and self.result.used[dev] == 0
                # as the reference: the room a later unit may take keeps the larger of the reserve and this unit
                and self._fill(name, pending, self.budgets[dev] - max(room, need))
            ):
                continue  # the device holds the later unit now; this one moves on
            self._move_on(name, obj, partners, need, free, room)

    def _room(self, dev: Device, name: str) -> int:
        """What stays free on ``dev`` while placing ``name``: the offload engine's headroom, and on the
        reference's main devices (first GPU, CPU) at least the largest layer still to place."""
        room = self.headroom.get(dev, 0)
        if dev in self.main:
            room = max(room, self.reserve.room(name, self._placed))
        return room

    def _fill(self, blocked: str, pending: deque, free: int) -> bool:
        """``fallback_allocation``: put on the empty current device the first later unit that fits it
        (splitting too-big units in module order, no-split classes whole); False when none fits."""
        search = list(pending)
        while search:
            name, obj = search.pop(0)
            if self._placed(name):
                continue
            partners = self._tie_partners(name)
            need = self.sizes.get(name, 0) + sum(self.sizes.get(p, 0) for p in partners)
            if need <= free:
                dev = self.devices[self.di]
                why = f"fallback_allocation: {blocked!r} does not fit {_dev_name(dev)}, this later unit does"
                self._commit(name, partners, dev, self.sizes.get(name, 0), need, free, why)
                return True
            if isinstance(obj, nn.Module) and obj._modules and not is_no_split(obj, self.no_split):
                search[:0] = _children_units(name, obj)
        return False

    def _commit(
        self, name: str, partners: list[str], dev: Device, size: int, need: int, free: int, why: str = ""
    ) -> None:
        self.result.device_map[name] = dev
        self.result.used[dev] += need
        self._step(name, "placed", size, free - need, why, dev=dev)
        for p in partners:
            self.result.device_map[p] = dev
            self._step(p, "tied", self.sizes.get(p, 0), free - need, f"shares weights with {name!r}", dev)

    def _move_on(self, name: str, obj: Any, partners: list[str], need: int, free: int, room: int) -> None:
        dev = self.devices[self.di]
        engine = self.headroom.get(dev, 0)
        if self.result.used[dev] == 0:
            self.left_empty[dev] = need + room
        self.kept[dev] = room  # the reference counts it as used when it warns about buffers
        kind = type(obj).__name__ if isinstance(obj, nn.Module) else "tensor"
        why = (
            f"{kind} {name!r} needs {human_bytes(need)}"
            + (f" (with tied {', '.join(partners)})" if partners else "")
            + f", {_dev_name(dev)} has {human_bytes(max(free, 0))} left"
            + (
                f" (after {human_bytes(room)} headroom for the offload engine)"
                if room and room == engine
                else ""
            )
            + (f" (after a {human_bytes(room)} reserve)" if room and room != engine else "")
        )
        self._step(name, "moved_on", need, free, why)
        self.di += 1
        if self.di == len(self.devices):
            raise DeviceMapError(self._too_small(why))

    def _too_small(self, why: str) -> str:
        budget_text = ", ".join(
            f"{_dev_name(d)}: {human_bytes(self.budgets[d])}"
            + (f" (headroom {human_bytes(self.headroom[d])})" if self.headroom.get(d) else "")
            for d in self.devices
        )
        layers = layer_sizes(self.model, self.no_split, sizes=self.sizes)
        largest_name, largest = max(layers.items(), key=lambda kv: kv[1], default=("", 0))
        return (
            f"the memory budget is too small: {why}. Budgets: {budget_text}; the model needs "
            f"{human_bytes(self.sizes.get('', 0))} in all and its largest layer {largest_name!r} "
            f"{human_bytes(largest)}. Raise max_memory, or allow disk offload with max_memory['disk'] "
            "(load_checkpoint_and_dispatch does this when you pass offload_folder=...)."
        )

    def _step(
        self, name: str, action: str, size: int, free: int, reason: str = "", dev: Device = None
    ) -> None:
        device = self.devices[self.di] if dev is None else dev
        self.result.steps.append(PlanStep(name, device, action, size, free, reason))

    # -- ties ----------------------------------------------------------------------------------------
    def _placed(self, name: str) -> bool:
        return any(_covers(p, name) for p in self.result.device_map)

    def _param_names(self, unit: str) -> list[str]:
        module = self.modules.get(unit)
        if module is None:
            return [unit]  # a tensor entry
        prefix = f"{unit}." if unit else ""
        return [prefix + n for n, _ in module.named_parameters(remove_duplicate=False)]

    def _partner_unit(self, tensor_name: str) -> str:
        """What must move with a tied tensor: its outermost no-split ancestor, its leaf owner, or itself."""
        parts = tensor_name.split(".")[:-1]
        for i in range(1, len(parts) + 1):
            ancestor = ".".join(parts[:i])
            if is_no_split(self.modules[ancestor], self.no_split):
                return ancestor
        owner = ".".join(parts)
        return owner if not self.modules[owner]._modules else tensor_name

    def _tie_partners(self, name: str) -> list[str]:
        """Units outside ``name`` that share a tensor with it, directly or through each other."""
        units = [name]
        queue = [name]
        while queue:
            for tensor_name in self._param_names(queue.pop()):
                for other in self.tied.get(tensor_name, ()):
                    if any(_covers(u, other) for u in units) or self._placed(other):
                        continue
                    partner = self._partner_unit(other)
                    if _covers(partner, name):
                        continue  # cannot happen for a unit the planner reached; be safe
                    units = [u for u in units if u == name or not _covers(partner, u)] + [partner]
                    queue.append(partner)
        return units[1:]


def _settle_headroom(planner: _Planner, engine: EngineReservation) -> tuple[_Pass, dict[Device, int], str]:
    """Plan, then plan again with the engine's reservation until it covers what the map streams."""
    headroom: dict[Device, int] = {d: 0 for d in planner.devices}
    result = planner.run(headroom)
    for _ in range(8):  # the reservation only grows, so this settles in a few passes
        gpu, need, note = engine.measure(result.device_map)
        if gpu is None or need <= headroom[gpu]:
            break
        headroom[gpu] = need
        result = planner.run(headroom)
    reserved = sum(headroom.values())
    if reserved and gpu is None:
        where = ", ".join(f"{_dev_name(d)} {human_bytes(r)}" for d, r in headroom.items() if r)
        note = (
            f"reserving the offload engine's device buffers ({where}) leaves no room for the first block "
            "on a GPU, so nothing runs there; raise the GPU budget or plan without the GPU"
        )
    elif reserved > need:
        note += f" (reserved {human_bytes(reserved)}: an earlier pass streamed larger blocks)"
    return result, headroom, note


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
    planner = _Planner(model, budgets, no_split, sizes, fallback_allocation)
    engine = EngineReservation(model, no_split, dtype, special_dtypes, offload_buffers, num_buffers)
    result, headroom, note = _settle_headroom(planner, engine)
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


def device_for(device_map: Mapping[str, Device], name: str) -> Device | None:
    """The device of a tensor or module path: the entry with the longest matching prefix."""
    parts = name.split(".")
    for i in range(len(parts), -1, -1):
        key = ".".join(parts[:i])
        if key in device_map:
            return device_map[key]
    return None


def _tensor_and_module_names(model: nn.Module) -> set[str]:
    return (
        set(dict(model.named_modules()))
        | {n for n, _ in model.named_parameters()}
        | {n for n, _ in model.named_buffers()}
    )


def known_entries(model: nn.Module, device_map: Mapping[str, Device]) -> dict[str, Device]:
    """``device_map`` without the entries that name nothing in ``model`` (check_device_map warned about them).

    known_entries(model, {"": 0, "lm_haed": "cpu"})   # {"": 0}
    """
    names = _tensor_and_module_names(model)
    return {k: v for k, v in device_map.items() if k in names}


def check_device_map(model: nn.Module, device_map: Mapping[str, Any]) -> None:
    """Raise DeviceMapError naming the modules no entry covers; warn (as the reference) about entries
    naming nothing: a misspelt key leaves its module where another entry puts it."""
    names = _tensor_and_module_names(model)
    unknown = [k for k in device_map if k not in names]
    if unknown:
        warnings.warn(  # the reference's words first: code and tests match on them
            f"The following device_map keys do not match any submodules in the model: {unknown}; they are not "
            f"modules or tensors of {type(model).__name__} and are ignored, so a misspelt key leaves its module "
            "where another entry puts it (module paths look like 'transformer.h.0')",
            UserWarning,
            stacklevel=2,
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


def check_devices_exist(devices: Iterable[Any], source: str) -> None:
    """Raise DeviceMapError naming any GPU in ``source`` (e.g. "max_memory") this machine lacks.

        check_devices_exist(device_map.values(), "device_map")
    Called before anything is loaded or moved. Planning alone never calls it: maps for a GPU
    machine can be made on a laptop.
    """
    wanted = {normalize_device(d) for d in devices}
    gpus = sorted(d for d in wanted if isinstance(d, int))
    have = torch.cuda.device_count() if gpus and torch.cuda.is_available() else 0
    missing = [g for g in gpus if g >= have]
    if missing:
        names = ", ".join(_dev_name(g) for g in missing)
        machine = f"{have} CUDA GPU(s)" if have else "no CUDA GPU"
        raise DeviceMapError(
            f"{source} names {names} but this machine has {machine}; nothing was loaded. Remove the GPU "
            f"entries from {source} (e.g. {{'cpu': '30GiB', 'disk': '1TB'}}), or run on a machine with "
            "that GPU. Planning alone (infer_auto_device_map, show_device_map) works without it."
        )
    if "mps" in wanted and not torch.backends.mps.is_available():
        raise DeviceMapError(f"{source} names 'mps' but MPS is not available here; nothing was loaded")
