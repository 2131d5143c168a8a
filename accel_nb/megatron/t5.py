"""The reference's T5 kind on megatron-core: its size from a ``transformers`` T5 config, megatron-core's
``T5Model`` of that size, and the step that turns a ``transformers``-style T5 batch into its loss.

As in the reference, a ``t5`` model is built as Megatron's T5 (learned absolute positions, shared by the
encoder and the decoder, the output layer tied to the word embeddings, Megatron's LayerNorm and GeLU):
``num_layers`` encoder layers (``num_decoder_layers`` decoder layers), ``d_model``, ``num_heads``, ``d_ff``,
the vocabulary, and ``n_positions`` positions (1024 when the config has none, the reference's value). The loss
is the language-model loss averaged over the label positions that are not -100. Without pipeline stages:
megatron-core splits an encoder-decoder model over stages only with its own encoder/decoder placement, which
accel_nb does not wire (``pp_degree`` > 1 is refused for T5).

    shape = t5_shape(hf_config, encoder_seq_length=None, decoder_seq_length=None)
    model = provide_t5(plugin, config, shape, pre_process=True, post_process=True)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch

__all__ = ["T5Shape", "T5TrainStep", "is_t5", "provide_t5", "t5_shape"]

DEFAULT_POSITIONS = 1024  # the reference's max_position_embeddings for a T5 config without n_positions


@dataclass
class T5Shape:
    """The size of the T5 the reference would build from a ``transformers`` T5 config."""

    num_layers: int  # the decoder's (megatron-core's config); the encoder's below
    encoder_num_layers: int
    hidden_size: int
    num_attention_heads: int
    ffn_hidden_size: int
    vocab_size: int
    max_position_embeddings: int
    seq_length: int  # the longest of the encoder's and the decoder's
    layernorm_epsilon: float
    kind: str = "t5"
    num_query_groups: int | None = None
    llama_like: bool = False
    tie_embeddings: bool = True
    eos_token_id: int = 0  # unused by T5; kept so every shape answers it


def is_t5(hf_config: Any) -> bool:
    """Whether the reference reads this config as its T5 kind (``model_type`` containing ``t5``)."""
    return "t5" in str(getattr(hf_config, "model_type", "")).lower()


def t5_shape(hf_config: Any, encoder_seq_length: int | None, decoder_seq_length: int | None) -> T5Shape:
    """The T5 shape of a ``transformers`` T5 config."""
    positions = int(getattr(hf_config, "n_positions", None) or DEFAULT_POSITIONS)
    layers = hf_config.num_layers
    return T5Shape(
        num_layers=getattr(hf_config, "num_decoder_layers", None) or layers,
        encoder_num_layers=layers,
        hidden_size=hf_config.d_model,
        num_attention_heads=hf_config.num_heads,
        ffn_hidden_size=getattr(hf_config, "d_ff", None) or 4 * hf_config.d_model,
        vocab_size=hf_config.vocab_size,
        max_position_embeddings=positions,
        seq_length=max(encoder_seq_length or positions, decoder_seq_length or positions),
        layernorm_epsilon=float(getattr(hf_config, "layer_norm_epsilon", 1e-5)),
    )


def provide_t5(plugin: Any, config: Any, shape: T5Shape, pre_process: bool, post_process: bool) -> Any:
    """megatron-core's ``T5Model`` of ``shape`` (local layers, no Transformer Engine), whole on this rank's stage."""
    from megatron.core.models.bert.bert_layer_specs import LNImpl
    from megatron.core.models.T5.t5_model import T5Model
    from megatron.core.models.T5.t5_spec import decoder_model_with_local_spec, encoder_model_with_local_spec
    from megatron.core.transformer.transformer_block import TransformerBlockSubmodules

    from .model import stage_arguments

    if plugin.pp_degree > 1:
        raise ValueError(
            "accel_nb builds T5 without pipeline stages (megatron-core places an encoder-decoder model's stages "
            "itself, which accel_nb does not wire): use tp_degree and data parallelism, pp_degree=1"
        )
    encoder_config = dataclasses.replace(config, num_layers=shape.encoder_num_layers)
    # megatron-core's own local block specs end in Transformer Engine's norm (None without it): LayerNorm here
    encoder = TransformerBlockSubmodules(
        [encoder_model_with_local_spec()] * shape.encoder_num_layers, layer_norm=LNImpl
    )
    decoder = TransformerBlockSubmodules(
        [decoder_model_with_local_spec()] * shape.num_layers, layer_norm=LNImpl
    )
    return T5Model(
        config=config,
        encoder_config=encoder_config,
        transformer_encoder_layer_spec=encoder,
        transformer_decoder_layer_spec=decoder,
        **stage_arguments(plugin, shape, pre_process, post_process),
        position_embedding_type="learned_absolute",
    )


def _blocked(keep_q: torch.Tensor, keep_k: torch.Tensor) -> torch.Tensor:
    """[b, 1, sq, sk], True where a query may not see a key (Megatron's masks say what is hidden)."""
    return (keep_q.unsqueeze(2) * keep_k.unsqueeze(1)).unsqueeze(1) < 0.5


class T5TrainStep:
    """How a T5 batch becomes Megatron's inputs and its loss (the reference's T5TrainStep, for torch batches).

    The batch is a ``transformers`` one: ``input_ids`` [b, s_enc], ``attention_mask`` [b, s_enc] (1 = a real
    token; all ones when absent), ``labels`` [b, s_dec] (-100 = not in the loss), and ``decoder_input_ids``
    [b, s_dec] (when absent: the labels shifted right after a 0, -100 read as 0, as the reference).
    """

    def __init__(self, plugin: Any) -> None:
        self.get_batch = plugin.custom_get_batch_function or self.batch
        self.loss_func = plugin.custom_loss_function or self.loss

    def batch(self, data_iterator: Any) -> tuple[Any, ...]:
        data = next(data_iterator)
        tokens_enc = data["input_ids"].long()
        device = (
            torch.device("cuda", torch.cuda.current_device()) if tokens_enc.is_cuda else tokens_enc.device
        )
        tokens_enc = tokens_enc.to(device)
        if "labels" not in data:
            raise KeyError("a T5 batch needs 'labels' (the decoder's targets, -100 where not in the loss)")
        labels = data["labels"].long().to(device)
        loss_mask = (labels != -100).float()
        if "decoder_input_ids" in data:
            tokens_dec = data["decoder_input_ids"].long().to(device)
        else:
            tokens_dec = torch.zeros_like(labels)
            tokens_dec[:, 1:] = labels[:, :-1].clamp(min=0)
        mask = data.get("attention_mask")
        keep_enc = torch.ones_like(tokens_enc) if mask is None else mask.long().to(device)
        keep_dec = torch.ones_like(tokens_dec)
        enc_mask = _blocked(keep_enc, keep_enc)
        seq_dec = tokens_dec.shape[1]
        dec_mask = torch.ones(seq_dec, seq_dec, device=device).tril().lt(0.5).view(1, 1, seq_dec, seq_dec)
        enc_dec_mask = _blocked(keep_dec, keep_enc)
        return tokens_enc, tokens_dec, loss_mask, labels, enc_mask, dec_mask, enc_dec_mask

    def loss(self, loss_mask: Any, output_tensor: Any) -> tuple[Any, ...]:
        """The language-model mean over the counted labels, one item per micro-batch (as BERT's), and its report."""
        mask = loss_mask.reshape(-1).float()
        lm = torch.sum(output_tensor.float().reshape(-1) * mask) / mask.sum().clamp(min=1)
        one = torch.ones((), dtype=lm.dtype, device=lm.device)
        return (
            lm,
            torch.ones((), dtype=torch.int, device=lm.device),
            {"lm loss": torch.stack([lm.detach(), one])},
        )

    def forward_step(self, data_iterator: Any, model: Any) -> tuple[Any, Any]:
        tokens_enc, tokens_dec, loss_mask, labels, enc_mask, dec_mask, enc_dec_mask = self.get_batch(
            data_iterator
        )
        output = model(tokens_enc, tokens_dec, enc_mask, dec_mask, enc_dec_mask, lm_labels=labels)
        return output, partial(self.loss_func, loss_mask)
