"""DeepSpeed from the script face and the bad inputs: `accel-nb launch` with a DEEPSPEED launch config or
`--use_deepspeed` (real 2-process CPU launches), and the errors that come before any rank starts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from accel_nb.config import ConfigError, LaunchConfig
from accel_nb.deepspeed import DeepSpeedPlugin

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
needs_deepspeed = pytest.mark.skipif(
    __import__("importlib").util.find_spec("deepspeed") is None,
    reason="deepspeed is not installed (pip install 'accel_nb[deepspeed]')",
)

SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    import torch
    from torch.utils.data import DataLoader, TensorDataset
    from accel_nb import Accelerator, PartialState

    partial = PartialState().distributed_type.value  # the launcher's request, before any Accelerator
    accelerator = Accelerator(gradient_accumulation_steps=2)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x = torch.randn(64, 8)
    loader = DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    losses = []
    for xb, yb in loader:
        with accelerator.accumulate(model):
            loss = torch.nn.functional.mse_loss(model(xb), yb)
            accelerator.backward(loss)
            optimizer.step(); optimizer.zero_grad()
        losses.append(loss.item())
    plugin = accelerator.deepspeed_plugin
    out = {"distributed_type": accelerator.distributed_type.value, "engine": type(model).__name__,
           "zero_stage": plugin.zero_stage, "clipping": accelerator.deepspeed_config.get("gradient_clipping"),
           "accumulation": accelerator.deepspeed_config["gradient_accumulation_steps"],
           "train_batch_size": accelerator.deepspeed_config["train_batch_size"], "losses": losses,
           "partial": partial}
    with open(os.path.join(sys.argv[1], f"rank{accelerator.process_index}.json"), "w") as f:
        json.dump(out, f)
    """
)


def _launch(tmp_path, *args, config: str | None = None, timeout: float = 600):
    script = tmp_path / "train_ds.py"
    script.write_text(SCRIPT)
    env = dict(
        os.environ,
        OMP_NUM_THREADS="1",
        PYTHONPATH=ROOT,
        ACCEL_NB_CONFIG_FILE=config or str(tmp_path / "none" / "default_config.yaml"),
    )
    env.pop("CUDA_VISIBLE_DEVICES", None)
    cmd = [sys.executable, "-m", "accel_nb.commands", "launch", *args, str(script), str(tmp_path)]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def _results(tmp_path):
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]


@needs_deepspeed
@pytest.mark.multiproc
def test_a_deepspeed_launch_config_runs_a_script_with_zero3(tmp_path):
    config = tmp_path / "ds.yaml"
    config.write_text(
        textwrap.dedent("""
        compute_environment: LOCAL_MACHINE
        distributed_type: DEEPSPEED
        num_processes: 2
        use_cpu: true
        mixed_precision: 'no'
        deepspeed_config:
          zero_stage: 3
          gradient_clipping: 0.5
          zero3_init_flag: false
    """)
    )
    out = _launch(tmp_path, "--config_file", str(config))
    assert out.returncode == 0, out.stdout + out.stderr
    for rank in _results(tmp_path):
        assert (
            rank["distributed_type"] == rank["partial"] == "DEEPSPEED" and rank["engine"] == "DeepSpeedEngine"
        )
        assert rank["zero_stage"] == 3 and rank["clipping"] == 0.5 and rank["accumulation"] == 2
        assert rank["train_batch_size"] == 4 * 2 * 2  # micro batch x accumulation x processes
        assert len(rank["losses"]) == 8  # 64 samples / 2 ranks / batch 4


@needs_deepspeed
@pytest.mark.multiproc
def test_use_deepspeed_flags_run_a_script(tmp_path):
    out = _launch(
        tmp_path,
        "--use_deepspeed",
        "--zero_stage",
        "1",
        "--gradient_clipping",
        "2.0",
        "--cpu",
        "--num_processes",
        "2",
    )
    assert out.returncode == 0, out.stdout + out.stderr
    ranks = _results(tmp_path)
    assert [r["zero_stage"] for r in ranks] == [1, 1] and ranks[0]["clipping"] == 2.0
    assert ranks[0]["losses"] != ranks[1]["losses"]  # each rank trained on its own shard of the data


@pytest.mark.parametrize(
    "args, words",
    [
        (["--zero_stage", "2"], "together with --use_deepspeed"),
        (["--use_deepspeed", "--zero_stage", "2", "--offload_param_device", "cpu"], "needs zero_stage=3"),
        (["--use_deepspeed", "--offload_optimizer_device", "nvme"], "needs offload_optimizer_nvme_path"),
        (["--use_deepspeed", "--deepspeed_config_file", "/nonexistent/ds.json"], "does not exist"),
        (["--use_deepspeed", "--mixed_precision", "fp16"], "DeepSpeed's CPU accelerator has no fp16"),
    ],
)
def test_bad_deepspeed_flags_are_refused_before_any_rank_starts(tmp_path, args, words):
    out = _launch(tmp_path, "--cpu", "--num_processes", "2", *args, timeout=120)
    assert out.returncode != 0
    assert words in out.stderr, out.stderr
    assert not (tmp_path / "rank0.json").exists()


def test_launch_config_validates_deepspeed_config_and_exports_it():
    cfg = LaunchConfig(
        distributed_type="deepspeed",
        num_processes=2,
        use_cpu=True,
        extras={"deepspeed_config": {"zero_stage": 2, "offload_optimizer_device": "cpu"}},
    ).validate()
    env = cfg.to_env()
    assert cfg.distributed_type == "DEEPSPEED" and env["ACCELERATE_USE_DEEPSPEED"] == "true"
    assert json.loads(env["ACCEL_NB_DEEPSPEED_CONFIG"]) == {
        "zero_stage": 2,
        "offload_optimizer_device": "cpu",
    }
    assert env["DS_ACCELERATOR"] == "cpu"
    with pytest.raises(ConfigError, match="deepspeed_config.*zero_stage"):
        LaunchConfig(distributed_type="DEEPSPEED", extras={"deepspeed_config": {"zero_stage": 7}}).validate()
    with pytest.raises(ConfigError, match="unknown key 'zero_stag'"):
        LaunchConfig(distributed_type="DEEPSPEED", extras={"deepspeed_config": {"zero_stag": 2}}).validate()
    assert LaunchConfig(distributed_type="MULTI_CPU").validate().deepspeed_env() == {}


def test_plugin_fields_build_the_config_and_bad_values_are_clear_errors(tmp_path):
    plugin = DeepSpeedPlugin(
        zero_stage=3, offload_param_device="cpu", offload_optimizer_device="cpu", zero3_save_16bit_model=True
    )
    zero = plugin.deepspeed_config["zero_optimization"]
    assert (
        zero["stage"] == 3
        and zero["offload_param"] == {"device": "cpu"}
        and zero["offload_optimizer"]["device"] == "cpu"
    )
    assert zero["stage3_gather_16bit_weights_on_model_save"] is True and plugin.zero3_init_flag is True
    assert plugin.deepspeed_config["train_micro_batch_size_per_gpu"] == "auto"
    # a JSON file: its values become the fields; a field given in code fills the file's "auto"
    path = tmp_path / "ds.json"
    path.write_text(
        json.dumps(
            {"zero_optimization": {"stage": 1}, "gradient_clipping": "auto", "bf16": {"enabled": True}}
        )
    )
    from_file = DeepSpeedPlugin(hf_ds_config=str(path), gradient_clipping=0.3)
    assert from_file.zero_stage == 1 and from_file.deepspeed_config["gradient_clipping"] == 0.3
    assert from_file.set_mixed_precision(None) == "bf16"  # the config's choice
    with pytest.raises(ValueError, match="disagrees with the DeepSpeed config"):
        from_file.set_mixed_precision("fp16")
    for kwargs, words in [
        ({"zero_stage": 4}, "not a ZeRO stage"),
        ({"zero_stage": 1, "offload_param_device": "cpu"}, "needs zero_stage=3"),
        ({"zero_stage": 0, "offload_optimizer_device": "cpu"}, "needs zero_stage 1, 2 or 3"),
        ({"offload_optimizer_device": "gpu"}, "is not valid"),
        ({"hf_ds_config": {"train_batch_size": 8}}, "no zero_optimization section"),
        ({"hf_ds_config": str(tmp_path / "missing.json")}, "does not exist"),
        (
            {"hf_ds_config": {"zero_optimization": {"stage": 2}, "gradient_accumulation_steps": 0}},
            "whole number",
        ),
        ({"enable_msamp": True}, "not supported"),
    ]:
        with pytest.raises(ValueError, match=words):
            DeepSpeedPlugin(**kwargs)
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        DeepSpeedPlugin(hf_ds_config=str(bad))


def _run_python(code: str, env: dict | None = None) -> subprocess.CompletedProcess:
    full = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1", **(env or {}))
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=full,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )


def test_import_accel_nb_and_creating_the_plugin_do_not_import_deepspeed():
    out = _run_python("""
        import sys, accel_nb
        from accel_nb import Accelerator, DeepSpeedPlugin
        from accel_nb.deepspeed import DummyOptim
        accelerator = Accelerator(deepspeed_plugin=DeepSpeedPlugin(zero_stage=2, gradient_accumulation_steps=3))
        assert accelerator.distributed_type.value == "DEEPSPEED", accelerator.distributed_type
        assert accelerator.gradient_accumulation_steps == 3
        print("deepspeed" in sys.modules)
    """)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_accelerator_settings_that_disagree_with_the_config_are_errors():
    out = _run_python("""
        from accel_nb import Accelerator, DeepSpeedPlugin
        from accel_nb.state import _reset_all_states
        cases = [
            dict(gradient_accumulation_steps=4, deepspeed_plugin=DeepSpeedPlugin(gradient_accumulation_steps=2)),
            dict(mixed_precision="fp16", deepspeed_plugin=DeepSpeedPlugin(
                hf_ds_config={"zero_optimization": {"stage": 2}, "bf16": {"enabled": True}})),
            dict(fsdp=True, deepspeed_plugin=DeepSpeedPlugin()),
            dict(mixed_precision="fp16", deepspeed_plugin=DeepSpeedPlugin(zero_stage=2)),
        ]
        for kwargs in cases:
            _reset_all_states()
            try:
                Accelerator(cpu=True, **kwargs)
            except (ValueError, TypeError) as exc:
                print("ERR", exc)
            else:
                print("OK")
    """)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert lines[0].startswith("ERR gradient_accumulation_steps=4 disagrees with the DeepSpeed config's 2"), (
        lines
    )
    assert lines[1].startswith("ERR mixed_precision='fp16' disagrees with the DeepSpeed config"), lines
    assert lines[2].startswith("ERR"), lines
    assert lines[3].startswith("ERR DeepSpeed's CPU accelerator has no fp16"), (
        lines
    )  # not DeepSpeed's own words


def test_deepspeed_missing_is_an_error_naming_the_extra():
    out = _run_python("""
        import sys
        sys.modules["deepspeed"] = None  # what `import deepspeed` meets where it is not installed
        import torch
        from accel_nb import Accelerator, DeepSpeedPlugin
        accelerator = Accelerator(cpu=True, deepspeed_plugin=DeepSpeedPlugin(zero_stage=2))
        model = torch.nn.Linear(2, 1)
        loader = torch.utils.data.DataLoader(torch.randn(8, 2), batch_size=2)
        try:
            accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1), loader)
        except ImportError as exc:
            print(exc)
    """)
    assert out.returncode == 0, out.stderr
    assert "pip install 'accel_nb[deepspeed]'" in out.stdout, out.stdout


def test_a_deepspeed_launch_without_deepspeed_installed_stops_before_any_rank(tmp_path):
    script = tmp_path / "never.py"
    script.write_text("open(__file__ + '.ran', 'w').close()\n")
    out = _run_python(
        f"""
        import sys
        sys.modules["deepspeed"] = None  # what the launcher's check meets where deepspeed is not installed
        from accel_nb.commands.main import main
        sys.exit(main(["launch", "--use_deepspeed", "--cpu", "--num_processes", "2", {str(script)!r}]))
    """,
        env={"ACCEL_NB_CONFIG_FILE": str(tmp_path / "none.yaml")},
    )
    assert out.returncode == 2, out.stdout + out.stderr
    assert "deepspeed is not installed; pip install 'accel_nb[deepspeed]'" in out.stderr
    assert not (tmp_path / "never.py.ran").exists()


@needs_deepspeed
@pytest.mark.parametrize("stage", [2, 3])
def test_bf16_on_one_cpu_process_trains_in_bf16_with_float32_master_weights(stage):
    out = _run_python(f"""
        import torch
        from accel_nb import Accelerator, DeepSpeedPlugin
        accelerator = Accelerator(cpu=True, mixed_precision="bf16", deepspeed_plugin=DeepSpeedPlugin(zero_stage={stage}))
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        x = torch.randn(64, 8, generator=torch.Generator().manual_seed(1))
        data = torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True).sin())
        model, optimizer, loader = accelerator.prepare(model, optimizer, torch.utils.data.DataLoader(data, batch_size=8))
        epochs = []
        for _ in range(6):
            losses = []
            for xb, yb in loader:  # float32 batches: prepare casts them to the engine's bf16
                out = model(xb)
                loss = torch.nn.functional.mse_loss(out.float(), yb)
                accelerator.backward(loss); optimizer.step(); optimizer.zero_grad()
                losses.append(loss.item())
            epochs.append(sum(losses) / len(losses))
        state = optimizer.optimizer.optimizer.state  # the torch AdamW inside ZeRO's optimizer: float32 moments
        master = next(t for s in state.values() for t in s.values() if torch.is_tensor(t) and t.dim() > 0)
        print(accelerator.deepspeed_config["bf16"], accelerator.num_processes, out.dtype,
              next(model.module.parameters()).dtype, master.dtype, epochs[-1] < epochs[0])
    """)
    assert out.returncode == 0, out.stderr[-3000:]
    assert (
        out.stdout.strip().splitlines()[-1]
        == "{'enabled': True} 1 torch.bfloat16 torch.bfloat16 torch.float32 True"
    )
