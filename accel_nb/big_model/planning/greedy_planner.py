"""The greedy placement behind ``plan_device_map``: modules in definition order, GPUs in order, then the
CPU, then disk.

    planner = GreedyPlanner(model, budgets, ["GPT2Block"], compute_module_sizes(model))
    result, headroom, note = settle_headroom(planner, EngineReservation(model, ["GPT2Block"], ...))
    result.device_map, result.used, result.steps   # the map, bytes per device, one PlanStep per decision

A unit that does not fit the current device is split into its children unless it is of a no-split
class or has none; then the device is closed and the next one tried. Tied parameters travel with
every unit that holds them. ``settle_headroom`` plans again with the offload engine's reservation
until it covers what the map streams (the rules: ``device_map``'s module docstring).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

from torch import nn

from ...byte_sizes import human_bytes
from .headroom import EngineReservation
from .map_errors import DeviceMapError
from .reference_planning import LayerReserve, main_devices
from .sizes import (
    Device,
    device_name,
    device_order,
    is_no_split,
    layer_sizes,
    named_tensors,
    tied_parameter_groups,
)

__all__ = ["GreedyPlanner", "PlanPass", "PlanStep", "children_units", "covers", "settle_headroom"]


@dataclass
class PlanStep:
    """One decision of the planner, for explanations and the device-map view."""

    module: str
    device: Device
    action: str  # "placed" | "split" | "moved_on" | "tied"
    size: int
    free: int
    reason: str = ""


def covers(prefix: str, name: str) -> bool:
    return prefix == "" or name == prefix or name.startswith(prefix + ".")


def children_units(name: str, module: nn.Module) -> list[tuple[str, Any]]:
    """What a module splits into: its direct tensors (as named entries), then its children."""
    prefix = f"{name}." if name else ""
    units: list[tuple[str, Any]] = [(prefix + n, t) for n, t in named_tensors(module, recurse=False)]
    units += [(prefix + n, m) for n, m in module.named_children()]
    return units


@dataclass
class PlanPass:
    """The result of one greedy pass: the map, bytes used per device, the trace."""

    device_map: dict[str, Device]
    used: dict[Device, int]
    steps: list[PlanStep]


class GreedyPlanner:
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

    def run(self, headroom: dict[Device, int]) -> PlanPass:
        """Place every unit; raise DeviceMapError when even the last device cannot take one."""
        self.headroom = headroom
        self.result = PlanPass({}, {d: 0 for d in self.devices}, [])
        self.reserve = LayerReserve(self.model, self.no_split, self.sizes)
        self.left_empty: dict[Device, int] = {}  # device -> what the first unit it could not take needed
        self.kept: dict[Device, int] = {}  # device -> room kept free on it when it was closed
        self.di = 0
        root_units = children_units("", self.model) if self.model._modules else []
        pending = deque(root_units or [("", self.model)])
        while pending:
            name, obj = pending.popleft()
            if self._placed(name):
                continue  # placed earlier with the tensors it shares
            inside = [p for p in self.result.device_map if covers(name, p) and p != name]
            if inside and isinstance(obj, nn.Module):
                dev = self.devices[self.di]
                free = self.budgets[dev] - self.headroom.get(dev, 0) - self.result.used[dev]
                why = f"holds {inside[0]!r}, placed earlier (tied weights or fallback_allocation)"
                self._step(name, "split", self.sizes.get(name, 0), free, why)
                pending.extendleft(reversed(children_units(name, obj)))
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
                pending.extendleft(reversed(children_units(name, obj)))
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
                why = (
                    f"fallback_allocation: {blocked!r} does not fit {device_name(dev)}, this later unit does"
                )
                self._commit(name, partners, dev, self.sizes.get(name, 0), need, free, why)
                return True
            if isinstance(obj, nn.Module) and obj._modules and not is_no_split(obj, self.no_split):
                search[:0] = children_units(name, obj)
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
            + f", {device_name(dev)} has {human_bytes(max(free, 0))} left"
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
            f"{device_name(d)}: {human_bytes(self.budgets[d])}"
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
        return any(covers(p, name) for p in self.result.device_map)

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
                    if any(covers(u, other) for u in units) or self._placed(other):
                        continue
                    partner = self._partner_unit(other)
                    if covers(partner, name):
                        continue  # cannot happen for a unit the planner reached; be safe
                    units = [u for u in units if u == name or not covers(partner, u)] + [partner]
                    queue.append(partner)
        return units[1:]


def settle_headroom(
    planner: GreedyPlanner, engine: EngineReservation
) -> tuple[PlanPass, dict[Device, int], str]:
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
        where = ", ".join(f"{device_name(d)} {human_bytes(r)}" for d, r in headroom.items() if r)
        note = (
            f"reserving the offload engine's device buffers ({where}) leaves no room for the first block "
            "on a GPU, so nothing runs there; raise the GPU budget or plan without the GPU"
        )
    elif reserved > need:
        note += f" (reserved {human_bytes(reserved)}: an earlier pass streamed larger blocks)"
    return result, headroom, note
