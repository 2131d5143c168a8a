"""``notebook_launcher``: run a training function on every GPU (or N CPU processes) from a cell.

from accel_nb import notebook_launcher, PartialState

def where_am_i():
    return PartialState().process_index

notebook_launcher(where_am_i, num_processes=2)      # -> [0, 1]
"""

from __future__ import annotations

import dataclasses
import sys
import warnings
from collections.abc import Callable
from typing import Any

from ..events import Reporter
from ..launch import cuda_guard, preimport
from ..launch.errors import LaunchError, LaunchSetupError
from ..launch.options import LaunchOptions
from ..launch.parent.run import run_launch
from ..launch.payload import FunctionPayload
from ..launch.plan import make_plan
from .display import make_reporter

# Remember where CUDA is first initialised from now on (names the line when spawn must be used).
cuda_guard.install_cuda_init_recorder()

# In a kernel, importing the launcher means a launch will follow: import what the ranks need (torch,
# what a first DDP step imports) in the background once this cell ends, while the user writes the
# training function; the first fork launch finishes what is left and its ranks inherit it.
preimport.start_in_kernel()


def launch_payload(payload: Any, options: LaunchOptions, reporter: Reporter | None = None) -> list[Any]:
    """The one code path behind ``notebook_launcher``, ``debug_launcher`` and ``%%accelerate``.

    Example:
        launch_payload(FunctionPayload(fn), LaunchOptions(num_processes=2, cpu=True))
    """
    __tracebackhide__ = True
    preimport.finish()  # the kernel's pre-import is over: torch is whole, no import lock held
    cuda_guard.install_cuda_init_recorder()
    plan = make_plan(options)
    if reporter is None:  # the live widget in a Jupyter kernel, else text; a bad progress= is a ValueError
        reporter = make_reporter(
            plan.num_processes,
            progress=options.progress,
            show_ranks=options.show_ranks,
            title=payload.describe(),
        )
    return run_launch(payload, plan, reporter, info={"title": payload.describe()})


# the reference's multi-node / elastic arguments: accepted at their single-machine values
_REFERENCE_DEFAULTS: dict[str, Any] = {
    "rdzv_endpoint": "",
    "rdzv_id": "none",
    "monitor_interval": None,
    "log_line_prefix_template": None,
}


_warned: set[str] = set()


def _accept_reference_options(options: dict[str, Any]) -> None:
    """Take the reference's multi-machine arguments out of ``options``: num_nodes, node_rank, rdzv_backend
    and rdzv_conf's timeout are launch options; the rest are fine at their defaults, a warning (once) for the
    two that change nothing here, a clear error for restarts and other rendezvous settings."""
    from ..launch.elastic.multinode import take_reference_options

    take_reference_options(options)  # num_nodes, node_rank, rdzv_backend pass on; rdzv_conf's timeout too
    for key in list(options):
        if key not in _REFERENCE_DEFAULTS:
            continue
        value = options.pop(key)
        if key in ("monitor_interval", "log_line_prefix_template"):
            if value is not None and key not in _warned:
                _warned.add(key)
                warnings.warn(
                    f"notebook_launcher({key}=...) is accepted for compatibility and has no effect: accel_nb "
                    "watches the ranks through their event channel and labels output by rank itself",
                    stacklevel=3,
                )
            continue
        if value in (_REFERENCE_DEFAULTS[key], None, "", 1 if key == "num_nodes" else 0):
            continue
        raise LaunchSetupError(
            f"notebook_launcher({key}={value!r}): elastic restarts and other rendezvous settings are not "
            "supported from a notebook (give machine 0's address as master_addr= and the port as use_port=); "
            "run a script with `accel-nb launch --max_restarts ...` for restarts"
        )


def take_max_restarts(options: dict[str, Any]) -> int:
    """``max_restarts`` out of ``options`` (0 when absent), checked: a count, and on one machine only."""
    value = options.pop("max_restarts", 0)
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise LaunchSetupError(f"notebook_launcher(max_restarts={value!r}) must be an int >= 0")
    if value and int(options.get("num_nodes") or 1) > 1:
        raise LaunchSetupError(
            f"notebook_launcher(max_restarts={value!r}) with num_nodes > 1: elastic restarts across machines are "
            "not supported from a notebook; run a script with `accel-nb launch --max_restarts ...` for restarts"
        )
    return value


def run_with_restarts(
    payload: Any, options: LaunchOptions, reporter: Reporter | None, max_restarts: int
) -> list[Any]:
    """Launch; when a rank fails, stop every rank and start them all again, up to ``max_restarts`` times
    (torch's elastic agent, behind the reference's launcher, does the same). Each attempt's ranks find its
    number in ``TORCHELASTIC_RESTART_COUNT``. The last failure raises a ``LaunchError`` that is also torch's
    ``ChildFailedError``."""
    __tracebackhide__ = True
    for attempt in range(max_restarts + 1):
        env = {
            **options.env,
            "TORCHELASTIC_RESTART_COUNT": str(attempt),
            "TORCHELASTIC_MAX_RESTARTS": str(max_restarts),
        }
        try:
            return launch_payload(payload, dataclasses.replace(options, env=env), reporter=reporter)
        except LaunchError as err:
            if attempt < max_restarts:
                first = err.first.summary() if err.first is not None else "the launch failed"
                print(
                    f"[accel_nb] {first}; starting every rank again (restart {attempt + 1} of {max_restarts})",
                    file=sys.stderr,
                    flush=True,
                )
                continue
            from ..launch.child_failed import as_child_failed  # deferred: imports torch's elastic package

            raise as_child_failed(err) from None
    raise AssertionError("unreachable")  # pragma: no cover


def reject_unknown_options(caller: str, options: dict[str, Any]) -> None:
    """A TypeError naming the keywords of ``caller`` that are not launch options (and the ones that are)."""
    unknown = sorted(set(options) - set(LaunchOptions.names()))
    if unknown:
        raise TypeError(
            f"{caller}() got unexpected keyword argument(s): {', '.join(unknown)}; it accepts "
            f"{', '.join(LaunchOptions.names())} (see help({caller}))"
        )


def notebook_launcher(
    function: Callable[..., Any],
    args: tuple = (),
    kwargs: dict[str, Any] | None = None,
    num_processes: int | None = None,
    mixed_precision: str | None = None,
    master_addr: str = "127.0.0.1",
    use_port: int | str | None = None,
    start_method: str = "auto",
    timeout: float | None = None,
    show_ranks: Any = "all",
    reporter: Reporter | None = None,
    **options: Any,
) -> list[Any]:
    """Run ``function(*args, **kwargs)`` on ``num_processes`` ranks; return each rank's result in rank order.

    ``num_processes=None`` uses every GPU, or 1 CPU process without GPUs. ``start_method="auto"``
    forks while the notebook has not touched CUDA, else spawns. ``timeout`` (seconds without any
    progress) turns a hang into a ``LaunchError`` showing each rank's stack. ``show_ranks`` picks
    whose output is shown ("all", a rank, or a list); every rank's full log is kept in a file.
    Extra ``options``: ``cpu=True``, ``gradient_accumulation_steps=K``, ``env={...}``, ``keep_logs=True``,
    ``progress="widget"|"text"`` (how the launch shows itself; default: a widget in Jupyter).
    ``num_nodes=M, node_rank=R`` (``master_addr`` and ``use_port`` of machine 0, ``rdzv_backend``,
    ``rdzv_conf={"timeout": s}``): these ``num_processes`` ranks are machine R's share of a job that
    ``accel-nb launch`` or other notebooks run on the other machines. ``max_restarts=K`` (one machine):
    when a rank fails, every rank is stopped and started again, up to K times, as torch's elastic agent
    does. A failure raises ``LaunchError``, which ``except ChildFailedError:`` (torch's) also catches.

        results = notebook_launcher(train, args=(config,), num_processes=2)
    """
    __tracebackhide__ = True
    max_restarts = take_max_restarts(options)
    _accept_reference_options(options)
    reject_unknown_options("notebook_launcher", options)
    launch_options = LaunchOptions(
        num_processes=num_processes,
        mixed_precision=mixed_precision,
        master_addr=master_addr,
        use_port=use_port,
        start_method=start_method,
        timeout=timeout,
        show_ranks=show_ranks,
        **options,
    )
    return run_with_restarts(FunctionPayload(function, args, kwargs), launch_options, reporter, max_restarts)


def debug_launcher(
    function: Callable[..., Any], args: tuple = (), num_processes: int = 2, **options: Any
) -> list[Any]:
    """Run ``function(*args)`` on ``num_processes`` CPU processes (a real gloo group); for tests and debugging.

    assert debug_launcher(lambda: PartialState().num_processes) == [2, 2]
    """
    __tracebackhide__ = True
    _accept_reference_options(options)
    passed_on = ("reporter", "max_restarts")
    reject_unknown_options("debug_launcher", {k: v for k, v in options.items() if k not in passed_on})
    options.setdefault("cpu", True)
    return notebook_launcher(function, args, num_processes=num_processes, **options)
