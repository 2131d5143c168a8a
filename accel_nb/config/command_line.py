"""The ``accel-nb launch`` command line a config stands for (the terminal questionnaire and the wizard show it).

    launch_command_line(LaunchConfig(distributed_type="MULTI_CPU", num_processes=2))
    # 'accel-nb launch --num_processes 2 --mixed_precision no --cpu train.py'

The command's name, ``PROG``, lives here too: the script face prints it in its messages.
"""

from __future__ import annotations

import shlex

from ..accelerator.backends import BACKENDS
from .launch_config import LaunchConfig

__all__ = ["PROG", "launch_command_line"]

PROG = "accel-nb"  # the script face's command (pyproject.toml's console script)


# the deepspeed_config keys `accel-nb launch` takes as flags (the reference's), in the order shown
DEEPSPEED_FLAG_KEYS = (
    "deepspeed_config_file",
    "zero_stage",
    "offload_optimizer_device",
    "offload_optimizer_nvme_path",
    "offload_param_device",
    "offload_param_nvme_path",
    "gradient_clipping",
    "zero3_save_16bit_model",
    "zero3_init_flag",
)


def launch_command_line(cfg: LaunchConfig, script: str = "train.py", explicit: bool = True) -> str:
    """The ``accel-nb launch`` command equivalent to ``cfg`` (every flag given when ``explicit``)."""
    parts = [PROG, "launch"]
    if cfg.num_processes is not None:
        parts += ["--num_processes", str(cfg.num_processes)]
    if cfg.num_machines > 1:
        parts += ["--num_machines", str(cfg.num_machines), "--machine_rank", str(cfg.machine_rank)]
        parts += ["--main_process_ip", cfg.main_process_ip or "?"]
    if cfg.main_process_port:
        parts += ["--main_process_port", str(cfg.main_process_port)]
    if explicit or cfg.mixed_precision != "no":
        parts += ["--mixed_precision", cfg.mixed_precision]
    if cfg.gradient_accumulation_steps != 1:
        parts += ["--gradient_accumulation_steps", str(cfg.gradient_accumulation_steps)]
    if cfg.gpu_ids != "all" and not cfg.use_cpu:
        parts += ["--gpu_ids", cfg.gpu_ids]
    if cfg.use_cpu or cfg.distributed_type == "MULTI_CPU":
        parts.append("--cpu")
    for backend in BACKENDS.values():  # --use_deepspeed and its settings, the layout's flags
        parts += backend.launch_flags(cfg)
    parts.append(script)
    return " ".join(shlex.quote(p) for p in parts)
