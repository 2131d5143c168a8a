"""The reference's tracker registry (LOGGER_TYPE_TO_CLASS, register_tracker_class), its MLflowTracker
arguments and its unshipped tracker names, side by side with the reference where it is installed."""

from __future__ import annotations

import os

import pytest

from accel_nb import Accelerator
from accel_nb.tracking import (
    LOGGER_TYPE_TO_CLASS,
    AimTracker,
    GeneralTracker,
    MLflowTracker,
    TensorBoardTracker,
    register_tracker_class,
)


class RunNameTracker(GeneralTracker):
    name = "run_name_tracker"
    requires_logging_directory = False

    def __init__(self, run_name, **kwargs):
        self.run_name, self.kwargs, self.rows, self.config = run_name, kwargs, [], None

    def store_init_configuration(self, values):
        self.config = dict(values)

    def log(self, values, step=None, **kwargs):
        self.rows.append((step, dict(values)))


class DirTracker(RunNameTracker):
    name = "dir_tracker"
    requires_logging_directory = True

    def __init__(self, run_name, logging_dir, **kwargs):
        super().__init__(run_name, **kwargs)
        self.logging_dir = logging_dir


@pytest.fixture
def registry():
    saved = dict(LOGGER_TYPE_TO_CLASS)
    yield LOGGER_TYPE_TO_CLASS
    LOGGER_TYPE_TO_CLASS.clear()
    LOGGER_TYPE_TO_CLASS.update(saved)


def test_the_table_has_the_references_names():
    accelerate_tracking = pytest.importorskip("accelerate.tracking")
    assert sorted(LOGGER_TYPE_TO_CLASS) == sorted(accelerate_tracking.LOGGER_TYPE_TO_CLASS)
    assert LOGGER_TYPE_TO_CLASS["tensorboard"] is TensorBoardTracker
    with pytest.raises(
        NotImplementedError, match="ships no aim tracker; wrap its client in a GeneralTracker"
    ):
        AimTracker("run")


def test_a_registered_class_is_made_by_name_with_the_references_arguments(registry, tmp_path):
    register_tracker_class(RunNameTracker)
    acc = Accelerator(cpu=True, log_with="run_name_tracker")
    acc.init_trackers("proj", config={"lr": 0.5}, init_kwargs={"run_name_tracker": {"colour": "red"}})
    acc.log({"loss": 1.0}, step=3)
    tracker = acc.get_tracker("run_name_tracker")
    acc.end_training()
    assert isinstance(tracker, RunNameTracker)
    assert (tracker.run_name, tracker.kwargs, tracker.config, tracker.rows) == (
        "proj",
        {"colour": "red"},
        {"lr": 0.5},
        [(3, {"loss": 1.0})],
    )

    register_tracker_class(DirTracker)
    with pytest.raises(
        ValueError, match="Logging with `dir_tracker` requires a `logging_dir` to be passed in"
    ):
        Accelerator(cpu=True, log_with="dir_tracker")
    acc = Accelerator(cpu=True, log_with="dir_tracker", project_dir=str(tmp_path))
    acc.init_trackers("proj")
    assert acc.get_tracker("dir_tracker").logging_dir == str(tmp_path)
    acc.end_training()


def test_register_refuses_what_the_reference_refuses_and_warns_on_a_second_class(registry):
    with pytest.raises(ValueError, match="takes a GeneralTracker subclass"):
        register_tracker_class(dict)

    class Nameless(GeneralTracker):
        requires_logging_directory = False

    class NoFlag(GeneralTracker):
        name = "no_flag"

    with pytest.raises(ValueError, match="non-empty class attribute name"):
        register_tracker_class(Nameless)
    with pytest.raises(ValueError, match="needs a class attribute requires_logging_directory"):
        register_tracker_class(NoFlag)
    register_tracker_class(RunNameTracker)

    class Shadow(RunNameTracker):
        pass

    with pytest.warns(UserWarning, match="'run_name_tracker' is already registered"):
        register_tracker_class(Shadow)
    assert LOGGER_TYPE_TO_CLASS["run_name_tracker"] is Shadow


def test_a_project_config_without_directories_takes_project_dir_for_the_logs(tmp_path):
    from accel_nb.utils import ProjectConfiguration

    acc = Accelerator(
        cpu=True,
        log_with="tensorboard",
        project_dir=str(tmp_path),
        project_config=ProjectConfiguration(total_limit=3),
    )
    assert acc.project_configuration.logging_dir == str(tmp_path)


@pytest.mark.parametrize("value, expected", [("off", False), ("0", False), ("yes", True), ("True", True)])
def test_mlflow_tracker_takes_the_references_arguments_and_environment(
    monkeypatch, tmp_path, value, expected
):
    monkeypatch.setenv("MLFLOW_NESTED_RUN", value)
    monkeypatch.setenv("MLFLOW_TAGS", '{"team": "t"}')
    tracker = MLflowTracker(experiment_name="exp", logging_dir=str(tmp_path), run_name="r1", description="d")
    assert tracker.nested_run is expected and tracker.tags == {"team": "t"}
    assert (tracker.experiment_name, tracker.run_name, tracker.description) == ("exp", "r1", "d")
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "from_env")
    assert MLflowTracker("arg").experiment_name == "from_env"  # the environment wins, as in the reference


def test_mlflow_run_gets_the_arguments_and_drops_overlong_parameters(monkeypatch, tmp_path):
    mlflow = pytest.importorskip("mlflow")
    from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    tracker = MLflowTracker("exp", str(tmp_path), tags={"team": "t"}, run_name="first", description="about")
    acc = Accelerator(cpu=True, log_with=tracker)
    acc.init_trackers("exp")
    values = {"lr": 0.1, "long": "x" * (MAX_PARAM_VAL_LENGTH + 1)}
    with pytest.warns(UserWarning, match="not stored: long"):
        tracker.store_init_configuration(values)
    assert "long" in values  # the caller's dict is left alone
    (tmp_path / "notes.txt").write_text("hello")
    tracker.log_artifact(str(tmp_path / "notes.txt"), artifact_path="docs")
    run_id = tracker.active_run.info.run_id
    acc.end_training()
    run = mlflow.tracking.MlflowClient((tmp_path / "mlruns").as_uri()).get_run(run_id)
    assert run.info.run_name == "first" and run.data.tags["team"] == "t"
    assert run.data.tags["mlflow.note.content"] == "about"
    assert run.data.params == {"lr": "0.1"}
    artifacts = mlflow.tracking.MlflowClient((tmp_path / "mlruns").as_uri()).list_artifacts(run_id, "docs")
    assert [a.path for a in artifacts] == ["docs/notes.txt"]
    assert os.environ.get("MLFLOW_TRACKING_URI") is None
