"""Big-model inference on CPU: empty init, sizes, budgets, device maps, loading, dispatch, offload."""

from __future__ import annotations

import os
import warnings

import pytest
import torch
from torch import nn

from accel_nb.big_model import (
    CheckpointLoadError,
    DeviceMapError,
    compute_module_sizes,
    cpu_offload,
    disk_offload,
    dispatch_model,
    get_balanced_memory,
    get_max_memory,
    infer_auto_device_map,
    init_empty_weights,
    init_on_device,
    load_checkpoint_and_dispatch,
    load_checkpoint_in_model,
)
from accel_nb.big_model.planning.device_map import device_for
from accel_nb.serialization import save_sharded_safetensors

torch.set_num_threads(1)


class Block(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 2 * d)
        self.fc2 = nn.Linear(2 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(torch.relu(self.fc1(self.norm(x))))


class Stack(nn.Module):
    """Embedding -> blocks -> head tied to the embedding, plus a buffer."""

    def __init__(self, d: int = 32, n: int = 6, vocab: int = 50) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(Block(d) for _ in range(n))
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.embed.weight
        self.register_buffer("scale", torch.linspace(0.5, 1.5, d))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids) * self.scale
        for b in self.blocks:
            h = b(h)
        return self.head(h)


def _reference(seed: int = 0, **kw) -> Stack:
    torch.manual_seed(seed)
    return Stack(**kw).eval()


def _empty(**kw) -> Stack:
    with init_empty_weights():
        return Stack(**kw).eval()


@pytest.fixture()
def stack_ckpt(tmp_path):
    ref = _reference()
    save_sharded_safetensors(ref.state_dict(), str(tmp_path / "ckpt"), max_shard_size="8KB")
    ids = torch.randint(0, 50, (3, 7))
    with torch.no_grad():
        want = ref(ids)
    return ref, str(tmp_path / "ckpt"), ids, want


def _gpt2():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(
        n_layer=4, n_embd=64, n_head=4, vocab_size=500, n_positions=64, bos_token_id=0, eos_token_id=0
    )
    return transformers.GPT2LMHeadModel, cfg


def _llama():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=300,
        max_position_embeddings=64,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=0,
    )
    return transformers.LlamaForCausalLM, cfg


# -- empty init ----------------------------------------------------------------------------------------
def test_init_empty_weights_puts_parameters_on_meta_and_restores_nn_module():
    before = (nn.Module.register_parameter, nn.Module.register_buffer)
    with init_empty_weights():
        big = nn.Linear(50_000, 50_000)  # 10 GB in fp32: only possible without storage
        m = Stack()
        with init_empty_weights(include_buffers=True):  # nested
            inner = Stack()
        after_inner = Stack()
    assert big.weight.device.type == "meta" and big.weight.shape == (50_000, 50_000)
    assert m.embed.weight.device.type == "meta" and m.scale.device.type == "cpu"
    assert inner.scale.device.type == "meta"
    assert after_inner.scale.device.type == "cpu", "the inner context leaked include_buffers"
    assert m.head.weight is m.embed.weight  # ties survive
    assert (nn.Module.register_parameter, nn.Module.register_buffer) == before
    assert nn.Linear(2, 2).weight.device.type == "cpu"


def test_init_on_device_cpu_and_restores_on_error():
    before = nn.Module.register_parameter
    with pytest.raises(RuntimeError):
        with init_on_device("meta"):
            raise RuntimeError("boom")
    assert nn.Module.register_parameter is before
    with init_on_device("cpu"):
        lin = nn.Linear(3, 3)
    assert lin.weight.device.type == "cpu"


# -- sizes and budgets ---------------------------------------------------------------------------------
def test_compute_module_sizes_counts_tied_once_and_honours_dtype():
    m = _empty()
    sizes = compute_module_sizes(m)
    d = 32
    block = (2 * d + d * 2 * d + 2 * d + 2 * d * d + d) * 4
    assert sizes["blocks.0"] == block
    assert sizes["embed"] == 50 * d * 4 and sizes["head"] == 0  # tied: counted under the embedding
    assert sizes[""] == 50 * d * 4 + 6 * block + d * 4
    half = compute_module_sizes(m, dtype=torch.float16)
    assert half["blocks.0"] == block // 2 and half[""] == (50 * d * 4 + 6 * block) // 2 + d * 2


def test_get_max_memory_parses_user_budgets_and_reads_ram():
    got = get_max_memory({"cpu": "1.5GiB", 0: "10MB", "cuda:1": 1024, "disk": "1TB"})
    assert got == {0: 10_000_000, 1: 1024, "cpu": int(1.5 * 2**30), "disk": 10**12}
    assert list(got) == [0, 1, "cpu", "disk"]
    auto = get_max_memory()
    assert auto["cpu"] > 0 and all(isinstance(k, int) for k in auto if k != "cpu")
    with pytest.raises(ValueError, match="10 parsecs"):
        get_max_memory({"cpu": "10 parsecs"})
    with pytest.raises(ValueError, match="unknown device"):
        get_max_memory({"gpu0": 10})


# -- device maps ---------------------------------------------------------------------------------------
def _device_totals(device_map, sizes):
    totals: dict = {}
    for name, dev in device_map.items():
        totals[dev] = totals.get(dev, 0) + sizes.get(name, 0)
    return totals


def test_device_map_respects_budgets_no_split_and_ties():
    m = _empty()
    sizes = compute_module_sizes(m)
    budget = {
        0: sizes["embed"] + 2 * sizes["blocks.0"] + 100,
        1: 3 * sizes["blocks.0"],
        "cpu": 2 * sizes["blocks.0"],
        "disk": "1GB",
    }
    dm = infer_auto_device_map(m, max_memory=budget, no_split_module_classes=["Block"])
    # no entry inside a Block
    assert all(not (k.startswith("blocks.") and k.count(".") > 1) for k in dm), dm
    # everything covered, tied head with the embedding
    assert dm["head"] == dm["embed"]
    totals = _device_totals(dm, sizes)
    plan = dm.plan
    for dev, used in totals.items():
        if dev != "disk":
            assert used <= plan.budgets[dev] - plan.headroom[dev], (dev, used, plan.budgets[dev])
    assert set(dm.values()) == {0, 1, "cpu", "disk"}
    # things spill over in order: GPU 0 blocks before GPU 1 blocks before cpu before disk
    order = [dm[f"blocks.{i}"] for i in range(6) if f"blocks.{i}" in dm]
    rank = {0: 0, 1: 1, "cpu": 2, "disk": 3}
    assert order == sorted(order, key=rank.get)
    # headroom for the offload engine on the GPU that runs offloaded blocks (GPU 0) only, explained
    block = sum((p.numel() * 4 + 255) // 256 * 256 for p in m.blocks[0].parameters())
    assert plan.headroom == {0: 2 * block, 1: 0, "cpu": 0, "disk": 0}
    assert (
        "GPU 0 runs the offloaded blocks" in plan.explain()
        and "largest streamed block 'blocks." in plan.notes[0]
    )
    assert plan.moved_on() and "needs" in plan.moved_on()[0].reason
    assert "moved_on" in plan.explain()


def test_device_map_no_headroom_when_everything_fits_and_splits_when_allowed():
    m = _empty()
    sizes = compute_module_sizes(m)
    dm = infer_auto_device_map(m, max_memory={0: sizes[""] * 2})
    assert set(dm.values()) == {0} and dm.plan.headroom[0] == 0
    # without no_split, a block can be split across devices (the CPU also keeps the largest layer still
    # to place free, as the reference does: another block's fc1)
    reserve = sizes["blocks.1.fc1"]
    tight = {
        "cpu": sizes["embed"] + sizes["blocks.0.norm"] + sizes["blocks.0.fc1"] + sizes["scale"] + 8 + reserve,
        "disk": "1GB",
    }
    split = infer_auto_device_map(m, max_memory=tight)
    assert split.get("blocks.0.fc1") == "cpu" and split.get("blocks.0.fc2") == "disk"
    whole = infer_auto_device_map(m, max_memory=tight, no_split_module_classes=[Block])
    assert device_for(whole, "blocks.0.fc1") == "disk"


def test_a_budget_too_small_for_one_block_maps_it_to_disk_and_says_why(caplog):
    m = _empty()
    sizes = compute_module_sizes(m)
    with caplog.at_level("WARNING", logger="accel_nb.big_model.planning.device_map"):
        dm = infer_auto_device_map(
            m, max_memory={"cpu": sizes["embed"] + sizes["scale"] + 10}, no_split_module_classes=["Block"]
        )
    assert device_for(dm, "blocks.0.fc1") == "disk"  # as the reference: what fits nowhere goes to disk
    moved = dm.plan.moved_on()[0]  # the CPU keeps a block's room free, as the reference does
    assert moved.device == "cpu" and "reserve)" in moved.reason
    assert any(
        "mapped to 'disk'" in r.getMessage() and "offload_folder" in r.getMessage() for r in caplog.records
    )


def test_balanced_memory_spreads_over_gpus():
    m = _empty(n=8)
    sizes = compute_module_sizes(m)
    big = {0: sizes[""] * 4, 1: sizes[""] * 4, "cpu": sizes[""] * 4}
    sequential = infer_auto_device_map(m, max_memory=big, no_split_module_classes=["Block"])
    assert set(sequential.values()) == {0}
    balanced = get_balanced_memory(m, big, no_split_module_classes=["Block"])
    assert balanced[0] < big[0] and balanced["cpu"] == big["cpu"]
    dm = infer_auto_device_map(m, max_memory=balanced, no_split_module_classes=["Block"])
    totals = _device_totals(dm, sizes)
    assert set(totals) == {0, 1}
    assert abs(totals[0] - totals[1]) <= 2 * sizes["blocks.0"] + sizes["embed"]
    low = get_balanced_memory(m, big, no_split_module_classes=["Block"], low_zero=True)
    assert low[0] < balanced[0]


def test_gpt2_map_keeps_lm_head_with_wte_and_blocks_whole():
    cls, cfg = _gpt2()
    with init_empty_weights():
        m = cls(cfg)
    sizes = compute_module_sizes(m)
    dm = infer_auto_device_map(
        m,
        max_memory={"cpu": sizes["transformer.wte"] + sizes["transformer.h.0"] * 1.5, "disk": "1GB"},
        no_split_module_classes=["GPT2Block"],
    )
    assert dm["lm_head"] == dm["transformer.wte"] == "cpu"
    assert not any(k.startswith("transformer.h.") and k.count(".") > 2 for k in dm)
    assert "disk" in dm.values()
    # no room on the CPU: everything, lm_head with its tied embedding, goes to disk as one entry
    dm2 = infer_auto_device_map(
        m, max_memory={"cpu": 1000, "disk": "1GB"}, no_split_module_classes=["GPT2Block"]
    )
    assert dm2 == {"": "disk"}  # everything on one device: one entry for the whole model


# -- loading -------------------------------------------------------------------------------------------
def test_load_sharded_checkpoint_into_empty_model(stack_ckpt):
    ref, ckpt, ids, want = stack_ckpt
    assert len([f for f in os.listdir(ckpt) if f.endswith(".safetensors")]) > 2
    m = _empty()
    report = load_checkpoint_in_model(m, ckpt)
    assert report.missing_keys == [] and report.unexpected_keys == []
    assert m.head.weight is m.embed.weight and m.embed.weight.device.type == "cpu"
    with torch.no_grad():
        assert torch.equal(m(ids), want)
    half = _empty()
    load_checkpoint_in_model(half, ckpt, dtype=torch.float16)
    assert half.blocks[0].fc1.weight.dtype == torch.float16
    assert torch.equal(half.blocks[0].fc1.weight, ref.blocks[0].fc1.weight.half())


def test_single_file_and_real_model_in_place(tmp_path):
    from safetensors.torch import save_file

    ref = _reference(seed=1)
    sd = {k: v.clone() for k, v in ref.state_dict().items() if k != "head.weight"}
    save_file(sd, str(tmp_path / "one.safetensors"))
    target = _reference(seed=2)
    load_checkpoint_in_model(target, str(tmp_path / "one.safetensors"))
    for (k, a), b in zip(target.state_dict().items(), ref.state_dict().values()):
        assert torch.equal(a, b), k


def test_missing_unexpected_and_shape_mismatch_are_clear(tmp_path, caplog):
    from safetensors.torch import save_file

    ref = _reference()
    sd = {k: v.clone() for k, v in ref.state_dict().items() if k != "head.weight"}
    partial = dict(sd)
    partial.pop("blocks.2.fc1.weight")
    save_file(partial, str(tmp_path / "missing.safetensors"))
    with pytest.raises(CheckpointLoadError, match=r"missing 1 tensor.*blocks\.2\.fc1\.weight.*meta"):
        load_checkpoint_in_model(_empty(), str(tmp_path / "missing.safetensors"))
    # a real model missing a key: reported, warned, raised only with strict=True
    real = _reference(seed=3)
    with pytest.warns(UserWarning, match="blocks.2.fc1.weight"):
        report = load_checkpoint_in_model(real, str(tmp_path / "missing.safetensors"))
    assert report.missing_keys == ["blocks.2.fc1.weight"]
    with pytest.raises(CheckpointLoadError, match="missing"):
        load_checkpoint_in_model(_reference(), str(tmp_path / "missing.safetensors"), strict=True)

    extra = dict(sd, **{"blocks.9.fc1.weight": torch.zeros(2)})
    save_file(extra, str(tmp_path / "extra.safetensors"))
    with caplog.at_level("WARNING", logger="accel_nb.big_model.loading"):
        report = load_checkpoint_in_model(_empty(), str(tmp_path / "extra.safetensors"))
    # the reference's words, logged as there (code and test suites match on them)
    assert "were not used when initializing Stack: blocks.9.fc1.weight" in caplog.text
    assert report.unexpected_keys == ["blocks.9.fc1.weight"]
    with pytest.raises(CheckpointLoadError, match="does not have: blocks.9.fc1.weight.*strict=False"):
        load_checkpoint_in_model(_empty(), str(tmp_path / "extra.safetensors"), strict=True)

    wrong = dict(sd, **{"blocks.1.fc2.weight": torch.zeros(3, 3)})
    save_file(wrong, str(tmp_path / "wrong.safetensors"))
    m = _empty()
    with pytest.raises(CheckpointLoadError) as info:
        load_checkpoint_in_model(m, str(tmp_path / "wrong.safetensors"))
    msg = str(info.value)
    assert "'blocks.1.fc2.weight' is [3, 3] in wrong.safetensors but [32, 64] in the model" in msg
    assert m.blocks[0].fc1.weight.device.type == "meta", "nothing may be half-loaded"


def test_device_map_leaving_modules_unassigned(stack_ckpt):
    _, ckpt, _, _ = stack_ckpt
    partial = {"embed": "cpu", "blocks.0": "cpu", "head": "cpu", "scale": "cpu"}
    with pytest.raises(CheckpointLoadError, match=r"unassigned.*blocks\.1.*blocks\.5"):
        load_checkpoint_in_model(_empty(), ckpt, device_map=partial)
    with pytest.raises(DeviceMapError, match="unassigned"):
        dispatch_model(_reference(), partial)
    with pytest.warns(UserWarning, match=r"do not match any submodules in the model: \['blocks.77'\]"):
        dispatch_model(_reference(), {"": "cpu", "blocks.77": "cpu"})  # ignored, as by the reference


class _RunsCode:
    """A pickled object whose loading would call os.system: what torch's weights-only unpickler refuses."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_pickle_is_read_with_torchs_weights_only_unpickler(tmp_path):
    # the reference's way: torch.load(weights_only=True) builds tensors and plain containers only
    ref = _reference(seed=4)
    path = str(tmp_path / "pytorch_model.bin")
    torch.save(ref.state_dict(), path)
    m = _empty()
    load_checkpoint_in_model(m, path)
    assert torch.equal(m.blocks[3].fc2.weight, ref.blocks[3].fc2.weight)
    m = _empty()
    load_checkpoint_in_model(m, str(tmp_path))  # the folder that holds it
    assert torch.equal(m.blocks[3].fc2.weight, ref.blocks[3].fc2.weight)
    # allow_pickle=False: safetensors only, said before anything is read
    with pytest.raises(CheckpointLoadError, match="allow_pickle=False refuses pickle files"):
        load_checkpoint_in_model(_empty(), path, allow_pickle=False)
    # a pickle whose loading would run code is refused, and the code does not run
    marker = tmp_path / "ran"
    torch.save({"embed.weight": torch.zeros(1), "x": _RunsCode(str(marker))}, str(tmp_path / "evil.pt"))
    with pytest.raises(CheckpointLoadError, match="weights_only=True"):
        load_checkpoint_in_model(_empty(), str(tmp_path / "evil.pt"))
    assert not marker.exists()


def test_pickle_to_disk_offload(tmp_path):
    ref = _reference(seed=5)
    torch.save(ref.state_dict(), str(tmp_path / "w.pt"))
    ids = torch.randint(0, 50, (2, 5))
    with torch.no_grad():
        want = ref(ids)
    dm = {
        "embed": "cpu",
        "scale": "cpu",
        "blocks.0": "cpu",
        "blocks.1": "disk",
        "blocks.2": "disk",
        "blocks.3": "cpu",
        "blocks.4": "disk",
        "blocks.5": "disk",
        "head": "cpu",
    }
    m = load_checkpoint_and_dispatch(
        _empty(),
        str(tmp_path / "w.pt"),
        device_map=dm,
        allow_pickle=True,
        offload_folder=str(tmp_path / "off"),
    )
    assert any(f.endswith(".safetensors") for f in os.listdir(tmp_path / "off"))
    with torch.no_grad():
        assert torch.allclose(m(ids), want)


# -- dispatch and offload: outputs equal the plain model's -----------------------------------------------
def test_dispatch_stack_all_cpu_and_cpu_plus_disk(stack_ckpt, tmp_path):
    ref, ckpt, ids, want = stack_ckpt
    m = load_checkpoint_and_dispatch(_empty(), ckpt, device_map="auto", no_split_module_classes=["Block"])
    assert set(m.hf_device_map.values()) == {"cpu"}
    with torch.no_grad():
        assert torch.equal(m(ids), want)
    sizes = compute_module_sizes(_empty())
    m = load_checkpoint_and_dispatch(
        _empty(),
        ckpt,
        device_map="auto",
        max_memory={"cpu": sizes["embed"] + 2 * sizes["blocks.0"] + 200},
        no_split_module_classes=["Block"],
        offload_folder=str(tmp_path / "off"),
    )
    assert "disk" in m.hf_device_map.values() and m.hf_device_map["head"] == "cpu"
    on_disk = [k for k, v in m.hf_device_map.items() if v == "disk"]
    assert m.blocks[5].fc1.weight.device.type == "meta"  # not in memory between forwards
    with torch.no_grad():
        assert torch.allclose(m(ids), want)
        assert torch.allclose(m(ids[:1]), want[:1])  # and again, with another shape
    assert m.blocks[5].fc1.weight.device.type == "meta"
    # safetensors checkpoint: disk weights are read from the checkpoint itself, nothing copied
    assert not os.path.exists(tmp_path / "off") or not os.listdir(tmp_path / "off"), on_disk


def test_cpu_offload_and_disk_offload_on_cpu(tmp_path):
    ref = _reference(seed=6)
    ids = torch.randint(0, 50, (2, 9))
    with torch.no_grad():
        want = ref(ids)
    a = _reference(seed=6)
    cpu_offload(a, execution_device="cpu")
    assert a.blocks[0].fc1.weight.device.type == "meta"
    b = _reference(seed=6)
    disk_offload(b, str(tmp_path / "off"), execution_device="cpu")
    assert os.listdir(tmp_path / "off") == ["accel_nb_offload_model.safetensors"]
    with torch.no_grad():
        assert torch.equal(a(ids), want)
        assert torch.equal(b(ids), want)
        assert torch.equal(b(ids), want)
    assert b.embed.weight.device.type == "meta" and b.hf_device_map == {"": "disk"}


def test_exception_inside_offloaded_forward_leaves_model_usable(tmp_path):
    m = _reference(seed=7)
    ids = torch.randint(0, 50, (2, 4))
    with torch.no_grad():
        want = m(ids)
    cpu_offload(m, "cpu")
    with pytest.raises(IndexError):
        m(torch.tensor([[999]]))  # embedding index out of range, inside an offloaded forward
    assert m.embed.weight.device.type == "meta"
    with torch.no_grad():
        assert torch.equal(m(ids), want)


def test_dispatch_without_weights_is_a_clear_error():
    with pytest.raises(DeviceMapError, match="meta device.*load_checkpoint_and_dispatch"):
        dispatch_model(_empty(), {"": "cpu"})


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_real_architectures_cpu_and_disk(arch, tmp_path):
    cls, cfg = _gpt2() if arch == "gpt2" else _llama()
    no_split = ["GPT2Block"] if arch == "gpt2" else ["LlamaDecoderLayer"]
    torch.manual_seed(0)
    ref = cls(cfg).eval()
    save_sharded_safetensors(ref.state_dict(), str(tmp_path / "ckpt"), max_shard_size="100KB")
    ids = torch.randint(0, cfg.vocab_size, (2, 12))
    with torch.no_grad():
        want = ref(ids).logits
    with init_empty_weights():
        m = cls(cfg).eval()
    sizes = compute_module_sizes(m)
    layer = [k for k in sizes if k.endswith("layers.0") or k.endswith("h.0")][0]
    budget = {"cpu": sizes[""] - 2 * sizes[layer]}
    m = load_checkpoint_and_dispatch(
        m,
        str(tmp_path / "ckpt"),
        device_map="auto",
        max_memory=budget,
        no_split_module_classes=no_split,
        offload_folder=str(tmp_path / "off"),
    )
    values = set(m.hf_device_map.values())
    assert values == {"cpu", "disk"}, m.hf_device_map
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.no_grad():
            got = m(ids).logits
    assert torch.allclose(got, want, atol=1e-5), (got - want).abs().max()
    if arch == "gpt2":
        assert m.hf_device_map["lm_head"] == m.hf_device_map["transformer.wte"]


# -- the streaming engine's bookkeeping, run on the CPU (the GPU path with synchronous copies) --------
@pytest.mark.parametrize("source", ["cpu", "disk", "mixed"])
def test_buffered_streaming_path_bounded_buffers_and_learnt_prefetch(source, tmp_path):
    ref = _reference(seed=8)
    ids = torch.randint(0, 50, (2, 6))
    with torch.no_grad():
        want = ref(ids)
    m = _reference(seed=8)
    if source == "cpu":
        cpu_offload(m, "cpu", buffered=True)
    elif source == "disk":
        disk_offload(m, str(tmp_path / "off"), "cpu", buffered=True)
    else:
        dm = {"embed": "cpu", "scale": "cpu", "head": "cpu", "blocks.0": "disk", "blocks.1": "cpu"}
        dm.update({f"blocks.{i}": ("disk" if i % 2 else "cpu") for i in range(2, 6)})
        dispatch_model(m, dm, main_device="cpu", offload_dir=str(tmp_path / "off"), buffered=True)
        # on the CPU, 'cpu' entries run in place: only disk blocks are streamed
    engine = m._accel_nb_engine
    assert engine.buffered and len(engine._buffers) == min(2, len(engine.units))
    with torch.no_grad():
        for _ in range(3):
            assert torch.equal(m(ids), want)
    n = len(engine.units)
    assert engine.bytes_streamed > 0
    # the first pass may miss; afterwards every unit's weights were prefetched while the previous ran
    assert engine.prefetch_hits >= 2 * n - 1, (engine.prefetch_hits, engine.prefetch_misses, n)
    assert all(not b.in_use for b in engine._buffers)


class ReversedStack(Stack):
    """Runs its blocks in the opposite order to their definition: the prefetcher must learn that."""

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids) * self.scale
        for b in reversed(self.blocks):
            h = b(h)
        return self.head(h)


def test_prefetch_order_is_learnt_from_execution(tmp_path):
    torch.manual_seed(9)
    ref = ReversedStack().eval()
    ids = torch.randint(0, 50, (2, 6))
    with torch.no_grad():
        want = ref(ids)
    torch.manual_seed(9)
    m = ReversedStack().eval()
    dispatch_model(
        m, {"": "cpu", "blocks": "disk"}, main_device="cpu", offload_dir=str(tmp_path), buffered=True
    )
    engine = m._accel_nb_engine
    with torch.no_grad():
        assert torch.equal(m(ids), want)
        assert engine.prefetch_misses > 1  # map order (blocks.0 first) was the wrong guess
        assert torch.equal(m(ids), want)  # learns the wrap-around (last block -> first of the next pass)
        learnt = engine.prefetch_misses
        for _ in range(2):
            assert torch.equal(m(ids), want)
    assert engine.prefetch_misses == learnt  # from then on every block is already on its way


def test_special_dtypes_override_sizes_per_tensor():
    m = _empty()
    half = compute_module_sizes(m, dtype=torch.float16)
    mixed = compute_module_sizes(
        m, dtype=torch.float16, special_dtypes={"blocks.0.fc1.weight": torch.float32}
    )
    extra = 32 * 64 * 2  # fc1.weight: 2 more bytes per element
    assert mixed["blocks.0.fc1.weight"] == 32 * 64 * 4
    assert mixed["blocks.0"] == half["blocks.0"] + extra and mixed[""] == half[""] + extra
    dm = infer_auto_device_map(
        m, {"cpu": "1GB"}, ["Block"], torch.float16, {"blocks.0.fc1.weight": "float32"}
    )
    assert dm.plan.sizes["blocks.0"] == mixed["blocks.0"]


def test_sharded_pickle_checkpoint_with_index(tmp_path):
    from accel_nb.serialization import save_sharded_safetensors as save

    ref = _reference(seed=10)
    save(ref.state_dict(), str(tmp_path), max_shard_size="20KB", safe_serialization=False)
    index = [f for f in os.listdir(tmp_path) if f.endswith(".bin.index.json")]
    assert len(index) == 1 and len(os.listdir(tmp_path)) > 3
    for target in (str(tmp_path), str(tmp_path / index[0])):
        with pytest.raises(CheckpointLoadError, match="allow_pickle=False"):
            load_checkpoint_in_model(_empty(), target, allow_pickle=False)
        m = _empty()
        load_checkpoint_in_model(m, target)
        assert torch.equal(m.blocks[5].fc2.bias, ref.blocks[5].fc2.bias) and m.head.weight is m.embed.weight


def test_transformers_no_split_modules_used_by_default(tmp_path):
    cls, cfg = _gpt2()
    torch.manual_seed(0)
    ref = cls(cfg).eval()
    save_sharded_safetensors(ref.state_dict(), str(tmp_path / "ckpt"))
    with init_empty_weights():
        m = cls(cfg).eval()
    assert "GPT2Block" in m._no_split_modules
    sizes = compute_module_sizes(m)
    budget = {"cpu": sizes["transformer.wte"] + sizes["transformer.wpe"] + 1.5 * sizes["transformer.h.0"]}
    m = load_checkpoint_and_dispatch(
        m, str(tmp_path / "ckpt"), max_memory=budget, offload_folder=str(tmp_path / "o")
    )
    assert not any(k.count(".") > 2 for k in m.hf_device_map), m.hf_device_map  # no block was split


@pytest.mark.parametrize("no_split", [["Block"], None])
def test_offloaded_entry_is_streamed_in_block_sized_units(no_split, tmp_path):
    ref = _reference(seed=11)
    ids = torch.randint(0, 50, (2, 5))
    with torch.no_grad():
        want = ref(ids)
    m = _reference(seed=11)
    block = compute_module_sizes(m)["blocks.0"]
    dispatch_model(
        m,
        {"": "disk"},
        main_device="cpu",
        offload_dir=str(tmp_path),
        buffered=True,
        no_split_module_classes=no_split,
    )
    engine = m._accel_nb_engine
    names = [u.name for u in engine.units]
    if no_split:
        assert "blocks.3" in names and "blocks.3.fc1" not in names
    else:
        assert "blocks.3.fc1" in names and "blocks.3" not in names
    assert max(u.nbytes for u in engine.units) <= block + 1024  # never the whole model at once
    with torch.no_grad():
        assert torch.equal(m(ids), want)
        assert torch.equal(m(ids), want)


def test_init_empty_weights_with_buffers_puts_factory_tensors_on_meta_too():
    import psutil

    factories = (torch.empty, torch.zeros, torch.ones, torch.full)
    rss = psutil.Process().memory_info().rss
    with init_empty_weights(include_buffers=True):
        plain, filled = torch.ones(3), torch.full((2,), 1.5)
        kept = torch.zeros(2, device="cpu")  # an explicit device is respected
        huge = nn.Linear(40_000, 40_000)  # 6.4 GB if its torch.empty(device=None) were real
    assert (plain.device.type, filled.device.type, kept.device.type) == ("meta", "meta", "cpu")
    assert huge.weight.device.type == "meta"
    assert psutil.Process().memory_info().rss - rss < 1 << 30
    assert (torch.empty, torch.zeros, torch.ones, torch.full) == factories  # restored
    assert torch.ones(1).device.type == "cpu"
    with init_empty_weights():  # without buffers the factories are left alone
        assert torch.ones(1).device.type == "cpu"
