"""The reference planner's rules that accel_nb's planner follows (greedy_planner.py): the room kept on the main
devices, one entry per module whose entries share a device, and the notes on what did not fit.

    reserve = LayerReserve(model, ["GPT2Block"], sizes)
    reserve.room("transformer.h.3", is_placed)   # bytes to keep free while placing that unit

The reference keeps free on its main devices (the first GPU and the CPU) the size of the largest layer
still to place, so that an offloaded layer can be brought there to run. A layer is a module without
children or of a no-split class (the root's own tensors are not one). The largest layer that is
neither placed yet nor inside the unit being placed counts, as in the reference (which drops the unit
it is placing from its candidates before it measures).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from torch import nn

from .sizes import Device, is_no_split

__all__ = ["LayerReserve", "log_what_did_not_fit", "main_devices", "merge_entries"]

_LOG = logging.getLogger(
    "accel_nb.big_model.planning.device_map"
)  # the planner's logger: its notes are its own


def main_devices(devices: Iterable[object]) -> list[object]:
    """The devices the reference keeps a layer's room on: the first GPU (if any) and the CPU."""
    devices = list(devices)
    gpus = [d for d in devices if isinstance(d, int)]
    return gpus[:1] + (["cpu"] if "cpu" in devices else [])


def _within(prefix: str, name: str) -> bool:
    return prefix == "" or name == prefix or name.startswith(prefix + ".")


class LayerReserve:
    """The reference's reservation: the largest layer not yet placed and not inside the current unit."""

    def __init__(self, model: nn.Module, no_split: list[str | type], sizes: dict[str, int]) -> None:
        layers: list[tuple[int, str]] = []
        stack = list(model.named_children()) if model._modules else [("", model)]
        while stack:
            name, module = stack.pop()
            if not module._modules or is_no_split(module, no_split):
                layers.append((sizes.get(name, 0), name))
            else:
                stack.extend((f"{name}.{c}", m) for c, m in module.named_children())
        self.layers = sorted(layers, key=lambda sl: -sl[0])  # largest first

    def room(self, unit: str, is_placed: Callable[[str], bool]) -> int:
        """Bytes to keep free on a main device while placing ``unit``."""
        while self.layers and is_placed(self.layers[0][1]):
            self.layers.pop(0)  # placed for good: never a candidate again
        for size, name in self.layers:
            if not _within(unit, name) and not is_placed(name):
                return size
        return 0


def merge_entries(device_map: dict[str, object]) -> dict[str, object]:
    """One entry for a module whose entries all name one device, outermost first (the reference's
    ``clean_device_map``): ``{"a.x": 0, "a.y": 0, "b": 1}`` -> ``{"a": 0, "b": 1}``."""
    out = dict(device_map)

    def visit(name: str) -> None:
        prefix = f"{name}." if name else ""
        inside = [k for k in out if k.startswith(prefix)]
        devices = {out[k] for k in inside}
        if len(inside) > 1 and len(devices) == 1:
            for k in inside:
                del out[k]
            out[name] = devices.pop()
            return
        depth = name.count(".") + 1 if name else 0
        for child in sorted({".".join(k.split(".")[: depth + 1]) for k in inside}):
            if child != name:
                visit(child)

    visit("")
    return out


def log_what_did_not_fit(
    left_empty: dict[Device, int], device_map: dict[str, Device], unbudgeted: bool
) -> None:
    """The reference's note on devices left empty (logged, level INFO), and a warning when modules went
    to a disk that max_memory gave no budget (dispatching them needs an offload folder)."""
    if left_empty:
        lines = "\n".join(
            f"  - {(f'GPU {d}' if isinstance(d, int) else str(d))}: {need} bytes required"
            for d, need in left_empty.items()
        )
        _LOG.info(
            "Based on the current allocation process, no modules could be assigned to the following devices "
            f"due to insufficient memory:\n{lines}\nThese minimums hold for this allocation only; raise these "
            "devices' budgets to at least that much, or change the model (map.plan.explain() says why)"
        )
    on_disk = [name for name, dev in device_map.items() if dev == "disk"]
    if unbudgeted and on_disk:
        _LOG.warning(
            f"{len(on_disk)} module(s) did not fit the max_memory budgets and are mapped to 'disk' "
            f"({', '.join(on_disk[:4])}{' ...' if len(on_disk) > 4 else ''}), as the reference does; "
            "dispatching them needs offload_folder=... (load_checkpoint_and_dispatch) or offload_dir=... "
            "(dispatch_model). Raise the budgets to keep them in memory"
        )
