"""The wizard's words: the equivalent launch commands (``%%accelerate``, ``notebook_launcher(...)``,
``DeepSpeedPlugin(...)``, ``MegatronLMPlugin(...)``) for a launch config, as text and as HTML that wraps between
whole flags, the mapping an engine's controls stand for, and a few lines of what this machine has. Plain
functions: no widget is built here.
"""

from __future__ import annotations

import html
import re
from typing import Any

from ..byte_sizes import human_bytes
from ..config import LaunchConfig, launch_command_line
from ..config.questions import ENGINES, Engine, question
from ..hardware import HardwareInfo


def engine_settings(engine: Engine, values: dict[str, Any]) -> dict[str, Any]:
    """The mapping (``deepspeed_config``, ``megatron_lm_config``) an engine's controls' ``values`` stand for: the
    table's questions of its section whose rule holds (``accel_nb.config.questions``), in its order, an empty text
    left out. ``accel-nb config`` writes the same mapping for the same answers.

    engine_settings(ENGINES[0], {"zero_stage": 1, "offload_param_device": "cpu", ...})   # no offload below stage 3
    """
    answers = {engine.switch: True, **values}
    out: dict[str, Any] = {}
    for q in map(question, engine.keys()):
        if not q.asked(answers):
            continue
        value = values.get(q.key, q.default)
        if q.kind == "text":
            value = (value or "").strip() or None
            if value is None and q.key == "deepspeed_config_file":
                continue  # empty: the settings below
        elif q.kind == "choice":
            value = type(q.options()[0])(q.default if value in (None, "") else value)
        else:
            value = {"int": int, "float": float, "bool": bool}[q.kind](value)
        out[q.key] = value
    return out


def plugin_call(cfg: LaunchConfig) -> str:
    """``DeepSpeedPlugin(...)`` or ``MegatronLMPlugin(...)`` with the engine's mapping as its arguments ("": none)."""
    names = {"deepspeed_config_file": "hf_ds_config"}
    plugin = {
        "DEEPSPEED": "deepspeed_plugin=DeepSpeedPlugin",
        "MEGATRON_LM": "megatron_lm_plugin=MegatronLMPlugin",
    }
    engine = next((e for e in ENGINES if e.distributed_type == cfg.distributed_type), None)
    if engine is None:
        return ""
    settings = cfg.extras.get(engine.config_key) or {}
    args = ", ".join(
        f"{names.get(k, k.removeprefix('megatron_lm_'))}={v!r}" for k, v in settings.items() if v is not None
    )
    return f"{plugin[engine.distributed_type]}({args})"


_LAYOUT_PREFIX = "parallelism_config_"
_MESH_ORDER = ("dp_replicate", "dp_shard", "cp", "tp")


def _sizes(layout: dict[str, Any]) -> dict[str, int]:
    """``{"dp_replicate": 1, "dp_shard": 2, "cp": 1, "tp": 2}`` of a launch config's ``parallelism_config``."""
    return {d: int(layout.get(f"{_LAYOUT_PREFIX}{d}_size") or 1) for d in _MESH_ORDER}


def layout_summary(layout: dict[str, Any]) -> str:
    """One line for the wizard: how many processes FSDP shards over, and the whole mesh.

    layout_summary({"parallelism_config_dp_shard_size": 2, "parallelism_config_tp_size": 2})
    # 'FSDP shards over 2 processes: dp_replicate=1 × dp_shard=2 × cp=1 × tp=2'
    """
    sizes = _sizes(layout)
    mesh = " × ".join(f"{d}={n}" for d, n in sizes.items())
    return f"FSDP shards over {sizes['dp_shard'] * sizes['cp']} processes: {mesh}"


def parallelism_config_call(layout: dict[str, Any]) -> str:
    """``ParallelismConfig(dp_shard_size=2, tp_size=2)``: the sizes above 1 of a ``parallelism_config`` mapping."""
    args = ", ".join(f"{d}_size={n}" for d, n in _sizes(layout).items() if n > 1)
    return f"ParallelismConfig({args})"


def _groups(line: str) -> list[str]:
    """A command's pieces that must stay on one line: ``--flag value`` pairs, ``name=value,`` arguments."""
    tokens = line.split(" ")
    out: list[str] = []
    i = 0
    while i < len(tokens):
        token = tokens[i]
        if (
            token.startswith("-")
            and "=" not in token
            and i + 1 < len(tokens)
            and tokens[i + 1]
            and not tokens[i + 1].startswith(("-", "#"))
        ):
            out.append(token + " " + tokens[i + 1])
            i += 2
        else:
            out.append(token)
            i += 1
    return out


def _unbroken(group: str) -> str:
    """One piece as a span that never breaks; a long Python call (``Accelerator(parallelism_config=...)``)
    may break after its ``(`` and ``,`` (a ``<wbr>``: nothing is copied with the text)."""
    parts = re.split(r"(?<=[(,])", group) if len(group) > 32 and "(" in group else [group]
    return "<wbr>".join(f"<span style='white-space:nowrap'>{html.escape(p)}</span>" for p in parts if p)


def commands_html(text: str) -> str:
    """The equivalent launches as HTML that wraps in a narrow cell between whole flags (never inside one).

    Each line is one command; a wrapped command's next lines are indented under it.
    """
    lines = []
    for line in text.split("\n"):
        if not line:
            lines.append("<div style='height:0.6em'></div>")
            continue
        colour = "color:#6a737d;" if line.startswith("#") else ""
        pieces = " ".join(_unbroken(g) for g in _groups(line))
        lines.append(f"<div style='{colour}padding-left:2em;text-indent:-2em'>{pieces}</div>")
    return (
        "<div class='accel-nb-wizard-commands' style='font-family:var(--jp-code-font-family,monospace);"
        "font-size:var(--jp-code-font-size,13px);white-space:normal;overflow-wrap:normal;line-height:1.45'>"
        + "".join(lines)
        + "</div>"
    )


def launches_text(cfg: LaunchConfig) -> str:
    """The wizard's equivalent launches of ``cfg``: the ``%%accelerate`` line, the ``notebook_launcher(...)`` call
    and the ``accel-nb launch`` command, each under a comment line (one command a line)."""
    share = " (this machine's share: notebook launches use one machine)" if cfg.num_machines > 1 else ""
    saved = {
        "DEEPSPEED": " (DeepSpeed's settings come from the saved config: Save first)",
        "FSDP": " (FSDP's settings come from the saved config: Save first)",
        "MEGATRON_LM": " (Megatron-LM's settings come from the saved config: Save first)",
    }.get(cfg.distributed_type, "")
    if cfg.extras.get("parallelism_config"):  # %%accelerate reads the layout from the saved file too
        saved = {
            "FSDP": " (FSDP's settings and the layout come from the saved config: Save first)",
        }.get(cfg.distributed_type, " (the layout comes from the saved config: Save first)")
    return "\n".join(
        [
            f"# a notebook cell{share}{saved}",
            magic_line(cfg),
            "",
            f"# a function from a notebook{share}",
            notebook_launcher_call(cfg),
            "",
            "# a script, from a terminal" + (saved if cfg.distributed_type == "FSDP" else ""),
            launch_command_line(cfg),
        ]
    )


def magic_line(cfg: LaunchConfig) -> str:
    """The ``%%accelerate`` line that launches a cell as ``cfg`` says."""
    parts = ["%%accelerate"]
    if cfg.num_processes is not None:
        parts += ["--num_processes", str(cfg.num_processes // cfg.num_machines)]
    parts += ["--mixed_precision", cfg.mixed_precision]
    if cfg.gradient_accumulation_steps != 1:
        parts += ["--gradient_accumulation_steps", str(cfg.gradient_accumulation_steps)]
    if cfg.start_method != "auto":
        parts += ["--start_method", cfg.start_method]
    if cfg.main_process_port:
        parts += ["--use_port", str(cfg.main_process_port)]
    if cfg.use_cpu:
        parts.append("--cpu")
    return " ".join(parts)


def notebook_launcher_call(cfg: LaunchConfig, function: str = "training_function") -> str:
    """The ``notebook_launcher(...)`` call that launches ``function`` as ``cfg`` says (one machine)."""
    args = [function]
    if cfg.num_processes is not None:
        args.append(f"num_processes={cfg.num_processes // cfg.num_machines}")
    args.append(f"mixed_precision={cfg.mixed_precision!r}")
    if cfg.main_process_port:
        args.append(f"use_port={cfg.main_process_port}")
    if cfg.start_method != "auto":
        args.append(f"start_method={cfg.start_method!r}")
    if cfg.use_cpu:
        args.append("cpu=True")
    call = f"notebook_launcher({', '.join(args)})"
    if plugin_call(cfg):  # notebook_launcher reads no config file: the function asks for the engine
        call += f"  # with Accelerator({plugin_call(cfg)}) in {function}"
    layout = cfg.extras.get("parallelism_config") or {}
    if layout:  # the layout, like FSDP, is in the function's code (notebook_launcher reads no config)
        call += f"  # with Accelerator(parallelism_config={parallelism_config_call(layout)}) in {function}"
    elif cfg.distributed_type == "FSDP":
        call += f"  # with Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin()) in {function}"
    if cfg.dynamo_backend != "no":  # notebook_launcher reads no config file: the function asks for it
        call += f"  # with Accelerator(dynamo_backend={cfg.dynamo_backend!r}) in {function}"
    return call + (
        "  # this machine's share; notebook launches use one machine" if cfg.num_machines > 1 else ""
    )


def hardware_summary(hw: HardwareInfo) -> str:
    """A few lines of what the machine has (plain text)."""
    cores = f"{hw.cpu_logical_cores} logical cores" + (
        f" ({hw.cpu_physical_cores} physical)" if hw.cpu_physical_cores else ""
    )
    ram = f"{human_bytes(hw.ram_total)} RAM" if hw.ram_total else "RAM unknown"
    lines = [f"CPU: {cores}, {ram}"]
    if hw.gpus:
        lines += [g.describe() for g in hw.gpus]
    else:
        lines.append("GPUs: none" + (" visible" if hw.nvml_available else " (no NVIDIA driver)"))
    if hw.tpu_detected or hw.xla_available or hw.device_backends:
        from ..hardware import tpu_report_lines

        lines += [line[2:] for line in tpu_report_lines(hw)]  # the report's lines without their "- "
    if hw.mps_available:
        lines.append("Apple MPS: available")
    lines.append(f"torch {hw.torch_version}, accel_nb {hw.accel_nb_version}, Python {hw.python_version}")
    return "\n".join(lines)
