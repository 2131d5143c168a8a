"""The Megatron-LM questions of ``accel-nb config`` (the reference's, asked when megatron-core is installed and the
run computes on GPUs); every answer is checked as a launch would check it.

    cfg = megatron_questions(cfg, "gpu", out, ask)      # ask(prompt, default, parse, out) -> value
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from ...config import ConfigError, LaunchConfig
from ...config.questions import QUESTIONS, megatron_installed, question

__all__ = ["megatron_installed", "megatron_questions", "with_megatron", "without_megatron"]


def with_megatron(cfg: LaunchConfig, settings: dict[str, Any]) -> LaunchConfig:
    """``cfg`` training with Megatron-LM under ``settings`` (a ``megatron_lm_config`` mapping), validated."""
    new = dataclasses.replace(cfg, distributed_type="MEGATRON_LM", dynamo_backend="no", use_cpu=False)
    # an FSDP, DeepSpeed or layout section left from before would be inert with Megatron-LM: it goes
    inert = ("fsdp_config", "deepspeed_config", "parallelism_config")
    new.extras = {k: v for k, v in cfg.extras.items() if k not in inert}
    new.extras["megatron_lm_config"] = dict(settings)
    return new.validate()


def without_megatron(cfg: LaunchConfig) -> LaunchConfig:
    """``cfg`` without Megatron-LM: its ``megatron_lm_config`` goes and the type is NO (not validated: the caller
    derives the type from the process count)."""
    if cfg.distributed_type != "MEGATRON_LM" and "megatron_lm_config" not in cfg.extras:
        return cfg
    new = dataclasses.replace(cfg, distributed_type="NO")
    new.extras = {k: v for k, v in cfg.extras.items() if k != "megatron_lm_config"}
    return new


def megatron_questions(cfg: LaunchConfig, compute: str, out: Any, ask: Callable[..., Any]) -> LaunchConfig:
    """Ask whether to train with Megatron-LM and, if so, its degrees, recompute, optimizer and clipping."""
    from ...megatron.plugin import MegatronLMPlugin, settings_from_launch

    def yes_no(raw: str) -> bool:
        return settings_from_launch({"megatron_lm_sequence_parallelism": raw})["sequence_parallelism"]

    def parse_use(raw: str) -> bool:
        try:
            return yes_no(raw)
        except ValueError:
            raise ConfigError("use_megatron_lm", raw, "yes or no") from None

    if not ask(
        question("use_megatron_lm").cli_prompt(), cfg.distributed_type == "MEGATRON_LM", parse_use, out
    ):
        return without_megatron(cfg)
    old = dict(cfg.extras.get("megatron_lm_config") or {}) if cfg.distributed_type == "MEGATRON_LM" else {}
    settings: dict[str, Any] = {}
    processes = int(cfg.num_processes or 1)

    def ask_checked(key: str, prompt: str, default: Any) -> None:
        name = key.removeprefix("megatron_lm_")

        def check(raw: str) -> Any:
            try:
                value = settings_from_launch({key: raw})[name]
                plugin = MegatronLMPlugin(**settings_from_launch({**settings, key: value}))
            except (ValueError, TypeError) as exc:
                raise ConfigError(key, raw, "see docs/megatron.md", None, str(exc)) from None
            if processes % (plugin.tp_degree * plugin.pp_degree):
                raise ConfigError(
                    key, raw, f"tp x pp dividing the {processes} processes", None, "the rest is data parallel"
                )
            return value

        settings[key] = ask(prompt, old.get(key, default), check, out)

    for q in QUESTIONS:  # the table's Megatron-LM questions, each where its rule holds (tp > 1, pp > 1)
        if (
            q.section == "megatron"
            and q.key != "use_megatron_lm"
            and q.asked({"use_megatron_lm": True, **settings})
        ):
            ask_checked(q.key, q.cli_prompt(), q.default)
    return with_megatron(cfg, settings)
