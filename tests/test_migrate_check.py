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
from accelerate.utils import add_model_config_to_megatron_parser, gather, helper_nobody_wrote
from accelerate.utils.fsdp_utils import save_fsdp_model
from accelerate.utils.operations import GatheredParameters
import accelerate.utils as au

accelerator = Accelerator(mixed_precision="fp8", torch_tp_plugin=None)
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
    findings, files, bad, *_ = check_path(script)
    assert files == [script] and bad == []
    assert _errors(findings) == [], [str(f) for f in findings]
    # the deliberate difference it touches is named, at the call (line 19, column 1), not the import
    notes = [str(f) for f in findings]
    assert any(
        n.startswith(f"{script}:19:1: note: `notebook_launcher`") and "LaunchError" in n for n in notes
    ), notes
    assert not any(n.startswith(f"{script}:2:") for n in notes), notes


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
    findings = check_path(script).findings
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
    findings = check_path(script).findings
    lines = [str(f) for f in _errors(findings)]

    def has(line, *words):
        return any(
            s.startswith(f"{script}:{line}:") and ": error:" in s and all(w in s for w in words)
            for s in lines
        )

    assert has(
        2,
        "`accelerate.utils.add_model_config_to_megatron_parser` is left out",
        "on purpose",
        LEFT_OUT["dataclasses.add_model_config_to_megatron_parser"],
    )
    assert has(2, "`helper_nobody_wrote` in `accel_nb.utils`", "has no")
    assert not any("gather`" in s for s in lines)  # gather exists
    assert has(3, "`accelerate.utils.fsdp_utils` is left out", LEFT_OUT["fsdp_utils"])
    assert has(4, "GatheredParameters", LEFT_OUT["operations.GatheredParameters"])
    # FP8 trains with torchao: a note (TransformerEngine / MS-AMP recipes are refused), not an error
    assert not has(7, "mixed_precision='fp8'")
    assert any(":7:" in str(f) and "mixed_precision='fp8'" in str(f) for f in findings)
    assert has(7, "torch_tp_plugin=", "does not take")
    assert has(8, "has no `frobnicate`")
    assert has(9, "Accelerator.prepare", "evaluation_mode=")
    assert has(10, "clean_result=False", "drop it")
    assert has(11, "accelerate.utils.not_there_either", "has no `not_there_either`")
    assert not any(s.startswith(f"{script}:12:") for s in lines)  # save_state passes safe_serialization on
    assert has(13, "Accelerator.load_state", "load_kwargs=", "does not take")
    assert len(lines) == 10, lines


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
    findings = check_path(script).findings
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
    assert [e.split(": error:")[0] for e in errors] == [f"{script}:3:24", f"{script}:6:7"], errors
    assert "not_a_keyword=" in errors[0] and "not_a_method" in errors[1]


def test_the_user_files_are_not_written_nor_run(tmp_path):
    marker = tmp_path / "ran"
    script = _write(
        tmp_path / "side_effect.py", f"open({str(marker)!r}, 'w').write('x')\nimport accelerate\n"
    )
    before = open(script, encoding="utf-8").read()
    findings = check_path(script).findings
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
    findings, files, bad, *_ = check_path(str(tmp_path / "proj"))
    assert bad == [] and len(files) == 3 and not any(f.endswith(".txt") for f in files)
    errors = [str(f) for f in _errors(findings)]
    assert len([e for e in errors if "gaps.py" in e]) == 10
    assert [e for e in errors if ".ipynb" in e] == [
        f"{notebook}:cell 3:line 2:col 1: error: `accelerate.utils.no_such_name`: accel_nb has no "
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
    assert f"{gaps}:8:13: error: accel_nb's Accelerator has no `frobnicate`" in done.stdout
    assert "10 error(s)" in done.stdout
    done = _cli("--check", str(tmp_path / "missing.py"))
    assert done.returncode == 2 and "no such file or folder" in done.stderr
    broken = _write(tmp_path / "broken.py", "from accelerate import (\n")
    done = _cli("--check", broken)
    assert done.returncode == 2 and "not valid Python" in done.stderr


@pytest.mark.parametrize("name", sorted(n for n in os.listdir(EXAMPLES) if n.endswith(".py")))
def test_the_reference_example_scripts_check_clean(name):
    findings, _, bad, *_ = check_path(os.path.join(EXAMPLES, name))
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
    findings, _, bad, *_ = check_path(script)
    assert bad == []
    flagged = {f.line for f in _errors(findings)}
    assert flagged == expected, (
        [lines[i - 1] for i in sorted(flagged - expected)],
        [lines[i - 1] for i in sorted(expected - flagged)],
    )
    assert len(lines) > 500, len(lines)


def test_left_out_names_at_the_top_level_and_whole_submodules_say_why(tmp_path):
    script = _write(
        tmp_path / "left_out.py",
        "from accelerate.utils import TorchTensorParallelPlugin\nfrom accelerate.utils import torch_xla\n"
        "import accelerate.utils.rich\nfrom accelerate.utils.launch import prepare_multi_gpu_env, prepare_tpu\n",
    )
    errors = [str(f) for f in _errors(check_path(script)[0])]
    assert errors == [
        f"{script}:1:1: error: `accelerate.utils.TorchTensorParallelPlugin` is left out of accel_nb on purpose: "
        + LEFT_OUT["dataclasses.TorchTensorParallelPlugin"],
        f"{script}:2:1: error: `accelerate.utils.torch_xla` is left out of accel_nb on purpose: "
        + LEFT_OUT["torch_xla"],
        f"{script}:3:1: error: `accelerate.utils.rich` is left out of accel_nb on purpose: "
        + LEFT_OUT["rich"],
        f"{script}:4:1: error: `accelerate.utils.launch.prepare_tpu` is left out of accel_nb on purpose: "
        + LEFT_OUT["launch.prepare_tpu"],
    ]


# -- issue 38, item 5: every binding that can hold an Accelerator, renamed files, places, differences ----

BINDINGS = {
    "conditional": """\
from accelerate import Accelerator
def main(args, d):
    accelerator = Accelerator(log_with="all", project_dir=d) if args.with_tracking else Accelerator()
    accelerator.prepare(1, not_a_keyword=1)
    accelerator.frobnicate()
""",
    "attribute": """\
from accelerate import Accelerator
class Trainer:
    def step(self):
        self.accelerator.prepare(1, not_a_keyword=1)
        self.accelerator.frobnicate()
    def __init__(self):
        self.accelerator = Accelerator()
""",
    "function_return": """\
import accelerate
def main():
    acc = make()
    acc.prepare(1, not_a_keyword=1)
    acc.frobnicate()
def make():
    accelerator = accelerate.Accelerator(cpu=True)
    return accelerator
""",
    "method_return": """\
from accelerate import Accelerator
class Runner:
    def build(self):
        return Accelerator()
    def run(self):
        acc = self.build()
        acc.prepare(1, not_a_keyword=1)
        acc.frobnicate()
""",
    "tuple_unpacking": """\
from accelerate import Accelerator
def main():
    (accelerator, other), n = (Accelerator(), 1), 2
    accelerator.prepare(1, not_a_keyword=1)
    accelerator.frobnicate()
""",
    "annotated": """\
from typing import Optional
from accelerate import Accelerator
def main(make):
    accelerator: "Optional[Accelerator]" = make()
    accelerator.prepare(1, not_a_keyword=1)
    accelerator.frobnicate()
""",
    "walrus": """\
from accelerate import Accelerator
def main():
    if (accelerator := Accelerator()) is not None:
        pass
    accelerator.prepare(1, not_a_keyword=1)
    accelerator.frobnicate()
""",
}


@pytest.mark.parametrize("form", sorted(BINDINGS))
def test_an_accelerator_is_followed_through_every_binding(tmp_path, form):
    text = BINDINGS[form]
    script = _write(tmp_path / f"{form}.py", text)
    errors = _errors(check_path(script).findings)
    lines = text.splitlines()
    prepare = next(i for i, line in enumerate(lines, 1) if "not_a_keyword" in line)
    assert [(e.line, e.column) for e in errors] == [
        (prepare, lines[prepare - 1].index("not_a_keyword") + 1),
        (prepare + 1, lines[prepare].index("frobnicate") + 1),
    ], [str(e) for e in errors]
    assert "not_a_keyword=" in errors[0].message and "has no `frobnicate`" in errors[1].message


def test_a_name_that_never_holds_an_accelerator_is_not_checked(tmp_path):
    script = _write(
        tmp_path / "other.py",
        "from accelerate import Accelerator\n"
        "a, b = 1, Accelerator()\n"
        "a.frobnicate()\n"
        "c = Accelerator if a else None\n"  # the class, not an instance
        "c.frobnicate()\n",
    )
    assert _errors(check_path(script).findings) == []


def test_a_renamed_file_is_checked_against_accel_nb(tmp_path):
    renamed = GAPS.replace("accelerate", "accel_nb")
    script = _write(tmp_path / "gaps" / "renamed.py", renamed)
    report = check_path(script)
    errors = [str(f) for f in _errors(report.findings)]
    assert report.unchecked == [] and report.renamed and len(errors) == 10, errors
    assert any(
        e.startswith(f"{script}:2:")
        and "`accel_nb.utils.add_model_config_to_megatron_parser` is left out" in e
        for e in errors
    )
    assert any(e.startswith(f"{script}:8:") and "has no `frobnicate`" in e for e in errors)
    done = _cli("--check", script)
    assert done.returncode == 1 and "10 error(s)" in done.stdout, done.stdout + done.stderr
    clean = _write(tmp_path / "clean" / "renamed.py", CLEAN.replace("accelerate", "accel_nb"))
    done = _cli("--check", clean)
    assert done.returncode == 0 and "Nothing blocks" in done.stdout, done.stdout + done.stderr
    assert "accel_nb names, keywords and methods used all exist" in done.stdout


def test_a_file_importing_neither_says_nothing_was_checked(tmp_path):
    plain = _write(tmp_path / "plain" / "train.py", "import torch\nmodel = torch.nn.Linear(2, 2)\n")
    done = _cli("--check", plain)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Nothing blocks" not in done.stdout and "nothing was checked" in done.stderr
    assert "imports neither accelerate nor accel_nb" in done.stderr
    _write(tmp_path / "plain" / "ok.py", CLEAN)  # a folder: the file that imports accelerate is checked
    done = _cli("--check", str(tmp_path / "plain"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "checked 1 file(s)" in done.stdout and "1 file(s) import neither" in done.stdout
    assert check_path(str(tmp_path / "plain")).unchecked == [plain]


PLACES = """\
from accelerate import Accelerator, notebook_launcher
from accelerate.utils import gather_object, reduce


def main():
    accelerator = Accelerator(
        gradient_accumulation_steps=2,
        torch_tp_plugin=None,
    )
    model = accelerator.prepare(
        object(),
        evaluation_mode=True,
    )
    accelerator.wait_for_everyone(); accelerator.frobnicate()
    total = reduce(model, "min")
    accelerator.end_training()


notebook_launcher(main, num_processes=2)
"""


def test_each_finding_carries_the_line_and_column_of_what_it_is_about(tmp_path):
    script = _write(tmp_path / "places.py", PLACES)
    found = {(f.line, f.column, f.severity): f for f in check_path(script).findings}
    expected = {
        (8, 9, "error"): "torch_tp_plugin=",  # the keyword, not the call's first line
        (12, 9, "error"): "evaluation_mode=",
        (14, 50, "error"): "has no `frobnicate`",  # the second call on the line
        (15, 27, "note"): "computes the real minimum",  # the positional argument
        (16, 17, "note"): "`Accelerator.end_training` differs",
        (19, 1, "note"): "`notebook_launcher` differs",  # the call, not the import of line 1
    }
    for place, words in expected.items():
        assert place in found and words in found[place].message, (place, [str(f) for f in found.values()])
        assert str(found[place]).startswith(f"{script}:{place[0]}:{place[1]}: {place[2]}: ")
    assert len(found) == len(expected), [str(f) for f in found.values()]
    # an imported name with a difference that is never used is noted at its import
    unused = _write(tmp_path / "unused.py", "from accelerate import notebook_launcher\n")
    assert [(f.line, f.column) for f in check_path(unused).findings] == [(1, 1)]


MAIN_ONLY = """\
from accelerate import Accelerator
accelerator = Accelerator()
if accelerator.is_main_process:
    accelerator.save_state("a")
if accelerator.is_local_main_process and True:
    accelerator.save_state("b")
if not accelerator.is_main_process:
    accelerator.save_state("fine: every process but the main one")
else:
    accelerator.save_state("c")
if accelerator.process_index == 0:
    accelerator.load_state("d")
@accelerator.on_main_process
def save():
    accelerator.save_state("e")
if accelerator.is_main_process:
    def later():
        accelerator.save_state("fine: runs where it is called")
accelerator.save_state("fine: every process")
if accelerator.is_main_process:
    accelerator.save_model(object(), "fine: not collective")
"""


def test_save_state_on_the_main_process_only_is_a_note_and_load_state_a_blocker(tmp_path):
    script = _write(tmp_path / "main_only.py", MAIN_ONLY)
    found = check_path(script).findings
    main_only = [f for f in found if "runs on the main process only" in f.message]
    assert [(f.line, f.column, f.severity) for f in main_only] == [
        (4, 17, "note"),
        (6, 17, "note"),
        (10, 17, "note"),
        (12, 17, "error"),
        (15, 17, "note"),
    ], [str(f) for f in main_only]
    assert "under the `if accelerator.is_main_process:` of line 3" in main_only[0].message
    assert "in the `else` of the `if not accelerator.is_main_process:` of line 7" in main_only[2].message
    assert (
        "`load_state(...)`" in main_only[3].message and "@accelerator.on_main_process" in main_only[4].message
    )
    for note in main_only[:3] + main_only[4:]:
        assert "writes the checkpoint alone" in note.message and "refused at once" in note.message
    assert "on every process" in main_only[3].message
    done = _cli("--check", script)
    assert done.returncode == 1 and "1 error(s)" in done.stdout, done.stdout + done.stderr


DIFFERING = """\
from accelerate import Accelerator
from accelerate.utils import TorchContextParallelConfig
accelerator = Accelerator(log_with="all", project_dir="runs", dynamo_backend="inductor")
plain = Accelerator(log_with="tensorboard")
accelerator.register_save_state_pre_hook(print)
accelerator.register_load_state_pre_hook(print)
if accelerator.device.index == 0 or str(accelerator.device) == "cpu:0":
    pass
accelerator.save_state(f"ckpt/{accelerator.process_index}")
accelerator.load_state(f"ckpt/{accelerator.local_process_index}")
accelerator.save_model(object(), "out", safe_serialization=False)
TorchContextParallelConfig(cp_comm_strategy="alltoall")
"""


def test_the_differences_a_call_shows_are_noted_where_they_are(tmp_path):
    script = _write(tmp_path / "differing.py", DIFFERING)
    found = [(f.line, f.column, f.severity, f.message) for f in check_path(script).findings]

    def has(line, column, severity, *words):
        return any(
            (f[0], f[1], f[2]) == (line, column, severity) and all(w in f[3] for w in words) for f in found
        )

    assert has(3, 27, "note", "Tracker files stay under `project_dir`")
    assert has(3, 63, "note", "dynamo_backend='inductor'", "inside the DDP wrapper")
    assert not any(f[0] == 4 for f in found)  # no project_dir: nothing moves
    assert has(5, 13, "note", "register_save_state_pre_hook", "Save pre-hooks get the folder being written")
    assert has(6, 13, "note", "register_load_state_pre_hook", "unwrap_model", "as in the reference")
    assert has(7, 23, "note", "`Accelerator.device`", "`cpu:0`")  # device.index
    assert has(7, 41, "note", "`Accelerator.device`")  # compared with "cpu:0"
    assert has(9, 24, "note", "A checkpoint is one folder, the main process's")
    assert has(10, 24, "error", "raises CheckpointError", "same folder on every rank")
    assert not any(f[0] == 11 for f in found)  # pickle files load back as in the reference (weights_only)
    assert has(12, 28, "note", "cp_comm_strategy='alltoall'", "allgather")
    assert [f for f in found if f[2] == "error"] == [f for f in found if f[0] == 10 and f[2] == "error"]
