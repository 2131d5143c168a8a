"""The reference library's ``DataLoaderStateMixin``: end-of-data and remainder bookkeeping for a custom loader.

    class MyLoader(DataLoaderStateMixin, DataLoader):
        def __iter__(self):
            self.begin()                 # registers with GradientState, sets remainder
            ...                          # set self.end_of_dataloader = True before the last batch
            self.end()

accel_nb's own loaders (``DataLoaderShard``, ``SkipDataLoader``, ``DataLoaderDispatcher``) are subclasses:
each of their passes starts with ``begin()`` and ends with ``end()``.
"""

from __future__ import annotations

import contextlib
from typing import Any

__all__ = ["DataLoaderStateMixin"]


class DataLoaderStateMixin:
    """Adds ``end_of_dataloader`` (False) and ``remainder`` (-1) to a loader class, and ``reset`` /
    ``begin`` / ``end`` that keep ``self.gradient_state`` (a ``GradientState`` the subclass creates)
    informed of the loader being iterated."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.end_of_dataloader = False
        cls.remainder = -1

    def reset(self) -> None:
        """Back to the start of a pass: not at the end, no remainder known."""
        self.end_of_dataloader = False
        self.remainder = -1

    def begin(self) -> None:
        """Start a pass: reset, compute the remainder (without ``drop_last``), register with the gradient state."""
        self.reset()
        with contextlib.suppress(Exception):  # a dataset without len(), a loader without total_batch_size
            if not self._drop_last:
                length = getattr(self.dataset, "total_dataset_length", len(self.dataset))
                self.remainder = length % self.total_batch_size
        self.gradient_state._add_dataloader(self)

    def end(self) -> None:
        """End a pass: unregister from the gradient state."""
        self.gradient_state._remove_dataloader(self)
