"""Every notebook in notebooks/ runs top to bottom in a real kernel (nbclient) with no errors."""

from __future__ import annotations

import base64
import importlib.util
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOKS = os.path.join(ROOT, "notebooks")


def _load_runner():
    spec = importlib.util.spec_from_file_location(
        "run_quickstart", os.path.join(ROOT, "examples", "run_quickstart.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


runner = _load_runner()


def error_outputs(nb) -> list[str]:
    errors = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                errors.append(f"{out['ename']}: {out['evalue']}")
    return errors


def all_text(nb) -> str:
    """Everything the cells printed or displayed as text (stdout, stderr, text/plain, text/html)."""
    parts = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream":
                parts.append(out["text"])
            for mime in ("text/plain", "text/html"):
                if mime in out.get("data", {}):
                    parts.append(out["data"][mime])
    return "\n".join(parts)


def test_notebooks_match_their_generator():
    res = subprocess.run(
        [sys.executable, os.path.join(NOTEBOOKS, "_build_notebooks.py"), "--check"],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stdout + res.stderr


def test_every_notebook_is_covered_here():
    names = sorted(f for f in os.listdir(NOTEBOOKS) if f.endswith(".ipynb"))
    assert names == [
        "big_model_inference.ipynb",
        "config_wizard.ipynb",
        "deepspeed_zero3.ipynb",
        "fp8_training.ipynb",
        "interactive_session.ipynb",
        "megatron.ipynb",
        "parallelism.ipynb",
        "quickstart.ipynb",
        "tpu_kaggle_colab.ipynb",
    ]


def test_tpu_notebook_installs_per_platform_and_launches_on_every_core():
    """Its run needs torch_xla (tests/xla/test_xla_notebook.py runs it); here: what it tells each platform."""
    import nbformat

    nb = nbformat.read(os.path.join(NOTEBOOKS, "tpu_kaggle_colab.ipynb"), as_version=4)
    code = [c.source for c in nb.cells if c.cell_type == "code"]
    install = code[0]
    assert "KAGGLE_KERNEL_RUN_TYPE" in install and "%pip install -q accel_nb\n" in install
    assert (
        "COLAB_RELEASE_TAG" in install
        and "%pip install -q torch==2.9.0 'torch_xla[tpu]==2.9.0' accel_nb" in install
    )
    assert any(
        'os.environ.setdefault("PJRT_DEVICE", "CPU")' in c and "detect_tpu().detected" in c for c in code
    )
    assert any("results = notebook_launcher(train)" in c for c in code)
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code")


@pytest.mark.notebooks
def test_quickstart_runs_and_exports(tmp_path):
    summary = runner.run(os.path.join(NOTEBOOKS, "quickstart.ipynb"), str(tmp_path / "out"))
    assert os.path.exists(summary["notebook"]) and os.path.exists(summary["html"])
    import nbformat

    nb = nbformat.read(summary["notebook"], as_version=4)
    assert error_outputs(nb) == []
    results = "\n".join(summary["results"])
    assert "ranks: [0, 1]" in results
    assert "rank 0 of 2" in results and "rank 1 of 2" in results
    assert "caught: rank 1 failed with ValueError: boom on rank 1" in results
    assert (
        "steps on 2 processes" in results and "trained model (back in this notebook): Sequential" in results
    )
    # the per-epoch losses fell, and both ranks agree on them (they were all-reduced)
    lines = [ln for ln in summary["results"] if ln.startswith("rank ")]
    histories = [json.loads(ln.split("loss per epoch ", 1)[1]) for ln in lines]
    assert histories[0] == histories[1] and histories[0][-1] < histories[0][0]
    # TensorBoard's own reader found each of the 48 steps once (only process 0 wrote)
    assert "TensorBoard run: 48 loss points, steps 0..47, each once: True" in results
    # pictures: the tracked launch's final curves, and the matplotlib plot of what --return brought back
    pngs = [
        i
        for i, cell in enumerate(nb.cells)
        for out in cell.get("outputs", [])
        if "image/png" in out.get("data", {})
    ]
    plot_cell = next(i for i, cell in enumerate(nb.cells) if "ax.plot(history" in cell.source)
    tracked_cell = next(
        i for i, cell in enumerate(nb.cells) if "notebook_launcher(train_logged" in cell.source
    )
    assert plot_cell in pngs and tracked_cell in pngs, pngs
    # the tracked launch's cell prints each rank's last loss, not a bare [None, None]
    said = "".join(
        o.get("text", "") for o in nb.cells[tracked_cell].outputs if o.get("output_type") == "stream"
    )
    assert re.search(r"last loss of each rank: \[\d+\.\d+, \d+\.\d+\]", said), said
    assert "[None, None]" not in json.dumps(nb.cells[tracked_cell].outputs)
    # the live progress view left its final state in the saved notebook: the two training launches
    # end with every rank's bar full (48/48, green); the failing launch has one red bar
    state = (
        nb.metadata.get("widgets", {}).get("application/vnd.jupyter.widget-state+json", {}).get("state", {})
    )
    bars = [m["state"] for m in state.values() if m.get("model_name") == "IntProgressModel"]
    full = [
        b for b in bars if b.get("max") == 48 and b.get("value") == 48 and b.get("bar_style") == "success"
    ]
    assert len(full) == 4, bars
    assert sum(b.get("bar_style") == "danger" for b in bars) == 1, bars
    html = open(summary["html"], encoding="utf-8").read()
    assert "accel_nb quickstart" in html and "48 steps on 2 processes" in html
    # widgets appear in their static form: each launch's final per-rank summary
    assert "48/48" in html and "rank 1 failed" in html
    images = [base64.b64decode(m) for m in re.findall(r"data:image/png;base64,([A-Za-z0-9+/=]+)", html)]
    # the pictures are in the export
    assert len(images) >= 2 and all(i.startswith(b"\x89PNG") for i in images)


@pytest.mark.notebooks
def test_big_model_inference_runs():
    nb = runner.execute_notebook(os.path.join(NOTEBOOKS, "big_model_inference.ipynb"), timeout=600)
    assert error_outputs(nb) == []
    results = "\n".join(runner.key_results(nb))
    assert "parameter device: meta" in results
    assert "'cpu'" in results and "'disk'" in results  # the budgets sent blocks to the CPU and the disk
    assert "offloaded forward matches the in-memory model: True" in results
    assert "same tokens as the in-memory model: True" in results
    assert "cpu_offload: forward matches the in-memory model: True" in results
    assert "disk_offload: forward matches the in-memory model: True" in results
    # 7. quantized (torchao int8 on the CPU): fits a budget the float model does not
    assert "planned: torchao-int8: " in results
    assert "float32 with this budget: ['cpu', 'disk']" in results
    assert "int8 with this budget: ['cpu']" in results
    assert "x smaller)" in results
    assert "int8 logits close to float32 (under 5%): True" in results
    assert "same greedy tokens as float32: True" in results
    assert "planned: bnb-nf4: " in results  # bitsandbytes 4-bit on the CPU too
    assert "nf4 greedy tokens same as float32: True" in results
    assert "nf4 with a 500 KB CPU budget: ['cpu', 'disk']" in results  # 4-bit blocks offloaded to disk
    assert "nf4 offloaded to disk, logits equal to nf4 on the CPU: True" in results
    assert "nf4 offloaded to disk, same greedy tokens: True" in results


@pytest.mark.notebooks
def test_interactive_session_notebook_keeps_state_across_cells():
    nb = runner.execute_notebook(os.path.join(NOTEBOOKS, "interactive_session.ipynb"), timeout=600)
    errors = error_outputs(nb)
    # the tagged cell
    assert len(errors) == 1 and "rank 1 (first to fail) failed: ValueError" in errors[0], errors
    results = "\n".join(runner.key_results(nb))
    assert "(below 1.0: True)" in results
    assert "rank 1 computed scaled = 10.0" in results
    assert "worker processes left: 0" in results
    text = all_text(nb)
    # the rerun cell saw cell C's mse on both ranks
    assert "[rank 1] (1, " in text and "[rank 0] (0, " in text


@pytest.mark.notebooks
def test_config_wizard_notebook_saves_a_config():
    nb = runner.execute_notebook(os.path.join(NOTEBOOKS, "config_wizard.ipynb"), timeout=300)
    assert error_outputs(nb) == []
    results = "\n".join(runner.key_results(nb))
    assert "num_processes=2, mixed_precision=no" in results
    assert "num_processes: 2" in results  # the YAML file the Save wrote


@pytest.mark.notebooks
@pytest.mark.skipif(
    importlib.util.find_spec("deepspeed") is None,
    reason="deepspeed is not installed (DS_BUILD_OPS=0 pip install 'accel_nb[deepspeed]')",
)
def test_deepspeed_zero3_notebook_trains_and_saves_a_model_the_plain_model_loads():
    nb = runner.execute_notebook(os.path.join(NOTEBOOKS, "deepspeed_zero3.ipynb"), timeout=600)
    assert error_outputs(nb) == []
    results = "\n".join(runner.key_results(nb))
    assert "(went down: True)" in results
    # ZeRO-3 on 2 processes: each holds about half of the 321 parameter elements
    assert "rank 0 held 161 of 321" in results and "rank 1 held 161 of 321" in results
    assert "files: ['model.safetensors']" in results
    assert "the plain model computes what the trained engine computed: True; trained weights: True" in results
    text = all_text(nb)
    assert all(f"step {i}: loss" in text for i in range(8)) and "is deprecated" not in text


@pytest.mark.notebooks
def test_fp8_notebook_trains_every_parameter_within_3_percent_of_fp32():
    pytest.importorskip("torchao")
    nb = runner.execute_notebook(os.path.join(NOTEBOOKS, "fp8_training.ipynb"), timeout=600)
    assert error_outputs(nb) == []
    results = "\n".join(runner.key_results(nb))
    assert "layers: ['Linear', 'Float8Linear', 'Float8Linear', 'Linear']" in results
    assert "parameters trained: ['8 of 8', '8 of 8']" in results
    assert "(under 3%: True)" in results


@pytest.mark.notebooks
def test_parallelism_notebook_runs_tp_x_fsdp_and_the_pipeline_equal_to_one_process():
    nb = runner.execute_notebook(os.path.join(NOTEBOOKS, "parallelism.ipynb"), timeout=900)
    assert error_outputs(nb) == []
    results = "\n".join(runner.key_results(nb))
    assert "losses equal to the one-process run: True" in results
    # 4 ranks on a dp_shard=2 x tp=2 mesh, each holding about a quarter of the parameter bytes
    wheres = re.findall(r"rank (\d) at \{'dp_shard': (\d), 'tp': (\d)\} holds (\d+) of (\d+)", results)
    assert [w[:3] for w in wheres] == [("0", "0", "0"), ("1", "0", "1"), ("2", "1", "0"), ("3", "1", "1")], (
        results
    )
    assert all(int(held) < int(full) / 3 for *_, held, full in wheres), results
    assert (
        "pipeline logits equal to the whole model's: True" in results and "process 0 returned None" in results
    )
    assert "pipeline losses equal to the unsplit model's: True" in results
    assert "context parallel losses equal to the one-process run: True" in results
    assert "each process computed 16 and 16 of 32 tokens per sequence" in results
    # issue 41, item 5: none of the warnings that asked nothing of the user (FSDP2's view tensor on the
    # TP output, DTensor's two all_reduces at clipping, torchao's CUDA kernels on a CPU torch)
    text = all_text(nb)
    for noise in ("returned a view tensor", "sequential all_reduce", "Failed to load", "is an Enum subclass"):
        assert noise not in text, (noise, text[-3000:])


STANDINS_STARTUP = """\
import sys
import warnings

sys.path.insert(0, {root!r})
with warnings.catch_warnings():  # megatron-core warns at import that Apex and Transformer Engine are absent
    warnings.simplefilter("ignore", UserWarning)
    from tests import megatron_standins

    megatron_standins.install()
"""


@pytest.mark.notebooks
def test_megatron_notebook_gives_every_rank_the_one_process_losses(tmp_path, monkeypatch):
    """The notebook is written for GPUs; here its kernel runs an IPython startup file first (from a temporary
    IPYTHONDIR: the notebook is not touched) that installs tests/megatron_standins.py, and the launched ranks,
    forked from that kernel, inherit them."""
    pytest.importorskip("megatron.core")
    startup = tmp_path / "ipython" / "profile_default" / "startup"
    startup.mkdir(parents=True)
    (startup / "00-standins.py").write_text(STANDINS_STARTUP.format(root=ROOT))
    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))  # the kernel inherits this environment
    nb = runner.execute_notebook(os.path.join(NOTEBOOKS, "megatron.ipynb"), timeout=300)
    assert error_outputs(nb) == []
    code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    assert "standins" not in code and "require_gpu" not in code  # the notebook is the one a GPU user runs
    results = runner.key_results(nb)

    def losses(prefix):
        line = next(ln for ln in results if ln.startswith(prefix))
        return json.loads(line.split(":", 1)[1])

    one = losses("one process losses")
    assert len(one) == 12 and one[-1] < one[0] - 1.0, one  # it trains
    for rank in (0, 1):  # test_megatron's tolerance
        np.testing.assert_allclose(losses(f"rank {rank} losses"), one, rtol=2e-5, err_msg=f"rank {rank}")
    assert "every rank's losses equal to the one-process run: True" in results
    # tp=2: each rank holds a slice (the position embedding and the norms are whole on both)
    held = re.findall(r"rank (\d) holds (\d+) of (\d+) parameter elements", "\n".join(results))
    assert [r for r, *_ in held] == ["0", "1"] and all(int(h) < 0.6 * int(n) for _, h, n in held), held


@pytest.mark.notebooks
def test_run_quickstart_reports_a_failing_notebook(tmp_path):
    import nbformat
    from nbformat.v4 import new_code_cell, new_notebook

    bad = tmp_path / "bad.ipynb"
    nbformat.write(new_notebook(cells=[new_code_cell("print('before')"), new_code_cell("1 / 0")]), str(bad))
    res = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "examples", "run_quickstart.py"),
            "--notebook",
            str(bad),
            "--out",
            str(tmp_path / "out"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 1
    assert "the notebook failed" in res.stderr and "ZeroDivisionError" in res.stderr
    # what ran is kept, the failing cell with its traceback, so the user can look at it
    assert "executed up to the failing cell" in res.stderr
    kept = nbformat.read(str(tmp_path / "out" / "bad.ipynb"), as_version=4)
    assert kept.cells[0].outputs[0]["text"] == "before\n"
    assert kept.cells[1].outputs[0]["ename"] == "ZeroDivisionError"
    assert (tmp_path / "out" / "bad.html").exists()
