"""The config file as the reference's dataclasses (its ``accelerate.commands.config.config_args`` path).

``load_config_from_file`` reads a launch config file (YAML or JSON) into a ``ClusterConfig`` (a local machine
or cluster) or a ``SageMakerConfig`` (read only: accel_nb does not launch on SageMaker). It checks the keys, not
the values: ``accel-nb launch`` validates the values (``accel_nb.config.LaunchConfig``).

    from accel_nb.commands.config.config_args import default_config_file, load_config_from_file
    cfg = load_config_from_file("my_config.yaml")      # ClusterConfig(distributed_type=<DistributedType.NO: 'NO'>, ...)
    cfg.fsdp_config, cfg.to_dict()

``default_config_file`` is the file ``accel-nb launch`` reads when no ``--config_file`` is given (accel_nb's own,
else the reference's, as found when this module was imported), or where ``accel-nb config`` writes when there is
none; ``cache_dir`` is accel_nb's config folder.
"""

from __future__ import annotations

import enum
import json
import os
from dataclasses import dataclass, fields
from typing import Any

from ...config import default_config_path, find_config_file
from ...config.values import ComputeEnvironment, SageMakerDistributedType
from ...state import DistributedType

__all__ = [
    "BaseConfig",
    "ClusterConfig",
    "SageMakerConfig",
    "cache_dir",
    "default_config_file",
    "default_json_config_file",
    "default_yaml_config_file",
    "load_config_from_file",
]

default_yaml_config_file = default_config_path()
cache_dir = os.path.dirname(default_yaml_config_file)
default_json_config_file = os.path.join(cache_dir, "default_config.json")
default_config_file = find_config_file() or default_yaml_config_file

# versions a SageMaker config names when it does not say (the reference's defaults; accel_nb never launches them)
SAGEMAKER_PYTORCH_VERSION = "1.10.2"
SAGEMAKER_PYTHON_VERSION = "py38"
SAGEMAKER_TRANSFORMERS_VERSION = "4.17.0"


def load_config_from_file(config_file: str | None = None) -> ClusterConfig | SageMakerConfig:
    """The config file as a ``ClusterConfig`` (``compute_environment: LOCAL_MACHINE``, the default) or a
    ``SageMakerConfig``; ``None`` reads ``default_config_file``.

    Raises ``FileNotFoundError`` for a file that is not there and ``ValueError`` for keys the file may not have.
    """
    if config_file is None:
        config_file = find_config_file() or default_config_file  # found now: the file may be new
    elif not os.path.isfile(config_file):
        raise FileNotFoundError(
            f"the config file {config_file!r} does not exist: pass an existing file, or write one with "
            "`accel-nb config` and leave --config_file out"
        )
    data = _read_mapping(config_file)
    environment = data.get("compute_environment", ComputeEnvironment.LOCAL_MACHINE)
    kind = ClusterConfig if environment == ComputeEnvironment.LOCAL_MACHINE else SageMakerConfig
    return (
        kind.from_json_file(config_file)
        if config_file.endswith(".json")
        else kind.from_yaml_file(config_file)
    )


def _read_mapping(path: str) -> dict[str, Any]:
    with open(path, encoding="utf-8") as f:
        if path.endswith(".json"):
            data = json.load(f)
        else:
            import yaml  # deferred: import time (yaml only when a file is read)

            data = yaml.safe_load(f)
    if not isinstance(data, dict):
        raise ValueError(
            f"the config file {path!r} must hold a mapping of key: value lines, not {type(data).__name__}"
        )
    return data


def _plain(value: Any) -> Any:
    """Enums as their values; an empty mapping as None (left out of the file); mappings converted inside."""
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()} or None
    return value


@dataclass
class BaseConfig:
    """The keys every config file has (the reference's ``BaseConfig``)."""

    compute_environment: ComputeEnvironment
    distributed_type: DistributedType | SageMakerDistributedType
    mixed_precision: str
    use_cpu: bool
    debug: bool

    def __post_init__(self) -> None:
        if isinstance(self.compute_environment, str):
            self.compute_environment = ComputeEnvironment(self.compute_environment)
        if isinstance(self.distributed_type, str):
            if self.compute_environment == ComputeEnvironment.AMAZON_SAGEMAKER:
                self.distributed_type = SageMakerDistributedType(self.distributed_type)
            else:
                name = "XLA" if self.distributed_type.upper() == "TPU" else self.distributed_type
                self.distributed_type = DistributedType(name)
        if getattr(self, "dynamo_config", None) is None:
            self.dynamo_config = {}

    def to_dict(self) -> dict[str, Any]:
        """The mapping written to the file: enums as strings, unset values and empty mappings left out."""
        out = {}
        for f in fields(self):
            value = _plain(getattr(self, f.name))
            if value is not None:
                out[f.name] = value
        return out

    @staticmethod
    def process_config(config_dict: dict[str, Any]) -> dict[str, Any]:
        """Fill the keys an older file may lack and turn old spellings into the current ones (in place)."""
        config_dict.setdefault("compute_environment", ComputeEnvironment.LOCAL_MACHINE)
        if "distributed_type" not in config_dict:
            raise ValueError(
                "the config file has no distributed_type: add one (NO, MULTI_CPU, MULTI_GPU, ...)"
            )
        if "num_processes" not in config_dict and config_dict["distributed_type"] == DistributedType.NO:
            config_dict["num_processes"] = 1
        if "mixed_precision" not in config_dict:
            config_dict["mixed_precision"] = "fp16" if config_dict.get("fp16") else None
        config_dict.pop("fp16", None)
        if "dynamo_backend" in config_dict:  # files before dynamo_config
            backend = config_dict.pop("dynamo_backend")
            config_dict["dynamo_config"] = {} if backend == "NO" else {"dynamo_backend": backend}
        for key in ("use_cpu", "debug", "enable_cpu_affinity"):
            config_dict.setdefault(key, False)
        return config_dict

    @classmethod
    def _from_mapping(cls, config_dict: dict[str, Any], path: str) -> BaseConfig:
        config_dict = cls.process_config(config_dict)
        unknown = sorted(set(config_dict) - {f.name for f in fields(cls)})
        if unknown:
            raise ValueError(
                f"The config file at {path} had unknown keys ({unknown}): remove them (a typo?) or write the "
                "file again with `accel-nb config`"
            )
        return cls(**config_dict)

    @classmethod
    def from_json_file(cls, json_file: str | None = None) -> BaseConfig:
        """Read a JSON config file (default: ``default_json_config_file``)."""
        path = json_file or default_json_config_file
        return cls._from_mapping(_read_mapping(path), path)

    @classmethod
    def from_yaml_file(cls, yaml_file: str | None = None) -> BaseConfig:
        """Read a YAML config file (default: ``default_yaml_config_file``)."""
        path = yaml_file or default_yaml_config_file
        return cls._from_mapping(_read_mapping(path), path)

    def to_json_file(self, json_file: str) -> None:
        """Write the config as sorted, indented JSON."""
        with open(json_file, "w", encoding="utf-8") as f:
            f.write(json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n")

    def to_yaml_file(self, yaml_file: str) -> None:
        """Write the config as YAML."""
        import yaml  # deferred: import time (yaml only when a file is written)

        with open(yaml_file, "w", encoding="utf-8") as f:
            yaml.safe_dump(self.to_dict(), f)


@dataclass
class ClusterConfig(BaseConfig):
    """A config for a local machine or a cluster of machines (``compute_environment: LOCAL_MACHINE``).

    The reference's keys, and the ones ``accel-nb config`` adds (``gradient_accumulation_steps``,
    ``start_method``, ``max_restarts``).
    """

    num_processes: int = -1  # -1: not set (a cluster scheduler passes it)
    machine_rank: int = 0
    num_machines: int = 1
    gpu_ids: str | None = None
    main_process_ip: str | None = None
    main_process_port: int | None = None
    rdzv_backend: str | None = "static"
    same_network: bool | None = False
    main_training_function: str = "main"
    enable_cpu_affinity: bool = False
    fp8_config: dict | None = None
    deepspeed_config: dict | None = None
    fsdp_config: dict | None = None
    parallelism_config: dict | None = None
    megatron_lm_config: dict | None = None
    mpirun_config: dict | None = None
    downcast_bf16: bool | str = False
    tpu_name: str | None = None
    tpu_zone: str | None = None
    tpu_use_cluster: bool = False
    tpu_use_sudo: bool = False
    command_file: str | None = None
    commands: list[str] | None = None
    tpu_vm: list[str] | None = None
    tpu_env: list[str] | None = None
    dynamo_config: dict | None = None
    # accel_nb's own keys (accel-nb config writes them)
    gradient_accumulation_steps: int | None = None
    start_method: str | None = None
    max_restarts: int | None = None
    num_cpu_threads_per_process: int | None = None
    ipex_config: dict | None = None
    tpu_config: dict | None = None
    rdzv_conf: str | None = None

    def __post_init__(self) -> None:
        for name in ("deepspeed_config", "fsdp_config", "megatron_lm_config", "mpirun_config", "fp8_config"):
            if getattr(self, name) is None:
                setattr(self, name, {})
        if self.parallelism_config is None:
            self.parallelism_config = {}
        super().__post_init__()


@dataclass
class SageMakerConfig(BaseConfig):
    """A SageMaker config (``compute_environment: AMAZON_SAGEMAKER``): accel_nb reads it and does not launch it."""

    ec2_instance_type: str
    iam_role_name: str
    image_uri: str | None = None
    profile: str | None = None
    region: str = "us-east-1"
    num_machines: int = 1
    gpu_ids: str = "all"
    base_job_name: str = "accelerate-sagemaker-1"
    pytorch_version: str = SAGEMAKER_PYTORCH_VERSION
    transformers_version: str = SAGEMAKER_TRANSFORMERS_VERSION
    py_version: str = SAGEMAKER_PYTHON_VERSION
    sagemaker_inputs_file: str | None = None
    sagemaker_metrics_file: str | None = None
    additional_args: dict | None = None
    dynamo_config: dict | None = None
    enable_cpu_affinity: bool = False
