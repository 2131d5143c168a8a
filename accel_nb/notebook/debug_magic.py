"""``%accelerate debug [--rank R]``: pdb in the rank where the last session cell raised, like IPython's ``%debug``.

    %accelerate start -n 2 --cpu
    %%accelerate
    ...                          # raises on rank 1
    %accelerate debug            # (rank 1 Pdb) prompts in this cell, at the frame that raised

A one-shot launch (``%%accelerate`` with no session, ``notebook_launcher``) leaves no process to
debug: the verb says so and gives the ``%accelerate start`` line with the failed cell's own flags.
"""

from __future__ import annotations

import shlex
from typing import Any

from IPython.core.error import UsageError

from ..launch.session.post_mortem import NoFailureToDebug
from .magic_flags import UsageParser

DEBUG_USAGE = "%accelerate debug [--rank R]"
# flags of %%accelerate that are not start flags (they belong to one cell); with how many values each takes
_CELL_ONLY = {"--rank": 1, "--return": 1}


class _LastOneShot:
    line: str | None = None  # the flags of the last %%accelerate that launched fresh processes and failed


def remember_failed_one_shot(line: str | None) -> None:
    """A one-shot ``%%accelerate`` with these flags failed (None: the last one succeeded)."""
    _LastOneShot.line = line


def start_line(cell_line: str) -> str:
    """``%accelerate start`` with the launch flags of a ``%%accelerate`` line (``--rank`` and ``--return``
    dropped: they are a cell's).

        start_line("-n 2 --cpu --return model")   # '%accelerate start -n 2 --cpu'
    """
    try:
        words = shlex.split(cell_line)
    except ValueError:
        words = cell_line.split()
    kept: list[str] = []
    skip = 0
    for word in words:
        if skip:
            skip -= 1
            continue
        name = word.split("=", 1)[0]
        if name in _CELL_ONLY:
            skip = 0 if "=" in word else _CELL_ONLY[name]
            continue
        kept.append(word)
    return " ".join(["%accelerate start", *map(shlex.quote, kept)])


def debug_verb(session: Any, rest: str) -> None:
    """Run ``%accelerate debug`` on ``session`` (None: no session is running)."""
    __tracebackhide__ = True
    p = UsageParser(
        prog="%accelerate debug",
        add_help=False,
        allow_abbrev=False,
        label="%accelerate",
        usage_line=DEBUG_USAGE,
    )
    p.add_argument("--rank", type=int, default=None)
    args = p.parse_args(shlex.split(rest))
    if session is None:
        if _LastOneShot.line is not None:
            start = start_line(_LastOneShot.line)
            said = (
                "the last %%accelerate cell ran on fresh processes, which ended with it: nothing is left to "
                f"debug. Post-mortem needs a session: run `{start}`, run the cell again, then %accelerate debug"
            )
        else:
            said = (
                "post-mortem needs a session (a one-shot launch's processes end with it): start one with "
                "%accelerate start and the cell's flags (e.g. %accelerate start -n 2 --cpu), run the failing "
                "cell, then %accelerate debug. A breakpoint() in the cell works without a session"
            )
        raise UsageError(f"%accelerate debug: {said}")
    try:
        what = session.debug(args.rank)
    except NoFailureToDebug as exc:
        raise UsageError(f"%accelerate debug: {exc}") from None
    print(f"[accel_nb] left the post-mortem of {what}")
