"""A rank of ``accel-nb launch --timeout``: answer the stacks signal, then run the script as ``python`` would.

The hang watchdog (``accel_nb.launch.elastic.watchdog``) asks every rank for its Python stacks with a
signal; a plain ``python script.py`` would die of it. torchrun starts each rank as

    python -u .../accel_nb/launch/rank/script_main.py STACKS_DIR SIGNUM file script.py [args...]
    python -u .../accel_nb/launch/rank/script_main.py STACKS_DIR SIGNUM module pkg.mod [args...]

This file registers faulthandler on SIGNUM (writing to ``STACKS_DIR/rank_<RANK>.stacks``), leaves
its pid in ``STACKS_DIR/rank_<RANK>.pid`` and runs the script in a fresh ``__main__`` module: the
same ``sys.argv``, ``sys.path[0]``, ``__file__``, exit code and traceback as ``python script.py``
(``python -m pkg.mod`` for ``module``). It is run as a file and imports nothing of accel_nb, so the
script's first import of anything (torch, accel_nb) is its own, as without the watchdog.
"""

from __future__ import annotations

import builtins
import faulthandler
import io
import os
import runpy
import signal
import sys
import types
from importlib.machinery import SourceFileLoader
from typing import Any, NoReturn

_OWN_FILES = (os.path.abspath(__file__), getattr(runpy, "__file__", ""), "<frozen runpy>")
_kept: list[Any] = []  # the stacks file: faulthandler writes to it until the process ends


def stacks_file(stacks_dir: str, rank: str) -> str:
    """Where rank ``rank`` writes its stacks when asked (the watchdog reads them there)."""
    return os.path.join(stacks_dir, f"rank_{rank}.stacks")


def pid_file(stacks_dir: str, rank: str) -> str:
    """Where rank ``rank`` leaves its process id (written once faulthandler answers the signal)."""
    return os.path.join(stacks_dir, f"rank_{rank}.pid")


def answer_stacks_signal(stacks_dir: str, signum: int) -> None:
    """faulthandler writes every thread's stack to this rank's stacks file on ``signum``; then the pid file."""
    rank = os.environ.get("RANK", "0")
    stacks = open(stacks_file(stacks_dir, rank), "w")  # noqa: SIM115 - open as long as the rank lives
    _kept.append(stacks)
    faulthandler.register(signum, file=stacks, all_threads=True, chain=False)
    path = pid_file(stacks_dir, rank)
    with open(f"{path}.{os.getpid()}", "w") as f:
        f.write(str(os.getpid()))
    os.replace(f"{path}.{os.getpid()}", path)  # whole or absent: never a half-written pid


def run_file(path: str, args: list[str]) -> None:
    """Run ``path`` as ``python path args...`` does: in a new ``__main__`` module that stays ``__main__``."""
    full = os.path.abspath(path)
    sys.argv = [path, *args]
    sys.path[0] = os.path.dirname(os.path.realpath(path))
    main = types.ModuleType("__main__")
    main.__dict__.update(
        __file__=full,
        __annotations__={},
        __cached__=None,
        __builtins__=builtins,
        __loader__=SourceFileLoader("__main__", full),
        __spec__=None,
    )
    sys.modules["__main__"] = main  # pickle finds the script's classes as __main__.<name>, as usual
    with io.open_code(full) as f:
        source = f.read()
    exec(compile(source, full, "exec", dont_inherit=True), main.__dict__)  # noqa: S102 - the user's script


def run_module(name: str, args: list[str]) -> None:
    """Run module ``name`` as ``python -m name args...`` does."""
    sys.argv = [name, *args]  # runpy puts the module's file in sys.argv[0]
    sys.path[0] = os.getcwd()
    runpy.run_module(name, init_globals={"__annotations__": {}}, run_name="__main__", alter_sys=True)


def main(argv: list[str]) -> NoReturn | None:
    stacks_dir, signum, kind, target, *args = argv
    answer_stacks_signal(stacks_dir, int(signum))
    try:
        (run_module if kind == "module" else run_file)(target, args)
    except Exception as exc:  # an uncaught error of the script: its traceback without this file's frames
        tb = exc.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename in _OWN_FILES:
            tb = tb.tb_next
        sys.excepthook(type(exc), exc.with_traceback(tb), tb)  # Python prints the exception's own
        raise SystemExit(1) from None
    finally:
        # The script is done: a stacks request that comes while the interpreter shuts down (a rank slow
        # to leave its process group) is ignored. faulthandler is switched off during shutdown, and the
        # signal's default action would kill a rank that finished its work.
        faulthandler.unregister(int(signum))
        signal.signal(int(signum), signal.SIG_IGN)
    return None


if __name__ == "__main__":
    main(sys.argv[1:])
