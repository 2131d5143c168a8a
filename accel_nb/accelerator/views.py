"""What an ``Accelerator`` shows of the shared state: topology, settings, and the per-process helpers.

Read-only views and one-line delegations to ``AcceleratorState`` / ``GradientState``, kept apart
from ``accelerator.py`` so the facade file holds what the Accelerator itself does.

    accelerator.process_index, accelerator.num_processes, accelerator.device
    with accelerator.main_process_first(): ...
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from ..state import DistributedType
from .device_maps import verify_device_map

# the reference's multi_device: one process per accelerator of these kinds
_MULTI_DEVICE_TYPES = (
    DistributedType.MULTI_GPU,
    DistributedType.MULTI_MLU,
    DistributedType.MULTI_SDAA,
    DistributedType.MULTI_MUSA,
    DistributedType.MULTI_NPU,
    DistributedType.MULTI_XPU,
    DistributedType.MULTI_HPU,
    DistributedType.MULTI_NEURON,
)


class StateViews:
    """Properties and helpers that read ``self.state`` (AcceleratorState) and ``self.gradient_state``."""

    state: Any
    gradient_state: Any
    dataloader_config: Any
    project_configuration: Any
    precision: Any
    _optimizers: list[Any]

    @property
    def device(self) -> torch.device:
        return self.state.device

    @property
    def process_index(self) -> int:
        return self.state.process_index

    @property
    def local_process_index(self) -> int:
        return self.state.local_process_index

    @property
    def num_processes(self) -> int:
        return self.state.num_processes

    @property
    def distributed_type(self) -> Any:
        return self.state.distributed_type

    @property
    def is_fsdp2(self) -> bool:
        """True when prepared models are sharded with FSDP (accel_nb's FSDP is always torch's FSDP2)."""
        backend = getattr(self, "backend", None)
        return bool(backend is not None and backend.shards_with_fsdp)

    # -- the parallelism layout (accel_nb.parallel): None without a ParallelismConfig ---------------------
    @property
    def parallelism_config(self) -> Any:
        """The run's ``ParallelismConfig`` (sizes checked against the processes), or None."""
        layout = getattr(self, "parallel_layout", None)
        return None if layout is None else layout.config

    @property
    def torch_device_mesh(self) -> Any:
        """The torch ``DeviceMesh`` of the ParallelismConfig (dimensions ``dp_replicate``, ``dp_shard``,
        ``cp``, ``tp`` where above 1, joint ``dp``, ``dp_shard_cp``, ``dp_cp``), or None.

            tp_group = accelerator.torch_device_mesh["tp"].get_group()
        """
        layout = getattr(self, "parallel_layout", None)
        return None if layout is None else layout.mesh

    def _mesh_rank(self, dim: str) -> int:
        config = self.parallelism_config
        if config is None:
            raise RuntimeError(
                f"no parallelism layout: pass Accelerator(parallelism_config=ParallelismConfig(...)) to have a {dim} rank"
            )
        return config.coordinates(self.process_index)[dim]

    @property
    def tensor_parallel_rank(self) -> int:
        """This process's place in its tensor-parallel group (0 when ``tp_size`` is 1)."""
        return self._mesh_rank("tp")

    @property
    def context_parallel_rank(self) -> int:
        """This process's place in its context-parallel group (0 when ``cp_size`` is 1)."""
        return self._mesh_rank("cp")

    @property
    def data_parallel_rank(self) -> int:
        """This process's replica index (the ``dp_replicate`` dimension; 0 when its size is 1)."""
        return self._mesh_rank("dp_replicate")

    @property
    def data_parallel_shard_rank(self) -> int:
        """This process's place in its FSDP shard group (the ``dp_shard`` dimension; 0 when its size is 1)."""
        return self._mesh_rank("dp_shard")

    @property
    def use_distributed(self) -> bool:
        return self.state.num_processes > 1

    @property
    def multi_device(self) -> bool:
        """Several processes, each on its own accelerator (GPU, XPU, ...): False on CPUs, XLA, FSDP, DeepSpeed."""
        return self.use_distributed and self.distributed_type in _MULTI_DEVICE_TYPES

    @property
    def is_composable_parallelism_enabled(self) -> bool:
        return self.is_fsdp2

    @property
    def should_save_model(self) -> bool:
        """The reference's answer: every process with a ParallelismConfig (all take part in the save),
        else the local main process."""
        return True if self.parallelism_config is not None else self.state.is_local_main_process

    @property
    def is_main_process(self) -> bool:
        return self.state.is_main_process

    @property
    def is_local_main_process(self) -> bool:
        return self.state.is_local_main_process

    @property
    def is_last_process(self) -> bool:
        return self.state.is_last_process

    @property
    def mixed_precision(self) -> str:
        return self.state.mixed_precision

    @property
    def native_amp(self) -> bool:
        """True when prepared models run under torch's autocast (fp16 or bf16; DeepSpeed casts by itself)."""
        return self.precision.enabled and not self.backend.casts_by_itself  # type: ignore[attr-defined]

    def verify_device_map(self, model: torch.nn.Module) -> bool:
        """True when ``model`` (or a module in it) was dispatched by a device map of more than one entry."""
        return verify_device_map(model)

    @property
    def project_dir(self) -> str | None:
        return getattr(self.project_configuration, "project_dir", None)

    @property
    def split_batches(self) -> bool:
        return self.dataloader_config.split_batches

    @property
    def even_batches(self) -> bool:
        return self.dataloader_config.even_batches

    @even_batches.setter
    def even_batches(self, value: bool) -> None:
        self.dataloader_config.even_batches = value

    # the reference's older spellings of the DataLoaderConfiguration and ProjectConfiguration fields
    @property
    def dispatch_batches(self) -> bool | None:
        return self.dataloader_config.dispatch_batches

    @property
    def use_seedable_sampler(self) -> bool:
        return self.dataloader_config.use_seedable_sampler

    @property
    def non_blocking(self) -> bool:
        return self.dataloader_config.non_blocking

    @property
    def use_stateful_dataloader(self) -> bool:
        return getattr(self.dataloader_config, "use_stateful_dataloader", False)

    @property
    def logging_dir(self) -> str | None:
        return getattr(self.project_configuration, "logging_dir", None)

    @property
    def save_iteration(self) -> int:
        """The number the next ``save_state`` under ``automatic_checkpoint_naming`` gives its folder."""
        return self.project_configuration.iteration

    @property
    def gradient_accumulation_steps(self) -> int:
        return self.gradient_state.num_steps

    @gradient_accumulation_steps.setter
    def gradient_accumulation_steps(self, value: int) -> None:
        self.gradient_state.num_steps = int(value)

    @property
    def sync_gradients(self) -> bool:
        """True on the steps where gradients are synchronised and the optimizer updates."""
        return self.gradient_state.sync_gradients

    @sync_gradients.setter
    def sync_gradients(self, value: bool) -> None:
        self.gradient_state._set_sync_gradients(bool(value))

    @property
    def optimizer_step_was_skipped(self) -> bool:
        return any(opt.step_was_skipped for opt in self._optimizers)

    def wait_for_everyone(self) -> None:
        """A barrier across all processes."""
        self.state.wait_for_everyone()

    def main_process_first(self) -> contextlib.AbstractContextManager[None]:
        return self.state.main_process_first()

    def local_main_process_first(self) -> contextlib.AbstractContextManager[None]:
        return self.state.local_main_process_first()

    def split_between_processes(
        self, inputs: Any, apply_padding: bool = False
    ) -> contextlib.AbstractContextManager[Any]:
        return self.state.split_between_processes(inputs, apply_padding=apply_padding)

    def on_main_process(self, function: Any) -> Any:
        return self.state.on_main_process(function)

    def on_local_main_process(self, function: Any) -> Any:
        return self.state.on_local_main_process(function)

    def on_process(self, function: Any = None, process_index: int = 0) -> Any:
        return self.state.on_process(function, process_index=process_index)

    def on_last_process(self, function: Any) -> Any:
        return self.state.on_last_process(function)

    def on_local_process(self, function: Any = None, local_process_index: int = 0) -> Any:
        return self.state.on_local_process(function, local_process_index=local_process_index)

    # -- a stop flag any process can raise --------------------------------------------------------
    def set_trigger(self) -> None:
        """Raise this process's flag: the next ``check_trigger()`` is True on every process.

            if loss.item() < target:
                accelerator.set_trigger()
            if accelerator.check_trigger():   # on every process, at the same step
                break

        Any one process may raise it; every process reads the same answer.
        """
        self._trigger_raised = True

    def check_trigger(self) -> bool:
        """True on every process when any process called ``set_trigger()`` since the last True.

        A collective (every process must call it at the same point); the flag is lowered again
        when it reports True.
        """
        from ..ops import reduce

        flag = torch.tensor(int(getattr(self, "_trigger_raised", False)), device=self.device)
        if int(reduce(flag, "sum").item()) >= 1:
            self._trigger_raised = False
            return True
        return False

    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print`` on the main process only."""
        self.state.print(*args, **kwargs)
