"""The launch-config questions are one table (accel_nb.config.questions) that both faces render: every question
is asked by `accel-nb config` where its rule holds, and every question the wizard renders has its control there,
with the table's label, kind and choices, shown exactly where the same rule holds."""

from __future__ import annotations

import io

import pytest

import accel_nb.commands.config as config_command
from accel_nb.config.questions import (
    KINDS,
    QUESTIONS,
    deepspeed_installed,
    megatron_installed,
    question,
)
from accel_nb.hardware import GPUInfo, HardwareInfo

# the questions only the terminal asks (the wizard has no control for them yet): a new one is added here on purpose
TERMINAL_ONLY = {"same_network", "dynamo_use_regional_compilation"}


def _hw(gpus: int = 0) -> HardwareInfo:
    return HardwareInfo(
        cpu_physical_cores=4,
        cpu_logical_cores=8,
        ram_total=2**35,
        ram_available=2**34,
        gpus=[GPUInfo(i, "NVIDIA H100", 80 * 2**30, (9, 0), True) for i in range(gpus)],
        nvml_available=bool(gpus),
    )


def _terminal(monkeypatch, tmp_path, hw: HardwareInfo, replies: dict[str, str]) -> tuple[list[str], object]:
    """Run the questionnaire; each prompt starting with a key of ``replies`` gets that answer, the others Enter.
    Returns the prompts asked (without the "[default]: " tail) and the config."""
    asked: list[str] = []

    def answer(prompt: str = "") -> str:
        text = prompt.rsplit(" [", 1)[0]
        asked.append(text)
        return next((reply for start, reply in replies.items() if text.startswith(start)), "")

    monkeypatch.setattr(config_command, "detect", lambda: hw)
    monkeypatch.setattr("builtins.input", answer)
    cfg = config_command.questionnaire(str(tmp_path / "none.yaml"), out=io.StringIO())
    return asked, cfg


def test_the_table_is_well_formed():
    keys = [q.key for q in QUESTIONS]
    assert len(keys) == len(set(keys))
    for q in QUESTIONS:
        assert q.kind in KINDS and q.prompt and question(q.key) is q
        assert bool(q.label) == q.wizard, q.key  # a wizard control has a label, a terminal-only question none
        assert (q.kind == "choice") == bool(q.options()), q.key
        if q.kind == "bool":
            assert q.cli_prompt().endswith(" (yes/no)"), q.key
    assert {q.key for q in QUESTIONS if not q.wizard} == TERMINAL_ONLY


def test_accel_nb_config_asks_every_question_where_its_rule_holds(monkeypatch, tmp_path):
    prompts = {q.key: q.cli_prompt() for q in QUESTIONS}
    asked: set[str] = set()
    nvme = str(tmp_path / "nvme")
    scenarios = [
        # two machines, DeepSpeed ZeRO-3 with both offloads on NVMe (where DeepSpeed is installed)
        (
            _hw(0),
            {
                "Compute on": "cpu",
                prompts["num_machines"]: "2",
                prompts["main_process_ip"]: "10.0.0.1",
                prompts["num_processes"]: "4",
                prompts["use_deepspeed"]: "yes",
                prompts["zero_stage"]: "3",
                prompts["offload_optimizer_device"]: "nvme",
                prompts["offload_param_device"]: "nvme",
                prompts["offload_optimizer_nvme_path"]: nvme,
                prompts["offload_param_nvme_path"]: nvme,
            },
        ),
        # FSDP2 with the layout, and a compiled model
        (
            _hw(0),
            {
                "Compute on": "cpu",
                prompts["num_processes"]: "4",
                prompts["use_deepspeed"]: "no",
                prompts["use_fsdp"]: "yes",
                prompts["use_parallelism_config"]: "yes",
                prompts["tp_size"]: "2",
                prompts["dynamo_backend"]: "inductor",
            },
        ),
        # four GPUs (stood in): Megatron-LM with tp and pp (where megatron-core is installed)
        (
            _hw(4),
            {
                "Compute on": "gpu",
                prompts["use_deepspeed"]: "no",
                prompts["use_megatron_lm"]: "yes",
                prompts["megatron_lm_tp_degree"]: "2",
                prompts["megatron_lm_pp_degree"]: "2",
            },
        ),
    ]
    for hw, replies in scenarios:
        texts, cfg = _terminal(monkeypatch, tmp_path, hw, replies)
        assert texts[0].startswith("Compute on (") and cfg.validate() is cfg
        compute = replies["Compute on"]
        for q in QUESTIONS:
            if q.key != "compute" and q.cli_prompt() in texts:
                asked.add(q.key)
        asked.add("compute")
        # a question the table says does not apply to the answers given is not asked (e.g. no GPU ids on CPU)
        if compute == "cpu":
            assert prompts["gpu_ids"] not in texts and prompts["use_megatron_lm"] not in texts
        if cfg.distributed_type in ("DEEPSPEED", "MEGATRON_LM"):
            assert prompts["use_fsdp"] not in texts and prompts["dynamo_backend"] not in texts
    expected = {q.key for q in QUESTIONS}
    if not deepspeed_installed():
        expected -= {q.key for q in QUESTIONS if q.section == "deepspeed"}
    if not megatron_installed():
        expected -= {q.key for q in QUESTIONS if q.section == "megatron"}
    assert asked == expected, f"never asked: {sorted(expected - asked)}"


def test_the_wizard_builds_a_control_for_every_question_and_shows_it_where_its_rule_holds(tmp_path):
    pytest.importorskip("ipywidgets")
    from accel_nb.notebook.wizard import ConfigWizard

    w = ConfigWizard(str(tmp_path / "w.yaml"), hw=_hw(2))
    rendered = {q.key for q in QUESTIONS if q.wizard}
    assert set(w.controls) == rendered
    widget = {"choice": "Dropdown", "bool": "Checkbox", "float": "BoundedFloatText", "text": "Text"}
    for key in rendered:
        q, control = question(key), w.controls[key]
        assert control.description == q.label, key
        expected = widget.get(q.kind) or ("IntSlider" if q.slider else "IntText")
        assert type(control).__name__ == expected, key
        if q.kind == "choice" and key != "compute":  # compute lists this machine's (label, value) pairs
            assert set(q.options()) <= set(control.options), key
    # each control is shown exactly where the table's rule holds for what the controls say
    for values in (
        {"compute": "cpu", "num_processes": 1},
        {
            "compute": "gpu",
            "num_processes": 4,
            "num_machines": 2,
            "use_fsdp": True,
            "use_parallelism_config": True,
        },
        {"compute": "cpu", "num_processes": 2, "use_deepspeed": deepspeed_installed(), "zero_stage": 3},
        # Megatron-LM on GPUs with DeepSpeed off (where megatron-core is installed): tp > 1 shows sequence parallel
        {"compute": "gpu", "use_deepspeed": False, "use_megatron_lm": True, "megatron_lm_tp_degree": 2},
        {"use_deepspeed": deepspeed_installed()},  # DeepSpeed on: Megatron-LM is not offered
    ):
        w.set_values(**values)
        answers = {key: control.value for key, control in w.controls.items()}
        answers["use_deepspeed"] = answers["use_deepspeed"] and deepspeed_installed()
        answers["use_megatron_lm"] = answers["use_megatron_lm"] and question("use_megatron_lm").asked(answers)
        for key in ("gpu_ids", "use_deepspeed", "use_megatron_lm", "use_fsdp", "dynamo_backend"):
            assert (w.controls[key].layout.display != "none") == question(key).asked(answers), (key, values)
        for key in ("zero_stage", "offload_param_device", "zero3_init_flag"):  # inside DeepSpeed's box
            assert (w.controls[key].layout.display != "none") == question(key).asked(
                {**answers, "use_deepspeed": 1}
            )
        for key in ("megatron_lm_sequence_parallelism", "megatron_lm_num_micro_batches"):  # Megatron-LM's box
            assert (w.controls[key].layout.display != "none") == question(key).asked(
                {**answers, "use_megatron_lm": 1}
            )
        assert (w._engine_boxes["deepspeed"].layout.display != "none") == answers["use_deepspeed"]
        assert (w._engine_boxes["megatron"].layout.display != "none") == answers["use_megatron_lm"]
        assert (w._multi.layout.display != "none") == question("machine_rank").asked(answers)
        layout = question("use_fsdp").asked(answers) and question("use_parallelism_config").asked(answers)
        assert (w._layout_box.layout.display != "none") == layout
        assert (w._sizes_box.layout.display != "none") == question("tp_size").asked(answers)
