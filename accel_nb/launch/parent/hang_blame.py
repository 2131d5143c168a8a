"""Read the ranks' Python stacks (faulthandler's text) for who waits in a collective and who does not.

When a launch hangs, the ranks waiting in a collective (``all_reduce``, ``barrier``, a DDP backward)
wait for the ranks that are not in one: those are the likely cause.

    blame = blame_stacks({0: stack_of_rank_0, 1: stack_of_rank_1})
    blame.waiting            # {0: "all_reduce"}
    blame.elsewhere          # {1: "train, line 12 of /tmp/ipykernel_81/2291.py"}
    blame.sentence()         # "rank 0 waits in a collective (all_reduce); rank 1 is not: the likely cause, ..."
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)', re.MULTILINE)
_DISTRIBUTED = re.compile(r"[/\\]torch[/\\](distributed|nn[/\\]parallel)[/\\]")
_AUTOGRAD = re.compile(r"[/\\]torch[/\\]autograd[/\\]")
_LIBRARY = re.compile(r"[/\\](site-packages|dist-packages|lib[/\\]python3\.\d+)[/\\]|^<frozen ")
# accel_nb/
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + os.sep
_WRAPPERS = ("wrapper", "inner", "_fn")  # decorators around torch.distributed's calls: not the call's name


# the status of a rank the hang watchdog found to be the likely cause (its row says so, not "stopped")
HUNG_CULPRIT = "hung (likely cause)"


def _frames(block: str) -> list[tuple[str, int, str]]:
    """(file, line, function) of a faulthandler thread block, innermost first (faulthandler's order)."""
    out = []
    for line in block.splitlines():
        m = _FRAME.match(line)
        if m:
            out.append((m["file"], int(m["line"]), m["func"]))
    return out


def _blocks(text: str) -> list[str]:
    return [b for b in re.split(r"\n\s*\n", text.strip()) if _FRAME.search(b)]


def collective_of(text: str) -> str | None:
    """The torch.distributed call (or DDP backward) a rank's stacks wait in; None when it is in none."""
    for block in _blocks(text):
        frames = _frames(block)
        for file, _, func in frames:
            if _DISTRIBUTED.search(file) and func not in _WRAPPERS and not func.startswith("<"):
                return func
        if frames and _AUTOGRAD.search(frames[0][0]) and any(f[2] == "backward" for f in frames):
            return "backward (DDP's gradient all-reduce)"
    return None


def user_line(text: str) -> str | None:
    """The innermost frame of the user's code in a rank's stacks: ``train, line 12 of /tmp/x.py``."""
    for block in _blocks(text):
        for file, line, func in _frames(block):
            if not _LIBRARY.search(file) and not os.path.abspath(file).startswith(_PACKAGE_DIR):
                return f"{func}, line {line} of {file}"
    return None


def _ranks(ranks: list[int]) -> str:
    return f"rank{'s' if len(ranks) != 1 else ''} {', '.join(map(str, ranks))}"


@dataclass
class Blame:
    """Which ranks wait in a collective (and in which), which are elsewhere (where), which did not answer."""

    waiting: dict[int, str] = field(default_factory=dict)
    elsewhere: dict[int, str] = field(default_factory=dict)
    silent: list[int] = field(default_factory=list)

    @property
    def likely_cause(self) -> list[int]:
        """The ranks the others wait for: not in a collective while some are (else none is singled out)."""
        if self.waiting and (self.elsewhere or self.silent):
            return sorted([*self.elsewhere, *self.silent])
        return []

    def sentence(self) -> str:
        """One sentence for the user: who waits in what, who does not (the likely cause), from the stacks."""
        parts = []
        if self.waiting:
            names = sorted(set(self.waiting.values()))
            parts.append(
                f"{_ranks(sorted(self.waiting))} wait{'s' if len(self.waiting) == 1 else ''} in a collective "
                f"({', '.join(names)})"
            )
        if self.elsewhere:
            if len(self.elsewhere) == 1:
                where = f"at {next(iter(self.elsewhere.values()))}"
            else:
                where = "; ".join(f"rank {r} at {w}" for r, w in sorted(self.elsewhere.items()))
            if self.waiting:
                one = len(self.elsewhere) == 1
                parts.append(
                    f"{_ranks(sorted(self.elsewhere))} {'is' if one else 'are'} not: the likely cause, "
                    f"{'it is' if one else 'they are'} waited for ({where})"
                )
            else:
                parts.append(f"no rank is in a collective ({where})")
        if self.silent:
            parts.append(f"{_ranks(self.silent)} did not answer with a stack")
        if self.waiting and not self.elsewhere and not self.silent:
            if len(set(self.waiting.values())) > 1:
                parts.append(
                    "the ranks wait in different collectives: each must call the same ones, in the same order"
                )
            else:
                parts.append(
                    "every rank waits in it: a rank may have called it once more or less than the others"
                )
        return "; ".join(parts)


def blame_stacks(stacks: dict[int, str], ranks: list[int] | None = None) -> Blame:
    """Sort ``ranks`` (default: those in ``stacks``) by what their stacks show."""
    blame = Blame()
    for rank in sorted(ranks if ranks is not None else stacks):
        text = stacks.get(rank, "")
        if not _blocks(text):
            blame.silent.append(rank)
            continue
        collective = collective_of(text)
        if collective is not None:
            blame.waiting[rank] = collective
        else:
            blame.elsewhere[rank] = user_line(text) or "outside torch.distributed"
    return blame
