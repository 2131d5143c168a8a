"""What ``accel-nb migrate --check`` knows about the reference (accelerate): names left out, differences.

One home for this data: ``tests/test_migration_paths.py`` reads ``LEFT_OUT`` from here, and
docs/migration.md names every entry (``tests/test_migrate_check.py`` checks the differences' anchors).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = [
    "DIFFERENCES",
    "KEYWORD_RULES",
    "LEFT_OUT",
    "LAUNCHER_REFERENCE_OPTIONS",
    "Difference",
    "KeywordRule",
]

_Q = "not provided: load_and_quantize_model quantizes and offloads in one step (docs/quantization.md)"
_PAR = "not provided: tensor parallelism is ParallelismConfig(tp_size=...) (docs/parallelism.md)"
_MEGATRON = (
    "accel_nb runs Megatron-LM on megatron-core (MegatronLMPlugin, MegatronLMDummyScheduler and the Megatron "
    "helpers are in accel_nb.utils; docs/megatron.md); the reference's megatron.training parts (its model-config "
    "parsers, its dataset loader, its train-step classes) are not built"
)
_DEVICES = (
    "device kinds accel_nb does not run on (Ascend NPU, MLU, MUSA, SDAA, Gaudi/HPU, Neuron, XPU collectives)"
)
_LAUNCH = (
    "the reference's launcher internals; `accel-nb launch` builds its own torchrun command (accel_nb.launch)"
)
_PROBES = (
    "hardware probes of the reference's launcher; `accel-nb env` (accel_nb.hardware) reports the machine"
)
_GATES = "version gates and launcher tables of the reference's internals; accel_nb decides these where it uses them"
_INTERNAL = "internal to the reference's implementation; code written for it does not import these"

# "module" (every name of accelerate.utils.<module>) or "module.name" -> why it is not under accel_nb.utils;
# "module.name" for a top-level module of the reference (accelerate.<module>.name). A name another module
# imports from there (accelerate.accelerator.MegatronLMPlugin) is left out for its home's reason.
LEFT_OUT: dict[str, str] = {
    "bnb.quantize_and_offload_8bit": _Q,
    "deepspeed.HfDeepSpeedConfig": "transformers' DeepSpeed config holder; accel_nb's DeepSpeedPlugin reads and fills the config itself",
    "deepspeed.get_active_deepspeed_plugin": "accel_nb takes one DeepSpeed plugin per Accelerator (accelerator.deepspeed_plugin)",
    "deepspeed.map_pytorch_optim_to_deepspeed": "accel_nb hands the torch optimizer to the engine as given (docs/deepspeed.md)",
    "megatron_lm": _MEGATRON,
    "fsdp_utils": "not yet: accel_nb's FSDP saves and loads through Accelerator.save_state / load_state (accel_nb.fsdp)",
    **{
        f"launch.{n}": _LAUNCH
        for n in [
            "PrepareForLaunch",
            "env_var_path_add",
            "prepare_deepspeed_cmd_env",
            "prepare_extend_env_parallelism_config",
            "prepare_sagemager_args_inputs",
            "prepare_tpu",
            "setup_fp8_env",
        ]
    },
    "rich": "the reference's optional rich tracebacks; not provided",
    "torch_xla": "installs packages with pip; see docs/tpu.md for setting up torch_xla",
    **{
        f"constants.{n}": _GATES
        for n in [
            "CUDA_DISTRIBUTED_TYPES",
            "DEEPSPEED_MULTINODE_LAUNCHERS",
            "DTENSOR_PYTORCH_VERSION",
            "ELASTIC_LOG_LINE_PREFIX_TEMPLATE_PYTORCH_VERSION",
            "FSDP2_PYTORCH_VERSION",
            "FSDP2_STATE_DICT_TYPE",
            "FSDP_AUTO_WRAP_POLICY",
            "FSDP_BACKWARD_PREFETCH",
            "FSDP_MODEL_NAME",
            "FSDP_PYTORCH_VERSION",
            "FSDP_SHARDING_STRATEGY",
            "FSDP_STATE_DICT_TYPE",
            "MITA_PROFILING_AVAILABLE_PYTORCH_VERSION",
            "SAGEMAKER_PARALLEL_EC2_INSTANCES",
            "SAGEMAKER_PYTHON_VERSION",
            "SAGEMAKER_PYTORCH_VERSION",
            "SAGEMAKER_TRANSFORMERS_VERSION",
            "TORCH_DISTRIBUTED_OPERATION_TYPES",
            "TORCH_LAUNCH_PARAMS",
            "XPU_PROFILING_AVAILABLE_PYTORCH_VERSION",
        ]
    },
    "constants.RNG_STATE_NAME": "accel_nb keeps RNG states in rank_<i>.pt, not random_states_<i>.pkl",
    "constants.SAMPLER_NAME": "accel_nb keeps sampler states in rank_<i>.pt, not sampler.bin",
    "dataclasses.DeepSpeedSequenceParallelConfig": "DeepSpeed's sequence parallelism (Ulysses) is not supported",
    **{f"dataclasses.{n}": _PAR for n in ["TorchTensorParallelPlugin"]},
    **{
        f"dataclasses.{n}": _MEGATRON
        for n in [
            "add_model_config_to_megatron_parser",
            "parse_bert_config",
            "parse_gpt2_config",
            "parse_t5_config",
            "parse_llama_config",
            "parse_glm4_moe_config",
        ]
    },
    "dataclasses.PrecisionType": "not provided: accel_nb takes mixed_precision as the strings 'no', 'fp16', 'bf16', 'fp8'",
    "dataclasses.EnumWithContains": _INTERNAL,
    "dataclasses.BaseEnum": _INTERNAL,
    **{
        f"environment.{n}": _PROBES
        for n in [
            "get_current_device_type",
            "get_gpu_info",
            "get_driver_version",
            "check_cuda_p2p_ib_support",
            "check_cuda_fp8_capability",
            "CPUInformation",
            "get_cpu_distributed_information",
            "override_numa_affinity",
            "set_numa_affinity",
        ]
    },
    "imports.deepspeed_required": _INTERNAL,
    "modeling.fallback_allocate": _INTERNAL,
    "modeling.get_mixed_precision_context_manager": "accel_nb applies autocast inside the prepared model (accel_nb.precision)",
    "modeling.get_grad_scaler": "accel_nb builds its scaler from GradScalerKwargs (accel_nb.precision)",
    "operations.is_torch_xpu_tensor": _DEVICES,
    "operations.verify_operation": "accel_nb checks shapes on every collective, not only in debug mode (ops.py)",
    "operations.chained_operation": "accel_nb checks shapes on every collective, not only in debug mode (ops.py)",
    "operations.GatheredParameters": "ZeRO-3 parameter gathering: use deepspeed.zero.GatheredParameters itself",
    "other.compile_regions_deepspeed": "torch.compile with DeepSpeed is refused with a clear error (docs/deepspeed.md)",
    **{f"other.{n}": _PAR for n in ["compile_regions_fsdp2", "model_has_dtensor"]},
    "dataclasses.MODEL_CONFIGS_TO_MEGATRON_PARSERS": _MEGATRON,
    "imports.USE_TORCH_XLA": _GATES,
    "other.TORCH_SAFE_GLOBALS": _INTERNAL,
    # the reference's top-level modules (accelerate.<module>): their keys never collide with utils' submodules
    **{
        f"checkpointing.{n}": "the reference's checkpoint internals take the parts one by one; accel_nb's "
        "save_accelerator_state(accelerator, dir) is what Accelerator.save_state / load_state run (accel_nb.checkpoint)"
        for n in [
            "save_accelerator_state",
            "load_accelerator_state",
            "save_custom_state",
            "load_custom_state",
        ]
    },
    "data_loader.DataLoaderAdapter": "wraps torchdata's StatefulDataLoader; accel_nb's prepared loaders keep "
    "their own position (loader.state_dict())",
    "data_loader.get_sampler": _INTERNAL,
    **{
        f"hooks.{n}": "the reference's dispatch internals; dispatch_model and cpu_offload attach accel_nb's hooks"
        for n in ["attach_align_device_hook_on_blocks", "attach_execution_device_hook"]
    },
    **{
        f"inference.{n}": "the reference's pipeline internals; prepare_pippy builds the pipeline (accel_nb.parallel.pipeline)"
        for n in ["build_pipeline", "find_pippy_batch_size", "generate_device_map", "pippy_forward"]
    },
    "launchers.test_launch": _INTERNAL,
    **{f"optimizer.{n}": _INTERNAL for n in ["move_to_device", "patch_optimizer_step"]},
    **{f"state.{n}": _INTERNAL for n in ["ThreadLocalSharedDict", "do_nothing", "is_initialized"]},
    **{
        f"tracking.{n}": "the reference's tracker internals; accel_nb resolves log_with itself "
        "(accel_nb.tracking.available_trackers, resolve_log_with)"
        for n in ["filter_trackers", "get_available_trackers", "on_main_process"]
    },
}


_DELIBERATE = "docs/migration.md, Deliberate differences"
_MATCHED = "docs/migration.md, Matched side by side with the reference"


@dataclass(frozen=True)
class Difference:
    """A deliberate difference touched by using ``name`` (a function/class ``__qualname__``, or
    ``Accelerator.<method>``): what differs and what to change. ``anchor`` is a phrase of docs/migration.md."""

    name: str
    message: str
    anchor: str


DIFFERENCES: tuple[Difference, ...] = (
    Difference(
        "infer_auto_device_map",
        "accel_nb's planner may place modules differently from the reference's (map.plan.explain() says why)",
        "`infer_auto_device_map` is accel_nb's planner",
    ),
    Difference(
        "notebook_launcher",
        "a failed launch raises accel_nb's LaunchError, also a torch ChildFailedError; its .failures is a list "
        "of accel_nb's RankFailure, not torch's dict of ProcessFailure",
        "A failed notebook launch raises `LaunchError`",
    ),
    Difference(
        "get_state_dict_offloaded_model",
        "returns every tensor, including those the root module holds itself",
        "`get_state_dict_offloaded_model` returns every tensor",
    ),
    Difference(
        "attach_layerwise_casting_hooks",
        "a single string as skip_modules_pattern is one pattern here (give a list to behave the same in both)",
        "a single string as `skip_modules_pattern` is one pattern here",
    ),
    Difference(
        "FullyShardedDataParallelPlugin",
        "FSDP is torch's FSDP2 whatever fsdp_version says; checkpoints use accel_nb's sharded layout",
        "FSDP is torch's FSDP2",
    ),
    Difference(
        "TorchDynamoPlugin",
        "torch.compile goes inside the DDP wrapper; a compiler failure at the first call warns and runs eagerly",
        "torch.compile goes inside the DDP wrapper",
    ),
    Difference(
        "Accelerator.end_training",
        "leaves the process group up (collectives still work after it); nothing to change",
        "`end_training()` leaves the process group up",
    ),
    Difference(
        "Accelerator.join_uneven_inputs",
        "applies torch's Join on CPU (gloo) process groups too, where the reference does nothing",
        "`join_uneven_inputs` also works on CPU process groups",
    ),
    Difference(
        "Accelerator.register_save_state_pre_hook",
        "the hook's output_dir is the temporary folder of the atomic save; weights hold unwrapped state dicts",
        "Save pre-hooks get the folder being written",
    ),
    Difference(
        "Accelerator.load_state",
        "a loader saved at an epoch's end resumes with the next epoch's shuffle (the reference replays the first)",
        "A loader saved at the end of an epoch resumes with the next epoch's shuffle",
    ),
    # noted by `migrate --check` from the call itself (migrate_checker): its place, its arguments
    Difference(
        "Accelerator.register_load_state_pre_hook",
        "the hook gets the user's models (what unwrap_model gives, not the DDP wrapper), as in the reference; "
        "nothing to change",
        "`models` are the user's modules",
    ),
    Difference(
        "Accelerator(log_with=..., project_dir=...)",
        "with a project_dir, W&B's run folder is <project_dir>/wandb/ and Comet's offline archives "
        "<project_dir>/comet/ (the reference: their default folders), TensorBoard's run config goes into the "
        "run's event file; init_kwargs={'wandb': {'dir': '.'}} gives the reference's W&B folder",
        "Tracker files stay under `project_dir`",
    ),
    Difference(
        "Accelerator.device",
        "on a CPU process it is `cpu` (index None) where the reference's is `cpu:0`: compare `device.type`, "
        "or with tensor.device",
        "A CPU process's device is `cpu`",
    ),
    Difference(
        "Accelerator.save_state(a folder per rank)",
        "a folder that differs per rank: the whole checkpoint goes to the main process's folder (the other "
        "ranks warn) and load_state refuses different folders; pass the same folder on every rank",
        "A checkpoint is one folder, the main process's",
    ),
)


def _literal(*values: Any) -> Callable[[Any], bool]:
    return lambda v: v in values


def _any(_v: Any) -> bool:
    return True


def _not_none(v: Any) -> bool:
    return v is not None


@dataclass(frozen=True)
class KeywordRule:
    """``callee(keyword=value)`` (or the value at ``position``) that accel_nb refuses (``error``) or where it
    differs (``note``); ``matches`` says which literal values the rule is about."""

    callee: str
    keyword: str
    matches: Callable[[Any], bool]
    severity: str
    message: str
    position: int | None = None


_FSDP1 = "an FSDP1-only field: accel_nb runs FSDP2 and warns once that it does nothing"
_RDZV = (
    "refused from a notebook (LaunchSetupError): elastic restarts and rendezvous settings need "
    "`accel-nb launch --max_restarts ...` on a script"
)

KEYWORD_RULES: tuple[KeywordRule, ...] = (
    KeywordRule(
        "Accelerator",
        "mixed_precision",
        _literal("fp8"),
        "note",
        "FP8 trains with torchao (AORecipeKwargs); TransformerEngine and MS-AMP recipes are refused (docs/fp8.md)",
        position=0,
    ),
    KeywordRule(
        "infer_auto_device_map",
        "clean_result",
        _literal(False),
        "error",
        "the reference planner's unclean maps are refused (ValueError): drop it",
    ),
    KeywordRule(
        "cpu_offload",
        "state_dict",
        _not_none,
        "error",
        "refused: accel_nb offloads the tensors the model holds; load the state dict into the model first",
    ),
    KeywordRule(
        "GradientAccumulationPlugin",
        "adjust_scheduler",
        _literal(False),
        "note",
        "changes nothing (a warning says so): a prepared scheduler already steps only when the optimizer does",
    ),
    *(
        KeywordRule("FullyShardedDataParallelPlugin", k, _not_none, "note", _FSDP1)
        for k in (
            "backward_prefetch",
            "forward_prefetch",
            "limit_all_gathers",
            "use_orig_params",
            "sync_module_states",
        )
    ),
    KeywordRule(
        "FullyShardedDataParallelPlugin", "fsdp_version", _literal(1), "note", "runs as FSDP2 with a warning"
    ),
    *(
        KeywordRule(
            "FullyShardedDataParallelPlugin",
            k,
            _not_none,
            "error",
            "not implemented by accel_nb's FSDP: an error",
        )
        for k in ("ignored_modules", "param_init_fn")
    ),
    KeywordRule(
        "DataLoaderConfiguration",
        "use_stateful_dataloader",
        _literal(True),
        "note",
        "loader.state_dict() is accel_nb's position dict, not torchdata's: states do not load across libraries",
    ),
    *(
        KeywordRule("notebook_launcher", k, lambda v: v not in (0, None, "", "none"), "error", _RDZV)
        for k in ("rdzv_endpoint", "rdzv_id")
    ),
    *(
        KeywordRule(
            "notebook_launcher", k, _not_none, "note", "accepted for compatibility; it has no effect (warns)"
        )
        for k in ("monitor_interval", "log_line_prefix_template")
    ),
    *(
        KeywordRule(
            callee,
            "reduction",
            _literal("min", "product"),
            "note",
            "computes the real minimum/product here (the reference sums)",
            position=1,
        )
        for callee in ("reduce", "Accelerator.reduce")
    ),
    KeywordRule(
        "Accelerator",
        "dynamo_backend",
        lambda v: str(v).lower() not in ("no", "none"),
        "note",
        "torch.compile goes inside the DDP wrapper here, and a compiler failure at the first call warns and "
        "runs eagerly (docs/migration.md: torch.compile goes inside the DDP wrapper)",
    ),
    KeywordRule(
        "TorchContextParallelConfig",
        "cp_comm_strategy",
        _literal("alltoall"),
        "note",
        "accepted, but Accelerator refuses it with cp_size > 1: accel_nb's context parallel all-gathers the "
        "keys and values (use 'allgather'; docs/migration.md: Context parallel is accel_nb's own)",
    ),
)

# notebook_launcher's **options: the reference's multi-machine arguments it takes besides LaunchOptions
LAUNCHER_REFERENCE_OPTIONS: frozenset[str] = frozenset(
    {
        "rdzv_endpoint",
        "rdzv_id",
        "max_restarts",
        "monitor_interval",
        "log_line_prefix_template",
        "num_nodes",
        "node_rank",
        "rdzv_backend",
        "rdzv_conf",
    }
)

# callables whose **kwargs only pass on to another accel_nb function ("module:name"): their keywords are
# checked against that function's signature
FORWARDS_KEYWORDS_TO: dict[str, str] = {
    "Accelerator.save_state": "accel_nb.checkpoint.save:save_accelerator_state",
    "Accelerator.load_state": "accel_nb.checkpoint.load:load_accelerator_state",
}
