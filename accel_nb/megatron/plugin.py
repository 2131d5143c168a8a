"""``MegatronLMPlugin``: the reference's Megatron-LM settings, run on megatron-core (docs/megatron.md).

Imports nothing heavy: the launch config checks its ``megatron_lm_config`` with it, and each rank builds it
back from the environment the launcher sets (``MEGATRON_LM_*``, the reference's names).

    plugin = MegatronLMPlugin(tp_degree=2, pp_degree=2, num_micro_batches=2, gradient_clipping=1.0)
    accelerator = Accelerator(megatron_lm_plugin=plugin)
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

__all__ = [
    "ENV_PREFIX",
    "EXTRA_HINT",
    "LAUNCH_FIELDS",
    "MegatronLMDummyScheduler",
    "MegatronLMPlugin",
    "launch_environment",
    "plugin_from_env",
    "resolve_megatron_plugin",
    "settings_from_launch",
]

EXTRA_HINT = "install megatron-core with `pip install 'accel_nb[megatron]'`"
ENV_PREFIX = "MEGATRON_LM_"  # the reference's prefix: MEGATRON_LM_TP_DEGREE, ...
REFERENCE_USE_MEGATRON_LM = "ACCELERATE_USE_MEGATRON_LM"  # "true": the launch asks for Megatron-LM

# the fields a launch (config file or --megatron_lm_* flags) sets, with their type: the reference's set
LAUNCH_FIELDS: dict[str, type] = {
    "tp_degree": int,
    "pp_degree": int,
    "num_micro_batches": int,
    "gradient_clipping": float,
    "sequence_parallelism": bool,
    "recompute_activations": bool,
    "use_distributed_optimizer": bool,
    "recompute_granularity": str,
    "recompute_method": str,
    "recompute_num_layers": int,
    "use_custom_fsdp": bool,
    "no_load_optim": bool,
    "no_save_optim": bool,
    "eod_mask_loss": bool,
    "optimizer_cpu_offload": bool,
    "overlap_cpu_optimizer_d2h_h2d": bool,
    "use_precision_aware_optimizer": bool,
    "decoder_last_pipeline_num_layers": int,
    "attention_backend": bool,
    "expert_model_parallel_size": int,
    "expert_tensor_parallel_size": int,
    "context_parallel_size": int,
    "attention_dropout": float,
    "hidden_dropout": float,
    "attention_softmax_in_fp32": bool,
    "calculate_per_token_loss": bool,
    "use_rotary_position_embeddings": bool,
}

# the value a launch field takes when neither the argument nor the environment gives one
_DEFAULTS: dict[str, Any] = {
    "tp_degree": 1,
    "pp_degree": 1,
    "num_micro_batches": 1,
    "gradient_clipping": 1.0,
    "sequence_parallelism": False,
    "recompute_activations": False,
    "use_distributed_optimizer": False,
    "use_custom_fsdp": False,
    "no_load_optim": False,
    "no_save_optim": False,
    "eod_mask_loss": False,
    "optimizer_cpu_offload": False,
    "overlap_cpu_optimizer_d2h_h2d": False,
    "use_precision_aware_optimizer": False,
    "attention_backend": True,
    "expert_model_parallel_size": 1,
    "expert_tensor_parallel_size": 1,
    "context_parallel_size": 1,
    "attention_dropout": 0.0,
    "hidden_dropout": 0.0,
    "attention_softmax_in_fp32": True,
    "calculate_per_token_loss": True,
}


def _parse(name: str, kind: type, raw: str) -> Any:
    if kind is bool:
        text = raw.strip().lower()
        if text in ("1", "true", "yes", "on"):
            return True
        if text in ("0", "false", "no", "off"):
            return False
        raise ValueError(f"{ENV_PREFIX}{name.upper()}={raw!r} is not a boolean; use true or false")
    try:
        return kind(raw)
    except ValueError:
        what = {int: "a whole number", float: "a number"}.get(kind, kind.__name__)
        raise ValueError(f"{ENV_PREFIX}{name.upper()}={raw!r} is not {what}") from None


@dataclass
class MegatronLMPlugin:
    """Megatron-LM's tensor, pipeline and data parallelism for ``Accelerator.prepare``, on megatron-core.

    The reference's fields and meanings: ``tp_degree``/``pp_degree`` (the data-parallel degree is what is
    left of the processes), ``num_micro_batches`` (each loader batch is cut into this many micro-batches for
    the pipeline), ``gradient_clipping`` (global L2 norm, 0 turns it off), the recompute, dropout and
    attention settings, the scheduler's fields (used with ``MegatronLMDummyScheduler``) and the custom
    functions (model provider, batch, loss, train step). A field left ``None`` comes from the launch's
    ``MEGATRON_LM_*`` environment, else its default. Settings accel_nb does not run are refused with the
    reason when the Accelerator starts (docs/megatron.md lists them).

        MegatronLMPlugin(tp_degree=2, pp_degree=1, num_micro_batches=1, gradient_clipping=0.0)
    """

    tp_degree: int | None = None
    pp_degree: int | None = None
    num_micro_batches: int | None = None
    gradient_clipping: float | None = None
    sequence_parallelism: bool | None = None
    recompute_activations: bool | None = None
    use_distributed_optimizer: bool | None = None
    recompute_granularity: str | None = None
    recompute_method: str | None = None
    recompute_num_layers: int | None = None
    use_custom_fsdp: bool | None = None
    overlap_cpu_optimizer_d2h_h2d: bool | None = None
    no_load_optim: bool | None = None
    eod_mask_loss: bool | None = None
    no_save_optim: bool | None = None
    optimizer_cpu_offload: bool | None = None
    use_precision_aware_optimizer: bool | None = None
    decoder_last_pipeline_num_layers: int | None = None
    attention_backend: bool | None = None
    expert_model_parallel_size: int | None = None
    context_parallel_size: int | None = None
    attention_dropout: float | None = None
    hidden_dropout: float | None = None
    attention_softmax_in_fp32: bool | None = None
    expert_tensor_parallel_size: int | None = None
    calculate_per_token_loss: bool | None = None
    use_rotary_position_embeddings: bool | None = None
    pipeline_model_parallel_split_rank: int | None = None
    num_layers_per_virtual_pipeline_stage: int | None = None
    is_train_batch_min: bool = True
    train_iters: int | None = None
    train_samples: int | None = None
    weight_decay_incr_style: str = "constant"
    start_weight_decay: float | None = None
    end_weight_decay: float | None = None
    lr_decay_style: str = "linear"
    lr_decay_iters: int | None = None
    lr_decay_samples: int | None = None
    lr_warmup_iters: int | None = None
    lr_warmup_samples: int | None = None
    lr_warmup_fraction: float | None = None
    min_lr: float = 0.0
    consumed_samples: list[int] | None = None
    no_wd_decay_cond: Callable[..., Any] | None = None
    scale_lr_cond: Callable[..., Any] | None = None
    lr_mult: float = 1.0
    megatron_dataset_flag: bool = False
    seq_length: int | None = None
    encoder_seq_length: int | None = None
    decoder_seq_length: int | None = None
    tensorboard_dir: str | None = None
    set_all_logging_options: bool = False
    eval_iters: int = 100
    eval_interval: int = 1000
    return_logits: bool = False
    custom_train_step_class: Any = None
    custom_train_step_kwargs: dict[str, Any] | None = None
    custom_model_provider_function: Callable[..., Any] | None = None
    custom_prepare_model_function: Callable[..., Any] | None = None
    custom_megatron_datasets_provider_function: Callable[..., Any] | None = None
    custom_get_batch_function: Callable[..., Any] | None = None
    custom_loss_function: Callable[..., Any] | None = None
    other_megatron_args: dict[str, Any] | None = None
    # set by prepare (the reference's set_training_args): not arguments
    micro_batch_size: int | None = field(default=None, init=False)
    data_parallel_size: int | None = field(default=None, init=False)
    global_batch_size: int | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        for name, kind in LAUNCH_FIELDS.items():
            if getattr(self, name) is not None:
                continue
            raw = os.environ.get(ENV_PREFIX + name.upper())
            setattr(self, name, _parse(name, kind, raw) if raw not in (None, "") else _DEFAULTS.get(name))
        for name in ("tp_degree", "pp_degree", "num_micro_batches"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"MegatronLMPlugin({name}={value!r}): a whole number of at least 1")
        if float(self.gradient_clipping) < 0:
            raise ValueError(
                f"MegatronLMPlugin(gradient_clipping={self.gradient_clipping!r}): at least 0 (0 turns clipping off)"
            )

    def set_training_args(self, micro_batch_size: int, dp_degree: int) -> None:
        """Record the batch sizes prepare found: the global batch is dp x micro-batch x micro-batches."""
        self.data_parallel_size = dp_degree
        self.micro_batch_size = micro_batch_size
        self.global_batch_size = dp_degree * micro_batch_size * self.num_micro_batches

    def launch_settings(self) -> dict[str, Any]:
        """The launch fields that differ from their defaults (what a config file or flags would carry)."""
        return {
            name: getattr(self, name)
            for name in LAUNCH_FIELDS
            if getattr(self, name) is not None and getattr(self, name) != _DEFAULTS.get(name)
        }


class MegatronLMDummyScheduler:
    """Stands for Megatron's own LR/weight-decay scheduler in ``prepare`` (the reference's class).

    scheduler = MegatronLMDummyScheduler(optimizer, total_num_steps=1000, warmup_num_steps=100)
    """

    def __init__(
        self, optimizer: Any, total_num_steps: int | None = None, warmup_num_steps: int = 0, **kwargs: Any
    ):
        self.optimizer = optimizer
        self.total_num_steps = total_num_steps
        self.warmup_num_steps = warmup_num_steps
        self.kwargs = kwargs


def settings_from_launch(config: dict[str, Any]) -> dict[str, Any]:
    """A launch config's ``megatron_lm_config`` (the reference's ``megatron_lm_<field>`` keys) as plugin fields."""
    if not isinstance(config, dict):
        raise TypeError(
            f"megatron_lm_config must be a mapping such as {{megatron_lm_tp_degree: 2}}, got {config!r}"
        )
    settings: dict[str, Any] = {}
    for key, value in config.items():
        name = key[len("megatron_lm_") :] if key.startswith("megatron_lm_") else key
        if name not in LAUNCH_FIELDS:
            raise ValueError(
                f"megatron_lm_config has {key!r}, which a launch does not set; the keys are megatron_lm_ + one of "
                f"{', '.join(LAUNCH_FIELDS)}"
            )
        if value is None:
            continue
        kind = LAUNCH_FIELDS[name]
        settings[name] = (
            _parse(name, kind, str(value)) if isinstance(value, str) or kind is bool else kind(value)
        )
    return settings


def launch_environment(config: dict[str, Any]) -> dict[str, str]:
    """The environment a launch gives each rank for ``megatron_lm_config`` (the reference's variables)."""
    env = {REFERENCE_USE_MEGATRON_LM: "true"}
    for name, value in settings_from_launch(config).items():
        env[ENV_PREFIX + name.upper()] = str(value).lower() if isinstance(value, bool) else str(value)
    return env


def plugin_from_env() -> MegatronLMPlugin | None:
    """The launch's plugin (``ACCELERATE_USE_MEGATRON_LM=true`` and ``MEGATRON_LM_*``), None when not asked for."""
    if os.environ.get(REFERENCE_USE_MEGATRON_LM, "").strip().lower() not in ("1", "true", "yes"):
        return None
    return MegatronLMPlugin()


def resolve_megatron_plugin(plugin: Any) -> MegatronLMPlugin | None:
    """``Accelerator(megatron_lm_plugin=...)``: a plugin, the reference's plugin object, or None (the launch decides)."""
    if plugin is None:
        return plugin_from_env()
    if isinstance(plugin, MegatronLMPlugin):
        return plugin
    if type(plugin).__name__ == "MegatronLMPlugin":  # the reference's: its fields carried over by name
        names = {f.name for f in fields(MegatronLMPlugin) if f.init}
        return MegatronLMPlugin(**{n: getattr(plugin, n) for n in names if hasattr(plugin, n)})
    raise TypeError(f"megatron_lm_plugin must be a MegatronLMPlugin, got {type(plugin).__name__}")
