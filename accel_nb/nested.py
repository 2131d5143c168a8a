"""Helpers over nested lists, tuples, namedtuples and dicts of tensors: inspect, convert, split, join.

    listify({"a": torch.tensor([1, 2])})                 # {'a': [1, 2]}
    concatenate([{"x": t1}, {"x": t2}])                   # {'x': torch.cat([t1, t2])}
    find_batch_size((torch.zeros(4, 3), torch.zeros(4)))  # 4

The collective operations over the same structures are in ``accel_nb.ops``.
"""

from __future__ import annotations

import dataclasses
import functools
import pickle
from collections.abc import Iterable, Mapping
from typing import Any

import torch

from .ops import CannotPadNestedTensorWarning, is_torch_tensor, recursively_apply

__all__ = [
    "CannotPadNestedTensorWarning",
    "ConvertOutputsToFp32",
    "convert_outputs_to_fp32",
    "TensorInformation",
    "concatenate",
    "convert_to_fp32",
    "find_batch_size",
    "find_device",
    "get_data_structure",
    "get_shape",
    "honor_type",
    "ignorant_find_batch_size",
    "initialize_tensors",
    "is_namedtuple",
    "is_tensor_information",
    "is_torch_tensor",
    "listify",
    "pad_input_tensors",
    "slice_tensors",
]


@dataclasses.dataclass
class TensorInformation:
    """Shape and dtype of a tensor, enough to allocate one like it (``initialize_tensors``)."""

    shape: torch.Size
    dtype: torch.dtype


def is_tensor_information(tensor_info: Any) -> bool:
    """True for a :class:`TensorInformation`."""
    return isinstance(tensor_info, TensorInformation)


def is_namedtuple(data: Any) -> bool:
    """True for an instance of a ``collections.namedtuple`` / ``typing.NamedTuple`` class.

    is_namedtuple(Point(1, 2)), is_namedtuple((1, 2))   # True, False
    """
    return isinstance(data, tuple) and hasattr(data, "_fields") and hasattr(data, "_asdict")


def honor_type(obj: Any, generator: Iterable[Any]) -> Any:
    """The items of ``generator`` in a container of ``obj``'s type (list, tuple or namedtuple)."""
    items = list(generator)
    return type(obj)(*items) if is_namedtuple(obj) else type(obj)(items)


def get_data_structure(data: Any) -> Any:
    """``data`` with each tensor replaced by its :class:`TensorInformation`."""
    return recursively_apply(lambda t: TensorInformation(shape=t.shape, dtype=t.dtype), data)


def get_shape(data: Any) -> Any:
    """``data`` with each tensor replaced by its shape as a list of ints."""
    return recursively_apply(lambda t: list(t.shape), data)


def initialize_tensors(data_structure: Any) -> Any:
    """Uninitialised tensors (``torch.empty``) for each :class:`TensorInformation` in ``data_structure``."""
    return recursively_apply(
        lambda info: torch.empty(*info.shape, dtype=info.dtype),
        data_structure,
        test_type=is_tensor_information,
    )


def find_batch_size(data: Any) -> int:
    """Size of dim 0 of the first tensor in ``data`` (first item of a sequence, first value of a mapping).

    An empty container raises ``ValueError``; a leaf that is no tensor raises ``TypeError``.
    """
    while isinstance(data, (tuple, list, Mapping)):
        if len(data) == 0:
            raise ValueError(f"Cannot find the batch size from empty {type(data)}.")
        data = next(iter(data.values())) if isinstance(data, Mapping) else data[0]
    if not isinstance(data, torch.Tensor):
        raise TypeError(f"Can only find the batch size of tensors but got {type(data)}.")
    return data.shape[0]


def ignorant_find_batch_size(data: Any) -> int | None:
    """:func:`find_batch_size`, or None where it would raise."""
    try:
        return find_batch_size(data)
    except (TypeError, ValueError):
        return None


def listify(data: Any) -> Any:
    """``data`` with each tensor turned into (nested) Python lists of numbers (bfloat16 read as float32)."""

    def _to_list(t: torch.Tensor) -> Any:
        t = t.detach().cpu()
        return (t.float() if t.dtype == torch.bfloat16 else t).tolist()

    return recursively_apply(_to_list, data)


def slice_tensors(
    data: Any, tensor_slice: Any, process_index: int | None = None, num_processes: int | None = None
) -> Any:
    """``data`` with each tensor indexed by ``tensor_slice`` (e.g. ``slice(0, 2)``).

    ``process_index`` and ``num_processes`` are accepted for signature compatibility and unused,
    as in the reference.
    """
    return recursively_apply(lambda t, s: t[s], data, tensor_slice)


def concatenate(data: list[Any] | tuple[Any, ...], dim: int = 0) -> Any:
    """Join a list of same-shaped structures into one structure, concatenating tensors along ``dim``.

    concatenate([(a1, {"x": b1}), (a2, {"x": b2})])   # (cat([a1, a2]), {"x": cat([b1, b2])})
    """
    first = data[0]
    if isinstance(first, (tuple, list)):
        return honor_type(
            first, (concatenate([item[i] for item in data], dim=dim) for i in range(len(first)))
        )
    if isinstance(first, Mapping):
        return type(first)({key: concatenate([item[key] for item in data], dim=dim) for key in first})
    if isinstance(first, torch.Tensor):
        return torch.cat(list(data), dim=dim)
    if isinstance(data, (tuple, list)) and len(data) == 1:
        return first
    raise TypeError(f"Can only concatenate tensors but got {type(first)}")


def pad_input_tensors(tensor: Any, batch_size: int, num_processes: int, dim: int = 0) -> Any:
    """Zero-pad dim 0 of each tensor of a short last batch so that every process gets inputs.

    The padded length is the reference's: ``batch_size`` plus ``num_processes - batch_size`` when
    the batch is smaller than the process count, else plus ``num_processes - batch_size //
    num_processes`` (with its correction when that is below one). The tensor's values fill the
    first ``tensor.shape[dim]`` places along ``dim``; the rest are zeros.
    """

    def _pad(t: torch.Tensor, batch_size: int, num_processes: int, dim: int = 0) -> torch.Tensor:
        per_process = batch_size // num_processes
        left_over = batch_size - per_process * num_processes
        extra = num_processes - batch_size if per_process == 0 else num_processes - per_process
        if left_over > extra and extra < 1:
            extra = left_over - extra
        shape = list(t.shape)
        shape[0] = batch_size + extra
        out = t.new_zeros(tuple(shape))
        where = tuple(slice(0, t.shape[dim]) if i == dim else slice(None) for i in range(len(shape)))
        out[where] = t
        return out

    return recursively_apply(
        _pad, tensor, error_on_other_type=True, batch_size=batch_size, num_processes=num_processes, dim=dim
    )


def _is_half(t: Any) -> bool:
    return (isinstance(t, torch.Tensor) or hasattr(t, "dtype")) and getattr(t, "dtype", None) in (
        torch.float16,
        torch.bfloat16,
    )


def convert_to_fp32(tensor: Any) -> Any:
    """``tensor`` with every float16 / bfloat16 tensor cast to float32; other leaves untouched."""
    return recursively_apply(lambda t: t.float(), tensor, test_type=_is_half)


def find_device(data: Any) -> torch.device | None:
    """Device of the first tensor found in ``data`` (depth first), or None without tensors."""
    if isinstance(data, torch.Tensor):
        return data.device
    children: Iterable[Any] = ()
    if isinstance(data, Mapping):
        children = data.values()
    elif isinstance(data, (tuple, list)):
        children = data
    for child in children:
        device = find_device(child)
        if device is not None:
            return device
    return None


class ConvertOutputsToFp32:
    """A forward whose float16 / bfloat16 outputs come back as float32 (refuses to be pickled, as the reference's).

    model.forward = ConvertOutputsToFp32(model.forward)
    """

    def __init__(self, model_forward: Any) -> None:
        self.model_forward = model_forward
        functools.update_wrapper(self, model_forward)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return convert_to_fp32(self.model_forward(*args, **kwargs))

    def __getstate__(self) -> Any:
        raise pickle.PicklingError(
            "Cannot pickle a prepared model with automatic mixed precision, please unwrap the model with "
            "`Accelerator.unwrap_model(model)` before pickling it."
        )


def convert_outputs_to_fp32(model_forward: Any) -> Any:
    """Wrap ``model_forward`` so its half-precision outputs come back as float32 (``__wrapped__`` is the wrapper
    object, which unwrapping helpers pop)."""
    converting = ConvertOutputsToFp32(model_forward)

    def forward(*args: Any, **kwargs: Any) -> Any:
        return converting(*args, **kwargs)

    forward.__wrapped__ = converting  # type: ignore[attr-defined]
    return forward
