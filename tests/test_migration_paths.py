"""Every public name of the reference's ``accelerate.utils`` and of each of its submodules, read from the
installed reference at test time, imports from the same dotted path under ``accel_nb`` -- or is listed
here (and in docs/migration.md) as deliberately left out, with the reason."""

from __future__ import annotations

import importlib
import inspect
import os
import pkgutil
import types

import pytest

pytest.importorskip("accelerate")
import accelerate.utils  # noqa: E402

DOCS = os.path.join(os.path.dirname(__file__), "..", "docs", "migration.md")

_Q, _PAR = "not yet: issue 29 (quantization)", "not yet: issue 30 (TP/CP/PP)"
_FP8 = "FP8 training (Transformer Engine, MS-AMP, torchao) is not supported by accel_nb"
_MEGATRON = "Megatron-LM is not supported by accel_nb"
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

# "module" (every name of accelerate.utils.<module>) or "module.name" -> why it is not under accel_nb.utils
LEFT_OUT: dict[str, str] = {
    "ao": _FP8,
    "transformer_engine": _FP8,
    **{f"bnb.{n}": _Q for n in ["replace_with_bnb_layers", "quantize_and_offload_8bit"]},
    "deepspeed.HfDeepSpeedConfig": "transformers' DeepSpeed config holder; accel_nb's DeepSpeedPlugin reads and fills the config itself",
    "deepspeed.get_active_deepspeed_plugin": "accel_nb takes one DeepSpeed plugin per Accelerator (accelerator.deepspeed_plugin)",
    "deepspeed.map_pytorch_optim_to_deepspeed": "accel_nb hands the torch optimizer to the engine as given (docs/deepspeed.md)",
    "megatron_lm": _MEGATRON,
    "fsdp_utils": "not yet: accel_nb's FSDP saves and loads through Accelerator.save_state / load_state (accel_nb.fsdp)",
    "launch": _LAUNCH,
    "rich": "the reference's optional rich tracebacks; not provided",
    "torch_xla": "installs packages with pip; see docs/tpu.md for setting up torch_xla",
    **{
        f"constants.{n}": _GATES
        for n in [
            "BETA_CP_AVAILABLE_PYTORCH_VERSION",
            "BETA_SP_AVAILABLE_DEEPSPEED_VERSION",
            "BETA_TP_AVAILABLE_PYTORCH_VERSION",
            "BETA_TP_AVAILABLE_TRANSFORMERS_VERSION",
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
            "SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING",
            "TORCH_DISTRIBUTED_OPERATION_TYPES",
            "TORCH_LAUNCH_PARAMS",
            "XPU_PROFILING_AVAILABLE_PYTORCH_VERSION",
        ]
    },
    "constants.RNG_STATE_NAME": "accel_nb keeps RNG states in rank_<i>.pt, not random_states_<i>.pkl",
    "constants.SAMPLER_NAME": "accel_nb keeps sampler states in rank_<i>.pt, not sampler.bin",
    **{
        f"dataclasses.{n}": _FP8
        for n in [
            "AORecipeKwargs",
            "TERecipeKwargs",
            "MSAMPRecipeKwargs",
            "FP8RecipeKwargs",
            "FP8BackendType",
        ]
    },
    "dataclasses.DeepSpeedSequenceParallelConfig": "DeepSpeed's sequence parallelism (Ulysses) is not supported",
    **{
        f"dataclasses.{n}": _PAR
        for n in ["TorchTensorParallelPlugin", "TorchContextParallelConfig", "TorchTensorParallelConfig"]
    },
    **{
        f"dataclasses.{n}": _MEGATRON
        for n in [
            "MegatronLMPlugin",
            "add_model_config_to_megatron_parser",
            "parse_bert_config",
            "parse_gpt2_config",
            "parse_t5_config",
            "parse_llama_config",
            "parse_glm4_moe_config",
        ]
    },
    "dataclasses.CustomDtype": _Q,
    "dataclasses.SageMakerDistributedType": "SageMaker launching is not supported by accel_nb",
    "dataclasses.ComputeEnvironment": "SageMaker launching is not supported; accel_nb's config has no compute environment",
    "dataclasses.PrecisionType": "not yet: accel_nb takes mixed_precision as the strings 'no', 'fp16', 'bf16'",
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
    **{
        f"imports.{n}": _FP8
        for n in [
            "is_transformer_engine_available",
            "is_transformer_engine_mxfp8_available",
            "is_fp8_available",
            "torchao_required",
        ]
    },
    "imports.is_bitsandbytes_multi_backend_available": "a bitsandbytes generation gate of the reference; accel_nb needs bitsandbytes >= 0.50",
    "imports.deepspeed_required": _INTERNAL,
    "imports.is_megatron_lm_available": _MEGATRON,
    **{
        f"imports.{n}": _DEVICES
        for n in [
            "is_xccl_available",
            "is_mlu_available",
            "is_musa_available",
            "is_npu_available",
            "is_sdaa_available",
            "is_hpu_available",
            "is_habana_gaudi1",
            "is_neuron_available",
        ]
    },
    "modeling.fallback_allocate": _INTERNAL,
    "modeling.get_mixed_precision_context_manager": "accel_nb applies autocast inside the prepared model (accel_nb.precision)",
    "modeling.get_grad_scaler": "accel_nb builds its scaler from GradScalerKwargs (accel_nb.precision)",
    "operations.is_torch_xpu_tensor": _DEVICES,
    "operations.verify_operation": "accel_nb checks shapes on every collective, not only in debug mode (ops.py)",
    "operations.chained_operation": "accel_nb checks shapes on every collective, not only in debug mode (ops.py)",
    "operations.gather_tensor_shape": _INTERNAL,
    "operations.copy_tensor_to_devices": _INTERNAL,
    "operations.GatheredParameters": "ZeRO-3 parameter gathering: use deepspeed.zero.GatheredParameters itself",
    "other.compile_regions_deepspeed": "torch.compile with DeepSpeed is refused with a clear error (docs/deepspeed.md)",
    **{f"other.{n}": _PAR for n in ["compile_regions_fsdp2", "model_has_dtensor", "get_model_tp_size"]},
    # names of accelerate.utils that come from outside its submodules
    "ParallelismConfig": _PAR,
}


def _submodules() -> list[str]:
    return sorted(m.name for m in pkgutil.iter_modules(accelerate.utils.__path__))


def _public_names(module: types.ModuleType, short: str) -> list[str]:
    """Names the reference defines in ``module``: its constants, or its functions and classes."""
    if short == "constants":
        return sorted(n for n in dir(module) if n.isupper())
    return sorted(
        n
        for n, v in vars(module).items()
        if not n.startswith("_")
        and callable(v)
        and not isinstance(v, types.ModuleType)
        and getattr(v, "__module__", None) == module.__name__
    )


def _left_out(short: str, name: str | None = None) -> bool:
    return short in LEFT_OUT or (name is not None and f"{short}.{name}" in LEFT_OUT)


@pytest.mark.parametrize("short", _submodules())
def test_each_reference_utils_submodule_path_imports_the_same_names(short):
    try:
        ref = importlib.import_module(f"accelerate.utils.{short}")
    except ImportError:  # an optional dependency of the reference (rich) is missing here
        assert short in LEFT_OUT, f"accelerate.utils.{short} does not import here and is not in LEFT_OUT"
        return
    names = _public_names(ref, short)
    if short in LEFT_OUT:
        with pytest.raises(ImportError):
            importlib.import_module(f"accel_nb.utils.{short}")
        return
    ours = importlib.import_module(f"accel_nb.utils.{short}")
    first_line = ours.__doc__.strip().splitlines()[0]
    assert first_line.startswith(f"Shim at the reference's ``accelerate.utils.{short}`` path"), first_line
    missing = [n for n in names if not _left_out(short, n) and not hasattr(ours, n)]
    assert not missing, f"accel_nb.utils.{short} lacks {missing}"
    stale = [n for n in names if f"{short}.{n}" in LEFT_OUT and hasattr(ours, n)]
    assert not stale, f"LEFT_OUT lists {stale} but accel_nb.utils.{short} has them now"
    for name in names:
        if hasattr(ours, name) and short != "constants":
            assert inspect.isclass(getattr(ours, name)) == inspect.isclass(getattr(ref, name)), name
        elif hasattr(ours, name):
            assert getattr(ours, name) == getattr(ref, name), f"constants.{name} differs from the reference's"


def test_every_name_of_reference_utils_imports_from_accel_nb_utils():
    import accel_nb.utils as ours

    submodules = set(_submodules())
    missing = []
    for name in dir(accelerate.utils):
        value = getattr(accelerate.utils, name)
        if name.startswith("_") or isinstance(value, types.ModuleType):
            continue
        home = getattr(value, "__module__", None) if callable(value) else None
        short = home.rsplit(".", 1)[-1] if home and home.startswith("accelerate.utils.") else None
        if short is None and name.isupper():
            short = "constants"
        if short in submodules and _left_out(short, name):
            continue
        if name in LEFT_OUT:
            continue
        if not hasattr(ours, name):
            missing.append(name)
    assert not missing, f"accel_nb.utils lacks {missing}"


def test_every_left_out_entry_is_in_the_migration_docs():
    text = open(DOCS, encoding="utf-8").read()
    absent = [key for key in LEFT_OUT if f"`{key.rsplit('.', 1)[-1]}`" not in text]
    assert not absent, f"docs/migration.md does not name {absent}"


def test_each_left_out_entry_names_something_the_reference_has():
    for key in LEFT_OUT:
        short, _, name = key.partition(".")
        if not name:
            if short in _submodules():
                continue
            assert hasattr(accelerate.utils, short), f"LEFT_OUT: accelerate.utils has no {short}"
            continue
        try:
            ref = importlib.import_module(f"accelerate.utils.{short}")
        except ImportError:
            continue
        assert hasattr(ref, name), f"LEFT_OUT: accelerate.utils.{short} has no {name}"


def test_the_utils_package_is_discovered_by_the_build():
    import tomllib

    with open(os.path.join(os.path.dirname(__file__), "..", "pyproject.toml"), "rb") as f:
        find = tomllib.load(f)["tool"]["setuptools"]["packages"]["find"]
    from setuptools import find_packages

    found = find_packages(os.path.join(os.path.dirname(__file__), ".."), include=find["include"])
    assert "accel_nb.utils" in found


def test_utils_stays_light_and_keeps_its_own_helpers():
    import subprocess
    import sys

    code = (
        "import sys, accel_nb.utils as u; u.set_seed(1); "
        "print(sorted(m for m in ('torch', 'IPython', 'accel_nb.availability') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    # set_seed imports torch itself; the lazy names do not pull IPython or the availability checks
    assert out.strip() == "['torch']"
    import accel_nb.ops
    import accel_nb.utils

    assert accel_nb.utils.gather is accel_nb.ops.gather
    from accel_nb.utils.operations import gather

    assert gather is accel_nb.ops.gather


@pytest.mark.parametrize(
    "name,args",
    [
        ("is_bnb_available", ()),
        ("is_bnb_available", ("0.1",)),
        ("is_bnb_available", ("99.0",)),
        ("is_8bit_bnb_available", ()),
        ("is_4bit_bnb_available", ()),
        ("is_torchao_available", ()),
        ("is_deepspeed_available", ()),
    ],
)
def test_quantization_and_deepspeed_gates_answer_as_the_reference(name, args):
    import accelerate.utils.imports as ref

    import accel_nb.utils.imports as ours

    assert getattr(ours, name)(*args) == getattr(ref, name)(*args)
