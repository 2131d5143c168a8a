"""Megatron-LM through megatron-core: tensor, pipeline and data parallelism of a GPT (accel_nb.megatron does the work).

``prepare`` builds megatron-core's GPTModel of the given model's size on this rank's tensor/pipeline slice,
wraps it in Megatron's DDP with Megatron's optimizer and scheduler, and returns an engine whose forward is a
whole training step; ``backward``, ``optimizer.step`` and ``scheduler.step`` do nothing (the reference's
meaning). Loaders split the data over the data-parallel ranks only. Checkpoints: each tensor/pipeline slice
writes its own file (``megatron/mp_rank_TT_PPP.pt``) with its optimizer and scheduler.

    accelerator = Accelerator(megatron_lm_plugin=MegatronLMPlugin(tp_degree=2))   # backend.name == 'megatron'
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

from .base import TrainingBackend, register_backend

if TYPE_CHECKING:
    import torch

__all__ = ["MegatronBackend"]


@register_backend
class MegatronBackend(TrainingBackend):
    """megatron-core's model parallelism behind ``prepare`` (``accelerator.megatron_lm_plugin``)."""

    name = "megatron"
    launch_types = ("MEGATRON_LM",)
    config_key = "megatron_lm_config"
    inert_advice = "set distributed_type: MEGATRON_LM to use it"

    # -- the launch config ----------------------------------------------------------------------------
    @classmethod
    def check_launch_config(cls, cfg: Any, path: str | None) -> None:
        """``megatron_lm_config`` (the reference's ``megatron_lm_*`` keys) is read with ``distributed_type: MEGATRON_LM``."""
        super().check_launch_config(cfg, path)
        if cfg.distributed_type not in cls.launch_types:
            return
        from ...config.values import ConfigError  # deferred: config imports this package
        from ...megatron.plugin import MegatronLMPlugin, settings_from_launch

        config = cfg.extras.get("megatron_lm_config") or {}
        if int(cfg.gradient_accumulation_steps or 1) > 1:
            raise ConfigError(
                "gradient_accumulation_steps",
                cfg.gradient_accumulation_steps,
                "1 with Megatron-LM",
                path,
                "Megatron-LM accumulates over megatron_lm_num_micro_batches instead",
            )
        try:
            MegatronLMPlugin(**settings_from_launch(config))
        except (ValueError, TypeError) as exc:
            raise ConfigError(
                "megatron_lm_config", config, "the megatron_lm_* keys of docs/megatron.md", path, str(exc)
            ) from None

    @classmethod
    def hardware_notes(cls, cfg: Any, hw: Any, path: str | None) -> list[str]:
        """megatron-core must be installed, the machine must have GPUs, and tp x pp must divide the processes."""
        if cfg.distributed_type not in cls.launch_types:
            return []
        import importlib.util

        from ...config.values import ConfigError  # deferred: config imports this package
        from ...megatron.plugin import EXTRA_HINT, MegatronLMPlugin, settings_from_launch

        if importlib.util.find_spec("megatron") is None or importlib.util.find_spec("megatron.core") is None:
            raise ConfigError(
                "distributed_type",
                "MEGATRON_LM",
                "a back-end installed here",
                path,
                f"megatron-core is not installed; {EXTRA_HINT}",
            )
        if cfg.use_cpu or hw.num_gpus == 0:
            raise ConfigError(
                "distributed_type",
                "MEGATRON_LM",
                "a back-end this machine runs",
                path,
                "Megatron-LM needs CUDA GPUs (megatron-core calls CUDA directly) and this launch has none",
            )
        plugin = MegatronLMPlugin(**settings_from_launch(cfg.extras.get("megatron_lm_config") or {}))
        if cfg.num_processes % (plugin.tp_degree * plugin.pp_degree):
            raise ConfigError(
                "num_processes",
                cfg.num_processes,
                f"a multiple of tp x pp = {plugin.tp_degree * plugin.pp_degree}",
                path,
                "Megatron-LM splits the processes into tensor x pipeline x data-parallel groups",
            )
        return []

    @classmethod
    def launch_env(cls, cfg: Any, num_processes: int | None = None) -> dict[str, str]:
        """``ACCELERATE_USE_MEGATRON_LM=true`` and ``MEGATRON_LM_*`` (the reference's variables) for each rank."""
        if cfg.distributed_type not in cls.launch_types:
            return {}
        from ...megatron.plugin import launch_environment

        return launch_environment(cfg.extras.get("megatron_lm_config") or {})

    @classmethod
    def launch_flags(cls, cfg: Any) -> list[str]:
        """``--use_megatron_lm`` and a ``--megatron_lm_<field>`` per setting of ``megatron_lm_config``."""
        if cfg.distributed_type not in cls.launch_types:
            return []
        from ...megatron.plugin import settings_from_launch

        flags = ["--use_megatron_lm"]
        for name, value in settings_from_launch(cfg.extras.get("megatron_lm_config") or {}).items():
            flags += [f"--megatron_lm_{name}", str(value).lower() if isinstance(value, bool) else str(value)]
        return flags

    @classmethod
    def keeps_distributed_type(cls, several: bool) -> bool:
        return True  # one process runs Megatron too (tp = pp = 1)

    def __init__(self, accelerator: Any) -> None:
        super().__init__(accelerator)
        from ...megatron.checks import check_plugin, require_gpu, require_megatron_core
        from ...megatron.plugin import plugin_from_env
        from ...state import DistributedType

        plugin = getattr(accelerator, "megatron_lm_plugin", None) or plugin_from_env()
        if plugin is None:
            raise ValueError(
                "the Megatron-LM back-end needs a MegatronLMPlugin (Accelerator(megatron_lm_plugin=...))"
            )
        self.plugin = plugin
        others = [
            what
            for what, value in (
                ("deepspeed_plugin", getattr(accelerator, "deepspeed_plugin", None)),
                ("fsdp", getattr(accelerator, "fsdp_options", None)),
                ("parallelism_config", getattr(accelerator, "parallel_layout", None)),
            )
            if value is not None
        ]
        if others:
            raise ValueError(
                f"Megatron-LM spreads the model itself; drop {others[0]} (Megatron-LM runs alone: tp_degree, pp_degree "
                "and the data-parallel rest are its layout)"
            )
        if getattr(accelerator, "conversions", None) or str(accelerator.state.mixed_precision) == "fp8":
            raise ValueError(
                "mixed_precision='fp8' with Megatron-LM needs Transformer Engine's layers, which accel_nb does not "
                "wire; use bf16 (GPUs) or no"
            )
        require_megatron_core()
        require_gpu("Megatron-LM (MegatronLMPlugin)")
        state = accelerator.state
        check_plugin(plugin, str(state.mixed_precision), state.device, state.num_processes)
        if accelerator.compile_options is not None:
            raise ValueError(
                "torch.compile with Megatron-LM is not supported by accel_nb; drop the compile setting"
            )
        if accelerator.gradient_accumulation_steps > 1:
            raise ValueError(
                "gradient_accumulation_steps with Megatron-LM: use MegatronLMPlugin(num_micro_batches=...) (each "
                "step runs that many micro-batches before the optimizer step)"
            )
        state.distributed_type = DistributedType.MEGATRON_LM
        self.engine: Any = None

    # -- prepare and the step -------------------------------------------------------------------------
    def prepare(self, args: tuple[Any, ...], device_placement: list[Any]) -> list[Any]:
        """The reference's Megatron prepare: one engine for the model, its optimizer and scheduler; loaders."""
        from ...megatron.preparing import prepare_megatron

        if any(p is False for p in device_placement):
            raise ValueError(
                "device_placement cannot be customised with Megatron-LM (it places its own model)"
            )
        if self.engine is not None and any(isinstance(a, __import__("torch").nn.Module) for a in args):
            raise ValueError(
                "Megatron-LM prepares one model per Accelerator; this one has prepared its model"
            )
        result = prepare_megatron(self.accelerator, self.plugin, args)
        from ...megatron.engine import MegatronEngine

        for obj in result:
            if isinstance(obj, MegatronEngine):
                self.engine = obj
                self._register_checkpoint_hooks()
        return result

    def data_shards(self) -> tuple[int, int]:
        """The data-parallel ranks split the data; a tensor/pipeline group reads the same batches."""
        from ...megatron.preparing import data_parallel_shards

        return data_parallel_shards()

    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        """Nothing: the engine's forward ran the backward pass and the optimizer step."""

    def no_sync(self, model: torch.nn.Module) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext()

    def clip_grad_norm_(self, parameters: Any, max_norm: float, norm_type: float) -> Any:
        raise ValueError(
            "with Megatron-LM the optimizer clips inside the engine's step: set MegatronLMPlugin(gradient_clipping="
            f"{max_norm}) instead of calling clip_grad_norm_"
        )

    def clip_grad_value_(self, parameters: Any, clip_value: float) -> None:
        raise ValueError("Megatron-LM clips by the global norm only: MegatronLMPlugin(gradient_clipping=...)")

    def gather_for_metrics(self, input_data: Any, use_gather_object: bool) -> Any:
        """Gathered over the data-parallel ranks only (a tensor/pipeline group holds the same samples)."""
        from ...megatron.helpers import gather_for_metrics

        return gather_for_metrics(input_data, use_gather_object, self.accelerator.gradient_state)

    # -- checkpoints ----------------------------------------------------------------------------------
    def needs_every_rank(self) -> str | None:
        return "Megatron-LM (each process holds its tensor/pipeline slice)"

    def _register_checkpoint_hooks(self) -> None:
        """Each slice saves and loads its own file; the engine's entry is taken out of the shared files."""
        engine = self.engine
        acc = self.accelerator

        def index() -> int:
            return next(i for i, m in enumerate(acc.prepared("model")) if m is engine)

        def save(models: list[Any], weights: list[Any], folder: str) -> None:
            engine.save_checkpoint(folder)
            i = index()
            models.pop(i)
            weights.pop(i)

        def load(models: list[Any], folder: str) -> None:
            state = engine.read_checkpoint(
                folder
            )  # a missing slice file fails here, before anything is loaded
            wrappers = [o for o in acc.prepared("optimizer") if getattr(o, "engine", None) is engine]
            if wrappers:  # loaded in load_state's apply phase, with the optimizer's (marker) state
                wrappers[0].pending = state
            else:
                engine.apply_checkpoint(state)
            models.pop(index())

        acc.register_save_state_pre_hook(save)
        acc.register_load_state_pre_hook(load)

    def gathered_weights(self, model: torch.nn.Module) -> dict[str, Any] | None:
        """The engine's whole model in the one-process layout (every rank calls it)."""
        from ...megatron.engine import MegatronEngine

        if isinstance(model, MegatronEngine):
            return model.full_weights()
        return super().gathered_weights(model)
