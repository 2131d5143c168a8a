"""Splitting inputs between processes: the pure function behind ``split_between_processes``.

split_for_process([1, 2, 3], index=1, parts=2)                      # [3]
split_for_process([1, 2, 3], index=1, parts=2, apply_padding=True)  # [3, 3]
"""

from __future__ import annotations

import math
import sys
from typing import Any

import torch

__all__ = ["split_for_process"]


def _share(n: int, index: int, parts: int) -> tuple[int, int]:
    """(start, stop) of part ``index`` when ``n`` items are split into ``parts`` contiguous parts."""
    base, extra = divmod(n, parts)
    start = index * base + min(index, extra)
    return start, start + base + (1 if index < extra else 0)


def split_for_process(inputs: Any, index: int, parts: int, apply_padding: bool = False) -> Any:
    """Pure function behind ``split_between_processes``."""
    if parts == 1:
        return inputs
    datasets = sys.modules.get("datasets")  # a datasets.Dataset can only exist once datasets is imported
    if datasets is not None and isinstance(inputs, getattr(datasets, "Dataset", ())):
        n = len(inputs)
        start, stop = _share(n, index, parts)
        rows = list(range(start, stop))
        if apply_padding and n:
            rows += [n - 1] * (math.ceil(n / parts) - len(rows))
        return inputs.select(rows)  # a Dataset again, as in the reference library
    if isinstance(inputs, dict):
        lengths = {k: len(v) for k, v in inputs.items()}
        if len(set(lengths.values())) > 1:
            raise ValueError(
                f"split_between_processes needs every value of the dict to have the same length, got {lengths}"
            )
        return {k: split_for_process(v, index, parts, apply_padding) for k, v in inputs.items()}
    if not hasattr(inputs, "__len__") or not hasattr(inputs, "__getitem__"):
        raise TypeError(
            f"split_between_processes takes a list, tuple, tensor or dict of those, not {type(inputs).__name__}"
        )
    n = len(inputs)
    start, stop = _share(n, index, parts)
    part = inputs[start:stop]
    if apply_padding:
        longest = math.ceil(n / parts)
        missing = longest - (stop - start)
        if missing > 0 and n > 0:
            last = inputs[-1:] if stop - start == 0 else part[-1:]
            if isinstance(part, torch.Tensor):
                part = torch.cat([part] + [last] * missing)
            elif isinstance(part, tuple):
                part = part + tuple(last) * missing
            else:
                part = list(part) + list(last) * missing
    return part
