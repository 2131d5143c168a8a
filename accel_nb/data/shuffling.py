"""How a prepared loader shuffles: the user's sampler and generator, kept in step across processes.

By default (``use_seedable_sampler=False``, as in the reference library) the loader's
``RandomSampler`` keeps its own ``torch.Generator``: the user's when the DataLoader got
``generator=``, or (with several processes) one seeded from torch's RNG when it had none. That
generator is copied from process 0 at the start of every pass, so every rank draws the same
permutation and takes its own batches of it: two processes see exactly the batches that one
process with the doubled batch size sees, in plain PyTorch's order.

``use_seedable_sampler=True`` (or a ``data_seed``) swaps the RandomSampler for a
``SeedableRandomSampler`` whose order is a pure function of ``(seed, epoch)``.

To resume mid-epoch, :class:`PassShuffle` remembers what the current pass's permutation was drawn
from: the generator's state at the start of the pass, or (a RandomSampler without generator, one
process) the seed it drew from torch's RNG, so a resumed pass draws the same permutation again.

    sampler = resolve_sampler(batch_sampler.sampler, seed=None, seedable=False)
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import RandomSampler

from ..ops import broadcast_object_list
from .samplers import SeedableRandomSampler

__all__ = ["resolve_sampler", "random_sampler", "give_generator", "shared_seed", "PassShuffle"]


def resolve_sampler(sampler: Any, seed: int | None, seedable: bool) -> Any:
    """``sampler``, or a SeedableRandomSampler in its place when ``seedable`` and it is a RandomSampler.

    Its seed is ``seed`` (``data_seed``), else process 0's ``torch.initial_seed()`` (what
    ``set_seed`` set), as in the reference library, which reads each process's own.
    """
    if seedable and type(sampler) is RandomSampler:
        if seed is None:
            seed = shared_seed()
        return SeedableRandomSampler(
            sampler.data_source, seed=seed, replacement=sampler.replacement, num_samples=sampler._num_samples
        )
    return sampler


def random_sampler(batch_sampler: Any) -> RandomSampler | None:
    """The RandomSampler (not a seedable one) that orders the samples of ``batch_sampler``, if any."""
    inner = batch_sampler
    while inner is not None:
        if isinstance(inner, RandomSampler):
            return None if isinstance(inner, SeedableRandomSampler) else inner
        nxt = getattr(inner, "batch_sampler", None)
        if nxt is None:
            nxt = getattr(inner, "sampler", None)
        inner = None if nxt is inner else nxt
    return None


def give_generator(sampler: RandomSampler | None) -> torch.Generator | None:
    """``sampler``'s generator, made (seeded with one draw from torch's RNG) when it has none."""
    if sampler is None:
        return None
    if sampler.generator is None:
        sampler.generator = torch.Generator()
        sampler.generator.manual_seed(int(torch.empty((), dtype=torch.int64).random_().item()))
    return sampler.generator


def shared_seed() -> int:
    """Process 0's ``torch.initial_seed()``, sent to every process (no random number is drawn)."""
    return int(broadcast_object_list([torch.initial_seed()], from_process=0)[0])


def _nth_draw(rng_state: torch.Tensor, n: int) -> int:
    """The ``n``-th int64 that torch's RNG would draw from ``rng_state`` (1-based), without drawing it."""
    gen = torch.Generator()
    gen.set_state(rng_state)
    value = 0
    for _ in range(n):
        value = int(torch.empty((), dtype=torch.int64).random_(generator=gen).item())
    return value


class PassShuffle:
    """What the permutation of the pass in progress is drawn from, to draw it again on resume.

    ``begin(sampler, loader_generator, new_iterator)`` runs at the start of a pass, before the
    DataLoader iterator exists; ``saved()`` is the loader's ``state_dict()`` entry;
    ``restore(entry, sampler)`` puts it back for a resumed pass (``loader_generator_hidden``
    then keeps the iterator's base seed from drawing on the shuffle's generator when the
    interrupted pass did not), and ``end(sampler)`` undoes a temporary generator.
    """

    def __init__(self) -> None:
        self._record: tuple[str, Any] | None = None
        self._temporary = False  # the sampler got a generator for this resumed pass only
        self._hide_loader_generator = False
        self._no_base_seed = False  # resumed between passes: the saved run's next pass drew no base seed

    def begin(
        self,
        sampler: RandomSampler | None,
        loader_generator: torch.Generator | None,
        new_iterator: bool = True,
    ) -> None:
        new_iterator = new_iterator and not self._no_base_seed
        if sampler is None:
            self._record = None
        elif self._temporary:
            pass  # a resumed pass: its seed is already recorded
        elif sampler.generator is not None:
            # a new iterator first draws its base seed from the loader's generator (perhaps this one);
            # persistent workers keep their iterator, and draw none
            drawn = new_iterator and not self._hide_loader_generator
            self._record = ("generator_state", (sampler.generator.get_state(), drawn))
        else:
            # RandomSampler draws its seed from torch's RNG on its first item, right after a new
            # iterator drew its base seed (from the same RNG when the loader has no generator;
            # persistent workers keep their iterator, and its base seed, from pass to pass)
            base_seed_draws = 1 if loader_generator is None and new_iterator else 0
            self._record = ("global_rng", (torch.get_rng_state(), base_seed_draws + 1))

    def saved(self) -> dict[str, Any] | None:
        if self._record is None:
            return None
        kind, value = self._record
        if kind == "global_rng":
            return {"seed": _nth_draw(*value)}
        if kind == "seed":
            return {"seed": value}
        return {"generator_state": value[0], "base_seed_drawn": value[1]}

    @staticmethod
    def between_passes(sampler: RandomSampler | None, next_iterator_new: bool) -> dict[str, Any]:
        """Between passes (a save at an epoch's end): what the next pass will draw from.

        That is the shuffle generator's current state (it moves on with every pass, and a fresh
        loader's starts where the first pass did: without it a loader resumed at an epoch's end
        would replay the first epoch's order), and whether the next pass draws an iterator base
        seed (not with persistent workers that keep their iterator; a resumed loader's first
        iterator is new and must then not draw). A sampler without generator draws from torch's
        RNG, which the checkpoint restores.
        """
        entry: dict[str, Any] = {"base_seed_drawn": bool(next_iterator_new)}
        if sampler is not None and sampler.generator is not None:
            entry["generator_state"] = sampler.generator.get_state()
        return entry

    def restore_between_passes(self, entry: dict[str, Any] | None, sampler: RandomSampler | None) -> None:
        """Put back what :meth:`between_passes` saved, for the next pass."""
        if not entry:
            return
        if sampler is not None and sampler.generator is not None and "generator_state" in entry:
            sampler.generator.set_state(entry["generator_state"])
        self._no_base_seed = not entry.get("base_seed_drawn", True)
        self._hide_loader_generator = self._no_base_seed

    @property
    def keeps_rng_on_new_iterator(self) -> bool:
        """True when the next pass's new iterator must draw no base seed (the saved run's did not)."""
        return self._no_base_seed

    def restore(self, entry: dict[str, Any] | None, sampler: RandomSampler | None) -> None:
        if not entry or sampler is None:
            return
        if "generator_state" in entry and sampler.generator is not None:
            sampler.generator.set_state(entry["generator_state"])
            self._hide_loader_generator = not entry.get("base_seed_drawn", True)
        elif "seed" in entry and sampler.generator is None:
            sampler.generator = torch.Generator()
            sampler.generator.manual_seed(int(entry["seed"]))
            self._temporary = True
            self._record = ("seed", int(entry["seed"]))

    @contextlib.contextmanager
    def loader_generator_hidden(self, loader: Any) -> Iterator[None]:
        """Within: ``loader.generator`` is a throwaway when the resumed pass must not draw from it."""
        if not self._hide_loader_generator:
            yield
            return
        kept, loader.generator = loader.generator, torch.Generator()
        try:
            yield
        finally:
            loader.generator = kept

    def end(self, sampler: RandomSampler | None) -> None:
        if self._temporary and sampler is not None:
            sampler.generator = None  # back to drawing a seed per pass, as PyTorch does
        self._temporary = False
        self._hide_loader_generator = False
        self._no_base_seed = False
