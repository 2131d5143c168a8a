"""Post-mortem of a session cell: pdb in the failing rank, at the frame where it raised (``%accelerate debug``).

A warm rank keeps the exception of a failed cell (its frames with their locals) until the next cell
(``accel_nb.launch.rank.debugger``); the session remembers which ranks failed. ``debug()`` sends the
rank a ``PostMortem`` command: its pdb's prompts are answered in the notebook like a ``breakpoint()``'s.

    s.run("def f(v):\\n    w = v * 2\\n    raise ValueError(w)\\nf(21)")   # LaunchError
    s.debug()            # (rank 0 Pdb) p w  ->  42
"""

from __future__ import annotations

from typing import Any

from ...events import FailureKind
from .loop import PostMortem


class NoFailureToDebug(RuntimeError):
    """``debug()`` with no failed cell to open (or a rank that did not fail); the message says what to do."""


class PostMortemVerb:
    """``debug(rank=None)`` for ``WarmSession``: it calls ``note_failures`` after each command."""

    failed_ranks: list[int] = []  # the ranks whose last cell raised, the first to fail first
    failed_cell: str | None = None

    def note_failures(self, outcome: Any, label: str) -> None:
        """After a command: a cell that raised on some ranks can be debugged until the next cell."""
        if not label.startswith("cell"):
            return  # push, pull, debug itself: the ranks keep what they hold
        raised = [f for f in outcome.failures.values() if f.kind is FailureKind.EXCEPTION]
        raised.sort(key=lambda f: (not getattr(f, "first", False), f.rank))
        self.failed_ranks = [f.rank for f in raised]
        self.failed_cell = label if raised else None

    def debug(self, rank: int | None = None) -> str:
        """Open pdb in ``rank`` (default: the first that failed) at the frame where the last cell raised.

        s.debug()          # the first rank that failed
        s.debug(rank=1)
        """
        if not self.failed_ranks:
            raise NoFailureToDebug(
                "nothing to debug: the last cell did not raise. After a cell fails, %accelerate debug "
                "(Session.debug()) opens pdb where it raised, until the next cell runs"
            )
        if rank is None:
            rank = self.failed_ranks[0]
        elif rank not in self.failed_ranks:
            which = ", ".join(map(str, self.failed_ranks))
            raise NoFailureToDebug(f"rank {rank} did not raise in {self.failed_cell}; rank(s) {which} did")
        results = self._command(PostMortem(), rank, title="post-mortem", label="debug", quiet=True)
        return results[rank]["value"]
