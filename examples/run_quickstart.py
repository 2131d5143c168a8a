"""Run notebooks/quickstart.ipynb headlessly in a real Jupyter kernel and export the result.

Writes the executed notebook and an HTML export to ``out/`` (or ``--out DIR``) and prints where
they are, plus the key results the notebook printed:

    .venv/bin/python examples/run_quickstart.py [--notebook notebooks/quickstart.ipynb] [--out out]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_NOTEBOOK = os.path.join(ROOT, "notebooks", "quickstart.ipynb")


def kernel_manager():
    """A kernel manager for an ipykernel running on this very interpreter (the project's venv)."""
    from jupyter_client import KernelManager
    from jupyter_client.kernelspec import KernelSpec

    km = KernelManager()
    km._kernel_spec = KernelSpec(  # noqa: SLF001 - the documented way to pin an interpreter
        # the kernel listens on 127.0.0.1 only; its "TCP without encryption" warning is noise here
        argv=[
            sys.executable,
            "-m",
            "ipykernel_launcher",
            "-f",
            "{connection_file}",
            "--IPKernelApp.log_level=ERROR",
        ],
        display_name="accel_nb",
        language="python",
    )
    return km


class NotebookFailed(RuntimeError):
    """A cell raised; ``notebook`` holds the notebook executed up to and including that cell."""

    def __init__(self, message: str, notebook) -> None:
        super().__init__(message)
        self.notebook = notebook


def execute_notebook(path: str, timeout: int = 600, cwd: str | None = None):
    """Execute ``path`` top to bottom; return the executed notebook (``NotebookFailed`` on the first error)."""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    nb = nbformat.read(path, as_version=4)
    env_cwd = cwd or os.path.dirname(os.path.abspath(path))
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    client = NotebookClient(
        nb,
        km=kernel_manager(),
        timeout=timeout,
        resources={"metadata": {"path": env_cwd}},
        store_widget_state=True,
    )
    try:
        client.execute()
    except CellExecutionError as exc:
        raise NotebookFailed(str(exc), nb) from exc
    return nb


WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def static_copy(nb):
    """A copy of ``nb`` whose widget outputs show their static form (text/HTML) instead of the widget.

    A widget view in an HTML export needs a widget manager fetched from a CDN at view time; the
    static form (the final progress summary, the device-map HTML) reads anywhere, offline too.
    """
    import copy

    nb = copy.deepcopy(nb)
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            data = out.get("data", {})
            if WIDGET_VIEW in data and len(data) > 1:
                del data[WIDGET_VIEW]
    nb.metadata.pop("widgets", None)
    return nb


def export_html(nb, path: str) -> str:
    from nbconvert import HTMLExporter

    body, _ = HTMLExporter().from_notebook_node(static_copy(nb))
    with open(path, "w", encoding="utf-8") as f:
        f.write(body)
    return path


def key_results(nb) -> list[str]:
    """The text the cells tagged ``key-result`` printed, line by line."""
    lines: list[str] = []
    for cell in nb.cells:
        if cell.cell_type != "code" or "key-result" not in cell.metadata.get("tags", []):
            continue
        for output in cell.get("outputs", []):
            if output.get("output_type") == "stream" and output.get("name") == "stdout":
                lines += [ln for ln in output["text"].splitlines() if ln.strip()]
    return lines


def run(notebook: str = DEFAULT_NOTEBOOK, out_dir: str = os.path.join(ROOT, "out")) -> dict[str, object]:
    """Execute, save and export one notebook; return the paths and the key results."""
    import nbformat

    os.makedirs(out_dir, exist_ok=True)
    stem = os.path.splitext(os.path.basename(notebook))[0]
    ipynb_path = os.path.join(out_dir, f"{stem}.ipynb")
    html_path = os.path.join(out_dir, f"{stem}.html")
    start = time.perf_counter()
    try:
        nb = execute_notebook(notebook)
    except NotebookFailed as exc:  # keep what ran: the failing cell shows its traceback there
        nbformat.write(exc.notebook, ipynb_path)
        export_html(exc.notebook, html_path)
        raise
    seconds = time.perf_counter() - start
    nbformat.write(nb, ipynb_path)
    export_html(nb, html_path)
    return {"notebook": ipynb_path, "html": html_path, "seconds": seconds, "results": key_results(nb)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--notebook", default=DEFAULT_NOTEBOOK)
    ap.add_argument("--out", default=os.path.join(ROOT, "out"))
    args = ap.parse_args(argv)
    print(f"executing {os.path.relpath(args.notebook, ROOT)} in a real Jupyter kernel ...", flush=True)
    try:
        summary = run(args.notebook, args.out)
    except NotebookFailed as exc:  # the message holds the failing cell and its traceback
        stem = os.path.splitext(os.path.basename(args.notebook))[0]
        print(f"the notebook failed: {exc}", file=sys.stderr)
        print(f"executed up to the failing cell: {os.path.join(args.out, stem + '.ipynb')}", file=sys.stderr)
        return 1
    except Exception as exc:  # the kernel did not start, the notebook is unreadable, ...
        print(f"could not run the notebook: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(f"done in {summary['seconds']:.1f} s\n\nkey results:")
    for line in summary["results"]:
        print("  " + line)
    print(f"\nexecuted notebook: {summary['notebook']}")
    print(f"HTML export:       {summary['html']}")
    print("open the notebooks interactively with: bash scripts/open_lab.sh")
    return 0


if __name__ == "__main__":
    sys.exit(main())
