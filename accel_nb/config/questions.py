"""The launch-config questions, in one table that ``accel-nb config`` and ``config_wizard()`` both render.

Each ``Question`` says which key it answers, the terminal's prompt and the wizard's label, its kind
(``choice``, ``int``, ``bool``, ``text`` or ``float``), its choices (fixed, or computed from what is
installed), its default where the saved config has none, and when it is asked: a predicate on the answers
so far (a flat mapping by key, see ``answers_of``). The terminal asks a question only where its predicate
holds; the wizard builds one control per question and shows it only where the same predicate holds.
Values are validated by ``LaunchConfig`` (and a back-end's plugin) in both faces, so an error reads the same.

    from accel_nb.config.questions import QUESTIONS, question
    question("mixed_precision").options()            # ('no', 'fp16', 'bf16', 'fp8') where torchao is installed
    question("gpu_ids").asked({"compute": "cpu"})    # False: the GPU ids are asked only for GPUs
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from .values import DYNAMO_BACKENDS, LAUNCHER_RDZV_BACKENDS, RDZV_BACKENDS, START_METHODS

__all__ = [
    "ENGINES",
    "Engine",
    "KINDS",
    "QUESTIONS",
    "Question",
    "answers_of",
    "deepspeed_installed",
    "megatron_installed",
    "question",
]

KINDS = ("choice", "int", "bool", "text", "float")
Answers = Mapping[str, Any]


def deepspeed_installed() -> bool:
    """Whether ``deepspeed`` can be imported here (checked without importing it)."""
    return importlib.util.find_spec("deepspeed") is not None


def megatron_installed() -> bool:
    """Whether megatron-core can be imported here (checked without importing it)."""
    return (
        importlib.util.find_spec("megatron") is not None
        and importlib.util.find_spec("megatron.core") is not None
    )


def _mixed_precisions() -> tuple[str, ...]:
    from ..precision.setting import offered_mixed_precisions  # deferred: reads what is installed

    return offered_mixed_precisions()  # fp8 only where an FP8 library (torchao) is installed (docs/fp8.md)


@dataclass(frozen=True)
class Question:
    """One launch-config question; ``asked(answers)`` says whether it applies to the answers so far."""

    key: str  # the config file's key (a section's key for deepspeed_/megatron_lm_/layout questions)
    prompt: str  # the terminal's question; "{choices}" stands for the offered choices joined by "/"
    label: str  # the wizard's label ("" where only the terminal asks it: ``wizard`` is False)
    kind: str
    section: str = "launch"  # launch | machines | deepspeed | megatron | fsdp | layout | compile
    choices: tuple[Any, ...] | Callable[[], tuple[Any, ...]] = ()  # offered (computed: what is installed)
    accepts: tuple[Any, ...] = ()  # what a typed or saved answer may also be (else: the choices)
    default: Any = None  # where the saved config has no value (None: the config's own default)
    when: Callable[[Answers], bool] | None = None  # asked only where this holds (None: always)
    placeholder: str = ""  # the wizard's hint in an empty text field
    slider: tuple[int, int] | None = None  # an int the wizard shows as a slider over this range
    wizard: bool = True  # whether the wizard has a control for it (the terminal asks every question)

    def options(self) -> tuple[Any, ...]:
        """The offered choices (computed now where they depend on what is installed)."""
        return self.choices() if callable(self.choices) else self.choices

    def accepted(self) -> tuple[Any, ...]:
        """Every answer the terminal takes for a choice question."""
        return self.accepts or self.options()

    def asked(self, answers: Answers) -> bool:
        """Whether this question applies, given the answers so far."""
        return self.when is None or bool(self.when(answers))

    def cli_prompt(self) -> str:
        """The terminal's prompt, the offered choices filled in."""
        return self.prompt.format(choices="/".join(str(c) for c in self.options()))


def _int(value: Any, fallback: int = 1) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return fallback


def _several_machines(a: Answers) -> bool:
    return _int(a.get("num_machines")) > 1


def _deepspeed_settings(a: Answers) -> bool:  # DeepSpeed on, its settings answered here (no JSON file)
    return bool(a.get("use_deepspeed")) and not str(a.get("deepspeed_config_file") or "").strip()


def _stage_at_least(min_stage: int) -> Callable[[Answers], bool]:
    return lambda a: _deepspeed_settings(a) and _int(a.get("zero_stage"), 2) >= min_stage


def _nvme(kind: str, min_stage: int) -> Callable[[Answers], bool]:
    return lambda a: _stage_at_least(min_stage)(a) and a.get(f"offload_{kind}_device") == "nvme"


def _engine(a: Answers) -> bool:  # DeepSpeed or Megatron-LM: their engines take the whole model
    return bool(a.get("use_deepspeed") or a.get("use_megatron_lm"))


def _fsdp_offered(a: Answers) -> bool:
    several = _int(a.get("num_processes")) > 1 or _int(a.get("num_machines")) > 1
    return several and a.get("compute") != "xla" and not _engine(a)


def _megatron(a: Answers) -> bool:
    return bool(a.get("use_megatron_lm"))


def _q(key: str, prompt: str, label: str, kind: str, **more: Any) -> Question:
    return Question(key, prompt, label, kind, **more)


_YN = " (yes/no)"
_STAGE_3 = 3
QUESTIONS: tuple[Question, ...] = (
    _q("compute", "Compute on ({choices})", "Compute on", "choice", choices=("cpu", "gpu", "xla")),
    _q("num_machines", "How many machines", "Machines", "int", section="machines"),
    _q(
        "machine_rank",
        "Rank of this machine (0 = the main one)",
        "This machine's rank",
        "int",
        section="machines",
        when=_several_machines,
    ),
    _q(
        "main_process_ip",
        "IP address or host name of machine 0",
        "Main machine address",
        "text",
        section="machines",
        when=_several_machines,
        placeholder="IP or host name of machine 0",
    ),
    _q(
        "main_process_port",
        "Port on machine 0",
        "Main machine port",
        "text",
        section="machines",
        default=29500,
        when=_several_machines,
        placeholder="empty: a free port",
    ),
    _q(
        "rdzv_backend",
        f"Rendezvous backend ({'/'.join(LAUNCHER_RDZV_BACKENDS)})",
        "Rendezvous backend",
        "choice",
        section="machines",
        choices=RDZV_BACKENDS,
        when=_several_machines,
    ),
    _q(
        "same_network",
        "Are all machines on the same network" + _YN,
        "",
        "bool",
        section="machines",
        when=_several_machines,
        wizard=False,
    ),
    _q("num_processes", "How many processes in total (all machines)", "Processes (all machines)", "int"),
    _q(
        "gpu_ids",
        "Which GPUs (all, or ids like 0,1)",
        "GPU ids",
        "text",
        when=lambda a: a.get("compute") == "gpu",
        placeholder="all, or 0,1",
    ),
    _q(
        "mixed_precision",
        "Mixed precision ({choices})",
        "Mixed precision",
        "choice",
        choices=_mixed_precisions,
    ),
    _q(
        "gradient_accumulation_steps",
        "Gradient accumulation steps",
        "Gradient accumulation",
        "int",
        slider=(1, 64),
    ),
    _q(
        "use_deepspeed",
        "Train with DeepSpeed ZeRO" + _YN,
        "DeepSpeed ZeRO",
        "bool",
        section="deepspeed",
        when=lambda a: a.get("compute") != "xla" and deepspeed_installed(),
    ),
    _q(
        "deepspeed_config_file",
        "A DeepSpeed JSON config file (none: answer the questions instead)",
        "DeepSpeed JSON file",
        "text",
        section="deepspeed",
        default="none",
        when=lambda a: bool(a.get("use_deepspeed")),
        placeholder="empty: the settings below",
    ),
    _q(
        "zero_stage",
        "ZeRO stage ({choices})",
        "ZeRO stage",
        "choice",
        section="deepspeed",
        choices=(0, 1, 2, 3),
        default=2,
        when=_deepspeed_settings,
    ),
    _q(
        "offload_optimizer_device",
        "Offload the optimizer state to ({choices})",
        "Offload optimizer state",
        "choice",
        section="deepspeed",
        choices=("none", "cpu", "nvme"),
        default="none",
        when=_stage_at_least(1),
    ),
    _q(
        "offload_optimizer_nvme_path",
        "Folder on the NVMe drive for the optimizer state",
        "NVMe folder (optimizer)",
        "text",
        section="deepspeed",
        when=_nvme("optimizer", 1),
        placeholder="a folder on an NVMe drive",
    ),
    _q(
        "offload_param_device",
        "Offload the parameters to ({choices})",
        "Offload parameters",
        "choice",
        section="deepspeed",
        choices=("none", "cpu", "nvme"),
        default="none",
        when=_stage_at_least(_STAGE_3),
    ),
    _q(
        "offload_param_nvme_path",
        "Folder on the NVMe drive for the parameters",
        "NVMe folder (param)",
        "text",
        section="deepspeed",
        when=_nvme("param", _STAGE_3),
        placeholder="a folder on an NVMe drive",
    ),
    _q(
        "gradient_clipping",
        "Clip the gradient norm at (0: no clipping)",
        "Clip grad norm (0: off)",
        "float",
        section="deepspeed",
        default=1.0,
        when=_deepspeed_settings,
    ),
    _q(
        "zero3_save_16bit_model",
        "Gather the shards into one model file in save_model" + _YN,
        "save_model gathers the shards",
        "bool",
        section="deepspeed",
        default=True,
        when=_stage_at_least(_STAGE_3),
    ),
    _q(
        "zero3_init_flag",
        "Partition big models as they are built, inside zero3_init(accelerator)" + _YN,
        "Partition while building (zero3_init)",
        "bool",
        section="deepspeed",
        default=True,
        when=_stage_at_least(_STAGE_3),
    ),
    # Megatron-LM: only GPUs run it (docs/megatron.md); every answer is checked by MegatronLMPlugin
    _q(
        "use_megatron_lm",
        "Train with Megatron-LM (megatron-core)" + _YN,
        "Megatron-LM",
        "bool",
        section="megatron",
        when=lambda a: a.get("compute") == "gpu" and not a.get("use_deepspeed") and megatron_installed(),
    ),
    _q(
        "megatron_lm_tp_degree",
        "Megatron-LM tensor parallel degree",
        "Tensor-parallel degree",
        "int",
        section="megatron",
        default=1,
        when=_megatron,
    ),
    _q(
        "megatron_lm_sequence_parallelism",
        "Sequence parallelism" + _YN,
        "Sequence parallelism",
        "bool",
        section="megatron",
        default=False,
        when=lambda a: _megatron(a) and _int(a.get("megatron_lm_tp_degree")) > 1,
    ),
    _q(
        "megatron_lm_pp_degree",
        "Megatron-LM pipeline parallel degree",
        "Pipeline-parallel degree",
        "int",
        section="megatron",
        default=1,
        when=_megatron,
    ),
    _q(
        "megatron_lm_num_micro_batches",
        "Micro-batches per step (pipeline)",
        "Micro-batches per step",
        "int",
        section="megatron",
        default=1,
        when=lambda a: _megatron(a) and _int(a.get("megatron_lm_pp_degree")) > 1,
    ),
    _q(
        "megatron_lm_recompute_activations",
        "Selective activation recomputation" + _YN,
        "Recompute activations",
        "bool",
        section="megatron",
        default=False,
        when=_megatron,
    ),
    _q(
        "megatron_lm_use_distributed_optimizer",
        "Megatron's distributed optimizer" + _YN,
        "Distributed optimizer",
        "bool",
        section="megatron",
        default=False,
        when=_megatron,
    ),
    _q(
        "megatron_lm_gradient_clipping",
        "Gradient clipping by the global norm (0: off)",
        "Clip grad norm (0: off)",
        "float",
        section="megatron",
        default=1.0,
        when=_megatron,
    ),
    # FSDP2 with several processes, and with it the layout: tp × cp × replicas, FSDP over the rest
    _q(
        "use_fsdp",
        "Do you want to use FullyShardedDataParallel (FSDP2)" + _YN,
        "Shard with FSDP2",
        "bool",
        section="fsdp",
        when=_fsdp_offered,
    ),
    _q(
        "use_parallelism_config",
        "Lay the processes out as FSDP x tensor/context parallel (ParallelismConfig)" + _YN,
        "Parallel layout",
        "bool",
        section="layout",
        when=lambda a: a.get("compute") != "xla" and bool(a.get("use_fsdp") or a.get("saved_layout")),
    ),
    _q(
        "tp_size",
        "Tensor-parallel size (processes that split each layer)",
        "Tensor-parallel size",
        "int",
        section="layout",
        when=lambda a: bool(a.get("use_parallelism_config")),
    ),
    _q(
        "cp_size",
        "Context-parallel size (processes that split each sequence)",
        "Context-parallel size",
        "int",
        section="layout",
        default=1,
        when=lambda a: bool(a.get("use_parallelism_config")),
    ),
    _q(
        "dp_replicate_size",
        "Replicas (dp_replicate_size; 1 = FSDP over all the others)",
        "Replicas (dp_replicate)",
        "int",
        section="layout",
        default=1,
        when=lambda a: bool(a.get("use_parallelism_config")),
    ),
    _q(
        "start_method",
        "Start method for notebook launches ({choices})",
        "Notebook start method",
        "choice",
        choices=START_METHODS,
    ),
    # accel_nb does not compile a DeepSpeed or Megatron-LM engine
    _q(
        "dynamo_backend",
        "torch.compile backend ({choices})",
        "torch.compile backend",
        "choice",
        section="compile",
        choices=("no", "inductor", "aot_eager", "eager"),
        accepts=DYNAMO_BACKENDS,
        when=lambda a: not _engine(a),
    ),
    _q(
        "dynamo_use_regional_compilation",
        "Compile only the repeated blocks (regional)" + _YN,
        "",
        "bool",
        section="compile",
        when=lambda a: a.get("dynamo_backend", "no") != "no" and not _engine(a),
        wizard=False,
    ),
)
_BY_KEY = {q.key: q for q in QUESTIONS}


class Engine(NamedTuple):
    """A section whose switch trains with an engine that takes the whole model (and excludes the others)."""

    section: str  # the table's section: its switch and its settings
    switch: str  # the question that turns it on
    distributed_type: str  # the config's type with it on
    config_key: str  # the config's mapping of its settings (the section's other answers)

    def keys(self) -> tuple[str, ...]:
        """Its settings' keys (the section's questions but the switch), in the table's order."""
        return tuple(q.key for q in QUESTIONS if q.section == self.section and q.key != self.switch)


# in the table's order: an engine's switch is asked only while no engine above it is on
ENGINES = (
    Engine("deepspeed", "use_deepspeed", "DEEPSPEED", "deepspeed_config"),
    Engine("megatron", "use_megatron_lm", "MEGATRON_LM", "megatron_lm_config"),
)


def question(key: str) -> Question:
    """The question that answers ``key``."""
    return _BY_KEY[key]


def answers_of(cfg: Any, compute: str, **more: Any) -> dict[str, Any]:
    """The answers a launch config ``cfg`` stands for when computing on ``compute``, by question key
    (``more``: answers not in the config yet, e.g. a section's settings being asked)."""
    answers = {k: getattr(cfg, k) for k in _BY_KEY if hasattr(cfg, k)}
    kind = cfg.distributed_type
    answers.update(
        compute=compute,
        use_deepspeed=kind == "DEEPSPEED",
        use_megatron_lm=kind == "MEGATRON_LM",
        use_fsdp=kind == "FSDP",
        saved_layout=bool(cfg.extras.get("parallelism_config")),
    )
    answers.update(more)
    return answers
