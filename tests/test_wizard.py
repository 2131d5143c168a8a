"""config_wizard(): driven in a real Jupyter kernel (widgets over comms), and its pieces in-process."""

from __future__ import annotations

import os
import re

import pytest

from accel_nb.config import LaunchConfig, load_config
from accel_nb.hardware import GPUInfo, HardwareInfo
from tests.kernel_helpers import KernelSession


def _hw(gpus: int = 0, cc: tuple[int, int] = (8, 0)) -> HardwareInfo:
    return HardwareInfo(
        cpu_physical_cores=4,
        cpu_logical_cores=8,
        ram_total=2**35,
        ram_available=2**34,
        gpus=[GPUInfo(i, "NVIDIA A100", 80 * 2**30, cc, cc >= (8, 0)) for i in range(gpus)],
        nvml_available=bool(gpus),
        torch_version="2.x",
        accel_nb_version="0.1.0",
        python_version="3.11.7",
    )


def _widget_states(comms: list[dict]) -> list[dict]:
    """Every widget state the kernel sent to the front end (comm_open and update messages)."""
    states = []
    for c in comms:
        data = c.get("data", {})
        state = data.get("state")
        if state:
            states.append(state)
    return states


@pytest.mark.kernel
def test_wizard_in_a_real_kernel_saves_a_valid_file_and_refuses_an_invalid_one(tmp_path):
    cfg_path = tmp_path / "wizard" / "default_config.yaml"
    with KernelSession(env={"ACCEL_NB_CONFIG_FILE": str(cfg_path)}) as k:
        out = k.run("from accel_nb import config_wizard\nwizard = config_wizard()\nwizard", timeout=180)
        assert out.error is None, out.traceback
        views = [r for r in out.results if "application/vnd.jupyter.widget-view+json" in r]
        assert views, out.results  # a real widget view went to the front end
        assert any(
            s.get("_model_name") == "ButtonModel" and s.get("description") == "Save"
            for s in _widget_states(out.comms)
        )

        out = k.run(
            "wizard.controls['num_processes'].value = 2\n"
            "wizard.controls['mixed_precision'].value = 'bf16'\n"
            "wizard.controls['gradient_accumulation_steps'].value = 4\n"
            "print('valid', wizard.valid, wizard.config.distributed_type)\n"
            "print(wizard.commands_text)\n"
            "print('saved', wizard.save())\n"
            "print('status', wizard.status)\n"
        )
        assert out.error is None, out.traceback
        assert "valid True MULTI_CPU" in out.stdout
        assert (
            "%%accelerate --num_processes 2 --mixed_precision bf16 --gradient_accumulation_steps 4"
            in out.stdout
        )
        assert (
            "notebook_launcher(training_function, num_processes=2, mixed_precision='bf16', cpu=True)"
            in out.stdout
        )
        assert (
            "accel-nb launch --num_processes 2 --mixed_precision bf16 --gradient_accumulation_steps 4"
            in out.stdout
        )
        assert f"saved {cfg_path}" in out.stdout and f"status Saved to {cfg_path}" in out.stdout
        saved = load_config(str(cfg_path))
        assert (saved.num_processes, saved.mixed_precision, saved.gradient_accumulation_steps) == (
            2,
            "bf16",
            4,
        )
        assert saved.distributed_type == "MULTI_CPU"
        before = cfg_path.read_text()

        out = k.run(
            "wizard.controls['num_processes'].value = 0\n"
            "print('valid', wizard.valid, 'disabled', wizard.save_button.disabled)\n"
            "print('error', wizard.error_label.value)\n"
            "print('saved', wizard.save())\n"
            "print('status', wizard.status)\n"
        )
        assert out.error is None, out.traceback
        assert "valid False disabled True" in out.stdout
        assert (
            "<b>num_processes</b>: num_processes=0 is not valid" in out.stdout
            and "whole number &gt;= 1" in out.stdout
        )
        assert "saved None" in out.stdout and "status Not saved: num_processes=0" in out.stdout
        assert cfg_path.read_text() == before  # the old file is untouched
        # the front end was told: Save disabled, the error text shown
        states = _widget_states(out.comms)
        assert any(s.get("disabled") is True for s in states)
        assert any("num_processes=0 is not valid" in str(s.get("value", "")) for s in states)

        # several machines: the address is required, then the file validates again
        out = k.run(
            "wizard.set_values(num_processes=4, num_machines=2, machine_rank=1)\n"
            "print('error key', wizard.error.key)\n"
            "wizard.set_values(main_process_ip='10.0.0.7', main_process_port='29555')\n"
            "print('valid', wizard.valid, 'saved', wizard.save())\n"
        )
        assert out.error is None, out.traceback
        assert "error key main_process_ip" in out.stdout and f"valid True saved {cfg_path}" in out.stdout
        saved = load_config(str(cfg_path))
        assert (saved.num_machines, saved.machine_rank, saved.main_process_ip, saved.main_process_port) == (
            2,
            1,
            "10.0.0.7",
            29555,
        )


@pytest.mark.kernel
def test_wizard_starts_from_the_saved_config(tmp_path):
    cfg_path = tmp_path / "c.yaml"
    LaunchConfig(distributed_type="MULTI_CPU", num_processes=3, gradient_accumulation_steps=2).save(
        str(cfg_path)
    )
    with KernelSession(env={"ACCEL_NB_CONFIG_FILE": str(cfg_path)}) as k:
        out = k.run(
            "from accel_nb import config_wizard\nw = config_wizard()\n"
            "print(w.controls['num_processes'].value, w.controls['gradient_accumulation_steps'].value, w.status)"
        )
        assert out.error is None, out.traceback
        assert f"3 2 Loaded {cfg_path}." in out.stdout


def test_wizard_proposal_follows_the_hardware(tmp_path):
    from accel_nb.notebook.wizard import ConfigWizard

    path = str(tmp_path / "x.yaml")
    four = ConfigWizard(path, hw=_hw(4))
    assert four.controls["compute"].value == "gpu" and four.controls["num_processes"].value == 4
    assert four.config.distributed_type == "MULTI_GPU" and four.config.mixed_precision == "bf16"
    assert "GPU 3: NVIDIA A100" in four.hardware_box.value
    # bf16 on GPUs that lack it: an error naming the GPU, Save disabled
    t4 = ConfigWizard(path, hw=_hw(2, cc=(7, 5)))
    assert t4.config.mixed_precision == "fp16"
    t4.set_values(mixed_precision="bf16")
    assert t4.error.key == "mixed_precision" and "compute capability 7.5" in str(t4.error)
    assert t4.save_button.disabled and t4.save() is None and not os.path.exists(path)
    # switching to CPU processes: fp16 goes, the type follows the process count
    t4.set_values(compute="cpu", num_processes=2, mixed_precision="fp16")
    assert t4.config.distributed_type == "MULTI_CPU" and any("fp16" in n for n in t4.notes)
    t4.reset()
    assert t4.config.distributed_type == "MULTI_GPU" and t4.config.num_processes == 2
    with pytest.raises(KeyError, match="no control 'colour'"):
        t4.set_values(colour="blue")


def test_wizard_with_a_broken_saved_file_starts_from_the_proposal(tmp_path):
    from accel_nb.notebook.wizard import ConfigWizard

    path = tmp_path / "bad.yaml"
    path.write_text("num_processes: [\n")
    w = ConfigWizard(str(path), hw=_hw(0))
    assert "cannot be used" in w.status and "not valid YAML" in w.status
    assert w.valid and w.save() == str(path)
    assert load_config(str(path)).num_processes == 1


def test_wizard_issue15_details_button_label_empty_address_and_cpu_flag(tmp_path):
    from accel_nb.notebook.wizard import ConfigWizard

    w = ConfigWizard(str(tmp_path / "x.yaml"), hw=_hw(0))
    # the reset button sizes itself to its label (the default width cut "Proposed for this machine" off)
    assert w.reset_button.description == "Proposed for this machine" and w.reset_button.layout.width == "auto"
    # CPU processes: all three equivalent launches say so
    w.set_values(num_processes=2)
    text = w.commands.value
    assert "--cpu" in text and "cpu=True" in text and text.count("--cpu") == 2
    # an empty main-machine address is called empty, never shown as None
    w.set_values(num_machines=2, main_process_ip="")
    assert w.error.key == "main_process_ip"
    assert "main_process_ip is empty" in str(w.error) and "None" not in w.error_label.value
    # the compile backend is offered now that prepare() applies it (issue 20)
    w.set_values(num_machines=1, dynamo_backend="aot_eager")
    shown = re.sub(
        r"<[^>]+>", "", w.commands.value
    )  # the text the cell shows (a long call may break after its "(")
    assert w.config.dynamo_backend == "aot_eager" and "Accelerator(dynamo_backend=" in shown


def test_wizard_on_a_tpu_host_proposes_one_process_per_xla_device_and_names_torchtpu(tmp_path):
    from accel_nb.notebook.wizard import ConfigWizard, hardware_summary
    from accel_nb.xla_detect import DeviceBackend, XlaRuntime

    hw = _hw()
    hw.xla_available, hw.tpu_detected, hw.tpu_chips = True, True, 8
    hw.tpu_hints = ["8 Google PCI devices (0000:00:04.0, ...)"]
    hw.xla_runtime = XlaRuntime("TPU", 8, "8 Google PCI devices")
    hw.device_backends = [DeviceBackend("tpu", "torch_tpu:_autoload", "torch-tpu")]
    text = hardware_summary(hw)
    assert "GPUs: none (no NVIDIA driver)" in text and "TPU detected, 8 chips" in text
    assert "XLA launch: TPU runtime, 8 devices" in text
    assert "TorchTPU torch-tpu" in text and "TORCH_DEVICE_BACKEND_AUTOLOAD=0" in text
    wizard = ConfigWizard(str(tmp_path / "x.yaml"), hw=hw)
    assert wizard.controls["compute"].value == "xla" and wizard.controls["num_processes"].value == 8
    assert wizard.config.distributed_type == "XLA" and wizard.config.mixed_precision == "bf16"
    wizard.set_values(compute="cpu", num_processes=1)
    wizard.controls["compute"].value = "xla"  # as a click does: the device count is proposed again
    assert wizard.controls["num_processes"].value == 8 and wizard.config.distributed_type == "XLA"


def test_commands_wrap_between_whole_flags_only():
    from accel_nb.notebook.wizard_text import _groups, commands_html

    line = "accel-nb launch --num_processes 2 --mixed_precision bf16 --cpu train.py --lr 0.1"
    groups = _groups(line)
    assert groups[:4] == ["accel-nb", "launch", "--num_processes 2", "--mixed_precision bf16"]
    assert " ".join(groups) == line and groups[-1] == "--lr 0.1"
    out = commands_html("# a script\n" + line)
    # every flag with its value sits in one unbreakable piece; breaks fall only between pieces
    assert "<span style='white-space:nowrap'>--mixed_precision bf16</span>" in out
    assert "white-space:normal" in out and "<pre" not in out


def test_wizard_offers_the_parallel_layout_with_fsdp_and_writes_what_the_cli_writes(tmp_path, monkeypatch):
    """Issue 30: tp/cp/replica sizes with FSDP, checked as `accel-nb config` checks them, the same mapping saved,
    and the generated `accel-nb launch` line gives the ranks the layout."""
    import io
    import shlex

    from accel_nb.commands.config import parallelism_questions
    from accel_nb.commands.launch import config_for_launch
    from accel_nb.commands.main import build_parser
    from accel_nb.notebook.wizard import ConfigWizard

    path = tmp_path / "layout.yaml"
    w = ConfigWizard(str(path), hw=_hw(0))
    # FSDP is offered with several processes only; the layout with FSDP only
    assert w.controls["use_fsdp"].layout.display == "none" and w._layout_box.layout.display == "none"
    w.set_values(compute="cpu", num_processes=4)
    assert w.controls["use_fsdp"].layout.display is None and w._layout_box.layout.display == "none"
    w.set_values(use_fsdp=True)
    assert w._layout_box.layout.display is None and w._sizes_box.layout.display == "none"
    assert w.config.distributed_type == "FSDP" and "parallelism_config" not in w.config.extras
    # sizes that do not divide the processes: the inline error with the numbers, nothing written
    w.set_values(use_parallelism_config=True, tp_size=3)
    assert w._sizes_box.layout.display is None
    assert w.error.key == "parallelism_config" and not w.valid and w.save_button.disabled
    assert "tp_size 3 × cp_size 1 × dp_replicate_size 1 = 3" in str(w.error)
    assert "does not divide the 4 processes" in str(w.error) and "1, 2 or 4" in w.error_label.value
    assert w.save() is None and not path.exists() and "does not divide the 4 processes" in w.status
    w.set_values(tp_size=4)  # no FSDP shard left
    assert "leaves FSDP no processes to shard over" in str(w.error)
    w.set_values(tp_size=0)
    assert w.error.key == "tp_size"
    w.set_values(tp_size=2)
    assert w.valid and "FSDP shards over 2 processes" in w.layout_label.value
    assert "ParallelismConfig(dp_shard_size=2, tp_size=2)" in w.commands_text  # notebook_launcher's comment
    # %%accelerate reads the layout from the saved file (issue 30): no "build it in the cell's code" line
    assert "# in the cell" not in w.commands_text
    assert "FSDP's settings and the layout come from the saved config" in w.commands_text
    assert w.save() == str(path)
    saved = load_config(str(path))
    assert saved.distributed_type == "FSDP"
    # `accel-nb config` answering the same sizes writes the same mapping
    answers = iter(["yes", "2", "1", "1"])
    monkeypatch.setattr("builtins.input", lambda prompt="": next(answers))
    cli = parallelism_questions(
        LaunchConfig(distributed_type="FSDP", num_processes=4, use_cpu=True), io.StringIO()
    )
    assert (
        saved.extras["parallelism_config"]
        == cli.extras["parallelism_config"]
        == {
            "parallelism_config_dp_replicate_size": 1,
            "parallelism_config_dp_shard_size": 2,
            "parallelism_config_tp_size": 2,
            "parallelism_config_cp_size": 1,
        }
    )
    # the wizard's terminal command, read by `accel-nb launch` with the saved file, gives the ranks the layout
    line = w.commands_text.splitlines()[-1]
    assert line.startswith("accel-nb launch") and "--parallelism_config_tp_size 2" in line
    monkeypatch.setenv("ACCEL_NB_CONFIG_FILE", str(path))
    cfg = config_for_launch(build_parser().parse_args(shlex.split(line)[1:]))
    env = cfg.to_env()
    assert cfg.distributed_type == "FSDP" and env["PARALLELISM_CONFIG_TP_SIZE"] == "2"
    assert env["PARALLELISM_CONFIG_DP_SHARD_SIZE"] == "2" and env["ACCEL_NB_USE_PARALLELISM_CONFIG"] == "true"
    # reopened, the wizard shows the saved layout; context parallel and replicas too
    again = ConfigWizard(str(path), hw=_hw(0))
    assert again.controls["use_fsdp"].value and again.controls["use_parallelism_config"].value
    assert again.controls["tp_size"].value == 2 and again.config.extras == saved.extras
    again.set_values(num_processes=8, cp_size=2, dp_replicate_size=2)  # FSDP over cp only, with replicas
    assert again.error.key == "parallelism_config" and "does not compose" in str(again.error)
    again.set_values(num_processes=16)
    assert again.config.extras["parallelism_config"]["parallelism_config_dp_shard_size"] == 2
    assert (
        "ParallelismConfig(dp_replicate_size=2, dp_shard_size=2, cp_size=2, tp_size=2)" in again.commands_text
    )
    # FSDP off: no layout, plain data parallel
    again.set_values(use_fsdp=False)
    assert again.config.distributed_type == "MULTI_CPU" and "parallelism_config" not in again.config.extras
    assert again._layout_box.layout.display == "none"
    again.reset()
    assert not again.controls["use_fsdp"].value and not again.controls["use_parallelism_config"].value
    # a saved layout without FSDP (any distributed_type may have one) is kept, not dropped on Save
    plain = tmp_path / "plain.yaml"
    plain.write_text(
        "distributed_type: MULTI_CPU\nnum_processes: 2\nuse_cpu: true\n"
        "parallelism_config:\n  parallelism_config_tp_size: 2\n"
    )
    kept = ConfigWizard(str(plain), hw=_hw(0))
    assert kept.controls["use_parallelism_config"].value and kept._layout_box.layout.display is None
    assert kept.save() == str(plain)
    assert load_config(str(plain)).extras["parallelism_config"]["parallelism_config_tp_size"] == 2
    # a click on the layout with every size 1 proposes tensor parallel over 2, as `accel-nb config` does
    fresh = ConfigWizard(str(tmp_path / "fresh.yaml"), hw=_hw(0))
    fresh.set_values(num_processes=4, use_fsdp=True)
    fresh.controls["use_parallelism_config"].value = True
    assert fresh.controls["tp_size"].value == 2 and "FSDP shards over 2 processes" in fresh.layout_label.value


def test_wizard_offers_megatron_lm_only_where_the_table_does(tmp_path, monkeypatch):
    """Issue 43: the Megatron-LM switch shows only with GPU compute, DeepSpeed off and megatron-core installed
    (the table's rule); a hidden switch is no answer. A saved Megatron-LM config shows while ticked, to be turned off."""
    import accel_nb.config.questions as questions
    from accel_nb.notebook.wizard import ConfigWizard

    cpu = ConfigWizard(str(tmp_path / "cpu.yaml"), hw=_hw(0))  # no GPU: CPU compute only
    assert cpu.controls["use_megatron_lm"].layout.display == "none"
    cpu.set_values(num_processes=2, use_megatron_lm=True)
    assert cpu.config.distributed_type == "MULTI_CPU" and "megatron_lm_config" not in cpu.config.extras
    assert cpu._engine_boxes["megatron"].layout.display == "none"
    monkeypatch.setattr(questions, "megatron_installed", lambda: False)
    gpu = ConfigWizard(str(tmp_path / "gpu.yaml"), hw=_hw(4))
    assert gpu.controls["compute"].value == "gpu" and gpu.controls["use_megatron_lm"].layout.display == "none"
    gpu.set_values(use_megatron_lm=True)
    assert (
        gpu.config.distributed_type == "MULTI_GPU" and gpu._engine_boxes["megatron"].layout.display == "none"
    )
    saved = tmp_path / "saved.yaml"
    saved.write_text(
        "distributed_type: MEGATRON_LM\nnum_processes: 4\nmegatron_lm_config:\n  megatron_lm_tp_degree: 2\n"
    )
    kept = ConfigWizard(str(saved), hw=_hw(4))
    assert kept.controls["use_megatron_lm"].value and kept.controls["use_megatron_lm"].layout.display is None
    assert kept.controls["megatron_lm_tp_degree"].value == 2
    kept.set_values(
        use_megatron_lm=False
    )  # turned off: gone, as the table says where megatron-core is missing
    assert kept.controls["use_megatron_lm"].layout.display == "none"
    assert kept.config.distributed_type == "MULTI_GPU" and "megatron_lm_config" not in kept.config.extras


def test_wizard_writes_the_megatron_lm_config_accel_nb_config_writes(tmp_path, monkeypatch):
    """Issue 43: the Megatron-LM box (GPUs, megatron-core installed) writes the file `accel-nb config` writes for
    the same answers, checked by the loader's rules, reloads it, and excludes DeepSpeed as the table does."""
    import shlex

    import accel_nb.commands.config as config_command
    from accel_nb.commands.launch import config_for_launch
    from accel_nb.commands.main import build_parser
    from accel_nb.config.questions import QUESTIONS, deepspeed_installed, megatron_installed
    from accel_nb.notebook.wizard import ConfigWizard

    if not megatron_installed():
        pytest.skip("megatron-core is not installed (pip install 'accel_nb[megatron]')")
    path = tmp_path / "wizard.yaml"
    w = ConfigWizard(str(path), hw=_hw(4))
    c = w.controls
    assert (
        c["use_megatron_lm"].layout.display is None and w._engine_boxes["megatron"].layout.display == "none"
    )
    w.set_values(use_megatron_lm=True)
    assert w._engine_boxes["megatron"].layout.display is None and w.config.distributed_type == "MEGATRON_LM"
    # tp > 1 asks sequence parallelism, pp > 1 the micro-batches; no FSDP, no compile with Megatron-LM
    assert c["megatron_lm_sequence_parallelism"].layout.display == "none"
    assert c["megatron_lm_num_micro_batches"].layout.display == "none"
    w.set_values(megatron_lm_tp_degree=2, megatron_lm_pp_degree=2, megatron_lm_num_micro_batches=4)
    assert c["megatron_lm_sequence_parallelism"].layout.display is None
    assert c["megatron_lm_num_micro_batches"].layout.display is None
    assert c["use_fsdp"].layout.display == "none" and c["dynamo_backend"].layout.display == "none"
    # checked as a launch checks it: tp x pp divides the processes, the plugin's values, no accumulation
    w.set_values(megatron_lm_tp_degree=3)
    assert w.error.key == "num_processes" and "a multiple of tp x pp = 6" in str(w.error)
    assert w.save_button.disabled and w.save() is None and not path.exists()
    w.set_values(megatron_lm_tp_degree=0)
    assert w.error.key == "megatron_lm_config" and "tp_degree=0" in str(w.error)
    w.set_values(megatron_lm_tp_degree=2, gradient_accumulation_steps=2)
    assert w.error.key == "gradient_accumulation_steps" and "megatron_lm_num_micro_batches" in str(w.error)
    w.set_values(gradient_accumulation_steps=1)
    text = w.commands_text
    assert "--use_megatron_lm --megatron_lm_tp_degree 2" in text and "--megatron_lm_pp_degree 2" in text
    assert "megatron_lm_plugin=MegatronLMPlugin(tp_degree=2, sequence_parallelism=False, pp_degree=2" in text
    # %%accelerate reads the saved megatron_lm_config (magic_flags.launch_options): the cell line needs the file
    assert "# a notebook cell (Megatron-LM's settings come from the saved config: Save first)" in text
    assert w.save() == str(path)
    # `accel-nb config` given the same answers on the same machine writes the same file
    prompts = {q.key: q.cli_prompt() for q in QUESTIONS}
    replies = {
        "Compute on": "gpu",
        prompts["use_deepspeed"]: "no",
        prompts["use_megatron_lm"]: "yes",
        prompts["megatron_lm_tp_degree"]: "2",
        prompts["megatron_lm_pp_degree"]: "2",
        prompts["megatron_lm_num_micro_batches"]: "4",
    }

    def answer(prompt: str = "") -> str:
        text = prompt.rsplit(" [", 1)[0]
        return next((reply for start, reply in replies.items() if text.startswith(start)), "")

    monkeypatch.setattr(config_command, "detect", lambda: _hw(4))
    monkeypatch.setattr("builtins.input", answer)
    cli = tmp_path / "cli.yaml"
    assert config_command.cmd_config_questions(str(cli)) == 0
    assert path.read_text() == cli.read_text()
    saved = load_config(str(path))  # the loader's rules (MegatronLMPlugin's) accept it
    assert saved.distributed_type == "MEGATRON_LM" and saved.extras["megatron_lm_config"] == {
        "megatron_lm_tp_degree": 2,
        "megatron_lm_sequence_parallelism": False,
        "megatron_lm_pp_degree": 2,
        "megatron_lm_num_micro_batches": 4,
        "megatron_lm_recompute_activations": False,
        "megatron_lm_use_distributed_optimizer": False,
        "megatron_lm_gradient_clipping": 1.0,
    }
    # the wizard's terminal command gives the ranks the reference's Megatron-LM variables
    line = w.commands_text.splitlines()[-1]
    monkeypatch.setenv("ACCEL_NB_CONFIG_FILE", str(path))
    env = config_for_launch(build_parser().parse_args(shlex.split(line)[1:])).to_env()
    assert env["ACCELERATE_USE_MEGATRON_LM"] == "true" and env["MEGATRON_LM_PP_DEGREE"] == "2"
    # reopened, the controls show the saved config; saving again writes the same file
    again = ConfigWizard(str(path), hw=_hw(4))
    assert again.config == saved and again.controls["use_megatron_lm"].value
    assert again.controls["megatron_lm_num_micro_batches"].value == 4
    assert again._engine_boxes["megatron"].layout.display is None
    before = path.read_text()
    assert again.save() == str(path) and path.read_text() == before
    # DeepSpeed on: Megatron-LM is not offered (a hidden switch is no answer); off again, it is back as it was
    if deepspeed_installed():
        again.set_values(use_deepspeed=True)
        assert again.controls["use_megatron_lm"].layout.display == "none"
        assert again._engine_boxes["megatron"].layout.display == "none"
        assert (
            again.config.distributed_type == "DEEPSPEED" and "megatron_lm_config" not in again.config.extras
        )
        again.set_values(use_deepspeed=False)
        assert again.controls["use_megatron_lm"].layout.display is None and again.config == saved
    again.set_values(use_megatron_lm=False)
    assert again.config.distributed_type == "MULTI_GPU" and "megatron_lm_config" not in again.config.extras
    assert again._engine_boxes["megatron"].layout.display == "none"
    assert again.controls["dynamo_backend"].layout.display is None
