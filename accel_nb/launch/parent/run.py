"""One launch from start to end: check the payload -> start -> supervise -> collect -> clean up.

plan = make_plan(LaunchOptions(num_processes=2, cpu=True))
results = run_launch(FunctionPayload(fn), plan, TextReporter())
"""

from __future__ import annotations

import atexit
import os
import sys
from collections.abc import Callable
from typing import Any

from ...availability import imported_module
from ...byte_sizes import human_bytes
from ...env_names import ENV_KEEP_LOGS
from ...events import Reporter, as_reporter
from ..errors import LaunchError, LaunchInterrupted
from ..payload import PayloadCheck, check_picklable, notebook_sources
from ..plan import LaunchPlan
from .hang_blame import collective_of, user_line
from .log_dirs import keep_log_dir, make_log_dir, remove_log_dir
from .start import RankProcess
from .supervisor import Supervisor, hang_headline

LARGE_ARGS_ENV = "ACCEL_NB_LARGE_ARGS_WARN_MB"


def large_args_bytes() -> int:
    """Arguments carrying more tensor bytes than this get a warning (``ACCEL_NB_LARGE_ARGS_WARN_MB``, 100)."""
    try:
        return int(float(os.environ.get(LARGE_ARGS_ENV, "100")) * 1024 * 1024)
    except ValueError:
        return 100 * 1024 * 1024


def _print(line: str) -> None:
    print(line, flush=True)


def prepare_payload(payload: Any, plan: LaunchPlan, say: Callable[[str], None] = _print) -> None:
    """What can fail before a process starts. Fork needs no pickling; spawn: pickling, skipped names, sizes."""
    check = PayloadCheck()
    if plan.start_method == "spawn":
        payload.sources = notebook_sources()  # spawned tracebacks show notebook lines, as forked ones do
        if payload.kind == "function":
            check = check_picklable(payload)
        else:
            payload.prepare_for_spawn()
            if payload.skipped:
                names = ", ".join(f"{n} ({why.split(':')[0]})" for n, why in sorted(payload.skipped.items()))
                say(f"[accel_nb] not sent to the workers because they cannot be pickled: {names}")
            check.tensor_bytes = payload.tensor_bytes
    if check.tensor_bytes > large_args_bytes():
        n = plan.num_processes
        say(
            f"[accel_nb] warning: {'the notebook namespace carries' if payload.kind == 'cell' else 'the arguments carry'} "
            f"{human_bytes(check.tensor_bytes)} of tensors; each of the {n} "
            f"ranks gets its own copy ({human_bytes(check.tensor_bytes * n)} in all). Load big data inside the function instead."
        )


def run_launch(
    payload: Any,
    plan: LaunchPlan,
    reporter: Reporter,
    *,
    info: dict[str, Any] | None = None,
    say: Callable[[str], None] = _print,
) -> list[Any]:
    """Run ``payload`` on every rank of ``plan``; per-rank results in rank order, or ``LaunchError``.

    ``plan.options`` gives the hang ``timeout`` and ``keep_logs`` (else ``ACCEL_NB_KEEP_LOGS``).
    """
    __tracebackhide__ = True  # IPython: show the user's line and the error, not the launcher's frames
    prepare_payload(payload, plan, say)
    keep_logs = plan.options.keep_logs
    if keep_logs is None:
        keep_logs = os.environ.get(ENV_KEEP_LOGS, "") not in ("", "0")
    timeout = plan.options.timeout
    _remove_kept_logs()  # the previous launch's notes pointed there until now
    say(plan.headline())
    if plan.spawn_reason:
        say(f"[accel_nb] using spawn instead of fork: {plan.spawn_reason}.")
    torch = imported_module("torch")
    if (
        plan.fork_threads == 1
        and plan.num_processes == 1
        and torch is not None
        and torch.get_num_threads() > 1
    ):
        say(
            "[accel_nb] the forked process uses 1 torch thread (the notebook's OpenMP thread pool does not "
            "survive a fork); start_method='spawn' gives it all cores"
        )
    plan.launcher.prepare(plan, say)  # a job of several machines waits for every machine here
    log_dir = make_log_dir("accel_nb-launch-")  # also removes those that killed processes left
    details = {
        "log_dir": log_dir,
        "start_method": plan.start_method,
        "backend": plan.backend,
        "master_port": plan.master_port,
    }
    details.update(info or {})
    ok = False
    outcome = None
    procs: list[RankProcess] = []
    try:
        reporter = start_reporter(reporter, plan.num_processes, details)
        try:
            # the launch kind's way: processes, or XLA's host
            plan.launcher.start(plan, payload, log_dir, procs)
        except BaseException:  # interrupted or failed half-way: take down what was started
            Supervisor(procs, reporter, log_dir).cleanup()
            raise
        supervisor = Supervisor(procs, reporter, log_dir, timeout=timeout)
        try:
            outcome = supervisor.run()
        except KeyboardInterrupt:
            # the stacks were just shown (each rank's pane); the cell says where each rank was, in short
            finish_reporter(reporter, False, "interrupted: every rank was stopped")
            raise LaunchInterrupted(
                interrupted_summary(supervisor.outcome.interrupt_stacks, plan.num_processes, log_dir)
            ) from None
        if outcome.failures:
            failures = list(outcome.failures.values())
            stopped = [r for r in outcome.stopped if r not in outcome.failures]
            headline = None
            if outcome.hung_after is not None:
                headline = hang_headline(outcome.hung_after, timeout, outcome.hang_blame)
            error = LaunchError(failures, headline=headline, stopped=stopped, log_dir=log_dir)
            finish_reporter(reporter, False, error.failures[0].summary())
            raise error
        missing = [r for r in range(plan.num_processes) if r not in outcome.results]
        if missing:  # pragma: no cover - the supervisor turns these into failures
            raise LaunchError([], headline=f"ranks {missing} returned nothing", log_dir=log_dir)
        finish_reporter(reporter, True, None)
        ok = True
        return [outcome.results[r] for r in range(plan.num_processes)]
    finally:
        plan.launcher.release(plan, ok)
        if keep_logs:
            keep_log_dir(log_dir)  # ACCEL_NB_KEEP_LOGS: for good, never swept
        else:
            if ok and not outcome.dropped_output:
                remove_log_dir(log_dir)
            else:
                # a LaunchError or a "dropped lines" note names this folder: kept until the next
                # launch starts or this process ends, never longer
                keep_until_next_launch(log_dir)


# (pid, folder): the last launch's logs that a LaunchError or a "dropped lines" note names
_kept_log_dir: list[tuple[int, str]] = []
_exit_hook: list[bool] = []


def keep_until_next_launch(log_dir: str) -> None:
    """Keep ``log_dir`` (a failure or a note names it) until the next launch starts or this process ends."""
    if not _exit_hook:
        _exit_hook.append(True)
        atexit.register(_remove_kept_logs)
    _remove_kept_logs()
    _kept_log_dir.append((os.getpid(), log_dir))


def _remove_kept_logs() -> None:
    """Remove the kept logs; only in the process that kept them (a forked rank inherits the list)."""
    while _kept_log_dir:
        pid, folder = _kept_log_dir.pop()
        if pid == os.getpid():
            remove_log_dir(folder)


def start_reporter(reporter: Any, num_processes: int, details: dict[str, Any]) -> Reporter:
    """``reporter``, started; a plain ``TextReporter`` when it fails to start (a display must not stop a launch)."""
    try:
        reporter = as_reporter(reporter)
        reporter.start(num_processes, details)
        return reporter
    except Exception as exc:  # noqa: BLE001 - any display fault: say it, show text instead
        print(
            f"[accel_nb] the display failed to start ({type(exc).__name__}: {exc}); showing text instead",
            file=sys.stderr,
        )
    from .reporting import TextReporter

    reporter = TextReporter()
    reporter.start(num_processes, details)
    return reporter


def finish_reporter(reporter: Reporter, ok: bool, summary: str | None) -> None:
    """``reporter.finish``; a fault of the display is said on stderr, never raised over the launch's outcome."""
    try:
        reporter.finish(ok, summary)
    except Exception as exc:  # noqa: BLE001
        print(f"[accel_nb] the reporter failed to finish: {exc}", file=sys.stderr)


def interrupted_summary(stacks: dict[int, str], num_processes: int, log_dir: str) -> str:
    """``the launch was interrupted: every rank was stopped`` and, per rank, the user's line it was at."""
    lines = ["the launch was interrupted: every rank was stopped"]
    for rank in range(num_processes):
        text = stacks.get(rank)
        where = user_line(text) if text else None
        waiting = collective_of(text) if text else None
        if where is None:
            where = "(no stack: the rank did not answer)" if text is None else "(in library code only)"
        lines.append(f"  rank {rank}: at {where}" + (f", waiting in {waiting}" if waiting else ""))
    lines.append(f"full per-rank logs: {log_dir}")
    return "\n".join(lines)
