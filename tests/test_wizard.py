"""config_wizard(): driven in a real Jupyter kernel (widgets over comms), and its pieces in-process."""

from __future__ import annotations

import os

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
    assert w.config.dynamo_backend == "aot_eager" and "Accelerator(dynamo_backend=" in w.commands.value


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
