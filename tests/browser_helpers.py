"""JupyterLab + Debian's Chromium (Playwright) for the widget browser tests.

Recipe of /work/shared/TESTING.md section 3: JupyterLab on 127.0.0.1 with a token, the news and
update checks switched off by a settings override, the system chromium launched headless (never a
browser download), the kernel awaited through ``/api/sessions`` before cells run.

    write_notebook(os.path.join(root_dir, "nb.ipynb"), ["print(1)"])
    with LabServer(root_dir) as lab, chromium() as browser:
        page = new_page(browser)
        open_notebook(page, lab, "nb.ipynb")
        run_all_cells(page, lab, "nb.ipynb")
        screenshot(page, "nb_done", SHOTS)

The one home of the browser tests' preamble: server, browser, page size, notebook files,
screenshots folder (``artifacts/screenshots``).
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
from collections.abc import Iterator
from typing import Any

from accel_nb.launch.ports import pick_free_port as free_port  # the launcher's picker

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHOTS = os.path.join(ROOT, "artifacts", "screenshots")  # kept after the run: look at them
VIEWPORT = {"width": 1400, "height": 1000}
KERNELSPEC = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
]
OVERRIDES = {
    "@jupyterlab/apputils-extension:notification": {"fetchNews": "false", "checkForUpdates": False},
    "@jupyterlab/notebook-extension:tracker": {"windowingMode": "none"},  # render every cell
}


def write_notebook(path: str, sources: list[str]) -> str:
    """A notebook of code cells at ``path`` with the python3 kernelspec (JupyterLab opens it unasked)."""
    cells = [
        {"cell_type": "code", "metadata": {}, "source": src, "outputs": [], "execution_count": None}
        for src in sources
    ]
    nb = {"cells": cells, "metadata": {"kernelspec": KERNELSPEC}, "nbformat": 4, "nbformat_minor": 5}
    with open(path, "w") as f:
        json.dump(nb, f)
    return path


def new_page(browser: Any) -> Any:
    """A fresh browser context and page at the size every screenshot is taken at."""
    return browser.new_context(viewport=VIEWPORT).new_page()


def start_all_cells(page: Any) -> None:
    """Start "Run All Cells" and return at once (to watch a cell while it runs)."""
    page.click(".jp-Notebook .jp-Cell >> nth=0")  # focus the notebook panel
    # not awaited: the command's promise settles only when the last cell has finished
    page.evaluate("() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }")


class LabServer:
    """A JupyterLab server on 127.0.0.1 serving ``root_dir``, with its own settings and runtime dirs."""

    def __init__(self, root_dir: str, log_path: str | None = None) -> None:
        self.root_dir = root_dir
        self.port = free_port()
        self.token = secrets.token_hex(16)
        self.home = tempfile.mkdtemp(prefix="accel_nb_lab_")
        self.log_path = log_path or os.path.join(self.home, "jupyterlab.log")
        self.proc: subprocess.Popen | None = None

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def url(self, path: str, **query: str) -> str:
        q = "&".join([f"token={self.token}"] + [f"{k}={v}" if v else k for k, v in query.items()])
        return f"{self.base}/{path.lstrip('/')}?{q}"

    def start(self, timeout: float = 90.0) -> LabServer:
        settings = os.path.join(self.home, "app-settings")
        os.makedirs(settings)
        with open(os.path.join(settings, "overrides.json"), "w") as f:
            json.dump(OVERRIDES, f)
        env = dict(os.environ)
        env.update(
            JUPYTER_CONFIG_DIR=os.path.join(self.home, "config"),
            JUPYTER_RUNTIME_DIR=os.path.join(self.home, "runtime"),
            JUPYTERLAB_SETTINGS_DIR=os.path.join(self.home, "user-settings"),
            JUPYTERLAB_WORKSPACES_DIR=os.path.join(self.home, "workspaces"),
            OMP_NUM_THREADS="1",
        )
        cmd = [
            sys.executable,
            "-m",
            "jupyterlab",
            "--no-browser",
            "--ip",
            "127.0.0.1",
            "--port",
            str(self.port),
            f"--IdentityProvider.token={self.token}",
            "--LabApp.news_url=None",
            "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
            f"--LabApp.app_settings_dir={settings}",
            f"--ServerApp.root_dir={self.root_dir}",
            "--ServerApp.open_browser=False",
            "--LabApp.expose_app_in_browser=True",
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
                raise RuntimeError(f"jupyter lab exited with {self.proc.returncode}: {self.log_tail()}")
            with contextlib.suppress(OSError):
                self.api("status")
                return self
            time.sleep(0.3)
        raise TimeoutError(f"jupyter lab did not answer within {timeout:.0f} s: {self.log_tail()}")

    def api(self, path: str) -> Any:
        with urllib.request.urlopen(self.url(f"api/{path}"), timeout=10) as resp:
            return json.loads(resp.read().decode())

    def kernel_state(self, notebook: str) -> str | None:
        """The execution state of the kernel of ``notebook``'s session, None if it has none yet."""
        for session in self.api("sessions"):
            if session.get("path", "").endswith(notebook) and session.get("kernel"):
                return session["kernel"].get("execution_state")
        return None

    def log_tail(self, n: int = 4000) -> str:
        with contextlib.suppress(OSError):
            with open(self.log_path, "rb") as f:
                return f.read().decode(errors="replace")[-n:]
        return ""

    def shutdown_kernels(self) -> None:
        """Shut every kernel down through the REST API (the server stays up)."""
        with contextlib.suppress(OSError, ValueError):
            for kernel in self.api("kernels"):
                req = urllib.request.Request(self.url(f"api/kernels/{kernel['id']}"), method="DELETE")
                with contextlib.suppress(OSError):
                    urllib.request.urlopen(req, timeout=30).close()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.shutdown_kernels()
            self.proc.send_signal(signal.SIGTERM)  # the server shuts its remaining kernels down too
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        if getattr(self, "_log", None):
            self._log.close()
        shutil.rmtree(self.home, ignore_errors=True)

    def __enter__(self) -> LabServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


@contextlib.contextmanager
def chromium() -> Iterator[Any]:
    """Debian's chromium driven by Playwright (no browser download)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


def wait_until(predicate, timeout: float, what: str, interval: float = 0.25) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")


def open_notebook(page: Any, lab: LabServer, notebook: str, timeout: float = 90.0) -> None:
    """Open ``notebook`` in a fresh workspace and wait until its kernel is idle."""
    page.goto(lab.url(f"lab/tree/{notebook}", reset=""), wait_until="domcontentloaded")
    page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=timeout * 1000)
    wait_until(lambda: lab.kernel_state(notebook) == "idle", timeout, f"the kernel of {notebook} to be idle")
    page.wait_for_function("() => !!window.jupyterapp", timeout=timeout * 1000)


def run_all_cells(page: Any, lab: LabServer, notebook: str, timeout: float = 180.0) -> None:
    """Run every cell (the Run menu's "Run All Cells") and wait until the kernel is idle again."""
    page.click(".jp-Notebook .jp-Cell >> nth=0")  # focus the notebook panel
    page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")
    # the first prompt turns to [*] or a number once the run started; resend once if it was lost
    try:
        page.wait_for_function(
            "() => [...document.querySelectorAll('.jp-InputPrompt')].some(p => /\\[(\\*|\\d+)\\]/.test(p.textContent))",
            timeout=15000,
        )
    except Exception:  # noqa: BLE001 - playwright's TimeoutError: the command was lost, send it again
        page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")
    wait_until(
        lambda: (
            cell_errors(page)  # run-all stops at an error: no need to wait for the rest
            or page.evaluate(
                "() => [...document.querySelectorAll('.jp-CodeCell .jp-InputPrompt')]"
                ".every(p => /\\[\\d+\\]/.test(p.textContent))"
            )
        ),
        timeout,
        f"every cell of {notebook} to finish",
        interval=0.5,
    )
    wait_until(lambda: lab.kernel_state(notebook) == "idle", 30, "the kernel to be idle")


def cell_errors(page: Any) -> list[str]:
    """``ename: evalue`` of every error output in the open notebook's model."""
    return page.evaluate(
        """() => {
            const errors = [];
            const notebook = window.jupyterapp.shell.currentWidget.content;
            for (const cell of notebook.model.cells) {
                if (cell.type !== 'code') continue;
                for (let i = 0; i < cell.outputs.length; i++) {
                    const out = cell.outputs.get(i).toJSON();
                    if (out.output_type === 'error') errors.push(out.ename + ': ' + out.evalue);
                }
            }
            return errors;
        }"""
    )


def screenshot(page: Any, name: str, directory: str) -> str:
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"{name}.png")
    page.screenshot(path=path, full_page=False)
    return path


def run_cell(page: Any, index: int) -> None:
    """Start cell ``index`` of the open notebook (Shift+Enter on it) and return at once."""
    page.evaluate(
        """i => { const panel = window.jupyterapp.shell.currentWidget;
        panel.content.activeCellIndex = i;
        window.jupyterapp.commands.execute('notebook:run-cell'); }""",
        index,
    )


def cell_done(page: Any, index: int) -> bool:
    """True once cell ``index`` has run (its prompt holds a number, not ``*``)."""
    return bool(
        page.evaluate(
            """i => { const cell = window.jupyterapp.shell.currentWidget.content.widgets[i];
            return /\\[\\d+\\]/.test(cell.node.querySelector('.jp-InputPrompt').textContent); }""",
            index,
        )
    )


def cell_outputs(page: Any, index: int) -> list[dict[str, Any]]:
    """Cell ``index``'s outputs as nbformat JSON (from the notebook's model)."""
    return page.evaluate(
        """i => { const cell = window.jupyterapp.shell.currentWidget.content.widgets[i];
        const out = [];
        for (let j = 0; j < cell.model.outputs.length; j++) out.push(cell.model.outputs.get(j).toJSON());
        return out; }""",
        index,
    )


def outputs_text(outputs: list[dict[str, Any]]) -> str:
    """The text of nbformat outputs: streams, tracebacks and ``text/plain`` data, one after another."""

    def joined(value: Any, sep: str = "") -> str:
        return value if isinstance(value, str) else sep.join(value)

    parts = []
    for out in outputs:
        parts.append(joined(out.get("text", "")))
        parts.append(joined(out.get("traceback", []), "\n"))
        parts.append(joined(out.get("data", {}).get("text/plain", "")))
    return "\n".join(parts)
