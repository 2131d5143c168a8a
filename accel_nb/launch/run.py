"""One launch from start to end: plan -> start -> supervise -> collect -> clean up.

plan = make_plan(num_processes=2, cpu=True)
results = run_launch(FunctionPayload(fn), plan, TextReporter())
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from typing import Any

from .errors import LaunchError
from .payload import PayloadCheck, check_picklable, dumps_payload
from .plan import LaunchPlan
from .supervisor import Supervisor, start_fork, start_spawn

LARGE_ARGS_ENV = "ACCEL_NB_LARGE_ARGS_WARN_MB"


def large_args_bytes() -> int:
    """Arguments carrying more tensor bytes than this get a warning (``ACCEL_NB_LARGE_ARGS_WARN_MB``, 100)."""
    try:
        return int(float(os.environ.get(LARGE_ARGS_ENV, "100")) * 1024 * 1024)
    except ValueError:
        return 100 * 1024 * 1024


def _human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1024 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TB"  # pragma: no cover


def _print(line: str) -> None:
    print(line, flush=True)


def prepare_payload(payload: Any, plan: LaunchPlan, say: Callable[[str], None] = _print) -> PayloadCheck:
    """Everything that can fail before a process starts: pickling, large-argument warning, skipped names."""
    check = check_picklable(payload) if payload.kind == "function" else PayloadCheck()
    if payload.kind == "cell" and plan.start_method == "spawn":
        payload.prepare_for_spawn()
        if payload.skipped:
            names = ", ".join(f"{n} ({why.split(':')[0]})" for n, why in sorted(payload.skipped.items()))
            say(f"[accel_nb] not sent to the workers because they cannot be pickled: {names}")
        check.tensor_bytes = payload.tensor_bytes
    if check.tensor_bytes > large_args_bytes():
        n = plan.num_processes
        say(
            f"[accel_nb] warning: {'the notebook namespace carries' if payload.kind == 'cell' else 'the arguments carry'} "
            f"{_human_bytes(check.tensor_bytes)} of tensors; each of the {n} "
            f"ranks gets its own copy ({_human_bytes(check.tensor_bytes * n)} in all). Load big data inside the function instead."
        )
    return check


def run_launch(
    payload: Any,
    plan: LaunchPlan,
    reporter: Any,
    *,
    timeout: float | None = None,
    info: dict[str, Any] | None = None,
    say: Callable[[str], None] = _print,
    keep_logs: bool | None = None,
) -> list[Any]:
    """Run ``payload`` on every rank of ``plan``; per-rank results in rank order, or ``LaunchError``."""
    __tracebackhide__ = True  # IPython: show the user's line and the error, not the launcher's frames
    prepare_payload(payload, plan, say)
    if keep_logs is None:
        keep_logs = os.environ.get("ACCEL_NB_KEEP_LOGS", "") not in ("", "0")
    log_dir = tempfile.mkdtemp(prefix="accel_nb-launch-")
    payload_path = None
    if plan.start_method == "spawn":
        payload_path = os.path.join(log_dir, "payload.pkl")
        with open(payload_path, "wb") as f:
            f.write(dumps_payload(payload))
    say(plan.headline())
    if plan.spawn_reason:
        say(f"[accel_nb] using spawn instead of fork: {plan.spawn_reason}.")
    torch = sys.modules.get("torch")
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
    details = {
        "log_dir": log_dir,
        "start_method": plan.start_method,
        "backend": plan.backend,
        "master_port": plan.master_port,
    }
    details.update(info or {})
    try:
        reporter.start(plan.num_processes, details)
    except Exception as exc:  # noqa: BLE001 - a broken display must not stop the launch
        print(
            f"[accel_nb] the display failed to start ({type(exc).__name__}: {exc}); showing text instead",
            file=sys.stderr,
        )
        from .reporting import TextReporter

        reporter = TextReporter()
        reporter.start(plan.num_processes, details)
    ok = False
    procs: list = []
    try:
        try:
            if plan.start_method == "fork":
                start_fork(plan, payload, log_dir, procs)
            else:
                start_spawn(plan, log_dir, payload_path, procs)
        except BaseException:  # interrupted or failed half-way: take down what was started
            Supervisor(procs, reporter, log_dir).cleanup()
            raise
        supervisor = Supervisor(procs, reporter, log_dir, timeout=timeout)
        try:
            outcome = supervisor.run()
        except KeyboardInterrupt:
            _finish(reporter, False, "interrupted: every rank was stopped")
            raise
        if outcome.failures:
            failures = list(outcome.failures.values())
            stopped = [r for r in outcome.stopped if r not in outcome.failures]
            headline = None
            if outcome.hung_after is not None:
                headline = (
                    f"the launch hung: no rank made progress for {outcome.hung_after:.0f} s (timeout={timeout:g}); "
                    "each rank's Python stack is below, every rank was stopped"
                )
            error = LaunchError(failures, headline=headline, stopped=stopped, log_dir=log_dir)
            _finish(reporter, False, error.failures[0].summary())
            raise error
        missing = [r for r in range(plan.num_processes) if r not in outcome.results]
        if missing:  # pragma: no cover - the supervisor turns these into failures
            raise LaunchError([], headline=f"ranks {missing} returned nothing", log_dir=log_dir)
        _finish(reporter, True, None)
        ok = True
        return [outcome.results[r] for r in range(plan.num_processes)]
    finally:
        if ok and not keep_logs:
            shutil.rmtree(log_dir, ignore_errors=True)


def _finish(reporter: Any, ok: bool, summary: str | None) -> None:
    try:
        reporter.finish(ok, summary)
    except Exception as exc:  # noqa: BLE001
        print(f"[accel_nb] the reporter failed to finish: {exc}", file=sys.stderr)
