"""The public surface accepts nothing it ignores: unknown keywords fail, formerly inert options act.

Each public constructor of the core and config gets an unknown keyword and must raise a clear
TypeError; each option that used to be accepted and ignored shows its effect (or its warning).
"""

from __future__ import annotations

import datetime
import os
import subprocess
import sys
import warnings

import pytest
import torch

from accel_nb import Accelerator, DataLoaderConfiguration, LaunchConfig, ProjectConfiguration
from accel_nb.state import AcceleratorState, PartialState
from tests.dist_helpers import run_ranks

pytestmark = pytest.mark.usefixtures("fresh_state")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize(
    "build, name",
    [
        (lambda: PartialState(nonsense=1), "nonsense"),
        (lambda: PartialState(init_method="tcp://x:1"), "init_method"),
        (lambda: AcceleratorState(nonsense=1), "nonsense"),
        (lambda: Accelerator(nonsense=1), "nonsense"),
        (lambda: LaunchConfig(nonsense=1), "nonsense"),
        (lambda: DataLoaderConfiguration(nonsense=1), "nonsense"),
        (lambda: ProjectConfiguration(nonsense=1), "nonsense"),
    ],
    ids=[
        "PartialState",
        "PartialState-init_method",
        "AcceleratorState",
        "Accelerator",
        "LaunchConfig",
        "DataLoaderConfiguration",
        "ProjectConfiguration",
    ],
)
def test_an_unknown_keyword_is_a_type_error_naming_it(build, name):
    with pytest.raises(TypeError, match=f"unexpected keyword argument '{name}'"):
        build()


def test_partial_state_lists_what_it_accepts_and_checks_backend_and_timeout():
    with pytest.raises(TypeError, match="it accepts cpu, backend, timeout"):
        PartialState(nonsense=1)
    with pytest.raises(ValueError, match=r"backend='carrier-pigeon'\) is not a process-group backend"):
        PartialState(backend="carrier-pigeon")
    with pytest.raises(ValueError, match="backend='nccl' (needs CUDA GPUs|is not built into this torch)"):
        PartialState(cpu=True, backend="nccl")
    with pytest.raises(ValueError, match="positive"):
        PartialState(timeout=0)
    with pytest.raises(TypeError, match="seconds"):
        PartialState(timeout="5")


def _group_with_short_timeout():
    import time

    import torch.distributed as dist

    state = PartialState(backend="gloo", timeout=datetime.timedelta(seconds=2))
    assert dist.get_backend() == "gloo" and state.backend == "gloo" and state.collective_timeout == 2
    if state.process_index == 0:
        try:
            dist.all_reduce(torch.ones(1))  # rank 1 never joins this one
        except RuntimeError as exc:
            return f"timed out: {type(exc).__name__}"
        return "completed"
    time.sleep(12)  # stays alive (and silent) past rank 0's timeout
    return "slept"


@pytest.mark.multiproc
def test_timeout_bounds_a_collective_that_a_peer_never_joins():
    # without timeout= this all_reduce would wait 30 minutes (the default collective timeout)
    assert run_ranks(_group_with_short_timeout, 2, timeout=90) == ["timed out: RuntimeError", "slept"]


def _draws(rng_types):
    from torch.utils.data import DataLoader

    torch.manual_seed(100 + PartialState(cpu=True).process_index)  # every rank starts differently
    acc = Accelerator(
        cpu=True, rng_types=rng_types, dataloader_config=DataLoaderConfiguration(use_seedable_sampler=False)
    )
    loader = acc.prepare(DataLoader(list(range(16)), batch_size=2, shuffle=True))
    seen = [int(x) for batch in loader for x in batch]
    return seen, torch.rand(3).tolist()


@pytest.mark.multiproc
def test_rng_types_make_shuffles_and_draws_agree_across_ranks():
    (seen0, rand0), (seen1, rand1) = run_ranks(_draws, 2, args=(["torch", "generator"],))
    assert sorted(seen0 + seen1) == list(range(16))  # one shuffle, split between the ranks
    assert rand0 == rand1  # torch's generator was synchronised from rank 0
    (seen0, rand0), (seen1, rand1) = run_ranks(_draws, 2, args=(None,))
    assert sorted(seen0 + seen1) == list(range(16))  # the shuffle's generator is always copied from rank 0
    assert rand0 != rand1  # but torch's own generator is not


def test_rng_types_are_checked():
    with pytest.raises(ValueError, match="'xla' needs the XLA"):
        Accelerator(cpu=True, rng_types=["xla"])
    with pytest.raises(ValueError, match="'cuda' synchronises the CUDA generator"):
        Accelerator(cpu=True, rng_types=["cuda"])
    with pytest.raises(ValueError, match="'dice' is not one of"):
        Accelerator(cpu=True, rng_types=["dice"])


def test_a_dynamo_backend_in_the_config_reaches_the_ranks_environment():
    # issue 20: the config's dynamo_config is applied now (tests/test_compile.py runs it on ranks)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cfg = LaunchConfig(dynamo_backend="inductor").validate()
    env = cfg.to_env()
    assert env["ACCEL_NB_DYNAMO_BACKEND"] == "inductor" and env["ACCELERATE_DYNAMO_BACKEND"] == "INDUCTOR"
    assert cfg.to_dict()["dynamo_config"]["dynamo_backend"] == "INDUCTOR"  # the user's file is kept


def test_the_questionnaire_asks_for_a_compile_backend_now_that_it_works():
    import inspect

    from accel_nb.commands import config

    assert "dynamo_backend" in inspect.getsource(config.questionnaire)


def test_monitor_interval_reaches_torchrun():
    from torch.distributed.run import parse_args

    from accel_nb.commands.launch import torchrun_arguments
    from accel_nb.commands.main import build_parser

    ns = build_parser().parse_args(["launch", "--monitor_interval", "0.5", "x.py"])
    args = torchrun_arguments(
        LaunchConfig().validate(), 1, "x.py", [], "/tmp/logs", monitor_interval=ns.monitor_interval
    )
    assert parse_args(args).monitor_interval == 0.5
    with pytest.raises(SystemExit):
        build_parser().parse_args(["launch", "--monitor_interval", "0", "x.py"])


@pytest.mark.multiproc
def test_log_line_prefix_template_prefixes_each_ranks_lines(tmp_path):
    script = tmp_path / "hello.py"
    script.write_text("import os\nprint('hello from', os.environ['RANK'], flush=True)\n")
    env = {**os.environ, "ACCEL_NB_CONFIG_FILE": str(tmp_path / "none.yaml"), "PYTHONPATH": ROOT}
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "accel_nb.commands",
            "launch",
            "--cpu",
            "--num_processes",
            "2",
            "--log_line_prefix_template",
            "[custom${rank}]:",
            str(script),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    assert "[custom0]:hello from 0" in out.stdout and "[custom1]:hello from 1" in out.stdout


def test_kwargs_handlers_are_applied_or_refused_never_ignored():
    from accel_nb.kwargs_handlers import AutocastKwargs, InitProcessGroupKwargs

    acc = Accelerator(
        cpu=True, kwargs_handlers=[InitProcessGroupKwargs(timeout=datetime.timedelta(seconds=42))]
    )
    assert acc.state.collective_timeout == 42  # what the process group would be given
    with pytest.raises(RuntimeError, match="timeout=7 s must be given to the first PartialState"):
        PartialState(timeout=7)
    acc = Accelerator(cpu=True, kwargs_handlers=[AutocastKwargs(enabled=False)])
    assert acc.precision.autocast_kwargs == {"enabled": False}  # applied to every autocast of the run
    with pytest.raises(ValueError, match=r"InitProcessGroupKwargs\(init_method=...\) is not supported"):
        Accelerator(cpu=True, kwargs_handlers=[InitProcessGroupKwargs(init_method="tcp://10.0.0.1:1")])
