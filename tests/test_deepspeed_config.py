"""DeepSpeed where users choose their launch: `accel-nb config` (driven through stdin in a real subprocess)
and config_wizard()'s controls offer it when deepspeed is installed, and what they write launches for real."""

from __future__ import annotations

import sys

import pytest

from accel_nb.config import launch_command_line, load_config
from tests.test_cli import accel_nb
from tests.test_deepspeed_launch import _launch, _results, needs_deepspeed
from tests.test_wizard import _hw

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@needs_deepspeed
@pytest.mark.multiproc
def test_questionnaire_offers_deepspeed_and_its_config_launches_zero2(tmp_path):
    cfg = str(tmp_path / "cfgdir" / "default_config.yaml")
    answers = [
        "cpu",  # compute on
        "1",  # machines
        "2",  # processes
        "",  # mixed precision: no
        "2",  # gradient accumulation
        "maybe",  # DeepSpeed: invalid, asked again
        "yes",
        str(tmp_path / "missing.json"),  # a JSON config that does not exist: asked again
        "",  # none: the questions
        "4",  # ZeRO stage: invalid
        "2",
        "disk",  # optimizer offload: invalid
        "none",
        "-1",  # clipping: invalid
        "0.5",
        "",  # start method (no torch.compile question with DeepSpeed)
    ]
    out = accel_nb("config", cfg=cfg, stdin="\n".join(answers) + "\n")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "! use_deepspeed='maybe' is not valid" in out.stdout
    assert "! deepspeed_config_file=" in out.stdout and "does not exist" in out.stdout
    assert "! zero_stage='4' is not valid" in out.stdout and "0, 1, 2, 3" in out.stdout
    assert "! offload_optimizer_device='disk' is not valid" in out.stdout
    assert "! gradient_clipping='-1' is not valid" in out.stdout
    assert "torch.compile" not in out.stdout  # not offered with DeepSpeed
    assert "Offload the parameters" not in out.stdout  # stage 3 only
    saved = load_config(cfg)
    assert (saved.distributed_type, saved.num_processes, saved.use_cpu) == ("DEEPSPEED", 2, True)
    assert saved.gradient_accumulation_steps == 2
    assert saved.extras["deepspeed_config"] == {
        "zero_stage": 2,
        "offload_optimizer_device": "none",
        "gradient_clipping": 0.5,
    }
    line = launch_command_line(saved)
    assert "--use_deepspeed --zero_stage 2 --offload_optimizer_device none --gradient_clipping 0.5" in line
    assert line in out.stdout
    # Enter on every question keeps it all
    again = accel_nb("config", cfg=cfg, stdin="\n" * 12)
    assert again.returncode == 0, again.stdout + again.stderr
    assert load_config(cfg) == saved
    # the written config runs a real 2-process DeepSpeed launch
    run = _launch(tmp_path, "--config_file", cfg)
    assert run.returncode == 0, run.stdout + run.stderr
    for rank in _results(tmp_path):
        assert (
            rank["distributed_type"] == rank["partial"] == "DEEPSPEED" and rank["engine"] == "DeepSpeedEngine"
        )
        assert rank["zero_stage"] == 2 and rank["clipping"] == 0.5 and rank["accumulation"] == 2
        assert rank["train_batch_size"] == 4 * 2 * 2 and len(rank["losses"]) == 8


@needs_deepspeed
def test_questionnaire_zero3_with_offload_and_leaving_deepspeed(tmp_path):
    cfg = str(tmp_path / "c.yaml")
    answers = ["cpu", "1", "2", "", "", "yes", "", "3", "cpu", "nvme", "", "/tmp/ds-nvme", "", "", "no", ""]
    out = accel_nb("config", "--config_file", cfg, cfg=cfg, stdin="\n".join(answers) + "\n")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "! offload_param_nvme_path is empty" in out.stdout and "NVMe" in out.stdout
    assert load_config(cfg).extras["deepspeed_config"] == {
        "zero_stage": 3,
        "offload_optimizer_device": "cpu",
        "offload_param_device": "nvme",
        "offload_param_nvme_path": "/tmp/ds-nvme",
        "gradient_clipping": 1.0,
        "zero3_save_16bit_model": True,
        "zero3_init_flag": False,
    }
    # answering no: back to plain data parallelism, the DeepSpeed settings gone, torch.compile asked again
    out = accel_nb("config", "--config_file", cfg, cfg=cfg, stdin="\n\n\n\n\nno\n\n\n\n")  # then FSDP: no
    assert out.returncode == 0, out.stdout + out.stderr
    assert "torch.compile backend" in out.stdout
    saved = load_config(cfg)
    assert saved.distributed_type == "MULTI_CPU" and "deepspeed_config" not in saved.extras


QUESTIONS_WITHOUT_DEEPSPEED = """
    import sys
    sys.modules["deepspeed"] = None  # what the check meets where deepspeed is not installed
    from accel_nb.commands.main import main
    sys.exit(main(["config", "--config_file", sys.argv[1]]))
"""


def _questions_without_deepspeed(cfg: str, answers: str):
    import subprocess

    from tests.test_deepspeed_launch import ROOT

    code = __import__("textwrap").dedent(QUESTIONS_WITHOUT_DEEPSPEED)
    env = dict(__import__("os").environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1", ACCEL_NB_CONFIG_FILE=cfg)
    return subprocess.run(
        [sys.executable, "-c", code, cfg], input=answers, env=env, capture_output=True, text=True, timeout=300
    )


def test_questionnaire_without_deepspeed_does_not_offer_it_and_a_deepspeed_config_names_the_extra(tmp_path):
    cfg = str(tmp_path / "c.yaml")
    out = _questions_without_deepspeed(
        cfg, "cpu\n1\n2\n\n\n\n\n\n"
    )  # 8 questions (FSDP: no), none about DeepSpeed
    assert out.returncode == 0, out.stdout + out.stderr
    assert "DeepSpeed" not in out.stdout and load_config(cfg).distributed_type == "MULTI_CPU"
    (tmp_path / "c.yaml").write_text(
        "distributed_type: DEEPSPEED\nnum_processes: 2\nuse_cpu: true\ndeepspeed_config:\n  zero_stage: 2\n"
    )
    out = _questions_without_deepspeed(cfg, "\n" * 7)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "DeepSpeed ZeRO (yes/no)" not in out.stdout
    assert "deepspeed is not installed; pip install 'accel_nb[deepspeed]'" in out.stdout


@needs_deepspeed
def test_wizard_offers_deepspeed_and_shows_only_what_applies(tmp_path):
    from accel_nb.notebook.wizard import ConfigWizard

    path = str(tmp_path / "w.yaml")
    w = ConfigWizard(path, hw=_hw(0))
    c = w.controls
    assert c["use_deepspeed"].layout.display is None and w._engine_boxes["deepspeed"].layout.display == "none"
    w.set_values(num_processes=2, use_deepspeed=True, zero_stage=1, gradient_clipping=0.5)
    assert (
        w._engine_boxes["deepspeed"].layout.display is None and c["dynamo_backend"].layout.display == "none"
    )
    assert c["offload_optimizer_device"].layout.display is None
    assert c["offload_param_device"].layout.display == "none"  # stage 3 only
    assert c["zero3_init_flag"].layout.display == "none"
    assert w.config.distributed_type == "DEEPSPEED"
    assert w.config.extras["deepspeed_config"] == {
        "zero_stage": 1,
        "offload_optimizer_device": "none",
        "gradient_clipping": 0.5,
    }
    text = w.commands_text
    assert "--use_deepspeed --zero_stage 1" in text and "Save first" in text
    assert "deepspeed_plugin=DeepSpeedPlugin(zero_stage=1, offload_optimizer_device='none'" in text
    # stage 3 with NVMe parameter offload: the folder is asked for; Save stays off until it is given
    w.set_values(zero_stage=3, offload_param_device="nvme")
    assert c["offload_param_nvme_path"].layout.display is None and c["zero3_init_flag"].layout.display is None
    assert w.error.key == "deepspeed_config" and "needs offload_param_nvme_path" in str(w.error)
    assert w.save_button.disabled and w.save() is None
    w.set_values(offload_param_nvme_path="/tmp/ds-nvme", zero3_init_flag=False)
    assert w.save() == path
    saved = load_config(path)
    assert saved.distributed_type == "DEEPSPEED" and saved.extras["deepspeed_config"]["zero_stage"] == 3
    assert saved.extras["deepspeed_config"]["offload_param_nvme_path"] == "/tmp/ds-nvme"
    # a wizard on the saved file starts from it; unticking DeepSpeed gives plain data parallelism
    again = ConfigWizard(path, hw=_hw(0))
    assert again.config == saved and again.controls["zero_stage"].value == 3
    again.set_values(use_deepspeed=False)
    assert again.config.distributed_type == "MULTI_CPU" and "deepspeed_config" not in again.config.extras
    # a JSON file replaces the settings, which hide; a missing file is named
    w.set_values(deepspeed_config_file=str(tmp_path / "nope.json"))
    assert c["zero_stage"].layout.display == "none" and "does not exist" in str(w.error)


def test_wizard_without_deepspeed_does_not_offer_it_and_a_deepspeed_config_names_the_extra(
    tmp_path, monkeypatch
):
    from accel_nb.notebook.wizard import ConfigWizard

    monkeypatch.setitem(sys.modules, "deepspeed", None)  # as where it is not installed
    w = ConfigWizard(str(tmp_path / "a.yaml"), hw=_hw(0))
    assert w.controls["use_deepspeed"].layout.display == "none" and w.valid
    path = tmp_path / "ds.yaml"
    path.write_text(
        "distributed_type: DEEPSPEED\nnum_processes: 2\nuse_cpu: true\ndeepspeed_config:\n  zero_stage: 2\n"
    )
    w = ConfigWizard(str(path), hw=_hw(0))
    assert w.controls["use_deepspeed"].value and not w.valid and w.save_button.disabled
    assert "deepspeed is not installed; pip install 'accel_nb[deepspeed]'" in str(w.error)
    w.set_values(use_deepspeed=False)
    assert w.valid and w.config.distributed_type == "MULTI_CPU"
