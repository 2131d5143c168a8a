"""Big-model keywords and names code written for the reference uses, side by side with the reference."""

from __future__ import annotations

import importlib

import pytest
import torch
from torch import nn

pytest.importorskip("accelerate")


@pytest.fixture(autouse=True)
def _reference_state_does_not_leak():
    """The reference's shared state a test makes here must not reach later tests' forked ranks."""
    yield
    import accelerate.state

    accelerate.state.AcceleratorState._reset_state(reset_partial_state=True)
    accelerate.state.GradientState._reset_state()


class ReadsChildWeights(nn.Module):
    """Uses ``inner``'s weights without calling ``inner``: offloading per module leaves them on meta."""

    def __init__(self):
        super().__init__()
        self.inner = nn.Linear(3, 3)
        self.other = nn.Linear(3, 3)

    def forward(self, x):
        return self.other(x @ self.inner.weight.T + self.inner.bias)


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 3), ReadsChildWeights(), nn.Linear(3, 2))


@pytest.mark.parametrize("library", ["accel_nb", "accelerate"])
@pytest.mark.parametrize("kind", ["cpu", "disk"])
def test_preload_module_classes_brings_in_a_whole_subtree(library, kind, tmp_path):
    big_modeling = importlib.import_module(f"{library}.big_modeling")
    x = torch.randn(2, 3)
    expected = _model()(x)

    def offload(model, **kwargs):
        if kind == "cpu":
            return big_modeling.cpu_offload(model, execution_device="cpu", **kwargs)
        return big_modeling.disk_offload(
            model, str(tmp_path / f"off{len(kwargs)}"), execution_device="cpu", **kwargs
        )

    plain = _model()
    offload(plain)
    with pytest.raises(RuntimeError):  # the child's weights are still on the meta device
        plain(x)
    model = _model()
    offload(model, preload_module_classes=["ReadsChildWeights"])
    assert model[1].inner.weight.device.type == "meta"  # between forwards the weights stay off the model
    assert torch.allclose(model(x), expected)
    assert torch.allclose(model(x), expected)  # and again: the unit goes back and comes in again


def test_cpu_offload_refuses_a_state_dict_it_would_not_use():
    from accel_nb.big_modeling import cpu_offload

    with pytest.raises(ValueError, match="load them into the model first"):
        cpu_offload(_model(), execution_device="cpu", state_dict={})


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 8)
        self.norm = nn.LayerNorm(8)
        self.conv = nn.Conv1d(1, 2, 3, padding=1)
        self.block = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 3))
        self.out_norm_proj = nn.Linear(3, 3)

    def forward(self, x):
        h = self.norm(self.proj(x)).unsqueeze(1)
        h = self.conv(h).flatten(1)
        return self.out_norm_proj(self.block(h))


@pytest.mark.parametrize(
    "skip",
    [
        {},
        {"skip_modules_pattern": ["norm"]},
        {"skip_modules_classes": (nn.Sequential,)},
        {"skip_modules_pattern": ["^block"], "skip_modules_classes": (nn.Conv1d,)},
    ],
    ids=["all", "pattern", "class", "both"],
)
def test_layerwise_casting_matches_the_reference(skip):
    import accelerate.big_modeling as ref

    import accel_nb.big_modeling as ours

    x = torch.randn(5, 4)
    results = []
    for module in (ours, ref):
        torch.manual_seed(0)
        net = Net()
        module.attach_layerwise_casting_hooks(net, torch.float8_e4m3fn, torch.float32, **skip)
        stored = {name: p.dtype for name, p in net.named_parameters()}
        out = net(x)
        after = {name: p.dtype for name, p in net.named_parameters()}
        results.append((stored, out, after))
    (stored, out, after), (ref_stored, ref_out, ref_after) = results
    assert stored == ref_stored and after == ref_after == stored
    assert torch.equal(out, ref_out) and out.dtype == torch.float32
    assert stored["norm.weight"] == torch.float32  # a LayerNorm is never cast


def test_layerwise_casting_saves_memory_and_stays_close():
    from accel_nb.big_modeling import attach_layerwise_casting_hooks

    torch.manual_seed(0)
    net = Net()
    x = torch.randn(5, 4)
    full = net(x)
    before = sum(p.numel() * p.element_size() for p in net.parameters())
    attach_layerwise_casting_hooks(net, torch.bfloat16, torch.float32, skip_modules_pattern="norm")
    after = sum(p.numel() * p.element_size() for p in net.parameters())
    assert after < before
    assert net.out_norm_proj.weight.dtype == torch.float32  # one string is one pattern
    assert torch.allclose(net(x), full, atol=0.05)


@pytest.mark.parametrize("library", ["accel_nb", "accelerate"])
@pytest.mark.parametrize("kind", ["cpu", "disk"])
def test_removing_offload_hooks_gives_the_weights_back(library, kind, tmp_path):
    big_modeling = importlib.import_module(f"{library}.big_modeling")
    hooks = importlib.import_module(f"{library}.hooks")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 4), nn.BatchNorm1d(4))
    model[2].weight = nn.Parameter(torch.randn(4, 4))
    model.eval()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    x = torch.randn(2, 3)
    expected = model(x)
    if kind == "cpu":
        big_modeling.cpu_offload(model, execution_device="cpu")
    else:
        big_modeling.disk_offload(model, str(tmp_path), execution_device="cpu")
    assert model[0].weight.device.type == "meta"
    hooks.remove_hook_from_submodules(model)
    for name, value in model.state_dict().items():
        assert value.device.type == "cpu", name
        assert torch.equal(value, state[name]), name
    assert isinstance(model[0].weight, nn.Parameter) and model[0].weight.requires_grad
    assert torch.allclose(model(x), expected)


@pytest.mark.parametrize("library", ["accel_nb", "accelerate"])
def test_a_second_disk_offload_after_removing_the_hooks_writes_the_new_folder(library, tmp_path):
    """Issue 38, item 8: the weights are back in memory after remove_hook_from_submodules, so a second
    disk_offload writes them under its own folder; the first folder may be gone by then."""
    import shutil

    big_modeling = importlib.import_module(f"{library}.big_modeling")
    hooks = importlib.import_module(f"{library}.hooks")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 5)).eval()
    x = torch.randn(2, 3)
    expected = model(x)
    big_modeling.disk_offload(model, str(tmp_path / "first"), execution_device="cpu")
    assert torch.allclose(model(x), expected)
    hooks.remove_hook_from_submodules(model)
    shutil.rmtree(tmp_path / "first")
    big_modeling.disk_offload(model, str(tmp_path / "second"), execution_device="cpu", offload_buffers=True)
    assert torch.allclose(model(x), expected)
    assert any((tmp_path / "second").iterdir())
    hooks.remove_hook_from_submodules(model)
    assert torch.allclose(model(x), expected)


def test_infer_auto_device_map_takes_the_reference_keywords():
    from accelerate.utils import infer_auto_device_map as ref_infer

    from accel_nb.utils.modeling import infer_auto_device_map

    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8))
    budget = {"cpu": 10**6}
    ours = infer_auto_device_map(
        model, budget, clean_result=True, fallback_allocation=False, offload_buffers=False
    )
    theirs = ref_infer(model, budget, clean_result=True, fallback_allocation=False, offload_buffers=False)
    assert dict(ours) == dict(theirs) == {"": "cpu"}
    with pytest.raises(ValueError, match="drop the argument"):
        infer_auto_device_map(model, budget, clean_result=False)


class _ThreeLayers(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear1 = nn.Linear(3, 4)
        self.batchnorm = nn.BatchNorm1d(4)
        self.linear2 = nn.Linear(4, 5)


def _quiet_reference(call):
    import logging

    level = logging.getLogger("accelerate").level
    logging.getLogger("accelerate").setLevel(logging.ERROR)  # "Device 0 is not available" on a CPU machine
    try:
        return dict(call())
    finally:
        logging.getLogger("accelerate").setLevel(level)


@pytest.mark.parametrize(
    "budgets", [{0: 200, 1: 200}, {0: 200, 1: 172, 2: 200}, {0: 10**6}, {0: 150, "cpu": 600}]
)
def test_the_largest_layer_is_kept_free_on_the_first_gpu_and_the_cpu_as_by_the_reference(budgets):
    from accelerate.utils import infer_auto_device_map as ref_infer

    from accel_nb.utils.modeling import infer_auto_device_map

    model = _ThreeLayers()  # linear1 64 B, batchnorm 72 B, linear2 100 B
    ours = infer_auto_device_map(model, budgets, offload_buffers=True)  # no buffers kept on the GPU
    assert dict(ours) == _quiet_reference(lambda: ref_infer(model, budgets, offload_buffers=True))
    if budgets == {0: 200, 1: 200}:  # all fits the GPUs, yet GPU 0 keeps linear2's 100 B free
        assert dict(ours) == {"linear1": 0, "batchnorm": 1, "linear2": 1}


def test_tied_weights_and_merged_entries_match_the_reference():
    from collections import OrderedDict

    from accelerate.utils import infer_auto_device_map as ref_infer

    from accel_nb.big_model.planning.reference_planning import merge_entries
    from accel_nb.utils.modeling import infer_auto_device_map

    model = nn.Sequential(OrderedDict((f"layer{i}", _ThreeLayers()) for i in (1, 2, 3)))
    model.layer3.linear2.weight = model.layer1.linear2.weight
    ours = infer_auto_device_map(model, {0: 400, 1: 500})
    assert dict(ours) == _quiet_reference(lambda: ref_infer(model, {0: 400, 1: 500}))
    assert ours["layer2"] == 1  # split on GPU 0, then whole on GPU 1: one entry, as the reference's clean map
    assert merge_entries({"a.x": 0, "a.y": 0, "b.x.0": 1, "b.x.1": 1, "b.y.0": 2, "b.y.1": 2, "c": 2}) == {
        "a": 0,
        "b.x": 1,
        "b.y": 2,
        "c": 2,
    }


def test_a_budget_without_disk_maps_the_rest_to_disk_as_the_reference_does(caplog):
    """Issue 38, item 9: with no "disk" in max_memory the reference maps what does not fit to "disk"
    anyway; so does accel_nb, with a warning that dispatching those needs an offload folder, and the
    reference's INFO note on devices left empty."""
    import logging

    from accelerate.utils import infer_auto_device_map as ref_infer

    from accel_nb.utils.modeling import infer_auto_device_map

    model = _ThreeLayers()
    level = logging.getLogger("accelerate").level
    logging.getLogger("accelerate").setLevel(logging.ERROR)  # "Device 0 is not available" on a CPU machine
    try:
        assert dict(ref_infer(model, {"cpu": 100})) == {"": "disk"}
    finally:
        logging.getLogger("accelerate").setLevel(level)
    with caplog.at_level(logging.INFO, logger="accel_nb.big_model.planning.device_map"):
        planned = infer_auto_device_map(model, {"cpu": 100})
    assert dict(planned) == {"": "disk"}
    messages = [r.getMessage() for r in caplog.records]
    assert any("insufficient memory" in m and "- cpu:" in m for m in messages), messages
    assert any("mapped to 'disk'" in m and "offload_folder=" in m for m in messages), messages
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="accel_nb.big_model.planning.device_map"):
        budgeted = infer_auto_device_map(model, {"cpu": 100, "disk": 10**6})
    assert dict(budgeted) == {"": "disk"}
    assert not any("mapped to 'disk'" in r.getMessage() for r in caplog.records)  # a disk budget: asked for
    assert "disk" not in infer_auto_device_map(model, {"cpu": 10**6}).plan.budgets  # shown only when used


def test_an_unknown_device_map_key_warns_as_the_reference_does():
    """Issue 38, item 18: the reference warns about a key that names nothing and goes on; so does accel_nb,
    with the reference's words first."""
    import warnings

    from accelerate.utils import check_device_map as ref_check

    from accel_nb.utils.modeling import check_device_map

    model = _ThreeLayers()
    device_map = {"": "cpu", "linear3": "cpu"}
    with pytest.warns(UserWarning, match="device_map keys do not match any submodules"):
        ref_check(model, device_map)
    with pytest.warns(
        UserWarning, match=r"device_map keys do not match any submodules in the model: \['linear3'\]"
    ):
        check_device_map(model, device_map)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # keys naming a parameter or a buffer are known
        check_device_map(
            model, {"linear1": "cpu", "batchnorm": "cpu", "linear2.weight": 0, "linear2.bias": 0}
        )
    with pytest.raises(ValueError, match="unassigned"):  # a module no entry covers is still an error
        check_device_map(model, {"linear1": "cpu"})


class _Block(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.a, self.b = nn.Linear(width, width), nn.Linear(width, width)


class _EmbeddingFirst(nn.Module):
    """The largest layer first (an embedding), then a small layer, then blocks: the shape where an
    empty GPU is what fallback_allocation is for."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(1000, 32)
        self.small = nn.Linear(4, 4)
        self.blocks = nn.ModuleList([_Block(32) for _ in range(3)])


def test_fallback_allocation_fills_the_gpu_the_first_layer_does_not_fit_like_the_reference():
    """The embedding does not fit GPU 0 once room for streaming the largest offloaded layer is kept: without
    fallback_allocation the GPU stays empty in both libraries; with it both put the later small layer there.
    num_buffers=1 makes accel_nb keep one largest layer, the room the reference keeps (accel_nb's default, two
    streaming buffers, keeps more: docs/migration.md)."""
    import logging

    from accelerate.utils import infer_auto_device_map as ref_infer

    from accel_nb.big_model.planning.device_map import device_for
    from accel_nb.big_model.planning.sizes import compute_module_sizes
    from accel_nb.utils.modeling import infer_auto_device_map

    with torch.device("meta"):
        model = _EmbeddingFirst()
    budgets = {0: compute_module_sizes(model)["embed"] + 4000, "cpu": 10**6}
    names = [n for n, _ in model.named_parameters()]
    maps = {}
    level = logging.getLogger("accelerate").level
    logging.getLogger("accelerate").setLevel(logging.ERROR)  # "Device 0 is not available" on a CPU machine
    try:
        for fallback in (False, True):
            theirs = ref_infer(model, dict(budgets), ["_Block"], fallback_allocation=fallback)
            ours = infer_auto_device_map(
                model, dict(budgets), ["_Block"], fallback_allocation=fallback, num_buffers=1
            )
            assert [device_for(ours, n) for n in names] == [device_for(theirs, n) for n in names], (
                ours,
                theirs,
            )
            maps[fallback] = ours
    finally:
        logging.getLogger("accelerate").setLevel(level)
    assert set(maps[False].values()) == {"cpu"}
    assert device_for(maps[True], "small.weight") == 0 and device_for(maps[True], "embed.weight") == "cpu"
    assert "fallback_allocation: 'embed' does not fit GPU 0" in maps[True].plan.explain()
    # a unit that fits nowhere on the device leaves it empty, as without the flag
    tight = {0: 60, "cpu": 10**6}
    assert set(infer_auto_device_map(model, tight, ["_Block"], fallback_allocation=True).values()) == {"cpu"}


_EXISTING = torch.ones(3)


class BuildsTensors(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(2, 2)
        self.register_buffer("pos", torch.arange(4))
        self.from_existing = nn.Parameter(_EXISTING)
        self.made = nn.Parameter(torch.randn(2))
        self.constant = torch.randn(2)


@pytest.mark.parametrize("include_buffers", [False, True])
def test_init_empty_weights_places_tensors_like_the_reference(include_buffers):
    import accelerate

    import accel_nb

    placed = []
    for library in (accel_nb, accelerate):
        with library.init_empty_weights(include_buffers=include_buffers):
            model = BuildsTensors()
        placed.append(
            (
                {k: v.device.type for k, v in model.state_dict().items()},
                model.constant.device.type,
                type(model.made),
            )
        )
    assert placed[0] == placed[1]
    assert placed[0][0]["lin.weight"] == "meta" and placed[0][0]["pos"] == (
        "meta" if include_buffers else "cpu"
    )


class TaggedParameter(nn.Parameter):
    """A parameter class whose constructor takes an attribute (as bitsandbytes' ``Params4bit`` does)."""

    def __new__(cls, data=None, requires_grad=True, tag=None):
        param = super().__new__(cls, data, requires_grad)
        param.tag = tag
        return param


class HoldsSpecialParameters(nn.Module):
    def __init__(self):
        super().__init__()
        tagged = TaggedParameter(torch.ones(2), requires_grad=False, tag="int4")
        tagged._is_hf_initialized = True
        self.tagged = tagged
        self.plain = nn.Parameter(torch.ones(2))
        self.register_buffer("pos", torch.arange(3))


@pytest.mark.parametrize("env", [None, "1", "0"])
def test_init_empty_weights_rebuilds_parameters_and_reads_the_environment_like_the_reference(
    env, monkeypatch
):
    """``include_buffers`` left out reads ACCELERATE_INIT_INCLUDE_BUFFERS; a parameter subclass is rebuilt with
    its attributes as constructor arguments, and ``_is_hf_initialized`` survives, in both libraries."""
    import accelerate

    import accel_nb

    if env is None:
        monkeypatch.delenv("ACCELERATE_INIT_INCLUDE_BUFFERS", raising=False)
    else:
        monkeypatch.setenv("ACCELERATE_INIT_INCLUDE_BUFFERS", env)
    seen = []
    for library in (accel_nb, accelerate):
        for context in (library.init_empty_weights(), library.init_on_device(torch.device("meta"))):
            with context:
                model = HoldsSpecialParameters()
            t = model.tagged
            seen.append(
                (
                    type(t).__name__,
                    t.device.type,
                    t.requires_grad,
                    getattr(t, "tag", None),
                    getattr(t, "_is_hf_initialized", None),
                    model.plain.device.type,
                    model.pos.device.type,
                )
            )
    assert seen[0] == seen[2] and seen[1] == seen[3], seen
    buffers = "meta" if env == "1" else "cpu"
    assert seen[0] == ("TaggedParameter", "meta", False, "int4", True, "meta", buffers)


@pytest.mark.parametrize(
    "layers,budgets,offload_buffers,warns",
    [
        ((16, 5000), {0: 3000, "cpu": 10**6}, False, True),  # 40 kB of buffers offloaded, no GPU has room
        ((16, 5000), {0: 3000, "cpu": 10**6}, True, False),  # they stream with the weights
        ((16, 16, 4), {0: 2676, "cpu": 10**6}, False, False),  # 40 bytes: room on GPU 0
        ((16, 5000), {"cpu": 10**6}, False, False),  # no GPU in the budget
    ],
)
def test_planner_warns_about_offloaded_buffers_in_the_cases_the_reference_does(
    layers, budgets, offload_buffers, warns
):
    """Linear(16, 16) layers, then a BatchNorm1d whose running statistics are buffers."""
    import warnings

    from accelerate.utils import infer_auto_device_map as ref_infer

    from accel_nb.utils.modeling import infer_auto_device_map

    with torch.device("meta"):
        model = nn.Sequential(*[nn.Linear(16, 16) for _ in layers[:-1]], nn.BatchNorm1d(layers[-1]))
    seen = []
    for infer in (infer_auto_device_map, ref_infer):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            infer(model, dict(budgets), offload_buffers=offload_buffers)
        seen.append([str(w.message) for w in caught if "offload_buffers=True" in str(w.message)])
    assert [bool(s) for s in seen] == [warns, warns], seen
    if warns:
        assert "bytes of buffers" in seen[0][0]


def test_planner_logs_untied_weights_that_the_config_ties_like_the_reference(caplog):
    transformers = pytest.importorskip("transformers")
    from accelerate.utils import infer_auto_device_map as ref_infer

    from accel_nb.utils.modeling import infer_auto_device_map

    cfg = transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, n_positions=8, vocab_size=32)
    for untie in (False, True):
        with torch.device("meta"):
            model = transformers.GPT2LMHeadModel(cfg)
        if untie:
            model.lm_head.weight = nn.Parameter(torch.empty(32, 16, device="meta"))
        for infer, logger in ((infer_auto_device_map, "accel_nb"), (ref_infer, "accelerate")):
            caplog.clear()
            with caplog.at_level("WARNING", logger=logger):
                infer(model, {"cpu": 10**7})
            said = [r for r in caplog.records if r.name.startswith(logger) and "tie" in r.getMessage()]
            assert bool(said) == untie, (logger, untie, [r.getMessage() for r in caplog.records])
