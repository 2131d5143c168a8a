"""``LaunchConfig``: the launch settings as one validated dataclass (reference key names), loaded and saved.

Where the file is and its YAML are :mod:`accel_nb.config.files`; the checks of single values
are :mod:`accel_nb.config.values`. Import all of it from :mod:`accel_nb.config`.

    cfg = LaunchConfig(distributed_type="MULTI_CPU", num_processes=2).validate()
    cfg.to_env()      # the environment a launched rank reads
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import warnings
from dataclasses import dataclass, field
from typing import Any

from ..accelerator.backends import BACKENDS, backend_named, launch_backend
from ..compile.options import DYNAMO_MODES
from ..counts import is_whole_number
from ..env_names import (
    DYNAMO_ENV,
    ENV_GRADIENT_ACCUMULATION_STEPS,
    ENV_MIXED_PRECISION,
    ENV_USE_CPU,
    REFERENCE_NAMES,
    REFERENCE_USE_CPU,
)
from ..hardware import HardwareInfo, cuda_device_count, detect
from ..precision.fp8_recipes import fp8_launch_env
from ..precision.setting import bf16_gpu_problem
from .files import default_config_path, find_config_file, read_config_mapping, write_config_mapping
from .values import (
    COMPUTE_ENVIRONMENTS,
    DISTRIBUTED_TYPES,
    DYNAMO_BACKENDS,
    RDZV_BACKENDS,
    REFERENCE_KEYS_KEPT,
    START_METHODS,
    UNSUPPORTED_DISTRIBUTED,
    ConfigError,
    ConfigFileError,
    ConfigWarning,
    check_bool,
    check_choice,
    check_gpu_ids,
    check_host,
    check_int,
    check_mixed_precision,
)

__all__ = ["LaunchConfig", "load_config", "save_config"]

# the dynamo_config switches (reference key names)
DYNAMO_FLAGS = ("dynamo_use_fullgraph", "dynamo_use_dynamic", "dynamo_use_regional_compilation")


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
    dynamo_use_regional_compilation: bool = False
    extras: dict[str, Any] = field(default_factory=dict)  # reference keys kept as they were
    source: str | None = field(default=None, compare=False)  # the file it was read from

    # ---------------------------------------------------------------- validation

    def validate(self, path: str | None = None) -> LaunchConfig:
        """Check every value (types, ranges, consistency); normalise spellings in place; return self.

        Raises ``ConfigError`` naming the first bad key, its value and what is allowed.
        """
        path = path or self.source
        self.compute_environment = check_choice(
            self, "compute_environment", COMPUTE_ENVIRONMENTS, path, upper=True
        )
        dt = self.distributed_type
        dt = dt.value if hasattr(dt, "value") else dt
        if isinstance(dt, str) and dt.strip().upper() == "TPU":
            dt = "XLA"  # older reference files
        if isinstance(dt, str) and dt.strip().upper() in UNSUPPORTED_DISTRIBUTED:
            raise ConfigError(
                "distributed_type",
                dt,
                ", ".join(DISTRIBUTED_TYPES),
                path,
                f"accel_nb does not run {UNSUPPORTED_DISTRIBUTED[dt.strip().upper()]}",
            )
        self.distributed_type = dt
        self.distributed_type = check_choice(self, "distributed_type", DISTRIBUTED_TYPES, path, upper=True)
        if (
            self.num_processes is not None
            and is_whole_number(self.num_processes)
            and int(self.num_processes) == -1
        ):
            self.num_processes = None  # the reference library's "unset"
        if self.num_processes is not None:
            self.num_processes = check_int(self, "num_processes", 1, None, path)
        self.num_machines = check_int(self, "num_machines", 1, None, path)
        self.machine_rank = check_int(self, "machine_rank", 0, None, path)
        if self.machine_rank >= self.num_machines:
            raise ConfigError(
                "machine_rank",
                self.machine_rank,
                f"0 to {self.num_machines - 1} (num_machines={self.num_machines})",
                path,
                "machine_rank must be smaller than num_machines",
            )
        self.mixed_precision = check_mixed_precision(self.mixed_precision, path)
        self.gradient_accumulation_steps = check_int(self, "gradient_accumulation_steps", 1, None, path)
        self.max_restarts = check_int(self, "max_restarts", 0, None, path)
        self.main_process_port = (
            None
            if self.main_process_port in (None, "")
            else check_int(self, "main_process_port", 1, 65535, path)
        )
        self.main_process_ip = check_host(self.main_process_ip, path)
        self.gpu_ids = check_gpu_ids(self.gpu_ids, path)
        for name in ("use_cpu", "same_network", *DYNAMO_FLAGS):
            setattr(self, name, check_bool(self, name, path))
        self.start_method = check_choice(self, "start_method", START_METHODS, path)
        self.rdzv_backend = check_choice(self, "rdzv_backend", RDZV_BACKENDS, path)
        self.dynamo_backend = check_choice(self, "dynamo_backend", DYNAMO_BACKENDS, path)
        self.dynamo_mode = check_choice(self, "dynamo_mode", DYNAMO_MODES, path)
        self._validate_consistency(path)
        for backend in BACKENDS.values():  # each training back-end checks its section (fsdp_config, ...)
            backend.check_launch_config(self, path)
        if self.dynamo_backend not in ("no", "inductor") and self.dynamo_mode != "default":
            raise ConfigError(
                "dynamo_mode",
                self.dynamo_mode,
                "default with this backend",
                path,
                f"a torch.compile mode is for the inductor backend; dynamo_backend={self.dynamo_backend!r} takes none",
            )
        return self

    def _validate_consistency(self, path: str | None) -> None:
        n, dt = self.num_processes, self.distributed_type
        if self.num_machines > 1 and not self.main_process_ip:
            raise ConfigError(
                "main_process_ip",
                self.main_process_ip,
                "the IP address or host name of machine 0",
                path,
                f"num_machines={self.num_machines} needs the address of the main machine",
            )
        if dt == "NO" and n is not None and n > 1:
            raise ConfigError(
                "distributed_type",
                dt,
                "MULTI_CPU or MULTI_GPU when num_processes > 1",
                path,
                f"'NO' runs a single process but num_processes={n}",
            )
        if dt == "NO" and self.num_machines > 1:
            raise ConfigError(
                "distributed_type",
                dt,
                "MULTI_CPU or MULTI_GPU across machines",
                path,
                f"'NO' runs one process but num_machines={self.num_machines}",
            )
        if dt == "MULTI_GPU" and self.use_cpu:
            raise ConfigError(
                "use_cpu",
                True,
                "false with distributed_type MULTI_GPU (or use MULTI_CPU)",
                path,
                "MULTI_GPU runs on GPUs",
            )
        if n is not None and n % self.num_machines:
            raise ConfigError(
                "num_processes",
                n,
                f"a multiple of num_machines={self.num_machines}",
                path,
                "num_processes counts the processes of all machines together; each machine runs the same number",
            )
        if self.gpu_ids != "all" and dt == "MULTI_GPU" and n is not None:
            ids = self.gpu_ids.split(",")
            per_machine = n // self.num_machines
            if len(ids) < per_machine:
                raise ConfigError(
                    "gpu_ids",
                    self.gpu_ids,
                    f"at least {per_machine} GPU ids (one per process on each machine)",
                    path,
                    f"num_processes={n} on {self.num_machines} machine(s) needs {per_machine} GPUs per machine",
                )

    def check_hardware(self, hw: HardwareInfo | None = None) -> list[str]:
        """Check the config against this machine; raise ConfigError for impossible, return warnings.

        Separate from ``validate`` because a valid file may be meant for another machine.
        """
        hw = hw or detect()
        notes: list[str] = []
        path = self.source
        per_machine = None if self.num_processes is None else self.num_processes // self.num_machines
        uses_gpu = self.distributed_type == "MULTI_GPU" or (
            self.distributed_type == "NO" and not self.use_cpu and hw.num_gpus > 0
        )
        if self.distributed_type == "MULTI_GPU":
            if hw.num_gpus == 0:
                raise ConfigError(
                    "distributed_type",
                    "MULTI_GPU",
                    "MULTI_CPU or NO on this machine",
                    path,
                    "this machine has no visible CUDA GPU",
                )
            available = hw.num_gpus if self.gpu_ids == "all" else len(self.gpu_ids.split(","))
            if per_machine is not None and per_machine > available:
                raise ConfigError(
                    "num_processes",
                    self.num_processes,
                    f"at most {available * self.num_machines}",
                    path,
                    f"{per_machine} processes per machine but {available} GPU(s) are available",
                )
        if self.gpu_ids != "all" and hw.num_gpus:
            too_big = [i for i in self.gpu_ids.split(",") if int(i) >= hw.num_gpus]
            if too_big:
                raise ConfigError(
                    "gpu_ids",
                    self.gpu_ids,
                    f"ids from 0 to {hw.num_gpus - 1}",
                    path,
                    f"GPU {too_big[0]} does not exist here",
                )
        problem = bf16_gpu_problem(hw.gpus) if self.mixed_precision == "bf16" and uses_gpu else None
        if problem:
            raise ConfigError("mixed_precision", "bf16", "fp16 or no on this GPU", path, problem)
        if self.mixed_precision == "fp16" and not uses_gpu:
            notes.append("mixed_precision='fp16' on CPU is slow and rarely helps; bf16 or no is usual on CPU")
        notes += launch_backend(self.distributed_type).hardware_notes(self, hw, path)
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
                    if sub in ("dynamo_backend", "dynamo_mode", *DYNAMO_FLAGS):
                        kwargs[sub] = subval.lower() if isinstance(subval, str) else subval
                    elif warn:
                        warnings.warn(
                            f"unknown key dynamo_config.{sub} in {path or 'the config'} is ignored",
                            ConfigWarning,
                            stacklevel=3,
                        )
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
        for key in ("same_network", "use_cpu", *DYNAMO_FLAGS):
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
                "dynamo_use_regional_compilation": self.dynamo_use_regional_compilation,
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
                    self.distributed_type == "NO" and not new.use_cpu and cuda_device_count() > 0
                )
                new.distributed_type = ("MULTI_GPU" if gpu else "MULTI_CPU") if several else "NO"
        return new.validate()

    def to_env(self) -> dict[str, str]:
        """Environment variables a launched rank reads (accel_nb's names and the reference's)."""
        env = {
            ENV_MIXED_PRECISION: self.mixed_precision,
            REFERENCE_NAMES[ENV_MIXED_PRECISION]: self.mixed_precision,
            ENV_GRADIENT_ACCUMULATION_STEPS: str(self.gradient_accumulation_steps),
            REFERENCE_NAMES[ENV_GRADIENT_ACCUMULATION_STEPS]: str(self.gradient_accumulation_steps),
        }
        if self.use_cpu or self.distributed_type == "MULTI_CPU":
            env.update({ENV_USE_CPU: "1", REFERENCE_USE_CPU: "true"})
        if self.gpu_ids != "all" and not self.use_cpu:
            env["CUDA_VISIBLE_DEVICES"] = self.gpu_ids
        env.update(self.compile_env())
        env.update(self.backends_env())
        # FP8: the config's fp8_config as ACCELERATE_FP8_* (accel_nb.precision.fp8_recipes); {} without fp8
        try:
            env.update(fp8_launch_env(self.mixed_precision, self.extras.get("fp8_config")))
        except ValueError as exc:  # before any rank starts
            raise ConfigError(
                "fp8_config",
                self.extras.get("fp8_config"),
                "backend AO (torchao installed)",
                self.source,
                str(exc),
            ) from None
        return env

    def deepspeed_env(self) -> dict[str, str]:
        """With ``distributed_type: DEEPSPEED``, the ``deepspeed_config`` each rank's Accelerator reads (as JSON).

        LaunchConfig(distributed_type="DEEPSPEED", use_cpu=True).deepspeed_env()["ACCEL_NB_DEEPSPEED_CONFIG"]   # '{}'
        """
        return backend_named("deepspeed").launch_env(self)

    def backends_env(self, num_processes: int | None = None) -> dict[str, str]:
        """What every registered training back-end gives each rank for this config (``fsdp_config``,
        ``deepspeed_config``, ``megatron_lm_config``, the layout): each answers ``{}`` unless the config asks
        for it, so a new back-end reaches ``accel-nb launch``, ``%%accelerate`` and sessions by registering.
        ``num_processes``: the launch's processes in all (default: the config's own)."""
        env: dict[str, str] = {}
        for backend in BACKENDS.values():
            env.update(backend.launch_env(self, num_processes))
        return env

    def compile_env(self) -> dict[str, str]:
        """The ``dynamo_config`` as the environment each rank's Accelerator reads (accel_nb's and the reference's names).

        LaunchConfig(dynamo_backend="eager").compile_env()["ACCEL_NB_DYNAMO_BACKEND"]   # 'eager'
        """
        values = {
            "backend": self.dynamo_backend,
            "mode": self.dynamo_mode,
            "fullgraph": self.dynamo_use_fullgraph,
            "dynamic": self.dynamo_use_dynamic,
            "regional": self.dynamo_use_regional_compilation,
        }
        env: dict[str, str] = {}
        for option, (ours, reference) in DYNAMO_ENV.items():
            value = values[option]
            env[ours] = str(value).lower()
            env[reference] = value.upper() if option == "backend" else str(value).lower()
        return env

    def processes_here(self, hw: HardwareInfo | None = None) -> int:
        """Processes this machine runs: ``num_processes / num_machines``; None resolves to GPUs or 1."""
        if self.num_processes is None:
            if self.use_cpu:
                return 1
            count = hw.num_gpus if hw is not None else cuda_device_count()
            return max(count, 1)
        return self.num_processes // self.num_machines


def load_config(path: str | None = None) -> LaunchConfig | None:
    """Read and validate the launch config; ``None`` when there is no file.

    cfg = load_config()              # accel_nb's file, else the reference library's
    cfg = load_config("my.yaml")
    """
    found = find_config_file(path)
    if found is None:
        return None
    return LaunchConfig.from_dict(read_config_mapping(found), path=found)


def save_config(cfg: LaunchConfig, path: str | None = None) -> str:
    """Validate, then write the YAML atomically (temp file + rename); return the path written.

    An invalid config raises ``ConfigError`` and leaves any existing file untouched.
    """
    target = os.path.abspath(os.path.expanduser(path)) if path else default_config_path()
    cfg.validate(target)
    write_config_mapping(target, cfg.to_dict())
    cfg.source = target
    return target
