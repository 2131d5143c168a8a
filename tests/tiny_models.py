"""The small model configs the quantization tests share (transformers configs: nothing is downloaded)."""

from __future__ import annotations


def tiny_llama_config(hidden_size: int = 128, intermediate_size: int = 320, layers: int = 3):
    """A 3-block Llama with 128-wide layers: big enough for 4-bit blocks, quick on a CPU. The FP8 tests ask
    for a smaller one (32 wide, 2 blocks): torch's CPU float8 matmul is slow."""
    import transformers

    return transformers.LlamaConfig(
        vocab_size=256,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=layers,
        num_attention_heads=hidden_size // 32 * 2,
        num_key_value_heads=hidden_size // 64 * 2 or 1,
        max_position_embeddings=64,
    )
