"""Experiment tracking from 2 processes: log once to TensorBoard (and MLflow, Comet where installed), read it back.

    python examples/tracking_demo.py                 # runs in a fresh temporary folder
    python examples/tracking_demo.py --out runs      # keep the runs: tensorboard --logdir runs

In a notebook the same launch also draws each rank's loss as live curves under the progress bars:
    from examples.tracking_demo import train; notebook_launcher(train, args=("runs", ["tensorboard"]), num_processes=2)
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import tempfile


def train(project_dir: str, log_with: list[str], epochs: int = 3) -> int:
    """A small data-parallel regression that logs its loss every step; returns the number of steps."""
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from accel_nb import Accelerator, progress

    accelerator = Accelerator(cpu=True, log_with=log_with, project_dir=project_dir)
    accelerator.init_trackers(
        "tracking_demo",
        config={"lr": 0.05, "epochs": epochs, "model": {"hidden": 32}},
        # Comet's offline mode: an archive under project_dir/comet, no account or network (docs/tracking.md)
        init_kwargs={"comet_ml": {"online": False}},
    )
    torch.manual_seed(0)
    x = torch.randn(512, 8)
    loader = DataLoader(TensorDataset(x, x @ torch.linspace(-1, 1, 8)), batch_size=32, shuffle=True)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    step = 0
    for _epoch in range(epochs):
        for xb, yb in progress(loader, desc="train"):
            loss = torch.nn.functional.mse_loss(model(xb).squeeze(-1), yb)
            optimizer.zero_grad()
            accelerator.backward(loss)
            optimizer.step()
            accelerator.log({"loss": loss}, step=step)  # written by process 0 only
            step += 1
    accelerator.end_training()
    return step


def read_back(project_dir: str, log_with: list[str]) -> list[str]:
    """One line per tracker: what its own reader finds in the run."""
    lines = []
    if "tensorboard" in log_with:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

        run = EventAccumulator(os.path.join(project_dir, "tracking_demo"))
        run.Reload()
        steps = [p.step for p in run.Scalars("loss")]
        lines.append(
            f"tensorboard: {len(steps)} loss points, steps {steps[0]}..{steps[-1]}, "
            f"each once: {len(set(steps)) == len(steps)}"
        )
    if "mlflow" in log_with:
        from pathlib import Path

        from mlflow.tracking import MlflowClient

        client = MlflowClient(Path(project_dir, "mlruns").resolve().as_uri())
        experiment = client.get_experiment_by_name("tracking_demo")
        (run,) = client.search_runs([experiment.experiment_id])
        history = client.get_metric_history(run.info.run_id, "loss")
        lines.append(f"mlflow: {len(history)} loss points, params {sorted(run.data.params)}")
    if "comet_ml" in log_with:
        import glob
        import json
        import zipfile

        (archive,) = glob.glob(os.path.join(project_dir, "comet", "*.zip"))
        with zipfile.ZipFile(archive) as z:
            messages = [json.loads(line) for line in z.read("messages.json").decode().splitlines() if line]
        metrics = [m["payload"]["metric"] for m in messages if m["type"] == "metric_msg"]
        params = [m["payload"]["param"]["paramName"] for m in messages if m["type"] == "parameter_msg"]
        losses = [m for m in metrics if m["metricName"] == "loss"]
        config = {"epochs", "lr", "model/hidden"} <= set(params)  # Comet adds its own (argparse's, curr_step)
        lines.append(f"comet_ml: {len(losses)} loss points, the config among its parameters: {config}")
    return lines


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="folder for the runs (default: a new temporary folder)")
    args = parser.parse_args(argv)
    project_dir = args.out or tempfile.mkdtemp(prefix="tracking_demo_")
    trackers = ("tensorboard", "mlflow", "comet_ml")
    log_with = [name for name in trackers if importlib.util.find_spec(name) is not None]
    if not log_with:
        print("install a tracker first: pip install 'accel_nb[tensorboard]'")
        return 1
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow's local file store, for this demo

    from accel_nb import notebook_launcher

    steps = notebook_launcher(train, args=(project_dir, log_with), num_processes=2)
    print(f"steps per rank: {steps}")
    for line in read_back(project_dir, log_with):
        print(line)
    print(f"runs in {project_dir}")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main(sys.argv[1:]))
