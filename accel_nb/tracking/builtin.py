"""The trackers accel_nb ships: TensorBoard, MLflow, Weights & Biases and Comet (each an optional extra).

Example:
    accelerator = Accelerator(log_with="tensorboard", project_dir="runs")
    accelerator.init_trackers("mnist", config={"lr": 0.1})   # runs/mnist/events.out.tfevents...
"""

from __future__ import annotations

import json
import os
import time
import warnings
from pathlib import Path
from typing import Any

from ..environment import str_to_bool
from .base import GeneralTracker

# seconds: TensorBoard's files are flushed at most this often while logging (and at the end)
FLUSH_EVERY = 1.0

__all__ = ["CometMLTracker", "MLflowTracker", "TensorBoardTracker", "WandBTracker"]


class TensorBoardTracker(GeneralTracker):
    """Event files under ``<logging_dir>/<run_name>`` (torch's SummaryWriter; extra ``accel_nb[tensorboard]``).

    Numbers become scalars, strings text, and a dict of numbers one chart as in the reference
    (``add_scalars``: ``{"glue": {"accuracy": x}}`` is tag ``glue`` in the sub-run ``<run>/glue_accuracy``);
    ``step=None`` uses the number of earlier ``log`` calls.
    The config is stored as the run's hyper-parameters (TensorBoard's HParams tab). The files are
    flushed at most once a second while logging (a flush waits for the writer's thread) and when
    the run finishes.

        TensorBoardTracker("mnist", "runs", flush_secs=10)
    """

    name = "tensorboard"
    requires_logging_directory = True
    logs_dict_groups = True  # accelerator.log keeps a top-level dict as a dict for add_scalars

    def __init__(self, run_name: str, logging_dir: str | os.PathLike, **writer_kwargs: Any) -> None:
        self.run_name = run_name
        self.logging_dir = os.path.join(os.fspath(logging_dir), run_name)
        self.writer_kwargs = writer_kwargs
        self.writer: Any = None
        self._calls = 0
        self._flushed = 0.0

    @property
    def tracker(self) -> Any:
        return self.writer

    def start(self) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(self.logging_dir, **self.writer_kwargs)

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        from torch.utils.tensorboard.summary import hparams

        # the HParams summaries go into this run's own event file (add_hparams would open a new run)
        for summary in hparams(dict(values), {}):
            self.writer.file_writer.add_summary(summary)
        self.writer.flush()

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        step = self._calls if step is None else step
        self._calls += 1
        for key, value in values.items():
            if isinstance(value, str):
                self.writer.add_text(key, value, global_step=step, **kwargs)
            elif isinstance(value, dict):
                numbers = {k: v for k, v in value.items() if not isinstance(v, str)}
                if numbers:
                    self.writer.add_scalars(key, numbers, global_step=step, **kwargs)
                for (
                    sub,
                    text,
                ) in value.items():  # add_scalars takes numbers only: a string goes to the text tab
                    if isinstance(text, str):
                        self.writer.add_text(f"{key}/{sub}", text, global_step=step, **kwargs)
            else:
                self.writer.add_scalar(key, value, global_step=step, **kwargs)
        now = time.monotonic()
        if now - self._flushed >= FLUSH_EVERY:
            self._flushed = now
            self.writer.flush()

    def finish(self) -> None:
        if self.writer is not None:
            self.writer.close()


class MLflowTracker(GeneralTracker):
    """One MLflow run in experiment ``experiment_name`` (extra ``accel_nb[mlflow]``, the mlflow-skinny client).

    The reference's arguments, with its meanings: ``MLFLOW_EXPERIMENT_NAME``, ``MLFLOW_RUN_ID``,
    ``MLFLOW_TAGS`` (JSON) and ``MLFLOW_NESTED_RUN`` override ``experiment_name``, ``run_id``, ``tags``
    and ``nested_run``; ``run_name`` and ``description`` go to ``mlflow.start_run``. The Accelerator
    passes the project name as ``experiment_name``. The store is ``tracking_uri``, else
    ``$MLFLOW_TRACKING_URI``, else ``<logging_dir>/mlruns`` (a local file store, which recent MLflow only
    opens with ``MLFLOW_ALLOW_FILE_STORE=true``), else MLflow's own default. The config becomes the
    run's parameters (values longer than MLflow takes are dropped with a warning); numbers become
    metrics (strings are skipped: MLflow metrics are numbers).

        MLflowTracker("mnist", "runs", tags={"team": "vision"})
    """

    name = "mlflow"
    requires_logging_directory = False

    def __init__(
        self,
        experiment_name: str | None = None,
        logging_dir: str | os.PathLike | None = None,
        run_id: str | None = None,
        tags: dict[str, Any] | str | None = None,
        nested_run: bool | str | None = False,
        run_name: str | None = None,
        description: str | None = None,
        tracking_uri: str | None = None,
        **start_run_kwargs: Any,
    ) -> None:
        self.experiment_name = os.environ.get("MLFLOW_EXPERIMENT_NAME", experiment_name)
        self.run_id = os.environ.get("MLFLOW_RUN_ID", run_id)
        tags = os.environ.get("MLFLOW_TAGS", tags)
        self.tags = json.loads(tags) if isinstance(tags, str) else tags
        nested_run = os.environ.get("MLFLOW_NESTED_RUN", nested_run)
        self.nested_run = (
            str_to_bool(nested_run, to_bool=True) if isinstance(nested_run, str) else bool(nested_run)
        )
        self.run_name = run_name
        self.description = description
        self.logging_dir = logging_dir
        uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
        if uri is None and logging_dir is not None:
            uri = Path(logging_dir, "mlruns").resolve().as_uri()
        self.tracking_uri = uri
        self.start_run_kwargs = start_run_kwargs
        self.active_run: Any = None
        self._calls = 0

    @property
    def tracker(self) -> Any:
        return self.active_run

    def start(self) -> None:
        import mlflow
        from mlflow.exceptions import MlflowException

        if self.tracking_uri is not None:
            before = os.environ.get("MLFLOW_TRACKING_URI")
            mlflow.set_tracking_uri(self.tracking_uri)
            # mlflow also exports the store to the environment; put it back, so that the next run
            # (another project_dir, a subprocess) does not take this store for the user's choice
            if before is None:
                os.environ.pop("MLFLOW_TRACKING_URI", None)
            else:
                os.environ["MLFLOW_TRACKING_URI"] = before
        try:  # no experiment name: MLflow's active (or default) experiment
            experiment = mlflow.set_experiment(self.experiment_name) if self.experiment_name else None
        except MlflowException as exc:
            if "MLFLOW_ALLOW_FILE_STORE" not in str(exc):
                raise
            raise RuntimeError(
                f"MLflow refuses the local file store {mlflow.get_tracking_uri()}: set the environment variable "
                "MLFLOW_ALLOW_FILE_STORE=true, or give a database store with init_kwargs={'mlflow': "
                "{'tracking_uri': 'sqlite:///mlflow.db'}} (needs the full 'mlflow' package)"
            ) from exc
        options = {"run_id": self.run_id, "run_name": self.run_name, "nested": self.nested_run}
        options.update(tags=self.tags, description=self.description)
        options.update(self.start_run_kwargs)
        if experiment is not None:
            options["experiment_id"] = experiment.experiment_id
        self.active_run = mlflow.start_run(**options)

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        import mlflow
        from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH, MAX_PARAMS_TAGS_PER_BATCH

        kept = {k: v for k, v in values.items() if len(str(v)) <= MAX_PARAM_VAL_LENGTH}
        if len(kept) < len(values):
            dropped = ", ".join(k for k in values if k not in kept)
            warnings.warn(
                f"MLflow stores parameters of at most {MAX_PARAM_VAL_LENGTH} characters; not stored: {dropped}",
                UserWarning,
                stacklevel=2,
            )
        items = list(kept.items())
        for first in range(0, len(items), MAX_PARAMS_TAGS_PER_BATCH):
            batch = dict(items[first : first + MAX_PARAMS_TAGS_PER_BATCH])
            mlflow.log_params(batch, run_id=self.active_run.info.run_id)

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        import mlflow

        step = self._calls if step is None else step
        self._calls += 1
        numbers = {k: float(v) for k, v in values.items() if isinstance(v, (int, float))}
        if numbers:
            mlflow.log_metrics(numbers, step=step, run_id=self.active_run.info.run_id, **kwargs)

    def log_figure(self, figure: Any, artifact_file: str, **save_kwargs: Any) -> None:
        """Save a matplotlib/plotly ``figure`` as ``artifact_file`` in the run (``mlflow.log_figure``)."""
        import mlflow

        mlflow.log_figure(figure=figure, artifact_file=artifact_file, save_kwargs=save_kwargs or None)

    def log_artifact(self, local_path: str, artifact_path: str | None = None) -> None:
        """Copy the file ``local_path`` into the run's artifacts (under ``artifact_path``)."""
        import mlflow

        mlflow.log_artifact(local_path, artifact_path=artifact_path, run_id=self.active_run.info.run_id)

    def log_artifacts(self, local_dir: str, artifact_path: str | None = None) -> None:
        """Copy every file of ``local_dir`` into the run's artifacts (under ``artifact_path``)."""
        import mlflow

        mlflow.log_artifacts(local_dir, artifact_path=artifact_path, run_id=self.active_run.info.run_id)

    def finish(self) -> None:
        import mlflow

        if self.active_run is not None:
            mlflow.end_run()


class WandBTracker(GeneralTracker):
    """A Weights & Biases run in project ``run_name`` (extra ``accel_nb[wandb]``).

    ``init_kwargs={"wandb": {"mode": "offline"}}`` (or ``WANDB_MODE=offline``) keeps the run on
    disk under ``<logging_dir>/wandb``; other keys go to ``wandb.init``.

        WandBTracker("mnist", "runs", mode="offline", tags=["baseline"])
    """

    name = "wandb"

    def __init__(
        self, run_name: str, logging_dir: str | os.PathLike | None = None, **init_kwargs: Any
    ) -> None:
        self.run_name = run_name
        self.init_kwargs = init_kwargs
        if logging_dir is not None:
            os.makedirs(logging_dir, exist_ok=True)
            self.init_kwargs.setdefault("dir", os.fspath(logging_dir))
        self.run: Any = None

    @property
    def tracker(self) -> Any:
        return self.run

    def start(self) -> None:
        import wandb

        self.run = wandb.init(project=self.run_name, **self.init_kwargs)

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        self.run.config.update(values, allow_val_change=True)

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        self.run.log(values, step=step, **kwargs)

    def finish(self) -> None:
        if self.run is not None:
            self.run.finish()


class CometMLTracker(GeneralTracker):
    """A Comet experiment in project ``run_name`` (extra ``accel_nb[comet_ml]``): ``comet_ml.start``.

    Online it needs an API key (``COMET_API_KEY`` or Comet's config file). Offline
    (``init_kwargs={"comet_ml": {"online": False}}`` or ``COMET_START_ONLINE=false``) the
    experiment is a zip archive under ``<logging_dir>/comet`` (unless ``COMET_OFFLINE_DIRECTORY``
    or an ``experiment_config`` says where); ``comet upload <zip>`` sends it later. The config
    becomes the experiment's parameters; numbers become metrics, strings "others".

        CometMLTracker("mnist", "runs", online=False)
    """

    name = "comet_ml"

    def __init__(
        self, run_name: str, logging_dir: str | os.PathLike | None = None, **start_kwargs: Any
    ) -> None:
        self.run_name = run_name
        self.start_kwargs = start_kwargs
        self.offline_directory = None
        if logging_dir is not None and not os.environ.get("COMET_OFFLINE_DIRECTORY"):
            self.offline_directory = os.path.join(os.fspath(logging_dir), "comet")
        self.experiment: Any = None

    @property
    def tracker(self) -> Any:
        return self.experiment

    def start(self) -> None:
        import comet_ml

        kwargs = dict(self.start_kwargs)
        if self.offline_directory is not None and "experiment_config" not in kwargs:
            kwargs["experiment_config"] = comet_ml.ExperimentConfig(offline_directory=self.offline_directory)
        try:
            self.experiment = comet_ml.start(project_name=self.run_name, **kwargs)
        except ValueError as exc:
            if "API key" not in str(exc):
                raise
            raise ValueError(  # the type Comet (and so the reference) raises here
                "Comet needs an API key to log online: set COMET_API_KEY (or Comet's config file), or log "
                "offline with init_kwargs={'comet_ml': {'online': False}} (or COMET_START_ONLINE=false)"
            ) from exc

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        self.experiment.log_parameters(values)

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        if step is not None:
            self.experiment.set_step(step)
        for key, value in values.items():
            if isinstance(value, str):
                self.experiment.log_other(key, value, **kwargs)
            else:
                self.experiment.log_metric(key, value, step=step, **kwargs)

    def finish(self) -> None:
        if self.experiment is not None:
            self.experiment.end()
