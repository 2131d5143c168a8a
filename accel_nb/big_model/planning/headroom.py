"""The GPU headroom a device map needs: what the offload engine will allocate on the execution GPU.

    need = EngineReservation(model, ["GPT2Block"], None, None, offload_buffers=False, num_buffers=2)
    gpu, nbytes, why = need.measure(device_map)   # (0, 6291456, "GPU 0 runs the offloaded blocks ...")

The engine streams offloaded entries in block-sized units (see ``units.offload_targets``) through
``num_buffers`` device buffers, each as large as the largest unit; buffers (non-parameter
tensors) of offloaded modules are moved to the execution GPU for good unless ``offload_buffers``.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from ...byte_sizes import human_bytes
from ..offload import aligned_bytes
from ..units import offload_targets, tensor_slots
from .sizes import Device, as_dtype, device_name, tensor_bytes


class EngineReservation:
    """What the offload engine will allocate on the execution GPU for a given map."""

    def __init__(
        self, model, no_split, dtype, special_dtypes, offload_buffers: bool, num_buffers: int
    ) -> None:
        self.model = model
        self.modules = dict(model.named_modules(remove_duplicate=False))
        self.no_split = no_split
        self.dtype = dtype
        self.special = {k: as_dtype(v) for k, v in (special_dtypes or {}).items()}
        self.offload_buffers = offload_buffers
        self.num_buffers = num_buffers

    def _bytes(self, name: str, t: torch.Tensor) -> int:
        return tensor_bytes(t, self.dtype, self.special.get(name))

    def measure(self, device_map: Mapping[str, Device]) -> tuple[Device | None, int, str]:
        """(execution GPU or None, bytes it needs kept free, the explanation)."""
        gpus = sorted(d for d in device_map.values() if isinstance(d, int))
        offloaded = [n for n, d in device_map.items() if d in ("cpu", "disk")]
        if not gpus:
            return None, 0, "no GPU in the map: nothing is streamed to a GPU, nothing is reserved"
        if not offloaded:
            return None, 0, "everything fits on the GPU(s): nothing is streamed, nothing is reserved"
        units: list[tuple[str, int]] = []
        resident: dict[int, int] = {}
        for name in offloaded:
            if name in self.modules:
                targets = offload_targets(name, self.modules[name], self.no_split)
            else:  # a tensor entry streams alone
                targets = [(name, None, False)]
            for path, module, direct_only in targets:
                nbytes = self._unit_bytes(path, module, direct_only, resident)
                if nbytes:
                    units.append((path, nbytes))
        exec_gpu = gpus[0]
        count = min(self.num_buffers, len(units))
        big_name, big = max(units, key=lambda u: u[1], default=("", 0))
        kept = sum(resident.values())
        need = count * big + kept
        note = (
            f"{device_name(exec_gpu)} runs the offloaded blocks and keeps {human_bytes(need)} free for the "
            f"offload engine: {count} device buffer(s) (num_buffers={self.num_buffers}) of "
            f"{human_bytes(big)}, the largest streamed block {big_name!r}"
            + (f", plus {human_bytes(kept)} of buffers of offloaded modules kept there" if kept else "")
        )
        return exec_gpu, need, note

    def _unit_bytes(
        self, path: str, module: nn.Module | None, direct_only: bool, resident: dict[int, int]
    ) -> int:
        if module is None:
            owner_name, _, attr = path.rpartition(".")
            owner = self.modules[owner_name]
            is_param = attr in owner._parameters
            t = owner._parameters[attr] if is_param else owner._buffers[attr]
            slots = [(path, is_param, t)]
        elif direct_only:
            prefix = f"{path}." if path else ""
            slots = [(prefix + a, True, p) for a, p in module._parameters.items() if p is not None]
            slots += [(prefix + a, False, b) for a, b in module._buffers.items() if b is not None]
        else:
            slots = [(full, is_param, t) for full, _, _, is_param, t in tensor_slots(module, path)]
        seen: set[int] = set()
        total = 0
        for full, is_param, t in slots:
            if not is_param and not self.offload_buffers:
                resident[id(t)] = self._bytes(full, t)
            elif id(t) not in seen:
                seen.add(id(t))
                total += aligned_bytes(self._bytes(full, t))
        return total
