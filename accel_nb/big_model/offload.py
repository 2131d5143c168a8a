"""The offload engine: bring CPU- or disk-held weights to the execution device for one forward.

On a CUDA execution device it streams at bus speed:
- each offloaded unit's weights are packed into ONE pinned host buffer (one large DMA per unit);
- copies run on a side CUDA stream into a small pool of device buffers (``num_buffers``, 2 by
  default), so GPU memory for offloaded weights stays bounded;
- while unit *i* computes, the weights of the unit that ran after it last time (or the next one
  in module order on the first pass) are already being copied: the next unit is prefetched;
- a buffer is refilled only after the compute that read it has finished (CUDA events, no host
  synchronisation); disk units are read from memory-mapped safetensors by a worker thread into
  pinned staging memory, then copied the same way.
On the CPU the weights are simply used where they are (CPU) or read from the memory-mapped file
(disk); nothing is copied more than once.
"""

from __future__ import annotations

import concurrent.futures
import threading
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

_ALIGN = 256  # bytes; keeps every tensor view in a flat buffer aligned for any dtype
DEFAULT_NUM_BUFFERS = 2  # device buffers for offloaded weights; the planner reserves room for them


def aligned_bytes(n: int) -> int:
    """Bytes a tensor of ``n`` bytes takes in a packed unit (rounded up to the alignment)."""
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


@dataclass
class TensorSlot:
    """One tensor of a unit: where it lives in the module and where its data comes from."""

    owner: nn.Module
    attr: str
    is_param: bool
    key: str  # full name in the model (also the key in the store)
    dtype: torch.dtype
    shape: torch.Size
    placeholder: torch.Tensor  # what the module holds between forwards (meta)
    offset: int = 0
    nbytes: int = 0


@dataclass
class OffloadUnit:
    """A module whose tensors live off the execution device between its forwards."""

    name: str
    module: nn.Module
    source: str  # "cpu" | "disk"
    slots: list[TensorSlot] = field(default_factory=list)
    host: dict[str, torch.Tensor] = field(default_factory=dict)  # cpu source: key -> tensor
    packed: torch.Tensor | None = None  # cpu source on CUDA: pinned flat uint8
    disk: dict[str, tuple[str, str]] = field(default_factory=dict)  # key -> (file, key in file)
    nbytes: int = 0
    index: int = 0

    def layout(self) -> None:
        offset = 0
        seen: dict[str, int] = {}
        for s in self.slots:
            s.nbytes = s.shape.numel() * torch.empty((), dtype=s.dtype, device="meta").element_size()
            if s.key in seen:  # the same tensor twice in one unit (tied): share the bytes
                s.offset = seen[s.key]
                continue
            s.offset = offset
            seen[s.key] = offset
            offset += aligned_bytes(s.nbytes)
        self.nbytes = offset


class _DeviceBuffer:
    """One reusable region on the execution device (plus pinned staging for disk reads)."""

    def __init__(self) -> None:
        self.data: torch.Tensor | None = None
        self.staging: torch.Tensor | None = None
        self.unit: OffloadUnit | None = None
        self.in_use = 0
        self.copy_done: Any = None  # torch.cuda.Event (or _NoEvent when streaming on the CPU)
        self.released: Any = None
        self.pending: concurrent.futures.Future | None = None
        self.last_used = 0


class _SlabAllocator:
    """Hands out pinned regions from a few large slabs.

    PyTorch's pinned allocator rounds every request up to a power of two; one allocation per
    block could waste almost half the host memory. Slabs are powers of two (>= 1 GiB, or the
    largest block) filled back to back, so the waste is a slab's unusable tail.
    """

    def __init__(self, pin: bool, needed: int) -> None:
        self.pin = pin
        self.needed = needed
        self.slab: torch.Tensor | None = None
        self.used = 0

    def take(self, nbytes: int) -> torch.Tensor:
        if self.slab is None or self.used + nbytes > self.slab.numel():
            size = max(1 << max(self.needed - 1, 1).bit_length(), 1) if self.needed < (1 << 30) else 1 << 30
            size = max(size, 1 << max(nbytes - 1, 1).bit_length())
            self.slab = torch.empty(size, dtype=torch.uint8, pin_memory=self.pin)
            self.used = 0
        region = self.slab[self.used : self.used + nbytes]
        self.used += aligned_bytes(nbytes)
        self.needed -= nbytes
        return region


class _NoEvent:
    """Stands in for a CUDA event where copies are synchronous (buffered streaming on the CPU)."""

    def record(self, stream: Any = None) -> None:
        pass

    def synchronize(self) -> None:
        pass


class OffloadEngine:
    """Materialise offloaded units on ``device`` for their forward; prefetch the next one.

    ``buffered=True`` on a CPU device runs the GPU code path (packed units, bounded buffer pool,
    learnt prefetch order) with synchronous copies, so that path is exercised without a GPU.
    """

    def __init__(
        self,
        device: torch.device | str,
        num_buffers: int = DEFAULT_NUM_BUFFERS,
        prefetch: bool = True,
        buffered: bool | None = None,
    ) -> None:
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.cuda = self.device.type == "cuda"
        self.buffered = self.cuda if buffered is None else (buffered or self.cuda)
        self.units: list[OffloadUnit] = []
        self.successor: dict[int, int] = {}
        self.prefetch = prefetch
        self.num_buffers = max(1, num_buffers)
        self._buffers: list[_DeviceBuffer] = []
        self._resident: dict[int, _DeviceBuffer] = {}
        self._last: int | None = None
        self._clock = 0
        self._files: dict[str, Any] = {}
        self._files_lock = threading.Lock()
        self._worker: concurrent.futures.ThreadPoolExecutor | None = None
        self._side_stream: torch.cuda.Stream | None = None
        self.bytes_streamed = 0
        self.prefetch_hits = 0  # forwards whose weights were already on their way
        self.prefetch_misses = 0

    # -- setup --------------------------------------------------------------------------------------
    def add_unit(self, unit: OffloadUnit) -> None:
        unit.layout()
        unit.index = len(self.units)
        self.units.append(unit)
        if unit.index > 0:
            self.successor.setdefault(unit.index - 1, unit.index)

    def finalize(self) -> None:
        """Pack CPU-held weights into pinned memory and size the device buffers."""
        if not self.units:
            return
        self.successor.setdefault(len(self.units) - 1, 0)
        if not self.buffered:
            return
        self._pack(self.units)
        self._size_buffers()

    def add_units(self, units: list[OffloadUnit]) -> None:
        """Add units to an engine already finalized (or a fresh one), packed and buffered like the rest.

        A quantized model's offloaded layers come this way, after ``dispatch_model`` placed the
        float tensors: they share the device buffers, the pinned memory and the prefetch order.
        """
        if not units:
            return
        if any(b.in_use for b in self._buffers):
            raise RuntimeError("offload units can be added only while no forward is running")
        last = len(self.units) - 1
        for unit in units:
            self.add_unit(unit)
        if last >= 0:
            self.successor[last] = last + 1
        self.successor[len(self.units) - 1] = 0
        if self.buffered:
            self._pack(units)
            self._size_buffers()

    def _pack(self, units: list[OffloadUnit]) -> None:
        todo = [u for u in units if u.source == "cpu" and u.packed is None]
        slabs = _SlabAllocator(pin=self.cuda, needed=sum(u.nbytes for u in todo))
        for unit in todo:
            packed = slabs.take(unit.nbytes)
            for s in unit.slots:
                view = packed[s.offset : s.offset + s.nbytes].view(s.dtype).view(s.shape)
                view.copy_(unit.host[s.key])
            unit.packed = packed
            unit.host.clear()  # the pinned copy is now the only one

    def _size_buffers(self) -> None:
        """(Re)make the device buffers (and disk staging) big enough for the biggest unit."""
        biggest = max(u.nbytes for u in self.units)
        disk = any(u.source == "disk" for u in self.units)
        count = min(self.num_buffers, len(self.units))
        fits = (
            len(self._buffers) == count
            and all(b.data is not None and b.data.numel() >= biggest for b in self._buffers)
            and (
                not disk or all(b.staging is not None and b.staging.numel() >= biggest for b in self._buffers)
            )
        )
        if not fits:
            if self.cuda and self._buffers:
                torch.cuda.synchronize(self.device)  # no copy may still be writing into a buffer we drop
            self._buffers.clear()
            self._resident.clear()
            if self.cuda and self._side_stream is None:
                self._side_stream = torch.cuda.Stream(device=self.device)
            for _ in range(count):
                buf = _DeviceBuffer()
                buf.data = torch.empty(biggest, dtype=torch.uint8, device=self.device)
                buf.copy_done = torch.cuda.Event() if self.cuda else _NoEvent()
                buf.released = torch.cuda.Event() if self.cuda else _NoEvent()
                if disk:
                    buf.staging = torch.empty(biggest, dtype=torch.uint8, pin_memory=self.cuda)
                self._buffers.append(buf)
        if disk and self._worker is None:
            self._worker = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="accel_nb-offload")

    def close(self) -> None:
        """Drop device buffers, pinned memory and open files."""
        if self._worker is not None:
            self._worker.shutdown(wait=True)
            self._worker = None
        if self.cuda and self._buffers:
            torch.cuda.synchronize(self.device)  # no copy may still be writing into a buffer we free
        self._buffers.clear()
        self._resident.clear()
        self._files.clear()

    # -- reading ------------------------------------------------------------------------------------
    def _open(self, path: str) -> Any:
        with self._files_lock:
            handle = self._files.get(path)
            if handle is None:
                from safetensors import safe_open

                handle = self._files[path] = safe_open(path, framework="pt", device="cpu")
            return handle

    def _read_disk(self, unit: OffloadUnit, key: str) -> torch.Tensor:
        path, name = unit.disk[key]
        return self._open(path).get_tensor(name)

    # -- the forward protocol -----------------------------------------------------------------------
    def before_forward(self, unit: OffloadUnit) -> None:
        """Put the unit's weights on the execution device and point its modules at them."""
        if self._last is not None and self._last != unit.index:
            self.successor[self._last] = unit.index
        self._last = unit.index
        if not self.buffered:
            tensors = self._host_tensors(unit)
        else:
            tensors = self._buffered_tensors(unit)
            nxt = self.successor.get(unit.index)
            if self.prefetch and nxt is not None and nxt != unit.index and nxt not in self._resident:
                self._issue(self.units[nxt])
        for s in unit.slots:
            t = tensors[s.key]
            if s.is_param:
                s.owner._parameters[s.attr] = nn.Parameter(t, requires_grad=False)
            else:
                s.owner._buffers[s.attr] = t

    def after_forward(self, unit: OffloadUnit) -> None:
        """Point the modules back at their placeholders; let the buffer be refilled."""
        for s in unit.slots:
            if s.is_param:
                s.owner._parameters[s.attr] = s.placeholder  # type: ignore[assignment]
            else:
                s.owner._buffers[s.attr] = s.placeholder
        if self.buffered:
            buf = self._resident.get(unit.index)
            if buf is not None and buf.unit is unit and buf.in_use:
                buf.in_use -= 1
                if not buf.in_use and self.cuda:
                    buf.released.record(torch.cuda.current_stream(self.device))

    # -- CPU execution ------------------------------------------------------------------------------
    def _host_tensors(self, unit: OffloadUnit) -> dict[str, torch.Tensor]:
        out: dict[str, torch.Tensor] = {}
        for s in unit.slots:
            if s.key in out:
                continue
            t = unit.host[s.key] if unit.source == "cpu" else self._read_disk(unit, s.key)
            if t.dtype != s.dtype:
                t = t.to(s.dtype)
            if t.device != self.device:
                t = t.to(self.device)
            out[s.key] = t
        return out

    # -- CUDA execution -----------------------------------------------------------------------------
    def _pick_buffer(self, unit: OffloadUnit) -> _DeviceBuffer | None:
        free = [b for b in self._buffers if not b.in_use and b.unit is not unit]
        if not free:
            return None
        return min(free, key=lambda b: b.last_used)

    def _fill_staging(self, unit: OffloadUnit, buf: _DeviceBuffer) -> None:
        """Worker thread: read a disk unit into pinned staging, then start its copy."""
        buf.copy_done.synchronize()  # the previous copy out of this staging area has finished
        for s in unit.slots:
            view = buf.staging[s.offset : s.offset + s.nbytes].view(s.dtype).view(s.shape)
            view.copy_(self._read_disk(unit, s.key))
        self._start_copy(buf, buf.staging[: unit.nbytes])

    def _start_copy(self, buf: _DeviceBuffer, host: torch.Tensor) -> None:
        if not self.cuda:
            buf.data[: host.numel()].copy_(host)
            self.bytes_streamed += host.numel()
            return
        stream = self._side_stream
        with torch.cuda.stream(stream):
            stream.wait_event(buf.released)  # whoever read this buffer last is done with it
            buf.data[: host.numel()].copy_(host, non_blocking=True)
            buf.copy_done.record(stream)
        self.bytes_streamed += host.numel()

    def _issue(self, unit: OffloadUnit) -> _DeviceBuffer | None:
        buf = self._pick_buffer(unit)
        if buf is None:
            return None
        if buf.pending is not None:  # a disk read still filling it (never when not in use, but be safe)
            buf.pending.result()
            buf.pending = None
        if buf.unit is not None:
            self._resident.pop(buf.unit.index, None)
        buf.unit = unit
        self._clock += 1
        buf.last_used = self._clock
        self._resident[unit.index] = buf
        if unit.source == "cpu":
            self._start_copy(buf, unit.packed)
        else:
            buf.pending = self._worker.submit(self._fill_staging, unit, buf)
        return buf

    def _buffered_tensors(self, unit: OffloadUnit) -> dict[str, torch.Tensor]:
        buf = self._resident.get(unit.index)
        if buf is None or buf.unit is not unit:
            self.prefetch_misses += 1
            buf = self._issue(unit)
        else:
            self.prefetch_hits += 1
        if buf is None:  # every buffer busy (nested offloaded units): plain synchronous copies
            return {
                s.key: (
                    unit.packed[s.offset : s.offset + s.nbytes].view(s.dtype).view(s.shape)
                    if unit.source == "cpu"
                    else self._read_disk(unit, s.key).to(s.dtype)
                ).to(self.device)
                for s in unit.slots
            }
        if buf.pending is not None:
            buf.pending.result()  # re-raises a read error here, in the forward that needs it
            buf.pending = None
        if self.cuda:
            torch.cuda.current_stream(self.device).wait_event(buf.copy_done)
        buf.in_use += 1
        self._clock += 1
        buf.last_used = self._clock
        return {
            s.key: buf.data[s.offset : s.offset + s.nbytes].view(s.dtype).view(s.shape) for s in unit.slots
        }
