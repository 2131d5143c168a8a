"""The training back-end registry (accel_nb/accelerator/backends/): chosen once, found by name, asked by the
launch config without torch, and a model conversion registered in one place is applied by ``prepare``."""

from __future__ import annotations

import subprocess
import sys

import torch

from accel_nb import Accelerator
from accel_nb.accelerator.backends import (
    BACKENDS,
    CONVERSIONS,
    ModelConversion,
    TrainingBackend,
    backend_named,
    launch_backend,
    register_conversion,
)
from accel_nb.config import LaunchConfig


def test_the_five_backends_are_registered_by_name():
    assert {"ddp", "fsdp", "deepspeed", "layout", "xla"} <= set(BACKENDS)
    for name, cls in BACKENDS.items():
        assert issubclass(cls, TrainingBackend) and cls.name == name
    assert backend_named("fsdp") is BACKENDS["fsdp"]


def test_launch_types_map_to_their_backend():
    assert launch_backend("FSDP").name == "fsdp"
    assert launch_backend("DEEPSPEED").name == "deepspeed"
    assert launch_backend("XLA").name == "xla"
    for plain in ("NO", "MULTI_CPU", "MULTI_GPU"):
        assert launch_backend(plain).name == "ddp"


def test_a_plain_run_gets_the_ddp_backend_once():
    accelerator = Accelerator(cpu=True)
    backend = accelerator.backend
    assert backend.name == "ddp" and backend.accelerator is accelerator
    model = accelerator.prepare(torch.nn.Linear(2, 2))
    assert accelerator.backend is backend  # chosen in the constructor, not per call
    assert accelerator.prepared("model") == [model]


def test_the_launch_config_asks_the_backends_without_torch():
    code = (
        "import sys\n"
        "from accel_nb.config import LaunchConfig\n"
        "cfg = LaunchConfig(distributed_type='FSDP', num_processes=2).validate()\n"
        "assert 'ACCEL_NB_FSDP_CONFIG' in cfg.to_env()\n"
        "assert 'torch' not in sys.modules, 'accel_nb.config imported torch'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    env = LaunchConfig(distributed_type="DEEPSPEED", use_cpu=True).validate().to_env()
    assert env["DS_ACCELERATOR"] == "cpu"


def test_a_registered_conversion_is_applied_before_the_backend_wraps():
    seen = []

    @register_conversion
    class Marked(ModelConversion):  # what FP8 does with torchao's layers, here a mark
        name = "test-mark"

        @classmethod
        def applies(cls, accelerator):
            return getattr(accelerator, "mark_models", False)

        def convert(self, accelerator, model):
            seen.append(type(model).__name__)
            model.marked = True
            return model

    try:
        plain = Accelerator(cpu=True)
        assert not any(isinstance(c, Marked) for c in plain.conversions)
        Accelerator.mark_models = True  # the setting a precision reads (FP8: the recipe)
        try:
            accelerator = Accelerator(cpu=True)
        finally:
            del Accelerator.mark_models
        model = accelerator.prepare(torch.nn.Linear(2, 2))
        assert seen == ["Linear"] and model.marked
    finally:
        CONVERSIONS.pop("test-mark", None)


def test_a_pickled_accelerator_serves_its_back_end_again_when_loaded():
    # the reference's users pickle an Accelerator with its prepared loaders (its test_can_pickle_dataloader);
    # the back-end holds its Accelerator weakly, and weak references do not pickle
    import pickle

    import torch

    from accel_nb import Accelerator

    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.arange(10)))
    accelerator = Accelerator()
    prepared = accelerator.prepare(loader)
    loaded = pickle.loads(pickle.dumps(accelerator))
    assert loaded.backend.accelerator is loaded and accelerator.backend.accelerator is accelerator
    assert [b[0].tolist() for b in loaded._dataloaders[0]] == [b[0].tolist() for b in prepared]


def test_a_registered_backends_launch_environment_reaches_every_kind_of_launch():
    # registering is all a back-end does for its settings to reach the ranks: accel-nb launch (to_env) and
    # %%accelerate / %accelerate start (the magic's launch options) ask every registered back-end
    from accel_nb.accelerator.backends import register_backend
    from accel_nb.notebook.magic_flags import launch_options, parse_accelerate_line

    class _Probe(TrainingBackend):
        name = "probe-for-test"

        @classmethod
        def launch_env(cls, cfg, num_processes=None):
            return {"PROBE_BACKEND": "on"} if cfg.extras.get("probe_config") else {}

    register_backend(_Probe)
    try:
        cfg = LaunchConfig(num_processes=2, use_cpu=True, extras={"probe_config": {"x": 1}})
        assert cfg.to_env()["PROBE_BACKEND"] == "on"
        assert launch_options(parse_accelerate_line("-n 2 --cpu"), cfg).env["PROBE_BACKEND"] == "on"
        assert "PROBE_BACKEND" not in LaunchConfig(num_processes=2, use_cpu=True).to_env()
    finally:
        del BACKENDS["probe-for-test"]
