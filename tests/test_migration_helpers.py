"""The helpers added under the reference's ``utils`` paths behave like the reference's, side by side in
this process: same outputs, same exceptions."""

from __future__ import annotations

import collections
import logging
import os
import platform
import unittest
import warnings

import pytest
import torch
from torch import nn

pytest.importorskip("accelerate")
import accelerate.utils as ref  # noqa: E402
import accelerate.utils.modeling as ref_modeling  # noqa: E402
import accelerate.utils.operations as ref_ops  # noqa: E402

import accel_nb.utils as ours  # noqa: E402
import accel_nb.utils.modeling as our_modeling  # noqa: E402
import accel_nb.utils.operations as our_ops  # noqa: E402

Point = collections.namedtuple("Point", "x y")


@pytest.fixture(autouse=True)
def _reference_state_does_not_leak():
    """Tests here create the reference's PartialState in this process; later tests fork ranks from
    it, which would inherit a one-process state. Reset it after each test."""
    yield
    import accelerate.state

    accelerate.state.AcceleratorState._reset_state(reset_partial_state=True)
    accelerate.state.GradientState._reset_state()


def _same(a, b):
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return type(a) is type(b) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return a == b


def _outcome(fn, *args, **kwargs):
    try:
        return ("ok", fn(*args, **kwargs))
    except Exception as exc:  # the type and message are compared
        return ("raised", type(exc).__name__, str(exc))


NESTED = [
    {"a": torch.arange(6).reshape(3, 2), "b": (torch.ones(3, dtype=torch.bfloat16), "text")},
    Point(torch.zeros(2, 2, dtype=torch.float16), [torch.tensor([1.5, 2.5])]),
    (torch.tensor(3), 7),
]


@pytest.mark.parametrize(
    "name", ["listify", "convert_to_fp32", "get_shape", "find_device", "ignorant_find_batch_size"]
)
@pytest.mark.parametrize("data", NESTED + [[], {}, "x"], ids=lambda d: type(d).__name__)
def test_structure_helpers_match_the_reference(name, data):
    mine, theirs = _outcome(getattr(our_ops, name), data), _outcome(getattr(ref_ops, name), data)
    assert mine[0] == theirs[0] and _same(mine[1:], theirs[1:]), (mine, theirs)


@pytest.mark.parametrize("data", NESTED + [[], {"k": []}, "x"], ids=lambda d: type(d).__name__)
def test_find_batch_size_matches_including_its_errors(data):
    assert _outcome(our_ops.find_batch_size, data) == _outcome(ref_ops.find_batch_size, data)


def test_is_namedtuple_honor_type_and_data_structure():
    for value in (Point(1, 2), (1, 2), [1], "ab"):
        assert our_ops.is_namedtuple(value) == ref_ops.is_namedtuple(value)
    assert our_ops.honor_type(Point(0, 0), iter([3, 4])) == ref_ops.honor_type(Point(0, 0), iter([3, 4]))
    structure = our_ops.get_data_structure(NESTED[0])
    theirs = ref_ops.get_data_structure(NESTED[0])
    assert structure["a"].shape == theirs["a"].shape and structure["b"][0].dtype == theirs["b"][0].dtype
    made = our_ops.initialize_tensors(structure)
    assert made["a"].shape == (3, 2) and made["b"][0].dtype == torch.bfloat16 and made["b"][1] == "text"


def test_concatenate_and_slice_tensors():
    batches = [
        {
            "x": torch.full((2, 3), float(i)),
            "y": (torch.tensor([i, i]), Point(torch.tensor([i]), torch.tensor([i]))),
        }
        for i in range(3)
    ]
    assert _same(our_ops.concatenate(batches), ref_ops.concatenate(batches))
    assert _same(
        our_ops.concatenate([torch.ones(2, 2)] * 2, dim=1), ref_ops.concatenate([torch.ones(2, 2)] * 2, dim=1)
    )
    assert our_ops.concatenate(["only"]) == ref_ops.concatenate(["only"]) == "only"
    assert _outcome(our_ops.concatenate, ["a", "b"]) == _outcome(ref_ops.concatenate, ["a", "b"])
    assert _same(
        our_ops.slice_tensors(batches[1], slice(0, 1)), ref_ops.slice_tensors(batches[1], slice(0, 1))
    )


@pytest.mark.parametrize(
    "batch_size, num_processes", [(3, 4), (1, 2), (5, 2), (10, 4), (9, 4), (7, 3), (4, 8)]
)
def test_pad_input_tensors_gives_the_reference_sizes_and_values(batch_size, num_processes):
    data = {"ids": torch.arange(batch_size * 2).reshape(batch_size, 2), "mask": torch.ones(batch_size)}
    assert _same(
        our_ops.pad_input_tensors(data, batch_size, num_processes),
        ref_ops.pad_input_tensors(data, batch_size, num_processes),
    )


def test_convert_outputs_to_fp32_wraps_a_forward_like_the_reference():
    import pickle

    def forward(x):
        return {"out": x.half(), "n": 1}

    ours_fwd, ref_fwd = our_ops.convert_outputs_to_fp32(forward), ref_ops.convert_outputs_to_fp32(forward)
    assert _same(ours_fwd(torch.ones(2)), ref_fwd(torch.ones(2)))
    assert ours_fwd(torch.ones(2))["out"].dtype == torch.float32
    with pytest.raises(pickle.PicklingError):
        pickle.dumps(our_ops.ConvertOutputsToFp32(forward))
    assert issubclass(our_ops.CannotPadNestedTensorWarning, UserWarning)


def _wrapped_by_hand(utils, how):
    """A half Linear whose forward the user wrapped with ``utils.convert_outputs_to_fp32``."""
    import types

    torch.manual_seed(0)
    model = nn.Linear(2, 2).half()
    if how == "bound":  # model.forward = convert_outputs_to_fp32(model.forward)
        model.forward = utils.convert_outputs_to_fp32(model.forward)
    else:  # the class's function wrapped, then bound to the model
        model.forward = types.MethodType(utils.convert_outputs_to_fp32(nn.Linear.forward), model)
    return model


@pytest.mark.parametrize("how", ["bound", "method"])
def test_a_forward_wrapped_by_convert_outputs_to_fp32_is_removed_by_extract_model_from_parallel(how):
    """One convert_outputs_to_fp32 (accel_nb.precision's was an outputs caster of the same name: given a
    forward it returned it unwrapped, so outputs stayed half); keep_fp32_wrapper=False removes it and the
    model pickles (the reference 1.15 leaves it there: a deliberate difference, docs/migration.md)."""
    import pickle

    import accel_nb.precision
    from accel_nb.nested import convert_outputs_to_fp32

    assert (
        accel_nb.precision.convert_outputs_to_fp32 is ours.convert_outputs_to_fp32 is convert_outputs_to_fp32
    )
    assert our_ops.convert_outputs_to_fp32 is convert_outputs_to_fp32
    x = torch.ones(1, 2, dtype=torch.float16)
    models = {library: _wrapped_by_hand(utils, how) for library, utils in (("ours", ours), ("ref", ref))}
    for model in models.values():  # wrapped the same way in both: fp32 outputs, no pickling when bound
        assert model(x).dtype == torch.float32
        if how == "bound":
            with pytest.raises((pickle.PicklingError, AttributeError)):
                pickle.dumps(model)
    kept = ours.extract_model_from_parallel(models["ours"])  # keep_fp32_wrapper=True: left as it is
    assert kept(x).dtype == torch.float32 and "forward" in kept.__dict__
    plain = ours.extract_model_from_parallel(models["ours"], keep_fp32_wrapper=False)
    assert "forward" not in plain.__dict__  # the class's own forward again
    assert plain(x).dtype == torch.float16
    copy = pickle.loads(pickle.dumps(plain))
    assert torch.equal(copy(x), plain(x))
    if how == "bound":  # the reference keeps the user's wrapper: its model still does not pickle
        theirs = ref.extract_model_from_parallel(models["ref"], keep_fp32_wrapper=False)
        assert theirs(x).dtype == torch.float32
        with pytest.raises((pickle.PicklingError, AttributeError)):
            pickle.dumps(theirs)


def test_shape_mismatch_is_a_distributed_operation_exception():
    from accel_nb.ops import ShapeMismatchError

    assert issubclass(ShapeMismatchError, our_ops.DistributedOperationException)
    assert issubclass(ShapeMismatchError, ValueError)  # what accel_nb code already catches


# -- modeling ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "size", [1024, "1MiB", "2GIB", "3KiB", "5GB", "5Gb", "1.5MB", "7kb", "12", "xMB", -1, "-1KB"]
)
def test_convert_file_size_to_int(size):
    assert _outcome(our_modeling.convert_file_size_to_int, size) == _outcome(
        ref_modeling.convert_file_size_to_int, size
    )


@pytest.mark.parametrize(
    "dtype",
    [
        torch.float32,
        torch.float16,
        torch.bfloat16,
        torch.int8,
        torch.uint8,
        torch.int64,
        torch.bool,
        torch.float64,
        torch.float8_e4m3fn,
        torch.complex64,
    ],
)
def test_dtype_byte_size(dtype):
    assert our_modeling.dtype_byte_size(dtype) == ref_modeling.dtype_byte_size(dtype)


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.block = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4))
        self.head = nn.Linear(4, 10, bias=False)
        self.head.weight = self.embed.weight
        self.register_buffer("steps", torch.zeros(3), persistent=False)
        self.block[0].register_buffer("scale", torch.ones(2))
        self.block[0].register_buffer("cache", torch.ones(5), persistent=False)


@pytest.mark.parametrize("recurse, fqns", [(False, False), (True, False), (True, True)])
def test_non_persistent_buffers(recurse, fqns):
    model = Tiny()
    got = our_modeling.get_non_persistent_buffers(model, recurse=recurse, fqns=fqns)
    assert got == ref_modeling.get_non_persistent_buffers(model, recurse=recurse, fqns=fqns)


def test_buffer_size_leaves_and_sizes_with_ties():
    model = Tiny()
    for dtype in (None, torch.float16):
        assert our_modeling.compute_module_total_buffer_size(
            model, dtype=dtype
        ) == ref_modeling.compute_module_total_buffer_size(model, dtype=dtype)
    sizes = ref_modeling.compute_module_sizes(model)
    assert sorted(our_modeling.get_module_leaves(sizes)) == sorted(ref_modeling.get_module_leaves(sizes))
    modules = list(model.named_children())
    args = (["head.weight"], sizes["embed"], sizes, modules)
    mine, theirs = (
        our_modeling.get_module_size_with_ties(*args),
        ref_modeling.get_module_size_with_ties(*args),
    )
    assert mine[0] == theirs[0] and mine[1] == theirs[1] and all(a is b for a, b in zip(mine[2], theirs[2]))
    assert our_modeling.get_module_size_with_ties([], 5, sizes, modules) == (5, [], [])


@pytest.mark.parametrize(
    "device_map",
    [
        {"a.x": 0, "a.y": 0, "b": 1},
        {"a.x.0": "cpu", "a.x.1": "cpu", "a.y": "disk", "b.c": 0, "b.d": 0},
        {"": 0},
        {"l.0": 0, "l.1": 1, "l.2": 1, "m": 0},
    ],
)
def test_clean_device_map(device_map):
    assert our_modeling.clean_device_map(dict(device_map)) == ref_modeling.clean_device_map(dict(device_map))


def test_retie_parameters_and_tensor_storage_ids():
    def broken():
        model = Tiny()
        model.head.weight = nn.Parameter(torch.empty_like(model.embed.weight, device="meta"))
        return model

    mine, theirs = broken(), broken()
    our_modeling.retie_parameters(mine, [["embed.weight", "head.weight"]])
    ref_modeling.retie_parameters(theirs, [["embed.weight", "head.weight"]])
    assert mine.head.weight is mine.embed.weight and theirs.head.weight is theirs.embed.weight
    t = torch.zeros(4)
    assert our_modeling.id_tensor_storage(t[1:]) == ref_modeling.id_tensor_storage(t[1:])
    for a, b in [("cpu", "cpu"), ("cuda", "cuda:0"), ("cuda:1", "cuda"), ("cpu", "meta")]:
        assert our_modeling.check_device_same(
            torch.device(a), torch.device(b)
        ) == ref_modeling.check_device_same(torch.device(a), torch.device(b))


def test_align_module_device_and_has_offloaded_params():
    from accel_nb import cpu_offload

    model = nn.Sequential(nn.Linear(3, 3), nn.ReLU(), nn.Linear(3, 2))
    expected = model[0].weight.detach().clone()
    assert not our_modeling.has_offloaded_params(model[0])
    cpu_offload(model, execution_device="cpu")
    assert our_modeling.has_offloaded_params(model[0])
    assert model[0].weight.device.type == "meta"
    with our_modeling.align_module_device(model[0]):
        assert torch.equal(model[0].weight.detach().cpu(), expected)
    assert model[0].weight.device.type == "meta"
    plain = nn.Linear(2, 2)
    weight = plain.weight
    with our_modeling.align_module_device(plain), ref_modeling.align_module_device(plain):
        assert plain.weight is weight  # nothing offloaded, no device asked: nothing moves
    with our_modeling.align_module_device(plain, execution_device="cpu"):
        assert plain.weight.device.type == "cpu" and torch.equal(plain.weight, weight)


def test_align_device_hook_offload_side_by_side():
    from accelerate.hooks import AlignDevicesHook as RefHook
    from accelerate.hooks import add_hook_to_module as ref_add

    from accel_nb.hooks import AlignDevicesHook, add_hook_to_module

    for add, hook_cls, has, align in (
        (
            add_hook_to_module,
            AlignDevicesHook,
            our_modeling.has_offloaded_params,
            our_modeling.align_module_device,
        ),
        (ref_add, RefHook, ref_modeling.has_offloaded_params, ref_modeling.align_module_device),
    ):
        layer = nn.Linear(2, 2)
        value = layer.weight.detach().clone()
        add(layer, hook_cls(execution_device="cpu", offload=True, weights_map=layer.state_dict()))
        assert has(layer) and layer.weight.device.type == "meta"
        with align(layer):
            assert torch.equal(layer.weight.detach(), value)
        assert layer.weight.device.type == "meta"


# -- environment, other, imports, versions --------------------------------------------------------
def test_purge_accelerate_environment_on_a_test_class_and_its_subclass():
    os.environ.pop("ACCELERATE_H33_PROBE", None)
    for decorator in (ours.purge_accelerate_environment, ref.purge_accelerate_environment):

        @decorator
        class Base(unittest.TestCase):
            def test_sets(self):
                os.environ["ACCELERATE_H33_PROBE"] = "1"

        class Child(Base):
            def test_child_sets(self):
                os.environ["ACCELERATE_H33_PROBE"] = "2"

        result = unittest.TestResult()
        unittest.defaultTestLoader.loadTestsFromTestCase(Child).run(result)
        assert result.wasSuccessful() and result.testsRun == 2
        assert "ACCELERATE_H33_PROBE" not in os.environ

    os.environ["ACCELERATE_H33_PROBE"] = "keep"
    try:

        @ours.purge_accelerate_environment
        def change():
            os.environ["ACCELERATE_H33_PROBE"] = "changed"
            return 5

        assert change() == 5 and os.environ["ACCELERATE_H33_PROBE"] == "keep"
    finally:
        del os.environ["ACCELERATE_H33_PROBE"]


def test_env_parsing_helpers(monkeypatch, caplog):
    for value in ("YES", "off", "1", "maybe"):
        assert _outcome(ours.str_to_bool, value) == _outcome(ref.str_to_bool, value)
        assert _outcome(ours.str_to_bool, value, True) == _outcome(ref.str_to_bool, value, True)
    monkeypatch.setenv("H33_FLAG", "true")
    monkeypatch.setenv("H33_INT", "3")
    assert ours.parse_flag_from_env("H33_FLAG") == ref.parse_flag_from_env("H33_FLAG") is True
    assert ours.parse_flag_from_env("H33_NONE", True) == ref.parse_flag_from_env("H33_NONE", True)
    assert ours.parse_choice_from_env("H33_NONE", "fp16") == ref.parse_choice_from_env("H33_NONE", "fp16")
    assert (
        ours.get_int_from_env(["H33_NONE", "H33_INT"], 9)
        == ref.get_int_from_env(["H33_NONE", "H33_INT"], 9)
        == 3
    )
    env = {"GOOD": "1", "BAD": "a b", "EMPTY": "", "X<": "2"}
    with caplog.at_level(logging.WARNING):
        assert (
            ours.convert_dict_to_env_variables(env) == ref.convert_dict_to_env_variables(env) == ["GOOD=1\n"]
        )
    assert sum("Skipping BAD=a b" in r.getMessage() for r in caplog.records) == 2


@pytest.mark.parametrize("release, warns", [("6.8.0-45-generic", False), ("5.4.0-150-generic", True)])
def test_check_os_kernel_warns_like_the_reference(monkeypatch, caplog, release, warns):
    real = platform.uname()
    monkeypatch.setattr(platform, "uname", lambda: real._replace(system="Linux", release=release))
    from accelerate import PartialState as RefPartialState

    from accel_nb import PartialState

    PartialState()
    RefPartialState()  # the reference's logger refuses to log before its state exists
    records = []
    for fn in (ours.check_os_kernel, ref.check_os_kernel):
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            fn()
        records.append([r.getMessage() for r in caplog.records if "kernel version" in r.getMessage()])
    assert len(records[0]) == len(records[1]) == int(warns)
    assert all(theirs in mine for mine, theirs in zip(records[0], records[1]))  # accel_nb may prefix the rank


def test_save_and_small_helpers(tmp_path):
    state = collections.OrderedDict(a=torch.arange(4.0), b=torch.ones(2))
    state["c"] = state["a"]  # shared storage: kept once for safetensors
    ours.save(state, tmp_path / "ours.safetensors", safe_serialization=True)
    ref.save(state, tmp_path / "ref.safetensors", safe_serialization=True)
    from safetensors.torch import load_file

    assert _same(load_file(tmp_path / "ours.safetensors"), load_file(tmp_path / "ref.safetensors"))
    ours.save({"x": torch.ones(1)}, tmp_path / "ours.pt")
    assert _same(ours.load(tmp_path / "ours.pt"), ref.load(tmp_path / "ours.pt"))
    assert ours.merge_dicts({"a": {"b": 1}, "c": 2}, {"a": {"d": 3}}) == ref.merge_dicts(
        {"a": {"b": 1}, "c": 2}, {"a": {"d": 3}}
    )
    for size in (10, 2048, 5 * 2**30, 3 * 2**50):
        assert ours.convert_bytes(size) == ref.convert_bytes(size)
    for obj in (Tiny, Tiny(), len, 3):
        assert ours.get_pretty_name(obj) == ref.get_pretty_name(obj)
    model = Tiny()
    assert ours.recursive_getattr(model, "block.0.weight") is ref.recursive_getattr(model, "block.0.weight")
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:  # a port we hold: in use for both
        server.bind(("localhost", 0))
        server.listen(1)
        port = server.getsockname()[1]
        assert ours.is_port_in_use(port) is True and ref.is_port_in_use(port) is True
    assert 0 < ours.get_free_port() < 65536


def test_save_warns_about_a_removed_shared_tensor_like_the_reference(tmp_path, caplog):
    """Issue 38, item 12: safe_serialization drops the second name of a shared storage with the reference's
    logged warning (one WARNING record, 'Removed shared tensor {names}')."""
    from accelerate import PartialState as RefPartialState

    from accel_nb import PartialState

    PartialState()
    RefPartialState()  # the reference's logger refuses to log before its state exists
    lin = nn.Linear(2, 2)
    state = collections.OrderedDict(a=lin.weight, b=lin.bias)
    state["tied"] = lin.weight
    messages = []
    for lib in (ours, ref):
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            lib.save(state, tmp_path / f"{lib.__name__}.safetensors", safe_serialization=True)
        records = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert len(records) == 1, [r.getMessage() for r in records]
        messages.append(records[0].getMessage())
    assert all("Removed shared tensor {'tied'} while saving" in m for m in messages), messages
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        ours.save(
            collections.OrderedDict(a=torch.ones(2)), tmp_path / "plain.safetensors", safe_serialization=True
        )
    assert not caplog.records


@pytest.mark.parametrize("library", ["accel_nb", "accelerate"])
def test_error_texts_code_matches_on_are_the_references(library):
    """Issue 38, item 21: the words the reference's tests match with pytest.raises(match=...) come first in
    accel_nb's errors too (its own guidance may follow)."""
    import importlib
    import re

    from torch.utils.data import BatchSampler, SequentialSampler

    lib = importlib.import_module(library)
    utils = importlib.import_module(f"{library}.utils")
    data_loader = importlib.import_module(f"{library}.data_loader")
    accelerator = lib.Accelerator(cpu=True)
    with pytest.raises(ValueError, match="must include a `state_dict` and `load_state_dict`") as err:
        accelerator.register_for_checkpointing(torch.ones(1), torch.ones(2), nn.Linear(1, 1))
    assert "Item at index 0" in str(err.value) and "Item at index 1" in str(err.value)
    assert "Item at index 2" not in str(err.value)
    sampler = BatchSampler(SequentialSampler(range(10)), batch_size=3, drop_last=False)
    with pytest.raises(ValueError, match=re.escape("the batch size (3) needs to be a round multiple of the")):
        data_loader.BatchSamplerShard(sampler, num_processes=2, split_batches=True)
    with pytest.raises(ValueError, match="round multiple of the number of processes"):
        data_loader.IterableDatasetShard(range(10), batch_size=3, num_processes=2, split_batches=True)
    with pytest.raises(
        TypeError, match=r"Unsupported types \(<class 'int'>\) passed to `len`.*is_torch_tensor"
    ):
        utils.recursively_apply(len, {"a": 1}, error_on_other_type=True)
    with pytest.raises(
        ValueError, match=r"Trying to set a tensor of shape torch.Size\(\[3, 3\]\) in \"weight\""
    ):
        utils.set_module_tensor_to_device(nn.Linear(2, 2), "weight", "cpu", value=torch.zeros(3, 3))
    state_module = importlib.import_module(f"{library}.state")
    for cls in (state_module.PartialState, state_module.AcceleratorState):
        lib.Accelerator(cpu=True)  # the reference's AcceleratorState() needs one first
        state = cls()
        assert state.num_processes > 0
        with pytest.raises(AttributeError, match="object has no attribute") as err:
            state.someotherthing  # noqa: B018
        assert "_reset_state()" not in str(err.value)
        cls._reset_state()
        with pytest.raises(
            AttributeError, match=f"`{cls.__name__}` object has no attribute `num_processes`"
        ) as err:
            state.num_processes  # noqa: B018
        assert f"This happens if `{cls.__name__}._reset_state()`" in str(err.value)
        state.someotherthing = "MyValue"
        assert state.someotherthing == "MyValue"
        state_module.AcceleratorState._reset_state(reset_partial_state=True)


def test_availability_checks_agree_with_the_reference():
    import accelerate.utils.imports as ref_imports

    import accel_nb.utils.imports as our_imports

    for name in our_imports.__all__:
        if name == "torchao_required":  # a decorator, not a check
            continue
        assert bool(getattr(our_imports, name)()) == bool(getattr(ref_imports, name)()), name
    for op, version in ((">=", "2.0"), ("<", "1.0"), ("==", "2.13.0")):
        assert ours.is_torch_version(op, version) == ref.is_torch_version(op, version)
        assert ours.compare_versions("numpy", op, version) == ref.compare_versions("numpy", op, version)
    with pytest.raises(ValueError):
        ours.compare_versions("torch", "~=", "2.0")


def test_constants_match_the_reference():
    import accelerate.utils.constants as ref_constants

    import accel_nb.utils.constants as our_constants

    for name in our_constants.__all__:
        assert getattr(our_constants, name) == getattr(ref_constants, name), name
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert ours.SAFE_WEIGHTS_NAME == "model.safetensors"


# -- offload folder format --------------------------------------------------------------------------
def test_offload_folders_are_readable_by_the_other_library(tmp_path):
    import accelerate.utils.offload as ref_offload

    import accel_nb.utils.offload as our_offload

    state = {
        "a.weight": torch.randn(3, 4),
        "a.bias": torch.randn(4).to(torch.bfloat16),
        "b.scale": torch.tensor(2.5),
        "b.count": torch.arange(5),
        "c.f8": torch.randn(4).to(torch.float8_e4m3fn),
    }
    our_offload.offload_state_dict(tmp_path / "ours", state)
    ref_offload.offload_state_dict(tmp_path / "ref", state)
    ours_index = (tmp_path / "ours" / "index.json").read_text()
    assert ours_index == (tmp_path / "ref" / "index.json").read_text()
    for name in state:
        assert (tmp_path / "ours" / f"{name}.dat").read_bytes() == (
            tmp_path / "ref" / f"{name}.dat"
        ).read_bytes()
    for folder in ("ours", "ref"):
        mine = our_offload.OffloadedWeightsLoader(save_folder=tmp_path / folder)
        theirs = ref_offload.OffloadedWeightsLoader(save_folder=tmp_path / folder)
        assert list(mine) == list(theirs)
        for name, value in state.items():
            assert mine[name].dtype == theirs[name].dtype == value.dtype
            assert torch.equal(
                mine[name].reshape(-1).view(torch.uint8), theirs[name].reshape(-1).view(torch.uint8)
            )
    merged = our_offload.OffloadedWeightsLoader(
        state_dict={"x": torch.ones(1)}, save_folder=tmp_path / "ours"
    )
    assert list(merged)[0] == "x" and len(merged) == len(state) + 1
    view, ref_view = our_offload.PrefixedDataset(merged, "a."), ref_offload.PrefixedDataset(merged, "a.")
    assert list(view) == list(ref_view) and len(view) == len(ref_view)
    assert torch.equal(view["weight"], ref_view["weight"])
    with pytest.raises(ValueError, match="Need either"):
        our_offload.OffloadedWeightsLoader()
    sd = {"h.1.w": 1, "h.10.w": 2, "h.1": 3, "g.w": 4}
    assert our_offload.extract_submodules_state_dict(
        sd, ["h.1", "g"]
    ) == ref_offload.extract_submodules_state_dict(sd, ["h.1", "g"])


def test_an_offload_folder_feeds_an_align_devices_hook(tmp_path):
    from accel_nb.hooks import AlignDevicesHook, add_hook_to_module
    from accel_nb.utils.offload import OffloadedWeightsLoader, PrefixedDataset, offload_state_dict

    model = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 2))
    x = torch.randn(4, 3)
    expected = model(x)
    offload_state_dict(tmp_path, model.state_dict())
    weights = OffloadedWeightsLoader(save_folder=tmp_path)
    for i, layer in enumerate(model):
        add_hook_to_module(
            layer,
            AlignDevicesHook(
                execution_device="cpu", offload=True, weights_map=PrefixedDataset(weights, f"{i}.")
            ),
        )
    assert model[0].weight.device.type == "meta"
    assert torch.allclose(model(x), expected)


# -- memory ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "exc",
    [
        RuntimeError("CPU out of memory."),
        RuntimeError("CUDA out of memory. Tried to allocate 2 GiB"),
        RuntimeError("XPU out of memory."),
        RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 10 bytes"),
        RuntimeError("FATAL ERROR :: MODULE:PT_DEVMEM Allocation failed"),
        RuntimeError("some other error"),
        ValueError("CPU out of memory."),
        RuntimeError("out of memory.", "two args"),
    ],
    ids=lambda e: f"{type(e).__name__}:{e.args[0][:20]}",
)
def test_should_reduce_batch_size_matches_the_reference(exc):
    import accelerate.utils.memory as ref_memory

    import accel_nb.utils.memory as our_memory

    assert our_memory.should_reduce_batch_size(exc) == ref_memory.should_reduce_batch_size(exc)


def test_find_executable_batch_size_retries_on_cpu_oom_and_fails_at_zero_like_the_reference():
    import accelerate.utils.memory as ref_memory

    import accel_nb.utils.memory as our_memory

    for module in (our_memory, ref_memory):
        tried = []

        @module.find_executable_batch_size(starting_batch_size=8)
        def train(batch_size):
            tried.append(batch_size)  # noqa: B023 (called within this iteration)
            if batch_size > 5:
                raise RuntimeError("CPU out of memory.")
            return batch_size

        assert train() == 5 and tried == [8, 7, 6, 5]

        @module.find_executable_batch_size(starting_batch_size=0)
        def never(batch_size):
            raise AssertionError("not called")

        with pytest.raises(RuntimeError, match="No executable batch size found, reached zero"):
            never()


# -- module tree ------------------------------------------------------------------------------------
class Stack(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(5, 4)
        self.layers = nn.ModuleList([nn.Sequential(nn.Linear(4, 4), nn.ReLU()) for _ in range(3)])
        self.mixed = nn.ModuleList([nn.Linear(4, 4), nn.ReLU()])
        self.head = nn.Linear(4, 5, bias=False)
        self.head.weight = self.embed.weight


def test_module_tree_helpers_match_the_reference(caplog):
    import accelerate.utils.dataclasses as ref_dataclasses
    import accelerate.utils.other as ref_other

    import accel_nb.utils.dataclasses as our_dataclasses
    import accel_nb.utils.other as our_other

    model = Stack()
    for name in ("Sequential", "ReLU", "Stack", "Missing"):
        assert our_dataclasses.get_module_class_from_name(
            model, name
        ) is ref_dataclasses.get_module_class_from_name(model, name)
    for fqns in (False, True):
        mine = our_other.get_module_children_bottom_up(model, return_fqns=fqns)
        theirs = ref_other.get_module_children_bottom_up(model, return_fqns=fqns)
        assert len(mine) == len(theirs) and all(
            (a[0] == b[0] and a[1] is b[1]) if fqns else a is b for a, b in zip(mine, theirs)
        )
    for module in (model, model.layers, model.mixed, model.head, nn.ModuleList()):
        assert our_other.is_repeated_blocks(module) == ref_other.is_repeated_blocks(module)
        assert our_other.has_repeated_blocks(module) == ref_other.has_repeated_blocks(module)
    sizes = ref_modeling.compute_module_sizes(model)
    named = list(model.named_children())
    for no_split in ([], ["Sequential"], ["ModuleList"]):
        assert our_modeling.get_max_layer_size(named, sizes, no_split) == ref_modeling.get_max_layer_size(
            named, sizes, no_split
        )
    # no peft here
    assert our_modeling.is_peft_model(model) is False and not ref_modeling.is_peft_model(model)
    ties = [["embed.weight", "head.weight"]]
    for device_map in ({"embed": 0, "layers": 0, "mixed": 0, "head": "cpu"}, {"": 0}):
        messages = []
        for fn in (
            our_modeling.check_tied_parameters_on_same_device,
            ref_modeling.check_tied_parameters_on_same_device,
        ):
            caplog.clear()
            with caplog.at_level(logging.WARNING):
                fn(ties, device_map)
            messages.append([r.getMessage() for r in caplog.records if "Tied parameters" in r.getMessage()])
        assert messages[0] == messages[1]
        assert bool(messages[0]) == ("head" in device_map)


def test_tqdm_and_offload_readers_match_the_reference(tmp_path):
    import accelerate.utils.modeling as ref_m
    from accelerate import PartialState as RefPartialState
    from accelerate.utils.tqdm import tqdm as ref_tqdm

    import accel_nb.utils.modeling as our_m
    from accel_nb import PartialState
    from accel_nb.utils.offload import offload_state_dict
    from accel_nb.utils.tqdm import tqdm

    PartialState()
    RefPartialState()
    for fn in (tqdm, ref_tqdm):
        bar = fn(range(3))
        assert bar.disable is False and list(bar) == [0, 1, 2]  # process 0 shows it (closing disables it)
        assert fn(range(3), disable=True).disable is True
        with pytest.raises(ValueError, match="main_process_only"):
            fn(True, range(3))
    torch.manual_seed(0)
    source = Tiny()
    offload_state_dict(tmp_path, source.state_dict())
    import json

    index = json.loads((tmp_path / "index.json").read_text())
    loaded = []
    for fn in (our_m.load_offloaded_weights, ref_m.load_offloaded_weights):
        torch.manual_seed(1)
        target = Tiny()
        fn(target, index, str(tmp_path))
        loaded.append(target.state_dict())
    assert _same(loaded[0], loaded[1]) and _same(loaded[0], source.state_dict())
    model = Tiny()
    model._no_split_modules = ["Sequential"]
    assert our_m.calculate_maximum_sizes(model) == ref_m.calculate_maximum_sizes(model)

    import accelerate.hooks as ref_hooks

    import accel_nb.hooks as our_hooks

    for fn, hooks in (
        (our_m.get_state_dict_from_offload, our_hooks),
        (ref_m.get_state_dict_from_offload, ref_hooks),
    ):
        layer = nn.Linear(2, 2)
        expected = {f"block.{k}": v.clone() for k, v in layer.state_dict().items()}
        hooks.add_hook_to_module(
            layer,
            hooks.AlignDevicesHook(execution_device="cpu", offload=True, weights_map=layer.state_dict()),
        )
        assert layer.weight.device.type == "meta"
        state = {"block.weight": "placeholder", "block.bias": "placeholder", "other": 1}
        out = fn(layer, "block.weight", state)
        assert out is state and state["other"] == 1
        assert _same({k: state[k] for k in expected}, expected)


def test_check_tied_parameters_in_config_matches_the_reference():
    transformers = pytest.importorskip("transformers")

    import accel_nb.utils.modeling as our_m

    config = dict(vocab_size=32, n_positions=16, n_embd=8, n_layer=1, n_head=2)
    models = [
        transformers.GPT2LMHeadModel(transformers.GPT2Config(**config)),
        transformers.GPT2LMHeadModel(transformers.GPT2Config(**config, tie_word_embeddings=False)),
        transformers.GPT2Model(transformers.GPT2Config(**config)),
        Tiny(),
    ]
    for model in models:
        assert our_m.check_tied_parameters_in_config(model) == ref_modeling.check_tied_parameters_in_config(
            model
        )
