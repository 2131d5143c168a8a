"""``GradientState``: the shared state of gradient accumulation (the reference's ``accelerate.state.GradientState``).

Whether this step syncs gradients, how many steps accumulate, and which data loader is active (its last
batch ends an accumulation window). Every instance shares one state, like ``PartialState``'s; the class
is imported from ``accel_nb.state`` too, the reference's path.

    gs = GradientState(gradient_accumulation_steps=4)
    GradientState().num_steps          # 4: the same state
"""

from __future__ import annotations

from typing import Any

from ..xla import runtime as xla_runtime

__all__ = ["GradientState"]


class GradientState:
    """Shared state of gradient accumulation: whether this step syncs, where the loader is."""

    _shared_state: dict[str, Any] = xla_runtime.StateStore()  # type: ignore[assignment]
    initialized: bool = False  # read through an instance whose shared state was reset: not initialized

    def __init__(
        self, gradient_accumulation_plugin: Any = None, gradient_accumulation_steps: int | None = None
    ) -> None:
        """``gradient_accumulation_plugin`` (the reference's argument, a ``GradientAccumulationPlugin``)
        sets the accumulation settings as there; ``gradient_accumulation_steps`` the number of steps."""
        self.__dict__ = self._shared_state
        if not self._shared_state.get("initialized"):
            self.sync_gradients = True
            self.num_steps = 1
            self.active_dataloader = None
            self.dataloader_references: list[Any] = [None]
            self.sync_with_dataloader = True
            self.sync_each_batch = False
            self.adjust_scheduler = False
            self.initialized = True
        plugin = gradient_accumulation_plugin
        if isinstance(plugin, int):  # accel_nb's earlier first argument: the number of steps
            plugin, gradient_accumulation_steps = None, plugin
        if plugin is not None:
            if plugin.num_steps is not None:
                self.num_steps = int(plugin.num_steps)
            self.adjust_scheduler = bool(plugin.adjust_scheduler)
            self.sync_with_dataloader = bool(plugin.sync_with_dataloader)
            self.sync_each_batch = bool(plugin.sync_each_batch)
        if gradient_accumulation_steps is not None:
            self.num_steps = int(gradient_accumulation_steps)

    @property
    def end_of_dataloader(self) -> bool:
        """True while the active data loader is yielding its last batch."""
        dl = self.active_dataloader
        return bool(dl is not None and getattr(dl, "end_of_dataloader", False))

    @property
    def in_dataloader(self) -> bool:
        return self.active_dataloader is not None

    @property
    def remainder(self) -> int:
        """The active data loader's ``remainder`` (samples of its short last round), -1 outside a loader."""
        dl = self.active_dataloader
        return -1 if dl is None else getattr(dl, "remainder", -1)

    def _set_sync_gradients(self, value: bool) -> None:
        self.sync_gradients = value

    def _add_dataloader(self, dataloader: Any) -> None:
        self.active_dataloader = dataloader
        self.dataloader_references.append(dataloader)

    def _remove_dataloader(self, dataloader: Any) -> None:
        if dataloader in self.dataloader_references:
            self.dataloader_references.remove(dataloader)
        self.active_dataloader = self.dataloader_references[-1] if self.dataloader_references else None

    @staticmethod
    def _reset_state() -> None:
        """Forget the accumulation and loader bookkeeping (the reference's private helper, same meaning)."""
        GradientState._shared_state.clear()
