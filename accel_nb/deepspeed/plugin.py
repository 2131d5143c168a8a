"""``DeepSpeedPlugin``: a DeepSpeed config (dict or JSON file) plus the reference's shortcut fields.

Imports nothing heavy: the launch config validates ``deepspeed_config`` with it, and each rank
reads the launch config's settings back from the environment (``plugin_from_env``).

    plugin = DeepSpeedPlugin(zero_stage=3, gradient_clipping=1.0)
    plugin = DeepSpeedPlugin(hf_ds_config="ds_config.json")
"""

from __future__ import annotations

import copy
import json
import os
from dataclasses import dataclass
from typing import Any

from ..counts import is_count
from ..env_names import ENV_DEEPSPEED_CONFIG, REFERENCE_USE_DEEPSPEED

__all__ = [
    "DeepSpeedPlugin",
    "ENV_DEEPSPEED_CONFIG",
    "plugin_from_env",
    "resolve_deepspeed_plugin",
    "plugin_from_launch_settings",
    "EXTRA_HINT",
]

EXTRA_HINT = "install it with `pip install 'accel_nb[deepspeed]'` (DS_BUILD_OPS=0 skips compiling its ops)"

OFFLOAD_DEVICES = ("none", "cpu", "nvme")
AUTO = "auto"
# the reference's plugin field -> the dotted key of the DeepSpeed config it stands for
FIELD_KEYS = {
    "gradient_accumulation_steps": "gradient_accumulation_steps",
    "gradient_clipping": "gradient_clipping",
    "zero_stage": "zero_optimization.stage",
    "offload_optimizer_device": "zero_optimization.offload_optimizer.device",
    "offload_param_device": "zero_optimization.offload_param.device",
    "offload_optimizer_nvme_path": "zero_optimization.offload_optimizer.nvme_path",
    "offload_param_nvme_path": "zero_optimization.offload_param.nvme_path",
    "zero3_save_16bit_model": "zero_optimization.stage3_gather_16bit_weights_on_model_save",
}
# the launch config's deepspeed_config keys (the reference's YAML spelling) -> plugin fields
LAUNCH_KEYS = {
    "deepspeed_config_file": "hf_ds_config",
    "zero_stage": "zero_stage",
    "gradient_accumulation_steps": "gradient_accumulation_steps",
    "gradient_clipping": "gradient_clipping",
    "offload_optimizer_device": "offload_optimizer_device",
    "offload_param_device": "offload_param_device",
    "offload_optimizer_nvme_path": "offload_optimizer_nvme_path",
    "offload_param_nvme_path": "offload_param_nvme_path",
    "zero3_init_flag": "zero3_init_flag",
    "zero3_save_16bit_model": "zero3_save_16bit_model",
}
# keys of the reference's deepspeed_config that need a multi-machine DeepSpeed launcher accel_nb does not run
LAUNCH_KEYS_IGNORED = (
    "deepspeed_multinode_launcher",
    "deepspeed_hostfile",
    "deepspeed_exclusion_filter",
    "deepspeed_inclusion_filter",
    "deepspeed_moe_layer_cls_names",
)


def get_value(config: dict[str, Any], dotted: str, default: Any = None) -> Any:
    """``config["a"]["b"]`` for ``"a.b"``; ``default`` when a part is missing."""
    node: Any = config
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    return node


def set_value(config: dict[str, Any], dotted: str, value: Any) -> None:
    """Set ``config["a"]["b"] = value`` for ``"a.b"``, creating the mappings on the way."""
    *parents, last = dotted.split(".")
    node = config
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value


def _read_config(source: Any) -> dict[str, Any]:
    if isinstance(source, dict):
        return copy.deepcopy(source)
    if hasattr(source, "config") and isinstance(source.config, dict):  # the reference's HfDeepSpeedConfig
        return copy.deepcopy(source.config)
    if isinstance(source, (str, os.PathLike)):
        path = os.fspath(source)
        if not os.path.isfile(path):
            raise ValueError(
                f"DeepSpeed config file {path!r} does not exist; pass a JSON file path or a dict"
            )
        try:
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
        except json.JSONDecodeError as exc:
            raise ValueError(f"DeepSpeed config file {path} is not valid JSON: {exc}") from None
        if not isinstance(data, dict):
            raise ValueError(
                f"DeepSpeed config file {path} must hold a JSON object, not {type(data).__name__}"
            )
        return data
    raise ValueError(
        f"hf_ds_config={source!r} is not a DeepSpeed config: pass a dict or the path of a JSON file"
    )


def _env(name: str, default: str | None = None) -> str | None:
    value = os.environ.get(name)
    return value if value not in (None, "") else default


@dataclass
class DeepSpeedPlugin:
    """DeepSpeed ZeRO settings for ``Accelerator(deepspeed_plugin=...)`` (the reference's fields and meanings).

        accelerator = Accelerator(deepspeed_plugin=DeepSpeedPlugin(zero_stage=2, gradient_clipping=1.0))
        accelerator = Accelerator(deepspeed_plugin=DeepSpeedPlugin(hf_ds_config="ds_config.json"))

    - ``hf_ds_config``: a DeepSpeed config (dict or JSON path); its ``"auto"`` values are filled at
      ``prepare`` from the Accelerator (mixed precision, accumulation) and the prepared objects
      (the loader's batch size, the optimizer's learning rate, ``model.config.hidden_size``).
      Without it the config is built from the fields below.
    - ``zero_stage`` (0-3, default 2), ``gradient_accumulation_steps``, ``gradient_clipping``,
      ``offload_optimizer_device`` / ``offload_param_device`` (``none``, ``cpu``, ``nvme``; parameters
      only with stage 3) and their ``*_nvme_path``, ``zero3_init_flag`` (build the model under
      ``deepspeed.zero.Init`` so no rank holds it whole; stage 3 only), ``zero3_save_16bit_model``
      (``save_model``/``get_state_dict`` gather the stage-3 shards).

    Unset fields take the reference's ``ACCELERATE_DEEPSPEED_*`` environment variables, then its defaults
    (``gradient_accumulation_steps`` unset: the Accelerator's).
    """

    hf_ds_config: Any = None
    gradient_accumulation_steps: Any = None
    gradient_clipping: Any = None
    zero_stage: Any = None
    is_train_batch_min: bool = True
    offload_optimizer_device: Any = None
    offload_param_device: Any = None
    offload_optimizer_nvme_path: Any = None
    offload_param_nvme_path: Any = None
    zero3_init_flag: Any = None
    zero3_save_16bit_model: Any = None
    transformer_moe_cls_names: Any = None
    enable_msamp: Any = None
    msamp_opt_level: Any = None

    def __post_init__(self) -> None:
        if self.enable_msamp or self.transformer_moe_cls_names:
            name = "enable_msamp" if self.enable_msamp else "transformer_moe_cls_names"
            raise ValueError(
                f"DeepSpeedPlugin({name}=...) is not supported by accel_nb (MS-AMP and MoE leaf modules)"
            )
        if self.hf_ds_config is None:
            self.hf_ds_config = _env("ACCELERATE_DEEPSPEED_CONFIG_FILE")
        from_file = self.hf_ds_config is not None and self.hf_ds_config != "none"
        self._read_fields_from_env(from_file)
        if from_file:
            self.deepspeed_config = _read_config(self.hf_ds_config)
            if not isinstance(self.deepspeed_config.get("zero_optimization"), dict):
                raise ValueError(
                    "the DeepSpeed config has no zero_optimization section; add "
                    '"zero_optimization": {"stage": 2} (or the stage you want) to it'
                )
            self.deepspeed_config.setdefault("gradient_accumulation_steps", 1)
            for name, key in FIELD_KEYS.items():  # a field given in code fills an "auto" of the file
                value = getattr(self, name)
                if value is not None and get_value(self.deepspeed_config, key) == AUTO:
                    set_value(self.deepspeed_config, key, value)
            for name, key in FIELD_KEYS.items():  # the file's concrete values become the fields
                value = get_value(self.deepspeed_config, key)
                if value is not None and value != AUTO:
                    setattr(self, name, value)
        else:
            self.deepspeed_config = self._config_from_fields()
        self.deepspeed_config.setdefault("steps_per_print", 2**62)  # DeepSpeed stays quiet on stdout
        self.zero_stage = int(get_value(self.deepspeed_config, "zero_optimization.stage", 0))
        self.offload_optimizer_device = str(
            get_value(self.deepspeed_config, FIELD_KEYS["offload_optimizer_device"], "none")
        ).lower()
        self.offload_param_device = str(
            get_value(self.deepspeed_config, FIELD_KEYS["offload_param_device"], "none")
        ).lower()
        if self.zero3_init_flag is None:
            flag = _env("ACCELERATE_DEEPSPEED_ZERO3_INIT")
            self.zero3_init_flag = (
                self.zero_stage == 3 if flag is None else flag.lower() in ("1", "true", "yes")
            )
        self.validate()

    def _read_fields_from_env(self, from_file: bool) -> None:
        # filled from the Accelerator's (which reads the launcher's)
        if self.gradient_accumulation_steps is None:
            self.gradient_accumulation_steps = AUTO
        if self.gradient_clipping is None:
            clip = _env("ACCELERATE_GRADIENT_CLIPPING", AUTO)
            self.gradient_clipping = clip if clip == AUTO else float(clip)
        if from_file:  # the file decides the rest
            return
        if self.zero_stage is None:
            self.zero_stage = int(_env("ACCELERATE_DEEPSPEED_ZERO_STAGE", "2"))
        if self.offload_optimizer_device is None:
            self.offload_optimizer_device = _env("ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE", "none")
        if self.offload_param_device is None:
            self.offload_param_device = _env("ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_DEVICE", "none")
        if self.offload_optimizer_nvme_path is None:
            self.offload_optimizer_nvme_path = _env(
                "ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_NVME_PATH", "none"
            )
        if self.offload_param_nvme_path is None:
            self.offload_param_nvme_path = _env("ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_NVME_PATH", "none")
        if self.zero3_save_16bit_model is None:
            self.zero3_save_16bit_model = (
                _env("ACCELERATE_DEEPSPEED_ZERO3_SAVE_16BIT_MODEL", "false").lower() == "true"
            )

    def _config_from_fields(self) -> dict[str, Any]:
        zero: dict[str, Any] = {
            "stage": self.zero_stage,
            "stage3_gather_16bit_weights_on_model_save": bool(self.zero3_save_16bit_model),
        }
        for kind in ("optimizer", "param"):
            device = str(getattr(self, f"offload_{kind}_device") or "none").lower()
            if device != "none":
                entry: dict[str, Any] = {"device": device}
                if device == "nvme":
                    entry["nvme_path"] = getattr(self, f"offload_{kind}_nvme_path")
                zero[f"offload_{kind}"] = entry
        config: dict[str, Any] = {
            "train_batch_size": AUTO,
            "train_micro_batch_size_per_gpu": AUTO,
            "gradient_accumulation_steps": self.gradient_accumulation_steps,
            "zero_optimization": zero,
        }
        if self.gradient_clipping not in (None, 0, 0.0):
            config["gradient_clipping"] = self.gradient_clipping
        return config

    def validate(self) -> None:
        """Refuse what DeepSpeed would refuse later (or silently drop), naming the fix."""
        if self.zero_stage not in (0, 1, 2, 3):
            raise ValueError(f"zero_stage={self.zero_stage!r} is not a ZeRO stage; use 0, 1, 2 or 3")
        for kind in ("optimizer", "param"):
            device = getattr(self, f"offload_{kind}_device")
            if device not in OFFLOAD_DEVICES:
                raise ValueError(
                    f"offload_{kind}_device={device!r} is not valid; use one of {', '.join(OFFLOAD_DEVICES)}"
                )
            path = get_value(self.deepspeed_config, f"zero_optimization.offload_{kind}.nvme_path")
            if device == "nvme" and path in (None, "", "none"):
                raise ValueError(
                    f"offload_{kind}_device='nvme' needs offload_{kind}_nvme_path (a folder on an NVMe drive)"
                )
        if self.offload_param_device != "none" and self.zero_stage != 3:
            raise ValueError(
                f"offload_param_device={self.offload_param_device!r} needs zero_stage=3 (only stage 3 partitions the "
                f"parameters; this config has stage {self.zero_stage}); use zero_stage=3 or offload_param_device='none'"
            )
        if self.offload_optimizer_device != "none" and self.zero_stage == 0:
            raise ValueError(
                f"offload_optimizer_device={self.offload_optimizer_device!r} needs zero_stage 1, 2 or 3 (stage 0 keeps "
                "the optimizer as it is)"
            )
        gas = self.deepspeed_config.get("gradient_accumulation_steps")
        if gas != AUTO and not is_count(gas):
            raise ValueError(
                f"gradient_accumulation_steps={gas!r} in the DeepSpeed config must be a whole number >= 1 or 'auto'"
            )
        clip = self.deepspeed_config.get("gradient_clipping")
        if clip not in (None, AUTO) and (
            isinstance(clip, bool) or not isinstance(clip, (int, float)) or clip < 0
        ):
            raise ValueError(
                f"gradient_clipping={clip!r} in the DeepSpeed config must be a number >= 0 or 'auto'"
            )
        if self.zero3_init_flag and self.zero_stage != 3:
            self.zero3_init_flag = False  # as the reference: the flag only means something with stage 3

    # -- the reference's helpers ------------------------------------------------------------------
    def get_value(self, ds_key_long: str, default: Any = None) -> Any:
        """The config value at a dotted key (``"zero_optimization.stage"``)."""
        return get_value(self.deepspeed_config, ds_key_long, default)

    def is_auto(self, ds_key_long: str) -> bool:
        """Whether the config value at the dotted key is ``"auto"``."""
        return self.get_value(ds_key_long) == AUTO

    def is_zero3(self) -> bool:
        return self.zero_stage == 3

    def set_mixed_precision(self, mixed_precision: str | None) -> str:
        """Agree the config's fp16/bf16 sections with the Accelerator's ``mixed_precision``; returns the one used.

        ``None`` (not given) takes the config's choice; a given value fills ``"auto"`` or absent
        sections; a value the config contradicts is an error (never silently one or the other).
        """
        enabled = {}
        for kind in ("fp16", "bf16"):
            value = self.get_value(f"{kind}.enabled")
            if value is not None and value != AUTO:
                enabled[kind] = bool(value)
        on = [kind for kind, value in enabled.items() if value]
        if len(on) > 1:
            raise ValueError("the DeepSpeed config enables both fp16 and bf16; enable one of them")
        config_choice = on[0] if on else ("no" if enabled else None)
        if mixed_precision is not None and config_choice is not None and mixed_precision != config_choice:
            raise ValueError(
                f"mixed_precision={mixed_precision!r} disagrees with the DeepSpeed config, which has "
                f"{config_choice if config_choice != 'no' else 'fp16 and bf16 disabled'}; set the same precision in "
                "both, or set the config's fp16/bf16 'enabled' to 'auto' so the Accelerator's setting fills it"
            )
        chosen = mixed_precision if mixed_precision is not None else (config_choice or "no")
        if chosen == "fp8":
            raise ValueError(
                "mixed_precision='fp8' with DeepSpeed is not supported by accel_nb; use bf16 or fp16"
            )
        for kind in ("fp16", "bf16"):
            if kind in self.deepspeed_config or chosen == kind:
                section = self.deepspeed_config.setdefault(kind, {})
                section["enabled"] = chosen == kind
        return chosen

    def to_launch_config(self) -> dict[str, Any]:
        """The ``deepspeed_config`` mapping of a launch config that stands for this plugin."""
        if isinstance(self.hf_ds_config, (str, os.PathLike)) and self.hf_ds_config != "none":
            return {"deepspeed_config_file": os.fspath(self.hf_ds_config)}
        out = {
            "zero_stage": self.zero_stage,
            "offload_optimizer_device": self.offload_optimizer_device,
            "offload_param_device": self.offload_param_device,
            "zero3_init_flag": bool(self.zero3_init_flag),
            "zero3_save_16bit_model": bool(self.zero3_save_16bit_model),
        }
        for name in ("gradient_accumulation_steps", "gradient_clipping"):
            if getattr(self, name) not in (None, AUTO):
                out[name] = getattr(self, name)
        return out


def plugin_from_launch_settings(settings: dict[str, Any] | None) -> DeepSpeedPlugin:
    """The plugin a launch config's ``deepspeed_config`` mapping (the reference's YAML keys) stands for.

    Example:
        plugin_from_launch_settings({"zero_stage": 3, "offload_optimizer_device": "cpu"})
    """
    settings = dict(settings or {})
    unknown = [k for k in settings if k not in LAUNCH_KEYS and k not in LAUNCH_KEYS_IGNORED]
    if unknown:
        raise ValueError(
            f"deepspeed_config has unknown key {unknown[0]!r}; accel_nb reads {', '.join(sorted(LAUNCH_KEYS))}"
        )
    kwargs = {LAUNCH_KEYS[k]: v for k, v in settings.items() if k in LAUNCH_KEYS and v is not None}
    if kwargs.get("hf_ds_config") in ("", "none"):
        kwargs.pop("hf_ds_config")
    for name in ("zero3_init_flag", "zero3_save_16bit_model"):
        if isinstance(kwargs.get(name), str):
            kwargs[name] = kwargs[name].strip().lower() in ("true", "1", "yes")
    if isinstance(kwargs.get("zero_stage"), str) and kwargs["zero_stage"].strip().isdigit():
        kwargs["zero_stage"] = int(kwargs["zero_stage"])
    return DeepSpeedPlugin(**kwargs)


def plugin_from_env() -> DeepSpeedPlugin | None:
    """The plugin the launcher asked for (``ACCEL_NB_DEEPSPEED_CONFIG``, or the reference's
    ``ACCELERATE_USE_DEEPSPEED=true`` with its ``ACCELERATE_DEEPSPEED_*`` variables); None otherwise."""
    raw = _env(ENV_DEEPSPEED_CONFIG)
    if raw is not None:
        return plugin_from_launch_settings(json.loads(raw))
    if (_env(REFERENCE_USE_DEEPSPEED, "false") or "").lower() == "true":
        return DeepSpeedPlugin()
    return None


def resolve_deepspeed_plugin(plugin: Any) -> DeepSpeedPlugin | None:
    """``Accelerator(deepspeed_plugin=...)``: a plugin, the reference's plugin object, or None (then the
    launcher's environment decides). A dict of several plugins is refused: accel_nb runs one."""
    if plugin is None:
        return plugin_from_env()
    if isinstance(plugin, dict):
        raise ValueError(
            "deepspeed_plugin as a dict of several plugins is not supported by accel_nb; pass one DeepSpeedPlugin"
        )
    if not isinstance(plugin, DeepSpeedPlugin):
        # the reference's
        if type(plugin).__name__ == "DeepSpeedPlugin" and hasattr(plugin, "deepspeed_config"):
            return DeepSpeedPlugin(
                hf_ds_config=copy.deepcopy(plugin.deepspeed_config),
                zero3_init_flag=getattr(plugin, "zero3_init_flag", None),
            )
        raise TypeError(f"deepspeed_plugin must be a DeepSpeedPlugin, got {type(plugin).__name__}")
    return plugin
