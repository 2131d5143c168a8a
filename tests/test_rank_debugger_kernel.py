"""pdb in a rank, answered through a REAL kernel's stdin channel (issue 42).

A person types pdb commands into the front-end's input box; a test does what the front-end does:
``kc.execute(code, allow_stdin=True)``, then each ``input_request`` on the stdin channel is answered
with ``kc.input(line)``. The tests share one kernel and run in order: breakpoints in
``notebook_launcher`` (one rank, both ranks), ``PYTHONBREAKPOINT=0``, a front-end without stdin,
then a session: a breakpoint in a ``%%accelerate`` cell and the post-mortem of a failed one.
"""

from __future__ import annotations

import queue
import re
import time
from dataclasses import dataclass, field
from typing import Any

import pytest

from tests.kernel_helpers import KernelSession

pytestmark = [pytest.mark.kernel, pytest.mark.multiproc, pytest.mark.slow]


@dataclass
class Answered:
    stdout: str = ""
    stderr: str = ""
    error: dict | None = None
    results: list[str] = field(default_factory=list)
    prompts: list[str] = field(default_factory=list)  # every input_request's prompt, in order
    unanswered: list[str] = field(default_factory=list)  # prompts that came after the answers ran out


@pytest.fixture(scope="module")
def kernel():
    with KernelSession(env={"ACCEL_NB_PROGRESS": "text"}) as k:
        out = k.run("%load_ext accel_nb", timeout=120)
        assert out.error is None, out.traceback
        yield k


STOP = object()  # an answer: interrupt the kernel (the ■ button)


def run_typing(
    k: KernelSession,
    code: str,
    answers: Any,
    allow_stdin: bool = True,
    timeout: float = 120,
    think: float = 0.0,
):
    """Run ``code``; answer each input_request with the next of ``answers`` (then with 'c'), as a person would,
    ``think`` seconds after the first prompt shows. ``answers`` may be a function of the prompts so far."""
    kc = k.kc
    msg_id = kc.execute(code, allow_stdin=allow_stdin)
    out = Answered()
    left = [] if callable(answers) else list(answers)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            req = kc.get_stdin_msg(timeout=0.05)
        except queue.Empty:
            req = None
        if req is not None and req["msg_type"] == "input_request":
            out.prompts.append(req["content"]["prompt"])
            if think and len(out.prompts) == 1:
                time.sleep(think)
            if callable(answers):
                kc.input(answers(out.prompts))
            elif left and left[0] is STOP:  # the person presses the ■ button instead of typing
                left.pop(0)
                k.interrupt()
            elif left:
                kc.input(left.pop(0))
            else:
                out.unanswered.append(req["content"]["prompt"])
                kc.input("c")
        try:
            msg = kc.get_iopub_msg(timeout=0.05)
        except queue.Empty:
            continue
        if msg.get("parent_header", {}).get("msg_id") != msg_id:
            continue
        kind, content = msg["msg_type"], msg["content"]
        if kind == "stream":  # pdb's colours (the kernel's pdb is IPython's) taken out
            text = re.sub(r"\x1b\[[0-9;]*m", "", content["text"])
            if content["name"] == "stdout":
                out.stdout += text
            else:
                out.stderr += text
        elif kind == "error":
            out.error = content
        elif kind == "execute_result":
            out.results.append(content["data"].get("text/plain", ""))
        elif kind == "status" and content["execution_state"] == "idle":
            return out
    raise AssertionError(f"the cell did not finish within {timeout} s; so far: {out}")


LAUNCH = """
from accel_nb import notebook_launcher

def f():
    import os
    rank = int(os.environ["RANK"])
    x = 10 + rank
    if {cond}:
        breakpoint()
        y = x * 2
    else:
        y = x
    return x, y

notebook_launcher(f, num_processes=2, cpu=True)
"""


def test_breakpoint_in_rank_1_inspect_step_continue(kernel):
    out = run_typing(kernel, LAUNCH.format(cond="rank == 1"), ["p x", "n", "p y", "c"])
    assert out.error is None, out
    assert out.prompts == ["(rank 1 Pdb) "] * 4, out
    assert "rank 1 stopped in pdb" in out.stdout
    assert re.search(r"-> *9 +y = x \* 2", out.stdout), out.stdout  # stopped on the line after breakpoint()
    assert "\n11\n" in out.stdout  # p x
    assert re.search(r"-> *12 +return x, y", out.stdout), out.stdout  # n stepped to the next line
    assert "\n22\n" in out.stdout  # p y
    assert out.results == ["[(10, 10), (11, 22)]"], out


def test_breakpoint_in_both_ranks_one_prompt_at_a_time(kernel):
    out = run_typing(kernel, LAUNCH.format(cond="True"), ["p rank", "p x", "c", "p rank", "c"])
    assert out.error is None, out
    assert out.results == ["[(10, 20), (11, 22)]"], out
    # each rank keeps the prompt until it is let go ("c"): three of one rank, then two of the other
    first, second = out.prompts[0], out.prompts[3]
    assert {first, second} == {"(rank 0 Pdb) ", "(rank 1 Pdb) "}, out.prompts
    assert out.prompts == [first] * 3 + [second] * 2, out.prompts
    assert not out.unanswered


def test_breakpoint_in_a_spawned_rank(kernel):
    code = LAUNCH.format(cond="rank == 1").replace("cpu=True)", "cpu=True, start_method='spawn')")
    out = run_typing(kernel, code, ["p x", "c"])
    assert out.error is None, out
    assert out.prompts == ["(rank 1 Pdb) "] * 2 and "\n11\n" in out.stdout, out
    assert out.results == ["[(10, 10), (11, 22)]"], out


COLLECTIVE = """
from accel_nb import notebook_launcher

def g():
    import torch, torch.distributed as dist
    from accel_nb import PartialState
    rank = PartialState().process_index
    t = torch.tensor([1.0 + rank])
    if rank == 1:
        breakpoint()
    dist.all_reduce(t)   # rank 0 waits here for rank 1, in the debugger
    return t.item()

notebook_launcher(g, num_processes=2, cpu=True, timeout=2)
"""


def _rank_of(prompt: str) -> int:
    return int(prompt.split()[1])  # "(rank 1 Pdb) "


def test_rank_n_at_a_prompt_moves_it_to_another_rank(kernel):
    def person(prompts: list[str]) -> str:
        first, now = _rank_of(prompts[0]), _rank_of(prompts[-1])
        other = 1 - first
        if now == first and not any(_rank_of(p) == other for p in prompts):
            return f"rank {other}"  # again until the other rank has reached its breakpoint
        in_a_row = 0  # prompts of this rank since it got the prompt
        for p in reversed(prompts):
            if _rank_of(p) != now:
                break
            in_a_row += 1
        return "p rank" if in_a_row == 1 else "c"

    out = run_typing(kernel, LAUNCH.format(cond="True"), person)
    assert out.error is None, out
    assert out.results == ["[(10, 20), (11, 22)]"], out
    ranks = [_rank_of(p) for p in out.prompts]
    first = ranks[0]
    switched = ranks.index(1 - first)
    # the first rank's prompt until the move, the other rank's two (p rank, c), then the first's two again
    assert ranks[:switched] == [first] * switched and ranks[switched:] == [1 - first] * 2 + [first] * 2, ranks
    assert f"\n{1 - first}\n" in out.stdout and f"\n{first}\n" in out.stdout


STEP_INTO_A_COLLECTIVE = """
from accel_nb import notebook_launcher

def h():
    import torch, torch.distributed as dist
    from accel_nb import PartialState
    rank = PartialState().process_index
    t = torch.tensor([1.0 + rank])
    breakpoint()
    dist.all_reduce(t)
    return t.item()

notebook_launcher(h, num_processes=2, cpu=True)
"""


def test_a_step_into_a_collective_passes_the_prompt_to_the_rank_it_waits_for(kernel):
    # the first rank steps over all_reduce: it waits for the other rank, at its breakpoint; the prompt
    # goes there ('c'), the all_reduce completes, and the first rank stops after it ('c')
    def person(prompts: list[str]) -> str:
        return "n" if len(prompts) == 1 else "c"

    out = run_typing(kernel, STEP_INTO_A_COLLECTIVE, person)
    assert out.error is None, out
    ranks = [_rank_of(p) for p in out.prompts]
    assert len(ranks) == 3 and ranks[0] == ranks[2] != ranks[1], ranks
    assert f"rank {ranks[0]} is still in its step" in out.stdout, out.stdout
    assert out.results == ["[3.0, 3.0]"], out


def test_the_hang_timeout_does_not_count_time_in_the_debugger(kernel):
    # the person looks at the prompt for longer than the launch's timeout while rank 0 waits in all_reduce
    out = run_typing(kernel, COLLECTIVE, ["p t", "c"], think=4.0)
    assert out.error is None, out
    assert out.prompts == ["(rank 1 Pdb) "] * 2
    assert "tensor([2.])" in out.stdout
    assert out.results == ["[3.0, 3.0]"], out


def test_pythonbreakpoint_0_is_honoured(kernel):
    code = 'import os\nos.environ["PYTHONBREAKPOINT"] = "0"\n' + LAUNCH.format(cond="rank == 1")
    try:
        out = run_typing(kernel, code, [])
    finally:
        kernel.run('import os\nos.environ.pop("PYTHONBREAKPOINT", None)')
    assert out.error is None, out
    assert out.prompts == []
    assert out.results == ["[(10, 10), (11, 22)]"], out


def test_no_stdin_the_breakpoint_is_said_and_skipped(kernel):
    out = run_typing(kernel, LAUNCH.format(cond="rank == 1"), [], allow_stdin=False)
    assert out.error is None, out
    assert out.prompts == []
    assert out.results == ["[(10, 10), (11, 22)]"], out
    assert "rank 1: breakpoint at" in out.stdout + out.stderr
    assert "skipped" in out.stdout + out.stderr


def test_one_shot_failure_debug_says_a_session_is_needed(kernel):
    out = run_typing(kernel, "%%accelerate -n 2 --cpu --return z\nraise ValueError('boom')", [])
    assert out.error is not None
    out = run_typing(kernel, "%accelerate debug", [])  # a UsageError: IPython shows it on stderr
    said = out.stderr
    assert out.prompts == [] and "UsageError: %accelerate debug" in said, out
    assert "Post-mortem needs a session" in said and "`%accelerate start -n 2 --cpu`" in said, said


def test_session_breakpoint_and_post_mortem(kernel):
    out = run_typing(kernel, "%accelerate start -n 2 --cpu", [])
    assert out.error is None, out
    try:
        cell = (
            "%%accelerate\n"
            "import os\n"
            "rank = int(os.environ['RANK'])\n"
            "secret = 41 + rank\n"
            "if rank == 0:\n"
            "    breakpoint()\n"
            "    seen = secret\n"
        )
        out = run_typing(kernel, cell, ["p secret", "c"])
        assert out.error is None, out
        assert out.prompts == ["(rank 0 Pdb) "] * 2
        assert "\n41\n" in out.stdout

        failing = (
            "%%accelerate\n"
            "def g(v):\n"
            "    doubled = v * 2\n"
            "    raise ValueError(f'boom {doubled}')\n"
            "if rank == 1:\n"
            "    g(secret)\n"
        )
        out = run_typing(kernel, failing, [])
        assert out.error is not None and "boom 84" in out.error["evalue"], out

        out = run_typing(kernel, "%accelerate debug", ["p doubled", "p v", "up", "p rank", "c"])
        assert out.error is None, out
        assert out.prompts == ["(rank 1 Pdb) "] * 5, out
        assert "ValueError: boom 84" in out.stdout
        assert "\n84\n" in out.stdout and "\n42\n" in out.stdout  # the failing frame's locals
        assert "\n1\n" in out.stdout  # one frame up: the cell's namespace

        out = run_typing(kernel, "%accelerate debug --rank 0", [])
        assert "UsageError" in out.stderr and "rank 0 did not raise in cell" in out.stderr, out
    finally:
        kernel.run("%accelerate stop")


def test_stop_at_a_prompt_ends_a_one_shot_launch_and_leaves_a_session_usable(kernel):
    out = run_typing(kernel, LAUNCH.format(cond="rank == 1"), ["p x", STOP])
    assert out.error is not None and "interrupted" in out.error["evalue"], out
    assert out.prompts == ["(rank 1 Pdb) "] * 2
    assert run_typing(kernel, "%accelerate start -n 2 --cpu", []).error is None
    try:
        cell = "%%accelerate\nimport os\nrank = int(os.environ['RANK'])\nif rank == 1:\n    breakpoint()\n    pass\n"
        out = run_typing(kernel, cell, [STOP])
        assert out.error is not None and out.error["ename"] == "KeyboardInterrupt", out
        out = run_typing(kernel, "%%accelerate\nprint('alive', rank)", [])
        assert out.error is None, out
        assert "alive 0" in out.stdout + out.stderr and "alive 1" in out.stdout + out.stderr, out
    finally:
        kernel.run("%accelerate stop")
