"""Issue 33's "different meanings", side by side with accelerate: the same lines under both libraries.

Each test runs the same code with ``accel_nb`` and with the reference and asserts the same result.
"""

from __future__ import annotations

import importlib
import logging

import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, SequentialSampler

from tests.dist_helpers import run_ranks

pytest.importorskip("accelerate")

LIBRARIES = ("accel_nb", "accelerate")


# -- get_logger: the [RANK i] prefix comes from process(), stacklevel names the reference's frame -------
class _Records(logging.Handler):
    def __init__(self):
        super().__init__()
        self.seen = []

    def emit(self, record):
        self.seen.append((record.getMessage(), record.funcName, record.lineno))


class _WrappingAdapter(logging.LoggerAdapter):
    """A user's adapter around the library's adapter; stacklevel 2 names the code that logged."""

    def process(self, msg, kwargs):
        kwargs.setdefault("stacklevel", 2)
        return f"<wrapped> {msg}", kwargs


def _helper(logger, msg, level):
    logger.info(msg, stacklevel=level, main_process_only=False)


def _calls_helper(logger, msg, level):
    _helper(logger, msg, level)


def _warns_once(logger):
    logger.warning_once("once", main_process_only=False)


def _logged(library):
    state = importlib.import_module(library).PartialState(cpu=True)
    logger = importlib.import_module(f"{library}.logging").get_logger(f"meanings.{library}", log_level="INFO")
    records = _Records()
    logger.logger.addHandler(records)
    logger.logger.propagate = False
    logger.info("plain")
    logger.info("every rank", main_process_only=False)
    logger.info("in order", in_order=True)
    for level in (1, 2, 3):
        _calls_helper(logger, f"stacklevel {level}", level)
    _WrappingAdapter(logger, {}).info("through an adapter", main_process_only=False)
    _warns_once(logger)
    _warns_once(logger)
    processed = logger.process("msg", {})
    kept = logger.process("msg", {"stacklevel": 5})
    state.wait_for_everyone()
    logger.logger.removeHandler(records)
    return {"records": records.seen, "process": processed, "process_kept": kept}


@pytest.mark.multiproc
def test_get_logger_prefix_and_callers_match_the_reference():
    ours, ref = (run_ranks(_logged, world_size=2, args=(library,)) for library in LIBRARIES)
    for rank in range(2):
        assert (
            ours[rank]["process"]
            == ref[rank]["process"]
            == (f"[RANK {rank}] msg", {"extra": {}, "stacklevel": 2})
        )
        assert ours[rank]["process_kept"] == ref[rank]["process_kept"]
        # warning_once: the reference names its own logging module's line; accel_nb names the caller
        # (docs/migration.md, deliberate differences)
        ref_once = [r for r in ref[rank]["records"] if r[0].endswith("once")]
        ours_once = [r for r in ours[rank]["records"] if r[0].endswith("once")]
        assert len(ref_once) == len(ours_once) == 1
        assert ref_once[0][1] == "warning_once"
        assert ours_once[0][1] == "_warns_once"
        # stacklevel=1 names the library's own log(): same function, each library's own line
        rest = [r if r[1] != "log" else r[:2] for r in ours[rank]["records"] if not r[0].endswith("once")]
        assert rest == [
            r if r[1] != "log" else r[:2] for r in ref[rank]["records"] if not r[0].endswith("once")
        ]
    names = [(message, func) for message, func, _ in ours[1]["records"]]
    assert names == [
        ("[RANK 1] every rank", "_logged"),
        ("[RANK 1] in order", "_logged"),
        ("[RANK 1] stacklevel 1", "log"),  # stacklevel=1 is the adapter's own log, as in the reference
        ("[RANK 1] stacklevel 2", "_helper"),
        ("[RANK 1] stacklevel 3", "_calls_helper"),
        ("[RANK 1] <wrapped> through an adapter", "_logged"),
        ("[RANK 1] once", "_warns_once"),
    ]


# -- ACCELERATE_TORCH_DEVICE (and ACCEL_NB_TORCH_DEVICE) choose the device ------------------------------
def _state_device(library, cpu=False):
    state = importlib.import_module(library).PartialState(cpu=cpu)
    return str(state.device), state.num_processes, str(state.distributed_type).split(".")[-1]


@pytest.mark.multiproc
@pytest.mark.parametrize("world_size, cpu", [(1, False), (2, True)])
def test_accelerate_torch_device_chooses_the_device_as_in_the_reference(world_size, cpu):
    # cpu=True on 2 processes: the reference forms a CPU process group only when asked (docs/migration.md)
    env = {"ACCELERATE_TORCH_DEVICE": "meta"}
    ours, ref = (
        run_ranks(_state_device, world_size=world_size, args=(library, cpu), env=env) for library in LIBRARIES
    )
    assert ours == ref
    assert [device for device, _, _ in ours] == ["meta"] * world_size


@pytest.mark.multiproc
def test_accel_nb_torch_device_is_read_first():
    env = {"ACCEL_NB_TORCH_DEVICE": "meta", "ACCELERATE_TORCH_DEVICE": "cpu"}
    assert run_ranks(_state_device, world_size=1, args=("accel_nb",), env=env)[0][0] == "meta"


def _state_error(value):
    import os

    os.environ["ACCEL_NB_TORCH_DEVICE"] = value
    try:
        importlib.import_module("accel_nb").PartialState()
    except ValueError as exc:
        return str(exc)
    return None


@pytest.mark.multiproc
def test_a_torch_device_that_cannot_be_used_is_named_with_the_fix():
    message = run_ranks(_state_error, world_size=1, args=("nodevice:3",))[0]
    assert "ACCEL_NB_TORCH_DEVICE='nodevice:3' is not a torch device" in message and "unset it" in message
    if not torch.cuda.is_available():
        message = run_ranks(_state_error, world_size=1, args=("cuda:1",))[0]
        assert "names a CUDA device but CUDA is not available" in message


# -- TorchDynamoPlugin() reads ACCELERATE_DYNAMO_* at construction ----------------------------------
_PLUGIN_FIELDS = ("backend", "mode", "fullgraph", "dynamic", "use_regional_compilation")


def _plugin_fields(plugin):
    values = {name: getattr(plugin, name) for name in _PLUGIN_FIELDS}
    values["backend"] = (type(values["backend"]).__name__, values["backend"].value)
    return values


@pytest.mark.parametrize(
    "env, kwargs",
    [
        ({}, {}),
        (
            {
                "ACCELERATE_DYNAMO_BACKEND": "aot_eager",
                "ACCELERATE_DYNAMO_MODE": "default",
                "ACCELERATE_DYNAMO_USE_FULLGRAPH": "yes",
                "ACCELERATE_DYNAMO_USE_DYNAMIC": "false",
                "ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION": "1",
            },
            {},
        ),
        (
            {"ACCELERATE_DYNAMO_BACKEND": "INDUCTOR", "ACCELERATE_DYNAMO_USE_DYNAMIC": "True"},
            {"mode": "max-autotune"},
        ),
        ({"ACCELERATE_DYNAMO_BACKEND": "inductor"}, {"backend": "eager", "fullgraph": True}),
    ],
)
def test_torch_dynamo_plugin_reads_the_environment_as_the_reference(monkeypatch, env, kwargs):
    from accel_nb.env_names import DYNAMO_ENV

    for names in DYNAMO_ENV.values():
        for name in names:
            monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    ours = importlib.import_module("accel_nb.utils").TorchDynamoPlugin(**kwargs)
    ref = importlib.import_module("accelerate.utils").TorchDynamoPlugin(**kwargs)
    assert _plugin_fields(ours) == _plugin_fields(ref)
    options = ours.to_compile_options()
    if ours.backend.value == "NO":
        assert options is None
    else:
        assert options.backend == ref.backend.value.lower()
        assert options.fullgraph == ref.fullgraph and options.regional == ref.use_regional_compilation


@pytest.mark.parametrize(
    "env, kwargs",
    [
        ({"ACCELERATE_DYNAMO_BACKEND": "aot_ts_nvfuser", "ACCELERATE_DYNAMO_MODE": "reduce-overhead"}, {}),
        ({"ACCELERATE_DYNAMO_USE_FULLGRAPH": "true", "ACCELERATE_DYNAMO_USE_DYNAMIC": "false"}, {}),
        ({}, {"backend": "inductor", "use_regional_compilation": True}),
        ({"ACCEL_NB_DYNAMO_BACKEND": "eager"}, {"mode": "max-autotune"}),
    ],
)
def test_torch_dynamo_plugin_to_kwargs_and_to_dict_as_the_reference(monkeypatch, env, kwargs):
    """Issue 38, item 14: to_kwargs() counts what the environment filled in as set (the defaults it
    compares with are read with no *_DYNAMO_* variable) and leaves use_regional_compilation out; to_dict()
    gives the backend as its lower-case name. accel_nb's own ACCEL_NB_DYNAMO_* spelling is read first."""
    from accel_nb.env_names import DYNAMO_ENV

    for names in DYNAMO_ENV.values():
        for name in names:
            monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    ours = importlib.import_module("accel_nb.utils").TorchDynamoPlugin(**kwargs)
    ref_env = {k.replace("ACCEL_NB_", "ACCELERATE_"): v for k, v in env.items()}
    for name, value in ref_env.items():
        monkeypatch.setenv(name, value)
    ref = importlib.import_module("accelerate.utils").TorchDynamoPlugin(**kwargs)
    assert ours.to_kwargs() == ref.to_kwargs()
    assert ours.to_dict() == ref.to_dict()


# -- a custom batch sampler nests as in the reference ------------------------------------------------
class _EvenFirstBatches(BatchSampler):
    """A user's batch sampler: the even indices first, then the odd ones."""

    def __iter__(self):
        order = [i for i in self.sampler if i % 2 == 0] + [i for i in self.sampler if i % 2 == 1]
        for start in range(0, len(order), self.batch_size):
            yield order[start : start + self.batch_size]


def _nesting(library, cpu):
    accelerator = importlib.import_module(library).Accelerator(cpu=cpu)
    sampler = _EvenFirstBatches(SequentialSampler(range(12)), batch_size=2, drop_last=False)
    loader = accelerator.prepare(DataLoader(torch.arange(12), batch_sampler=sampler))
    chain, level = [], loader.batch_sampler
    while level is not None:
        chain.append(type(level).__name__)
        level = None if level is sampler else getattr(level, "batch_sampler", None)
    return {
        "loader": type(loader).__name__,
        "chain": chain,
        "batches": [[b.tolist() for b in loader] for _ in range(2)],
    }


@pytest.mark.multiproc
@pytest.mark.parametrize("world_size, cpu", [(1, False), (2, True)])
def test_a_custom_batch_sampler_nests_as_in_the_reference(world_size, cpu):
    ours, ref = (run_ranks(_nesting, world_size=world_size, args=(library, cpu)) for library in LIBRARIES)
    assert ours == ref
    expected = ["_EvenFirstBatches"] if world_size == 1 else ["BatchSamplerShard", "_EvenFirstBatches"]
    assert ours[0]["chain"] == expected
    # the batches unchanged: the user's order, dealt out batch by batch to the ranks
    assert [rank["batches"][0][0] for rank in ours] == [[0, 2], [4, 6]][:world_size]


# -- prepared objects carry _is_accelerate_prepared --------------------------------------------------
def _prepared_marks(library, cpu):
    accelerator = importlib.import_module(library).Accelerator(cpu=cpu)
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)
    loader = DataLoader(torch.arange(8.0), batch_size=2)
    given = {"model": model, "optimizer": optimizer, "scheduler": scheduler, "loader": loader}
    prepared = dict(zip(given, accelerator.prepare(model, optimizer, scheduler, loader)))
    marks = {f"prepared {k}": getattr(v, "_is_accelerate_prepared", None) for k, v in prepared.items()}
    marks.update({f"given {k}": getattr(v, "_is_accelerate_prepared", None) for k, v in given.items()})
    # marked by hand: prepare returns the object as it is, in both libraries
    other = torch.nn.Linear(2, 2)
    other._is_accelerate_prepared = True
    marks["marked by hand is returned"] = accelerator.prepare(other) is other
    return marks


@pytest.mark.multiproc
@pytest.mark.parametrize("world_size, cpu", [(1, False), (2, True)])
def test_prepared_objects_carry_is_accelerate_prepared(world_size, cpu):
    ours, ref = (
        run_ranks(_prepared_marks, world_size=world_size, args=(library, cpu)) for library in LIBRARIES
    )
    assert ours == ref
    assert all(ours[0][f"prepared {k}"] is True for k in ("model", "optimizer", "scheduler", "loader"))


# -- save_state / load_state with a different folder per rank ----------------------------------------
def _folder_per_rank(library, base):
    import os
    import warnings

    accelerator = importlib.import_module(library).Accelerator(cpu=True)
    accelerator.prepare(torch.nn.Linear(2, 2))  # tracked by the accelerator: part of the checkpoint
    rank = accelerator.process_index
    mine = os.path.join(base, library, f"rank{rank}")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        accelerator.save_state(mine)
    accelerator.wait_for_everyone()
    out = {"warned": [str(w.message) for w in caught if "save_state" in str(w.message)]}
    try:
        accelerator.load_state(mine)
        out["load"] = "ok"
    except Exception as exc:  # noqa: BLE001 - compared below
        out["load"] = f"{type(exc).__name__}: {exc}"
    if library == "accel_nb":  # the one folder, read on every rank, resumes
        accelerator.load_state(os.path.join(base, library, "rank0"))
        out["main folder"] = "ok"
    return out


@pytest.mark.multiproc
def test_a_folder_per_rank_fails_on_rank_1_in_both_and_accel_nb_names_the_fix(tmp_path):
    ours, ref = (
        run_ranks(_folder_per_rank, world_size=2, args=(library, str(tmp_path))) for library in LIBRARIES
    )
    # the reference: rank 0 loads, rank 1 cannot (its folder holds only its RNG file)
    assert ref[0]["load"] == "ok" and ref[1]["load"].startswith("FileNotFoundError")
    # accel_nb (docs/migration.md, deliberate differences): one folder, the main process's; rank 1 is
    # warned at save, and load_state refuses on every rank before reading anything
    assert ours[0]["warned"] == [] and "the checkpoint is one folder" in ours[1]["warned"][0]
    for rank in ours:
        assert (
            rank["load"].startswith("CheckpointError")
            and "pass that same folder on every rank" in rank["load"]
        )
        assert rank["main folder"] == "ok"
