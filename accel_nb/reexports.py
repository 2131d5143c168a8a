"""The names each of the reference's module paths has because it imports them, and where each lives here.

accelerate's modules import helpers from one another, so code written for it imports such names from
wherever it met them (``from accelerate.accelerator import DataLoaderConfiguration``,
``from accelerate.state import is_npu_available``). Each accel_nb module at one of those paths takes its
share of this table and resolves every name on first use from accel_nb's one implementation:

    __getattr__, __dir__ = lazy_exports(globals(), {**reexports(__name__), **_EXPORTS})

``_PATHS`` was read off ``dir()`` of the installed reference's modules; ``_HOMES`` says which accel_nb
module defines each name. ``tests/test_migration_paths.py`` rereads the reference at test time: a name it
has that is neither here, nor defined by the accel_nb module itself, nor in ``LEFT_OUT``
(accel_nb.commands.migrate_data, with the reason) fails that test.
"""

from __future__ import annotations

__all__ = ["reexports"]

# accel_nb module that defines the name -> the names (space separated)
_HOMES: dict[str, str] = {
    "accel_nb.accelerator.accelerator": "Accelerator",
    "accel_nb.accelerator.optim": "AcceleratedOptimizer AcceleratedScheduler",
    "accel_nb.accelerator.unwrap": "extract_model_from_parallel is_compiled_module",
    "accel_nb.availability": (
        "compare_versions is_4bit_bnb_available is_8bit_bnb_available is_aim_available is_bf16_available "
        "is_bitsandbytes_multi_backend_available "
        "is_bnb_available is_clearml_available is_comet_ml_available is_cuda_available "
        "is_datasets_available is_deepspeed_available is_dvclive_available is_fp8_available "
        "is_habana_gaudi1 is_hpu_available is_lomo_available is_megatron_lm_available is_mlflow_available "
        "is_mlu_available is_mps_available is_msamp_available is_musa_available is_neuron_available "
        "is_npu_available is_numpy_available is_peft_available is_pippy_available is_rocm_available "
        "is_sdaa_available is_swanlab_available is_tensorboard_available is_torch_distributed_available "
        "is_torch_version is_torch_xla_available is_torchao_available torchao_required "
        "is_torchdata_stateful_dataloader_available is_tqdm_available is_trackio_available "
        "is_transformer_engine_available is_wandb_available is_weights_only_available is_xccl_available "
        "is_xpu_available"
    ),
    "accel_nb.big_model.dispatch": "dispatch_model",
    "accel_nb.big_model.empty_init": "init_empty_weights",
    "accel_nb.big_model.layerwise_casting": "LayerwiseCastingHook SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING",
    "accel_nb.big_model.loading": "load_checkpoint_in_model",
    "accel_nb.big_model.model_hooks": "add_hook_to_module AlignDevicesHook attach_align_device_hook CpuOffload UserCpuOffloadHook",
    "accel_nb.big_model.module_helpers": (
        "calculate_maximum_sizes get_non_persistent_buffers get_state_dict_offloaded_model "
        "has_offloaded_params id_tensor_storage retie_parameters"
    ),
    "accel_nb.big_model.module_tensors": "find_tied_parameters named_module_tensors set_module_tensor_to_device",
    "accel_nb.big_model.planning.device_map": "infer_auto_device_map",
    "accel_nb.big_model.planning.map_checks": "check_device_map",
    "accel_nb.big_model.planning.sizes": "CustomDtype get_balanced_memory",
    "accel_nb.big_model.quantization.config": "BnbQuantizationConfig",
    "accel_nb.big_model.weight_files": (
        "extract_submodules_state_dict load_offloaded_weight offload_state_dict offload_weight "
        "OffloadedWeightsLoader PrefixedDataset save_offload_index"
    ),
    "accel_nb.checkpoint.layout": "ProjectConfiguration",
    "accel_nb.compile.apply": "compile_regions",
    "accel_nb.compile.options": "DynamoBackend TorchDynamoPlugin",
    "accel_nb.config.basic": "write_basic_config",
    "accel_nb.data.dispatch": "DataLoaderDispatcher",
    "accel_nb.data.skipping": "skip_first_batches",
    "accel_nb.data.prepare": "DataLoaderConfiguration prepare_data_loader",
    "accel_nb.data.random_sync": "RNGType synchronize_rng_states",
    "accel_nb.deepspeed.plugin": "DeepSpeedPlugin",
    "accel_nb.megatron.plugin": "MegatronLMPlugin",
    "accel_nb.deepspeed.wrappers": (
        "DeepSpeedEngineWrapper DeepSpeedOptimizerWrapper DeepSpeedSchedulerWrapper DummyOptim DummyScheduler"
    ),
    "accel_nb.environment": (
        "are_libraries_initialized get_int_from_env parse_choice_from_env parse_flag_from_env "
        "patch_environment str_to_bool"
    ),
    "accel_nb.fsdp.options": "FullyShardedDataParallelPlugin",
    "accel_nb.kwargs_handlers": (
        "AutocastKwargs DistributedDataParallelKwargs GradientAccumulationPlugin GradScalerKwargs "
        "InitProcessGroupKwargs KwargsHandler ProfileKwargs"
    ),
    "accel_nb.logging": "get_logger",
    "accel_nb.precision.fp8": "convert_model_to_fp8_ao",
    "accel_nb.precision.fp8_recipes": "AORecipeKwargs FP8BackendType FP8RecipeKwargs MSAMPRecipeKwargs TERecipeKwargs",
    "accel_nb.precision.fp8_te": "apply_fp8_autowrap convert_model",
    "accel_nb.memory": "clear_device_cache release_memory",
    "accel_nb.misc": (
        "check_os_kernel clean_state_dict_for_safetensors convert_bytes get_free_port get_pretty_name "
        "is_port_in_use load merge_dicts recursive_getattr reduce save tqdm wait_for_everyone"
    ),
    "accel_nb.nested": (
        "concatenate convert_outputs_to_fp32 find_batch_size find_device get_data_structure honor_type "
        "ignorant_find_batch_size initialize_tensors listify pad_input_tensors slice_tensors "
        "TensorInformation"
    ),
    "accel_nb.notebook.launcher": "debug_launcher notebook_launcher",
    "accel_nb.ops": (
        "broadcast broadcast_object_list copy_tensor_to_devices gather gather_object pad_across_processes "
        "recursively_apply send_to_device"
    ),
    "accel_nb.parallel.config": "ParallelismConfig",
    "accel_nb.state": "AcceleratorState DistributedType GradientState PartialState",
    "accel_nb.config.values": "ComputeEnvironment SageMakerDistributedType",
    "accel_nb.tracking": "LoggerType",
    "accel_nb.tracking.registry": "LOGGER_TYPE_TO_CLASS",
    "accel_nb.parallel.tensor_parallel": "get_model_tp_size",
    "accel_nb.tracking.base": "GeneralTracker",
    "accel_nb.utils.constants": (
        "BETA_CP_AVAILABLE_PYTORCH_VERSION BETA_TP_AVAILABLE_PYTORCH_VERSION BETA_TP_AVAILABLE_TRANSFORMERS_VERSION "
        "MODEL_NAME OPTIMIZER_NAME PROFILE_PATTERN_NAME SAFE_MODEL_NAME SAFE_WEIGHTS_INDEX_NAME "
        "SAFE_WEIGHTS_NAME SAFE_WEIGHTS_PATTERN_NAME SCALER_NAME SCHEDULER_NAME STR_OPERATION_TO_FUNC "
        "WEIGHTS_INDEX_NAME WEIGHTS_NAME WEIGHTS_PATTERN_NAME"
    ),
}

# the reference's module path (after "accelerate.") -> the names accel_nb's module at that path takes from _HOMES
_PATHS: dict[str, str] = {
    "accelerator": (
        "AORecipeKwargs apply_fp8_autowrap convert_model convert_model_to_fp8_ao FP8BackendType FP8RecipeKwargs "
        "MSAMPRecipeKwargs TERecipeKwargs "
        "AutocastKwargs check_os_kernel clean_state_dict_for_safetensors compare_versions compile_regions "
        "convert_outputs_to_fp32 DataLoaderConfiguration DataLoaderDispatcher DeepSpeedEngineWrapper "
        "DeepSpeedOptimizerWrapper DeepSpeedPlugin DeepSpeedSchedulerWrapper MegatronLMPlugin "
        "DistributedDataParallelKwargs DummyOptim DummyScheduler DynamoBackend "
        "extract_model_from_parallel FullyShardedDataParallelPlugin gather gather_object GeneralTracker "
        "get_logger get_pretty_name get_state_dict_offloaded_model GradientAccumulationPlugin "
        "GradScalerKwargs has_offloaded_params InitProcessGroupKwargs is_bf16_available "
        "is_compiled_module get_model_tp_size LOGGER_TYPE_TO_CLASS is_bitsandbytes_multi_backend_available "
        "is_deepspeed_available is_lomo_available "
        "is_megatron_lm_available "
        "is_mlu_available is_msamp_available is_musa_available is_npu_available is_torch_version "
        "is_torch_xla_available is_torchao_available is_transformer_engine_available is_xpu_available "
        "KwargsHandler LoggerType MODEL_NAME pad_across_processes ParallelismConfig parse_choice_from_env "
        "prepare_data_loader PROFILE_PATTERN_NAME ProfileKwargs ProjectConfiguration recursively_apply "
        "reduce release_memory RNGType SAFE_WEIGHTS_INDEX_NAME SAFE_WEIGHTS_NAME "
        "SAFE_WEIGHTS_PATTERN_NAME save SCALER_NAME skip_first_batches TorchDynamoPlugin "
        "wait_for_everyone WEIGHTS_INDEX_NAME WEIGHTS_NAME WEIGHTS_PATTERN_NAME"
    ),
    "big_modeling": (
        "add_hook_to_module AlignDevicesHook attach_align_device_hook check_device_map CpuOffload "
        "extract_submodules_state_dict find_tied_parameters get_balanced_memory infer_auto_device_map "
        "is_bnb_available is_mlu_available is_musa_available is_neuron_available is_npu_available "
        "is_sdaa_available is_xpu_available LayerwiseCastingHook load_checkpoint_in_model "
        "offload_state_dict OffloadedWeightsLoader parse_flag_from_env recursive_getattr retie_parameters "
        "SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING UserCpuOffloadHook"
    ),
    "checkpointing": (
        "get_logger get_pretty_name is_cuda_available is_hpu_available is_mlu_available is_musa_available "
        "is_neuron_available is_sdaa_available is_torch_version is_torch_xla_available is_xpu_available "
        "load MODEL_NAME OPTIMIZER_NAME PartialState SAFE_MODEL_NAME SAFE_WEIGHTS_NAME save SCALER_NAME "
        "SCHEDULER_NAME WEIGHTS_NAME"
    ),
    "data_loader": (
        "broadcast broadcast_object_list compare_versions concatenate DistributedType find_batch_size "
        "get_data_structure get_logger GradientState initialize_tensors is_datasets_available "
        "is_torch_version is_torch_xla_available is_torchdata_stateful_dataloader_available PartialState "
        "RNGType send_to_device slice_tensors synchronize_rng_states"
    ),
    "hooks": (
        "clear_device_cache find_device get_non_persistent_buffers is_mlu_available is_musa_available "
        "is_npu_available LayerwiseCastingHook named_module_tensors PartialState PrefixedDataset "
        "recursive_getattr send_to_device set_module_tensor_to_device"
    ),
    "inference": (
        "calculate_maximum_sizes convert_bytes copy_tensor_to_devices ignorant_find_batch_size "
        "infer_auto_device_map is_pippy_available pad_input_tensors PartialState send_to_device"
    ),
    "launchers": (
        "AcceleratorState are_libraries_initialized debug_launcher is_mps_available is_rocm_available "
        "is_torch_version notebook_launcher PartialState patch_environment"
    ),
    "local_sgd": "Accelerator DistributedType",
    "logging": "PartialState",
    "optimizer": (
        "AcceleratedOptimizer AcceleratorState DistributedType GradientState honor_type is_lomo_available "
        "is_torch_xla_available"
    ),
    "parallelism_config": "DistributedType is_torch_version",
    "scheduler": "AcceleratedScheduler AcceleratorState GradientState",
    "state": (
        "DynamoBackend get_int_from_env GradientAccumulationPlugin is_datasets_available "
        "is_deepspeed_available is_fp8_available is_habana_gaudi1 is_hpu_available is_mlu_available "
        "is_mps_available is_musa_available is_neuron_available is_npu_available is_sdaa_available "
        "is_torch_xla_available is_xccl_available is_xpu_available parse_choice_from_env "
        "parse_flag_from_env SageMakerDistributedType"
    ),
    "tracking": (
        "compare_versions get_logger is_aim_available is_clearml_available is_comet_ml_available "
        "is_dvclive_available is_mlflow_available is_swanlab_available is_tensorboard_available "
        "is_trackio_available is_wandb_available listify PartialState str_to_bool"
    ),
    "utils.ao": "is_torchao_available torchao_required",
    "utils.bnb": (
        "BnbQuantizationConfig dispatch_model find_tied_parameters get_balanced_memory "
        "infer_auto_device_map init_empty_weights is_4bit_bnb_available is_8bit_bnb_available "
        "load_checkpoint_in_model offload_weight set_module_tensor_to_device"
    ),
    "utils.dataclasses": (
        "BETA_CP_AVAILABLE_PYTORCH_VERSION BETA_TP_AVAILABLE_PYTORCH_VERSION BETA_TP_AVAILABLE_TRANSFORMERS_VERSION "
        "compare_versions is_cuda_available is_hpu_available is_mlu_available is_msamp_available "
        "is_musa_available is_neuron_available is_npu_available is_rocm_available is_torch_version "
        "is_torchao_available is_transformer_engine_available is_xpu_available parse_flag_from_env "
        "str_to_bool"
    ),
    "utils.deepspeed": "AcceleratedOptimizer AcceleratedScheduler compare_versions DistributedType is_bnb_available",
    "utils.imports": "compare_versions is_torch_version parse_flag_from_env patch_environment str_to_bool",
    "utils.launch": (
        "compare_versions DistributedType DynamoBackend get_free_port is_fp8_available is_hpu_available "
        "is_mlu_available is_musa_available is_neuron_available is_npu_available is_port_in_use "
        "is_sdaa_available is_torch_xla_available is_xpu_available merge_dicts SageMakerDistributedType str_to_bool"
    ),
    "utils.memory": (
        "is_cuda_available is_hpu_available is_mlu_available is_mps_available is_musa_available "
        "is_neuron_available is_npu_available is_sdaa_available is_xpu_available"
    ),
    "utils.modeling": (
        "AcceleratorState AutocastKwargs clear_device_cache CustomDtype DistributedType is_hpu_available "
        "is_mlu_available is_mps_available is_musa_available is_npu_available is_peft_available "
        "is_sdaa_available is_torch_version is_torch_xla_available is_tqdm_available is_xpu_available "
        "load_offloaded_weight offload_weight SAFE_WEIGHTS_NAME save_offload_index tqdm "
        "WEIGHTS_INDEX_NAME WEIGHTS_NAME"
    ),
    "utils.operations": (
        "AcceleratorState DistributedType is_npu_available is_torch_distributed_available "
        "is_torch_version is_torch_xla_available PartialState TensorInformation"
    ),
    "utils.other": (
        "convert_model DistributedType get_logger id_tensor_storage is_deepspeed_available is_numpy_available "
        "is_torch_distributed_available is_torch_version is_torch_xla_available is_weights_only_available "
        "PartialState write_basic_config"
    ),
    "utils.random": (
        "AcceleratorState DistributedType is_hpu_available is_mlu_available is_musa_available "
        "is_neuron_available is_npu_available is_sdaa_available is_torch_xla_available is_xpu_available "
        "RNGType"
    ),
    "utils.tqdm": "is_tqdm_available PartialState",
    "utils.transformer_engine": "is_hpu_available is_transformer_engine_available",
    "utils.versions": "STR_OPERATION_TO_FUNC",
}

_HOME_OF = {name: home for home, names in _HOMES.items() for name in names.split()}


def reexports(module: str) -> dict[str, str]:
    """``{name: defining module}`` for what the reference's path of ``module`` (``accel_nb.<path>``) imports."""
    path = module.removeprefix("accel_nb.")
    return {name: _HOME_OF[name] for name in _PATHS.get(path, "").split()}
