"""FSDP settings: ``FSDPOptions`` (accel_nb's), the reference's ``FullyShardedDataParallelPlugin``
and the ``fsdp_config`` mapping of a launch config file, all reduced to one ``FSDPOptions``.

Imports nothing heavy (the launch config validates ``fsdp_config`` with it).

    FSDPOptions(auto_wrap_classes=["Block"], state_dict_type="full")
    options_from_config({"fsdp_version": 2, "fsdp_auto_wrap_policy": "SIZE_BASED_WRAP",
                         "fsdp_min_num_params": 1000})
"""

from __future__ import annotations

import json
import os
import warnings
from dataclasses import dataclass, field
from typing import Any

from ..env_names import ENV_FSDP_CONFIG

__all__ = [
    "ENV_FSDP_CONFIG",
    "FSDPOptions",
    "FullyShardedDataParallelPlugin",
    "options_from_config",
    "resolve_fsdp_options",
    "options_from_env",
]


# our spelling -> (reshard_after_forward, mesh layout)
SHARDING_STRATEGIES = ("full", "shard_grad_op", "hybrid", "no_shard")
_REFERENCE_STRATEGIES = {
    "FULL_SHARD": "full",
    "SHARD_GRAD_OP": "shard_grad_op",
    "HYBRID_SHARD": "hybrid",
    "NO_SHARD": "no_shard",
    "1": "full",
    "2": "shard_grad_op",
    "3": "no_shard",
    "4": "hybrid",
}
STATE_DICT_TYPES = ("sharded", "full")
_REFERENCE_STATE_DICT = {"SHARDED_STATE_DICT": "sharded", "FULL_STATE_DICT": "full"}

_warned: set[str] = set()


def _warn_once(key: str, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, UserWarning, stacklevel=4)


def _named_choice(value: Any, own: Any, reference: dict[str, str], error: str) -> str:
    """``value`` (a name or an enum member) as one of ``own``'s lower-case names, or a reference
    upper-case name mapped through ``reference``; ValueError(``error``) otherwise."""
    text = str(getattr(value, "name", value)).strip()
    if text.lower() in own:
        return text.lower()
    if text.upper() in reference:
        return reference[text.upper()]
    raise ValueError(error)


def _strategy(value: Any, option: str) -> str:
    return _named_choice(
        value,
        SHARDING_STRATEGIES,
        _REFERENCE_STRATEGIES,
        f"{option}={value!r} is not a sharding strategy; use one of {', '.join(SHARDING_STRATEGIES)} "
        "(or the reference names FULL_SHARD, SHARD_GRAD_OP, HYBRID_SHARD, NO_SHARD)",
    )


def _state_dict_type(value: Any, option: str) -> str:
    return _named_choice(
        value,
        STATE_DICT_TYPES,
        _REFERENCE_STATE_DICT,
        f"{option}={value!r} is not supported; use 'sharded' (SHARDED_STATE_DICT: each rank saves its shards "
        "with torch.distributed.checkpoint) or 'full' (FULL_STATE_DICT: gathered on the main process)",
    )


def _class_names(value: Any, option: str) -> list[str]:
    if value is None:
        return []
    items = value.split(",") if isinstance(value, str) else list(value)
    names = []
    for item in items:
        name = item.__name__ if isinstance(item, type) else str(item).strip()
        if not name:
            continue
        if not name.isidentifier():
            raise ValueError(f"{option}: {item!r} is not a class name (e.g. 'GPT2Block')")
        names.append(name)
    return names


@dataclass
class FSDPOptions:
    """How ``prepare`` shards a model with torch's ``fully_shard`` (FSDP2) over the processes.

        accelerator = Accelerator(mixed_precision="bf16",
                                  fsdp=FSDPOptions(auto_wrap_classes=["GPT2Block"], activation_checkpointing=True))

    - ``sharding_strategy``: ``full`` (parameters, gradients and optimizer state sharded; parameters
      freed again after forward), ``shard_grad_op`` (kept gathered from forward to backward),
      ``hybrid`` (sharded within a machine, replicated across machines), ``no_shard`` (replicated
      everywhere, like DDP).
    - ``auto_wrap_classes``: class names (or classes) whose instances are sharded as one unit each;
      ``min_num_params``: also shard each submodule holding at least that many parameters of its own.
    - ``cpu_offload``: keep parameters, gradients and optimizer state on the CPU (GPU runs only).
    - ``activation_checkpointing``: recompute the activations of these classes in backward
      (``True``: the ``auto_wrap_classes``).
    - ``state_dict_type``: what ``save_state`` writes: ``sharded`` (each rank its shards, with
      torch.distributed.checkpoint) or ``full`` (gathered on the main process).
    - ``reshard_after_forward``: overrides the strategy's choice.

    Mixed precision follows the Accelerator's ``mixed_precision`` (parameters in bf16/fp16,
    gradients reduced in fp32).
    """

    sharding_strategy: str = "full"
    auto_wrap_classes: list[Any] = field(default_factory=list)
    min_num_params: int | None = None
    cpu_offload: bool = False
    activation_checkpointing: bool | list[Any] = False
    state_dict_type: str = "sharded"
    reshard_after_forward: bool | None = None

    def __post_init__(self) -> None:
        self.sharding_strategy = _strategy(self.sharding_strategy, "sharding_strategy")
        self.state_dict_type = _state_dict_type(self.state_dict_type, "state_dict_type")
        self.auto_wrap_classes = _class_names(self.auto_wrap_classes, "auto_wrap_classes")
        if self.min_num_params is not None:
            if isinstance(self.min_num_params, bool) or int(self.min_num_params) < 1:
                raise ValueError(
                    f"min_num_params={self.min_num_params!r} must be a whole number >= 1 (or None)"
                )
            self.min_num_params = int(self.min_num_params)
        if not isinstance(self.cpu_offload, bool):
            raise ValueError(f"cpu_offload={self.cpu_offload!r} must be True or False")
        if isinstance(self.activation_checkpointing, bool):
            if self.activation_checkpointing and not self.auto_wrap_classes:
                raise ValueError(
                    "activation_checkpointing=True checkpoints the auto_wrap_classes, but none are given; pass "
                    "auto_wrap_classes=[...] or activation_checkpointing=['BlockClassName']"
                )
        else:
            self.activation_checkpointing = _class_names(
                self.activation_checkpointing, "activation_checkpointing"
            )
        if self.reshard_after_forward is not None and not isinstance(self.reshard_after_forward, bool):
            raise ValueError(
                f"reshard_after_forward={self.reshard_after_forward!r} must be True, False or None"
            )

    @property
    def checkpointed_classes(self) -> list[str]:
        """The class names whose activations are recomputed in backward."""
        if self.activation_checkpointing is True:
            return list(self.auto_wrap_classes)
        return list(self.activation_checkpointing or [])

    @property
    def reshards_after_forward(self) -> bool:
        """Whether parameters are freed after each forward (False for shard_grad_op and no_shard)."""
        if self.reshard_after_forward is not None:
            return self.reshard_after_forward
        return self.sharding_strategy in ("full", "hybrid")


# fields of the reference plugin that only its FSDP1 path uses: FSDP2 has nothing to apply them to
_FSDP1_ONLY = {
    "backward_prefetch": None,
    "forward_prefetch": False,
    "limit_all_gathers": True,
    "use_orig_params": None,
    "sync_module_states": None,
}
# fields accel_nb does not implement: anything but the default is an error
_NOT_SUPPORTED = {
    "ignored_modules": None,
    "param_init_fn": None,
    "activation_checkpointing_offload": False,
    "state_dict_config": None,
    "optim_state_dict_config": None,
    "mixed_precision_policy": None,
}


@dataclass
class FullyShardedDataParallelPlugin:
    """The reference library's FSDP settings object, for scripts moving over; read as FSDP2.

        accelerator = Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin(
            fsdp_version=2, auto_wrap_policy="transformer_based_wrap", transformer_cls_names_to_wrap=["Block"]))

    Honoured: ``fsdp_version``, ``sharding_strategy``, ``reshard_after_forward``, ``auto_wrap_policy``
    (``transformer_based_wrap``, ``size_based_wrap``, ``no_wrap``), ``transformer_cls_names_to_wrap``,
    ``min_num_params``, ``cpu_offload``, ``activation_checkpointing``, ``state_dict_type``.
    FSDP1-only fields warn once; the others are refused unless left at their defaults.
    """

    fsdp_version: int = 2
    sharding_strategy: Any = None
    reshard_after_forward: Any = None
    backward_prefetch: Any = None
    mixed_precision_policy: Any = None
    auto_wrap_policy: Any = None
    cpu_offload: Any = False
    ignored_modules: Any = None
    state_dict_type: Any = "SHARDED_STATE_DICT"
    state_dict_config: Any = None
    optim_state_dict_config: Any = None
    limit_all_gathers: bool = True
    use_orig_params: Any = None
    param_init_fn: Any = None
    sync_module_states: Any = None
    forward_prefetch: bool = False
    activation_checkpointing: bool = False
    activation_checkpointing_offload: bool = False
    cpu_ram_efficient_loading: bool = False
    transformer_cls_names_to_wrap: Any = None
    min_num_params: int | None = None

    def to_options(self) -> FSDPOptions:
        """The ``FSDPOptions`` these fields mean; a clear error for a field accel_nb would ignore."""
        for name, default in _NOT_SUPPORTED.items():
            if getattr(self, name) not in (default, None):
                fix = (
                    " (the Accelerator's mixed_precision sets it)" if name == "mixed_precision_policy" else ""
                )
                raise ValueError(
                    f"FullyShardedDataParallelPlugin({name}=...) is not supported by accel_nb{fix}"
                )
        for name, default in _FSDP1_ONLY.items():
            if getattr(self, name) not in (default, None):
                _warn_once(
                    name,
                    f"FullyShardedDataParallelPlugin({name}=...) applies to FSDP1 only; accel_nb runs "
                    "FSDP2 (fully_shard), which has no such setting: it is ignored",
                )
        if self.cpu_ram_efficient_loading:
            _warn_once(
                "cpu_ram_efficient_loading",
                "cpu_ram_efficient_loading=True is not applied by accel_nb: every "
                "process builds the whole model, and fully_shard then frees what each process does not own",
            )
        version = int(self.fsdp_version or 2)
        if version not in (1, 2):
            raise ValueError(f"fsdp_version={self.fsdp_version!r} must be 1 or 2")
        if version == 1:
            _warn_once(
                "fsdp_version",
                "fsdp_version=1: accel_nb runs FSDP2 (torch's fully_shard) for it; sharding "
                "strategy, wrapping and state dict type keep their meaning",
            )
        strategy = (
            "full"
            if self.sharding_strategy is None
            else _strategy(self.sharding_strategy, "sharding_strategy")
        )
        reshard = self.reshard_after_forward
        if isinstance(reshard, str) and reshard.strip().lower() not in ("true", "false"):
            # a strategy name (v1 files)
            strategy, reshard = _strategy(reshard, "reshard_after_forward"), None
        elif isinstance(reshard, str):
            reshard = reshard.strip().lower() == "true"
        policy = self.auto_wrap_policy
        if callable(policy):
            raise ValueError(
                "FullyShardedDataParallelPlugin(auto_wrap_policy=<callable>) is not supported; use "
                "'transformer_based_wrap' with transformer_cls_names_to_wrap, or 'size_based_wrap'"
            )
        policy = str(policy or "no_wrap").strip().lower()
        if policy not in ("transformer_based_wrap", "size_based_wrap", "no_wrap"):
            raise ValueError(
                f"auto_wrap_policy={self.auto_wrap_policy!r}: use transformer_based_wrap, "
                "size_based_wrap or no_wrap"
            )
        classes = _class_names(self.transformer_cls_names_to_wrap, "transformer_cls_names_to_wrap")
        if policy == "transformer_based_wrap" and not classes:
            raise ValueError(
                "auto_wrap_policy='transformer_based_wrap' needs transformer_cls_names_to_wrap "
                "(the block class names, e.g. ['GPT2Block']); accel_nb cannot read them from the model"
            )
        if policy == "size_based_wrap" and not self.min_num_params:
            raise ValueError("auto_wrap_policy='size_based_wrap' needs min_num_params (e.g. 100000000)")
        checkpointing: bool | list[str] = False
        if self.activation_checkpointing:
            if not classes:
                raise ValueError(
                    "activation_checkpointing=True needs transformer_cls_names_to_wrap: accel_nb "
                    "checkpoints the blocks of those classes"
                )
            checkpointing = True if policy == "transformer_based_wrap" else classes
        return FSDPOptions(
            sharding_strategy=strategy,
            auto_wrap_classes=classes if policy == "transformer_based_wrap" else [],
            min_num_params=self.min_num_params if policy == "size_based_wrap" else None,
            cpu_offload=bool(self.cpu_offload),
            activation_checkpointing=checkpointing,
            state_dict_type=_state_dict_type(self.state_dict_type, "state_dict_type"),
            reshard_after_forward=reshard if isinstance(reshard, bool) else None,
        )


def _as_bool(value: Any, key: str) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "yes", "1"):
        return True
    if text in ("false", "no", "0", "none", ""):
        return False
    raise ValueError(f"fsdp_config.{key}={value!r} must be true or false")


def options_from_config(config: dict[str, Any] | None) -> FSDPOptions:
    """The ``FSDPOptions`` of a launch config's ``fsdp_config`` mapping (the reference's ``fsdp_*`` keys).

    Example:
        options_from_config({"fsdp_version": 2, "fsdp_state_dict_type": "FULL_STATE_DICT"}).state_dict_type  # 'full'
    """
    config = dict(config or {})
    plugin: dict[str, Any] = {}
    simple = {
        "fsdp_version": "fsdp_version",
        "fsdp_sharding_strategy": "sharding_strategy",
        "fsdp_reshard_after_forward": "reshard_after_forward",
        "fsdp_auto_wrap_policy": "auto_wrap_policy",
        "fsdp_state_dict_type": "state_dict_type",
        "fsdp_backward_prefetch": "backward_prefetch",
        "fsdp_transformer_layer_cls_to_wrap": "transformer_cls_names_to_wrap",
        "fsdp_ignored_modules": "ignored_modules",  # null is the only value accel_nb takes (to_options says so)
    }
    flags = {
        "fsdp_offload_params": "cpu_offload",
        "fsdp_activation_checkpointing": "activation_checkpointing",
        "fsdp_forward_prefetch": "forward_prefetch",
        "fsdp_use_orig_params": "use_orig_params",
        "fsdp_sync_module_states": "sync_module_states",
        "fsdp_cpu_ram_efficient_loading": "cpu_ram_efficient_loading",
    }
    for key, value in config.items():
        if key in simple:
            plugin[simple[key]] = value
        elif key in flags:
            plugin[flags[key]] = _as_bool(value, key)
        elif key == "fsdp_min_num_params":
            plugin["min_num_params"] = int(value)
        else:
            raise ValueError(
                f"fsdp_config.{key} is not a key accel_nb knows; use the fsdp_* keys of docs/configuration.md"
            )
    if plugin.get("use_orig_params") is True:
        plugin["use_orig_params"] = None  # FSDP2 always keeps the original parameters
    if plugin.get("sync_module_states") is False:
        plugin["sync_module_states"] = None
    if plugin.get("auto_wrap_policy") is None and plugin.get("transformer_cls_names_to_wrap"):
        plugin["auto_wrap_policy"] = "transformer_based_wrap"
    return FullyShardedDataParallelPlugin(**plugin).to_options()


def options_from_env() -> FSDPOptions | None:
    """The ``FSDPOptions`` the launcher passed to this rank (``accel-nb launch`` with ``distributed_type: FSDP``)."""
    raw = os.environ.get(ENV_FSDP_CONFIG)
    if not raw:
        return None
    return options_from_config(json.loads(raw))


def resolve_fsdp_options(
    fsdp: Any, fsdp_plugin: Any, num_processes: int, on_xla: bool = False
) -> FSDPOptions | None:
    """The FSDP settings of an Accelerator: ``fsdp=``, ``fsdp_plugin=`` or the launcher's config; None without FSDP.

    Example:
        resolve_fsdp_options(FSDPOptions(), None, num_processes=2)     # FSDPOptions(...)
    """
    if fsdp is not None and fsdp_plugin is not None:
        raise ValueError(
            "pass either fsdp=FSDPOptions(...) or fsdp_plugin=FullyShardedDataParallelPlugin(...), not both"
        )
    if fsdp_plugin is not None:
        if not isinstance(fsdp_plugin, FullyShardedDataParallelPlugin):
            raise TypeError(
                f"fsdp_plugin must be a FullyShardedDataParallelPlugin, got {type(fsdp_plugin).__name__}"
            )
        fsdp = fsdp_plugin.to_options()
    elif fsdp is True:
        fsdp = FSDPOptions()
    elif fsdp is None or fsdp is False:
        fsdp = options_from_env()
    if fsdp is None:
        return None
    if not isinstance(fsdp, FSDPOptions):
        raise TypeError(f"fsdp= takes FSDPOptions(...) (or True for the defaults), got {type(fsdp).__name__}")
    if on_xla:
        raise ValueError(
            "FSDP (fsdp=/fsdp_plugin=/distributed_type: FSDP) is not supported on XLA devices (TPU cores): "
            "accel_nb shards with torch's fully_shard, which does not run on torch_xla; train without "
            "FSDP there (every core keeps the whole model), or use GPUs for sharded training"
        )
    if num_processes < 2:
        raise ValueError(
            "fsdp= shards the model over several processes but this run has 1; launch 2 or more "
            "(notebook_launcher(fn, num_processes=2), accel-nb launch --num_processes 2) or leave fsdp unset"
        )
    return fsdp
