"""Collective operations over nested structures of tensors.

Every function takes a tensor or any nesting of lists, tuples, namedtuples and dicts of tensors,
and returns the same structure. With one process they are no-ops (``gather`` and ``reduce``
return their input unchanged).

    from accel_nb.ops import gather, reduce
    all_preds = gather({"logits": logits, "labels": labels})   # concatenated along dim 0
    mean_loss = reduce(loss, reduction="mean")
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.distributed as dist

from .state import PartialState
from .xla import runtime as _xla_runtime

__all__ = [
    "gather",
    "gather_object",
    "broadcast",
    "broadcast_object_list",
    "reduce",
    "pad_across_processes",
    "send_to_device",
    "recursively_apply",
    "ShapeMismatchError",
    "DistributedOperationException",
    "CannotPadNestedTensorWarning",
    "copy_tensor_to_devices",
    "gather_tensor_shape",
]

_MAX_DIMS = 8


class DistributedOperationException(Exception):
    """A collective cannot run as asked (the reference library's name; ``except`` it to catch every such error)."""


class ShapeMismatchError(ValueError, DistributedOperationException):
    """Tensors passed to a collective differ across ranks where they must agree.

    Also a ``DistributedOperationException``: code written for the reference, which raises that
    in its debug mode, catches it unchanged. accel_nb checks shapes on every call, not only in
    debug mode.
    """


class CannotPadNestedTensorWarning(UserWarning):
    """``pad_across_processes`` met a nested (ragged) tensor: it has no single size to pad, so it is
    returned as it is (the reference's warning class)."""


def is_torch_tensor(tensor: Any) -> bool:
    """True for a ``torch.Tensor`` (any subclass); ``recursively_apply``'s default ``test_type``."""
    return isinstance(tensor, torch.Tensor)


# -- structure walking ------------------------------------------------------------------------------
def _is_namedtuple(obj: Any) -> bool:
    return isinstance(obj, tuple) and hasattr(obj, "_fields")


def _rebuild(obj: Any, items: list[Any]) -> Any:
    if _is_namedtuple(obj):
        return type(obj)(*items)
    return type(obj)(items)


def recursively_apply(
    func: Callable[..., Any],
    data: Any,
    *args: Any,
    test_type: Callable[[Any], bool] = is_torch_tensor,
    error_on_other_type: bool = False,
    **kwargs: Any,
) -> Any:
    """Apply ``func`` to every leaf of ``data`` that passes ``test_type``; keep the structure."""
    if isinstance(data, (list, tuple)):
        return _rebuild(
            data,
            [
                recursively_apply(
                    func, x, *args, test_type=test_type, error_on_other_type=error_on_other_type, **kwargs
                )
                for x in data
            ],
        )
    if isinstance(data, Mapping):
        out = {
            k: recursively_apply(
                func, v, *args, test_type=test_type, error_on_other_type=error_on_other_type, **kwargs
            )
            for k, v in data.items()
        }
        try:
            return type(data)(out)
        except TypeError:  # mappings whose constructor takes something else
            return out
    if test_type(data):
        return func(data, *args, **kwargs)
    if error_on_other_type:
        name = getattr(func, "__name__", type(func).__name__)
        kind = getattr(test_type, "__name__", type(test_type).__name__)
        error = TypeError(  # the reference's words (code matches on them); the way out as a note
            f"Unsupported types ({type(data)}) passed to `{name}`. Only nested list/tuple/dicts of objects that "
            f"are valid for `{kind}` should be passed."
        )
        error.add_note("Use gather_object / broadcast_object_list for arbitrary Python objects.")
        raise error
    return data


def _leaves(data: Any) -> list[torch.Tensor]:
    found: list[torch.Tensor] = []
    recursively_apply(lambda t: found.append(t), data)
    return found


def _xla() -> Any:
    """``accel_nb.xla.collectives`` when this run is on XLA devices (their collectives replace
    torch.distributed's), else None."""
    if not _xla_runtime.in_use():
        return None
    from .xla import collectives

    return collectives


def world_size() -> int:
    """Processes in the run: the XLA world or the process group's size; 1 outside a process group."""
    if _xla_runtime.in_use():
        return _xla_runtime.world_size()
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def rank() -> int:
    """This process's index in the run (XLA ordinal or process-group rank); 0 outside a process group."""
    if _xla_runtime.in_use():
        return _xla_runtime.ordinal()
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _comm_device(t: torch.Tensor) -> torch.device:
    # nccl needs CUDA tensors; gloo works with CPU tensors
    backend = dist.get_backend()
    if backend == "nccl" and t.device.type != "cuda":
        return torch.device("cuda", torch.cuda.current_device())
    return t.device


# dtypes are compared through a stable small code
_DTYPES = [
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.bool,
    torch.complex64,
    torch.complex128,
]


def _dtype_code(dtype: torch.dtype) -> int:
    return _DTYPES.index(dtype) if dtype in _DTYPES else len(_DTYPES)


def _exchange_meta(tensors: list[torch.Tensor]) -> torch.Tensor:
    """All ranks' (ndim, dtype, *shape) of each tensor, in one small collective: [world, n, 2+MAX]."""
    meta = torch.full((len(tensors), 2 + _MAX_DIMS), -1, dtype=torch.int64)
    for i, t in enumerate(tensors):
        if t.dim() > _MAX_DIMS:
            raise ValueError(
                f"tensors with more than {_MAX_DIMS} dimensions are not supported by collectives here"
            )
        meta[i, 0] = t.dim()
        meta[i, 1] = _dtype_code(t.dtype)
        meta[i, 2 : 2 + t.dim()] = torch.tensor(t.shape, dtype=torch.int64)
    if _xla() is not None:
        return _xla().all_gather(meta.unsqueeze(0))
    device = _comm_device(tensors[0]) if tensors else torch.device("cpu")
    meta = meta.to(device)
    out = [torch.empty_like(meta) for _ in range(world_size())]
    dist.all_gather(out, meta)
    return torch.stack(out).cpu()


def _shape_str(row: torch.Tensor) -> str:
    ndim = int(row[0])
    dtype = _DTYPES[int(row[1])] if int(row[1]) < len(_DTYPES) else "other"
    return f"{tuple(int(x) for x in row[2 : 2 + ndim])} {str(dtype).replace('torch.', '')}"


def _check_same(meta: torch.Tensor, op: str, ignore_dim: int | None = None) -> None:
    """Raise a ShapeMismatchError naming every rank's shape when leaves differ across ranks."""
    world, n = meta.shape[0], meta.shape[1]
    for i in range(n):
        rows = meta[:, i]
        ref = rows[0].clone()
        mismatch = False
        for r in range(1, world):
            a, b = ref.clone(), rows[r].clone()
            if ignore_dim is not None and a[0] == b[0] and ignore_dim < int(a[0]):
                a[2 + ignore_dim] = b[2 + ignore_dim] = 0
            if not torch.equal(a, b):
                mismatch = True
                break
        if mismatch:
            shapes = ", ".join(f"rank {r}: {_shape_str(rows[r])}" for r in range(world))
            where = f" (tensor #{i} of the structure)" if n > 1 else ""
            hint = (
                "pad them first with pad_across_processes(t, dim=0) (gather_for_metrics does this for you) "
                "or use gather_object"
                if op == "gather"
                else "every rank must pass tensors of the same shape and dtype"
            )
            raise ShapeMismatchError(
                f"{op} got different tensors on different ranks{where}: {shapes}; {hint}"
            )


# -- gather -----------------------------------------------------------------------------------------
def gather(tensor: Any) -> Any:
    """Concatenate each tensor of ``tensor`` from every process along dim 0 (scalars become 1-D).

    Shapes must agree across ranks; if they do not, a ``ShapeMismatchError`` names every
    rank's shape.
    """
    if world_size() == 1:
        return tensor
    leaves = _leaves(tensor)
    if not leaves:
        return tensor
    _check_same(_exchange_meta(leaves), "gather")

    def _one(t: torch.Tensor) -> torch.Tensor:
        if t.dim() == 0:
            t = t.unsqueeze(0)
        if _xla() is not None:
            return _xla().all_gather(t)
        src = t.contiguous().to(_comm_device(t))
        out = [torch.empty_like(src) for _ in range(world_size())]
        dist.all_gather(out, src)
        return torch.cat(out, dim=0).to(t.device)

    return recursively_apply(_one, tensor)


def gather_object(object: Any) -> list[Any]:  # the reference's parameter name, for keyword callers
    """Gather picklable objects from every process.

    A list or tuple from each rank is concatenated in rank order; any other object gives a
    list with one entry per rank.
    """
    obj = object
    if world_size() == 1:
        return list(obj) if isinstance(obj, (list, tuple)) else [obj]
    out: list[Any] = [None] * world_size()
    if _xla() is not None:
        out = _xla().gather_objects(obj)
    else:
        dist.all_gather_object(out, obj)
    if isinstance(obj, (list, tuple)):
        return [x for part in out for x in part]
    return out


# -- broadcast --------------------------------------------------------------------------------------
def broadcast(tensor: Any, from_process: int = 0) -> Any:
    """Copy each tensor of ``tensor`` from ``from_process`` into every other process (in place)."""
    if world_size() == 1:
        return tensor
    leaves = _leaves(tensor)
    if leaves:
        _check_same(_exchange_meta(leaves), "broadcast")

    def _one(t: torch.Tensor) -> torch.Tensor:
        if _xla() is not None:
            return _xla().broadcast_(t, from_process)
        dev = _comm_device(t)
        if dev == t.device and t.is_contiguous():
            dist.broadcast(t, src=from_process)
            return t
        buf = t.contiguous().to(dev)
        dist.broadcast(buf, src=from_process)
        t.copy_(buf)
        return t

    return recursively_apply(_one, tensor)


def broadcast_object_list(object_list: list[Any], from_process: int = 0) -> list[Any]:
    """Replace the contents of ``object_list`` on every rank with ``from_process``'s (in place)."""
    if world_size() > 1 and _xla() is not None:
        object_list[:] = _xla().gather_objects(list(object_list))[from_process]
    elif world_size() > 1:
        dist.broadcast_object_list(object_list, src=from_process)
    return object_list


# the reference's dtype codes for gather_tensor_shape (its TENSOR_TYPE_TO_INT / TENSOR_INT_TO_DTYPE)
TENSOR_TYPE_TO_INT = {dtype: code for code, dtype in enumerate(_DTYPES[:10], start=1)}
TENSOR_INT_TO_DTYPE = {code: dtype for dtype, code in TENSOR_TYPE_TO_INT.items()}


def gather_tensor_shape(tensor: torch.Tensor | None) -> tuple[torch.Size, int]:
    """The shape and dtype code (``TENSOR_TYPE_TO_INT``) of a tensor only one process holds
    (``None`` on the others), on every process.

        shape, code = gather_tensor_shape(t if state.is_main_process else None)
    """
    held = None if tensor is None else (tuple(tensor.shape), TENSOR_TYPE_TO_INT[tensor.dtype])
    found = [x for x in gather_object([held]) if x is not None]
    if not found:
        raise ValueError("gather_tensor_shape: no process passed a tensor (all passed None)")
    return torch.Size(found[0][0]), found[0][1]


def copy_tensor_to_devices(tensor: torch.Tensor | None = None) -> torch.Tensor:
    """Every process gets the tensor only one process holds; the others pass ``None`` and need not
    know its shape (unlike ``broadcast``). Summed over the processes, as in the reference, so a
    tensor passed by several processes comes back as their sum.

        t = copy_tensor_to_devices(torch.tensor([1, 2, 3]) if state.is_main_process else None)
    """
    shape, code = gather_tensor_shape(tensor)
    if tensor is None:
        tensor = torch.zeros(shape, dtype=TENSOR_INT_TO_DTYPE[code], device=PartialState().device)
    return reduce(tensor, reduction="sum")


def gather_for_metrics(input_data: Any, use_gather_object: bool = False, gradient_state: Any = None) -> Any:
    """``Accelerator.gather_for_metrics``: gather, then drop the samples ``even_batches`` repeated.

    On the last batch of the prepared loader that ``gradient_state`` says is active, only its
    ``last_round_real`` samples are kept. Non-tensor data goes through ``gather_object``.
    """
    flat = _nested_values(input_data)
    as_objects = use_gather_object or not flat or not all(isinstance(x, torch.Tensor) for x in flat)
    data = gather_object(input_data) if as_objects else gather(input_data)
    if world_size() == 1 or gradient_state is None or not gradient_state.end_of_dataloader:
        return data
    real = getattr(gradient_state.active_dataloader, "last_round_real", None)
    if real is None:
        return data
    return data[:real] if as_objects else recursively_apply(lambda t: t[:real], data)


def _nested_values(data: Any) -> list[Any]:
    if isinstance(data, (list, tuple)):
        return [x for item in data for x in _nested_values(item)]
    if isinstance(data, dict):
        return [x for item in data.values() for x in _nested_values(item)]
    return [data]


# -- reduce -----------------------------------------------------------------------------------------
_REDUCE_OPS = {  # reduction -> torch.distributed.ReduceOp member ("mean" is divided afterwards)
    "sum": "SUM",
    "mean": "SUM",
    "max": "MAX",
    "min": "MIN",
    "product": "PRODUCT",
}


def reduce(tensor: Any, reduction: str = "sum", scale: float = 1.0) -> Any:
    """Combine each tensor over all processes elementwise; returns new tensors.

    ``reduction`` is ``"sum"``, ``"mean"``, ``"max"``, ``"min"`` or ``"product"`` (``"none"``: no
    communication, a copy of this process's tensor).

        best = reduce(torch.tensor([accuracy]), "max")
    """
    if reduction not in _REDUCE_OPS and reduction not in ("none", None):
        raise ValueError(
            f"reduction={reduction!r} is not supported; choose one of {', '.join(map(repr, _REDUCE_OPS))} or 'none'"
        )
    world = world_size()
    if world > 1:
        leaves = _leaves(tensor)
        if leaves:
            _check_same(_exchange_meta(leaves), "reduce")

    def _one(t: torch.Tensor) -> torch.Tensor:
        out = t.clone()
        if world > 1 and reduction not in ("none", None) and _xla() is not None:
            out = _xla().all_reduce(out, reduction)
            if reduction == "mean":
                out = out / world if out.is_floating_point() or out.is_complex() else out // world
        elif world > 1 and reduction not in ("none", None):
            buf = out.to(_comm_device(out))
            dist.all_reduce(buf, op=getattr(dist.ReduceOp, _REDUCE_OPS[reduction]))
            out = buf.to(t.device)
            if reduction == "mean":
                out = out / world if out.is_floating_point() or out.is_complex() else out // world
        return out * scale if scale != 1.0 else out

    return recursively_apply(_one, tensor)


# -- padding ----------------------------------------------------------------------------------------
def pad_across_processes(tensor: Any, dim: int = 0, pad_index: int = 0, pad_first: bool = False) -> Any:
    """Pad each tensor along ``dim`` to the largest size any process has, so it can be gathered.

    Padding uses ``pad_index`` and goes at the end (or the start with ``pad_first``). A nested tensor
    is returned as it is, with a ``CannotPadNestedTensorWarning`` (on every process count).
    """
    if any(getattr(t, "is_nested", False) for t in _leaves(tensor)):
        warnings.warn(
            "Cannot pad nested tensors without more information. Leaving unprocessed. (A nested tensor "
            "has no single size along a dimension; pad its components before nesting them to gather it.)",
            CannotPadNestedTensorWarning,
            stacklevel=2,
        )
    if world_size() == 1:
        return tensor
    leaves = [t for t in _leaves(tensor) if not getattr(t, "is_nested", False)]
    if not leaves:
        return tensor
    meta = _exchange_meta(leaves)
    for i, t in enumerate(leaves):
        ndims = {int(meta[r, i, 0]) for r in range(meta.shape[0])}
        if len(ndims) > 1:
            shapes = ", ".join(f"rank {r}: {_shape_str(meta[r, i])}" for r in range(meta.shape[0]))
            raise ShapeMismatchError(
                f"pad_across_processes needs the same number of dimensions on every rank: {shapes}"
            )
        if not -t.dim() <= dim < max(t.dim(), 1):
            raise IndexError(f"dim={dim} is out of range for a tensor of shape {tuple(t.shape)}")
    counter = iter(range(len(leaves)))

    def _one(t: torch.Tensor) -> torch.Tensor:
        if getattr(t, "is_nested", False):
            return t
        i = next(counter)
        if t.dim() == 0:
            return t
        d = dim % t.dim()
        target = int(meta[:, i, 2 + d].max())
        if target == t.shape[d]:
            return t
        shape = list(t.shape)
        shape[d] = target
        out = t.new_full(shape, pad_index)
        idx = [slice(None)] * t.dim()
        idx[d] = slice(target - t.shape[d], target) if pad_first else slice(0, t.shape[d])
        out[tuple(idx)] = t
        return out

    return recursively_apply(_one, tensor)


# -- devices ----------------------------------------------------------------------------------------
def send_to_device(
    tensor: Any, device: torch.device | str, non_blocking: bool = False, skip_keys: Any = None
) -> Any:
    """Move every tensor (or object with ``.to``) in ``tensor`` (any nesting) to ``device``; keep the structure."""
    obj = tensor
    if isinstance(skip_keys, str):
        skip_keys = [skip_keys]
    if isinstance(obj, (list, tuple)):
        return _rebuild(obj, [send_to_device(x, device, non_blocking, skip_keys) for x in obj])
    if isinstance(obj, Mapping):
        out = {
            k: (v if skip_keys and k in skip_keys else send_to_device(v, device, non_blocking, skip_keys))
            for k, v in obj.items()
        }
        try:
            return type(obj)(out)
        except TypeError:
            return out
    if isinstance(obj, torch.Tensor):
        if obj.device == torch.device(device):
            return obj
        return obj.to(device, non_blocking=non_blocking)
    if hasattr(obj, "to") and callable(obj.to) and not isinstance(obj, torch.nn.Module):
        try:
            return obj.to(device, non_blocking=non_blocking)
        except TypeError:
            return obj.to(device)
    return obj
