"""The hooks API and the modeling helpers behave like the reference's, side by side on CPU."""

from __future__ import annotations

import copy
import importlib
import inspect
import json
import os

import pytest
import torch
from torch import nn

pytest.importorskip("accelerate")

LIBRARIES = ["accel_nb", "accelerate"]


def _hooks(library):
    return importlib.import_module(f"{library}.hooks")


def _utils(library):
    return importlib.import_module(f"{library}.utils")


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a = nn.Linear(4, 6)
        self.b = nn.Linear(6, 3)
        self.register_buffer("scale", torch.full((3,), 2.0))
        self.register_buffer("scratch", torch.zeros(1), persistent=False)

    def forward(self, x, shift=0.0):
        return self.b(torch.relu(self.a(x))) * self.scale + shift


def _recording_hook(library, log, tag):
    class Record(_hooks(library).ModelHook):
        def init_hook(self, module):
            log.append(f"init {tag}")
            return module

        def pre_forward(self, module, *args, **kwargs):
            log.append(f"pre {tag}")
            return (args[0] + 1,), kwargs

        def post_forward(self, module, output):
            log.append(f"post {tag}")
            return output * 10

        def detach_hook(self, module):
            log.append(f"detach {tag}")
            return module

    return Record()


def _run_hook_story(library):
    hooks = _hooks(library)
    x = torch.linspace(-1, 1, 8).reshape(2, 4)
    model = Net()
    plain = model(x)
    log = []
    hooks.add_hook_to_module(model, _recording_hook(library, log, "A"))
    once = model(x)
    hooks.add_hook_to_module(model, _recording_hook(library, log, "B"), append=True)
    twice = model(x)
    signature = str(inspect.signature(model.forward))
    copied = copy.deepcopy(model)
    with torch.no_grad():
        copied.b.bias.add_(1.0)
    copy_differs = not torch.equal(copied(x), model(x))
    hooks.remove_hook_from_module(model)
    after = model(x)
    return {
        "once": torch.allclose(once, model.b(torch.relu(model.a(x + 1))) * model.scale * 10),
        "twice": torch.allclose(twice, (model.b(torch.relu(model.a(x + 2))) * model.scale) * 100),
        "restored": torch.equal(after, plain),
        "hooked": hasattr(model, "_hf_hook") or hasattr(model, "_old_forward"),
        "log": log,
        "signature": signature,
        "copy_differs": copy_differs,
    }


def test_model_hooks_run_chain_and_detach_like_the_reference():
    ours, theirs = (_run_hook_story(lib) for lib in LIBRARIES)
    assert ours == theirs, f"accel_nb {ours}\nreference {theirs}"
    assert ours["once"] and ours["twice"] and ours["restored"] and not ours["hooked"]
    assert "shift" in ours["signature"]  # libraries read the user's forward signature through the hook


@pytest.mark.parametrize("library", LIBRARIES)
def test_align_devices_hook_offloads_weights_between_calls(library):
    hooks = _hooks(library)
    x = torch.randn(3, 4)
    model = Net()
    expected = model(x)
    state = {k: v.clone() for k, v in model.a.state_dict().items()}
    hooks.add_hook_to_module(
        model.a, hooks.AlignDevicesHook(execution_device="cpu", offload=True, io_same_device=True)
    )
    assert model.a.weight.device.type == "meta" and model.a.bias.device.type == "meta"
    assert torch.allclose(model(x), expected)
    assert model.a.weight.device.type == "meta"  # back off the module after the call
    hooks.remove_hook_from_module(model.a)
    assert model.a.weight.device.type == "cpu"
    assert torch.equal(model.a.weight, state["weight"]) and torch.allclose(model(x), expected)


def test_attach_align_device_hook_with_a_weights_map_matches_the_reference():
    outputs = []
    for library in LIBRARIES:
        hooks = _hooks(library)
        x = torch.randn(3, 4)
        model = Net()
        weights = {k: v.clone() for k, v in model.state_dict().items()}
        hooks.attach_align_device_hook(model, execution_device="cpu", offload=True, weights_map=weights)
        metas = sorted(n for n, p in model.named_parameters() if p.device.type == "meta")
        outputs.append((metas, model(x)))
        hooks.remove_hook_from_submodules(model)
        hooks.remove_hook_from_module(model)
    (ours_meta, ours_out), (ref_meta, ref_out) = outputs
    assert ours_meta == ref_meta == ["a.bias", "a.weight", "b.bias", "b.weight"]
    assert torch.allclose(ours_out, ref_out)


@pytest.mark.parametrize("library", LIBRARIES)
def test_attach_align_device_hook_offloads_without_an_execution_device(library):
    """Issue 38, item 11: offload=True without execution_device is accepted (the reference keeps the
    weights in a CPU weights map and puts meta tensors on the module); removing the hooks gives them back.
    accel_nb's forward brings each weight back to where it was (the reference's forward fails there)."""
    hooks = _hooks(library)
    utils = _utils(library)
    x = torch.randn(3, 4)
    model = Net()
    expected = model(x)
    hooks.attach_align_device_hook(model, offload=True)
    assert utils.has_offloaded_params(model.a)
    assert {n: p.device.type for n, p in model.named_parameters()} == dict.fromkeys(
        ["a.weight", "a.bias", "b.weight", "b.bias"], "meta"
    )
    assert model.scale.device.type == "cpu"
    if library == "accel_nb":
        assert torch.allclose(model(x), expected)
        assert model.a.weight.device.type == "meta"
    hooks.remove_hook_from_submodules(model)
    hooks.remove_hook_from_module(model)
    assert all(p.device.type == "cpu" for p in model.parameters())
    assert torch.allclose(model(x), expected)


def test_cpu_offload_with_hook_offloads_the_previous_model_when_the_next_runs():
    from accel_nb.big_modeling import cpu_offload_with_hook as offload_with_hook

    first, second = nn.Linear(4, 4), nn.Linear(4, 2)
    x = torch.randn(2, 4)
    expected = second(first(x))
    first, hook_1 = offload_with_hook(first, "cpu")
    second, hook_2 = offload_with_hook(second, "cpu", prev_module_hook=hook_1)
    offloaded = []
    original = hook_1.offload
    hook_1.offload = lambda: (offloaded.append("first"), original())[1]
    assert torch.allclose(second(first(x)), expected)
    assert offloaded == ["first"]  # the chain: running the second model sent the first back
    hook_2.offload()
    hook_2.remove()
    assert not hasattr(second, "_hf_hook")


# -- modeling helpers ---------------------------------------------------------------------------------
def _meta_linear():
    with torch.device("meta"):
        return nn.Linear(3, 2)


@pytest.mark.parametrize("library", LIBRARIES)
def test_set_module_tensor_to_device_materialises_and_casts(library):
    set_tensor = _utils(library).set_module_tensor_to_device
    model = nn.Sequential(_meta_linear())
    model[0].weight.requires_grad_(False)
    set_tensor(model, "0.weight", "cpu", value=torch.ones(2, 3, dtype=torch.float64))
    weight = model[0].weight
    assert isinstance(weight, nn.Parameter) and weight.dtype == torch.float32 and not weight.requires_grad
    assert torch.equal(weight, torch.ones(2, 3))
    set_tensor(model, "0.bias", "cpu", value=torch.arange(2.0), dtype=torch.float16)
    assert model[0].bias.dtype == torch.float16
    with pytest.raises(ValueError):
        set_tensor(model, "0.nothing", "cpu", value=torch.ones(1))
    with pytest.raises(ValueError):
        set_tensor(model, "0.weight", "cpu", value=torch.ones(5))
    fresh = nn.Sequential(_meta_linear())
    with pytest.raises(ValueError):
        set_tensor(fresh, "0.weight", "cpu")  # meta and no value: nothing to put there


@pytest.mark.parametrize(
    "old, value, dtype",
    [
        (torch.float32, torch.float16, None),
        (torch.float16, torch.float32, torch.bfloat16),
        (torch.int64, torch.int32, None),
        (torch.float32, torch.int64, None),
        (torch.bool, torch.int64, None),
        (torch.float32, torch.float64, torch.int32),
        (torch.float32, torch.int64, torch.float16),
    ],
)
def test_set_module_tensor_to_device_dtypes_match_the_reference(old, value, dtype):
    results = []
    for library in LIBRARIES:
        module = nn.Module()
        module.register_buffer("t", torch.zeros(2, dtype=old))
        _utils(library).set_module_tensor_to_device(
            module, "t", "cpu", value=torch.ones(2, dtype=value), dtype=dtype
        )
        results.append(module.t.dtype)
    assert results[0] == results[1]


def test_find_tied_parameters_and_named_module_tensors_match_the_reference():
    model = Net()
    model.b.weight = nn.Parameter(torch.zeros(3, 6))
    model.extra = nn.Linear(6, 3)
    model.extra.weight = model.b.weight
    results = []
    for library in LIBRARIES:
        utils = _utils(library)
        listing = {
            (buffers, recurse, persistent): [
                n for n, _ in utils.named_module_tensors(model, buffers, recurse, persistent)
            ]
            for buffers in (True, False)
            for recurse in (True, False)
            for persistent in (True, False)
        }
        results.append((utils.find_tied_parameters(model), listing))
    assert results[0] == results[1]
    assert results[0][0] == [["b.weight", "extra.weight"]]


@pytest.mark.parametrize("device_map", [None, {"a": "cpu", "b": "cpu", "scale": "cpu"}])
def test_load_state_dict_reads_safetensors_like_the_reference(tmp_path, device_map):
    from safetensors.torch import save_file

    state = {k: v.contiguous() for k, v in Net().state_dict().items()}
    path = str(tmp_path / "model.safetensors")
    save_file(state, path)
    ours = _utils("accel_nb").load_state_dict(path, device_map=device_map)
    theirs = _utils("accelerate").load_state_dict(path, device_map=device_map)
    assert sorted(ours) == sorted(theirs) == sorted(state)
    assert all(torch.equal(ours[k], theirs[k]) for k in state)


def test_load_state_dict_of_a_pickle_reads_it_as_the_reference_does(tmp_path):
    from accel_nb.utils import load_state_dict

    path = str(tmp_path / "pytorch_model.bin")
    torch.save(Net().state_dict(), path)
    ours = load_state_dict(path)
    theirs = _utils("accelerate").load_state_dict(path)
    assert sorted(ours) == sorted(theirs) and all(torch.equal(ours[k], theirs[k]) for k in theirs)
    with pytest.raises(ValueError, match="allow_pickle=False refuses pickle files"):
        load_state_dict(path, allow_pickle=False)


def _pickle_shards(folder) -> None:
    """The reference's own sharded pickle layout: one .bin per module and a bare {name: file} index."""
    state = Net().state_dict()
    files = {"a": "part1.bin", "b": "part2.bin", "scale": "part2.bin"}
    index = {name: files[name.split(".")[0]] for name in state}
    with open(os.path.join(folder, "weight_map.index.json"), "w") as f:
        json.dump(index, f)
    for fname in set(files.values()):
        torch.save({k: v for k, v in state.items() if index[k] == fname}, os.path.join(folder, fname))


def test_load_checkpoint_in_model_of_pickle_shards_and_unexpected_keys_as_the_reference(tmp_path, caplog):
    _pickle_shards(tmp_path)
    want = Net().state_dict()
    for library in ("accel_nb", "accelerate"):
        for target in (str(tmp_path / "weight_map.index.json"), str(tmp_path)):  # the index, or its folder
            model = Net()
            with torch.no_grad():
                for p in model.parameters():
                    p.zero_()
            _utils(library).load_checkpoint_in_model(model, target)
            assert all(torch.equal(model.state_dict()[k], v) for k, v in want.items()), (library, target)
    # a tensor the model does not have: both log the same words (test suites match on them), strict raises
    extra = str(tmp_path / "extra.pt")
    torch.save(dict(want, foo=torch.zeros(2)), extra)
    for library in ("accel_nb", "accelerate"):
        caplog.clear()
        with caplog.at_level("WARNING"):
            _utils(library).load_checkpoint_in_model(Net(), extra)
        assert "were not used when initializing Net" in caplog.text and "foo" in caplog.text, library
        with pytest.raises((ValueError, RuntimeError)):
            _utils(library).load_checkpoint_in_model(Net(), extra, strict=True)


@pytest.mark.parametrize("whole_model", [False, True])
def test_get_state_dict_offloaded_model_reads_accel_nb_disk_offload(tmp_path, whole_model):
    from accel_nb import disk_offload, dispatch_model
    from accel_nb.utils import get_state_dict_offloaded_model

    expected = Net().state_dict()
    model = Net()
    if whole_model:
        disk_offload(model, str(tmp_path / "offload"), execution_device="cpu")
    else:
        device_map = {"a": "disk", "b": "cpu", "scale": "cpu", "scratch": "cpu"}
        dispatch_model(model, device_map, offload_dir=str(tmp_path / "offload"))
    assert model.a.weight.device.type == "meta"  # really held off the module between forwards
    state = get_state_dict_offloaded_model(model)
    assert list(state) == list(expected)
    assert all(torch.equal(state[k], expected[k]) for k in expected)


def test_get_state_dict_offloaded_model_matches_the_reference_on_hooked_models():
    results = []
    for library in LIBRARIES:
        model = Net()
        hooks = _hooks(library)
        hooks.add_hook_to_module(model.a, hooks.AlignDevicesHook(execution_device="cpu", offload=True))
        assert model.a.weight.device.type == "meta"
        results.append(
            _utils(library).get_state_dict_offloaded_model(model)
            if library == "accel_nb"
            else importlib.import_module("accelerate.utils.modeling").get_state_dict_offloaded_model(model)
        )
    ours, theirs = results
    assert all(torch.equal(ours[k], theirs[k]) for k in theirs)
    # the reference leaves out tensors held by the root module itself ('scale'); accel_nb returns them all
    assert list(ours) == list(Net().state_dict()) and set(ours) - set(theirs) == {"scale"}


@pytest.mark.gpu
@pytest.mark.parametrize("library", LIBRARIES)
def test_cpu_offload_with_hook_moves_models_between_cpu_and_gpu(library):
    offload_with_hook = importlib.import_module(f"{library}.big_modeling").cpu_offload_with_hook
    first, second = nn.Linear(4, 4), nn.Linear(4, 2)
    x = torch.randn(2, 4)
    expected = second(first(x))
    first, hook_1 = offload_with_hook(first, "cuda:0")
    second, hook_2 = offload_with_hook(second, "cuda:0", prev_module_hook=hook_1)
    assert first.weight.device.type == "cpu" and second.weight.device.type == "cpu"
    hidden = first(x)
    assert first.weight.device.type == "cuda"  # stays on the GPU after its forward
    out = second(hidden)
    assert first.weight.device.type == "cpu" and second.weight.device.type == "cuda"
    hook_2.offload()
    assert second.weight.device.type == "cpu"
    assert torch.allclose(out.cpu(), expected, atol=1e-5)
