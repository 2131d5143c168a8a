"""What the processes say to each other and to the outside: collectives over the processes, metrics to the
launcher's display, and experiment trackers.

Mixed into ``Accelerator``; each call has the reference library's name, arguments and meaning.

    preds = accelerator.gather_for_metrics(logits.argmax(-1))
    accelerator.init_trackers("mnist", config={"lr": 0.1}); accelerator.log({"loss": loss}, step=step)
"""

from __future__ import annotations

from typing import Any

import torch

from .. import ops
from ..tracking import find_tracker, log_to_trackers, start_trackers

__all__ = ["Reporting"]


class Reporting:
    """``gather``/``gather_for_metrics``/``reduce``/``pad_across_processes``, ``log_metrics``/``log``,
    ``init_trackers``/``get_tracker``/``end_training`` of ``Accelerator``."""

    # -- collectives ---------------------------------------------------------------------------------
    def gather(self, tensor: Any) -> Any:
        """Concatenate ``tensor`` (or a nested structure of tensors) from every process along dim 0."""
        return ops.gather(tensor)

    def gather_for_metrics(self, input_data: Any, use_gather_object: bool = False) -> Any:
        """Gather predictions/labels for a metric, without the samples repeated to even out the last batch.

        preds, labels = accelerator.gather_for_metrics((logits.argmax(-1), labels))
        """
        return self.backend.gather_for_metrics(input_data, use_gather_object)  # type: ignore[attr-defined]

    def reduce(self, tensor: Any, reduction: str = "sum", scale: float = 1.0) -> Any:
        """Combine ``tensor`` over the processes: "sum" (default), "mean", "max", "min" or "product"."""
        return ops.reduce(tensor, reduction=reduction, scale=scale)

    def pad_across_processes(
        self, tensor: Any, dim: int = 0, pad_index: int = 0, pad_first: bool = False
    ) -> Any:
        """Pad ``tensor`` along ``dim`` to the largest size on any process (so it can be gathered)."""
        return ops.pad_across_processes(tensor, dim=dim, pad_index=pad_index, pad_first=pad_first)

    # -- logging -------------------------------------------------------------------------------------
    def log_metrics(self, values: dict[str, Any], step: int | None = None) -> bool:
        """Send scalar metrics to the launching notebook/terminal (a no-op outside a launch).

        accelerator.log_metrics({"loss": loss.item()}, step=step)
        """
        from ..events import Metrics, emit

        clean = {k: (v.item() if isinstance(v, torch.Tensor) else v) for k, v in values.items()}
        return emit(Metrics(rank=self.process_index, values=clean, step=step))

    def log(
        self, values: dict[str, Any], step: int | None = None, log_kwargs: dict[str, Any] | None = None
    ) -> bool:
        """Send ``values`` to the trackers (main process) and to the launcher's display (every process).

        ``log_kwargs`` maps a tracker name to extra arguments of its ``log`` call.

            accelerator.log({"loss": loss, "lr": scheduler.get_last_lr()[0]}, step=step)
        """
        clean = log_to_trackers(
            self.trackers, self.log_with, values, step, log_kwargs, self._tracking_started
        )
        return self.log_metrics({k: v for k, v in clean.items() if not isinstance(v, str)}, step=step)

    def init_trackers(
        self,
        project_name: str,
        config: dict[str, Any] | None = None,
        init_kwargs: dict[str, Any] | None = None,
    ) -> None:
        """Start a run named ``project_name`` in each ``log_with`` tracker and store ``config`` with it.

        Only the main process starts runs. Nested config dicts are flattened (``"optim/lr"``),
        one-element tensors become numbers, and what no tracker can store is dropped with a warning.
        ``init_kwargs`` maps a tracker name to arguments for its run (``{"wandb": {"mode": "offline"}}``).
        Calling it again (a rerun cell) finishes the previous runs first.

            accelerator.init_trackers("mnist", config={"lr": 0.1}, init_kwargs={"tensorboard": {"flush_secs": 5}})
        """
        for tracker in self.trackers:
            tracker.finish()
        self.trackers = []
        self.project_name = project_name
        self.tracker_config = config
        self.trackers = start_trackers(
            self.log_with,
            project_name,
            getattr(self.project_configuration, "logging_dir", None),
            config,
            init_kwargs,
            self.is_main_process,
        )
        self._tracking_started = True

    def get_tracker(self, name: str, unwrap: bool = False) -> Any:
        """The tracker called ``name`` (its run object with ``unwrap=True``); a do-nothing stand-in on other processes.

            writer = accelerator.get_tracker("tensorboard", unwrap=True)   # a SummaryWriter on process 0

        Ask for it after ``init_trackers``; the name is the tracker's (``"tensorboard"``, ``"wandb"``, …).
        """
        return find_tracker(self.trackers, self.log_with, name, unwrap, self._tracking_started)

    def end_training(self) -> None:
        """Finish every tracker's run (main process), then wait for every process."""
        trackers, self.trackers = self.trackers, []
        for tracker in trackers:
            tracker.finish()
        self.wait_for_everyone()
