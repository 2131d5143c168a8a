"""Migrating from accelerate is a rename: every name a typical script imports resolves under
accel_nb's module of the same path, and the helpers behave like the reference's (side by side,
in this process)."""

from __future__ import annotations

import dataclasses
import datetime
import importlib
import inspect
import os
import re

import pytest
import torch

from tests.dist_helpers import run_ranks

accelerate = pytest.importorskip("accelerate")

# (reference module, names) -- what scripts and libraries import from each path
TYPICAL_IMPORTS = {
    "": [
        "Accelerator",
        "PartialState",
        "DistributedType",
        "notebook_launcher",
        "debug_launcher",
        "find_executable_batch_size",
        "init_empty_weights",
        "init_on_device",
        "dispatch_model",
        "load_checkpoint_and_dispatch",
        "load_checkpoint_in_model",
        "infer_auto_device_map",
        "cpu_offload",
        "disk_offload",
        "cpu_offload_with_hook",
        "skip_first_batches",
        "DataLoaderConfiguration",
        "DistributedDataParallelKwargs",
        "GradScalerKwargs",
        "InitProcessGroupKwargs",
        "AutocastKwargs",
        "ProfileKwargs",
        "DDPCommunicationHookType",
        "synchronize_rng_states",
    ],
    ".utils": [
        "set_seed",
        "DistributedType",
        "ProjectConfiguration",
        "DataLoaderConfiguration",
        "GradientAccumulationPlugin",
        "DistributedDataParallelKwargs",
        "GradScalerKwargs",
        "InitProcessGroupKwargs",
        "AutocastKwargs",
        "ProfileKwargs",
        "DDPCommunicationHookType",
        "KwargsHandler",
        "gather",
        "gather_object",
        "broadcast",
        "broadcast_object_list",
        "reduce",
        "pad_across_processes",
        "send_to_device",
        "recursively_apply",
        "find_executable_batch_size",
        "release_memory",
        "patch_environment",
        "clear_environment",
        "extract_model_from_parallel",
        "synchronize_rng_states",
        "synchronize_rng_state",
        "RNGType",
        "wait_for_everyone",
        "set_module_tensor_to_device",
        "find_tied_parameters",
        "named_module_tensors",
        "load_state_dict",
        "compute_module_sizes",
        "get_balanced_memory",
        "get_max_memory",
        "infer_auto_device_map",
        "load_checkpoint_in_model",
        "check_device_map",
        "is_compiled_module",
        "write_basic_config",
        "LoggerType",
    ],
    ".tracking": ["GeneralTracker", "TensorBoardTracker", "MLflowTracker", "WandBTracker", "CometMLTracker"],
    ".logging": ["get_logger", "MultiProcessAdapter"],
    ".big_modeling": [
        "init_empty_weights",
        "init_on_device",
        "cpu_offload",
        "cpu_offload_with_hook",
        "disk_offload",
        "dispatch_model",
        "load_checkpoint_and_dispatch",
    ],
    ".hooks": [
        "ModelHook",
        "SequentialHook",
        "AlignDevicesHook",
        "CpuOffload",
        "UserCpuOffloadHook",
        "add_hook_to_module",
        "remove_hook_from_module",
        "remove_hook_from_submodules",
        "attach_align_device_hook",
    ],
    ".data_loader": [
        "BatchSamplerShard",
        "IterableDatasetShard",
        "DataLoaderShard",
        "SkipBatchSampler",
        "SeedableRandomSampler",
        "prepare_data_loader",
        "skip_first_batches",
    ],
    ".local_sgd": ["LocalSGD"],
    ".state": ["PartialState", "AcceleratorState", "GradientState"],
    ".accelerator": ["Accelerator"],
}

# names accelerate keeps on a submodule of utils, which accel_nb.utils (a module) holds directly
SUBMODULE_PATHS = {
    "accelerate.utils.memory": ["clear_device_cache", "should_reduce_batch_size", "release_memory"],
    "accelerate.utils.modeling": ["get_state_dict_offloaded_model", "named_module_tensors"],
}


@pytest.mark.parametrize("path", sorted(TYPICAL_IMPORTS))
def test_every_typical_import_resolves_under_the_renamed_path(path):
    ref = importlib.import_module("accelerate" + path)
    ours = importlib.import_module("accel_nb" + path)
    missing = []
    for name in TYPICAL_IMPORTS[path]:
        assert hasattr(ref, name), f"the list is wrong: accelerate{path} has no {name}"
        if not hasattr(ours, name):
            missing.append(name)
            continue
        ref_value, value = getattr(ref, name), getattr(ours, name)
        assert inspect.isclass(value) == inspect.isclass(ref_value), (
            f"accel_nb{path}.{name}: class vs function"
        )
    assert not missing, f"accel_nb{path} lacks {missing}"


def test_names_from_utils_submodules_are_in_accel_nb_utils():
    import accel_nb.utils

    for path, names in SUBMODULE_PATHS.items():
        ref = importlib.import_module(path)
        for name in names:
            assert hasattr(ref, name)
            assert callable(getattr(accel_nb.utils, name)), name


def test_reexports_are_the_one_implementation():
    import accel_nb
    import accel_nb.big_model
    import accel_nb.data
    import accel_nb.data.samplers
    import accel_nb.data_loader
    import accel_nb.hooks
    import accel_nb.ops
    import accel_nb.utils
    from accel_nb import big_modeling

    assert accel_nb.utils.gather is accel_nb.ops.gather
    assert accel_nb.utils.DistributedType is accel_nb.DistributedType
    assert accel_nb.data_loader.BatchSamplerShard is accel_nb.data.samplers.BatchSamplerShard
    assert accel_nb.data_loader.prepare_data_loader is accel_nb.data.prepare_data_loader
    assert big_modeling.dispatch_model is accel_nb.big_model.dispatch_model
    assert big_modeling.cpu_offload_with_hook is accel_nb.hooks.cpu_offload_with_hook
    assert accel_nb.find_executable_batch_size is accel_nb.utils.find_executable_batch_size
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        accel_nb.utils.nope  # noqa: B018


def test_distributed_type_has_every_reference_member():
    from accelerate.utils import DistributedType as Ref

    from accel_nb.utils import DistributedType

    assert {m.name: m.value for m in Ref} == {m.name: m.value for m in DistributedType}
    assert DistributedType.FSDP == "FSDP" and DistributedType("DEEPSPEED") is DistributedType.DEEPSPEED


# -- kwargs handlers ------------------------------------------------------------------------------
HANDLERS = [
    "DistributedDataParallelKwargs",
    "GradScalerKwargs",
    "InitProcessGroupKwargs",
    "AutocastKwargs",
    "ProfileKwargs",
    "GradientAccumulationPlugin",
]


@pytest.mark.parametrize("name", HANDLERS)
def test_handler_fields_and_defaults_match_the_reference(name):
    import accelerate.utils as ref_utils

    import accel_nb.utils as utils

    def fields(cls):
        out = {}
        for f in dataclasses.fields(cls):
            default = f.default_factory() if f.default is dataclasses.MISSING else f.default
            out[f.name] = default.value if hasattr(default, "value") else default
        return out

    assert fields(getattr(utils, name)) == fields(getattr(ref_utils, name))


@pytest.mark.parametrize(
    "name, kwargs",
    [
        ("DistributedDataParallelKwargs", {"find_unused_parameters": True, "bucket_cap_mb": 50}),
        ("DistributedDataParallelKwargs", {"comm_hook": "fp16"}),
        ("DistributedDataParallelKwargs", {"static_graph": True, "gradient_as_bucket_view": True}),
        ("GradScalerKwargs", {"init_scale": 1024.0, "growth_interval": 10}),
        ("InitProcessGroupKwargs", {"timeout": datetime.timedelta(seconds=90)}),
        ("AutocastKwargs", {"enabled": False}),
        ("AutocastKwargs", {"cache_enabled": True}),
        ("GradientAccumulationPlugin", {"num_steps": 4, "sync_with_dataloader": False}),
        ("ProfileKwargs", {"record_shapes": True, "with_flops": True}),
    ],
)
def test_to_kwargs_matches_the_reference(name, kwargs):
    import accelerate.utils as ref_utils

    import accel_nb.utils as utils

    ref_kwargs = dict(kwargs)
    if name == "DistributedDataParallelKwargs" and "comm_hook" in kwargs:
        ref_kwargs["comm_hook"] = ref_utils.DDPCommunicationHookType(kwargs["comm_hook"])
    assert getattr(utils, name)(**kwargs).to_kwargs() == getattr(ref_utils, name)(**ref_kwargs).to_kwargs()


@pytest.mark.parametrize(
    "name, kwargs, match",
    [
        ("DistributedDataParallelKwargs", {"comm_hook": "zip"}, "not a DDP communication hook"),
        ("DistributedDataParallelKwargs", {"comm_wrapper": "fp16"}, "wraps a PowerSGD hook"),
        ("DistributedDataParallelKwargs", {"bucket_cap_mb": 0}, "positive"),
        ("GradScalerKwargs", {"backoff_factor": 2.0}, "between 0 and 1"),
        ("GradScalerKwargs", {"growth_factor": 0.5}, "greater than 1"),
        ("InitProcessGroupKwargs", {"backend": "tcp"}, "use one of"),
        ("InitProcessGroupKwargs", {"timeout": 30}, "datetime.timedelta"),
        ("GradientAccumulationPlugin", {"num_steps": 0}, ">= 1"),
        ("ProfileKwargs", {"activities": ["gpu"]}, "unknown"),
        ("ProfileKwargs", {"schedule_option": {"pause": 1}}, "unknown keys"),
    ],
)
def test_bad_handler_values_are_refused_with_the_fix(name, kwargs, match):
    import accel_nb.utils as utils

    with pytest.raises((ValueError, TypeError), match=match):
        getattr(utils, name)(**kwargs)


def test_read_kwargs_handlers_splits_by_consumer_and_takes_reference_instances():
    import accelerate.utils as ref_utils

    from accel_nb.kwargs_handlers import read_kwargs_handlers
    from accel_nb.utils import AutocastKwargs, GradientAccumulationPlugin, GradScalerKwargs, ProfileKwargs

    args = read_kwargs_handlers(
        [
            ref_utils.DistributedDataParallelKwargs(find_unused_parameters=True),  # the reference's own class
            GradScalerKwargs(init_scale=8.0),
            ref_utils.InitProcessGroupKwargs(timeout=datetime.timedelta(seconds=77)),
            AutocastKwargs(cache_enabled=False),
            ProfileKwargs(record_shapes=True),
            GradientAccumulationPlugin(num_steps=3),
        ]
    )
    assert args.ddp == {"find_unused_parameters": True}
    assert args.scaler == {"init_scale": 8.0}
    assert args.init_process_group == {"timeout": datetime.timedelta(seconds=77)}
    assert args.autocast == {"cache_enabled": False}
    assert args.profile.record_shapes and args.gradient_accumulation.num_steps == 3
    with pytest.raises(ValueError, match="two GradScalerKwargs"):
        read_kwargs_handlers([GradScalerKwargs(), GradScalerKwargs(init_scale=2.0)])
    with pytest.raises(ValueError, match="accel_nb understands"):
        read_kwargs_handlers([{"find_unused_parameters": True}])


def _reference_profile(folder):
    from accelerate import Accelerator
    from accelerate.utils import ProfileKwargs

    accelerator = Accelerator(
        cpu=True, kwargs_handlers=[ProfileKwargs(activities=["cpu"], output_trace_dir=folder)]
    )
    with accelerator.profile():
        torch.mm(torch.ones(4, 4), torch.ones(4, 4))


def test_profile_context_writes_the_trace_file_the_reference_writes(tmp_path):
    from accel_nb.kwargs_handlers import profile_context
    from accel_nb.utils import ProfileKwargs

    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    with profile_context(ProfileKwargs(activities=["cpu"], output_trace_dir=str(ours))) as prof:
        torch.mm(torch.ones(4, 4), torch.ones(4, 4))
    assert any("mm" in e.key for e in prof.key_averages())
    run_ranks(_reference_profile, world_size=1, args=(str(theirs),))  # the reference's state stays in a child
    assert sorted(os.listdir(ours)) == sorted(os.listdir(theirs)) == ["profile_0.json"]
    assert '"traceEvents"' in (ours / "profile_0.json").read_text()


def test_profile_kwargs_build_profiles_cpu_ops():
    from accel_nb.utils import ProfileKwargs

    with ProfileKwargs(activities=["cpu"], record_shapes=True).build() as prof:
        torch.mm(torch.ones(8, 8), torch.ones(8, 8))
    assert any("mm" in e.key for e in prof.key_averages())


# -- memory ---------------------------------------------------------------------------------------
def _batch_sizes_tried(find_executable_batch_size, start, fits_at_most):
    tried = []

    @find_executable_batch_size(starting_batch_size=start)
    def train(batch_size, bytes_per_sample):
        tried.append(batch_size)
        if batch_size > fits_at_most:  # a real allocation the host cannot make
            torch.empty(batch_size * bytes_per_sample, dtype=torch.uint8)
        return batch_size

    return train(10**15), tried


def test_find_executable_batch_size_retries_a_real_out_of_memory_like_the_reference():
    from accelerate.utils import find_executable_batch_size as ref

    from accel_nb.utils import find_executable_batch_size

    ours = _batch_sizes_tried(find_executable_batch_size, 128, 50)
    theirs = _batch_sizes_tried(ref, 128, 50)
    assert ours == theirs
    assert ours[0] <= 50 and ours[1][0] == 128 and len(ours[1]) > 2


def test_find_executable_batch_size_errors_like_the_reference():
    from accelerate.utils import find_executable_batch_size as ref

    from accel_nb.utils import find_executable_batch_size

    for decorator in (find_executable_batch_size, ref):

        @decorator(starting_batch_size=4)
        def never_fits(batch_size):
            raise RuntimeError("CUDA out of memory. Tried to allocate 1 GiB")

        with pytest.raises(RuntimeError, match="[Nn]o .*batch size"):
            never_fits()

        @decorator(starting_batch_size=4)
        def broken(batch_size):
            raise ValueError("a bug, not memory")

        with pytest.raises(ValueError, match="a bug"):
            broken()

        @decorator(starting_batch_size=4)
        def takes_one(batch_size, model):
            return batch_size, model

        with pytest.raises(TypeError, match="first argument"):
            takes_one(8, "model")
        assert takes_one("model") == (4, "model")


def test_should_reduce_batch_size_agrees_on_real_messages():
    from accelerate.utils.memory import should_reduce_batch_size as ref

    from accel_nb.utils import should_reduce_batch_size

    try:
        torch.empty(10**16, dtype=torch.uint8)
    except RuntimeError as exc:
        real = exc
    cases = [
        real,
        RuntimeError("CUDA out of memory. Tried to allocate 20.00 MiB"),
        RuntimeError("cuDNN error: CUDNN_STATUS_NOT_SUPPORTED. This error may appear if"),
        RuntimeError("shape mismatch"),
        ValueError("CUDA out of memory."),
    ]
    assert (
        [should_reduce_batch_size(e) for e in cases]
        == [ref(e) for e in cases]
        == [True, True, True, False, False]
    )


def test_release_memory_returns_nones_and_frees_the_objects():
    import weakref

    from accel_nb.utils import clear_device_cache, release_memory

    model = torch.nn.Linear(4, 4)
    alive = weakref.ref(model)
    model, other = release_memory(model, [1, 2])
    assert model is None and other is None and alive() is None
    clear_device_cache(garbage_collection=True)


# -- environment ----------------------------------------------------------------------------------
@pytest.mark.parametrize("library", ["accel_nb", "accelerate"])
def test_patch_environment_sets_upper_case_strings_and_restores(library, monkeypatch):
    patch_environment = importlib.import_module(f"{library}.utils").patch_environment
    monkeypatch.setenv("MIGRATION_KEPT", "before")
    monkeypatch.delenv("MIGRATION_NEW", raising=False)
    with patch_environment(migration_kept=1, migration_new=2.5):
        assert os.environ["MIGRATION_KEPT"] == "1" and os.environ["MIGRATION_NEW"] == "2.5"
    assert os.environ["MIGRATION_KEPT"] == "before" and "MIGRATION_NEW" not in os.environ
    with pytest.raises(KeyError), patch_environment(migration_kept="x"):
        raise KeyError("fails inside")
    assert os.environ["MIGRATION_KEPT"] == "before"


def test_clear_environment_empties_and_restores(monkeypatch):
    from accel_nb.utils import clear_environment

    monkeypatch.setenv("MIGRATION_KEPT", "before")
    with clear_environment():
        assert os.environ == {}
        os.environ["MIGRATION_KEPT"] = "changed"
    assert os.environ["MIGRATION_KEPT"] == "before" and "PATH" in os.environ


def test_write_basic_config_writes_what_the_reference_writes_and_keeps_an_existing_file(tmp_path, capsys):
    import yaml
    from accelerate.utils import write_basic_config as reference

    from accel_nb.config import LaunchConfig
    from accel_nb.utils import write_basic_config

    ours, theirs = tmp_path / "ours.yaml", tmp_path / "theirs.yaml"
    assert write_basic_config(mixed_precision="bf16", save_location=str(ours)) == ours
    reference(mixed_precision="bf16", save_location=str(theirs))
    mine, ref = yaml.safe_load(ours.read_text()), yaml.safe_load(theirs.read_text())
    keys = ("distributed_type", "num_processes", "mixed_precision", "use_cpu", "num_machines")
    assert {k: mine[k] for k in keys} == {k: ref[k] for k in keys}
    assert LaunchConfig.load(str(ours)).mixed_precision == "bf16"
    before = ours.read_text()
    assert write_basic_config(mixed_precision="fp16", save_location=str(ours)) is False
    assert ours.read_text() == before and "already exists" in capsys.readouterr().out
    with pytest.raises(ValueError, match="mixed_precision"):
        write_basic_config(mixed_precision="fp4", save_location=str(tmp_path / "bad.yaml"))


# -- unwrapping -----------------------------------------------------------------------------------
def test_extract_model_from_parallel_unwraps_compile_like_the_reference():
    from accelerate.utils import extract_model_from_parallel as ref

    from accel_nb.utils import extract_model_from_parallel, is_compiled_module

    model = torch.nn.Linear(2, 2)
    compiled = torch.compile(model)  # not run: compiling happens at the first call
    assert extract_model_from_parallel(compiled, keep_torch_compile=False) is model
    assert ref(compiled, keep_torch_compile=False) is model
    kept = extract_model_from_parallel(compiled)
    assert is_compiled_module(kept) and kept._orig_mod is model
    assert extract_model_from_parallel(model) is model


# -- the migration page stays true ---------------------------------------------------------------------
def _listed_after(page: str, marker: str) -> list[str]:
    """The `names` in the bullet item that starts with ``marker``."""
    start = page.index(marker) + len(marker)
    end = page.find("\n- ", start)
    item = page[start : end if end != -1 else len(page)]
    return re.findall(r"`(\w+)`", item)


def test_migration_page_lists_only_what_is_really_missing():
    from accel_nb import Accelerator

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(root, "docs", "migration.md")) as f:
        page = f.read()
    marker = "`Accelerator` methods not there yet:"
    methods = _listed_after(page, marker) if marker in page else []
    landed = [m for m in methods if hasattr(Accelerator, m)]
    assert not landed, (
        f"Accelerator.{landed} exist now: take them off docs/migration.md's 'not there yet' list"
    )
    marker = "Not there yet in `accel_nb.data_loader`:"
    loaders = _listed_after(page, marker) if marker in page else []
    import accel_nb.data_loader

    landed = [n for n in loaders if n[0].isupper() and hasattr(accel_nb.data_loader, n)]
    assert not landed, f"accel_nb.data_loader.{landed} exist now: update docs/migration.md"
    for module in TYPICAL_IMPORTS:  # the table's paths are the tested ones
        assert f"`accel_nb{module}`" in page or module in ("", ".state", ".accelerator"), module
