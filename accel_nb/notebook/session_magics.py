"""``%accelerate start|status|stop|restart|push|pull``: an interactive session from notebook cells.

    %accelerate start -n 2 --cpu
    %%accelerate                      # runs on the warm workers while the session is up
    model = torch.nn.Linear(4, 2)
    %accelerate push lr
    %accelerate pull model --rank 0
    %accelerate debug                 # after a cell raised: pdb in the failing rank (debug_magic)
    %accelerate status
    %accelerate stop

The session lives as long as the kernel (its workers die with it). While it is up, ``%%accelerate``
cells run on its workers (``--rank R``, ``--return NAMES`` and ``--timeout S`` apply; the other
flags were fixed at ``start``).
"""

from __future__ import annotations

import argparse
import dataclasses
import shlex
from typing import Any

from IPython.core.error import UsageError

from .debug_magic import debug_verb
from .magic_flags import (
    UsageParser,
    add_launch_flags,
    as_cell_lines,
    cell_filename,
    launch_options,
    parse_accelerate_line,
    rank_or_all,
    saved_config,
)
from .session_view import Session, show_status

VERBS_USAGE = (
    "%accelerate start [-n N] [--mixed_precision no|fp16|bf16|fp8] [--gpu_ids 0,1] [--start_method auto|fork|spawn] "
    "[--cpu] [--use_port P] [--timeout S] | status | stop | restart | push NAME... | pull NAME [--rank R] | "
    "debug [--rank R]"
)

_active: Session | None = None


def active_session() -> Session | None:
    """The session started with ``%accelerate start`` in this kernel (None when none is running)."""
    if _active is not None and _active.running:
        return _active
    return None


def _gpu_ids(text: str) -> tuple[int, ...]:
    try:
        ids = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of GPU numbers") from None
    if not ids or any(i < 0 for i in ids) or len(set(ids)) != len(ids):
        raise argparse.ArgumentTypeError(f"{text!r} must list distinct GPU numbers, e.g. 0,1")
    return ids


def _start_parser() -> argparse.ArgumentParser:
    p = UsageParser(
        prog="%accelerate start",
        add_help=False,
        allow_abbrev=False,
        label="%accelerate",
        usage_line=VERBS_USAGE,
    )
    add_launch_flags(p)
    p.add_argument("--gpu_ids", "--gpu-ids", type=_gpu_ids, default=None)
    return p


def start_options(line: str) -> Any:
    """The ``LaunchOptions`` of ``%accelerate start <flags>`` (absent flags: the saved config, as ``%%accelerate``)."""
    from .. import hardware
    from ..launch.plan import MAGIC_CHOICES, check_gpu_processes

    args = _start_parser().parse_args(shlex.split(line))
    args.rank = None
    options = launch_options(args, saved_config(), "%accelerate start")
    if args.gpu_ids is not None:
        if args.cpu:
            raise UsageError("%accelerate start: --gpu_ids and --cpu exclude each other; drop one")
        found = hardware.cuda_device_count()
        missing = [i for i in args.gpu_ids if i >= found]
        if missing:
            raise UsageError(
                f"%accelerate start: --gpu_ids {','.join(map(str, args.gpu_ids))} names GPU {missing[0]}, "
                f"but this machine has {found} GPU{'s' if found != 1 else ''}"
            )
        n = options.num_processes or len(args.gpu_ids)
        if n != len(args.gpu_ids):
            raise UsageError(
                f"%accelerate start: -n {n} but --gpu_ids lists {len(args.gpu_ids)} GPUs; give one per rank"
            )
        env = dict(options.env, CUDA_VISIBLE_DEVICES=",".join(map(str, args.gpu_ids)))
        options = dataclasses.replace(options, num_processes=n, env=env)
    else:
        check_gpu_processes(options, MAGIC_CHOICES)  # before any worker starts, in the magic's own flags
    return options


def _need_session() -> Session:
    session = active_session()
    if session is None:
        raise UsageError("%accelerate: no session is running; start one with %accelerate start -n N")
    return session


def session_verb(shell: Any, line: str) -> Any:
    """Run one ``%accelerate`` verb."""
    global _active
    __tracebackhide__ = True
    verb, _, rest = line.strip().partition(" ")
    if verb in ("", "-h", "--help", "help"):
        print(VERBS_USAGE)
        return None
    if verb == "start":
        if active_session() is not None:
            raise UsageError(
                "%accelerate start: a session is already running; %accelerate restart or stop it first"
            )
        session = Session.from_options(start_options(rest))
        session.start()
        _active = session
        print(
            f"[accel_nb] {session.describe(cells=False)} started; %%accelerate cells now run on these workers"
        )
        return None
    if verb == "status":
        if _active is None:
            print("no session is running (start one with %accelerate start -n N)")
            return None
        show_status(_active)
        return None
    if verb == "stop":
        if _active is None:
            print("[accel_nb] no session was running; %%accelerate cells launch fresh processes")
            return None
        stopped = _active.num_processes
        _active.stop()
        _active = None
        print(
            f"[accel_nb] the session was stopped: its {stopped} worker{'s' if stopped != 1 else ''} ended; "
            "%%accelerate cells launch fresh processes again"
        )
        return None
    if verb == "restart":
        if _active is None:
            raise UsageError("%accelerate restart: no session was started; use %accelerate start -n N")
        _active.restart()
        print(f"[accel_nb] restarted: {_active.describe()}")
        return None
    if verb == "push":
        return _push(shell, rest)
    if verb == "pull":
        return _pull(shell, rest)
    if verb == "debug":
        return debug_verb(active_session(), rest)
    raise UsageError(f"%accelerate: unknown verb {verb!r}. Usage: {VERBS_USAGE}")


def _push(shell: Any, rest: str) -> None:
    names = shlex.split(rest.replace(",", " "))
    if not names:
        raise UsageError(
            "%accelerate push: name the notebook variables to send, e.g. %accelerate push model lr"
        )
    missing = [n for n in names if n not in shell.user_ns]
    if missing:
        raise UsageError(f"%accelerate push: the notebook has no variable {missing[0]!r}")
    _need_session().push(**{n: shell.user_ns[n] for n in names})
    print(f"[accel_nb] {', '.join(names)} sent to every rank")


def _pull(shell: Any, rest: str) -> None:
    p = UsageParser(
        prog="%accelerate pull",
        add_help=False,
        allow_abbrev=False,
        label="%accelerate",
        usage_line=VERBS_USAGE,
    )
    p.add_argument("name")
    p.add_argument("--rank", type=rank_or_all, default=0)
    args = p.parse_args(shlex.split(rest))
    if not args.name.isidentifier():
        raise UsageError(f"%accelerate pull: {args.name!r} is not a Python name")
    if args.rank == "all":
        raise UsageError("%accelerate pull: --rank takes one rank (a number)")
    shell.user_ns[args.name] = _need_session().pull(args.name, rank=args.rank)
    print(f"[accel_nb] {args.name} copied from rank {args.rank} into the notebook")


_FIXED_AT_START = (
    "num_processes",
    "mixed_precision",
    "gradient_accumulation_steps",
    "start_method",
    "use_port",
)


def run_cell_on_session(magics: Any, session: Session, line: str, cell: str) -> None:
    """``%%accelerate`` while a session is up: the cell runs in every warm rank's namespace (or ``--rank R``)."""
    __tracebackhide__ = True
    args = parse_accelerate_line(line)
    fixed = [f"--{name}" for name in _FIXED_AT_START if getattr(args, name) is not None]
    if args.cpu:
        fixed.append("--cpu")
    if fixed:
        raise UsageError(
            f"%%accelerate: {', '.join(fixed)} cannot change while a session is running (its workers were started "
            "with %accelerate start); drop the flag, or %accelerate stop and start again with it"
        )
    rank = args.rank if isinstance(args.rank, int) else None
    filename = cell_filename(magics.shell)
    try:
        values = session.run_cell(
            as_cell_lines(cell), filename, rank=rank, return_names=args.return_names, timeout=args.timeout
        )
    except SyntaxError as exc:
        where = f"line {exc.lineno}" + (f": {exc.text.strip()}" if exc.text else "")
        raise UsageError(
            f"%%accelerate: the cell does not compile, nothing was run: {exc.msg} ({where})"
        ) from None
    if args.return_names:
        magics.shell.user_ns.update(values)
        print(f"[accel_nb] {', '.join(args.return_names)} copied from rank {rank or 0} into the notebook")
