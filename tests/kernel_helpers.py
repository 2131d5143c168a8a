"""Drive a real Jupyter kernel (ipykernel through jupyter_client) from a test.

Example:
    with KernelSession() as k:
        out = k.run("print(1 + 1)")
        assert out.stdout.strip() == "2" and out.error is None
"""

from __future__ import annotations

import os
import queue
import sys
import time
from dataclasses import dataclass, field
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclass
class CellOutput:
    stdout: str = ""
    stderr: str = ""
    error: dict[str, Any] | None = None  # ename, evalue, traceback
    results: list[dict[str, Any]] = field(default_factory=list)  # execute_result / display_data bundles
    comms: list[dict[str, Any]] = field(default_factory=list)  # comm_open / comm_msg contents
    messages: list[dict[str, Any]] = field(default_factory=list)
    timed_out: bool = False

    @property
    def text(self) -> str:
        """stdout + stderr + the plain-text of every result, in one string (for asserts)."""
        plain = "".join(r.get("text/plain", "") for r in self.results)
        return self.stdout + self.stderr + plain

    @property
    def traceback(self) -> str:
        import re

        tb = "\n".join(self.error.get("traceback", [])) if self.error else ""
        return re.sub(r"\x1b\[[0-9;]*m", "", tb)


class KernelSession:
    """A real ipykernel running this interpreter, with the repository on its path."""

    def __init__(self, env: dict[str, str] | None = None, cwd: str | None = None) -> None:
        self.env = env or {}
        self.cwd = cwd or ROOT
        self.km = None
        self.kc = None

    def __enter__(self) -> KernelSession:
        from jupyter_client import KernelManager
        from jupyter_client.kernelspec import KernelSpec

        spec = KernelSpec(
            argv=[sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            display_name="accel_nb-test",
            language="python",
        )
        km = KernelManager()
        km._kernel_spec = spec
        from accel_nb.launch.pythonpath import with_package_on_path

        env = with_package_on_path(dict(os.environ))  # the kernel imports this checkout's accel_nb
        env["OMP_NUM_THREADS"] = "1"
        env.update(self.env)
        km.start_kernel(env=env, cwd=self.cwd)
        kc = km.client()
        kc.start_channels()
        kc.wait_for_ready(timeout=60)
        self.km, self.kc = km, kc
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @property
    def pid(self) -> int:
        return self.km.provisioner.process.pid

    def children(self) -> list[Any]:
        import psutil

        try:
            return psutil.Process(self.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    def close(self) -> None:
        if self.kc is not None:
            self.kc.stop_channels()
        if self.km is not None:
            self.km.shutdown_kernel(now=True)
        self.kc = self.km = None

    def run(self, code: str, timeout: float = 120, on_message: Any = None) -> CellOutput:
        """Execute ``code`` as a cell; collect everything the kernel sends for it until idle."""
        msg_id = self.kc.execute(code)
        return self.collect(msg_id, timeout=timeout, on_message=on_message)

    def collect(self, msg_id: str, timeout: float = 120, on_message: Any = None) -> CellOutput:
        out = CellOutput()
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                out.timed_out = True
                break
            try:
                msg = self.kc.get_iopub_msg(timeout=min(remaining, 1.0))
            except queue.Empty:
                continue
            mtype = msg["msg_type"]
            content = msg["content"]
            if mtype.startswith("comm_"):
                out.comms.append({"msg_type": mtype, **content})
                out.messages.append(msg)
                continue
            if msg.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            out.messages.append(msg)
            if on_message is not None:
                on_message(msg)
            if mtype == "stream":
                if content["name"] == "stdout":
                    out.stdout += content["text"]
                else:
                    out.stderr += content["text"]
            elif mtype == "error":
                out.error = content
            elif mtype in ("execute_result", "display_data", "update_display_data"):
                out.results.append(content.get("data", {}))
            elif mtype == "status" and content.get("execution_state") == "idle":
                break
        return out

    def wait_for_text(self, msg_id: str, text: str, count: int = 1, timeout: float = 60) -> str:
        """Read the running cell's stream output until ``text`` appeared ``count`` times (or ``timeout``); return it."""
        seen = ""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and seen.count(text) < count:
            try:
                msg = self.kc.get_iopub_msg(timeout=0.5)
            except queue.Empty:
                continue
            if msg.get("parent_header", {}).get("msg_id") == msg_id and msg["msg_type"] == "stream":
                seen += msg["content"]["text"]
        return seen

    def interrupt(self) -> None:
        self.km.interrupt_kernel()
