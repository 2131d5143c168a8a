"""What a session knows of its ranks' health, and how it mends a broken process group.

After each command ``WarmSession`` records what the command did to each rank (idle, failed, stopped,
interrupted, hung, dead), the parallel roles it gave them, whether the session is broken (a rank's
process is gone: restart it) and whether the process group is (a collective could not finish). A group
broken under live ranks is re-formed at once: a new store on a new port, a new group, the ranks'
namespaces kept (``Regroup``); a cell stuck in a collective is freed by closing the group on its peers.

    s.run(cell)        # a collective of the cell never finished: the group is re-formed after it
    s.describe()       # "session of 2 ranks (gloo, fork): 3 cells run; re-bound to the re-formed process group: ..."
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Callable
from typing import Any

from ...events import FailureKind, Role
from ..launcher import LaunchPlan
from ..parent.rank_process import RankProcess
from ..parent.reporting import ListReporter
from ..parent.run import start_reporter
from ..parent.supervisor import Supervisor
from ..ports import pick_free_port
from .cell_report import stuck_sentence
from .cell_supervisor import CellOutcome, CellSupervisor
from .loop import BreakGroup, Regroup, send_message

__all__ = ["SessionHealth", "REGROUP_TRIES"]

# fresh groups tried after a broken one (a new port each: another program may take the one picked)
REGROUP_TRIES = 3
# the failures that leave a rank's process gone: the session is broken then
_DEATHS = (FailureKind.SIGNAL, FailureKind.EXIT_CODE, FailureKind.STUCK)


class SessionHealth:
    """The health half of ``WarmSession``: dead ranks, a broken session or process group, and re-forming it.

    ``WarmSession`` holds the attributes named here; ``note_failures`` is ``PostMortemVerb``'s.
    """

    plan: LaunchPlan | None
    procs: list[RankProcess]
    states: dict[int, str]
    roles: dict[int, Role]
    broken: str | None
    group_broken: str | None
    stale: dict[int, list[str]]
    rebound: dict[int, list[str]]
    log_dir: str | None
    _conns: dict[int, socket.socket]
    num_processes: int
    note_failures: Callable[[Any, str], None]

    def _health(self) -> dict[str, Any]:
        """What the words about a cell's end depend on: a broken session or group, re-bound and stale objects."""
        return {
            "broken": self.broken,
            "group_broken": self.group_broken,
            "rebound": self.rebound,
            "stale": self.stale,
        }

    def _notice_deaths(self) -> None:
        for p in self.procs:
            if p.poll() is not None and self.states.get(p.rank) != "dead":
                self.states[p.rank] = "dead"
                if not self.broken:
                    failure = Supervisor(self.procs, ListReporter(), self.log_dir or "").death_failure(
                        p.rank, p.returncode
                    )
                    self.broken = failure.summary()

    def show_roles(self, roles: dict[int, Role]) -> None:
        """A command gave ranks a (new) parallel role: a front end with a live view of the ranks shows it there."""
        return None

    def _free_stuck(self, stuck: list[int]) -> None:
        """Close the process group on the ranks that are not stuck: a peer waiting on them in a collective is freed."""
        pids = [p.pid for p in self.procs]
        for rank, conn in self._conns.items():
            if rank not in stuck:
                with contextlib.suppress(OSError):
                    send_message(conn, BreakGroup(pids))

    def _after(self, outcome: CellOutcome, cell: str) -> None:
        """Record what the command did to the ranks and to the session."""
        told = {r: role for r, role in outcome.roles.items() if self.roles.get(r) != role}
        self.roles.update(outcome.roles)
        if told:
            self.show_roles(told)
        for p in self.procs:
            if p.poll() is not None:
                self.states[p.rank] = "dead"
            elif p.rank in outcome.failures and outcome.failures[p.rank].kind is not FailureKind.HANG:
                self.states[p.rank] = f"failed in {cell}"
            elif p.rank in outcome.stopped or p.rank in outcome.failures:
                # stopped by the user, a peer or the watchdog
                why = (
                    "interrupted"
                    if outcome.interrupted
                    else "hung"
                    if outcome.hung_after is not None
                    else "stopped"
                )
                self.states[p.rank] = f"{why} in {cell}"
            elif self.states.get(p.rank, "").startswith("running"):
                self.states[p.rank] = "idle"
        dead = [f for f in outcome.failures.values() if f.kind in _DEATHS]
        if dead and not self.broken:
            self.broken = dead[0].summary()
        if outcome.group_broken and not self.group_broken:
            self.group_broken = f"in {cell}, " + stuck_sentence(outcome)
        self.note_failures(outcome, cell)

    def _recover_group(self) -> str | None:
        """A group broken under live ranks is replaced (a new store on a new port, a new group; namespaces kept).

        Returns why the old group was broken when a fresh one was formed, else None (``group_broken``
        then says why it could not be).
        """
        if not self.group_broken or self.broken or self.plan is None:
            return None
        self._notice_deaths()
        if self.broken:
            return None
        why = self.group_broken
        failure = None
        for _ in range(REGROUP_TRIES):
            port = pick_free_port(self.plan.options.master_addr)
            reporter = start_reporter(
                ListReporter(),
                self.num_processes,
                {"title": "re-form the process group", "log_dir": self.log_dir},
            )
            for p in self.procs:
                with contextlib.suppress(OSError):  # its end is closed: the supervisor reads how it died
                    send_message(self._conns[p.rank], Regroup(port))
            supervisor = CellSupervisor(self.procs, reporter, self.log_dir or "")
            try:
                outcome = supervisor.run()
            except KeyboardInterrupt:
                self.group_broken = f"{why}; forming a fresh group was interrupted"
                self._notice_deaths()
                return None
            self._notice_deaths()
            if self.broken:
                return None
            if not outcome.failures:
                self.group_broken = None
                self.stale = {
                    r: list(answer["value"]["stale"])
                    for r, answer in outcome.results.items()
                    if answer["value"]["stale"]
                }
                self.rebound = {
                    r: list(answer["value"]["rebound"])
                    for r, answer in outcome.results.items()
                    if answer["value"]["rebound"]
                }
                return why
            failure = next(iter(outcome.failures.values()))
        self.group_broken = (
            f"{why}; a fresh group could not be formed ({failure.summary() if failure else '?'})"
        )
        return None
