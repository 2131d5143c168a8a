"""The small model configs the quantization tests share (transformers configs: nothing is downloaded)."""

from __future__ import annotations


def tiny_llama_config():
    """A 3-block Llama with 128-wide layers: big enough for 4-bit blocks, quick on a CPU."""
    import transformers

    return transformers.LlamaConfig(
        vocab_size=256,
        hidden_size=128,
        intermediate_size=320,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
