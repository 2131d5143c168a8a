"""Collective ops over nested structures: no-ops on one process, real on 2 gloo ranks."""

from __future__ import annotations

from collections import namedtuple

import pytest
import torch

from accel_nb import ops
from accel_nb.state import PartialState
from tests.dist_helpers import RanksFailed, run_ranks

Pair = namedtuple("Pair", "a b")


pytestmark = pytest.mark.usefixtures("fresh_state")  # tests/conftest.py: one process, fresh state


def test_single_process_noops():
    t = torch.arange(3)
    assert ops.gather(t) is t
    assert torch.equal(ops.reduce(t), t)
    assert ops.pad_across_processes(t) is t
    assert ops.broadcast(t) is t
    assert ops.gather_object([1, 2]) == [1, 2] and ops.gather_object("x") == ["x"]
    assert ops.broadcast_object_list([1]) == [1]


def test_send_to_device_keeps_structure():
    data = {"x": [torch.ones(1), (torch.zeros(2), "keep")], "p": Pair(torch.ones(1), 3)}
    out = ops.send_to_device(data, "cpu")
    assert isinstance(out["p"], Pair) and out["p"].b == 3 and out["x"][1][1] == "keep"
    out = ops.send_to_device({"a": torch.ones(1), "b": torch.ones(1)}, torch.device("cpu"), skip_keys="b")
    assert set(out) == {"a", "b"}


def test_recursively_apply_error_on_other_type():
    with pytest.raises(TypeError, match="gather_object"):
        ops.recursively_apply(lambda t: t, [torch.ones(1), object()], error_on_other_type=True)


def _gather_nested():
    r = PartialState().process_index
    data = {
        "x": torch.full((2, 3), float(r)),
        "l": [torch.tensor(r), Pair(torch.tensor([r, r]), torch.tensor([[r]]))],
    }
    g = ops.gather(data)
    return (
        g["x"].tolist(),
        g["l"][0].tolist(),
        type(g["l"][1]).__name__,
        g["l"][1].a.tolist(),
        g["l"][1].b.tolist(),
    )


@pytest.mark.multiproc
def test_gather_nested():
    res = run_ranks(_gather_nested, 2)
    assert res[0] == res[1]
    x, scalar, name, a, b = res[0]
    assert x == [[0.0] * 3] * 2 + [[1.0] * 3] * 2
    assert scalar == [0, 1] and name == "Pair" and a == [0, 0, 1, 1] and b == [[0], [1]]


def _gather_mismatch():
    r = PartialState().process_index
    ops.gather(torch.zeros(4 + r, 3))


@pytest.mark.multiproc
def test_gather_mismatched_shapes_names_every_rank():
    with pytest.raises(RanksFailed) as info:
        run_ranks(_gather_mismatch, 2)
    msg = str(info.value)
    assert "ShapeMismatchError" in msg
    assert "rank 0: (4, 3) float32" in msg and "rank 1: (5, 3) float32" in msg
    assert "pad_across_processes" in msg


def _gather_object():
    r = PartialState().process_index
    return ops.gather_object([f"r{r}", {"n": r}]), ops.gather_object({"rank": r})


@pytest.mark.multiproc
def test_gather_object():
    res = run_ranks(_gather_object, 2)
    assert res[0] == res[1] == (["r0", {"n": 0}, "r1", {"n": 1}], [{"rank": 0}, {"rank": 1}])


def _broadcast():
    r = PartialState().process_index
    data = [torch.full((2,), float(r + 10)), {"k": torch.tensor([r])}]
    out = ops.broadcast(data, from_process=1)
    objs = ops.broadcast_object_list([f"from {r}", r], from_process=0)
    return out[0].tolist(), out[1]["k"].tolist(), objs


@pytest.mark.multiproc
def test_broadcast_and_object_list():
    res = run_ranks(_broadcast, 2)
    assert res == [([11.0, 11.0], [1], ["from 0", 0])] * 2


def _reduce():
    r = PartialState().process_index
    s = ops.reduce({"a": torch.tensor([1.0 + r, 2.0])})
    m = ops.reduce(torch.tensor([1.0 + r]), reduction="mean")
    i = ops.reduce(torch.tensor([3 + r]), reduction="mean")
    scaled = ops.reduce(torch.tensor([1.0]), scale=0.5)
    return s["a"].tolist(), m.tolist(), i.tolist(), scaled.tolist()


@pytest.mark.multiproc
def test_reduce_sum_mean_scale():
    assert run_ranks(_reduce, 2) == [([3.0, 4.0], [1.5], [3], [1.0])] * 2


def _reduce_elementwise():
    r = PartialState().process_index
    value = {"f": torch.tensor([r + 1.0, 4.0 - r]), "i": torch.tensor([2 + r, 5])}
    return {op: {k: v.tolist() for k, v in ops.reduce(value, op).items()} for op in ("max", "min", "product")}


@pytest.mark.multiproc
def test_reduce_max_min_product():
    expected = {
        "max": {"f": [2.0, 4.0], "i": [3, 5]},
        "min": {"f": [1.0, 3.0], "i": [2, 5]},
        "product": {"f": [2.0, 12.0], "i": [6, 25]},
    }
    assert run_ranks(_reduce_elementwise, 2) == [expected] * 2


def _reduce_bad():
    ops.reduce(torch.ones(1), reduction="median")


@pytest.mark.multiproc
def test_reduce_bad_reduction():
    with pytest.raises(
        RanksFailed, match="reduction='median' is not supported; choose one of 'sum', 'mean', 'max'"
    ):
        run_ranks(_reduce_bad, 2)


def _pad():
    r = PartialState().process_index
    t = torch.full((1 + 2 * r, 2), r + 1)
    end = ops.pad_across_processes(t, dim=0, pad_index=-1)
    first = ops.pad_across_processes({"t": t}, dim=0, pad_index=0, pad_first=True)["t"]
    last_dim = ops.pad_across_processes(torch.ones(2, 1 + r), dim=-1)
    gathered = ops.gather(end)
    return end.tolist(), first.tolist(), last_dim.shape[-1], gathered.shape[0]


@pytest.mark.multiproc
def test_pad_across_processes():
    res = run_ranks(_pad, 2)
    assert res[0] == ([[1, 1], [-1, -1], [-1, -1]], [[0, 0], [0, 0], [1, 1]], 2, 6)
    assert res[1][0] == [[2, 2]] * 3 and res[1][2] == 2


def _pad_nested():
    import warnings

    r = PartialState().process_index
    nested = torch.nested.nested_tensor([torch.ones(1 + r), torch.ones(2)])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = ops.pad_across_processes({"n": nested, "t": torch.ones(1 + r)})
    kinds = [w.category.__name__ for w in caught if "Cannot pad nested tensors" in str(w.message)]
    return out["n"] is nested, out["t"].tolist(), kinds


@pytest.mark.multiproc
def test_pad_across_processes_leaves_a_nested_tensor_with_a_warning():
    """Issue 38, item 13: a nested tensor is left as it is with CannotPadNestedTensorWarning; the other
    tensors of the same structure are still padded."""
    res = run_ranks(_pad_nested, 2)
    assert res[0] == (True, [1.0, 0.0], ["CannotPadNestedTensorWarning"])
    assert res[1] == (True, [1.0, 1.0], ["CannotPadNestedTensorWarning"])


@pytest.mark.parametrize("library", ["accel_nb", "accelerate"])
def test_pad_across_processes_warns_on_a_nested_tensor_in_one_process_like_the_reference(library):
    import importlib

    pytest.importorskip("accelerate")
    utils = importlib.import_module(f"{library}.utils")
    nested = torch.nested.nested_tensor([torch.ones(3), torch.ones(1)])
    try:
        with pytest.warns(utils.CannotPadNestedTensorWarning, match="Cannot pad nested tensors"):
            assert utils.pad_across_processes(nested) is nested
    finally:  # the reference's state made here must not reach later tests' forked ranks
        import accelerate.state

        accelerate.state.AcceleratorState._reset_state(reset_partial_state=True)
    assert (
        utils.CannotPadNestedTensorWarning
        is importlib.import_module(f"{library}.utils.operations").CannotPadNestedTensorWarning
    )


def _pad_ndim_mismatch():
    r = PartialState().process_index
    ops.pad_across_processes(torch.zeros([2] * (1 + r)))


@pytest.mark.multiproc
def test_pad_different_ndims_is_a_clear_error():
    with pytest.raises(RanksFailed, match="same number of dimensions on every rank"):
        run_ranks(_pad_ndim_mismatch, 2)
