"""The stack venv holds the runtime's versions, and installing ``accel_nb[notebook]`` there replaces none of them."""

from __future__ import annotations

import importlib.metadata as md
import json
import subprocess
import sys

import pytest

from tests.kernel_helpers import ROOT

# what each runtime ships (issue 26's table); the venv must hold exactly these
STACK_VERSIONS = {
    "colab": {
        "ipython": "7.34.0",
        "ipykernel": "6.17.1",
        "ipywidgets": "7.7.1",
        "notebook": "6.5.7",
        "jupyter_client": "7.4.9",
    },
    "kaggle": {"ipywidgets": "8.1.5"},
}
RUNTIME_PACKAGES = ("ipython", "ipykernel", "ipywidgets")


def test_the_venv_holds_the_runtimes_versions(stack):
    have = {name: md.version(name) for name in STACK_VERSIONS[stack]}
    assert have == STACK_VERSIONS[stack]
    if stack == "kaggle":
        assert md.version("ipykernel").startswith("6.29.") and md.version("jupyterlab").startswith("4.")


@pytest.mark.timeout(300)
def test_pip_would_replace_nothing_of_the_runtime_to_install_the_notebook_extra(tmp_path, stack):
    """pip's dry run of ``accel_nb[notebook]`` (this checkout) installs accel_nb only: no IPython, ipykernel, ipywidgets."""
    report = tmp_path / "report.json"
    # --no-build-isolation: the build backend already in the venv (no setuptools download to build accel_nb)
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--dry-run",
            "--no-build-isolation",
            "--quiet",
            "--report",
            str(report),
            f"{ROOT}[notebook]",
        ],
        capture_output=True,
        text=True,
        timeout=280,
        cwd=str(tmp_path),
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    would = {
        item["metadata"]["name"].lower().replace("_", "-"): item["metadata"]["version"]
        for item in json.loads(report.read_text())["install"]
    }
    replaced = {name: (md.version(name), would[name]) for name in RUNTIME_PACKAGES if name in would}
    assert replaced == {}, (
        f"installing accel_nb[notebook] would replace {replaced} (installed, would install)"
    )
    assert set(would) <= {"accel-nb"}, would  # and nothing else the runtime has either


def test_the_extras_lower_bounds_admit_the_runtime():
    """The bounds pyproject declares (what the dry run relies on), read from accel_nb's own metadata."""
    from packaging.requirements import Requirement

    extra = [Requirement(r) for r in md.requires("accel_nb") or [] if 'extra == "notebook"' in r]
    assert extra, md.requires("accel_nb")
    for req in extra:
        name = req.name.lower()
        if name in RUNTIME_PACKAGES:
            for runtime_version in {
                "ipython": ("7.34.0",),
                "ipykernel": ("6.17.1", "6.29.5"),
                "ipywidgets": ("7.7.1", "8.1.5"),
            }[name]:
                assert req.specifier.contains(runtime_version), (req, runtime_version)
