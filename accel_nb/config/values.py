"""Launch-config values: the allowed choices, the error types and one checker per kind of value.

Every checker takes the config, the key and the file (for the message) and returns the
normalised value or raises :class:`ConfigError` naming the key, the value, what is allowed and
the file. ``LaunchConfig.validate`` calls them; so may anything that reads a config value.

    check_int(cfg, "num_machines", 1, None, path)    # 2 for "2"; ConfigError for "two"
"""

from __future__ import annotations

import enum
import ipaddress
import re
import warnings
from typing import Any

from ..counts import is_count, is_whole_number, whole_number
from ..precision.setting import MIXED_PRECISION_CHOICES, validate_mixed_precision

CONFIG_FILE_ENV = "ACCEL_NB_CONFIG_FILE"
CONFIG_FILE_NAME = "default_config.yaml"

COMPUTE_ENVIRONMENTS = ("LOCAL_MACHINE",)
DISTRIBUTED_TYPES = ("NO", "MULTI_CPU", "MULTI_GPU", "XLA", "FSDP", "DEEPSPEED", "MEGATRON_LM")
START_METHODS = ("auto", "fork", "spawn")
# The rendezvous accel_nb sets up itself (no server to run): the choices of the launch flags
# (accel-nb launch, %%accelerate) and of notebook launches across machines.
LAUNCHER_RDZV_BACKENDS = ("static", "c10d")
# What a config file may name: those, and the etcd backends torchrun reaches when one is running.
RDZV_BACKENDS = (*LAUNCHER_RDZV_BACKENDS, "etcd", "etcd-v2")
DYNAMO_BACKENDS = (
    "no",
    "eager",
    "aot_eager",
    "inductor",
    "aot_ts_nvfuser",
    "nvprims_nvfuser",
    "cudagraphs",
    "ofi",
    "fx2trt",
    "onnxrt",
    "tensorrt",
    "aot_torchxla_trace_once",
    "torchxla_trace_once",
    "ipex",
    "tvm",
    "hpu_backend",
    "openxla",
    "neuron",
)

# Keys of the reference library's config that accel_nb accepts, keeps (they are written back on
# save so the file stays the user's) and does not act on.
REFERENCE_KEYS_KEPT = (
    "debug",
    "downcast_bf16",
    "enable_cpu_affinity",
    "main_training_function",
    "tpu_name",
    "tpu_zone",
    "tpu_use_cluster",
    "tpu_use_sudo",
    "tpu_env",
    "tpu_vm",
    "command_file",
    "commands",
    "deepspeed_config",
    "fsdp_config",
    "megatron_lm_config",
    "mpirun_config",
    "parallelism_config",
    "ipex_config",
    "fp8_config",
    "num_cpu_threads_per_process",
    "tpu_config",
    "rdzv_conf",
)
# distributed_type values of the reference library that accel_nb cannot run (a clear error).
UNSUPPORTED_DISTRIBUTED = {
    "MULTI_NPU": "Ascend NPUs",
    "MULTI_MLU": "Cambricon MLUs",
    "MULTI_SDAA": "SDAA devices",
    "MULTI_MUSA": "Moore Threads GPUs",
    "MULTI_XPU": "Intel XPUs",
    "MULTI_HPU": "Gaudi HPUs",
    "MULTI_NEURON": "AWS Neuron cores",
}
_HOSTNAME = re.compile(
    r"^(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\.?$"
)


class ComputeEnvironment(str, enum.Enum):
    """Where a config file says the run happens (``compute_environment``); accel_nb launches ``LOCAL_MACHINE`` only.

    ``AMAZON_SAGEMAKER`` files are read (``accel_nb.commands.config.config_args.SageMakerConfig``), never launched.
    """

    LOCAL_MACHINE = "LOCAL_MACHINE"
    AMAZON_SAGEMAKER = "AMAZON_SAGEMAKER"


class SageMakerDistributedType(str, enum.Enum):
    """The ``distributed_type`` values of a SageMaker config file (read, not launched, by accel_nb)."""

    NO = "NO"
    DATA_PARALLEL = "DATA_PARALLEL"
    MODEL_PARALLEL = "MODEL_PARALLEL"


class ConfigError(ValueError):
    """A launch config value is invalid; the message names the key, the value, what is allowed, the file.

    An empty value is said to be empty (not shown as ``None``).
    """

    def __init__(self, key: str, value: Any, allowed: str, path: str | None = None, reason: str = "") -> None:
        self.key, self.value, self.allowed, self.path, self.reason = key, value, allowed, path, reason
        where = f" in {path}" if path else ""
        why = f": {reason}" if reason else ""
        fix = f"; fix it with `accel-nb config` or edit {path}" if path else ""
        head = (
            f"{key}{where} is empty"
            if value is None or value == ""
            else f"{key}={value!r}{where} is not valid"
        )
        super().__init__(f"{head}{why}. Allowed: {allowed}{fix}")


class ConfigFileError(ConfigError):
    """The config file itself cannot be read (malformed YAML, not a mapping)."""

    def __init__(self, path: str, message: str) -> None:
        self.key, self.value, self.allowed, self.path = None, None, "a YAML mapping of key: value lines", path
        ValueError.__init__(self, f"{path}: {message}")


class ConfigWarning(UserWarning):
    """Something in a config file was ignored (an unknown key)."""


# -------------------------------------------------------------------- value checks


def check_int(cfg: Any, key: str, low: int, high: int | None, path: str | None) -> int:
    value = getattr(cfg, key)
    allowed = f"a whole number >= {low}" if high is None else f"a whole number from {low} to {high}"
    number = whole_number(value)
    if number is None:
        raise ConfigError(key, value, allowed, path, f"expected a whole number, got {type(value).__name__}")
    if number < low or (high is not None and number > high):
        raise ConfigError(key, value, allowed, path, "out of range")
    return number


def check_bool(cfg: Any, key: str, path: str | None) -> bool:
    value = getattr(cfg, key)
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "yes", "y", "1", "on"):
        return True
    if text in ("false", "no", "n", "0", "off"):
        return False
    raise ConfigError(key, value, "true or false", path)


def check_choice(cfg: Any, key: str, allowed: tuple[str, ...], path: str | None, upper: bool = False) -> str:
    value = getattr(cfg, key)
    value = value.value if hasattr(value, "value") else value  # enums (e.g. DistributedType)
    if isinstance(value, str):
        text = value.strip().upper() if upper else value.strip().lower()
        if text in allowed:
            return text
    raise ConfigError(key, value, ", ".join(allowed), path)


def check_mixed_precision(value: Any, path: str | None) -> str:
    try:
        return validate_mixed_precision(value)
    except ValueError as exc:
        raise ConfigError(
            "mixed_precision", value, ", ".join(MIXED_PRECISION_CHOICES), path, str(exc)
        ) from None


def check_host(value: Any, path: str | None) -> str | None:
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    text = str(value).strip()
    try:
        ipaddress.ip_address(text)
        return text
    except ValueError:
        pass
    if not _HOSTNAME.match(text):
        raise ConfigError(
            "main_process_ip", value, "an IPv4/IPv6 address or a host name such as node0.cluster", path
        )
    return text


def check_gpu_ids(value: Any, path: str | None) -> str:
    if value is None:
        return "all"
    if is_whole_number(value):
        items = [value]
    elif isinstance(value, (list, tuple)):
        items = list(value)
    elif isinstance(value, str):
        text = value.strip().lower()
        if text in ("all", ""):
            return "all"
        items = [p.strip() for p in text.split(",")]
    else:
        items = None
    allowed = "'all' or GPU indices separated by commas, such as '0,1'"
    if not items:
        raise ConfigError("gpu_ids", value, allowed, path)
    ids: list[int] = []
    for item in items:
        if is_count(item, low=0):
            ids.append(item)
        elif isinstance(item, str) and item.isdigit():
            ids.append(int(item))
        else:
            raise ConfigError("gpu_ids", value, allowed, path, f"{item!r} is not a GPU index")
    if len(set(ids)) != len(ids):
        raise ConfigError("gpu_ids", value, allowed, path, "a GPU is listed twice")
    return ",".join(str(i) for i in ids)


_warned_once: set[str] = set()


def warn_once(key: str, message: str) -> None:
    """Warn with ``ConfigWarning`` the first time ``key`` comes up in this process, then stay quiet."""
    if key not in _warned_once:
        _warned_once.add(key)
        warnings.warn(message, ConfigWarning, stacklevel=3)
