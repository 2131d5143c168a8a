"""TEST-ONLY stand-ins that let megatron-core 0.16 train on CPU (gloo): never part of accel_nb.

megatron-core calls CUDA in places a CPU run reaches: its RNG tracker (torch.cuda.get_rng_state),
``torch.cuda.current_device()`` (rotary embeddings, utils, the optimizer), ``torch.cuda.synchronize()``
and tensors made with ``device="cuda"`` (the pipeline schedules, its DDP buffers). ``install()`` replaces
these, in the calling process only:

- a tracker whose ``fork`` keeps the CPU RNG (dropout is 0 in the tests, so no stream is drawn);
- ``torch.cuda.current_device`` -> "cpu", ``torch.cuda.synchronize`` -> nothing;
- a TorchFunctionMode that turns ``device="cuda"`` (and ``Tensor.cuda()``) into the CPU.

It also lets the Megatron back-end start without a GPU (accel_nb refuses that for users): it replaces
``accel_nb.megatron.checks.require_gpu`` with a no-op, which is the test-only switch.
"""

from __future__ import annotations

import contextlib

import torch
from torch.overrides import TorchFunctionMode


class CpuRngTracker:
    """What megatron's CudaRNGStatesTracker offers, on the CPU generator (fork keeps the CPU state)."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.states_: dict = {}
        self.seeds_: set = set()
        self._is_initialized = False

    def is_initialized(self) -> bool:
        return self._is_initialized

    def get_states(self) -> dict:
        return dict(self.states_)

    def set_states(self, states: dict) -> None:
        self._is_initialized = True
        self.states_ = states

    def add(self, name: str, seed: int) -> None:
        self._is_initialized = True
        self.seeds_.add(seed)
        self.states_[name] = seed

    @contextlib.contextmanager
    def fork(self, name: str = "model-parallel-rng"):
        yield


def _cpu(device):
    if device is None:
        return None
    if isinstance(device, int) or str(device).startswith("cuda"):
        return torch.device("cpu")
    return device


class CudaToCpu(TorchFunctionMode):
    """Every tensor megatron-core asks to make on "cuda" is made on the CPU."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func is torch.Tensor.cuda:
            return args[0]
        if "device" in kwargs:
            kwargs["device"] = _cpu(kwargs["device"])
        if (
            func in (torch.Tensor.to,)
            and len(args) > 1
            and not isinstance(args[1], (torch.Tensor, torch.dtype))
        ):
            args = (args[0], _cpu(args[1]), *args[2:])
        return func(*args, **kwargs)


_MODE: CudaToCpu | None = None


def install() -> None:
    """Switch the stand-ins on in this process (idempotent)."""
    global _MODE
    from megatron.core.tensor_parallel import random as mrandom

    import accel_nb.megatron.checks as checks

    mrandom._CUDA_RNG_STATE_TRACKER = CpuRngTracker()
    mrandom._CUDA_RNG_STATE_TRACKER_INITIALIZED = True
    torch.cuda.current_device = lambda: "cpu"
    torch.cuda.synchronize = lambda *a, **k: None
    checks.require_gpu = lambda what: None
    if _MODE is None:
        _MODE = CudaToCpu()
        _MODE.__enter__()
