"""The environment variables of a launch, named once: what the launcher sets for each rank and the
rank side reads, with the reference library's spelling of each where it has one (the launcher sets
both, the rank reads ours first), and the settings a user exports to change a launch.

    from accel_nb.env_names import ENV_MIXED_PRECISION, REFERENCE_NAMES
    env = {ENV_MIXED_PRECISION: "bf16", REFERENCE_NAMES[ENV_MIXED_PRECISION]: "bf16"}

Only names live here (no reading, no defaults): every module that sets or reads one imports it.
"""

from __future__ import annotations

__all__ = [
    "DYNAMO_ENV",
    "ENV_COLLECTIVE_TIMEOUT",
    "ENV_DEEPSPEED_CONFIG",
    "ENV_FORKED",
    "ENV_FSDP_CONFIG",
    "ENV_GRADIENT_ACCUMULATION_STEPS",
    "ENV_KEEP_LOGS",
    "ENV_LAUNCH_TIMEOUT",
    "ENV_MIXED_PRECISION",
    "ENV_USE_PARALLELISM_CONFIG",
    "PARALLELISM_ENV",
    "ENV_RENDEZVOUS_TIMEOUT",
    "ENV_TORCH_DEVICE",
    "ENV_USE_CPU",
    "ENV_XLA_LAUNCH",
    "REFERENCE_NAMES",
    "REFERENCE_USE_CPU",
    "REFERENCE_USE_DEEPSPEED",
    "REFERENCE_USE_FSDP",
]

# -- set by the launcher for each rank ----------------------------------------------------------------
ENV_MIXED_PRECISION = "ACCEL_NB_MIXED_PRECISION"
ENV_GRADIENT_ACCUMULATION_STEPS = "ACCEL_NB_GRADIENT_ACCUMULATION_STEPS"
ENV_USE_CPU = "ACCEL_NB_USE_CPU"  # "1"
ENV_FORKED = "ACCEL_NB_FORKED"  # "1": the rank is a fork of the launching process
ENV_DEEPSPEED_CONFIG = "ACCEL_NB_DEEPSPEED_CONFIG"  # the launch config's deepspeed_config, as JSON
ENV_FSDP_CONFIG = "ACCEL_NB_FSDP_CONFIG"  # the launch config's fsdp_config, as JSON
ENV_XLA_LAUNCH = "ACCEL_NB_XLA_LAUNCH"  # "1": the ranks were started by the XLA launcher
ENV_USE_PARALLELISM_CONFIG = "ACCEL_NB_USE_PARALLELISM_CONFIG"  # "true": build a ParallelismConfig from below

# ParallelismConfig field -> (accel_nb's variable, the reference's): the launch config's parallelism sizes
PARALLELISM_ENV = {
    field: (f"ACCEL_NB_PARALLELISM_CONFIG_{field.upper()}", f"PARALLELISM_CONFIG_{field.upper()}")
    for field in (
        "dp_replicate_size",
        "dp_shard_size",
        "tp_size",
        "cp_size",
        "cp_backend",
        "cp_comm_strategy",
    )
}

# -- read by the rank (a user may export it) ---------------------------------------------------------
ENV_TORCH_DEVICE = "ACCEL_NB_TORCH_DEVICE"  # a torch device string ("cuda:1", "cpu"): this process's device

# option -> (accel_nb's variable, the reference's): the launch config's dynamo settings
DYNAMO_ENV = {
    "backend": ("ACCEL_NB_DYNAMO_BACKEND", "ACCELERATE_DYNAMO_BACKEND"),
    "mode": ("ACCEL_NB_DYNAMO_MODE", "ACCELERATE_DYNAMO_MODE"),
    "fullgraph": ("ACCEL_NB_DYNAMO_USE_FULLGRAPH", "ACCELERATE_DYNAMO_USE_FULLGRAPH"),
    "dynamic": ("ACCEL_NB_DYNAMO_USE_DYNAMIC", "ACCELERATE_DYNAMO_USE_DYNAMIC"),
    "regional": ("ACCEL_NB_DYNAMO_USE_REGIONAL_COMPILATION", "ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION"),
}

# -- the reference library's spellings (scripts and configs written for it set or read these) ---------
REFERENCE_NAMES = {
    ENV_MIXED_PRECISION: "ACCELERATE_MIXED_PRECISION",
    ENV_GRADIENT_ACCUMULATION_STEPS: "ACCELERATE_GRADIENT_ACCUMULATION_STEPS",
    ENV_USE_CPU: "ACCELERATE_USE_CPU",
    ENV_TORCH_DEVICE: "ACCELERATE_TORCH_DEVICE",
    ENV_USE_PARALLELISM_CONFIG: "ACCELERATE_USE_PARALLELISM_CONFIG",
}
REFERENCE_USE_CPU = REFERENCE_NAMES[ENV_USE_CPU]  # "true"
REFERENCE_USE_DEEPSPEED = "ACCELERATE_USE_DEEPSPEED"  # "true"
REFERENCE_USE_FSDP = "ACCELERATE_USE_FSDP"  # "true"

# -- settings a user exports --------------------------------------------------------------------------
ENV_RENDEZVOUS_TIMEOUT = "ACCEL_NB_RENDEZVOUS_TIMEOUT"  # seconds the ranks wait for each other to join
ENV_COLLECTIVE_TIMEOUT = "ACCEL_NB_COLLECTIVE_TIMEOUT"  # seconds a collective may wait
ENV_KEEP_LOGS = "ACCEL_NB_KEEP_LOGS"  # not "" or "0": keep each rank's log files after the launch
# seconds without output from any rank before ``accel-nb launch`` calls it a hang (its --timeout; the
# reference's launcher has no such option, so no ACCELERATE_ spelling)
ENV_LAUNCH_TIMEOUT = "ACCEL_NB_LAUNCH_TIMEOUT"
