"""What a session tells the user when a cell ends badly: the error of a failed or hung cell, the
note of an interrupted one, and the sentences about a process group that was re-formed or broken
(which objects were re-bound to the new group, which still hold the old one).

    raise cell_error(outcome, "cell 3", None, broken=None, group_broken=None, rebound={}, stale={})
"""

from __future__ import annotations

from ...events import FailureKind
from ..errors import LaunchError, RankFailure
from ..failures import first_failure
from ..parent.hang_blame import blame_stacks, collective_of
from .cell_supervisor import CellOutcome

__all__ = [
    "cell_error",
    "interrupted_note",
    "last_user_line",
    "per_object",
    "regrouped_sentence",
    "stale_sentence",
    "stuck_sentence",
]


def regrouped_sentence(recovered: str, rebound: dict[int, list[str]], stale: dict[int, list[str]]) -> str:
    """The words for a process group re-formed on the same workers after a broken collective."""
    said = (
        f"the process group was broken ({recovered}) and a fresh one was formed on the same workers: "
        "their namespaces are kept and collectives work again"
    )
    if rebound:
        said += "; " + per_object(rebound) + " now synchronise over the new group (re-bound)"
    return f"{said}; {stale_sentence(stale)}" if stale else said


def interrupted_note(
    recovered: str | None,
    *,
    broken: str | None,
    group_broken: str | None,
    rebound: dict[int, list[str]],
    stale: dict[int, list[str]],
) -> str:
    """What an interrupted cell left: a usable session, a re-formed group, or one to restart."""
    if broken:
        return f"a rank had to be killed, the session is broken ({broken}); restart it"
    if group_broken:
        return f"the process group is broken ({group_broken}); restart it"
    if recovered:
        return regrouped_sentence(recovered, rebound, stale)
    return "every rank stopped the cell; the session is still usable"


def cell_error(
    outcome: CellOutcome,
    cell: str,
    recovered: str | None,
    *,
    broken: str | None,
    group_broken: str | None,
    rebound: dict[int, list[str]],
    stale: dict[int, list[str]],
) -> LaunchError:
    """The error a failed or hung cell raises: who failed, then what the session can still do."""
    failures = list(outcome.failures.values())
    stopped = [r for r in outcome.stopped if r not in outcome.failures]
    first = first_failure(failures)
    if first is None:  # the hang watchdog ended it
        blame = blame_stacks(outcome.stuck_stacks, stopped or None) if outcome.stuck_stacks else None
        said = f"; {blame.sentence()}" if blame is not None and blame.sentence() else ""
        what = f"{cell} hung: no rank made progress for {outcome.hung_after:.0f} s{said}; each rank was interrupted"
        failures = [
            RankFailure(r, None, "interrupted by the hang watchdog", kind=FailureKind.HANG) for r in stopped
        ]
    else:
        what = f"{cell}: " + first.summary(first=True)
    if broken:
        then = f"the session is broken ({broken}): restart it"
    elif group_broken:
        then = f"the process group is broken ({group_broken}): pull what you need, then restart the session"
    elif recovered:
        then = regrouped_sentence(recovered, rebound, stale) + "; fix the cell and run it again"
    else:
        then = "the workers are alive and their namespaces intact: fix the cell and run it again"
    if outcome.stuck_stacks:
        where = "; ".join(
            f"rank {r} was at: {last_user_line(t)}" for r, t in sorted(outcome.stuck_stacks.items())
        )
        then = f"{where}. {then}"
    return LaunchError(failures, headline=f"{what}\n{then}", stopped=stopped)


def per_object(per_rank: dict[int, list[str]]) -> str:
    """``{0: ["model (X)"], 1: ["model (X)"]}`` -> ``"model (X) on ranks 0,1"``."""
    ranks_of: dict[str, list[int]] = {}
    for rank, items in sorted(per_rank.items()):
        for item in items:
            ranks_of.setdefault(item, []).append(rank)
    return "; ".join(
        f"{item} on rank{'s' if len(rs) > 1 else ''} {','.join(map(str, rs))}"
        for item, rs in ranks_of.items()
    )


def stale_sentence(stale: dict[int, list[str]]) -> str:
    """What still holds a replaced process group, per object with its ranks, and what to do about it."""
    return (
        "still bound to the old process group (it would fail or hang): "
        + per_object(stale)
        + ". Build them again and prepare them (e.g. a new model loaded from your last checkpoint, then its "
        "optimizer)"
    )


def stuck_sentence(outcome: CellOutcome) -> str:
    """Which ranks did not stop at the interrupt, and in what: from their stacks, not all that ran."""
    stuck = outcome.stuck or sorted(outcome.stuck_stacks)
    if not stuck:
        return "a rank did not stop at the interrupt and the group was closed under it"
    collectives = {r: collective_of(outcome.stuck_stacks.get(r, "")) for r in stuck}
    # the ones blocked in a collective; a rank merely slow to answer is not named
    if any(collectives.values()):
        stuck = [r for r in stuck if collectives[r]]
    parts = [f"rank {r}" + (f" (in {collectives[r]})" if collectives[r] else "") for r in stuck]
    verb = "was" if len(stuck) == 1 else "were"
    return (
        f"{' and '.join(parts)} did not stop at the interrupt and {verb} freed by closing the process group"
    )


def last_user_line(stacks: str) -> str:
    """Where the main thread is, from faulthandler's text: its innermost frame outside installed packages."""
    blocks = [b for b in stacks.split("\n\n") if "File " in b]
    main = next((b for b in blocks if "Current thread" in b), blocks[0] if blocks else "")
    frames = [ln.strip() for ln in main.splitlines() if ln.strip().startswith("File ")]
    if not frames:
        return "(no stack)"
    inside = [f for f in frames if "site-packages" not in f and "/lib/python" not in f]
    where = inside[0] if inside else frames[0]
    return where if where == frames[0] else f"{where} (inside {frames[0].rsplit(' in ', 1)[-1]})"
