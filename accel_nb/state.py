"""The shared state of a run's processes: ``PartialState``, ``AcceleratorState``, ``GradientState``.

``PartialState`` reads the topology that torchrun (or accel_nb's launcher) puts in the
environment -- ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``,
``MASTER_PORT``, read by ``topology.read_topology`` -- and joins the process group (nccl on CUDA, gloo on CPU). Every instance
shares one state, so it is cheap to create anywhere:

    state = PartialState()
    with state.main_process_first():
        dataset = build_dataset()          # rank 0 first (downloads, caches), then the others
    state.print(f"{state.num_processes} processes on {state.device}")

``GradientState`` is defined in ``accel_nb.accelerator.gradient_state`` and imported here, its reference path.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import os
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist

from .accelerator.gradient_state import GradientState  # the reference's path: accelerate.state.GradientState
from .env_names import (  # the launcher's variables (the reference's spellings are read too)
    ENV_DEEPSPEED_CONFIG,
    ENV_FORKED,
    ENV_MIXED_PRECISION,
    ENV_USE_CPU,
    REFERENCE_USE_DEEPSPEED,
)
from .lazy_exports import lazy_exports
from .precision.setting import MIXED_PRECISION_CHOICES, check_xla_mixed_precision, validate_mixed_precision
from .process_group import (
    PROCESS_GROUP_KEYWORDS,
    RendezvousError,
    check_backend,
    check_state_keywords,
    join_process_group,
    set_group_timeout,
    timeout_seconds,
)
from .reexports import reexports
from .splitting import split_for_process
from .topology import TopologyError, env_flag, env_value, read_topology, requested_device
from .xla import runtime as xla_runtime

__all__ = [
    "PartialState",
    "AcceleratorState",
    "GradientState",
    "DistributedType",
    "TopologyError",
    "RendezvousError",
    "MIXED_PRECISION_CHOICES",
    "validate_mixed_precision",
    "split_for_process",
    "read_topology",
]


class DistributedType(str, enum.Enum):
    """How the processes of this run talk to each other.

    accel_nb sets NO, MULTI_CPU, MULTI_GPU or XLA; the other members exist with the reference
    library's names and values so scripts that compare against them run unchanged.
    """

    NO = "NO"
    MULTI_CPU = "MULTI_CPU"
    MULTI_GPU = "MULTI_GPU"
    MULTI_NPU = "MULTI_NPU"
    MULTI_MLU = "MULTI_MLU"
    MULTI_SDAA = "MULTI_SDAA"
    MULTI_MUSA = "MULTI_MUSA"
    MULTI_XPU = "MULTI_XPU"
    DEEPSPEED = "DEEPSPEED"
    FSDP = "FSDP"
    XLA = "XLA"
    MEGATRON_LM = "MEGATRON_LM"
    MULTI_HPU = "MULTI_HPU"
    MULTI_NEURON = "MULTI_NEURON"


def _cuda_usable(cpu: bool) -> bool:
    return not cpu and torch.cuda.is_available()


def _choose_state_scope(owner: Any, cpu: bool) -> bool:
    """Before the first state of a run: start the XLA runtime when it is configured (which decides
    whether the shared state is per thread). True when this run uses XLA devices."""
    if owner._shared_state.get("initialized"):
        return owner._shared_state.get("distributed_type") == DistributedType.XLA
    return xla_runtime.use_xla(cpu or env_flag(ENV_USE_CPU))


class PartialState:
    """Topology of this run: which process this is, how many there are, which device it uses.

    All instances share one state (created on first use). ``cpu=True`` forces the CPU even
    when GPUs (or XLA devices) are present. With torch_xla installed and a PJRT device configured
    (``PJRT_DEVICE``, or TPU chips) the run is ``DistributedType.XLA``: device, rank and world size
    come from torch_xla's runtime, and no process group is formed.

        state = PartialState()
        if state.is_main_process:
            print("world size", state.num_processes)
    """

    _shared_state: dict[str, Any] = xla_runtime.StateStore()  # type: ignore[assignment]
    initialized: bool = False  # read through an instance whose shared state was reset: not initialized
    # what a live state holds: reading one after _reset_state() says why it is gone
    _state_attrs: tuple[str, ...] = (
        "backend",
        "collective_timeout",
        "device",
        "distributed_type",
        "fork_launched",
        "local_process_index",
        "num_local_processes",
        "num_processes",
        "process_index",
    )

    def __getattr__(self, name: str) -> Any:
        # only reached when normal lookup fails: a reset shared state, or a name no state has
        cls = type(self).__name__
        if name in type(self)._state_attrs and not self._shared_state.get("initialized"):
            raise AttributeError(
                f"`{cls}` object has no attribute `{name}`. This happens if `{cls}._reset_state()` was "
                "called and an `Accelerator` or `PartialState` was not reinitialized."
            )
        raise AttributeError(f"'{cls}' object has no attribute '{name}'")

    def __init__(
        self, cpu: bool = False, *, backend: str | None = None, timeout: Any = None, **kwargs: Any
    ) -> None:
        check_state_keywords("PartialState", kwargs, ("cpu",) + PROCESS_GROUP_KEYWORDS)
        use_xla = _choose_state_scope(PartialState, cpu)
        self.__dict__ = self._shared_state
        if self._shared_state.get("initialized"):
            self._check_same_settings(cpu, backend, timeout)
            return
        cpu = cpu or env_flag(ENV_USE_CPU)
        collective_timeout = timeout_seconds(timeout)
        if use_xla:
            self._init_xla(backend, collective_timeout)
            return
        topo = read_topology()
        self.num_processes: int = topo["world_size"]
        self.process_index: int = topo["rank"]
        self.local_process_index: int = topo["local_rank"]
        self.num_local_processes: int = topo["local_world_size"]
        self._owns_group = False
        requested = requested_device(cpu)
        if requested is not None:
            use_cuda = requested.type == "cuda"
            self.device = requested
        else:
            use_cuda = _cuda_usable(cpu)
            if use_cuda:
                index = self.local_process_index % max(torch.cuda.device_count(), 1)
                self.device = torch.device("cuda", index)
                torch.cuda.set_device(self.device)
            else:
                self.device = torch.device("cpu")
        chosen = check_backend(backend, use_cuda)
        self.collective_timeout = collective_timeout
        if self.num_processes > 1:
            self.backend = chosen or ("nccl" if use_cuda else "gloo")
            self.distributed_type = DistributedType.MULTI_GPU if use_cuda else DistributedType.MULTI_CPU
            if not dist.is_initialized():
                join_process_group(topo, self.backend, collective_timeout)
                self._owns_group = True
            else:
                self._adopt_existing_group(chosen, collective_timeout)
        else:
            self.backend = None  # one process: no group to form (a given backend was still checked)
            self.distributed_type = DistributedType.NO
        if env_value(ENV_DEEPSPEED_CONFIG) or env_flag(REFERENCE_USE_DEEPSPEED):
            # the launcher asked for DeepSpeed (accel_nb.deepspeed)
            self.distributed_type = DistributedType.DEEPSPEED
        self.fork_launched = os.environ.get(ENV_FORKED) == "1"
        self.initialized = True

    def _init_xla(self, backend: str | None, collective_timeout: float | None) -> None:
        """Topology from torch_xla's runtime: its device, ordinal and world size; no process group."""
        if backend is not None:
            raise ValueError(
                f"PartialState(backend={backend!r}) does not apply on XLA devices: torch_xla's runtime "
                "connects them; leave backend out (or pass cpu=True to train on the CPU with gloo)"
            )
        if collective_timeout is not None:
            warnings.warn(
                "timeout= has no effect on XLA devices (torch_xla's runtime sets its own collective "
                "timeouts); it is ignored",
                stacklevel=3,
            )
        topo = xla_runtime.topology()
        self.num_processes = topo["world_size"]
        self.process_index = topo["rank"]
        self.local_process_index = topo["local_rank"]
        self.num_local_processes = topo["local_world_size"]
        self._owns_group = False
        self.device = topo["device"]
        self.collective_timeout = None
        self.backend = None  # no torch.distributed group: XLA collectives
        self.distributed_type = DistributedType.XLA
        self.fork_launched = os.environ.get(ENV_FORKED) == "1"
        self.initialized = True

    def _adopt_existing_group(self, backend: str | None, collective_timeout: float | None) -> None:
        """The process group was formed before accel_nb (e.g. by the user's script): use it as it is."""
        existing = str(dist.get_backend())
        if backend is not None and backend != existing:
            raise RuntimeError(
                f"PartialState(backend={backend!r}) but the process group already runs {existing!r}; "
                "leave backend out, or create PartialState before initialising the group yourself"
            )
        self.backend = existing
        if collective_timeout is not None:
            set_group_timeout(collective_timeout)

    def _check_same_settings(self, cpu: bool, backend: Any, timeout: Any) -> None:
        """A later PartialState(...) may not ask for settings other than the first one's."""
        if cpu and self.device.type != "cpu":
            raise RuntimeError(
                "PartialState was already created on "
                f"{self.device}; cpu=True must be given the first time (or set {ENV_USE_CPU}=1)"
            )
        wanted = check_backend(backend, self.device.type == "cuda")
        if wanted is not None and self.backend is not None and wanted != self.backend:
            raise RuntimeError(
                f"PartialState already runs the {self.backend!r} backend; backend={wanted!r} must be given "
                "to the first PartialState (or Accelerator) of the run"
            )
        seconds = timeout_seconds(timeout)
        if seconds is not None and seconds != self.collective_timeout:
            raise RuntimeError(
                f"PartialState already exists with timeout={self.collective_timeout}; timeout={seconds:g} s "
                "must be given to the first PartialState (or Accelerator) of the run"
            )

    # -- identity -----------------------------------------------------------------------------
    @property
    def use_distributed(self) -> bool:
        return self.num_processes > 1

    @property
    def is_main_process(self) -> bool:
        return self.process_index == 0

    @property
    def is_local_main_process(self) -> bool:
        return self.local_process_index == 0

    @property
    def is_last_process(self) -> bool:
        return self.process_index == self.num_processes - 1

    def __repr__(self) -> str:
        """The reference's report, line for line (its ``run_me.py`` prints it): environment, backend, counts, device."""
        backend = f"  Backend: {self.backend}" if self.backend else ""
        return (
            f"Distributed environment: {self.distributed_type}{backend}\n"
            f"Num processes: {self.num_processes}\n"
            f"Process index: {self.process_index}\n"
            f"Local process index: {self.local_process_index}\n"
            f"Device: {self.device}\n"
        )

    # -- synchronisation ------------------------------------------------------------------------
    def wait_for_everyone(self) -> None:
        """Block until every process reaches this line (a barrier; nothing with one process)."""
        if self.use_distributed:
            if self.distributed_type == DistributedType.XLA:
                xla_runtime.barrier()
                return
            dist.barrier()

    @contextlib.contextmanager
    def _goes_first(self, first: bool) -> Iterator[None]:
        if not first:
            self.wait_for_everyone()
        yield
        if first:
            self.wait_for_everyone()

    def main_process_first(self) -> contextlib.AbstractContextManager[None]:
        """Run the block on the main process first, then on all the others together."""
        return self._goes_first(self.is_main_process)

    def local_main_process_first(self) -> contextlib.AbstractContextManager[None]:
        """Run the block on each machine's local main process first, then on the rest."""
        return self._goes_first(self.is_local_main_process)

    # -- decorators -----------------------------------------------------------------------------
    def on_main_process(self, function: Callable[..., Any]) -> Callable[..., Any]:
        """Decorator: the function runs on the main process only (returns None elsewhere)."""
        return self.on_process(function, process_index=0)

    def on_local_main_process(self, function: Callable[..., Any]) -> Callable[..., Any]:
        """Decorator: the function runs on each machine's local main process only."""

        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if self.is_local_main_process:
                return function(*args, **kwargs)
            return None

        return wrapper

    def on_process(self, function: Callable[..., Any] | None = None, process_index: int = 0) -> Any:
        """Decorator: the function runs on ``process_index`` only (returns None elsewhere).

        With one process it always runs, as in the reference library.
        """
        if function is None:
            return functools.partial(self.on_process, process_index=process_index)

        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if self.process_index == process_index or self.num_processes == 1:
                return function(*args, **kwargs)
            return None

        return wrapper

    def on_last_process(self, function: Callable[..., Any]) -> Callable[..., Any]:
        """Decorator: the function runs on the last process only (returns None elsewhere)."""
        return self.on_process(function, process_index=self.num_processes - 1)

    def on_local_process(
        self, function: Callable[..., Any] | None = None, local_process_index: int = 0
    ) -> Any:
        """Decorator: the function runs on the process of each machine with ``local_process_index``
        (always with one process, as in the reference library).

            @state.on_local_process(local_process_index=1)
            def warm_cache(): ...
        """
        if function is None:
            return functools.partial(self.on_local_process, local_process_index=local_process_index)

        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if self.local_process_index == local_process_index or self.num_processes == 1:
                return function(*args, **kwargs)
            return None

        return wrapper

    # -- work splitting -------------------------------------------------------------------------
    @contextlib.contextmanager
    def split_between_processes(self, inputs: Any, apply_padding: bool = False) -> Iterator[Any]:
        """Yield this process's contiguous share of ``inputs`` (list, tuple, tensor, dict of those).

        With ``apply_padding`` every share has the same length (the last element is repeated),
        which keeps a later ``gather`` shape-consistent; drop the padding after gathering.

            with state.split_between_processes(prompts) as mine:
                outputs = [generate(p) for p in mine]
        """
        yield split_for_process(inputs, self.process_index, self.num_processes, apply_padding)

    # -- output ---------------------------------------------------------------------------------
    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print`` on the main process only."""
        if self.is_main_process:
            print(*args, **kwargs)

    # -- teardown -------------------------------------------------------------------------------
    def destroy_process_group(self, group: Any = None) -> None:
        """Leave the process group and forget the topology (the next PartialState starts fresh)."""
        if self.use_distributed and dist.is_initialized():
            dist.destroy_process_group(group)
        if group is None:
            _reset_all_states()

    @staticmethod
    def _reset_state() -> None:
        """Forget the topology shared by every PartialState (tests and warm workers between launches).

        The reference's private helper, kept with its meaning because test suites call it between tests;
        ``AcceleratorState`` and ``GradientState`` keep theirs (see ``AcceleratorState._reset_state``).
        """
        PartialState._shared_state.clear()


class AcceleratorState(PartialState):
    """PartialState plus the training settings of this run (mixed precision, ...), shared too."""

    _shared_state: dict[str, Any] = xla_runtime.StateStore()  # type: ignore[assignment]
    _state_attrs = PartialState._state_attrs + ("mixed_precision",)

    def __init__(self, mixed_precision: str | None = None, cpu: bool = False, **kwargs: Any) -> None:
        check_state_keywords(
            "AcceleratorState",
            {k: v for k, v in kwargs.items() if k not in PROCESS_GROUP_KEYWORDS},
            ("mixed_precision", "cpu") + PROCESS_GROUP_KEYWORDS,
        )
        _choose_state_scope(AcceleratorState, cpu)
        self.__dict__ = self._shared_state
        if not self._shared_state.get("initialized"):
            partial = PartialState(cpu=cpu, **kwargs)
            mp = mixed_precision if mixed_precision is not None else env_value(ENV_MIXED_PRECISION, "no")
            mp = validate_mixed_precision(mp)
            if partial.distributed_type == DistributedType.XLA:
                check_xla_mixed_precision(mp)  # before this state exists: a retry with bf16 works
            self._shared_state.update(partial.__dict__)
            self.mixed_precision = mp
            self.initialized = True
        elif not PartialState._shared_state.get("initialized"):
            # the topology was reset (PartialState._reset_state(), as test suites do between tests) and
            # these settings kept: the topology is found again and copied in, as the reference does
            self._shared_state.update(PartialState(cpu=cpu, **kwargs).__dict__)
        elif kwargs:
            PartialState(cpu=cpu, **kwargs)  # the same settings, or a clear error
        if mixed_precision is not None and validate_mixed_precision(mixed_precision) != self.mixed_precision:
            raise RuntimeError(
                f"AcceleratorState already exists with mixed_precision={self.mixed_precision!r}; "
                f"it cannot change to {mixed_precision!r} in the same run. Create one Accelerator per run "
                "(or call AcceleratorState._reset_state() first in tests)."
            )

    @property
    def partial_state(self) -> PartialState:
        return PartialState()

    # What the reference's AcceleratorState answers from PartialState(): these still work after
    # AcceleratorState._reset_state() while the topology is kept (its test scripts call
    # ``state.destroy_process_group()`` on such a state); the settings and the topology copied
    # here (device, process_index, ...) raise as in the reference.
    @property
    def use_distributed(self) -> bool:
        return PartialState().use_distributed

    @property
    def fork_launched(self) -> bool:
        return PartialState().fork_launched

    @property
    def is_main_process(self) -> bool:
        return PartialState().is_main_process

    @property
    def is_local_main_process(self) -> bool:
        return PartialState().is_local_main_process

    @property
    def is_last_process(self) -> bool:
        return PartialState().is_last_process

    def wait_for_everyone(self) -> None:
        PartialState().wait_for_everyone()

    def split_between_processes(self, inputs: Any, apply_padding: bool = False) -> Any:
        return PartialState().split_between_processes(inputs, apply_padding=apply_padding)

    def main_process_first(self) -> Any:
        return PartialState().main_process_first()

    def local_main_process_first(self) -> Any:
        return PartialState().local_main_process_first()

    def destroy_process_group(self, group: Any = None) -> None:
        PartialState().destroy_process_group(group)

    @staticmethod
    def _reset_state(reset_partial_state: bool = False) -> None:
        """Forget the training settings shared by every AcceleratorState; with ``reset_partial_state``
        the topology too, as the reference's helper of this name does (tests call it between tests:
        ``AcceleratorState._reset_state(True)``). ``GradientState`` is left as it is."""
        AcceleratorState._shared_state.clear()
        if reset_partial_state:
            PartialState._reset_state()

    def __repr__(self) -> str:
        """PartialState's report and the mixed precision, as the reference prints them."""
        return f"{PartialState().__repr__()}\nMixed precision type: {self.mixed_precision}\n"


def _reset_all_states() -> None:
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


# the names the reference's module at this path has because it imports them (accel_nb.reexports)
__getattr__, __dir__ = lazy_exports(globals(), reexports(__name__))
