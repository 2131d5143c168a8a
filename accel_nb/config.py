"""The launch config: one dataclass, validated, stored as YAML in a per-user directory.

The file uses the key names and values of the reference library's ``default_config.yaml``
(``distributed_type: MULTI_GPU``, ``mixed_precision: bf16``, ``gpu_ids: all`` ...), so a config
written for it loads here unchanged. ``accel-nb config``, ``config_wizard()``, ``accel-nb launch``,
``notebook_launcher`` and ``%%accelerate`` all read the same file.

    from accel_nb.config import load_config, save_config, default_config
    cfg = load_config() or default_config()      # the saved config, else one for this machine
    cfg.num_processes = 2
    save_config(cfg)                             # validated first, written atomically
"""

from __future__ import annotations

import dataclasses
import difflib
import ipaddress
import os
import re
import tempfile
import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from .hardware import HardwareInfo

CONFIG_FILE_ENV = "ACCEL_NB_CONFIG_FILE"
CONFIG_FILE_NAME = "default_config.yaml"

COMPUTE_ENVIRONMENTS = ("LOCAL_MACHINE",)
DISTRIBUTED_TYPES = ("NO", "MULTI_CPU", "MULTI_GPU", "XLA")
MIXED_PRECISIONS = ("no", "fp16", "bf16")
START_METHODS = ("auto", "fork", "spawn")
RDZV_BACKENDS = ("static", "c10d", "etcd", "etcd-v2")
DYNAMO_BACKENDS = (
    "no", "eager", "aot_eager", "inductor", "aot_ts_nvfuser", "nvprims_nvfuser", "cudagraphs", "ofi",
    "fx2trt", "onnxrt", "tensorrt", "aot_torchxla_trace_once", "torchxla_trace_once", "ipex", "tvm",
    "hpu_backend", "openxla", "neuron",
)  # fmt: skip
DYNAMO_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")

# Keys of the reference library's config that accel_nb accepts, keeps (they are written back on
# save so the file stays the user's) and does not act on.
REFERENCE_KEYS_KEPT = (
    "debug", "downcast_bf16", "enable_cpu_affinity", "main_training_function", "tpu_name", "tpu_zone",
    "tpu_use_cluster", "tpu_use_sudo", "tpu_env", "tpu_vm", "command_file", "commands", "deepspeed_config",
    "fsdp_config", "megatron_lm_config", "mpirun_config", "parallelism_config", "ipex_config", "fp8_config",
    "num_cpu_threads_per_process", "tpu_config", "rdzv_conf",
)  # fmt: skip
# distributed_type values of the reference library that accel_nb cannot run (a clear error).
_UNSUPPORTED_DISTRIBUTED = {
    "DEEPSPEED": "DeepSpeed", "FSDP": "FSDP", "MEGATRON_LM": "Megatron-LM", "MULTI_NPU": "Ascend NPUs",
    "MULTI_MLU": "Cambricon MLUs", "MULTI_SDAA": "SDAA devices", "MULTI_MUSA": "Moore Threads GPUs",
    "MULTI_XPU": "Intel XPUs", "MULTI_HPU": "Gaudi HPUs", "MULTI_NEURON": "AWS Neuron cores",
}  # fmt: skip
_HOSTNAME = re.compile(
    r"^(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\.?$"
)


class ConfigError(ValueError):
    """A launch config value is invalid; the message names the key, the value, what is allowed, the file."""

    def __init__(self, key: str, value: Any, allowed: str, path: str | None = None, reason: str = "") -> None:
        self.key, self.value, self.allowed, self.path = key, value, allowed, path
        where = f" in {path}" if path else ""
        why = f": {reason}" if reason else ""
        fix = f"; fix it with `accel-nb config` or edit {path}" if path else ""
        super().__init__(f"{key}={value!r}{where} is not valid{why}. Allowed: {allowed}{fix}")


class ConfigFileError(ConfigError):
    """The config file itself cannot be read (malformed YAML, not a mapping)."""

    def __init__(self, path: str, message: str) -> None:
        self.key, self.value, self.allowed, self.path = None, None, "a YAML mapping of key: value lines", path
        ValueError.__init__(self, f"{path}: {message}")


class ConfigWarning(UserWarning):
    """Something in a config file was ignored (an unknown key)."""


@dataclass
class LaunchConfig:
    """How to launch: processes, machines, precision. Field names follow the reference config file.

    cfg = LaunchConfig(distributed_type="MULTI_CPU", num_processes=2)
    cfg.validate()              # raises ConfigError naming the key
    cfg.to_env()                # env vars a launched rank reads
    """

    compute_environment: str = "LOCAL_MACHINE"
    distributed_type: str = "NO"
    num_processes: int | None = 1  # all machines together; None = every GPU, else 1 process
    num_machines: int = 1
    machine_rank: int = 0
    main_process_ip: str | None = None
    main_process_port: int | None = None  # None: a free port on one machine, 29500 across machines
    mixed_precision: str = "no"
    gpu_ids: str = "all"  # "all" or "0,1,3"
    gradient_accumulation_steps: int = 1
    use_cpu: bool = False
    start_method: str = "auto"  # notebook launches: auto (fork while safe) | fork | spawn
    rdzv_backend: str = "static"
    same_network: bool = True
    max_restarts: int = 0
    dynamo_backend: str = "no"
    dynamo_mode: str = "default"
    dynamo_use_fullgraph: bool = False
    dynamo_use_dynamic: bool = False
    extras: dict[str, Any] = field(default_factory=dict)  # reference keys kept as they were
    source: str | None = field(default=None, compare=False)  # the file it was read from

    # ---------------------------------------------------------------- validation

    def validate(self, path: str | None = None) -> LaunchConfig:
        """Check every value (types, ranges, consistency); normalise spellings in place; return self.

        Raises ``ConfigError`` naming the first bad key, its value and what is allowed.
        """
        path = path or self.source
        self.compute_environment = _choice(
            self, "compute_environment", COMPUTE_ENVIRONMENTS, path, upper=True
        )
        dt = self.distributed_type
        dt = dt.value if hasattr(dt, "value") else dt
        if isinstance(dt, str) and dt.strip().upper() == "TPU":
            dt = "XLA"  # older reference files
        if isinstance(dt, str) and dt.strip().upper() in _UNSUPPORTED_DISTRIBUTED:
            raise ConfigError(
                "distributed_type", dt, ", ".join(DISTRIBUTED_TYPES), path,
                f"accel_nb does not run {_UNSUPPORTED_DISTRIBUTED[dt.strip().upper()]}",
            )  # fmt: skip
        self.distributed_type = dt
        self.distributed_type = _choice(self, "distributed_type", DISTRIBUTED_TYPES, path, upper=True)
        if self.num_processes is not None and _is_int(self.num_processes) and int(self.num_processes) == -1:
            self.num_processes = None  # the reference library's "unset"
        if self.num_processes is not None:
            self.num_processes = _int(self, "num_processes", 1, None, path)
        self.num_machines = _int(self, "num_machines", 1, None, path)
        self.machine_rank = _int(self, "machine_rank", 0, None, path)
        if self.machine_rank >= self.num_machines:
            raise ConfigError(
                "machine_rank", self.machine_rank, f"0 to {self.num_machines - 1} (num_machines={self.num_machines})",
                path, "machine_rank must be smaller than num_machines",
            )  # fmt: skip
        self.mixed_precision = _mixed_precision(self.mixed_precision, path)
        self.gradient_accumulation_steps = _int(self, "gradient_accumulation_steps", 1, None, path)
        self.max_restarts = _int(self, "max_restarts", 0, None, path)
        self.main_process_port = (
            None if self.main_process_port in (None, "") else _int(self, "main_process_port", 1, 65535, path)
        )
        self.main_process_ip = _host(self.main_process_ip, path)
        self.gpu_ids = _gpu_ids(self.gpu_ids, path)
        for name in ("use_cpu", "same_network", "dynamo_use_fullgraph", "dynamo_use_dynamic"):
            setattr(self, name, _bool(self, name, path))
        self.start_method = _choice(self, "start_method", START_METHODS, path)
        self.rdzv_backend = _choice(self, "rdzv_backend", RDZV_BACKENDS, path)
        self.dynamo_backend = _choice(self, "dynamo_backend", DYNAMO_BACKENDS, path)
        self.dynamo_mode = _choice(self, "dynamo_mode", DYNAMO_MODES, path)
        self._validate_consistency(path)
        return self

    def _validate_consistency(self, path: str | None) -> None:
        n, dt = self.num_processes, self.distributed_type
        if self.num_machines > 1 and not self.main_process_ip:
            raise ConfigError("main_process_ip", self.main_process_ip, "the IP address or host name of machine 0",
                              path, f"num_machines={self.num_machines} needs the address of the main machine")  # fmt: skip
        if dt == "NO" and n is not None and n > 1:
            raise ConfigError(
                "distributed_type", dt, "MULTI_CPU or MULTI_GPU when num_processes > 1", path,
                f"'NO' runs a single process but num_processes={n}",
            )  # fmt: skip
        if dt == "NO" and self.num_machines > 1:
            raise ConfigError("distributed_type", dt, "MULTI_CPU or MULTI_GPU across machines", path,
                              f"'NO' runs one process but num_machines={self.num_machines}")  # fmt: skip
        if dt == "MULTI_GPU" and self.use_cpu:
            raise ConfigError("use_cpu", True, "false with distributed_type MULTI_GPU (or use MULTI_CPU)", path,
                              "MULTI_GPU runs on GPUs")  # fmt: skip
        if n is not None and n % self.num_machines:
            raise ConfigError(
                "num_processes", n, f"a multiple of num_machines={self.num_machines}", path,
                "num_processes counts the processes of all machines together; each machine runs the same number",
            )  # fmt: skip
        if self.gpu_ids != "all" and dt == "MULTI_GPU" and n is not None:
            ids = self.gpu_ids.split(",")
            per_machine = n // self.num_machines
            if len(ids) < per_machine:
                raise ConfigError(
                    "gpu_ids", self.gpu_ids, f"at least {per_machine} GPU ids (one per process on each machine)",
                    path, f"num_processes={n} on {self.num_machines} machine(s) needs {per_machine} GPUs per machine",
                )  # fmt: skip

    def check_hardware(self, hw: HardwareInfo | None = None) -> list[str]:
        """Check the config against this machine; raise ConfigError for impossible, return warnings.

        Separate from ``validate`` because a valid file may be meant for another machine.
        """
        from .hardware import detect

        hw = hw or detect()
        notes: list[str] = []
        path = self.source
        per_machine = None if self.num_processes is None else self.num_processes // self.num_machines
        uses_gpu = self.distributed_type == "MULTI_GPU" or (
            self.distributed_type == "NO" and not self.use_cpu and hw.num_gpus > 0
        )
        if self.distributed_type == "MULTI_GPU":
            if hw.num_gpus == 0:
                raise ConfigError("distributed_type", "MULTI_GPU", "MULTI_CPU or NO on this machine", path,
                                  "this machine has no visible CUDA GPU")  # fmt: skip
            available = hw.num_gpus if self.gpu_ids == "all" else len(self.gpu_ids.split(","))
            if per_machine is not None and per_machine > available:
                raise ConfigError(
                    "num_processes", self.num_processes, f"at most {available * self.num_machines}", path,
                    f"{per_machine} processes per machine but {available} GPU(s) are available",
                )  # fmt: skip
        if self.gpu_ids != "all" and hw.num_gpus:
            too_big = [i for i in self.gpu_ids.split(",") if int(i) >= hw.num_gpus]
            if too_big:
                raise ConfigError("gpu_ids", self.gpu_ids, f"ids from 0 to {hw.num_gpus - 1}", path,
                                  f"GPU {too_big[0]} does not exist here")  # fmt: skip
        if self.mixed_precision == "bf16" and uses_gpu:
            bad = [g for g in hw.gpus if not g.bf16]
            if bad:
                g = bad[0]
                cc = f"{g.compute_capability[0]}.{g.compute_capability[1]}"
                raise ConfigError(
                    "mixed_precision", "bf16", "fp16 or no on this GPU", path,
                    f"GPU {g.index} ({g.name}, compute capability {cc}) does not support bf16",
                )  # fmt: skip
        if self.mixed_precision == "fp16" and not uses_gpu:
            notes.append("mixed_precision='fp16' on CPU is slow and rarely helps; bf16 or no is usual on CPU")
        if self.distributed_type == "XLA" and not hw.xla_available:
            notes.append("distributed_type='XLA' but torch_xla is not installed in this environment")
        return notes

    # ---------------------------------------------------------------- files

    @classmethod
    def load(cls, path: str | None = None) -> LaunchConfig:
        """Read a config file (default: the saved one); ``ConfigFileError`` when there is none.

        cfg = LaunchConfig.load("default_config.yaml")
        """
        cfg = load_config(path)
        if cfg is None:
            where = path or default_config_path()
            raise ConfigFileError(
                where, "does not exist; write one with `accel-nb config` or config_wizard()"
            )
        return cfg

    def save(self, path: str | None = None) -> str:
        """Validate and write this config (default: the per-user file) atomically; return the path."""
        return save_config(self, path)

    # ---------------------------------------------------------------- conversions

    @classmethod
    def from_dict(cls, data: dict[str, Any], path: str | None = None, warn: bool = True) -> LaunchConfig:
        """Build from a parsed config file (reference key names accepted); unknown keys warn and are ignored."""
        own = {f.name for f in dataclasses.fields(cls)} - {"extras", "source"}
        kwargs: dict[str, Any] = {}
        extras: dict[str, Any] = {}
        for key, value in data.items():
            key = str(key)
            if key == "dynamo_config":
                for sub, subval in (value or {}).items():
                    if sub in ("dynamo_backend", "dynamo_mode", "dynamo_use_fullgraph", "dynamo_use_dynamic"):
                        kwargs[sub] = subval.lower() if isinstance(subval, str) else subval
                    elif warn:
                        warnings.warn(f"unknown key dynamo_config.{sub} in {path or 'the config'} is ignored",
                                      ConfigWarning, stacklevel=3)  # fmt: skip
            elif key in own:
                kwargs[key] = value
            elif key in REFERENCE_KEYS_KEPT:
                extras[key] = value
            elif warn:
                hint = difflib.get_close_matches(key, sorted(own) + ["dynamo_config"], n=1)
                warnings.warn(
                    f"unknown key {key!r} in {path or 'the config'} is ignored"
                    + (f" (did you mean {hint[0]!r}?)" if hint else ""),
                    ConfigWarning,
                    stacklevel=3,
                )
        if kwargs.get("mixed_precision") is None and "mixed_precision" in kwargs:
            kwargs["mixed_precision"] = "no"
        if kwargs.get("gpu_ids") is None and "gpu_ids" in kwargs:
            kwargs["gpu_ids"] = "all"
        for key in ("rdzv_backend", "dynamo_backend", "dynamo_mode", "start_method", "compute_environment"):
            if key in kwargs and kwargs[key] is None:
                del kwargs[key]
        for key in ("same_network", "use_cpu", "dynamo_use_fullgraph", "dynamo_use_dynamic"):
            if key in kwargs and kwargs[key] is None:
                del kwargs[key]
        cfg = cls(**kwargs, extras=extras, source=path)
        return cfg.validate(path)

    def to_dict(self) -> dict[str, Any]:
        """The YAML mapping: reference key names, reference-style ``dynamo_config``, kept extras last."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            if f.name in ("extras", "source") or f.name.startswith("dynamo_"):
                continue
            value = getattr(self, f.name)
            if f.name == "num_processes" and value is None:
                value = -1
            if value is None:
                continue
            out[f.name] = value
        if self.dynamo_backend != "no":
            out["dynamo_config"] = {
                "dynamo_backend": self.dynamo_backend.upper(),
                "dynamo_mode": self.dynamo_mode,
                "dynamo_use_fullgraph": self.dynamo_use_fullgraph,
                "dynamo_use_dynamic": self.dynamo_use_dynamic,
            }
        out.update(self.extras)
        return out

    def replace(self, **changes: Any) -> LaunchConfig:
        """A copy with some values changed (``None`` means keep), re-validated.

        When ``num_processes`` changes and ``distributed_type`` was not given, the type follows:
        one process -> ``NO``; several -> ``MULTI_GPU`` if the config used GPUs, else ``MULTI_CPU``.
        """
        changes = {k: v for k, v in changes.items() if v is not None}
        new = dataclasses.replace(self, **changes)
        new.extras = dict(self.extras)
        if "use_cpu" in changes and changes["use_cpu"] and "distributed_type" not in changes:
            if new.distributed_type == "MULTI_GPU":
                new.distributed_type = "MULTI_CPU"
        if ("num_processes" in changes or "num_machines" in changes) and "distributed_type" not in changes:
            total = new.num_processes
            if new.distributed_type in ("NO", "MULTI_CPU", "MULTI_GPU") and total is not None:
                several = total > 1 or new.num_machines > 1
                gpu = self.distributed_type == "MULTI_GPU" or (
                    self.distributed_type == "NO" and not new.use_cpu and _gpu_count() > 0
                )
                new.distributed_type = ("MULTI_GPU" if gpu else "MULTI_CPU") if several else "NO"
        return new.validate()

    def to_env(self) -> dict[str, str]:
        """Environment variables a launched rank reads (accel_nb's names and the reference's)."""
        env = {
            "ACCEL_NB_MIXED_PRECISION": self.mixed_precision,
            "ACCELERATE_MIXED_PRECISION": self.mixed_precision,
            "ACCEL_NB_GRADIENT_ACCUMULATION_STEPS": str(self.gradient_accumulation_steps),
            "ACCELERATE_GRADIENT_ACCUMULATION_STEPS": str(self.gradient_accumulation_steps),
        }
        if self.use_cpu or self.distributed_type == "MULTI_CPU":
            env.update({"ACCEL_NB_USE_CPU": "1", "ACCELERATE_USE_CPU": "true"})
        if self.gpu_ids != "all" and not self.use_cpu:
            env["CUDA_VISIBLE_DEVICES"] = self.gpu_ids
        if self.dynamo_backend != "no":
            for prefix in ("ACCEL_NB_", "ACCELERATE_"):
                env[prefix + "DYNAMO_BACKEND"] = self.dynamo_backend.upper()
                env[prefix + "DYNAMO_MODE"] = self.dynamo_mode
                env[prefix + "DYNAMO_USE_FULLGRAPH"] = str(self.dynamo_use_fullgraph).lower()
                env[prefix + "DYNAMO_USE_DYNAMIC"] = str(self.dynamo_use_dynamic).lower()
        return env

    def processes_here(self, hw: HardwareInfo | None = None) -> int:
        """Processes this machine runs: ``num_processes / num_machines``; None resolves to GPUs or 1."""
        if self.num_processes is None:
            if self.use_cpu:
                return 1
            count = hw.num_gpus if hw is not None else _gpu_count()
            return max(count, 1)
        return self.num_processes // self.num_machines


# -------------------------------------------------------------------- value checks


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int(cfg: LaunchConfig, key: str, low: int, high: int | None, path: str | None) -> int:
    value = getattr(cfg, key)
    allowed = f"a whole number >= {low}" if high is None else f"a whole number from {low} to {high}"
    number: int | None = None
    if _is_int(value):
        number = value
    elif isinstance(value, float) and value.is_integer():
        number = int(value)
    elif isinstance(value, str) and re.fullmatch(r"\s*[+-]?\d+\s*", value):
        number = int(value)
    if number is None:
        raise ConfigError(key, value, allowed, path, f"expected a whole number, got {type(value).__name__}")
    if number < low or (high is not None and number > high):
        raise ConfigError(key, value, allowed, path, "out of range")
    return number


def _bool(cfg: LaunchConfig, key: str, path: str | None) -> bool:
    value = getattr(cfg, key)
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "yes", "y", "1", "on"):
        return True
    if text in ("false", "no", "n", "0", "off"):
        return False
    raise ConfigError(key, value, "true or false", path)


def _choice(
    cfg: LaunchConfig, key: str, allowed: tuple[str, ...], path: str | None, upper: bool = False
) -> str:
    value = getattr(cfg, key)
    value = value.value if hasattr(value, "value") else value  # enums (e.g. DistributedType)
    if isinstance(value, str):
        text = value.strip().upper() if upper else value.strip().lower()
        if text in allowed:
            return text
    raise ConfigError(key, value, ", ".join(allowed), path)


def _mixed_precision(value: Any, path: str | None) -> str:
    aliases = {
        None: "no",
        False: "no",
        "none": "no",
        "no": "no",
        "fp32": "no",
        "fp16": "fp16",
        "bf16": "bf16",
    }
    key = value.strip().lower() if isinstance(value, str) else value
    try:
        return aliases[key]
    except (KeyError, TypeError):
        reason = "accel_nb does not support fp8 yet" if key == "fp8" else ""
        raise ConfigError("mixed_precision", value, ", ".join(MIXED_PRECISIONS), path, reason) from None


def _host(value: Any, path: str | None) -> str | None:
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


def _gpu_ids(value: Any, path: str | None) -> str:
    if value is None:
        return "all"
    if _is_int(value):
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
        if _is_int(item) and item >= 0:
            ids.append(item)
        elif isinstance(item, str) and item.isdigit():
            ids.append(int(item))
        else:
            raise ConfigError("gpu_ids", value, allowed, path, f"{item!r} is not a GPU index")
    if len(set(ids)) != len(ids):
        raise ConfigError("gpu_ids", value, allowed, path, "a GPU is listed twice")
    return ",".join(str(i) for i in ids)


def _gpu_count() -> int:
    from .hardware import cuda_device_count

    return cuda_device_count()


# -------------------------------------------------------------------- files


def default_config_path() -> str:
    """Where accel_nb keeps the launch config: ``$ACCEL_NB_CONFIG_FILE``, else the per-user config dir.

    default_config_path()   # e.g. ~/.config/accel_nb/default_config.yaml
    """
    override = os.environ.get(CONFIG_FILE_ENV)
    if override:
        return os.path.abspath(os.path.expanduser(override))
    if os.name == "nt":
        base = os.environ.get("APPDATA") or os.path.expanduser("~\\AppData\\Roaming")
    else:
        base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return os.path.join(base, "accel_nb", CONFIG_FILE_NAME)


def reference_config_path() -> str | None:
    """The reference library's default config file, if the user has one (read when accel_nb has none)."""
    cache = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "huggingface"
    )
    for name in ("default_config.yaml", "default_config.json"):
        candidate = os.path.join(cache, "accelerate", name)
        if os.path.isfile(candidate):
            return candidate
    return None


def find_config_file(path: str | None = None) -> str | None:
    """The file ``load_config(path)`` reads: ``path``; else accel_nb's file; else the reference's; else None."""
    if path is not None:
        return os.path.abspath(os.path.expanduser(path)) if os.path.exists(os.path.expanduser(path)) else None
    own = default_config_path()
    if os.path.exists(own):
        return own
    if os.environ.get(CONFIG_FILE_ENV):
        return None  # an explicit location: never read some other file instead
    return reference_config_path()


def load_config(path: str | None = None) -> LaunchConfig | None:
    """Read and validate the launch config; ``None`` when there is no file.

    cfg = load_config()              # accel_nb's file, else the reference library's
    cfg = load_config("my.yaml")
    """
    found = find_config_file(path)
    if found is None:
        return None
    import yaml

    try:
        with open(found, encoding="utf-8") as f:
            text = f.read()
    except OSError as exc:
        raise ConfigFileError(found, f"cannot be read: {exc}") from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else "somewhere"
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigFileError(
            found, f"is not valid YAML ({problem} at {where}); fix that line, or delete the file and run "
            "`accel-nb config default`",
        ) from None  # fmt: skip
    if data is None:
        raise ConfigFileError(found, "is empty; run `accel-nb config default` to write a config")
    if not isinstance(data, dict):
        raise ConfigFileError(found, f"must be a mapping of key: value lines, not a {type(data).__name__}")
    return LaunchConfig.from_dict(data, path=found)


def save_config(cfg: LaunchConfig, path: str | None = None) -> str:
    """Validate, then write the YAML atomically (temp file + rename); return the path written.

    An invalid config raises ``ConfigError`` and leaves any existing file untouched.
    """
    import yaml

    target = os.path.abspath(os.path.expanduser(path)) if path else default_config_path()
    cfg.validate(target)
    text = yaml.safe_dump(cfg.to_dict(), sort_keys=False, default_flow_style=False)
    directory = os.path.dirname(target)
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".default_config.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    cfg.source = target
    return target


def default_config(hw: HardwareInfo | None = None) -> LaunchConfig:
    """A sensible config for this machine: one process per GPU (bf16 where supported), else 1 CPU process.

    cfg = default_config()
    """
    from .hardware import detect

    hw = hw or detect()
    if hw.num_gpus:
        if hw.bf16_gpus:
            mp = "bf16"
        elif all(g.compute_capability >= (7, 0) for g in hw.gpus):
            mp = "fp16"
        else:
            mp = "no"
        dt = "MULTI_GPU" if hw.num_gpus > 1 else "NO"
        return LaunchConfig(distributed_type=dt, num_processes=hw.num_gpus, mixed_precision=mp).validate()
    if hw.tpu_detected and hw.xla_available:
        return LaunchConfig(distributed_type="XLA", num_processes=None, mixed_precision="bf16").validate()
    return LaunchConfig(distributed_type="NO", num_processes=1, mixed_precision="no", use_cpu=True).validate()


def effective_config(path: str | None = None) -> LaunchConfig:
    """The saved config, or ``default_config()`` when none is saved (what launches use)."""
    return load_config(path) or default_config()
