"""pdb in a rank on a terminal (issue 42): a script calls ``notebook_launcher``; the rank's prompt is the terminal's.

Driven through a pty, as a person at a terminal: each ``(rank 1 Pdb)`` prompt is answered by writing a line.
"""

from __future__ import annotations

import os
import select
import sys
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
    argv: list[str], prompt: bytes, answers: list[bytes], env: dict[str, str], timeout: float = 120
) -> bytes:
    """Run ``argv`` on a pty; write the next answer each time ``prompt`` appears; everything it wrote."""
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
            if left and seen.count(prompt) > len(answers) - len(left):
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
    out = drive([sys.executable, str(script)], b"(rank 1 Pdb) ", [b"p x\n", b"c\n"], env).decode()
    out = out.replace("\r\n", "\n")
    assert "[accel_nb] rank 1 stopped in pdb at " in out, out
    assert "(rank 1 Pdb) p x\n11\n(rank 1 Pdb) c\n" in out, out
    assert "results: [10, 11]" in out, out
