"""``prepare`` under Megatron-LM: Megatron's process groups, the GPT model, its DDP, optimizer and scheduler.

The reference's order: the loaders give the micro-batch size (the smallest batch size of the loaders passed,
or the largest with ``is_train_batch_min=False``), the model its size, the optimizer its kind and settings, a
``MegatronLMDummyScheduler`` the scheduler's; then megatron-core builds this rank's part of the model and the
objects come back as the engine (the model), its optimizer and scheduler wrappers, and loaders that split
the data over the data-parallel ranks only (a tensor/pipeline group reads the same batches), each batch
holding ``num_micro_batches`` micro-batches.

    model, optimizer, loader, scheduler = prepare_megatron(accelerator, plugin, args)
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import DataLoader

__all__ = ["data_parallel_shards", "prepare_megatron", "start_model_parallel"]

INIT_SEED = 1234  # the seed Megatron's own initialisation starts from (megatron.training's --seed default)


def start_model_parallel(plugin: Any, device: Any) -> None:
    """megatron-core's tensor/pipeline/data-parallel groups over the launch's process group (once per process).

    One process has no process group in accel_nb; megatron-core needs one, so a one-rank group is made.
    """
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

    if ps.model_parallel_is_initialized():
        if (
            ps.get_tensor_model_parallel_world_size() != plugin.tp_degree
            or ps.get_pipeline_model_parallel_world_size() != plugin.pp_degree
        ):
            raise ValueError(
                "this process already runs Megatron with other tp/pp degrees; one layout per launch (start a new one)"
            )
        return
    if not dist.is_initialized():
        backend = "nccl" if getattr(device, "type", "") == "cuda" else "gloo"
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    ps.initialize_model_parallel(
        tensor_model_parallel_size=plugin.tp_degree, pipeline_model_parallel_size=plugin.pp_degree
    )
    model_parallel_cuda_manual_seed(INIT_SEED)


def data_parallel_shards() -> tuple[int, int]:
    """How many data-parallel ranks read different batches, and this process's one."""
    from megatron.core import parallel_state as ps

    return ps.get_data_parallel_world_size(), ps.get_data_parallel_rank()


def _classify(args: tuple[Any, ...]) -> dict[str, list[int]]:
    from .plugin import MegatronLMDummyScheduler

    kinds: dict[str, list[int]] = {"model": [], "optimizer": [], "dataloader": [], "scheduler": []}
    for i, obj in enumerate(args):
        if isinstance(obj, MegatronLMDummyScheduler):
            kinds["scheduler"].append(i)
        elif isinstance(obj, torch.nn.Module):
            kinds["model"].append(i)
        elif isinstance(obj, torch.optim.Optimizer):
            kinds["optimizer"].append(i)
        elif isinstance(obj, DataLoader):
            kinds["dataloader"].append(i)
        elif hasattr(obj, "step") and hasattr(obj, "get_last_lr"):
            raise ValueError(
                f"{type(obj).__name__} cannot be used with Megatron-LM: Megatron steps its own scheduler; pass "
                "accel_nb.utils.MegatronLMDummyScheduler(optimizer, total_num_steps=..., warmup_num_steps=...)"
            )
    for kind in ("model", "optimizer", "scheduler"):
        if len(kinds[kind]) > 1:
            raise ValueError(
                f"Megatron-LM prepares one {kind} per Accelerator; {len(kinds[kind])} were passed"
            )
    return kinds


def _optimizer_config(plugin: Any, optimizer: Any, params_dtype: Any) -> Any:
    from megatron.core.optimizer import OptimizerConfig

    name = type(optimizer).__name__.lower()
    defaults = optimizer.defaults
    settings: dict[str, Any] = dict(
        lr=float(defaults["lr"]),
        min_lr=float(plugin.min_lr),
        weight_decay=float(defaults.get("weight_decay", 0.0)),
        clip_grad=float(plugin.gradient_clipping),
        bf16=params_dtype == torch.bfloat16,
        fp16=params_dtype == torch.float16,
        params_dtype=params_dtype,
        use_distributed_optimizer=bool(plugin.use_distributed_optimizer),
        optimizer_cpu_offload=bool(plugin.optimizer_cpu_offload),
        overlap_cpu_optimizer_d2h_h2d=bool(plugin.overlap_cpu_optimizer_d2h_h2d),
        use_precision_aware_optimizer=bool(plugin.use_precision_aware_optimizer),
    )
    if "adam" in name:
        beta1, beta2 = defaults["betas"]
        settings.update(
            optimizer="adam",
            adam_beta1=float(beta1),
            adam_beta2=float(beta2),
            adam_eps=float(defaults["eps"]),
            decoupled_weight_decay="adamw" in name,
        )
    elif "sgd" in name:
        settings.update(optimizer="sgd", sgd_momentum=float(defaults.get("momentum", 0.0)))
    else:
        raise ValueError(
            f"Megatron-LM builds its own Adam/AdamW or SGD from the optimizer passed to prepare; "
            f"{type(optimizer).__name__} is neither"
        )
    return OptimizerConfig(**settings)


def _scheduler(plugin: Any, optimizer: Any, dummy: Any, lr: float) -> Any:
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

    total = plugin.train_iters or dummy.total_num_steps
    if total is None:
        raise ValueError(
            "MegatronLMDummyScheduler needs total_num_steps (or MegatronLMPlugin(train_iters=...)): Megatron's "
            "scheduler decays the learning rate over a known number of steps"
        )
    if plugin.train_samples is not None or plugin.lr_decay_samples is not None or plugin.lr_warmup_samples:
        raise ValueError(
            "MegatronLMPlugin's *_samples scheduler fields count Megatron dataset samples; use train_iters, "
            "lr_decay_iters and lr_warmup_iters (steps)"
        )
    warmup = plugin.lr_warmup_iters
    if warmup is None:
        warmup = (
            int(plugin.lr_warmup_fraction * total) if plugin.lr_warmup_fraction else dummy.warmup_num_steps
        )
    wd = optimizer.param_groups[0].get("weight_decay", 0.0) if optimizer.param_groups else 0.0
    start_wd = plugin.start_weight_decay if plugin.start_weight_decay is not None else wd
    end_wd = plugin.end_weight_decay if plugin.end_weight_decay is not None else wd
    return OptimizerParamScheduler(
        optimizer,
        init_lr=0.0 if warmup else lr,
        max_lr=lr,
        min_lr=float(plugin.min_lr),
        lr_warmup_steps=int(warmup),
        lr_decay_steps=int(plugin.lr_decay_iters or total),
        lr_decay_style=plugin.lr_decay_style,
        start_wd=float(start_wd),
        end_wd=float(end_wd),
        wd_incr_steps=int(total),
        wd_incr_style=plugin.weight_decay_incr_style,
    )


def model_shape(plugin: Any, model: Any) -> Any:
    """The size of the Megatron model the reference builds for ``model``: its BERT, T5 or GPT kinds."""
    from .bert import bert_shape, is_bert
    from .model import gpt_shape
    from .t5 import is_t5, t5_shape

    if is_bert(model.config):
        return bert_shape(model, plugin.encoder_seq_length or plugin.seq_length)
    if is_t5(model.config):
        return t5_shape(model.config, plugin.encoder_seq_length, plugin.decoder_seq_length)
    return gpt_shape(model.config, plugin.seq_length or plugin.decoder_seq_length)


def _provider(plugin: Any, shape: Any) -> Any:
    """The function that builds this stage's model: the plugin's own, BERT's, T5's or GPT's."""
    kind = shape.kind if shape is not None and plugin.custom_model_provider_function is None else "custom"
    if kind == "bert":
        from .bert import provide_bert

        return provide_bert
    if kind == "t5":
        from .t5 import provide_t5

        return provide_t5
    from .model import provide_model

    return provide_model


def train_step_for(plugin: Any, shape: Any) -> Any:
    """The reference's train step for the model kind (GPT's for a custom model, as the reference)."""
    if shape is not None and shape.kind == "bert":
        from .bert import BertTrainStep

        return BertTrainStep(plugin, shape.binary_head)
    if shape is not None and shape.kind == "t5":
        from .t5 import T5TrainStep

        return T5TrainStep(plugin)
    from .engine import GptTrainStep

    return GptTrainStep(plugin, shape.eos_token_id if shape is not None else 0)


def _rebatched(loader: DataLoader, batch_size: int) -> DataLoader:
    """``loader`` with ``batch_size`` samples per batch (the micro-batches of one step together)."""
    if loader.batch_size is None:
        raise ValueError(
            "with Megatron-LM every loader needs a batch_size (not a batch_sampler): its batches are rebuilt to hold "
            "the num_micro_batches micro-batches of one step"
        )
    return DataLoader(
        loader.dataset,
        batch_size=batch_size,
        shuffle=isinstance(loader.sampler, torch.utils.data.RandomSampler),
        collate_fn=loader.collate_fn,
        drop_last=loader.drop_last,
        num_workers=loader.num_workers,
        pin_memory=loader.pin_memory,
        generator=loader.generator,
    )


def prepare_megatron(accelerator: Any, plugin: Any, args: tuple[Any, ...]) -> list[Any]:
    """The reference's ``_prepare_megatron_lm`` on megatron-core: everything passed, prepared, in order."""
    from megatron.core import parallel_state as ps
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.optimizer import get_megatron_optimizer

    from .engine import MegatronEngine, MegatronLMOptimizerWrapper, MegatronLMSchedulerWrapper
    from .model import transformer_config, zero_vocab_padding

    kinds = _classify(args)
    loaders = [args[i] for i in kinds["dataloader"]]
    sizes = [dl.batch_size for dl in loaders if dl.batch_size is not None]
    if plugin.micro_batch_size is not None and not kinds["model"]:
        micro = plugin.micro_batch_size  # a loader prepared later follows the engine's micro-batch size
    elif not sizes:
        raise ValueError(
            "Megatron-LM needs a training or evaluation DataLoader with a batch_size in prepare()"
        )
    else:
        micro = min(sizes) if plugin.is_train_batch_min else max(sizes)
    start_model_parallel(plugin, accelerator.device)
    dp = ps.get_data_parallel_world_size()
    plugin.set_training_args(micro, dp)
    result = list(args)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(
        str(accelerator.mixed_precision), torch.float32
    )

    model_engine = optimizer_wrapper = None
    if kinds["model"]:
        model = args[kinds["model"][0]]
        shape = None
        if plugin.custom_model_provider_function is None:
            if getattr(model, "config", None) is None:
                raise ValueError(
                    f"Megatron-LM builds its model from a transformers model's config; {type(model).__name__} has "
                    "none: pass a GPT-2, Llama or Megatron-BERT model, or "
                    "MegatronLMPlugin(custom_model_provider_function=...)"
                )
            shape = model_shape(plugin, model)
        config = transformer_config(plugin, shape, accelerator.device.type, dtype)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(INIT_SEED + 100 * ps.get_pipeline_model_parallel_rank())
            chunk = _provider(plugin, shape)(
                plugin,
                config,
                shape,
                ps.is_pipeline_first_stage(ignore_virtual=True),
                ps.is_pipeline_last_stage(ignore_virtual=True),
            )
        if shape is not None:  # the vocabulary's padding rows start at zero in every layout
            zero_vocab_padding(chunk, shape.vocab_size)
        chunk = chunk.to(accelerator.device)
        ddp_config = DistributedDataParallelConfig(
            grad_reduce_in_fp32=True, use_distributed_optimizer=bool(plugin.use_distributed_optimizer)
        )
        ddp = DistributedDataParallel(config=chunk.config, ddp_config=ddp_config, module=chunk)
        ddp.broadcast_params()  # the data-parallel copies start equal
        source = args[kinds["optimizer"][0]] if kinds["optimizer"] else torch.optim.AdamW([torch.zeros(1)])
        megatron_optimizer = get_megatron_optimizer(_optimizer_config(plugin, source, dtype), [ddp])
        scheduler = None
        if kinds["scheduler"]:
            dummy = args[kinds["scheduler"][0]]
            scheduler = _scheduler(plugin, megatron_optimizer, dummy, float(source.defaults["lr"]))
        step = (
            plugin.custom_train_step_class(plugin, **(plugin.custom_train_step_kwargs or {}))
            if plugin.custom_train_step_class is not None
            else train_step_for(plugin, shape)
        )
        model_engine = MegatronEngine(plugin, [ddp], megatron_optimizer, scheduler, step, shape)
        optimizer_wrapper = MegatronLMOptimizerWrapper(megatron_optimizer)
        optimizer_wrapper.engine = model_engine
        result[kinds["model"][0]] = accelerator.register_prepared(model_engine, "model")
        if kinds["optimizer"]:
            result[kinds["optimizer"][0]] = accelerator.register_prepared(optimizer_wrapper, "optimizer")
        if kinds["scheduler"]:
            wrapper = MegatronLMSchedulerWrapper(scheduler, megatron_optimizer)
            result[kinds["scheduler"][0]] = accelerator.register_prepared(wrapper, "scheduler")
    elif kinds["optimizer"] or kinds["scheduler"]:
        raise ValueError(
            "Megatron-LM prepares the optimizer and scheduler together with the model: pass the model too"
        )
    for i in kinds["dataloader"]:
        loader = args[i]
        if loader.batch_size != micro * plugin.num_micro_batches:
            loader = _rebatched(loader, micro * plugin.num_micro_batches)
        result[i] = accelerator.prepare_data_loader(loader)
    return result
