"""``accel-nb migrate --check PATH``: real files written for accelerate, read (never run) and reported."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from accel_nb.commands.migrate import check_path
from accel_nb.commands.migrate_data import DIFFERENCES, LEFT_OUT

ROOT = os.path.join(os.path.dirname(__file__), "..")
EXAMPLES = os.path.join(ROOT, "examples", "from_accelerate")

CLEAN = """\
import torch
from accelerate import Accelerator, notebook_launcher
from accelerate.logging import get_logger
from accelerate.utils import DataLoaderConfiguration, set_seed
from accelerate.utils.operations import gather, send_to_device
from accelerate.utils.modeling import clean_device_map
import accelerate.utils as au

logger = get_logger(__name__)


def train():
    accelerator = Accelerator(gradient_accumulation_steps=2, dataloader_config=DataLoaderConfiguration())
    set_seed(0)
    model = accelerator.prepare(torch.nn.Linear(2, 2), device_placement=[True])
    accelerator.print(au.gather(send_to_device(torch.ones(1), accelerator.device)))


notebook_launcher(train, num_processes=2, mixed_precision="no")
"""

GAPS = """\
from accelerate import Accelerator, infer_auto_device_map
from accelerate.utils import FP8RecipeKwargs, gather, helper_nobody_wrote
from accelerate.utils.fsdp_utils import save_fsdp_model
from accelerate.utils.operations import GatheredParameters
import accelerate.utils as au

accelerator = Accelerator(mixed_precision="fp8", megatron_lm_plugin=None)
accelerator.frobnicate()
model = accelerator.prepare(object(), evaluation_mode=True)
infer_auto_device_map(model, clean_result=False)
au.not_there_either(1)
accelerator.save_state("ckpt", safe_serialization=False)
accelerator.load_state("ckpt", load_kwargs={"map_location": "cpu"})
"""


def _write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return str(path)


def _errors(findings):
    return [f for f in findings if f.severity == "error"]


def test_a_script_using_names_accel_nb_has_checks_clean(tmp_path):
    script = _write(tmp_path / "train.py", CLEAN)
    findings, files, bad = check_path(script)
    assert files == [script] and bad == []
    assert _errors(findings) == [], [str(f) for f in findings]
    # the deliberate difference it touches is named, at the import line
    notes = [str(f) for f in findings]
    assert any(
        n.startswith(f"{script}:2: note: `notebook_launcher`") and "LaunchError" in n for n in notes
    ), notes


GUARDED = """\
import os
if os.environ.get("TESTING_MOCKED_DATALOADERS", None) == "1":
    from accelerate.test_utils.training import mocked_dataloaders
try:
    from accelerate.utils import helper_nobody_wrote
except (ImportError, AttributeError):
    helper_nobody_wrote = None
try:
    from accelerate.utils import another_one_nobody_wrote
except KeyError:
    pass
from accelerate.utils import not_there_at_all
"""


def test_an_import_that_may_never_run_is_a_note_not_an_error(tmp_path):
    # the reference's own examples import accelerate.test_utils under an `if` (tests/test_reference_examples.py)
    script = _write(tmp_path / "guarded.py", GUARDED)
    findings, _, _ = check_path(script)
    by_line = {int(str(f).split(":")[1]): f for f in findings}
    assert by_line[3].severity == "note" and "inside the `if` of line 2" in by_line[3].message
    assert (
        by_line[5].severity == "note" and "the `try` of line 4 catches the ImportError" in by_line[5].message
    )
    assert by_line[9].severity == "error"  # `except KeyError` does not catch it
    assert by_line[12].severity == "error"
    assert len(findings) == 4, [str(f) for f in findings]


def test_a_script_with_gaps_reports_each_at_its_line(tmp_path):
    script = _write(tmp_path / "gaps.py", GAPS)
    findings, _, _ = check_path(script)
    lines = [str(f) for f in _errors(findings)]

    def has(line, *words):
        return any(s.startswith(f"{script}:{line}: error:") and all(w in s for w in words) for s in lines)

    assert has(
        2,
        "`accelerate.utils.FP8RecipeKwargs` is left out",
        "on purpose",
        LEFT_OUT["dataclasses.FP8RecipeKwargs"],
    )
    assert has(2, "`helper_nobody_wrote` in `accel_nb.utils`", "has no")
    assert not any("gather`" in s for s in lines)  # gather exists
    assert has(3, "`accelerate.utils.fsdp_utils` is left out", LEFT_OUT["fsdp_utils"])
    assert has(4, "GatheredParameters", LEFT_OUT["operations.GatheredParameters"])
    assert has(7, "mixed_precision='fp8'")
    assert has(7, "megatron_lm_plugin=", "does not take")
    assert has(8, "has no `frobnicate`")
    assert has(9, "Accelerator.prepare", "evaluation_mode=")
    assert has(10, "clean_result=False", "drop it")
    assert has(11, "accelerate.utils.not_there_either", "has no `not_there_either`")
    assert not any(s.startswith(f"{script}:12:") for s in lines)  # save_state passes safe_serialization on
    assert has(13, "Accelerator.load_state", "load_kwargs=", "does not take")
    assert len(lines) == 11, lines


def test_a_name_defined_again_by_the_script_is_its_own(tmp_path):
    script = _write(
        tmp_path / "own.py",
        "from accelerate.utils import gather, set_seed\n"
        "def gather(x, my_option=1):\n"
        "    return x\n"
        "gather(1, my_option=2)\n"
        "set_seed = print\n"
        "set_seed(1, sep='')\n",
    )
    findings, _, _ = check_path(script)
    assert findings == [], [str(f) for f in findings]


def test_an_accelerator_reached_through_an_annotation(tmp_path):
    script = _write(
        tmp_path / "annotated.py",
        "from accelerate import Accelerator\n"
        "def train(acc: Accelerator, other):\n"
        "    acc.prepare(other, not_a_keyword=1)\n"
        "    other.frobnicate()\n"
        "state: Accelerator = make()\n"
        "state.not_a_method()\n",
    )
    errors = [str(f) for f in _errors(check_path(script)[0])]
    assert [e.split(": error:")[0] for e in errors] == [f"{script}:3", f"{script}:6"], errors
    assert "not_a_keyword=" in errors[0] and "not_a_method" in errors[1]


def test_the_user_files_are_not_written_nor_run(tmp_path):
    marker = tmp_path / "ran"
    script = _write(
        tmp_path / "side_effect.py", f"open({str(marker)!r}, 'w').write('x')\nimport accelerate\n"
    )
    before = open(script, encoding="utf-8").read()
    findings, _, _ = check_path(script)
    assert findings == [] and not marker.exists()
    assert open(script, encoding="utf-8").read() == before


def test_a_folder_and_a_notebook(tmp_path):
    _write(tmp_path / "proj" / "ok.py", CLEAN)
    _write(tmp_path / "proj" / "pkg" / "gaps.py", GAPS)
    _write(tmp_path / "proj" / "notes.txt", "from accelerate import nothing_here\n")
    nb = {
        "cells": [
            {"cell_type": "markdown", "metadata": {}, "source": ["from accelerate import not_code\n"]},
            {"cell_type": "code", "metadata": {}, "source": ["%pip install accelerate\n", "import torch\n"]},
            {
                "cell_type": "code",
                "metadata": {},
                "source": [
                    "!nvidia-smi\n",
                    "from accelerate.utils import set_seed, offload_weight, no_such_name\n",
                ],
            },
        ],
        "metadata": {},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    notebook = _write(tmp_path / "proj" / "nb" / "train.ipynb", json.dumps(nb))
    findings, files, bad = check_path(str(tmp_path / "proj"))
    assert bad == [] and len(files) == 3 and not any(f.endswith(".txt") for f in files)
    errors = [str(f) for f in _errors(findings)]
    assert len([e for e in errors if "gaps.py" in e]) == 11
    assert [e for e in errors if ".ipynb" in e] == [
        f"{notebook}:cell 3:line 2: error: `accelerate.utils.no_such_name`: accel_nb has no "
        "`no_such_name` in `accel_nb.utils` (not provided yet; see docs/migration.md)"
    ]
    assert not any("ok.py" in e for e in errors)


def _cli(*args):
    env = dict(os.environ, PYTHONPATH=os.path.abspath(ROOT))
    return subprocess.run(
        [sys.executable, "-m", "accel_nb.commands", "migrate", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )


def test_the_cli_exit_codes(tmp_path):
    clean = _write(tmp_path / "clean" / "train.py", CLEAN)
    gaps = _write(tmp_path / "gaps" / "train.py", GAPS)
    done = _cli("--check", clean)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 error(s)" in done.stdout and "Nothing blocks" in done.stdout
    done = _cli("--check", str(tmp_path / "gaps"))
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"{gaps}:8: error: accel_nb's Accelerator has no `frobnicate`" in done.stdout
    assert "11 error(s)" in done.stdout
    done = _cli("--check", str(tmp_path / "missing.py"))
    assert done.returncode == 2 and "no such file or folder" in done.stderr
    broken = _write(tmp_path / "broken.py", "from accelerate import (\n")
    done = _cli("--check", broken)
    assert done.returncode == 2 and "not valid Python" in done.stderr


@pytest.mark.parametrize("name", sorted(n for n in os.listdir(EXAMPLES) if n.endswith(".py")))
def test_the_reference_example_scripts_check_clean(name):
    findings, _, bad = check_path(os.path.join(EXAMPLES, name))
    assert bad == [] and _errors(findings) == [], [str(f) for f in findings]


def test_every_difference_names_a_passage_of_the_migration_docs():
    text = open(os.path.join(ROOT, "docs", "migration.md"), encoding="utf-8").read()
    absent = [d.anchor for d in DIFFERENCES if d.anchor not in text]
    assert not absent, f"docs/migration.md has no passage {absent}"


def test_what_it_reports_missing_is_exactly_what_fails_to_import_after_the_rename(tmp_path):
    """Every public name of the installed reference's top level and utils submodules, imported from its
    path in one script: the checker flags exactly the imports that really fail under accel_nb."""
    pytest.importorskip("accelerate")
    import importlib
    import pkgutil
    import types

    import accelerate.utils

    modules = ["accelerate", "accelerate.utils"] + [
        f"accelerate.utils.{m.name}" for m in pkgutil.iter_modules(accelerate.utils.__path__)
    ]
    lines, expected = [], set()
    for module_name in modules:
        try:
            module = importlib.import_module(module_name)
        except ImportError:  # an optional dependency of the reference
            continue
        if module_name in ("accelerate", "accelerate.utils"):  # what the packages re-export
            names = [n for n in dir(module) if not n.startswith("_")]
        else:  # what each submodule defines
            names = [
                n
                for n, v in vars(module).items()
                if not n.startswith("_") and callable(v) and getattr(v, "__module__", None) == module.__name__
            ]
        for name in sorted(set(names)):
            if isinstance(getattr(module, name, None), types.ModuleType):
                continue
            lines.append(f"from {module_name} import {name}")
            ours = module_name.replace("accelerate", "accel_nb", 1)
            try:
                ok = hasattr(importlib.import_module(ours), name)
            except ImportError:
                ok = False
            if not ok:
                expected.add(len(lines))
    script = _write(tmp_path / "everything.py", "\n".join(lines) + "\n")
    findings, _, bad = check_path(script)
    assert bad == []
    flagged = {int(f.where.rsplit(":", 1)[1]) for f in _errors(findings)}
    assert flagged == expected, (
        [lines[i - 1] for i in sorted(flagged - expected)],
        [lines[i - 1] for i in sorted(expected - flagged)],
    )
    assert len(lines) > 500, len(lines)


def test_left_out_names_at_the_top_level_and_whole_submodules_say_why(tmp_path):
    script = _write(
        tmp_path / "left_out.py",
        "from accelerate.utils import TorchTensorParallelPlugin\nfrom accelerate.utils import transformer_engine\n"
        "import accelerate.utils.ao\nfrom accelerate.utils.launch import prepare_multi_gpu_env, prepare_tpu\n",
    )
    errors = [str(f) for f in _errors(check_path(script)[0])]
    assert errors == [
        f"{script}:1: error: `accelerate.utils.TorchTensorParallelPlugin` is left out of accel_nb on purpose: "
        + LEFT_OUT["dataclasses.TorchTensorParallelPlugin"],
        f"{script}:2: error: `accelerate.utils.transformer_engine` is left out of accel_nb on purpose: "
        + LEFT_OUT["transformer_engine"],
        f"{script}:3: error: `accelerate.utils.ao` is left out of accel_nb on purpose: " + LEFT_OUT["ao"],
        f"{script}:4: error: `accelerate.utils.launch.prepare_tpu` is left out of accel_nb on purpose: "
        + LEFT_OUT["launch.prepare_tpu"],
    ]
