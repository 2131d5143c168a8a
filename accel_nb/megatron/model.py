"""The Megatron model a prepared ``transformers`` model stands for: megatron-core's GPTModel, built on this rank.

As in the reference, ``prepare`` reads the size of the model it is given (GPT-2 and Llama configs: the
reference's GPT kinds; its BERT and T5 kinds are built in bert.py and t5.py) and builds megatron-core's
``GPTModel`` of that size with fresh weights, split over the tensor-parallel ranks and this rank's pipeline stage; ``load_state``, or ``load_full_weights`` with a full
state dict, brings trained weights in. ``full_weights`` gathers the whole model's weights back, in the
one-process layout (the same names and shapes whatever the tp/pp degrees).

    config, kind = transformer_config(plugin, hf_model.config, seq_length=128, device_type="cuda")
    model = build_gpt(plugin, config, kind, pre_process=True, post_process=True)
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields
from typing import Any

__all__ = [
    "GptShape",
    "full_weights",
    "gpt_shape",
    "load_full_weights",
    "provide_model",
    "transformer_config",
]

VOCAB_MULTIPLE = 128  # Megatron's make_vocab_size_divisible_by: the vocabulary is padded to a multiple of it


@dataclass
class GptShape:
    """The size of the GPT the reference would build from a ``transformers`` config."""

    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_query_groups: int | None
    ffn_hidden_size: int
    vocab_size: int
    max_position_embeddings: int
    seq_length: int
    eos_token_id: int
    llama_like: bool  # RMSNorm, SwiGLU, no biases, rotary positions
    tie_embeddings: bool
    layernorm_epsilon: float
    rotary_base: float
    kind: str = "gpt"


def gpt_shape(hf_config: Any, seq_length: int | None) -> GptShape:
    """The GPT shape of a GPT-2 or Llama ``transformers`` config; other kinds are refused by name."""
    kind = str(getattr(hf_config, "model_type", "")).lower()
    if "gpt2" in kind:
        hidden = hf_config.n_embd
        shape = dict(
            num_layers=hf_config.n_layer,
            hidden_size=hidden,
            num_attention_heads=hf_config.n_head,
            num_query_groups=None,
            ffn_hidden_size=getattr(hf_config, "n_inner", None) or 4 * hidden,
            max_position_embeddings=hf_config.n_positions,
            llama_like=False,
            tie_embeddings=bool(getattr(hf_config, "tie_word_embeddings", True)),
            layernorm_epsilon=hf_config.layer_norm_epsilon,
            rotary_base=10000.0,
        )
    elif "llama" in kind:
        shape = dict(
            num_layers=hf_config.num_hidden_layers,
            hidden_size=hf_config.hidden_size,
            num_attention_heads=hf_config.num_attention_heads,
            num_query_groups=getattr(hf_config, "num_key_value_heads", None),
            ffn_hidden_size=hf_config.intermediate_size,
            max_position_embeddings=hf_config.max_position_embeddings,
            llama_like=True,
            tie_embeddings=bool(getattr(hf_config, "tie_word_embeddings", False)),
            layernorm_epsilon=hf_config.rms_norm_eps,
            rotary_base=float(getattr(hf_config, "rope_theta", None) or 10000.0),
        )
    else:
        raise ValueError(
            f"accel_nb's Megatron-LM back-end builds the reference's kinds (gpt2, llama, megatron-bert and t5 "
            f"configs); this model is "
            f"{kind or type(hf_config).__name__!r}. Give MegatronLMPlugin(custom_model_provider_function=...) "
            "that builds your megatron-core model"
        )
    eos = getattr(hf_config, "eos_token_id", None)
    if isinstance(eos, (list, tuple)):
        eos = eos[0]
    if seq_length is None:
        seq_length = shape["max_position_embeddings"]
    return GptShape(
        vocab_size=hf_config.vocab_size, seq_length=seq_length, eos_token_id=int(eos or 0), **shape
    )


def padded_vocab(vocab_size: int, tp: int) -> int:
    """The vocabulary rounded up to a multiple of 128 that tp divides (the same for every tp up to 128, so the
    padding logits, part of the softmax, do not change the loss between layouts)."""
    import math

    multiple = math.lcm(VOCAB_MULTIPLE, tp)
    return -(-vocab_size // multiple) * multiple


def stage_arguments(plugin: Any, shape: Any, pre_process: bool, post_process: bool) -> dict[str, Any]:
    """The keywords every megatron-core language model of ``shape`` takes the same way here (GPT, BERT, T5):
    the padded vocabulary, the positions, this stage's ends, vocabulary-parallel logits, tied embeddings."""
    return {
        "vocab_size": padded_vocab(shape.vocab_size, plugin.tp_degree),
        "max_sequence_length": max(shape.max_position_embeddings, shape.seq_length),
        "pre_process": pre_process,
        "post_process": post_process,
        "parallel_output": True,
        "share_embeddings_and_output_weights": shape.tie_embeddings,
    }


def transformer_config(plugin: Any, shape: GptShape | None, device_type: str, params_dtype: Any) -> Any:
    """megatron-core's ``TransformerConfig`` for ``shape`` with the plugin's parallel and model settings."""
    import torch
    from megatron.core.transformer.enums import AttnBackend
    from megatron.core.transformer.transformer_config import TransformerConfig

    on_cpu = device_type != "cuda"
    settings: dict[str, Any] = dict(
        tensor_model_parallel_size=plugin.tp_degree,
        pipeline_model_parallel_size=plugin.pp_degree,
        sequence_parallel=bool(plugin.sequence_parallelism),
        hidden_dropout=float(plugin.hidden_dropout),
        attention_dropout=float(plugin.attention_dropout),
        attention_softmax_in_fp32=bool(plugin.attention_softmax_in_fp32),
        calculate_per_token_loss=bool(plugin.calculate_per_token_loss),
        attention_backend=AttnBackend.auto if plugin.attention_backend else AttnBackend.local,
        params_dtype=params_dtype,
        pipeline_dtype=params_dtype,
        bf16=params_dtype == torch.bfloat16,
        fp16=params_dtype == torch.float16,
        # a CPU run: megatron-core's fused kernels and CUDA-side initialisation are GPU-only
        use_cpu_initialization=on_cpu,
        gradient_accumulation_fusion=False,
        bias_activation_fusion=not on_cpu,
        masked_softmax_fusion=not on_cpu,
        bias_dropout_fusion=not on_cpu,
        apply_rope_fusion=False,
        persist_layer_norm=not on_cpu,
    )
    if plugin.recompute_activations:
        settings["recompute_granularity"] = "selective"
    elif plugin.recompute_granularity is not None:
        settings["recompute_granularity"] = plugin.recompute_granularity
        if plugin.recompute_granularity == "full":
            settings["recompute_method"] = plugin.recompute_method or "uniform"
            settings["recompute_num_layers"] = plugin.recompute_num_layers or 1
    if plugin.decoder_last_pipeline_num_layers is not None:
        settings["num_layers_in_last_pipeline_stage"] = plugin.decoder_last_pipeline_num_layers
    if shape is not None:
        settings.update(
            num_layers=shape.num_layers,
            hidden_size=shape.hidden_size,
            num_attention_heads=shape.num_attention_heads,
            num_query_groups=shape.num_query_groups,
            ffn_hidden_size=shape.ffn_hidden_size,
            layernorm_epsilon=shape.layernorm_epsilon,
        )
        if shape.llama_like:
            import torch.nn.functional as F

            settings.update(
                normalization="RMSNorm", gated_linear_unit=True, activation_func=F.silu, add_bias_linear=False
            )
            settings["bias_activation_fusion"] = False
    known = {f.name for f in fields(TransformerConfig)}
    if "cuda_graph_scope" in known:  # megatron-core 0.16's default "full" warns it is deprecated; [] means it
        settings["cuda_graph_scope"] = []
    other = dict(plugin.other_megatron_args or {})
    unknown = sorted(set(other) - known - {"position_embedding_type"})
    if unknown:
        raise ValueError(
            f"MegatronLMPlugin(other_megatron_args=...) has keys megatron-core's TransformerConfig does not know: "
            f"{', '.join(unknown)} (accel_nb passes these keys to TransformerConfig)"
        )
    other.pop("position_embedding_type", None)
    settings.update(other)
    if shape is None:  # a custom model provider builds its own config; this one is for the schedules
        settings.setdefault("num_layers", 1)
        settings.setdefault("hidden_size", 1)
        settings.setdefault("num_attention_heads", 1)
    return TransformerConfig(**settings)


def position_embedding(plugin: Any, shape: GptShape) -> str:
    chosen = (plugin.other_megatron_args or {}).get("position_embedding_type")
    if chosen:
        return chosen
    rotary = plugin.use_rotary_position_embeddings
    if rotary is None:
        rotary = shape.llama_like
    return "rope" if rotary else "learned_absolute"


def provide_model(
    plugin: Any, config: Any, shape: GptShape | None, pre_process: bool, post_process: bool
) -> Any:
    """This pipeline stage's model: the plugin's ``custom_model_provider_function``, else a GPTModel of ``shape``."""
    if plugin.custom_model_provider_function is not None:
        return plugin.custom_model_provider_function(pre_process=pre_process, post_process=post_process)
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    spec = get_gpt_layer_local_spec(normalization="RMSNorm" if shape.llama_like else "LayerNorm")
    return GPTModel(
        config=config,
        transformer_layer_spec=spec,
        **stage_arguments(plugin, shape, pre_process, post_process),
        position_embedding_type=position_embedding(plugin, shape),
        rotary_base=int(shape.rotary_base),
    )


# -- full weights: this rank's slices <-> the one-process layout ----------------------------------------
_LAYER = re.compile(r"(^|\.)(decoder|encoder)\.layers\.(\d+)\.")  # GPT's decoder, BERT's encoder


def _global_name(name: str, module: Any) -> str:
    """``decoder.layers.0.x`` (BERT: ``encoder.``) on a later pipeline stage -> its index in the whole model."""
    match = _LAYER.search(name)
    if not match:
        return name
    layer = getattr(module, match.group(2)).layers[int(match.group(3))]
    return name[: match.start(3)] + str(layer.layer_number - 1) + name[match.end(3) :]


def _owned(module: Any) -> dict[str, Any]:
    """This rank's tensors by global name; the output layer's copy of tied embeddings is left out."""
    tied = getattr(module, "share_embeddings_and_output_weights", False)
    out, seen = {}, set()
    for name, tensor in module.state_dict(keep_vars=True).items():
        if tensor is None or "_extra_state" in name or id(tensor) in seen:
            continue  # T5 registers its position embeddings and output layer twice: the first name is kept
        seen.add(id(tensor))
        if tied and name.endswith("output_layer.weight"):
            continue
        out[_global_name(name, module)] = tensor
    return out


def _vocab_rows(name: str) -> bool:
    return (
        name.endswith(("output_layer.weight", "output_layer.bias"))
        or name == "embedding.word_embeddings.weight"
    )


def zero_vocab_padding(module: Any, vocab_size: int) -> None:
    """Zero the rows past ``vocab_size`` of this rank's vocabulary slices (embedding, output layer): the
    padding ``full_weights`` leaves out and ``load_full_weights`` fills with zeros, so a fresh model and the
    same model saved and loaded in any layout give the same logits (the padding is part of the softmax)."""
    import torch
    from megatron.core import parallel_state as ps

    tp = ps.get_tensor_model_parallel_world_size()
    rank = ps.get_tensor_model_parallel_rank()
    with torch.no_grad():
        for name, tensor in _owned(module).items():
            if not _vocab_rows(name):
                continue
            split = (
                getattr(tensor, "tensor_model_parallel", False) and getattr(tensor, "partition_dim", -1) == 0
            )
            first = rank * tensor.shape[0] if split and tp > 1 else 0  # this slice's first global row
            start = max(vocab_size - first, 0)
            if start < tensor.shape[0]:
                tensor[start:].zero_()


def full_weights(module: Any, vocab_size: int | None) -> dict[str, Any]:
    """Every rank calls it; all get the whole model's weights (CPU tensors, the one-process layout)."""
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    tp_group = ps.get_tensor_model_parallel_group()
    tp = ps.get_tensor_model_parallel_world_size()
    local: dict[str, Any] = {}
    for name, tensor in _owned(module).items():
        dim = getattr(tensor, "partition_dim", -1) if getattr(tensor, "tensor_model_parallel", False) else -1
        tensor = tensor.detach()
        if tp > 1 and dim >= 0:
            parts = [torch.empty_like(tensor) for _ in range(tp)]
            dist.all_gather(parts, tensor.contiguous(), group=tp_group)
            if _glu(name, module):
                parts = [p.chunk(2, dim=dim) for p in parts]
                tensor = torch.cat([p[0] for p in parts] + [p[1] for p in parts], dim=dim)
            else:
                tensor = torch.cat(parts, dim=dim)
        if vocab_size is not None and _vocab_rows(name):
            tensor = tensor[:vocab_size]
        local[name] = tensor.cpu().clone()
    # every pipeline stage holds its own layers: gather the dictionaries over the pipeline group
    stages: list[Any] = [None] * ps.get_pipeline_model_parallel_world_size()
    dist.all_gather_object(stages, local, group=ps.get_pipeline_model_parallel_group())
    merged: dict[str, Any] = {}
    for part in stages:
        merged.update(part)
    return merged


def _glu(name: str, module: Any) -> bool:
    return bool(getattr(module.config, "gated_linear_unit", False)) and "linear_fc1" in name


def load_full_weights(module: Any, weights: dict[str, Any]) -> None:
    """Copy a one-process state dict (``full_weights``'s layout) into this rank's slices, in place."""
    import torch
    from megatron.core import parallel_state as ps

    tp = ps.get_tensor_model_parallel_world_size()
    rank = ps.get_tensor_model_parallel_rank()
    owned = _owned(module)
    missing = sorted(set(owned) - set(weights))
    if missing:
        raise KeyError(f"the weights lack {len(missing)} of this model's tensors, e.g. {missing[:3]}")
    tied = getattr(module, "share_embeddings_and_output_weights", False)
    if tied and not module.pre_process and module.post_process:  # the last stage's copy of the embeddings
        owned["embedding.word_embeddings.weight"] = module.output_layer.weight
    with torch.no_grad():
        for name, target in owned.items():
            source = weights[name].to(target.dtype)
            dim = (
                getattr(target, "partition_dim", -1)
                if getattr(target, "tensor_model_parallel", False)
                else -1
            )
            if _vocab_rows(name) and source.shape[0] < target.shape[0] * (tp if dim == 0 else 1):
                pad = target.shape[0] * (tp if dim == 0 else 1) - source.shape[0]
                source = torch.cat([source, source.new_zeros(pad, *source.shape[1:])])
            if tp > 1 and dim >= 0:
                if _glu(name, module):
                    halves = source.chunk(2, dim=dim)
                    source = torch.cat([h.chunk(tp, dim=dim)[rank] for h in halves], dim=dim)
                else:
                    source = source.chunk(tp, dim=dim)[rank]
            if source.shape != target.shape:
                raise ValueError(
                    f"{name}: the weights hold {tuple(source.shape)}, this rank {tuple(target.shape)}"
                )
            target.copy_(source)
