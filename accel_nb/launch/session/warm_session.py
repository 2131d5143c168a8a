"""An interactive session: N warm ranks that keep their namespace and process group across commands.

The lifecycle of a one-shot launch (plan -> start -> supervise -> collect) with "supervise and
collect" repeated per command: the ranks run ``SessionLoop`` (see ``loop``), each
command is supervised by a ``CellSupervisor`` and shown by a fresh reporter, exactly as a launch.

    with WarmSession(LaunchOptions(num_processes=2, cpu=True)) as s:
        s.run("import torch.distributed as dist; x = dist.get_rank()")
        s.run("x")                     # [0, 1]
        s.pull("x", rank=1)            # 1

``accel_nb.Session`` (``accel_nb.notebook.session_view``) is this class with the notebook's display.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import secrets
import select
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from ...env_names import ENV_KEEP_LOGS
from ...events import Failure, Heartbeat, Phase, Reporter, Result, Role
from .. import cuda_guard, preimport
from ..errors import LaunchError, LaunchSetupError, UserFramesOnly
from ..options import LaunchOptions
from ..parent.log_dirs import keep_log_dir, make_log_dir, remove_log_dir
from ..parent.reporting import ListReporter, TextReporter
from ..parent.run import finish_reporter, start_reporter
from ..parent.start import RankProcess
from ..parent.supervisor import STARTUP_GRACE_S, Supervisor
from ..plan import LaunchPlan, make_plan
from .cell_report import cell_error, interrupted_note, per_object, stale_sentence
from .cell_supervisor import CellSupervisor
from .health import SessionHealth
from .loop import (
    FormGroup,
    Pull,
    Push,
    RunCode,
    RunFunction,
    SessionCommand,
    SessionLoop,
    Stop,
    recv_message,
    send_message,
)
from .post_mortem import PostMortemVerb

STOP_GRACE_S = 3.0  # after Stop, how long ranks may take to leave before they are killed


class SessionError(RuntimeError):
    """The session cannot run this command as it is (not started, broken, group broken); the message says what to do."""


def _rss_bytes(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def _default_reporter(num_processes: int, show_ranks: Any, title: str) -> Reporter:
    return TextReporter(show_ranks=show_ranks)


class WarmSession(PostMortemVerb, SessionHealth):
    """Warm ranks and the verbs to use them: ``start``, ``run``, ``push``, ``pull``, ``status``, ``stop``, ``restart``,
    ``debug`` (post-mortem of a failed cell, see ``post_mortem``). What a command did to the ranks and the
    re-forming of a broken process group are ``SessionHealth``'s (``health``).

    ``reporter_factory(num_processes, show_ranks, title)`` makes the display of one command.
    """

    def __init__(
        self,
        options: LaunchOptions,
        reporter_factory: Callable[[int, Any, str], Reporter] | None = None,
        say: Callable[[str], None] | None = None,
    ) -> None:
        self.options = options
        self.reporter_factory = reporter_factory or _default_reporter
        self.say = say or (lambda line: print(line, flush=True))
        self.plan: LaunchPlan | None = None
        self.procs: list[RankProcess] = []
        self.devices: dict[int, str] = {}
        self.states: dict[int, str] = {}
        # each rank's mesh coordinates or pipeline stage, once a cell built them
        self.roles: dict[int, Role] = {}
        self.broken: str | None = None  # why the session cannot run anything (a rank died)
        self.group_broken: str | None = None  # why the process group cannot be used any more
        self.stale: dict[int, list[str]] = {}  # per rank: names still bound to a group that was replaced
        # per rank: DDP models given the new group by the last re-forming
        self.rebound: dict[int, list[str]] = {}
        self.cell = 0
        self.log_dir: str | None = None
        self._conns: dict[int, socket.socket] = {}
        self._listener: socket.socket | None = None
        self._lock = threading.Lock()  # one command at a time

    # -- lifecycle --------------------------------------------------------------------------------
    @property
    def running(self) -> bool:
        return bool(self.procs)

    @property
    def num_processes(self) -> int:
        return self.plan.num_processes if self.plan is not None else 0

    def __enter__(self) -> WarmSession:
        if not self.running:
            self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def start(self) -> WarmSession:
        """Start the ranks, connect to each, form the process group; ``LaunchError`` if a rank fails to start.

        Session(num_processes=2, cpu=True).start()
        """
        if self.running:
            raise SessionError("the session is already running; stop() or restart() it first")
        preimport.finish()  # the kernel's pre-import is over: torch is whole
        cuda_guard.install_cuda_init_recorder()
        plan = make_plan(self.options)
        problem = plan.launcher.session_problem(plan)
        if problem is not None:
            raise LaunchSetupError(problem)
        self.plan, self.broken, self.group_broken, self.cell = plan, None, None, 0
        self.stale, self.rebound, self.roles = {}, {}, {}
        self.log_dir = make_log_dir("accel_nb-session-")  # also removes those that killed kernels left
        address = os.path.join(self.log_dir, "session.sock")
        token = secrets.token_hex(16)
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(address)
        self._listener.listen(plan.num_processes)
        self.say(plan.headline().replace("Launching", "Starting a session of", 1))
        if plan.spawn_reason:
            self.say(f"[accel_nb] using spawn instead of fork: {plan.spawn_reason}.")
        procs: list[RankProcess] = []
        try:
            plan.launcher.start(plan, SessionLoop(address, token), self.log_dir, procs)
            self.procs = procs
            self._accept(token)
            self.states = {p.rank: "starting" for p in procs}
            results = self._command(FormGroup(), None, title="session start", label="start")
        except BaseException:
            self.broken = self.broken or "it failed to start"  # keeps the logs the error points to
            self._teardown()
            raise
        self.devices = {r: v["value"]["device"] for r, v in results.items()}
        return self

    def _accept(self, token: str) -> None:
        """Wait for every rank's hello on the session socket; a rank that dies first is a ``LaunchError``."""
        assert self._listener is not None
        deadline = time.monotonic() + STARTUP_GRACE_S
        while len(self._conns) < len(self.procs):
            dead = [p for p in self.procs if p.poll() is not None]
            if dead:
                sup = Supervisor(self.procs, ListReporter(), self.log_dir or "")
                for p in dead:
                    sup.on_rank_exit(p)
                raise LaunchError(list(sup.outcome.failures.values()), log_dir=self.log_dir)
            if time.monotonic() > deadline:
                raise SessionError(
                    f"the ranks did not connect within {STARTUP_GRACE_S:.0f} s (logs: {self.log_dir})"
                )
            ready, _, _ = select.select([self._listener], [], [], 0.05)
            if not ready:
                continue
            conn, _ = self._listener.accept()
            conn.settimeout(30)
            kind, rank, their_token, _pid = recv_message(conn)
            conn.settimeout(None)
            if kind != "hello" or their_token != token:
                conn.close()
                continue
            self._conns[rank] = conn

    def stop(self) -> None:
        """Stop every rank (no process is left); the session can be started again."""
        if not self.procs:
            return
        for conn in self._conns.values():
            with contextlib.suppress(OSError):
                send_message(conn, Stop())
        deadline = time.monotonic() + STOP_GRACE_S
        while time.monotonic() < deadline and any(p.poll() is None for p in self.procs):
            time.sleep(0.02)
        self._teardown()
        self.states, self.roles = {}, {}

    def _teardown(self) -> None:
        Supervisor(self.procs, ListReporter(), self.log_dir or "").cleanup()  # kills and reaps what is left
        for conn in self._conns.values():
            with contextlib.suppress(OSError):
                conn.close()
        self._conns.clear()
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        self.procs = []
        keep = self.options.keep_logs
        if keep is None:
            keep = os.environ.get(ENV_KEEP_LOGS, "") not in ("", "0")
        if self.log_dir and keep:
            keep_log_dir(self.log_dir)  # for good, never swept
        elif self.log_dir and not self.broken:
            remove_log_dir(self.log_dir)
        # a broken session's logs (its error names them) stay while this process lives

    def restart(self) -> WarmSession:
        """Stop and start again with the same options (fresh namespaces, a fresh process group)."""
        self.stop()
        return self.start()

    # -- verbs ------------------------------------------------------------------------------------
    def run(
        self, code_or_function: Any, rank: int | None = None, args: tuple = (), kwargs: dict | None = None
    ) -> Any:
        """Run code (its last expression is the value) or ``function(*args, **kwargs)`` on every rank (or ``rank``).

        s.run("x = torch.ones(2) * PartialState().process_index; x.sum().item()")   # [0.0, 2.0]
        """
        label = f"cell {self.cell + 1}"
        if isinstance(code_or_function, str):
            command: SessionCommand = RunCode(
                code_or_function, f"<session-cell-{self.cell + 1}>", show_value=False, send_value=True
            )
        else:
            command = RunFunction(code_or_function, args, kwargs)
        results = self._command(command, rank, title=command.describe(), label=label)
        values = {r: v["value"] for r, v in results.items()}
        return values[rank] if rank is not None else [values[r] for r in sorted(values)]

    def run_cell(
        self,
        source: str,
        filename: str,
        rank: int | None = None,
        return_names: tuple[str, ...] = (),
        timeout: float | None = None,
    ) -> dict[str, Any]:
        """Run a notebook cell: the last expression is printed per rank; returns rank ``rank`` (or 0)'s ``return_names``."""
        return_rank = rank if rank is not None else 0
        command = RunCode(source, filename, return_names=return_names, return_rank=return_rank)
        number = filename.rsplit("-", 1)[-1].rstrip(">")
        label = f"cell {number}" if number.isdigit() else f"cell {self.cell + 1}"
        results = self._command(command, rank, title=filename, timeout=timeout, label=label)
        return results[return_rank]["names"] if return_rank in results else {}

    def push(self, **values: Any) -> None:
        """Copy ``values`` into every rank's namespace (cloudpickled: notebook functions travel by value).

        s.push(lr=1e-3, data=tensor)
        """
        self._command(Push(values), None, title="push", quiet=True, label="push " + ", ".join(values))

    def pull(self, name: str, rank: int = 0) -> Any:
        """Rank ``rank``'s variable ``name`` (tensors and modules on the CPU).

        metric = s.pull("accuracy")
        """
        return self._command(Pull(name), rank, title=f"pull {name}", quiet=True, label=f"pull {name}")[rank][
            "value"
        ]

    def status(self) -> list[dict[str, Any]]:
        """One dict per rank: ``rank``, ``pid``, ``device``, ``memory`` (resident bytes), ``state``, ``role``
        (``"dp 1 · tp 1"`` once a cell built a parallel layout, else ``""``)."""
        self._notice_deaths()
        return [
            {
                "rank": p.rank,
                "pid": p.pid,
                "device": self.devices.get(p.rank, "?"),
                "memory": _rss_bytes(p.pid) if p.poll() is None else None,
                "state": self.states.get(p.rank, "?"),
                "role": self.roles[p.rank].text() if p.rank in self.roles else "",
            }
            for p in self.procs
        ]

    def describe(self, cells: bool = True) -> str:
        """A one-line state of the whole session (running, broken, group broken); ``cells``: with the count of
        cells run (not in a line that stays in a cell's output: it would go stale)."""
        if not self.running:
            return "no session is running"
        self._notice_deaths()
        head = f"session of {self.num_processes} ranks ({self.plan.backend}, {self.plan.start_method})"
        if self.broken:
            return f"{head}: BROKEN: {self.broken}; restart it"
        if self.group_broken:
            return f"{head}: process group broken: {self.group_broken}; pull what you need, then restart"
        if not cells:
            return head
        said = f"{head}: {self.cell} cell{'s' if self.cell != 1 else ''} run"
        if self.rebound:
            said += "; re-bound to the re-formed process group: " + per_object(self.rebound)
        return f"{said}; {stale_sentence(self.stale)}" if self.stale else said

    # -- one command --------------------------------------------------------------------------------
    def _check_usable(self, command: SessionCommand, ranks: list[int]) -> None:
        if not self.running:
            raise SessionError("no session is running; start it with Session.start() or %accelerate start")
        bad = [r for r in ranks if not 0 <= r < self.num_processes]
        if bad:
            raise SessionError(
                f"rank {bad[0]} does not exist: the session has ranks 0..{self.num_processes - 1}"
            )
        self._notice_deaths()
        if self.broken:
            raise SessionError(
                f"the session is broken ({self.broken}); restart it: Session.restart() or %accelerate restart"
            )
        if self.group_broken and not isinstance(command, (Pull, Push)):
            raise SessionError(
                f"the process group is broken ({self.group_broken}): collectives would fail or hang. "
                "Pull what you need (%accelerate pull NAME), then restart (%accelerate restart)"
            )

    def on_command(self, label: str | None) -> None:
        """A cell starts on the workers (its label, "cell 3") or is over (None): a view may follow it."""

    def _command(
        self, command: SessionCommand, rank: int | None, *, label: str, **how: Any
    ) -> dict[int, Any]:
        """``_run_command``, with ``on_command`` told when a cell starts and ends."""
        if not label.startswith("cell"):
            return self._run_command(command, rank, label=label, **how)
        self.on_command(label)
        try:
            return self._run_command(command, rank, label=label, **how)
        finally:
            self.on_command(None)

    def _run_command(
        self,
        command: SessionCommand,
        rank: int | None,
        *,
        title: str,
        label: str,
        quiet: bool = False,
        timeout: float | None = None,
    ) -> dict[int, Any]:
        """Send ``command`` to ``rank`` (None: every rank), supervise it, return each rank's answer."""
        __tracebackhide__ = True
        ranks = list(range(self.num_processes)) if rank is None else [rank]
        self._check_usable(command, ranks)
        with self._lock:
            if label.startswith("cell"):
                self.cell += 1
            cell = label
            show = rank if rank is not None else self.options.show_ranks
            reporter = (
                TextReporter(show_ranks=show)
                if quiet
                else self.reporter_factory(self.num_processes, show, title)
            )
            reporter = start_reporter(reporter, self.num_processes, {"title": title, "log_dir": self.log_dir})
            procs = [self.procs[r] for r in ranks]
            self._pass_on_earlier_events(reporter)
            command.check_stale = bool(self.stale) and isinstance(command, (RunCode, RunFunction))
            for p in procs:
                try:
                    send_message(self._conns[p.rank], command)
                except OSError:  # its end is closed: the supervisor reads how it died
                    pass
                self.states[p.rank] = f"running {cell}"
            supervisor = CellSupervisor(
                procs,
                reporter,
                self.log_dir or "",
                timeout=timeout or self.options.timeout,
                on_stuck=self._free_stuck,
            )
            try:
                outcome = supervisor.run()
            except KeyboardInterrupt:
                self._after(supervisor.outcome, cell)
                recovered = self._recover_group()
                note = f"{cell} interrupted: " + interrupted_note(recovered, **self._health())
                finish_reporter(reporter, False, note)
                raise CellInterrupt(note) from None
            self._after(outcome, cell)
            recovered = self._recover_group()
            if outcome.failures or outcome.hung_after is not None:
                error = cell_error(outcome, cell, recovered, **self._health())
                finish_reporter(
                    reporter, False, error.failures[0].summary() if error.failures else error.headline
                )
                raise error
            finish_reporter(reporter, True, None)
            if command.check_stale:  # what the cell re-prepared is no longer named
                for r in ranks:
                    self.stale[r] = list((outcome.results.get(r) or {}).get("stale", self.stale.get(r, [])))
                self.stale = {r: items for r, items in self.stale.items() if items}
            return {r: outcome.results[r] for r in ranks if r in outcome.results}

    def _pass_on_earlier_events(self, reporter: Reporter) -> None:
        """What ranks printed between commands (a background thread) goes to this command's display;
        so do the roles earlier cells gave the ranks (their rows show them)."""
        for role in self.roles.values():
            with contextlib.suppress(Exception):
                reporter.handle(dataclasses.replace(role, again=True))
        for p in self.procs:
            for event in p.reader.read_available():
                if not isinstance(event, (Heartbeat, Phase, Result, Failure)):
                    with contextlib.suppress(Exception):
                        reporter.handle(event)


class CellInterrupt(UserFramesOnly, KeyboardInterrupt):
    """A session command the user stopped: a ``KeyboardInterrupt`` that IPython shows without accel_nb's frames."""


# the notebook names it as what it is: a KeyboardInterrupt (``except KeyboardInterrupt`` catches it too)
CellInterrupt.__name__ = CellInterrupt.__qualname__ = "KeyboardInterrupt"
