"""The flags of the ``%%accelerate`` and ``%accelerate start`` magics and the launch they ask for: one
parser class for every magic line, the shared flags, the saved config as their defaults.

    args = parse_accelerate_line("-n 2 --cpu --return model")
    options = launch_options(args, saved_config())      # a LaunchOptions

Used by ``magics`` (the cell magic) and ``session_magics`` (the session verbs); imports neither.
"""

from __future__ import annotations

import argparse
import keyword
import shlex
from typing import Any

from IPython.core.error import UsageError

from .. import config as config_module
from .. import hardware
from ..config import LAUNCHER_RDZV_BACKENDS, START_METHODS, ConfigError
from ..config.arguments import positive_int, positive_seconds
from ..launch.options import LaunchOptions
from ..precision.setting import MIXED_PRECISION_CHOICES

USAGE = (
    "%%accelerate [-n/--num_processes N] [--mixed_precision no|fp16|bf16|fp8] [--gradient_accumulation_steps K] "
    "[--start_method auto|fork|spawn] [--timeout S] [--rank R|all] [--return NAME[,NAME...]] [--use_port P] [--cpu] "
    f"[--num_nodes M --node_rank R --master_addr IP [--rdzv_backend {'|'.join(LAUNCHER_RDZV_BACKENDS)}] [--rdzv_timeout S]]"
)


class UsageParser(argparse.ArgumentParser):
    """A magic's flag parser: a bad flag or value is a one-line ``UsageError`` (``label: message. Usage: ...``)
    before anything starts; where argparse would exit (``--help``), a ``UsageError`` carrying the usage."""

    def __init__(self, *args: Any, label: str, usage_line: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.label, self.usage_line = label, usage_line

    def error(self, message: str) -> None:  # one line, before anything is launched
        raise UsageError(f"{self.label}: {message}. Usage: {self.usage_line}")

    def exit(self, status: int = 0, message: str | None = None) -> None:
        raise UsageError(message or self.usage_line)


def rank_or_all(text: str) -> Any:
    """A rank number (0 or more) or ``all``."""
    if text == "all":
        return "all"
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a rank number or 'all'") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"rank {value} must be 0 or more")
    return value


def python_names(text: str) -> tuple[str, ...]:
    """A comma-separated list of Python names, as a tuple."""
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    bad = [n for n in names if not n.isidentifier() or keyword.iskeyword(n)]
    if not names or bad:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of Python names")
    return names


def add_launch_flags(p: argparse.ArgumentParser) -> None:
    """The flags ``%%accelerate`` and ``%accelerate start`` share (what ``launch_options`` reads)."""
    p.add_argument("-n", "--num_processes", "--num-processes", type=positive_int, default=None)
    p.add_argument("--mixed_precision", "--mixed-precision", choices=MIXED_PRECISION_CHOICES, default=None)
    p.add_argument(
        "--gradient_accumulation_steps", "--gradient-accumulation-steps", type=positive_int, default=None
    )
    p.add_argument("--start_method", "--start-method", choices=START_METHODS, default=None)
    p.add_argument("--timeout", type=positive_seconds, default=None)
    p.add_argument("--use_port", "--use-port", type=positive_int, default=None)
    p.add_argument("--cpu", action="store_true", default=False)


def build_parser() -> argparse.ArgumentParser:
    """The ``%%accelerate`` line's parser."""
    p = UsageParser(
        prog="%%accelerate", add_help=False, allow_abbrev=False, label="%%accelerate", usage_line=USAGE
    )
    add_launch_flags(p)
    p.add_argument("--rank", type=rank_or_all, default=None)
    p.add_argument("--return", dest="return_names", type=python_names, default=())
    p.add_argument("--num_nodes", "--num-nodes", type=positive_int, default=None)
    p.add_argument("--node_rank", "--node-rank", type=rank_number, default=None)
    p.add_argument("--master_addr", "--master-addr", default=None)
    p.add_argument("--rdzv_backend", "--rdzv-backend", choices=LAUNCHER_RDZV_BACKENDS, default=None)
    p.add_argument("--rdzv_timeout", "--rdzv-timeout", type=positive_seconds, default=None)
    return p


def rank_number(text: str) -> int:
    """One machine number (``--node_rank``)."""
    value = rank_or_all(text)
    if value == "all":
        raise argparse.ArgumentTypeError("--node_rank takes one machine number")
    return value


def parse_accelerate_line(line: str) -> argparse.Namespace:
    """Parse the ``%%accelerate`` line; ``UsageError`` (one line) for an unknown flag or a bad value."""
    try:
        tokens = shlex.split(line)
    except ValueError as exc:
        raise UsageError(f"%%accelerate: cannot read the flags ({exc}). Usage: {USAGE}") from None
    return build_parser().parse_args(tokens)


def saved_config() -> Any:
    """The saved launch config, or None when there is none (a broken one is named and skipped)."""
    try:
        return config_module.load_config()
    except Exception as exc:  # noqa: BLE001 - a broken config file must not block a launch with flags
        print(f"[accel_nb] ignoring the saved launch config: {exc}")
        return None


def launch_options(args: argparse.Namespace, cfg: Any, label: str = "%%accelerate") -> LaunchOptions:
    """The launch the flags ask for; a flag that is absent takes the saved config's value (``cfg``, may be None).

    The saved file's layout (``parallelism_config``) reaches the ranks as ``accel-nb launch`` gives it; its
    sizes are checked against this launch's processes first (a ``UsageError`` starting with ``label``).
    """
    num_processes = args.num_processes
    mixed_precision = args.mixed_precision
    grad_steps = args.gradient_accumulation_steps
    start_method = args.start_method
    cpu = args.cpu
    xla = None  # XLA devices when a runtime is present (and --cpu is not given)
    if cfg is not None:
        num_processes = num_processes if num_processes is not None else cfg.num_processes
        mixed_precision = mixed_precision or cfg.mixed_precision
        if grad_steps is None and cfg.gradient_accumulation_steps not in (None, 1):
            grad_steps = cfg.gradient_accumulation_steps
        start_method = start_method or cfg.start_method
        cpu = cpu or bool(cfg.use_cpu)
        if cfg.distributed_type == "XLA" and not args.cpu:
            xla, cpu = True, False
    env: dict[str, str] = {}
    if cfg is not None:  # dynamo_config and each back-end's section (fsdp, deepspeed, megatron_lm, layout)
        total = launch_total(cfg, num_processes, cpu, xla, getattr(args, "num_nodes", None))
        try:
            env = {**cfg.compile_env(), **cfg.backends_env(total)}
        except ConfigError as exc:
            raise UsageError(f"{label}: nothing was launched: {exc}") from None
    return LaunchOptions(
        num_processes=num_processes,
        mixed_precision=mixed_precision,
        start_method=start_method or "auto",
        timeout=args.timeout,
        show_ranks=args.rank if args.rank is not None else "all",
        use_port=args.use_port,
        cpu=cpu,
        xla=xla,
        gradient_accumulation_steps=grad_steps,
        env=env,
        **machine_flags(args),
    )


def launch_total(
    cfg: Any, num_processes: int | None, cpu: bool, xla: Any, num_nodes: int | None
) -> int | None:
    """The processes in all of a launch of ``num_processes`` per machine on ``num_nodes`` machines, which a
    saved layout is checked against (None without a layout: nothing needs it).

    The process count is resolved as the launch resolves it (every GPU, else 1); with XLA devices the
    count is known only in the launch, and the ranks' ``Accelerator`` checks it.
    """
    if not cfg.extras.get("parallelism_config"):
        return None
    if num_processes is None and not xla:
        num_processes = 1 if cpu else max(hardware.cuda_device_count(), 1)
    return None if num_processes is None else num_processes * (num_nodes or 1)


def machine_flags(args: argparse.Namespace) -> dict[str, Any]:
    """The launch options of ``--num_nodes/--node_rank/--master_addr/--rdzv_backend/--rdzv_timeout`` that were given."""
    names = ("num_nodes", "node_rank", "master_addr", "rdzv_backend", "rdzv_timeout")
    return {name: getattr(args, name) for name in names if getattr(args, name, None) is not None}


def cell_filename(shell: Any) -> str:
    """``<accelerate-cell-N>`` for the cell running now, N its ``In [N]`` prompt number.

    IPython 9 counts the running cell up before executing it (``execution_count`` is N + 1 during the
    cell); IPython 7 and 8 (Colab's 7.34, Kaggle's 8.x) after it (N). The input history holds the
    running cell as its last entry on all of them; a cell run without history falls back to the count.
    """
    history = getattr(getattr(shell, "history_manager", None), "input_hist_parsed", None)
    if history and len(history) > 1:
        number = len(history) - 1
    else:
        number = int(getattr(shell, "execution_count", 1) or 1) - 1
    return f"<accelerate-cell-{max(number, 1)}>"


def as_cell_lines(cell: str) -> str:
    """The body of a ``%%accelerate`` cell placed at its lines in the cell: the magic's line is line 1,
    so an error at the body's first line reads "line 2", as the notebook's editor numbers it."""
    return "\n" + cell
