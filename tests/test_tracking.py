"""Experiment tracking with real trackers writing to a temporary directory (no network).

Each test reads the run back with the tracker's own reader: TensorBoard's EventAccumulator,
MLflow's client, W&B's offline record file, Comet's offline archive.
"""

from __future__ import annotations

import argparse
import glob
import importlib.util
import json
import os
import re
import struct
import subprocess
import sys
import time
import warnings
import zipfile

import pytest
import torch

from accel_nb import Accelerator
from accel_nb.tracking import GeneralTracker, LoggerType, available_trackers, flatten_config

from .dist_helpers import run_ranks

pytestmark = pytest.mark.usefixtures("fresh_state")


class ListTracker(GeneralTracker):
    """A user's own tracker: keeps everything in lists."""

    name = "list"

    def __init__(self):
        self.config, self.rows, self.kwargs, self.events = None, [], [], []

    def start(self):
        self.events.append("start")

    def store_init_configuration(self, values):
        self.config = dict(values)

    def log(self, values, step=None, **kwargs):
        self.rows.append((step, dict(values)))
        self.kwargs.append(kwargs)

    def finish(self):
        self.events.append("finish")


def tensorboard_scalars(run_dir: str) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(run_dir, size_guidance={"scalars": 0})
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def tensorboard_hparams(run_dir: str) -> dict[str, object]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    events = EventAccumulator(run_dir)
    events.Reload()
    for content in events.PluginTagToContent("hparams").values():
        data = plugin_data_pb2.HParamsPluginData.FromString(content)
        if data.HasField("session_start_info"):
            hparams = data.session_start_info.hparams
            return {k: (v.string_value or v.number_value or v.bool_value) for k, v in hparams.items()}
    raise AssertionError(f"no hparams in {run_dir}")


CONFIG = {
    "lr": torch.tensor(0.25),
    "optim": {"name": "adam", "betas": (0.9, 0.99)},
    "max_steps": None,
    "weights": torch.ones(3),
}


def test_tensorboard_event_files_hold_the_scalars_and_config(tmp_path):
    acc = Accelerator(cpu=True, log_with="tensorboard", project_dir=str(tmp_path))
    with pytest.warns(UserWarning, match=r"dropped: weights \(Tensor\)"):
        acc.init_trackers("demo", config=CONFIG)
    for step in range(3):
        acc.log({"loss": torch.tensor(1.0 / (step + 1)), "eval": {"acc": 0.5 + step / 10}}, step=step)
    acc.log({"note": "text goes to the text tab"}, step=3)
    writer = acc.get_tracker("tensorboard", unwrap=True)
    assert type(writer).__name__ == "SummaryWriter"
    acc.end_training()

    scalars = tensorboard_scalars(str(tmp_path / "demo"))
    assert [s for s, _ in scalars["loss"]] == [0, 1, 2]
    assert [round(v, 4) for _, v in scalars["loss"]] == [1.0, 0.5, 0.3333]
    eval_acc = tensorboard_scalars(str(tmp_path / "demo" / "eval_acc"))[
        "eval"
    ]  # a dict: add_scalars' sub-run
    assert [round(v, 4) for _, v in eval_acc] == [0.5, 0.6, 0.7]
    hparams = tensorboard_hparams(str(tmp_path / "demo"))
    assert hparams["lr"] == pytest.approx(0.25)
    assert hparams["optim/name"] == "adam" and hparams["optim/betas"] == "[0.9, 0.99]"
    assert hparams["max_steps"] == "None" and "weights" not in hparams


def _tensorboard_runs(library, project_dir):
    """Each event folder under the run (relative path) with its scalar tags and values, after nested logs."""
    import importlib

    acc = importlib.import_module(library).Accelerator(
        cpu=True, log_with="tensorboard", project_dir=project_dir
    )
    acc.init_trackers("demo")
    for step in range(2):
        acc.log({"loss": 1.0 / (step + 1), "glue": {"accuracy": 0.5 + step / 10, "f1": 0.25}}, step=step)
    acc.end_training()
    runs = {}
    for folder, _, files in os.walk(os.path.join(project_dir, "demo")):
        if any(name.startswith("events.out.tfevents") for name in files):
            scalars = tensorboard_scalars(folder)
            rel = os.path.relpath(folder, project_dir)
            runs[rel] = {tag: [(s, round(v, 4)) for s, v in points] for tag, points in scalars.items()}
    return runs


def test_a_nested_dict_goes_to_tensorboard_as_the_reference_writes_it(tmp_path):
    # issue 38, item 20: {"glue": {"accuracy": x}} is TensorBoard's add_scalars in the reference: tag "glue" in
    # the sub-run demo/glue_accuracy (one chart for the dict); accel_nb wrote glue/accuracy in the main run,
    # so dashboards built on the reference's tags found nothing
    pytest.importorskip("accelerate")
    import accelerate.state

    try:
        theirs = _tensorboard_runs("accelerate", str(tmp_path / "theirs"))
    finally:
        accelerate.state.AcceleratorState._reset_state(reset_partial_state=True)
        accelerate.state.GradientState._reset_state()
    ours = _tensorboard_runs("accel_nb", str(tmp_path / "ours"))
    assert ours == theirs
    assert ours[os.path.join("demo", "glue_accuracy")] == {"glue": [(0, 0.5), (1, 0.6)]}
    assert ours["demo"] == {"loss": [(0, 1.0), (1, 0.5)]}


def test_mlflow_local_store_holds_metrics_and_params(tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    acc = Accelerator(cpu=True, log_with="mlflow", project_dir=str(tmp_path))
    with pytest.warns(UserWarning, match="weights"):
        acc.init_trackers("demo", config=CONFIG, init_kwargs={"mlflow": {"tags": {"team": "t"}}})
    for step in range(3):
        acc.log({"loss": 1.0 / (step + 1), "phase": "train"}, step=step)
    run_id = acc.get_tracker("mlflow", unwrap=True).info.run_id
    acc.end_training()

    client = MlflowClient((tmp_path / "mlruns").as_uri())
    history = client.get_metric_history(run_id, "loss")
    assert [(m.step, round(m.value, 4)) for m in history] == [(0, 1.0), (1, 0.5), (2, 0.3333)]
    run = client.get_run(run_id)
    assert run.data.params["optim/name"] == "adam" and float(run.data.params["lr"]) == 0.25
    assert "weights" not in run.data.params and run.data.tags["team"] == "t"
    assert run.info.status == "FINISHED"
    assert client.get_experiment(run.info.experiment_id).name == "demo"


def test_mlflow_runs_of_two_project_dirs_go_to_their_own_stores(tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    for name in ("a", "b"):
        acc = Accelerator(cpu=True, log_with="mlflow", project_dir=str(tmp_path / name))
        acc.init_trackers("demo")
        acc.log({"loss": 1.0}, step=0)
        acc.end_training()
    assert "MLFLOW_TRACKING_URI" not in os.environ  # the user's environment is left as it was
    for name in ("a", "b"):
        client = MlflowClient((tmp_path / name / "mlruns").as_uri())
        assert len(client.search_runs([client.get_experiment_by_name("demo").experiment_id])) == 1


def test_mlflow_refusing_the_file_store_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    acc = Accelerator(cpu=True, log_with="mlflow", project_dir=str(tmp_path))
    with pytest.raises(RuntimeError, match="MLFLOW_ALLOW_FILE_STORE=true"):
        acc.init_trackers("demo")


def wandb_records(run_dir: str) -> list[object]:
    """The records of an offline run's .wandb file (a LevelDB-style log of protobuf records)."""
    from wandb.proto import wandb_internal_pb2

    with open(glob.glob(os.path.join(run_dir, "*.wandb"))[0], "rb") as file:
        raw = file.read()
    block, pos, part, records = 32768, 7, b"", []
    while pos + 7 <= len(raw):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", raw[pos : pos + 7])
        if length == 0 and kind == 0:  # zero padding
            pos += left
            continue
        part += raw[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # a whole record, or the last piece of one
            records.append(wandb_internal_pb2.Record.FromString(part))
            part = b""
    return records


@pytest.mark.slow
def test_wandb_offline_run_holds_the_metrics(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    acc = Accelerator(cpu=True, log_with=LoggerType.WANDB, project_dir=str(tmp_path))
    with pytest.warns(UserWarning, match="weights"):
        acc.init_trackers("demo", config=CONFIG, init_kwargs={"wandb": {"mode": "offline"}})
    for step in range(3):
        acc.log({"loss": 1.0 / (step + 1)}, step=step)
    acc.end_training()

    (run_dir,) = glob.glob(str(tmp_path / "wandb" / "offline-run-*"))
    # wandb's service may still be writing the file when finish() returns: wait for its exit record
    deadline = time.monotonic() + 60
    while not any(r.WhichOneof("record_type") == "exit" for r in wandb_records(run_dir)):
        assert time.monotonic() < deadline, "the offline run never got its exit record"
        time.sleep(0.2)
    # wandb keeps its service process (wandb-core) for the life of this process; end it so later
    # tests that count this process's children find none
    import wandb

    wandb.teardown()
    history, config = [], {}
    for record in wandb_records(run_dir):
        kind = record.WhichOneof("record_type")
        if kind == "history":
            items = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item}
            history.append((items["_step"], items["loss"]))
        elif kind in ("run", "config"):
            updates = record.run.config.update if kind == "run" else record.config.update
            config.update({u.key: json.loads(u.value_json) for u in updates})
    assert [(s, round(v, 4)) for s, v in history] == [(0, 1.0), (1, 0.5), (2, 0.3333)]
    assert config["optim/name"] == "adam" and config["lr"] == pytest.approx(0.25)


# comet_ml patches the process that imports it (sys.excepthook, import hooks on torch and tensorboard, an
# error reporter's thread), so the Comet runs below happen in a Python of their own, never in pytest's
_COMET_OFFLINE_RUN = """
import sys, torch
from accel_nb import Accelerator
from accel_nb.tracking import LoggerType
acc = Accelerator(cpu=True, log_with=LoggerType.COMETML, project_dir=sys.argv[1])
acc.init_trackers(
    "demo", config={"lr": 0.25, "optim": {"name": "adam"}}, init_kwargs={"comet_ml": {"online": False}}
)
print("tracker:", type(acc.get_tracker("comet_ml", unwrap=True)).__name__)
for step in range(3):
    acc.log({"loss": torch.tensor(1.0 / (step + 1)), "phase": "warmup"}, step=step)
acc.end_training()
"""
_COMET_ONLINE_RUN = """
from accel_nb import Accelerator
acc = Accelerator(cpu=True, log_with="comet_ml")
try:
    acc.init_trackers("demo")
except ValueError as exc:  # the reference's type
    print("error:", exc)
"""


def _skip_without_comet() -> None:
    if importlib.util.find_spec("comet_ml") is None:  # found, not imported (see above)
        pytest.skip("comet_ml is not installed")


def _comet_run(code: str, tmp_path, **env: str) -> str:
    """Run ``code`` in a fresh Python (this tree's accel_nb, no Comet settings of the user); its stdout."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("COMET_")}
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)],
        env={**clean, "PYTHONPATH": root, "HOME": str(tmp_path), **env},  # HOME: no ~/.comet.config
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_comet_offline_archive_holds_the_metrics_config_and_text(tmp_path):
    _skip_without_comet()
    printed = _comet_run(_COMET_OFFLINE_RUN, tmp_path)
    assert "tracker: OfflineExperiment" in printed

    (archive,) = glob.glob(str(tmp_path / "comet" / "*.zip"))  # under project_dir, as W&B's offline runs
    with zipfile.ZipFile(archive) as z:
        assert json.loads(z.read("experiment.json"))["project_name"] == "demo"
        messages = [json.loads(line) for line in z.read("messages.json").decode().splitlines() if line]
    metrics = [m["payload"]["metric"] for m in messages if m["type"] == "metric_msg"]
    loss = [(m["step"], round(m["metricValue"], 4)) for m in metrics if m["metricName"] == "loss"]
    assert loss == [(0, 1.0), (1, 0.5), (2, 0.3333)]
    params = {
        m["payload"]["param"]["paramName"]: m["payload"]["param"]["paramValue"]
        for m in messages
        if m["type"] == "parameter_msg"
    }
    assert params["lr"] == 0.25 and params["optim/name"] == "adam"
    others = {m["payload"]["key"]: m["payload"]["value"] for m in messages if m["type"] == "log_other"}
    assert others["phase"] == "warmup"


def test_comet_online_without_an_api_key_says_how_to_log_offline(tmp_path):
    _skip_without_comet()
    printed = _comet_run(_COMET_ONLINE_RUN, tmp_path)
    assert re.search(r"error: .*COMET_API_KEY .* init_kwargs=\{'comet_ml': \{'online': False\}\}", printed), (
        printed
    )


def test_a_custom_tracker_gets_start_config_values_and_finish():
    mine = ListTracker()
    acc = Accelerator(cpu=True, log_with=[mine])
    acc.init_trackers("demo", config={"a": {"b": 1}})
    acc.log({"loss": torch.tensor(2.0)}, step=7, log_kwargs={"list": {"commit": False}})
    with pytest.warns(UserWarning, match=r"dropped values a tracker cannot take: big \(Tensor\)"):
        acc.log({"loss": 1.0, "big": torch.ones(2)})
    assert acc.get_tracker("list") is mine and acc.get_tracker("list", unwrap=True) is mine
    acc.end_training()
    assert mine.config == {"a/b": 1}
    assert mine.rows == [(7, {"loss": 2.0}), (None, {"loss": 1.0})]
    assert mine.kwargs == [{"commit": False}, {}]
    assert mine.events == ["start", "finish"]
    with pytest.raises(ValueError, match="log_kwargs has options for 'wandb', which is not in log_with"):
        acc.log({"loss": 1.0}, log_kwargs={"wandb": {}})
    with pytest.raises(ValueError, match=r"get_tracker\('tensorboard'\): no such tracker"):
        acc.get_tracker("tensorboard")


def test_a_tracker_without_log_or_name_is_refused_clearly():
    class NoName(GeneralTracker):
        def log(self, values, step=None, **kwargs):
            pass

    with pytest.raises(ValueError, match="NoName needs a class attribute name"):
        Accelerator(cpu=True, log_with=NoName())
    with pytest.raises(TypeError, match=r"pass an instance, ListTracker\(...\)"):
        Accelerator(cpu=True, log_with=ListTracker)

    class NoLog(GeneralTracker):
        name = "nolog"

    acc = Accelerator(cpu=True, log_with=NoLog())
    acc.init_trackers("demo")
    with pytest.raises(NotImplementedError, match="NoLog must implement log"):
        acc.log({"loss": 1.0})


def test_a_requested_tracker_that_is_not_installed_names_the_extra(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "mlflow", None)  # what an environment without mlflow looks like
    with pytest.raises(ImportError, match=r"pip install 'accel_nb\[mlflow\]'"):
        Accelerator(cpu=True, log_with="mlflow")
    assert "mlflow" not in available_trackers()
    acc = Accelerator(cpu=True, log_with="all", project_dir=str(tmp_path))
    assert "mlflow" not in acc.log_with and "tensorboard" in acc.log_with


def test_all_means_every_installed_tracker_and_names_are_checked(tmp_path):
    acc = Accelerator(cpu=True, log_with=["all", ListTracker()], project_dir=str(tmp_path))
    assert acc.log_with[:-1] == available_trackers() and acc.log_with[-1].name == "list"
    with pytest.raises(
        ValueError,
        match=r"Logging with `tensorboard` requires a `logging_dir` to be passed in: log_with='tensorboard' writes files, give Accelerator\(project_dir=...\)",
    ):
        Accelerator(cpu=True, log_with="tensorboard")
    with pytest.raises(ValueError, match="ships no aim tracker; wrap its client in a GeneralTracker"):
        Accelerator(cpu=True, log_with="aim")
    with pytest.raises(ValueError, match="ships no clearml tracker"):
        Accelerator(cpu=True, log_with=[LoggerType.CLEARML])
    with pytest.raises(ValueError, match="'tensorbord' names no tracker"):
        Accelerator(cpu=True, log_with="tensorbord")
    with pytest.raises(ValueError, match="init_kwargs has options for 'wandb'"):
        Accelerator(cpu=True, log_with="tensorboard", project_dir=str(tmp_path)).init_trackers(
            "demo", init_kwargs={"wandb": {}}
        )


def test_rerunning_init_trackers_finishes_the_previous_run():
    mine = ListTracker()
    acc = Accelerator(cpu=True, log_with=mine)
    acc.init_trackers("one")
    acc.init_trackers("two")
    assert mine.events == ["start", "finish", "start"]


def test_flatten_config_converts_and_reports():
    from dataclasses import dataclass

    @dataclass
    class Optim:
        lr: float = 0.1
        kind: str = "sgd"

    args = argparse.Namespace(seed=1, out=None)
    flat, dropped = flatten_config(
        {"optim": Optim(), "n": torch.tensor(3), "obj": object(), "ok": True, "args": args}
    )
    assert flat == {
        "optim/lr": 0.1,
        "optim/kind": "sgd",
        "n": 3,
        "ok": True,
        "args/seed": 1,
        "args/out": "None",
    }
    assert dropped == ["obj (object)"]
    with pytest.raises(TypeError, match="config must be a dict"):
        flatten_config([1, 2])


class EveryRankTracker(ListTracker):
    name = "every_rank"
    main_process_only = False


def _two_ranks_log(project_dir: str):
    from accel_nb.tracking.base import InactiveTracker

    mine, every = ListTracker(), EveryRankTracker()
    acc = Accelerator(cpu=True, log_with=["tensorboard", mine, every], project_dir=project_dir)
    acc.init_trackers("ddp", config={"world": acc.num_processes})
    for step in range(4):
        acc.log({"loss": float(step)}, step=step)
    writer = acc.get_tracker("tensorboard", unwrap=True)
    inactive = isinstance(writer, InactiveTracker)
    writer.add_scalar("extra", 1.0, 0)  # a no-op on rank 1
    names = [t.name for t in acc.trackers]
    acc.end_training()
    return acc.process_index, names, inactive, len(mine.rows), len(every.rows)


@pytest.mark.multiproc
def test_two_processes_log_each_step_exactly_once(tmp_path):
    results = run_ranks(_two_ranks_log, 2, args=(str(tmp_path),))
    assert results == [
        (0, ["tensorboard", "list", "every_rank"], False, 4, 4),
        (1, ["every_rank"], True, 0, 4),
    ]
    assert len(glob.glob(str(tmp_path / "ddp" / "events.out.tfevents.*"))) == 1
    scalars = tensorboard_scalars(str(tmp_path / "ddp"))
    assert scalars["loss"] == [(0, 0.0), (1, 1.0), (2, 2.0), (3, 3.0)]
    assert scalars["extra"] == [(0, 1.0)]
    assert tensorboard_hparams(str(tmp_path / "ddp"))["world"] == 2


def test_no_tracker_no_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        acc = Accelerator(cpu=True)
        acc.init_trackers("demo", config={"lr": 0.1})
        acc.log({"loss": 1.0})
        acc.end_training()
    assert acc.trackers == []


def test_without_a_step_the_calls_are_numbered(tmp_path):
    acc = Accelerator(cpu=True, log_with="tensorboard", project_dir=str(tmp_path))
    acc.init_trackers("nostep")
    for value in (3.0, 2.0, 1.0):
        acc.log({"loss": value})
    acc.end_training()
    assert tensorboard_scalars(str(tmp_path / "nostep"))["loss"] == [(0, 3.0), (1, 2.0), (2, 1.0)]


def test_all_with_nothing_installed_warns(monkeypatch):
    for module in ("tensorboard", "mlflow", "wandb", "comet_ml"):
        monkeypatch.setitem(sys.modules, module, None)
    with pytest.warns(
        UserWarning, match=r"found no tracker installed: pip install 'accel_nb\[tensorboard\]' \(or mlflow"
    ):
        acc = Accelerator(cpu=True, log_with="all")
    assert acc.log_with == []


@pytest.mark.multiproc
@pytest.mark.slow
def test_the_tracking_example_reads_its_runs_back(tmp_path):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {
        **os.environ,
        "ACCEL_NB_PROGRESS": "text",
        "OMP_NUM_THREADS": "1",
        "MLFLOW_ALLOW_FILE_STORE": "true",
    }
    done = subprocess.run(
        [sys.executable, os.path.join(root, "examples", "tracking_demo.py"), "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
        cwd=root,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "steps per rank: [24, 24]" in done.stdout
    assert "tensorboard: 24 loss points, steps 0..23, each once: True" in done.stdout
    assert "mlflow: 24 loss points, params ['epochs', 'lr', 'model/hidden']" in done.stdout
    if importlib.util.find_spec("comet_ml") is not None:  # the offline archive, read back from its zip
        assert "comet_ml: 24 loss points, the config among its parameters: True" in done.stdout


def test_log_or_get_tracker_before_init_trackers_says_so(tmp_path):
    import accel_nb.tracking as tracking

    tracking._warned.discard("log_before_init")
    acc = Accelerator(cpu=True, log_with="tensorboard", project_dir=str(tmp_path))
    with pytest.warns(
        UserWarning, match=r"log\(\) before init_trackers\(\): nothing goes to \['tensorboard'\]"
    ):
        acc.log({"loss": 1.0})
    with pytest.raises(ValueError, match=r"call accelerator.init_trackers\(project_name\) first"):
        acc.get_tracker("tensorboard")
