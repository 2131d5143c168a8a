"""Megatron-LM through megatron-core (``pip install 'accel_nb[megatron]'``): the reference's Megatron integration.

- ``plugin``: ``MegatronLMPlugin`` and ``MegatronLMDummyScheduler`` (no heavy imports)
- ``checks``: what is refused, before anything starts (GPU-only settings, settings not built, no GPU)
- ``model``: the GPTModel a GPT-2/Llama config stands for; full weights to and from the slices
- ``preparing``: ``prepare`` under Megatron (process groups, DDP, optimizer, scheduler, loaders)
- ``engine``: ``MegatronEngine``, whose forward is a training step, and its optimizer/scheduler wrappers
- ``helpers``: gathers and averages over the data-parallel group

The back-end class is ``accel_nb.accelerator.backends.megatron.MegatronBackend``; docs/megatron.md says what
runs where.

    from accel_nb.megatron import MegatronLMPlugin
    accelerator = Accelerator(megatron_lm_plugin=MegatronLMPlugin(tp_degree=2, pp_degree=2))
"""

from __future__ import annotations

from .plugin import MegatronLMDummyScheduler, MegatronLMPlugin

__all__ = ["MegatronLMDummyScheduler", "MegatronLMPlugin"]
