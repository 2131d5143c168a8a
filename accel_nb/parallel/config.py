"""``ParallelismConfig``: how the processes of a run split into data-parallel replicas, FSDP shards,
tensor-parallel and context-parallel groups, and the one torch ``DeviceMesh`` that names them.

    pc = ParallelismConfig(dp_shard_size=2, tp_size=2)        # 4 processes: FSDP over 2, TP over 2
    accelerator = Accelerator(parallelism_config=pc)
    accelerator.torch_device_mesh["tp"]                        # this rank's tensor-parallel group

The sizes multiply to the number of processes. A size left at None is read from the launch
(``accel-nb launch --parallelism_config_tp_size 2``, which sets ``ACCEL_NB_PARALLELISM_CONFIG_TP_SIZE``
and the reference's ``PARALLELISM_CONFIG_TP_SIZE``), else it is 1.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from ..env_names import ENV_USE_PARALLELISM_CONFIG, PARALLELISM_ENV, REFERENCE_NAMES

__all__ = [
    "LayoutError",
    "MESH_ORDER",
    "ParallelismConfig",
    "TorchContextParallelConfig",
    "TorchTensorParallelConfig",
    "check_launch_settings",
    "launch_env",
    "layout_settings",
    "proposed_tp_size",
    "parallelism_from_env",
]

# the mesh's dimensions, outermost first: tensor parallel innermost (its ranks are neighbours)
MESH_ORDER = ("dp_replicate", "dp_shard", "cp", "tp")
_SIZES = ("dp_replicate_size", "dp_shard_size", "tp_size", "cp_size")
_COMM_STRATEGIES = ("allgather", "alltoall")


def _env(name: str) -> str | None:
    ours, reference = PARALLELISM_ENV[name]
    value = os.environ.get(ours) or os.environ.get(reference)
    return value or None


@dataclass
class TorchTensorParallelConfig:
    """Settings of the tensor-parallel dimension (the reference's class; ``enable_async_tp`` is accepted and ignored)."""

    enable_async_tp: bool = False


@dataclass
class TorchContextParallelConfig:
    """Settings of the context-parallel dimension: how the ranks exchange the keys and values.

    ``cp_comm_strategy``: ``"allgather"`` (default, what accel_nb builds: every rank gathers the whole
    sequence's keys and values) or ``"alltoall"`` (the reference's other choice: accepted here, refused
    by ``Accelerator`` with ``cp_size > 1``).
    """

    cp_comm_strategy: str | None = None

    def __post_init__(self) -> None:
        if self.cp_comm_strategy is None:
            self.cp_comm_strategy = _env("cp_comm_strategy") or "allgather"
        if self.cp_comm_strategy not in _COMM_STRATEGIES:
            raise ValueError(  # the reference's words (code and tests match on them)
                f"Invalid cp_comm_strategy: {self.cp_comm_strategy}. Must be one of 'allgather' or 'alltoall'."
            )


@dataclass
class ParallelismConfig:
    """How ``Accelerator.prepare`` splits the model and the data over the processes.

    - ``dp_replicate_size``: whole-model replicas (DDP, or the replicated dimension of HSDP).
    - ``dp_shard_size``: processes one FSDP2 shard group spans (parameters, gradients and optimizer
      state split over them).
    - ``tp_size``: processes one tensor-parallel group spans (each layer's weights split over
      them, by the model's tensor-parallel plan or ``tp_plan``).
    - ``cp_size``: processes one context-parallel group spans (the sequence split over them).
    - ``tp_plan``: ``"auto"`` (the model's own plan: ``model.tp_plan`` or its config's
      ``base_model_tp_plan``) or a dict ``{"layers.*.mlp.up_proj": "colwise", ...}`` of
      module-name patterns to ``colwise`` / ``rowwise`` / ``colwise_rep`` / ``rowwise_rep`` /
      ``replicate`` or a torch ``ParallelStyle``.

    The sizes multiply to the number of processes: ``dp_replicate × dp_shard × cp × tp``.
    Every rank of a tensor- or context-parallel group reads the same batches; the data is split
    over ``dp_replicate × dp_shard`` only.

        Accelerator(parallelism_config=ParallelismConfig(dp_shard_size=2, tp_size=2))   # 4 processes
    """

    dp_replicate_size: int | None = None
    dp_shard_size: int | None = None
    tp_size: int | None = None
    cp_size: int | None = None
    cp_backend: str | None = None
    sp_size: int | None = None
    sp_backend: str | None = None
    tp_handler: TorchTensorParallelConfig | None = None
    cp_handler: TorchContextParallelConfig | None = None
    sp_handler: Any = None
    tp_plan: Any = "auto"
    device_mesh: Any = field(default=None, repr=False, compare=False)
    joint_meshes: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        for name in _SIZES:
            value = getattr(self, name)
            if value is None:
                value = _env(name) or 1
            if isinstance(value, bool) or not str(value).strip().isdigit() or int(value) < 1:
                raise ValueError(f"ParallelismConfig {name}={value!r} must be a whole number >= 1")
            setattr(self, name, int(value))
        if self.cp_backend is None:
            self.cp_backend = _env("cp_backend") or "torch"
        if self.cp_backend != "torch":
            raise ValueError(
                f"cp_backend={self.cp_backend!r} is not supported: accel_nb's context parallel is torch's "
                "(cp_backend='torch')"
            )
        if self.sp_size not in (None, 1):
            raise ValueError(
                f"sp_size={self.sp_size}: DeepSpeed's sequence parallelism (ALST/Ulysses) is not part of accel_nb; "
                "use cp_size (torch's context parallel) to split long sequences, and leave sp_size at 1"
            )
        self.sp_size = 1
        if self.tp_size > 1 and self.tp_handler is None:
            self.tp_handler = TorchTensorParallelConfig()
        if self.cp_size > 1 and self.cp_handler is None:
            self.cp_handler = TorchContextParallelConfig()
        if self.cp_handler is not None and not isinstance(self.cp_handler, TorchContextParallelConfig):
            raise TypeError(
                f"cp_handler must be a TorchContextParallelConfig, got {type(self.cp_handler).__name__}"
            )
        if (self.tp_size > 1 or self.cp_size > 1) and self.dp_replicate_size > 1 and self.dp_shard_size == 1:
            raise ValueError(
                f"ParallelismConfig(dp_replicate_size={self.dp_replicate_size}, dp_shard_size=1, "
                f"tp_size={self.tp_size}, cp_size={self.cp_size}): tensor/context parallel does not compose with "
                "plain replicated data parallel (DDP); shard instead: set dp_shard_size="
                f"{self.dp_replicate_size} and dp_replicate_size=1 (FSDP × TP/CP), or keep both > 1 (HSDP × TP/CP)"
            )
        if self.tp_plan is not None and not isinstance(self.tp_plan, (str, dict)):
            raise TypeError(
                f"tp_plan must be 'auto' or a dict of module-name patterns to styles, got {type(self.tp_plan).__name__}"
            )
        if isinstance(self.tp_plan, str) and self.tp_plan != "auto":
            raise ValueError(f"tp_plan={self.tp_plan!r}: give 'auto' (the model's own plan) or a dict")

    # -- sizes and names ------------------------------------------------------------------------------
    @property
    def total_size(self) -> int:
        """The number of processes this layout needs: the product of every size."""
        return self.dp_replicate_size * self.dp_shard_size * self.tp_size * self.cp_size * self.sp_size

    @property
    def data_parallel_size(self) -> int:
        """How many different batches one step reads: ``dp_replicate_size × dp_shard_size``."""
        return self.dp_replicate_size * self.dp_shard_size

    @property
    def non_data_parallel_size(self) -> int:
        """How many processes read the same batch: ``tp_size × cp_size``."""
        return self.tp_size * self.cp_size * self.sp_size

    @property
    def dp_replicate_enabled(self) -> bool:
        return self.dp_replicate_size > 1

    @property
    def dp_shard_enabled(self) -> bool:
        return self.dp_shard_size > 1

    @property
    def tp_enabled(self) -> bool:
        return self.tp_size > 1

    @property
    def cp_enabled(self) -> bool:
        return self.cp_size > 1

    @property
    def sp_enabled(self) -> bool:
        return False

    @property
    def dp_dim_names(self) -> list[str]:
        """The enabled dimensions the data is split over."""
        return [d for d in ("dp_replicate", "dp_shard") if getattr(self, f"{d}_enabled")]

    @property
    def non_dp_dim_names(self) -> list[str]:
        """The enabled dimensions whose ranks read the same batch."""
        return [d for d in ("tp", "cp") if getattr(self, f"{d}_enabled")]

    @property
    def dp_shard_cp_dim_names(self) -> list[str]:
        """The enabled dimensions FSDP shards the model over (the shard group and the context-parallel group)."""
        return [d for d in ("dp_shard", "cp") if getattr(self, f"{d}_enabled")]

    @property
    def dp_cp_dim_names(self) -> list[str]:
        """The enabled dimensions a loss is averaged over."""
        return [d for d in ("dp_replicate", "dp_shard", "cp") if getattr(self, f"{d}_enabled")]

    @property
    def fsdp_dim_names(self) -> list[str]:
        """The mesh dimensions ``fully_shard`` gets: ``dp_shard_cp``, after ``dp_replicate`` for HSDP."""
        return (["dp_replicate"] if self.dp_replicate_enabled else []) + ["dp_shard_cp"]

    @property
    def active_mesh_dims(self) -> list[str]:
        """The enabled dimensions, in mesh order."""
        return [d for d in MESH_ORDER if getattr(self, f"{d}_enabled")]

    @property
    def shards_with_fsdp(self) -> bool:
        """True when ``prepare`` shards models with FSDP2 (``dp_shard_size`` or ``cp_size`` above 1)."""
        return self.dp_shard_enabled or self.cp_enabled

    def describe(self) -> str:
        """``dp_replicate=1 × dp_shard=2 × cp=1 × tp=2`` (the order of the mesh)."""
        return " × ".join(f"{d}={getattr(self, f'{d}_size')}" for d in MESH_ORDER)

    # -- checks and the mesh --------------------------------------------------------------------------
    def check_world_size(self, num_processes: int) -> None:
        """A clear error when the sizes do not multiply to ``num_processes`` (before any mesh or training)."""
        if self.total_size == num_processes:
            return
        hint = ""
        others = self.total_size // max(self.dp_shard_size, 1)
        if num_processes % others == 0:
            hint = f" (e.g. dp_shard_size={num_processes // others})"
        raise ValueError(
            f"ParallelismConfig({self.describe()}) multiplies to {self.total_size} processes but this run has "
            f"{num_processes}: make dp_replicate_size × dp_shard_size × cp_size × tp_size equal {num_processes}"
            f"{hint}, or launch {self.total_size} processes"
        )

    def mesh_shape(self) -> tuple[tuple[str, ...], tuple[int, ...]]:
        """``(names, sizes)`` of the mesh's enabled dimensions, in mesh order (empty for one process)."""
        names = tuple(self.active_mesh_dims)
        return names, tuple(getattr(self, f"{d}_size") for d in names)

    def _get_mesh(self) -> tuple[tuple[Any, ...], ...]:
        """The reference's private spelling of :meth:`mesh_shape`: ``(names, sizes)``, or ``()`` for one process."""
        names, shape = self.mesh_shape()
        return (names, shape) if names else ()

    def build_device_mesh(self, device_type: str) -> Any:
        """The torch ``DeviceMesh`` of this layout (None when every size is 1).

        Besides its dimensions it has the joint ones ``dp`` (the data split), ``dp_shard_cp``
        (what FSDP shards over) and ``dp_cp`` (what a loss is averaged over), where enabled.
        """
        names, shape = self.mesh_shape()
        if not names:
            return None
        from torch.distributed.device_mesh import init_device_mesh  # deferred: torch.distributed

        mesh = init_device_mesh(device_type, shape, mesh_dim_names=names)
        self.joint_meshes = {}
        for joint, dims in (
            ("dp", self.dp_dim_names),
            ("dp_shard_cp", self.dp_shard_cp_dim_names),
            ("dp_cp", self.dp_cp_dim_names),
        ):
            # sliced by the list itself, as the reference does (code patching the mesh sees its keys)
            if dims:
                self.joint_meshes[joint] = mesh[dims]._flatten(joint)
        return mesh

    def _flatten_for_clipping(self, mesh: Any) -> None:
        if self.tp_enabled and self.dp_shard_enabled and not self.cp_enabled:
            # a tensor-parallel weight's gradient norm is partial over dp_shard x tp: with the two
            # flattened DTensor reduces it in one all_reduce (it warned on every rank, once per launch,
            # "2 sequential all_reduce operations ... flatten mesh dimensions", at clip_grad_norm_).
            # Done where accel_nb builds its mesh, so that build_device_mesh flattens what the reference's does.
            self.joint_meshes["dp_shard_tp"] = mesh[("dp_shard", "tp")]._flatten("dp_shard_tp")

    def submesh(self, *names: str) -> Any:
        """The mesh of the named dimensions (``"tp"``, or ``"dp_replicate", "dp_shard_cp"``), joint ones included.

        A joint dimension of one enabled dimension is that dimension itself (no flattened copy needed).
        """
        mesh = self.get_device_mesh()
        dims = []
        for name in names:
            parts = {
                "dp": self.dp_dim_names,
                "dp_shard_cp": self.dp_shard_cp_dim_names,
                "dp_cp": self.dp_cp_dim_names,
            }
            dims.append(parts[name][0] if name in parts and len(parts[name]) == 1 else name)
        if len(dims) == 1:
            joint = self.joint_meshes.get(dims[0]) if dims[0] not in mesh.mesh_dim_names else None
            return joint if joint is not None else mesh[dims[0]]
        return mesh[tuple(dims)]

    def get_device_mesh(self, device_type: str | None = None) -> Any:
        """The mesh built once for ``device_type`` (an error for another device type)."""
        if self.device_mesh is None:
            if device_type is None:
                raise ValueError("the device mesh is not built yet: pass device_type (e.g. 'cpu', 'cuda')")
            self.device_mesh = self.build_device_mesh(device_type)
            if self.device_mesh is not None:
                self._flatten_for_clipping(self.device_mesh)
        elif device_type is not None and self.device_mesh.device_type != device_type:
            raise ValueError(
                f"this ParallelismConfig's mesh was built for {self.device_mesh.device_type!r}, not {device_type!r}; "
                "create a new ParallelismConfig for the other device"
            )
        return self.device_mesh

    def data_parallel_rank(self, rank: int) -> int:
        """Which batch shard the process of global ``rank`` reads (the tp/cp ranks of one group share it)."""
        return rank // self.non_data_parallel_size

    def coordinates(self, rank: int) -> dict[str, int]:
        """``{"dp_replicate": i, "dp_shard": j, "cp": k, "tp": l}`` of the process of global ``rank``."""
        coords: dict[str, int] = {}
        for d in reversed(MESH_ORDER):
            size = getattr(self, f"{d}_size")
            coords[d] = rank % size
            rank //= size
        return {d: coords[d] for d in MESH_ORDER}

    def to_json(self) -> dict[str, Any]:
        """The sizes and backends (what a launch config stores)."""
        return {name: getattr(self, name) for name in (*_SIZES, "cp_backend")}


def parallelism_from_env() -> ParallelismConfig | None:
    """The ``ParallelismConfig`` the launcher asked for (``ACCEL_NB_USE_PARALLELISM_CONFIG`` or the
    reference's ``ACCELERATE_USE_PARALLELISM_CONFIG`` set to true), else None."""
    flag = os.environ.get(ENV_USE_PARALLELISM_CONFIG) or os.environ.get(
        REFERENCE_NAMES[ENV_USE_PARALLELISM_CONFIG]
    )
    if str(flag).strip().lower() not in ("1", "true", "yes", "on"):
        return None
    return ParallelismConfig()


# -- the launch config's ``parallelism_config`` mapping (the reference's keys: parallelism_config_tp_size, ...) --
LAUNCH_KEYS = ("dp_replicate_size", "dp_shard_size", "tp_size", "cp_size", "cp_backend", "cp_comm_strategy")
LAUNCH_PREFIX = "parallelism_config_"


def check_launch_settings(settings: Any, num_processes: int | None = None) -> dict[str, Any]:
    """The launch config's ``parallelism_config`` mapping, checked and with the reference's prefixed keys.

    Keys may be given with or without the ``parallelism_config_`` prefix. Raises ValueError naming
    the bad key or, with ``num_processes``, sizes that do not multiply to it.

        check_launch_settings({"tp_size": 2, "dp_shard_size": 2}, 4)
        # {'parallelism_config_tp_size': 2, 'parallelism_config_dp_shard_size': 2}
    """
    if not isinstance(settings, dict):
        raise ValueError(f"parallelism_config must be a mapping such as {{tp_size: 2}}, got {settings!r}")
    out: dict[str, Any] = {}
    for key, value in settings.items():
        name = str(key)[len(LAUNCH_PREFIX) :] if str(key).startswith(LAUNCH_PREFIX) else str(key)
        if name in (
            "sp_size",
            "sp_backend",
            "sp_seq_length",
            "sp_seq_length_is_variable",
            "sp_attn_implementation",
        ):
            if name == "sp_size" and value not in (None, 1, "1"):
                raise ValueError(
                    f"parallelism_config {key}={value!r}: DeepSpeed's sequence parallelism is not part of accel_nb; "
                    "use cp_size (torch's context parallel)"
                )
            continue
        if name not in LAUNCH_KEYS:
            raise ValueError(
                f"parallelism_config has an unknown key {key!r}; known: "
                + ", ".join(LAUNCH_PREFIX + k for k in LAUNCH_KEYS)
            )
        if value is None:
            continue
        out[LAUNCH_PREFIX + name] = value
    sizes = {k[len(LAUNCH_PREFIX) :]: v for k, v in out.items() if k.endswith("_size")}
    extra = {k[len(LAUNCH_PREFIX) :]: v for k, v in out.items() if not k.endswith("_size")}
    config = ParallelismConfig(**sizes, cp_backend=extra.get("cp_backend"))  # checks each value
    if "cp_comm_strategy" in extra:
        TorchContextParallelConfig(extra["cp_comm_strategy"])
    for name in sizes:
        out[LAUNCH_PREFIX + name] = getattr(config, name)
    if num_processes is not None and config.total_size not in (1, num_processes):
        config.check_world_size(num_processes)
    return out


# the sizes a user chooses for a layout (``accel-nb config`` asks them, the wizard has a control each);
# FSDP shards over the processes they leave: dp_shard_size = processes / (tp × cp × dp_replicate)
LAYOUT_CHOICES = ("tp_size", "cp_size", "dp_replicate_size")


class LayoutError(ValueError):
    """Layout sizes that cannot be used: ``key`` (the size at fault, or ``parallelism_config`` for the sizes
    together), ``value`` (what was given, with its numbers), ``reason`` and ``allowed`` (what would do)."""

    def __init__(self, key: str, value: Any, reason: str, allowed: str) -> None:
        super().__init__(f"{value} {reason}; allowed: {allowed}")
        self.key, self.value, self.reason, self.allowed = key, value, reason, allowed


def proposed_tp_size(num_processes: int) -> int:
    """The tensor-parallel size a layout starts from: 2 where that leaves FSDP 2 or more processes, else 1."""
    n = int(num_processes or 1)
    return 2 if n % 2 == 0 and n >= 4 else 1


def _either(values: list[str]) -> str:
    """``"1, 2 or 4"``."""
    return values[0] if len(values) == 1 else f"{', '.join(values[:-1])} or {values[-1]}"


def layout_settings(
    num_processes: int, tp_size: Any = 1, cp_size: Any = 1, dp_replicate_size: Any = 1, fsdp: bool = True
) -> dict[str, int]:
    """The launch config's ``parallelism_config`` mapping for these sizes, FSDP sharding over the rest.

    What ``accel-nb config`` and the notebook wizard both write (the reference's four prefixed keys).
    Raises :class:`LayoutError` naming the numbers: a size that is not a whole number >= 1, sizes
    whose product does not divide ``num_processes``, or a layout that does not compose (with ``fsdp``,
    the run's FSDP needs ``dp_shard_size × cp_size`` of 2 or more to shard over).

        layout_settings(4, tp_size=2)
        # {'parallelism_config_dp_replicate_size': 1, 'parallelism_config_dp_shard_size': 2,
        #  'parallelism_config_tp_size': 2, 'parallelism_config_cp_size': 1}
    """
    n = int(num_processes or 1)
    sizes: dict[str, int] = {}
    for key, value in zip(LAYOUT_CHOICES, (tp_size, cp_size, dp_replicate_size), strict=True):
        if isinstance(value, bool) or not str(value).strip().isdigit() or int(value) < 1:
            raise LayoutError(key, f"{key}={value!r}", "is not a whole number >= 1", "1, 2, 3, ...")
        sizes[key] = int(value)
    tp, cp, replicas = sizes["tp_size"], sizes["cp_size"], sizes["dp_replicate_size"]
    used = tp * cp * replicas
    if n % used:
        fits = [str(d) for d in range(1, n + 1) if n % d == 0]
        raise LayoutError(
            "parallelism_config",
            f"tp_size {tp} × cp_size {cp} × dp_replicate_size {replicas} = {used}",
            f"does not divide the {n} processes (FSDP shards over what the other sizes leave)",
            f"sizes whose product is {_either(fits)}",
        )
    if fsdp and n > 1 and (n // used) * cp == 1:
        fits = [str(d) for d in range(1, n) if n % d == 0 and (n // d > 1)]
        raise LayoutError(
            "parallelism_config",
            f"tp_size {tp} × cp_size {cp} × dp_replicate_size {replicas} = {used}",
            f"leaves FSDP no processes to shard over (dp_shard_size 1 of the {n} processes)",
            f"sizes whose product is {_either(fits)} (or a context-parallel size above 1)",
        )
    settings = {"dp_replicate_size": replicas, "dp_shard_size": n // used, "tp_size": tp, "cp_size": cp}
    try:
        return check_launch_settings(settings, n)
    except ValueError as exc:  # e.g. replicas with tensor parallel and no FSDP shard left
        raise LayoutError(
            "parallelism_config",
            f"dp_replicate_size {replicas} × dp_shard_size {n // used} × cp_size {cp} × tp_size {tp}",
            f"cannot be built: {exc}",
            "fewer replicas, so that FSDP shards over 2 or more processes",
        ) from None


def launch_env(settings: dict[str, Any]) -> dict[str, str]:
    """The environment a launched rank's Accelerator builds its ParallelismConfig from (both spellings)."""
    env = {ENV_USE_PARALLELISM_CONFIG: "true", REFERENCE_NAMES[ENV_USE_PARALLELISM_CONFIG]: "true"}
    for key, value in settings.items():
        name = key[len(LAUNCH_PREFIX) :] if key.startswith(LAUNCH_PREFIX) else key
        if name in PARALLELISM_ENV and value is not None:
            for variable in PARALLELISM_ENV[name]:
                env[variable] = str(value)
    return env
