"""The reference's replace_with_bnb_layers and CustomDtype, at its paths (issue 29): real bitsandbytes on CPU."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from accel_nb.big_model import compute_module_sizes, init_empty_weights
from accel_nb.big_model.quantization import (
    BnbQuantizationConfig,
    QuantizationError,
    TorchAoQuantizationConfig,
)
from accel_nb.utils.bnb import load_and_quantize_model, replace_with_bnb_layers
from accel_nb.utils.dataclasses import CustomDtype

bnb = pytest.importorskip("bitsandbytes")
transformers = pytest.importorskip("transformers")


def _llama():
    config = transformers.LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).eval()


IDS = torch.tensor([[1, 2, 3, 4, 5, 6]])


def _logits(model):
    with torch.no_grad():
        return model(IDS).logits


def test_8bit_replacement_quantizes_when_moved_and_keeps_the_skipped_head():
    model = _llama()
    expected = _logits(model)
    quant = BnbQuantizationConfig(load_in_8bit=True, torch_dtype=torch.float32)
    out = replace_with_bnb_layers(copy.deepcopy(model), quant, modules_to_not_convert=["lm_head"])
    up = out.model.layers[0].mlp.up_proj
    assert type(up) is bnb.nn.Linear8bitLt and up.weight.dtype == torch.float32  # not quantized yet
    assert type(out.lm_head) is nn.Linear and torch.equal(out.lm_head.weight, model.lm_head.weight)
    assert torch.equal(up.weight.data, model.model.layers[0].mlp.up_proj.weight)
    out = out.to("cpu")  # bitsandbytes quantizes on the move
    assert out.model.layers[0].mlp.up_proj.weight.dtype == torch.int8
    assert not out.model.layers[0].mlp.up_proj.training  # the replaced layers keep the model's eval mode
    error = (_logits(out) - expected).norm() / expected.norm()
    assert error < 0.05
    loaded = load_and_quantize_model(copy.deepcopy(model), quant).eval()
    assert torch.equal(_logits(out), _logits(loaded))


def test_4bit_replacement_gives_the_loaders_logits_bitwise():
    model = _llama()
    quant = BnbQuantizationConfig(
        load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.float32
    )
    replaced = replace_with_bnb_layers(copy.deepcopy(model), quant, ["lm_head"]).to("cpu")
    assert replaced.model.layers[1].self_attn.q_proj.weight.dtype == torch.uint8
    loaded = load_and_quantize_model(copy.deepcopy(model), quant).eval()
    assert torch.equal(_logits(replaced), _logits(loaded))


def test_replacement_on_an_empty_model_a_model_without_linears_and_a_torchao_config():
    with init_empty_weights():
        empty = transformers.LlamaForCausalLM(_llama().config)
    quant = BnbQuantizationConfig(load_in_4bit=True)
    out = replace_with_bnb_layers(empty, quant, ["lm_head", "model.layers.1"])
    assert type(out.model.layers[0].self_attn.o_proj) is bnb.nn.Linear4bit
    assert type(out.model.layers[1].self_attn.o_proj) is nn.Linear  # a dotted prefix is kept
    assert out.model.layers[0].self_attn.o_proj.weight.device.type == "meta"
    with pytest.warns(UserWarning, match="no linear layer of Sequential was replaced"):
        same = replace_with_bnb_layers(nn.Sequential(nn.ReLU()), quant)
    assert type(same[0]) is nn.ReLU
    with pytest.raises(QuantizationError, match="takes a BnbQuantizationConfig"):
        replace_with_bnb_layers(nn.Linear(4, 4), TorchAoQuantizationConfig("int8"))


def test_custom_dtype_counts_in_the_planner():
    from accel_nb.utils import CustomDtype as from_utils
    from accel_nb.utils.modeling import dtype_byte_size

    assert from_utils is CustomDtype
    assert [m.value for m in CustomDtype] == ["fp8", "int4", "int2"]
    assert dtype_byte_size(CustomDtype.INT4) == 0.5 and dtype_byte_size(CustomDtype.INT2) == 0.25
    assert dtype_byte_size(CustomDtype.FP8) == 1
    layer = nn.Linear(64, 32, bias=False)
    sizes = compute_module_sizes(layer, special_dtypes={"weight": CustomDtype.INT4})
    assert sizes[""] == 64 * 32 // 2
