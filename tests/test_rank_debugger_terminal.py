"""pdb in a rank on a terminal (issue 42): a script that calls ``notebook_launcher``, and ``accel-nb launch``.

Driven through a pty, as a person at a terminal: each ``(rank N Pdb)`` prompt is answered by writing a line.
"""

from __future__ import annotations

import glob
import os
import re
import select
import subprocess
import sys
import tempfile
import textwrap
import time

import pytest

from tests.kernel_helpers import ROOT

pytestmark = [pytest.mark.multiproc]

SCRIPT = textwrap.dedent(
    """
    from accel_nb import notebook_launcher

    def f():
        import os
        rank = int(os.environ["RANK"])
        x = 10 + rank
        if rank == 1:
            breakpoint()
        return x

    print("results:", notebook_launcher(f, num_processes=2, cpu=True))
    """
)


def drive(
    argv: list[str],
    prompt: bytes,
    answers: list[bytes],
    env: dict[str, str],
    timeout: float = 120,
    think: float = 0.0,
) -> bytes:
    """Run ``argv`` on a pty; write the next answer each time ``prompt`` (a regular expression) appears; all it wrote."""
    import pty

    pid, fd = pty.fork()
    if pid == 0:  # the child: the program, with the pty as its terminal
        os.execve(argv[0], argv, env)
    seen, left = b"", list(answers)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], 1.0)
            if not ready:
                continue
            try:
                chunk = os.read(fd, 4096)
            except OSError:  # EIO: the program ended and closed the terminal
                break
            if not chunk:
                break
            seen += chunk
            if left and len(re.findall(prompt, seen)) > len(answers) - len(left):
                if think and len(left) == len(answers):
                    time.sleep(think)  # the person looks at the first prompt for a while
                os.write(fd, left.pop(0))
        else:
            raise AssertionError(
                f"still running after {timeout} s; it wrote: {seen.decode(errors='replace')}"
            )
    finally:
        _, status = os.waitpid(pid, 0)
        os.close(fd)
    assert os.waitstatus_to_exitcode(status) == 0, seen.decode(errors="replace")
    return seen


def test_notebook_launcher_from_a_script_asks_on_the_terminal(tmp_path):
    script = tmp_path / "bp.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1")
    env.pop("PYTHONBREAKPOINT", None)
    out = drive([sys.executable, str(script)], rb"\(rank 1 Pdb\) ", [b"p x\n", b"c\n"], env).decode()
    out = out.replace("\r\n", "\n")
    assert "[accel_nb] rank 1 stopped in pdb at " in out, out
    assert "(rank 1 Pdb) p x\n11\n(rank 1 Pdb) c\n" in out, out
    assert "results: [10, 11]" in out, out


def test_notebook_launcher_from_a_script_without_a_terminal_says_and_skips(tmp_path):
    script = tmp_path / "bp.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1")
    env.pop("PYTHONBREAKPOINT", None)
    res = subprocess.run(
        [sys.executable, str(script)],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    assert "rank 1: breakpoint at" in out and "skipped: stdin is not a terminal" in out, out
    assert "results: [10, 11]" in out, out


SCRIPT_FOR_TORCHRUN = """
import torch, torch.distributed as dist
dist.init_process_group("gloo")
rank = dist.get_rank()
x = 10 + rank
breakpoint()
t = torch.tensor([x * 1.0])
dist.all_reduce(t)
print("rank", rank, "done", x, t.item())
# a raw torch group (not accel_nb's, which tears itself down at exit, docs/cli.md): without this, a rank
# may die of gloo's threads at interpreter shutdown ("terminate called without an active exception")
dist.destroy_process_group()
"""


def _accel_nb_launch(script, *flags: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "accel_nb.commands",
        "launch",
        "--num_processes",
        "2",
        "--cpu",
        *flags,
        str(script),
    ]


def test_accel_nb_launch_one_rank_at_a_time_on_the_terminal(tmp_path):
    script = tmp_path / "bp.py"
    script.write_text(SCRIPT_FOR_TORCHRUN)
    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1")
    env.pop("PYTHONBREAKPOINT", None)
    # the first rank: p x, then n twice (the second steps into all_reduce, which waits for the other rank,
    # at its breakpoint: after a second the terminal goes there); the other rank: p x, c; the first again: c
    answers = [b"p x\n", b"n\n", b"n\n", b"p x\n", b"c\n", b"c\n"]
    out = drive(_accel_nb_launch(script), rb"\(rank \d Pdb\) ", answers, env).decode().replace("\r\n", "\n")
    ranks = [int(r) for r in re.findall(r"\(rank (\d) Pdb\) ", out)]
    first, other = ranks[0], 1 - ranks[0]
    # one rank holds the terminal from its stop to its 'c', or until a step of it waits (for the other)
    assert ranks == [first] * 3 + [other] * 2 + [first], out
    assert not glob.glob(os.path.join(tempfile.gettempdir(), "accel_nb-pdb-*.lock")), "the pdb lock was left"
    for rank in (0, 1):
        assert f"[accel_nb] rank {rank} stopped in pdb at {script}:" in out, out
        # the answer to 'p x' (another rank's lines may come between: it runs on)
        assert re.search(rf"\(rank {rank} Pdb\) (.|\n)*?p x\n(.|\n)*?\[default{rank}\]:{10 + rank}\n", out), (
            out
        )
        assert f"rank {rank} done {10 + rank} 21.0" in out, out


def test_accel_nb_launch_timeout_does_not_count_time_in_pdb(tmp_path):
    script = tmp_path / "bp.py"
    # no process group: the ranks end at once after their last line (the watchdog's own end is not at stake)
    script.write_text('import os\nx = 10 + int(os.environ["RANK"])\nbreakpoint()\nprint("done", x)\n')
    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1")
    env.pop("PYTHONBREAKPOINT", None)
    # --timeout 2 while the person looks at the first prompt for 4 s (and the other rank waits its turn)
    argv = _accel_nb_launch(script, "--timeout", "2")
    out = drive(argv, rb"\(rank \d Pdb\) ", [b"c\n", b"c\n"], env, think=4.0).decode()
    assert "done 10" in out and "done 11" in out and "hung" not in out, out


def test_accel_nb_launch_without_a_terminal_says_and_skips(tmp_path):
    script = tmp_path / "bp.py"
    script.write_text(SCRIPT_FOR_TORCHRUN)
    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1")
    env.pop("PYTHONBREAKPOINT", None)
    res = subprocess.run(
        _accel_nb_launch(script),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    for rank in (0, 1):
        assert f"rank {rank}: breakpoint at {script}:6 skipped: stdin is not a terminal" in out, out
        assert f"rank {rank} done {10 + rank} 21.0" in out, out
