"""What the Accelerator frees and measures: ``free_memory`` / ``clear`` and ``profile()``.

Mixed into ``Accelerator``; each call has the reference library's name, arguments and meaning.

    model, optimizer = accelerator.free_memory(model, optimizer)
    with accelerator.profile() as prof: ...
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator
from typing import Any

import torch

__all__ = ["Resources"]


class Resources:
    """``free_memory`` (``clear``) and ``profile``."""

    _models: list[Any]
    _optimizers: list[Any]
    _schedulers: list[Any]
    _dataloaders: list[Any]
    _custom_objects: list[Any]
    profile_handler: Any = None

    def free_memory(self, *objects: Any) -> list[None]:
        """Drop every prepared object's reference here, collect garbage and empty the CUDA cache.

            model, optimizer = accelerator.free_memory(model, optimizer)

        Returns one None per object passed, so the caller's names let go of them too.
        """
        for prepared in (
            self._models,
            self._optimizers,
            self._schedulers,
            self._dataloaders,
            self._custom_objects,
        ):
            prepared.clear()
        self.step = 0
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        return [None] * len(objects)

    def clear(self, *objects: Any) -> list[None]:
        """The same as :meth:`free_memory`."""
        return self.free_memory(*objects)

    @contextlib.contextmanager
    def profile(self, profile_handler: Any = None) -> Iterator[Any]:
        """Profile the block with torch's profiler (settings from ``ProfileKwargs``); yields the profiler.

        With ``output_trace_dir`` set, each process writes ``profile_<process_index>.json`` (a
        Chrome trace) there at the end, then waits for the others.

            with accelerator.profile(ProfileKwargs(activities=["cpu"], output_trace_dir="traces")) as prof:
                train_step()
            accelerator.print(prof.key_averages().table(row_limit=10))
        """
        from ..kwargs_handlers import profile_context, read_kwargs_handlers

        handler = profile_handler or self.profile_handler
        if handler is not None:
            handler = read_kwargs_handlers([handler]).profile  # the reference's instances too
        with profile_context(handler, process_index=self.process_index) as prof:  # type: ignore[attr-defined]
            yield prof
        if handler is not None and handler.output_trace_dir:
            self.wait_for_everyone()  # type: ignore[attr-defined]
