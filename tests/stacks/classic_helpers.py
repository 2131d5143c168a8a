"""Classic Notebook 6 (the front-end of Colab's ``notebook`` 6.5.7 and its ipywidgets 7 extension)
for the colab stack's browser test: the server, opening a notebook, running it, reading outputs.

    with ClassicServer(root_dir) as nb, chromium() as browser:
        page = new_page(browser)
        open_classic(page, nb, "progress.ipynb")
        page.evaluate("() => Jupyter.notebook.execute_all_cells()")

The recipe of /work/shared/TESTING.md section 10; the browser side is tests/browser_helpers.py's.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from typing import Any

from tests.browser_helpers import free_port, wait_until


class ClassicServer:
    """``jupyter notebook`` (classic, 6.x) on 127.0.0.1 serving ``root_dir``, with its own config and data dirs."""

    def __init__(self, root_dir: str, log_path: str | None = None) -> None:
        self.root_dir = root_dir
        self.port = free_port()
        self.token = secrets.token_hex(16)
        self.home = tempfile.mkdtemp(prefix="accel_nb_classic_")
        self.log_path = log_path or os.path.join(self.home, "notebook.log")
        self.proc: subprocess.Popen | None = None

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}/{path.lstrip('/')}?token={self.token}"

    def start(self, timeout: float = 90.0) -> ClassicServer:
        env = dict(os.environ)
        env.update(
            # the venv's own nbconfig (widgets) still applies
            JUPYTER_CONFIG_DIR=os.path.join(self.home, "config"),
            JUPYTER_DATA_DIR=os.path.join(self.home, "data"),  # no user kernelspec: python3 is this venv's
            JUPYTER_RUNTIME_DIR=os.path.join(self.home, "runtime"),
            OMP_NUM_THREADS="1",
        )
        cmd = [
            sys.executable,
            "-m",
            "notebook",
            "--no-browser",
            "--ip",
            "127.0.0.1",
            "--port",
            str(self.port),
            f"--NotebookApp.token={self.token}",
            f"--NotebookApp.notebook_dir={self.root_dir}",
            # the "migrate to Notebook 7" banner would cover the screenshots
            "--NotebookApp.show_banner=False",
        ]
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            cmd.append("--allow-root")
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            cmd,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=self.root_dir,
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"jupyter notebook exited with {self.proc.returncode}: {self.log_tail()}")
            with contextlib.suppress(OSError):
                self.api("status")
                return self
            time.sleep(0.3)
        raise TimeoutError(f"jupyter notebook did not answer within {timeout:.0f} s: {self.log_tail()}")

    def api(self, path: str) -> Any:
        with urllib.request.urlopen(self.url(f"api/{path}"), timeout=10) as resp:
            return json.loads(resp.read().decode())

    def kernel_state(self, notebook: str) -> str | None:
        for session in self.api("sessions"):
            if session.get("path", "").endswith(notebook) and session.get("kernel"):
                return session["kernel"].get("execution_state")
        return None

    def log_tail(self, n: int = 4000) -> str:
        with contextlib.suppress(OSError):
            with open(self.log_path, "rb") as f:
                return f.read().decode(errors="replace")[-n:]
        return ""

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(OSError, ValueError):
                for kernel in self.api("kernels"):
                    req = urllib.request.Request(self.url(f"api/kernels/{kernel['id']}"), method="DELETE")
                    with contextlib.suppress(OSError):
                        urllib.request.urlopen(req, timeout=30).close()
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        if getattr(self, "_log", None):
            self._log.close()
        shutil.rmtree(self.home, ignore_errors=True)

    def __enter__(self) -> ClassicServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def open_classic(page: Any, server: ClassicServer, notebook: str, timeout: float = 90.0) -> None:
    """Open ``notebook`` and wait until its kernel is idle and the page's notebook is ready."""
    page.goto(server.url(f"notebooks/{notebook}"), wait_until="domcontentloaded")
    page.wait_for_function(
        "() => window.Jupyter && Jupyter.notebook && Jupyter.notebook._fully_loaded && Jupyter.notebook.kernel",
        timeout=timeout * 1000,
    )
    page.wait_for_function("() => Jupyter.notebook.kernel.is_connected()", timeout=timeout * 1000)

    def idle() -> bool:
        # The server learns the kernel's state from its status messages. The page's first
        # kernel_info can come before the server's subscription to them is in place (zmq's
        # "slow joiner"): that idle is lost and the state reads "starting" until the next message.
        # Asking the kernel again makes a new busy/idle pair, so the wait ends on a condition.
        if server.kernel_state(notebook) == "idle":
            return True
        page.evaluate("() => Jupyter.notebook.kernel.kernel_info()")
        return False

    wait_until(idle, timeout, f"the kernel of {notebook} to be idle", interval=2.0)


def run_cell(page: Any, index: int) -> None:
    """Start cell ``index`` (returns at once)."""
    page.evaluate("i => Jupyter.notebook.execute_cells([i])", index)


def cell_done(page: Any, index: int) -> bool:
    """True once cell ``index`` has run (its prompt holds a number, not ``*``)."""
    return bool(
        page.evaluate(
            "i => { const c = Jupyter.notebook.get_cell(i); "
            "return c.input_prompt_number !== null && c.input_prompt_number !== '*' "
            "&& c.input_prompt_number !== undefined; }",
            index,
        )
    )


def cell_outputs(page: Any, index: int) -> list[dict[str, Any]]:
    """Cell ``index``'s outputs as nbformat JSON."""
    return page.evaluate("i => Jupyter.notebook.get_cell(i).output_area.toJSON()", index)


def cell_node(page: Any, index: int) -> Any:
    node = page.locator("#notebook-container .cell").nth(index)
    node.scroll_into_view_if_needed()
    return node
