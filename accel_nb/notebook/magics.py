"""IPython magics: ``%%accelerate`` runs a cell on N processes; ``%accelerate_config``, ``%accelerate_env``.

    %load_ext accel_nb

    %%accelerate -n 2 --return model,history
    accelerator = Accelerator()
    model, opt = accelerator.prepare(model, opt)
    history = train(model, opt)

The cell becomes a ``CellPayload`` run by the same worker entry as ``notebook_launcher``: with
fork it sees the notebook's namespace as it is; with spawn the namespace is cloudpickled (modules
re-imported by name, unpicklable names skipped with a warning). A cell that does not compile is a
one-line ``UsageError`` before anything starts; tracebacks name the cell ``<accelerate-cell-N>``
with ``N`` its prompt number.
"""

from __future__ import annotations

import argparse
import keyword
import shlex
import sys
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class

from .. import config as config_module
from ..config import LAUNCHER_RDZV_BACKENDS, START_METHODS
from ..config.arguments import positive_int, positive_seconds
from ..launch import cuda_guard
from ..launch.options import LaunchOptions
from ..launch.payload import CellPayload
from ..launch.plan import MAGIC_CHOICES, check_gpu_processes
from ..precision_setting import MIXED_PRECISION_CHOICES

USAGE = (
    "%%accelerate [-n/--num_processes N] [--mixed_precision no|fp16|bf16] [--gradient_accumulation_steps K] "
    "[--start_method auto|fork|spawn] [--timeout S] [--rank R|all] [--return NAME[,NAME...]] [--use_port P] [--cpu] "
    f"[--num_nodes M --node_rank R --master_addr IP [--rdzv_backend {'|'.join(LAUNCHER_RDZV_BACKENDS)}] [--rdzv_timeout S]]"
)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, before anything is launched
        raise UsageError(f"%%accelerate: {message}. Usage: {USAGE}")

    def exit(self, status: int = 0, message: str | None = None) -> None:
        raise UsageError(message or USAGE)


def _rank(text: str) -> Any:
    if text == "all":
        return "all"
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a rank number or 'all'") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"rank {value} must be 0 or more")
    return value


def _names(text: str) -> tuple[str, ...]:
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
    p = _Parser(prog="%%accelerate", add_help=False, allow_abbrev=False)
    add_launch_flags(p)
    p.add_argument("--rank", type=_rank, default=None)
    p.add_argument("--return", dest="return_names", type=_names, default=())
    p.add_argument("--num_nodes", "--num-nodes", type=positive_int, default=None)
    p.add_argument("--node_rank", "--node-rank", type=_rank_number, default=None)
    p.add_argument("--master_addr", "--master-addr", default=None)
    p.add_argument("--rdzv_backend", "--rdzv-backend", choices=LAUNCHER_RDZV_BACKENDS, default=None)
    p.add_argument("--rdzv_timeout", "--rdzv-timeout", type=positive_seconds, default=None)
    return p


def _rank_number(text: str) -> int:
    value = _rank(text)
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


def launch_options(args: argparse.Namespace, cfg: Any) -> LaunchOptions:
    """The launch the flags ask for; a flag that is absent takes the saved config's value (``cfg``, may be None)."""
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
        # dynamo_config, fsdp_config, deepspeed_config
        env={**cfg.compile_env(), **cfg.fsdp_env(), **cfg.deepspeed_env()} if cfg is not None else {},
        **machine_flags(args),
    )


def machine_flags(args: argparse.Namespace) -> dict[str, Any]:
    """The launch options of ``--num_nodes/--node_rank/--master_addr/--rdzv_backend/--rdzv_timeout`` that were given."""
    names = ("num_nodes", "node_rank", "master_addr", "rdzv_backend", "rdzv_timeout")
    return {name: getattr(args, name) for name in names if getattr(args, name, None) is not None}


@magics_class
class AccelerateMagics(Magics):
    """``%%accelerate``, ``%accelerate_config`` and ``%accelerate_env``."""

    @cell_magic("accelerate")
    def accelerate(self, line: str, cell: str) -> None:
        """Run this cell on N processes (see ``%%accelerate --help`` for the flags)."""
        __tracebackhide__ = True
        if line.strip() in ("-h", "--help"):
            print(USAGE)
            return
        from .session_magics import active_session, run_cell_on_session

        session = active_session()
        if session is not None:  # %accelerate start: the cell runs on the warm workers
            return run_cell_on_session(self, session, line, cell)
        args = parse_accelerate_line(line)
        from .launcher import launch_payload

        options = launch_options(args, saved_config())
        check_gpu_processes(options, MAGIC_CHOICES)  # refused in the magic's own flags, before anything starts
        return_rank = args.rank if isinstance(args.rank, int) else 0
        payload = self._cell_payload(cell, args.return_names, return_rank)
        results = launch_payload(payload, options)
        if args.return_names:
            if return_rank >= len(results):
                raise UsageError(f"%%accelerate: --rank {return_rank} but only {len(results)} processes ran")
            values = results[return_rank] or {}
            self.shell.user_ns.update(values)
            print(
                f"[accel_nb] {', '.join(args.return_names)} copied from rank {return_rank} into the notebook"
            )

    def _cell_payload(self, cell: str, return_names: tuple[str, ...], return_rank: int) -> CellPayload:
        """The cell as a payload named after its prompt number; a cell that does not compile is a UsageError."""
        # IPython counts the running cell before executing it: its prompt number is one less
        filename = f"<accelerate-cell-{max(self.shell.execution_count - 1, 1)}>"
        try:
            return CellPayload(
                cell, self.shell.user_ns, filename=filename, return_names=return_names, return_rank=return_rank
            )
        except SyntaxError as exc:
            where = f"line {exc.lineno}" + (f": {exc.text.strip()}" if exc.text else "")
            raise UsageError(
                f"%%accelerate: the cell does not compile, nothing was launched: {exc.msg} ({where})"
            ) from None

    @line_magic("accelerate")
    def accelerate_session(self, line: str = "") -> None:
        """``%accelerate start|status|stop|restart|push|pull``: warm workers that keep their state across cells."""
        __tracebackhide__ = True
        from .session_magics import session_verb

        return session_verb(self.shell, line)

    @line_magic("accelerate_config")
    def accelerate_config(self, line: str = "") -> None:
        """Print the launch config that ``%%accelerate`` uses when flags are absent."""
        path = config_module.find_config_file()
        cfg = saved_config()
        if cfg is None:
            where = config_module.default_config_path()
            print(f"No saved launch config (looked for {where}).")
            print(
                "%%accelerate defaults: every GPU, else 1 CPU process; mixed_precision=no; start_method=auto."
            )
            print("Write one with `accel-nb config default` or accel_nb.config_wizard().")
            return
        print(f"Launch config from {path}:")
        data = cfg.to_dict() if hasattr(cfg, "to_dict") else dict(vars(cfg))
        for key, value in data.items():
            print(f"  {key}: {value}")

    @line_magic("accelerate_env")
    def accelerate_env(self, line: str = "") -> None:
        """Print the hardware/software report to paste into a bug report."""
        from ..env_report import environment_report

        print(environment_report())


def load_ipython_extension(ipython: Any) -> None:
    """Register the magics; from now on remember which line first initialises CUDA."""
    ipython.register_magics(AccelerateMagics)
    cuda_guard.install_cuda_init_recorder()
    if "torch" not in sys.modules:
        import torch  # noqa: F401 - so the recorder sees the first CUDA initialisation

        cuda_guard.install_cuda_init_recorder()


def unload_ipython_extension(ipython: Any) -> None:
    """Nothing to undo beyond what IPython does (magics stay registered until the kernel restarts)."""
