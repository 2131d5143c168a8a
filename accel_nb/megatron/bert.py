"""The reference's BERT kind on megatron-core: its size from a ``transformers`` Megatron-BERT config, megatron-core's
``BertModel`` of that size, and the step that turns a ``transformers``-style BERT batch into its loss.

As in the reference, a ``megatron-bert`` masked-LM model (``MegatronBertForMaskedLM``) is built as Megatron's
pre-training BERT: the masked-LM head, and the sentence-order ("binary") head when the config has
``num_labels == 2`` (the ``transformers`` default), with two token types then. The loss is the masked-LM loss
averaged over the positions whose label is not -100, plus the sentence-order loss when the binary head is on.
Other Megatron-BERT classes are the reference's fine-tuning kind (Megatron's ``Classification`` model, which
megatron-core does not have): refused by name.

    shape = bert_shape(hf_model, seq_length=None)
    model = provide_bert(plugin, config, shape, pre_process=True, post_process=True)
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any

import torch

__all__ = ["BertShape", "BertTrainStep", "bert_shape", "is_bert", "provide_bert"]


@dataclass
class BertShape:
    """The size of the BERT the reference would build from a ``transformers`` Megatron-BERT config."""

    num_layers: int
    hidden_size: int
    num_attention_heads: int
    ffn_hidden_size: int
    vocab_size: int
    max_position_embeddings: int
    seq_length: int
    layernorm_epsilon: float
    tie_embeddings: bool
    binary_head: bool  # the sentence-order head (and two token types)
    kind: str = "bert"
    num_query_groups: int | None = None
    llama_like: bool = False
    eos_token_id: int = 0  # unused by BERT; kept so every shape answers it


def is_bert(hf_config: Any) -> bool:
    """Whether the reference reads this config as its BERT kind (``model_type`` containing ``megatron-bert``)."""
    return "megatron-bert" in str(getattr(hf_config, "model_type", "")).lower()


def bert_shape(hf_model: Any, seq_length: int | None) -> BertShape:
    """The BERT shape of a ``transformers`` Megatron-BERT masked-LM model; its fine-tuning classes are refused."""
    cfg = hf_model.config
    if "maskedlm" not in type(hf_model).__name__.lower():
        raise ValueError(
            f"{type(hf_model).__name__} is the reference's fine-tuning BERT (Megatron's Classification model), "
            "which megatron-core does not have; accel_nb builds the pre-training BERT of a "
            "MegatronBertForMaskedLM, or give MegatronLMPlugin(custom_model_provider_function=...)"
        )
    hidden = cfg.hidden_size
    return BertShape(
        num_layers=cfg.num_hidden_layers,
        hidden_size=hidden,
        num_attention_heads=cfg.num_attention_heads,
        ffn_hidden_size=getattr(cfg, "intermediate_size", None) or 4 * hidden,
        vocab_size=cfg.vocab_size,
        max_position_embeddings=cfg.max_position_embeddings,
        seq_length=seq_length or cfg.max_position_embeddings,
        layernorm_epsilon=float(getattr(cfg, "layer_norm_eps", 1e-12)),
        tie_embeddings=bool(getattr(cfg, "tie_word_embeddings", True)),
        binary_head=int(getattr(cfg, "num_labels", 2)) == 2,
    )


def provide_bert(plugin: Any, config: Any, shape: BertShape, pre_process: bool, post_process: bool) -> Any:
    """This pipeline stage's megatron-core ``BertModel`` of ``shape`` (local layers, no Transformer Engine)."""
    from megatron.core.models.bert.bert_layer_specs import bert_layer_local_spec
    from megatron.core.models.bert.bert_model import BertModel

    from .model import position_embedding, stage_arguments

    return BertModel(
        config=config,
        num_tokentypes=2 if shape.binary_head else 0,
        transformer_layer_spec=bert_layer_local_spec,
        **stage_arguments(plugin, shape, pre_process, post_process),
        position_embedding_type=position_embedding(plugin, shape),
        add_binary_head=shape.binary_head,
    )


class BertTrainStep:
    """How a BERT batch becomes Megatron's inputs and its loss (the reference's BertTrainStep, pre-training).

    The batch is a ``transformers`` one: ``input_ids`` [b, s], ``attention_mask`` [b, s] (1 = a real token; all
    ones when absent), ``labels`` [b, s] (-100 = not in the loss), and with the binary head
    ``token_type_ids`` [b, s] and ``next_sentence_label`` [b].
    """

    def __init__(self, plugin: Any, binary_head: bool) -> None:
        self.binary_head = binary_head
        self.get_batch = plugin.custom_get_batch_function or self.batch
        self.loss_func = plugin.custom_loss_function or self.loss

    def batch(self, data_iterator: Any) -> tuple[Any, ...]:
        data = next(data_iterator)
        tokens = data["input_ids"].long()
        device = torch.device("cuda", torch.cuda.current_device()) if tokens.is_cuda else tokens.device
        tokens = tokens.to(device)
        if "labels" not in data:
            raise KeyError(
                "a BERT batch needs 'labels' (the masked-LM targets, -100 where a position is not predicted)"
            )
        labels = data["labels"].long().to(device)
        loss_mask = (labels != -100).float()
        mask = data.get("attention_mask")
        padding_mask = torch.ones_like(tokens) if mask is None else mask.long().to(device)
        types = data.get("token_type_ids")
        types = types.long().to(device) if types is not None else None
        order = data.get("next_sentence_label")
        if self.binary_head and order is None:
            raise KeyError(
                "this BERT has the sentence-order head (its config's num_labels is 2): the batch needs "
                "'next_sentence_label' [b] (or build it from a config with num_labels=1 to leave the head out)"
            )
        order = order.long().to(device) if order is not None else None
        return tokens, types, order, loss_mask, labels, padding_mask

    def loss(self, loss_mask: Any, sentence_order: Any, output_tensor: Any) -> tuple[Any, ...]:
        """The masked-LM mean (+ the sentence-order loss), counted as one item per micro-batch, and its parts.

        Megatron's 3-part contract with a count of 1: each micro-batch's mean weighs the same (the reference's
        average over micro-batches and data-parallel ranks) whatever ``calculate_per_token_loss`` says.
        """
        lm_losses, sop_logits = output_tensor
        mask = loss_mask.reshape(-1).float()
        lm = torch.sum(lm_losses.float().reshape(-1) * mask) / mask.sum().clamp(min=1)
        one = torch.ones((), dtype=lm.dtype, device=lm.device)
        report = {"lm loss": torch.stack([lm.detach(), one])}
        total = lm
        if sop_logits is not None:
            sop = torch.nn.functional.cross_entropy(
                sop_logits.reshape(-1, 2).float(), sentence_order.reshape(-1), ignore_index=-1
            )
            report["sop loss"] = torch.stack([sop.detach(), one])
            total = lm + sop
        return total, torch.ones((), dtype=torch.int, device=lm.device), report

    def forward_step(self, data_iterator: Any, model: Any) -> tuple[Any, Any]:
        tokens, types, order, loss_mask, labels, padding_mask = self.get_batch(data_iterator)
        if not self.binary_head:
            types = None  # the reference: token types only with the binary head
        output = model(tokens, padding_mask, tokentype_ids=types, lm_labels=labels)
        return output, partial(self.loss_func, loss_mask, order)
