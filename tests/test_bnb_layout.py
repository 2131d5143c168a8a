"""bitsandbytes 4-bit layouts (big_model/quantization/bnb_layout.py): a saved 4-bit model is the same
model on every CPU and under every bitsandbytes release the extra allows (0.50.0 to 0.50.2).

bitsandbytes 0.50 repacks a 4-bit layer for its bfloat16 CPU kernel on CPUs with AVX512-BF16, and
its ``state_dict`` of such a layer is wrong. Whether this machine's CPU has AVX512-BF16 or not, the
tests make the packed layout with bitsandbytes' own conversion (plain torch code), so they check the
same thing everywhere.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

transformers = pytest.importorskip("transformers")
bnb = pytest.importorskip(
    "bitsandbytes", reason="bitsandbytes is not installed (pip install 'accel_nb[quantization]')"
)
bnb_functional = pytest.importorskip("bitsandbytes.functional")
if not hasattr(bnb_functional, "_convert_weight_packed_for_cpu"):
    pytest.skip("this bitsandbytes has no CPU packing", allow_module_level=True)

from accel_nb.big_model import init_empty_weights  # noqa: E402
from accel_nb.big_model.quantization import (  # noqa: E402
    BnbQuantizationConfig,
    QuantizationError,
    load_and_quantize_model,
)
from accel_nb.big_model.quantization.bnb_layout import TESTED_RELEASES, is_packed, portable_state  # noqa: E402
from accel_nb.big_model.quantization.offload import QuantizedOffloader  # noqa: E402
from accel_nb.big_model.quantization.prequantized import fill_layer  # noqa: E402
from accel_nb.serialization import save_sharded_safetensors  # noqa: E402
from tests.tiny_models import tiny_llama_config  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OLDEST = os.path.join(
    ROOT, ".venv", f"bitsandbytes-{TESTED_RELEASES[0]}"
)  # scripts/setup-env.sh puts it there
F32 = torch.float32
CPU = {"": "cpu"}
TOKENS = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(1))
KINDS = {
    "nf4": dict(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=F32),
    "fp4": dict(load_in_4bit=True, bnb_4bit_quant_type="fp4", bnb_4bit_compute_dtype=F32),
    "nf4-double": dict(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_compute_dtype=F32,
        bnb_4bit_use_double_quant=True,
    ),
}


def _empty():
    with init_empty_weights():
        return transformers.LlamaForCausalLM(tiny_llama_config())


def _logits(model):
    with torch.no_grad():
        return model.eval()(TOKENS).logits.float()


def _pack(layer):
    """What bitsandbytes 0.50 does to a 4-bit layer at its first CPU forward on an AVX512-BF16 CPU."""
    layer.weight.data, layer.weight.quant_state = bnb_functional._convert_weight_packed_for_cpu(
        layer.weight.data, layer.weight.quant_state
    )
    assert is_packed(layer)


def _four_bit(model):
    return [(n, m) for n, m in model.named_modules() if isinstance(m, bnb.nn.Linear4bit)]


@pytest.fixture(scope="module")
def float_folder(tmp_path_factory):
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("llama")
    transformers.LlamaForCausalLM(tiny_llama_config()).eval().save_pretrained(folder, max_shard_size="300KB")
    return str(folder)


def _load(folder, kind):
    return load_and_quantize_model(
        _empty(), BnbQuantizationConfig(**KINDS[kind]), weights_location=folder, device_map=CPU
    )


@pytest.mark.parametrize("kind", list(KINDS))
def test_loaded_4bit_layers_keep_the_portable_layout_through_forwards(float_folder, kind):
    model = _load(float_folder, kind)
    before = _logits(model)
    assert not any(is_packed(m) for _, m in _four_bit(model))  # not repacked by the forward
    state = model.state_dict()
    for name, _ in _four_bit(model):
        absmax = state[f"{name}.weight.absmax"]
        assert absmax.dim() == 1 and absmax.dtype == (torch.uint8 if "double" in kind else F32), name
    assert torch.equal(_logits(model), before)  # state_dict() left the layers as they were


@pytest.mark.parametrize("kind", ["nf4", "fp4"])
def test_a_checkpoint_from_bitsandbytes_own_state_dict_of_packed_layers_loads_exactly(
    float_folder, kind, tmp_path
):
    """bitsandbytes' state_dict of a packed layer (absmax transposed, bfloat16) is converted on load, exactly."""
    model = _load(float_folder, kind)
    portable = model.state_dict()
    # the model those bytes mean: the portable checkpoint with its block scales rounded to bfloat16
    rounded = {
        k: (v.to(torch.bfloat16).to(F32) if k.endswith(".weight.absmax") else v) for k, v in portable.items()
    }
    save_sharded_safetensors(rounded, str(tmp_path / "rounded"), max_shard_size="100KB")
    expected = _load(str(tmp_path / "rounded"), kind)
    for _, layer in _four_bit(model):
        _pack(layer)
    packed_state = model.state_dict()  # bitsandbytes' own: the layout users' files have
    odd = [k for k, v in packed_state.items() if k.endswith(".weight.absmax") and v.dim() == 2]
    assert odd and packed_state[odd[0]].dtype == torch.bfloat16
    save_sharded_safetensors(packed_state, str(tmp_path / "packed"), max_shard_size="100KB")
    again = _load(str(tmp_path / "packed"), kind)
    want = expected.state_dict()
    for name, tensor in again.state_dict().items():
        assert torch.equal(tensor, want[name]), name
    assert torch.equal(_logits(again), _logits(expected))
    full = _logits(_load(float_folder, kind))
    assert (_logits(again) - full).abs().max() < 0.05  # bfloat16 scales: close to the float32 ones


@pytest.mark.parametrize("kind", list(KINDS))
def test_portable_state_of_a_packed_layer_and_its_offload(float_folder, kind):
    model = _load(float_folder, kind)
    name, layer = _four_bit(model)[0]
    before = portable_state(layer)
    x = torch.randn(3, layer.in_features, generator=torch.Generator().manual_seed(2))
    _pack(layer)
    after = portable_state(layer)
    assert is_packed(layer)  # the live layer is left as it was
    assert set(after) == set(before)
    assert torch.equal(after["weight"], before["weight"])  # the nibbles, back in row order
    if "double" in kind:  # the statistics quantized again, as bitsandbytes does: close, not equal
        assert torch.allclose(_absmax(after), _absmax(before), rtol=2e-2, atol=1e-4)
    else:
        assert torch.equal(after["weight.absmax"], before["weight.absmax"].to(torch.bfloat16).to(F32))
    # a fresh layer filled from the portable parts, and the packed layer offloaded: the same outputs
    config = BnbQuantizationConfig(**KINDS[kind])
    fresh = bnb.nn.Linear4bit(
        layer.in_features, layer.out_features, False, F32, quant_type=config.bnb_4bit_quant_type
    )
    fill_layer(fresh, after, config, "cpu")
    offloader = QuantizedOffloader(torch.device("cpu"), config)
    offloader.offload(name, layer, "cpu")
    offloader.attach()
    with torch.no_grad():
        assert torch.equal(layer(x), fresh(x))
    assert not is_packed(fresh)


def _absmax(parts):
    """The dequantized block scales of a double-quantized layer's portable parts."""
    stats = {k[len("weight.") :]: v for k, v in parts.items() if k != "weight"}
    state = bnb_functional.QuantState.from_dict(stats, device="cpu")
    return bnb_functional.dequantize_blockwise(state.absmax, state.state2) + state.offset


def test_an_unknown_absmax_layout_is_refused_naming_the_releases(float_folder, tmp_path):
    model = _load(float_folder, "nf4")
    state = dict(model.state_dict())
    key = next(k for k in state if k.endswith(".weight.absmax"))
    state[key] = state[key].reshape(2, -1, 1)
    save_sharded_safetensors(state, str(tmp_path), max_shard_size="100KB")
    target = _empty()
    with pytest.raises(QuantizationError) as info:
        load_and_quantize_model(
            target, BnbQuantizationConfig(**KINDS["nf4"]), weights_location=str(tmp_path), device_map=CPU
        )
    text = str(info.value)
    assert "does not know" in text and bnb.__version__ in text and TESTED_RELEASES[0] in text
    assert "Nothing was loaded" in text
    assert all(p.device.type == "meta" for p in target.parameters())  # the model was not changed


@pytest.mark.slow
def test_a_checkpoint_written_under_one_release_loads_under_the_other(float_folder, tmp_path):
    """The oldest allowed bitsandbytes (its own copy, put first on the path) and the installed one."""
    if not os.path.isdir(os.path.join(OLDEST, "bitsandbytes")):
        pytest.skip(f"bitsandbytes {TESTED_RELEASES[0]} is not at {OLDEST}: run scripts/setup-env.sh")
    script = os.path.join(ROOT, "tests", "scripts", "bnb_release_roundtrip.py")

    def run(oldest: bool, work: str, mode: str) -> dict:
        env = dict(os.environ)
        if oldest:
            env["PYTHONPATH"] = os.pathsep.join(p for p in (OLDEST, env.get("PYTHONPATH")) if p)
        version = TESTED_RELEASES[0] if oldest else bnb.__version__
        res = subprocess.run(
            [sys.executable, script, version, float_folder, work, mode],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert res.returncode == 0, res.stdout + res.stderr
        return json.loads(res.stdout.strip().splitlines()[-1])

    old_dir, new_dir = str(tmp_path / "old"), str(tmp_path / "new")
    assert run(True, old_dir, "write")["bitsandbytes"] == TESTED_RELEASES[0]
    read_new = run(False, old_dir, "read")
    run(False, new_dir, "write")
    read_old = run(True, new_dir, "read")
    for report in (read_new, read_old):
        for kind in ("nf4", "fp4-double"):
            assert report[kind] == {"same_logits": True, "differing": []}, (report["bitsandbytes"], kind)


def test_tested_releases_match_the_extra():
    """The oldest release the layouts were checked with is the extra's lower bound."""
    with open(os.path.join(ROOT, "pyproject.toml")) as f:
        text = f.read()
    assert f'"bitsandbytes>={TESTED_RELEASES[0]}"' in text
