"""Launches with the kernel's debugger on (accel_nb/launch/kernel_debugger.py).

The debugger is switched on the way JupyterLab's bug icon and VS Code's "Debug Cell" do it: a
``debug_request`` ``initialize`` then ``attach`` on the kernel's control channel (debugpy starts in
the kernel and patches its process creation). Before the fix a plain ``%%accelerate -n 2`` sat at
"starting" forever: each forked rank waited to be attached to the debugger.
"""

from __future__ import annotations

import contextlib
import time

import psutil
import pytest

from tests.kernel_helpers import KernelSession
from tests.process_helpers import live_descendants
from tests.test_rank_debugger_kernel import LAUNCH, run_typing

pytestmark = [pytest.mark.kernel, pytest.mark.multiproc]


def _debug_request(k: KernelSession, seq: int, command: str, arguments: dict) -> dict:
    kc = k.kc
    kc.control_channel.send(
        kc.session.msg(
            "debug_request", {"type": "request", "seq": seq, "command": command, "arguments": arguments}
        )
    )
    while True:  # the reply to this request (events may come on the iopub channel, not here)
        msg = kc.control_channel.get_msg(timeout=120)
        if msg["msg_type"] == "debug_reply" and msg["content"].get("request_seq") == seq:
            return msg["content"]


def _debugger_on(k: KernelSession) -> None:
    init = {
        "clientID": "accel_nb-test",
        "adapterID": "python",
        "pathFormat": "path",
        "linesStartAt1": True,
        "columnsStartAt1": True,
    }
    assert _debug_request(k, 1, "initialize", init)["success"]
    assert _debug_request(k, 2, "attach", {})["success"]
    out = k.run(
        "import sys, os; print('traced' if sys.gettrace() else 'plain', hasattr(os, 'original_fork'))"
    )
    assert out.stdout.split() == ["traced", "True"], out.text  # debugpy is on and has patched fork


def _ok(out) -> None:
    assert out.error is None and not out.timed_out, (out.text, out.traceback)


def test_launches_and_a_session_work_with_the_kernels_debugger_on():
    with KernelSession() as k:
        _debugger_on(k)
        _ok(k.run("%load_ext accel_nb"))
        out = k.run("%%accelerate -n 2\nimport os\nprint('hello from rank', os.environ['RANK'])", timeout=240)
        _ok(out)
        assert "hello from rank 0" in out.text and "hello from rank 1" in out.text
        out = k.run(
            "from accel_nb import notebook_launcher\n"
            "def where():\n"
            "    import os, sys\n"
            "    return int(os.environ['RANK']), sys.gettrace() is None\n"
            "print(notebook_launcher(where, num_processes=2))",
            timeout=240,
        )
        _ok(out)
        assert "[(0, True), (1, True)]" in out.stdout  # the ranks do not carry the debugger's tracer
        # a breakpoint() in a rank is still accel_nb's pdb prompt in the cell (docs/debugging.md)
        typed = run_typing(k, LAUNCH.format(cond="rank == 1"), ["p x", "c"], timeout=240)
        assert typed.error is None, typed
        assert typed.prompts == ["(rank 1 Pdb) "] * 2 and "\n11\n" in typed.stdout, typed
        assert typed.results == ["[(10, 10), (11, 22)]"], typed
        out = k.run(
            "notebook_launcher(where, num_processes=2, start_method='spawn')\nprint('spawned ok')",
            timeout=240,
        )
        _ok(out)
        assert "spawned ok" in out.stdout
        _ok(k.run("%accelerate start -n 2 --cpu", timeout=240))
        _ok(k.run("%%accelerate\nimport os\nx = int(os.environ['RANK']) * 10", timeout=240))
        out = k.run("%%accelerate\nprint('warm', x)", timeout=240)
        _ok(out)
        assert "warm 0" in out.text and "warm 10" in out.text
        _ok(k.run("%accelerate stop", timeout=120))
        assert _debug_request(k, 3, "disconnect", {"restart": False, "terminateDebuggee": False})["success"]
        kernel = psutil.Process(k.pid)
        deadline = time.monotonic() + 60  # a bound, not a wait: ranks are gone at once after stop
        while _ranks(kernel) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _ranks(kernel) == []


def _ranks(kernel: psutil.Process) -> list[str]:
    """The kernel's descendants but debugpy's adapter (it stays for the next debug session)."""
    out = []
    for p in live_descendants(kernel):
        with contextlib.suppress(psutil.Error):
            if "debugpy" not in " ".join(p.cmdline()):
                out.append(f"{p.pid} {p.cmdline()[:3]}")
    return out
