"""Quantized loading on the CPU: bitsandbytes 8-bit/4-bit and torchao int8, against the libraries by hand.

Models are transformers models built from configs (no downloads), saved as sharded safetensors.
"By hand" means the library's own layers applied to the float model directly (bitsandbytes'
Linear8bitLt/Linear4bit, torchao's quantize_), which is what the loader must reproduce exactly.
"""

from __future__ import annotations

import copy
import os
import warnings

import pytest
import torch
from torch import nn

transformers = pytest.importorskip("transformers")
bnb = pytest.importorskip(
    "bitsandbytes", reason="bitsandbytes is not installed (pip install 'accel_nb[quantization]')"
)

from accel_nb.big_model import compute_module_sizes, infer_auto_device_map, init_empty_weights  # noqa: E402
from accel_nb.big_model.quantization import (  # noqa: E402
    BnbQuantizationConfig,
    QuantizationError,
    TorchAoQuantizationConfig,
    get_quantized_model_device_map,
    load_and_quantize_model,
    mark_quantized_sizes,
    quantized_weight_bytes,
    unmark_quantized_sizes,
)
from tests.tiny_models import tiny_llama_config  # noqa: E402

warnings.filterwarnings("ignore", message=".*MatMul8bitLt.*")
F32 = torch.float32
CPU = {"": "cpu"}  # the comparisons by hand run on the CPU, also on a machine with a GPU
TOKENS = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(1))


def _llama():
    return transformers.LlamaForCausalLM, tiny_llama_config()


def _gpt2():
    cfg = transformers.GPT2Config(
        vocab_size=256, n_embd=128, n_layer=3, n_head=4, n_positions=64, bos_token_id=0, eos_token_id=0
    )
    return transformers.GPT2LMHeadModel, cfg


ARCHS = {"llama": _llama, "gpt2": _gpt2}


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """arch -> (float model, checkpoint folder with several shards)."""
    out = {}
    for arch, make in ARCHS.items():
        cls, cfg = make()
        torch.manual_seed(0)
        model = cls(cfg).eval()
        folder = tmp_path_factory.mktemp(arch)
        model.save_pretrained(folder, max_shard_size="300KB")
        assert len([f for f in os.listdir(folder) if f.endswith(".safetensors")]) > 2
        out[arch] = (model, str(folder))
    return out


def _empty(arch):
    cls, cfg = ARCHS[arch]()
    with init_empty_weights():
        return cls(cfg)


def _logits(model):
    with torch.no_grad():
        return model(TOKENS).logits.float()


def _by_hand_bnb(model, config: BnbQuantizationConfig, skip=("lm_head",)):
    """bitsandbytes' layers put into a copy of the float model directly (Conv1D weights transposed)."""
    model = copy.deepcopy(model)
    for name, module in list(model.named_modules()):
        conv1d = type(module).__name__ == "Conv1D"
        if not (isinstance(module, nn.Linear) or conv1d) or name in skip:
            continue
        weight = module.weight.data.t() if conv1d else module.weight.data
        n_out, n_in = weight.shape
        has_bias = module.bias is not None
        if config.load_in_8bit:
            layer = bnb.nn.Linear8bitLt(n_in, n_out, has_bias, has_fp16_weights=False, threshold=6.0)
            layer.weight = bnb.nn.Int8Params(
                weight.contiguous().clone(), requires_grad=False, has_fp16_weights=False
            )
        else:
            layer = bnb.nn.Linear4bit(
                n_in,
                n_out,
                has_bias,
                F32,
                compress_statistics=config.bnb_4bit_use_double_quant,
                quant_type=config.bnb_4bit_quant_type,
            )
            # bitsandbytes 0.50 would repack the layer for its bfloat16 CPU kernel on an AVX512-BF16 CPU;
            # accel_nb's layers never are (bnb_layout.py says why), so the hand-made ones are not either
            layer.support_avx512bf16_for_cpu = False
            layer.weight = bnb.nn.Params4bit(
                weight.contiguous().clone(),
                requires_grad=False,
                compress_statistics=config.bnb_4bit_use_double_quant,
                quant_type=config.bnb_4bit_quant_type,
                module=layer,
            )
        if has_bias:
            layer.bias = nn.Parameter(module.bias.data.clone(), requires_grad=False)
        layer = layer.to("cpu")  # bitsandbytes quantizes here
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent), child, layer)
    return model.eval()


BNB_CONFIGS = {
    "int8": (lambda: BnbQuantizationConfig(load_in_8bit=True, torch_dtype=F32), 0.03),
    "nf4": (
        lambda: BnbQuantizationConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=F32
        ),
        0.25,
    ),
    "fp4-double": (
        lambda: BnbQuantizationConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type="fp4",
            bnb_4bit_compute_dtype="fp32",
            bnb_4bit_use_double_quant=True,
        ),
        0.35,
    ),
}


def _relative_error(out, ref):
    return float((out - ref).norm() / ref.norm())


@pytest.mark.parametrize("arch", list(ARCHS))
@pytest.mark.parametrize("kind", list(BNB_CONFIGS))
def test_bnb_load_equals_bitsandbytes_by_hand_and_is_close_to_float(saved, arch, kind):
    float_model, folder = saved[arch]
    make_config, tolerance = BNB_CONFIGS[kind]
    model = load_and_quantize_model(
        _empty(arch), make_config(), weights_location=folder, device_map=CPU
    ).eval()
    layer_type = bnb.nn.Linear8bitLt if kind == "int8" else bnb.nn.Linear4bit
    quantized = [n for n, m in model.named_modules() if isinstance(m, layer_type)]
    assert (
        len(quantized) == (7 if arch == "llama" else 4) * 3
    )  # every linear of every block; the head stays float
    assert not any(p.device.type == "meta" for p in model.parameters())
    assert type(model.lm_head) is nn.Linear
    if arch == "gpt2":
        assert model.lm_head.weight is model.transformer.wte.weight  # the tie survives
    out, ref = _logits(model), _logits(float_model)
    err = _relative_error(out, ref)
    assert 0 < err < tolerance, err  # quantized (not float), within the format's expected error
    by_hand = _logits(_by_hand_bnb(float_model, make_config()))
    assert torch.equal(out, by_hand)


def test_bnb_8bit_defaults_run_in_float16(saved):
    float_model, folder = saved["llama"]
    model = load_and_quantize_model(
        _empty("llama"), BnbQuantizationConfig(load_in_8bit=True), weights_location=folder, device_map=CPU
    )
    assert model.model.norm.weight.dtype == torch.float16  # torch_dtype defaults to float16 for 8-bit
    assert model.model.layers[0].mlp.up_proj.weight.dtype == torch.int8
    assert model.is_loaded_in_8bit and not model.is_loaded_in_4bit
    assert _relative_error(_logits(model), _logits(float_model)) < 0.05


def test_quantizes_a_loaded_model_from_its_own_weights(saved):
    float_model, _ = saved["gpt2"]
    config = BNB_CONFIGS["nf4"][0]()
    model = load_and_quantize_model(copy.deepcopy(float_model), config, device_map=CPU).eval()
    assert torch.equal(_logits(model), _logits(_by_hand_bnb(float_model, config)))


def test_keep_in_fp32_and_skip_modules(saved):
    _, folder = saved["llama"]
    config = BnbQuantizationConfig(
        load_in_8bit=True, skip_modules=["lm_head", "mlp"], keep_in_fp32_modules=["norm"]
    )
    model = load_and_quantize_model(_empty("llama"), config, weights_location=folder, device_map=CPU)
    block = model.model.layers[0]
    assert type(block.mlp.up_proj) is nn.Linear and block.mlp.up_proj.weight.dtype == torch.float16
    assert type(block.self_attn.q_proj) is bnb.nn.Linear8bitLt
    assert model.model.norm.weight.dtype == F32 and block.input_layernorm.weight.dtype == torch.float16


# -- torchao ------------------------------------------------------------------------------------------
def test_torchao_int8_equals_torchao_by_hand(saved):
    torchao_quant = pytest.importorskip("torchao.quantization", reason="torchao is not installed")
    float_model, folder = saved["llama"]
    model = load_and_quantize_model(
        _empty("llama"), TorchAoQuantizationConfig("int8"), weights_location=folder, device_map=CPU
    ).eval()
    assert type(model.model.layers[0].mlp.up_proj.weight).__name__ == "Int8Tensor"
    by_hand = copy.deepcopy(float_model)
    torchao_quant.quantize_(
        by_hand,
        torchao_quant.Int8WeightOnlyConfig(),
        filter_fn=lambda m, fqn: isinstance(m, nn.Linear) and fqn != "lm_head",
    )
    out, ref = _logits(model), _logits(float_model)
    assert 0 < _relative_error(out, ref) < 0.03
    assert torch.equal(out, _logits(by_hand))


def test_torchao_int8_gpt2_conv1d(saved):
    torchao_quant = pytest.importorskip("torchao.quantization", reason="torchao is not installed")
    float_model, folder = saved["gpt2"]
    model = load_and_quantize_model(
        _empty("gpt2"), TorchAoQuantizationConfig("int8"), weights_location=folder, device_map=CPU
    ).eval()
    by_hand = copy.deepcopy(float_model)  # Conv1D -> Linear with the transposed weight, then torchao
    for name, module in list(by_hand.named_modules()):
        if type(module).__name__ == "Conv1D":
            linear = nn.Linear(module.weight.shape[0], module.weight.shape[1])
            linear.weight = nn.Parameter(module.weight.data.t().contiguous())
            linear.bias = nn.Parameter(module.bias.data.clone())
            parent, _, child = name.rpartition(".")
            setattr(by_hand.get_submodule(parent), child, linear)
    torchao_quant.quantize_(
        by_hand,
        torchao_quant.Int8WeightOnlyConfig(),
        filter_fn=lambda m, fqn: isinstance(m, nn.Linear) and fqn != "lm_head",
    )
    out = _logits(model)
    assert 0 < _relative_error(out, _logits(float_model)) < 0.03
    assert torch.equal(out, _logits(by_hand))


# -- the planner counts quantized sizes -----------------------------------------------------------------
def _stored_bytes(model):
    total = 0
    for m in model.modules():
        for p in list(m._parameters.values()) + list(m._buffers.values()):
            if p is None:
                continue
            if hasattr(p, "qdata"):  # torchao: int8 data plus scales
                total += sum(getattr(p, k).numel() * getattr(p, k).element_size() for k in ("qdata", "scale"))
                continue
            total += p.numel() * p.element_size()
            for extra in ("SCB",):
                if getattr(p, extra, None) is not None:
                    total += getattr(p, extra).numel() * getattr(p, extra).element_size()
            state = getattr(p, "quant_state", None)
            if state is not None:
                total += sum(t.numel() * t.element_size() for t in (state.absmax, state.code))
    return total


@pytest.mark.parametrize("kind", ["int8", "nf4", "torchao-int8"])
def test_quantized_size_estimate_matches_what_is_stored(saved, kind):
    _, folder = saved["llama"]
    config = TorchAoQuantizationConfig("int8") if kind == "torchao-int8" else BNB_CONFIGS[kind][0]()
    empty = _empty("llama")
    marked = mark_quantized_sizes(empty, config)
    try:
        planned = compute_module_sizes(empty, dtype=F32)[""]
    finally:
        unmark_quantized_sizes(marked)
    assert compute_module_sizes(empty, dtype=F32)[""] > planned * 1.5  # float vs quantized
    stored = _stored_bytes(load_and_quantize_model(empty, config, weights_location=folder, device_map=CPU))
    assert abs(planned - stored) <= 0.01 * stored, (planned, stored)


def test_weight_bytes_formula():
    assert (
        quantized_weight_bytes(4096, 4096, BnbQuantizationConfig(load_in_8bit=True)) == 4096 * 4096 + 4 * 4096
    )
    nf4 = quantized_weight_bytes(4096, 4096, BnbQuantizationConfig(load_in_4bit=True))
    assert 4096 * 4096 // 2 < nf4 < 4096 * 4096 * 0.6


@pytest.mark.parametrize(
    "config",
    [BnbQuantizationConfig(load_in_8bit=True), BnbQuantizationConfig(load_in_4bit=True)],
    ids=["int8", "fp4"],
)
def test_auto_device_map_fits_a_budget_only_the_quantized_model_fits(saved, config):
    float_model, folder = saved["llama"]
    empty = _empty("llama")
    marked = mark_quantized_sizes(empty, config)
    try:
        quantized = compute_module_sizes(empty, dtype=config.torch_dtype)[""]
    finally:
        unmark_quantized_sizes(marked)
    budget = {"cpu": int(quantized * 1.1), "disk": 10**12}
    # the same budget in float spills onto the disk ...
    float_map = infer_auto_device_map(
        _empty("llama"), budget, ["LlamaDecoderLayer"], dtype=config.torch_dtype
    )
    assert "disk" in float_map.values()
    # ... and quantized it all lands on the CPU
    assert get_quantized_model_device_map(empty, config, "auto", max_memory=budget) == {"": "cpu"}
    half = {"cpu": budget["cpu"] // 2, "disk": 10**12}  # half of it: the plan (no load) uses disk
    assert "disk" in get_quantized_model_device_map(empty, config, "sequential", half).values()
    model = load_and_quantize_model(
        empty, config, weights_location=folder, device_map="auto", max_memory=budget
    )
    assert model.hf_device_map == {"": "cpu"}
    assert _relative_error(_logits(model), _logits(float_model)) < 0.35


def test_a_budget_too_small_even_quantized_spills_to_disk_with_an_offload_folder(saved, tmp_path):
    _, folder = saved["llama"]
    empty = _empty("llama")
    config = BnbQuantizationConfig(load_in_8bit=True)
    small = {"cpu": 100_000, "disk": 10**12}
    with pytest.raises(
        QuantizationError, match="to 'disk' but no offload folder was given; pass offload_folder="
    ):
        load_and_quantize_model(empty, config, weights_location=folder, device_map="auto", max_memory=small)
    assert all(p.device.type == "meta" for p in empty.parameters())
    assert not any(hasattr(p, "accel_nb_quantized_bytes") for p in empty.parameters())
    # with a folder, the blocks that do not fit go to disk in their quantized form, same outputs
    model = load_and_quantize_model(
        empty, config, weights_location=folder, device_map="auto", max_memory=small, offload_folder=tmp_path
    )
    assert "disk" in model.hf_device_map.values()
    on_cpu = load_and_quantize_model(_empty("llama"), config, weights_location=folder, device_map=CPU)
    assert torch.equal(_logits(model.eval()), _logits(on_cpu.eval()))


# -- offloaded quantized layers -------------------------------------------------------------------------
OFFLOAD_MAP = {  # execution on the CPU; blocks 1-2 and the (float) head on disk
    "model.embed_tokens": "cpu",
    "model.rotary_emb": "cpu",
    "model.layers.0": "cpu",
    "model.layers.1": "disk",
    "model.layers.2": "disk",
    "model.norm": "cpu",
    "lm_head": "disk",
}
OFFLOAD_CONFIGS = {
    "int8": lambda: BnbQuantizationConfig(load_in_8bit=True, torch_dtype=F32),
    "nf4": lambda: BnbQuantizationConfig(
        load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=F32
    ),
    "torchao-int8": lambda: TorchAoQuantizationConfig("int8"),
    # double quant: the nested statistics stream too, the nested offset is made once on the device
    "nf4-double": lambda: BnbQuantizationConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_compute_dtype=F32,
        bnb_4bit_use_double_quant=True,
    ),
}


def _released(layer):
    """True when an offloaded layer holds nothing quantized between forwards."""
    state = getattr(layer, "state", None)
    return (
        layer.weight is None
        and getattr(state, "CB", None) is None
        and getattr(state, "SCB", None) is None
        and getattr(layer, "quant_state", None) is None
    )


@pytest.mark.parametrize("kind", list(OFFLOAD_CONFIGS))
def test_disk_and_cpu_offloaded_quantized_layers_give_the_same_outputs(saved, kind, tmp_path):
    from accel_nb.big_model.quantization.offload import OFFLOADER_ATTR, QuantizedOffloader

    if kind.startswith("torchao"):
        pytest.importorskip("torchao.quantization", reason="torchao is not installed")
    float_model, folder = saved["llama"]
    config = OFFLOAD_CONFIGS[kind]
    in_place = load_and_quantize_model(
        _empty("llama"), config(), weights_location=folder, device_map=CPU
    ).eval()
    expected = _logits(in_place)
    model = load_and_quantize_model(
        _empty("llama"), config(), weights_location=folder, device_map=OFFLOAD_MAP, offload_folder=tmp_path
    ).eval()
    assert model.hf_device_map == OFFLOAD_MAP
    offloader = getattr(model, OFFLOADER_ATTR)
    names = sorted(s.name for s in offloader.stores)
    blocks = ("model.layers.1.", "model.layers.2.")
    assert names == sorted(
        n for n, m in in_place.named_modules() if isinstance(m, nn.Linear) and n.startswith(blocks)
    )
    assert len(names) == 14  # 7 linear layers in each of the two disk blocks
    # the folder holds the quantized bytes: one file per layer, the size of the quantized weights
    files = {
        f: os.path.getsize(tmp_path / f) for f in os.listdir(tmp_path) if f.startswith("accel_nb_quantized_")
    }
    assert len(files) == 14
    float_bytes = sum(float_model.get_submodule(n).weight.numel() * 4 for n in names)
    stored = sum(s.nbytes for s in offloader.stores)
    assert stored < float_bytes * (0.27 if "int8" in kind else 0.15)
    assert stored <= sum(files.values()) < stored + 14 * 1024  # + each file's small header
    # no quantized layer holds its weights between forwards; only the running one during a forward
    seen = []
    probe = model.model.layers[2].mlp.down_proj
    others = [model.get_submodule(n) for n in names if n != "model.layers.2.mlp.down_proj"]
    probe.register_forward_pre_hook(lambda m, a: seen.append(all(_released(o) for o in others)))
    assert all(_released(model.get_submodule(n)) for n in names)
    out = _logits(model)
    assert torch.equal(out, expected)  # bitwise: the same quantized bytes, the same kernels
    assert seen == [True] and all(_released(model.get_submodule(n)) for n in names)
    assert offloader.bytes_moved == stored and offloader.forwards == 14  # each layer's quantized bytes, once
    assert torch.equal(_logits(model), expected)  # and again, from the same files
    assert offloader.bytes_moved == 2 * stored
    prompt = TOKENS[:1, :4]
    generated = model.generate(prompt, max_new_tokens=3, do_sample=False)
    assert generated.shape == (1, 7)
    assert torch.equal(generated, in_place.generate(prompt, max_new_tokens=3, do_sample=False))
    # "cpu" layers (streamed to the GPU on a GPU run): the same code with the bytes kept in RAM, run on the CPU
    ram = QuantizedOffloader(torch.device("cpu"), config())
    block = [
        n for n, m in in_place.named_modules() if isinstance(m, nn.Linear) and n.startswith("model.layers.0.")
    ]
    for n in block:
        ram.offload(n, in_place.get_submodule(n), "cpu")
    ram.attach()
    assert all(_released(in_place.get_submodule(n)) for n in block)
    assert torch.equal(_logits(in_place), expected)
    assert ram.forwards == 7 and ram.bytes_moved == sum(s.nbytes for s in ram.stores)
    assert all(_released(in_place.get_submodule(n)) for n in block)


@pytest.mark.parametrize("kind", ["nf4", "nf4-double", "torchao-int8"])
def test_offloaded_quantized_layers_stream_through_the_engine_buffers(saved, kind, tmp_path, monkeypatch):
    """The GPU code path on the CPU (the engine's buffered mode): quantized layers packed, copied
    into the engine's bounded device buffers, prefetched in the learnt order; outputs bitwise equal."""
    import functools

    from accel_nb.big_model.quantization import loader

    if kind.startswith("torchao"):
        pytest.importorskip("torchao.quantization", reason="torchao is not installed")
    _, folder = saved["llama"]
    config = OFFLOAD_CONFIGS[kind]
    expected = _logits(
        load_and_quantize_model(_empty("llama"), config(), weights_location=folder, device_map=CPU).eval()
    )
    monkeypatch.setattr(loader, "dispatch_model", functools.partial(loader.dispatch_model, buffered=True))
    dmap = dict(OFFLOAD_MAP, **{"model.layers.0": "cpu"})
    model = load_and_quantize_model(
        _empty("llama"), config(), weights_location=folder, device_map=dmap, offload_folder=tmp_path
    ).eval()
    engine, offloader = model._accel_nb_engine, model._accel_nb_quantized_offloader
    assert engine.buffered and offloader.engine is engine and len(offloader.stores) == 14
    quantized_units = {id(s.unit) for s in offloader.stores}
    assert quantized_units <= {id(u) for u in engine.units}  # one engine for float and quantized tensors
    assert len(engine._buffers) == 2  # bounded: two device buffers whatever the number of layers
    for _ in range(3):
        before = engine.bytes_streamed
        assert torch.equal(_logits(model), expected)
        assert engine.bytes_streamed - before >= sum(s.nbytes for s in offloader.stores)
    assert engine.prefetch_hits > 0  # the next layer's copy was issued while the previous one ran
    assert all(_released(model.get_submodule(s.name)) for s in offloader.stores)
    # "cpu" layers (what a GPU run does with cpu-mapped quantized layers): packed into one host slab
    from accel_nb.big_model.offload import OffloadEngine
    from accel_nb.big_model.quantization.offload import QuantizedOffloader

    ram = QuantizedOffloader(torch.device("cpu"), config())
    for n, m in list(model.named_modules()):
        if isinstance(m, nn.Linear) and n.startswith("model.layers.0."):
            ram.offload(n, m, "cpu")
    assert len(ram.stores) == 7
    ram.attach(OffloadEngine("cpu", buffered=True))
    assert all(s.unit.packed is not None and not s.unit.host for s in ram.stores)
    assert torch.equal(_logits(model), expected) and ram.forwards == 7
    assert all(_released(model.get_submodule(s.name)) for s in ram.stores)


GPT2_OFFLOAD_MAP = {
    "transformer.wte": "cpu",
    "transformer.wpe": "cpu",
    "transformer.drop": "cpu",
    "transformer.h.0": "cpu",
    "transformer.h.1": "disk",
    "transformer.h.2": "disk",
    "transformer.ln_f": "cpu",
    "lm_head": "cpu",
}


def test_offload_of_layers_with_biases_and_from_a_prequantized_checkpoint(saved, tmp_path):
    """GPT-2 (Conv1D layers with biases: the biases stream as float tensors) and a checkpoint saved quantized."""
    from accel_nb.serialization import save_sharded_safetensors

    _, folder = saved["gpt2"]
    config = OFFLOAD_CONFIGS["nf4"]
    expected = _logits(
        load_and_quantize_model(_empty("gpt2"), config(), weights_location=folder, device_map=CPU).eval()
    )
    model = load_and_quantize_model(
        _empty("gpt2"),
        config(),
        weights_location=folder,
        device_map=GPT2_OFFLOAD_MAP,
        offload_folder=tmp_path / "a",
    ).eval()
    attn = model.transformer.h[1].attn.c_attn
    assert attn.weight is None and attn.bias.device.type == "meta"  # both off the module between forwards
    assert torch.equal(_logits(model), expected)
    # a checkpoint saved quantized (8-bit) loads into an offloading map without re-quantizing, same outputs
    _, folder = saved["llama"]
    int8 = OFFLOAD_CONFIGS["int8"]
    in_place = load_and_quantize_model(
        _empty("llama"), int8(), weights_location=folder, device_map=CPU
    ).eval()
    save_sharded_safetensors(in_place.state_dict(), str(tmp_path / "ckpt"), max_shard_size="100KB")
    model = load_and_quantize_model(
        _empty("llama"),
        int8(),
        weights_location=tmp_path / "ckpt",
        device_map=OFFLOAD_MAP,
        offload_folder=tmp_path / "b",
    ).eval()
    assert torch.equal(_logits(model), _logits(in_place))
    assert model._accel_nb_quantized_offloader.forwards == 14
    # the offload folder must stay: a layer whose file is gone says so, and holds nothing afterwards
    model = load_and_quantize_model(
        _empty("llama"),
        int8(),
        weights_location=tmp_path / "ckpt",
        device_map=OFFLOAD_MAP,
        offload_folder=tmp_path / "c",
    ).eval()
    os.remove(tmp_path / "c" / "accel_nb_quantized_model.layers.1.self_attn.q_proj.safetensors")
    with pytest.raises(
        QuantizationError, match="offload folder must stay in place while the model is in use"
    ):
        _logits(model)
    assert _released(model.model.layers[1].self_attn.q_proj)


def test_offload_placements_that_cannot_work_are_refused(saved, tmp_path):
    _, folder = saved["llama"]
    empty = _empty("llama")
    split = dict(OFFLOAD_MAP, **{"model.layers.1.mlp.up_proj.weight": "cpu"})
    with pytest.raises(QuantizationError, match="a quantized layer's tensors go to one device together"):
        load_and_quantize_model(
            empty,
            BnbQuantizationConfig(load_in_8bit=True),
            weights_location=folder,
            device_map=split,
            offload_folder=tmp_path,
        )
    with pytest.raises(QuantizationError, match="torchao int4 layers cannot be offloaded yet"):
        load_and_quantize_model(
            empty,
            TorchAoQuantizationConfig("int4"),
            weights_location=folder,
            device_map=OFFLOAD_MAP,
            offload_folder=tmp_path,
        )
    assert all(p.device.type == "meta" for p in empty.parameters()) and not os.listdir(tmp_path)


# -- bad input ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({}, "exactly one of load_in_8bit=True or load_in_4bit=True"),
        ({"load_in_8bit": True, "load_in_4bit": True}, "exactly one of"),
        (
            {"load_in_4bit": True, "bnb_4bit_quant_type": "nf3"},
            "bnb_4bit_quant_type must be 'nf4' or 'fp4', got 'nf3'",
        ),
        ({"load_in_4bit": True, "bnb_4bit_compute_dtype": "int8"}, "bnb_4bit_compute_dtype must be"),
        ({"load_in_8bit": 1}, "load_in_8bit must be True or False"),
        ({"load_in_8bit": True, "skip_modules": "lm_head"}, "skip_modules must be a list"),
    ],
)
def test_config_errors(kwargs, words):
    with pytest.raises(QuantizationError, match=words.replace("(", r"\(").replace(")", r"\)")):
        BnbQuantizationConfig(**kwargs)


def test_config_meanings():
    c = BnbQuantizationConfig(load_in_4bit=True, bnb_4bit_compute_dtype="bf16")
    assert (
        c.torch_dtype == torch.bfloat16
        and c.bnb_4bit_compute_dtype == torch.bfloat16
        and c.target_dtype == "int4"
    )
    c = BnbQuantizationConfig(load_in_8bit=True)
    assert c.torch_dtype == torch.float16 and c.target_dtype == torch.int8 and c.llm_int8_threshold == 6.0
    assert BnbQuantizationConfig(load_in_4bit=True).bnb_4bit_quant_type == "fp4"
    with pytest.raises(QuantizationError, match="int4 weight-only runs in bfloat16 only"):
        TorchAoQuantizationConfig("int4", torch_dtype=F32)


def test_no_linear_layers(tmp_path):
    from safetensors.torch import save_file

    class Table(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(10, 4)
            self.norm = nn.LayerNorm(4)

    save_file(Table().state_dict(), str(tmp_path / "model.safetensors"))
    with init_empty_weights():
        model = Table()
    with pytest.raises(QuantizationError, match="Table has no linear layers to quantize"):
        load_and_quantize_model(
            model, BnbQuantizationConfig(load_in_8bit=True), weights_location=str(tmp_path), device_map=CPU
        )
    assert all(p.device.type == "meta" for p in model.parameters())


def _state(model):
    return [
        (
            n,
            type(m).__name__,
            [(k, p.device.type, p.dtype) for k, p in m._parameters.items() if p is not None],
        )
        for n, m in model.named_modules()
    ]


@pytest.fixture(scope="module")
def int8_checkpoint(saved, tmp_path_factory):
    """The llama model quantized to 8-bit by hand and saved as bitsandbytes serializes it (weight, SCB, weight_format)."""
    from safetensors.torch import save_file

    model = _by_hand_bnb(saved["llama"][0], BnbQuantizationConfig(load_in_8bit=True))
    sd = {k: v.contiguous() for k, v in model.state_dict().items()}
    folder = tmp_path_factory.mktemp("int8ckpt")
    save_file({k: v.clone() for k, v in sd.items()}, str(folder / "model.safetensors"))
    assert any(k.endswith(".SCB") for k in sd)
    return str(folder)


@pytest.mark.parametrize(
    "config, words",
    [
        (
            BnbQuantizationConfig(load_in_4bit=True),
            r"already quantized with other settings \(bnb-int8.*\(bnb-fp4\)",
        ),
        (
            TorchAoQuantizationConfig("int8"),
            r"already quantized with other settings \(bnb-int8.*\(torchao-int8\)",
        ),
    ],
    ids=["bnb-4bit", "torchao"],
)
def test_prequantized_checkpoint_with_other_settings(int8_checkpoint, config, words):
    model = _empty("llama")
    before = _state(model)
    with pytest.raises(QuantizationError, match=words):
        load_and_quantize_model(model, config, weights_location=int8_checkpoint, device_map=CPU)
    assert _state(model) == before


ROUND_TRIP = {
    "int8": lambda: BnbQuantizationConfig(load_in_8bit=True, torch_dtype=F32),
    "nf4": lambda: BnbQuantizationConfig(
        load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=F32
    ),
    "fp4-double": lambda: BnbQuantizationConfig(
        load_in_4bit=True, bnb_4bit_compute_dtype=F32, bnb_4bit_use_double_quant=True
    ),
}


@pytest.mark.parametrize("arch", list(ARCHS))
@pytest.mark.parametrize("kind", list(ROUND_TRIP))
def test_save_and_load_back_without_requantizing(saved, arch, kind, tmp_path):
    """The quantized state dict (as bitsandbytes/transformers serialize it) saved in shards loads back equal."""
    from accel_nb.serialization import save_sharded_safetensors

    _, folder = saved[arch]
    model = load_and_quantize_model(
        _empty(arch), ROUND_TRIP[kind](), weights_location=folder, device_map=CPU
    ).eval()
    out = _logits(model)
    state = model.state_dict()
    assert any(k.endswith(".SCB" if kind == "int8" else ".weight.absmax") for k in state)
    save_sharded_safetensors(state, str(tmp_path), max_shard_size="100KB")
    again = load_and_quantize_model(
        _empty(arch), ROUND_TRIP[kind](), weights_location=str(tmp_path), device_map=CPU
    )
    assert torch.equal(_logits(again.eval()), out)
    for name, tensor in again.state_dict().items():
        assert torch.equal(tensor, state[name]), name
    if kind == "fp4-double":  # the same file with double quantization switched off is refused
        with pytest.raises(QuantizationError, match="bnb-fp4 with double quantization"):
            load_and_quantize_model(
                _empty(arch),
                BnbQuantizationConfig(load_in_4bit=True, bnb_4bit_compute_dtype=F32),
                weights_location=str(tmp_path),
                device_map=CPU,
            )


def test_missing_tensor_and_wrong_shape(saved, tmp_path):
    from safetensors.torch import save_file

    float_model, _ = saved["llama"]
    sd = {
        k: v.clone() for k, v in float_model.state_dict().items() if k != "model.layers.1.mlp.up_proj.weight"
    }
    save_file(sd, str(tmp_path / "model.safetensors"))
    model = _empty("llama")
    before = _state(model)
    with pytest.raises(QuantizationError, match="lacks 1 tensor.*model.layers.1.mlp.up_proj.weight"):
        load_and_quantize_model(
            model, BnbQuantizationConfig(load_in_8bit=True), weights_location=str(tmp_path), device_map=CPU
        )
    assert _state(model) == before
    sd["model.layers.1.mlp.up_proj.weight"] = torch.zeros(3, 3)
    save_file(sd, str(tmp_path / "model.safetensors"))
    with pytest.raises(QuantizationError, match="shape mismatch.*up_proj.weight"):
        load_and_quantize_model(
            model, BnbQuantizationConfig(load_in_8bit=True), weights_location=str(tmp_path), device_map=CPU
        )
    assert _state(model) == before


def test_a_failure_while_reading_leaves_the_model_as_it_was(saved):
    """A real model quantized from its own weights; torchao fails on a layer part-way (int4 without its kernel)."""
    float_model, _ = saved["llama"]
    model = copy.deepcopy(float_model).to(torch.bfloat16)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    types = _state(model)
    try:
        load_and_quantize_model(model, TorchAoQuantizationConfig("int4"), device_map=CPU)
    except QuantizationError as exc:
        assert "torchao could not quantize" in str(exc) and "Nothing was loaded" in str(exc)
    else:
        pytest.skip("torchao int4 runs on this CPU (its kernel package is installed); no failure to provoke")
    assert _state(model) == types
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())


def test_already_quantized_model_is_refused(saved):
    _, folder = saved["llama"]
    model = load_and_quantize_model(
        _empty("llama"), BnbQuantizationConfig(load_in_8bit=True), weights_location=folder, device_map=CPU
    )
    with pytest.raises(QuantizationError, match="already quantized; build a fresh model"):
        load_and_quantize_model(
            model, BnbQuantizationConfig(load_in_4bit=True), weights_location=folder, device_map=CPU
        )


def test_meta_model_without_weights_location():
    with pytest.raises(QuantizationError, match="has empty \\(meta\\) weights and no weights_location"):
        load_and_quantize_model(_empty("llama"), BnbQuantizationConfig(load_in_8bit=True), device_map=CPU)


def test_missing_library_names_the_extra(tmp_path):
    """A fresh interpreter in which bitsandbytes cannot be imported."""
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['bitsandbytes'] = None\n"
        "from torch import nn\n"
        "from accel_nb.big_model.quantization import BnbQuantizationConfig, load_and_quantize_model\n"
        "m = nn.Sequential(nn.Linear(4, 4))\n"
        "try:\n"
        "    load_and_quantize_model(m, BnbQuantizationConfig(load_in_8bit=True), device_map={'': 'cpu'})\n"
        "except Exception as exc:\n"
        "    print(type(exc).__name__, exc)\n"
        "print(type(m[0]).__name__)\n"
    )
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=root)
    assert res.returncode == 0, res.stderr
    assert "QuantizationError bitsandbytes is needed" in res.stdout
    assert 'pip install "accel_nb[quantization]"' in res.stdout
    assert res.stdout.strip().endswith("Linear")


def test_the_reference_import_paths():
    import accel_nb.utils as utils
    from accel_nb.big_model import quantization
    from accel_nb.utils import bnb as utils_bnb
    from accel_nb.utils import dataclasses as utils_dataclasses

    assert (
        utils.load_and_quantize_model
        is utils_bnb.load_and_quantize_model
        is quantization.load_and_quantize_model
    )
    assert utils.BnbQuantizationConfig is utils_dataclasses.BnbQuantizationConfig is BnbQuantizationConfig
    assert utils_bnb.get_keys_to_not_convert(_empty("gpt2")) == ["transformer.wte", "lm_head"]
    model = _empty("llama")
    assert not utils_bnb.has_4bit_bnb_layers(model) and utils_bnb.get_parameter_device(model).type == "meta"


@pytest.mark.gpu
@pytest.mark.parametrize("weight", ["int8", "int4"])
def test_torchao_on_a_gpu_equals_quantize_by_hand(tmp_path, weight):
    """On CUDA, int4 uses torchao's tile-packed layout (torch's own tinygemm kernel, no mslk needed)."""
    pytest.importorskip("torchao")
    from torchao.quantization import Int4WeightOnlyConfig, Int8WeightOnlyConfig, quantize_

    cfg = transformers.LlamaConfig(
        vocab_size=256,
        hidden_size=128,
        intermediate_size=256,  # tinygemm wants in_features divisible by 128
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    float_model = transformers.LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
    float_model.save_pretrained(tmp_path, max_shard_size="200KB")
    with init_empty_weights():
        empty = transformers.LlamaForCausalLM(cfg)
    ours = load_and_quantize_model(
        empty,
        TorchAoQuantizationConfig(weight, torch_dtype=torch.bfloat16),
        weights_location=str(tmp_path),
        device_map={"": 0},
    )
    hand = copy.deepcopy(float_model).cuda()
    # .to(bfloat16) above rounded the rotary frequencies (a float buffer); the loader keeps them float32
    hand.model.rotary_emb.inv_freq = ours.model.rotary_emb.inv_freq.clone()
    ao = (
        Int8WeightOnlyConfig()
        if weight == "int8"
        else Int4WeightOnlyConfig(group_size=128, int4_packing_format="tile_packed_to_4d")
    )
    quantize_(hand, ao, filter_fn=lambda m, fqn: isinstance(m, nn.Linear) and fqn != "lm_head")
    with torch.no_grad():
        got, want = ours(TOKENS.cuda()).logits.float(), hand(TOKENS.cuda()).logits.float()
        full = float_model.cuda()(TOKENS.cuda()).logits.float()
    assert (
        type(ours.model.layers[0].mlp.down_proj.weight).__name__
        == type(hand.model.layers[0].mlp.down_proj.weight).__name__
    )
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert (got - full).abs().max() < 0.25 * full.abs().max()  # quantization error, not garbage


def test_importing_the_quantization_libraries_shows_no_cuda_less_notes():
    """torchao's 'Failed to load ..._C_*.so', torch's enum notes, bitsandbytes' kernels note: not in the cell."""
    import subprocess
    import sys

    code = (
        "from accel_nb.big_model.quantization.layers import require\n"
        "require('bitsandbytes'); require('torchao'); require('torchao.quantization')\n"
        "import logging; from accel_nb.logging import quiet_import_notes\n"
        "logging.basicConfig()\n"
        "with quiet_import_notes():\n"
        "    logging.getLogger('torchao').warning('Another torchao warning still shows')\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    out = res.stdout + res.stderr
    assert "Failed to load" not in out and "Enum subclass" not in out, out
    assert "Another torchao warning still shows" in out
