"""notebook_launcher / debug_launcher driven from this test process: real forked/spawned ranks, gloo."""

from __future__ import annotations

import os
import signal
import socket
import threading
import time

import psutil
import pytest

from accel_nb import LaunchError, PartialState, debug_launcher, notebook_launcher
from accel_nb.events import Dropped, Failure, FailureKind, Log, Phase, Progress, Result, emit
from accel_nb.launch.errors import LaunchSetupError, PayloadError, RankFailure
from accel_nb.launch.options import LaunchOptions
from accel_nb.launch.parent.reporting import ListReporter, TextReporter
from accel_nb.launch.plan import make_plan
from tests.cuda_pretend import pretend_cuda_initialised
from tests.process_helpers import live_descendants

pytestmark = pytest.mark.multiproc


def _no_children() -> list:
    """Live descendants of this test process, except the warm spawn server."""
    return live_descendants(psutil.Process())


def _allreduce_rank() -> list[int]:
    import torch
    import torch.distributed as dist

    state = PartialState()
    t = torch.tensor([state.process_index + 1.0])
    dist.all_reduce(t)
    return [state.process_index, state.num_processes, int(t.item())]


def test_results_come_back_in_rank_order_from_a_real_gloo_group():
    rep = ListReporter()
    assert debug_launcher(_allreduce_rank, reporter=rep) == [[0, 2, 3], [1, 2, 3]]
    assert rep.started[0] == 2 and rep.finished == (True, None)
    assert {e.rank for e in rep.of_type(Result)} == {0, 1}
    assert not _no_children()


def _env_of_rank(extra):
    keys = [
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
        "ACCEL_NB_MIXED_PRECISION",
        "ACCELERATE_MIXED_PRECISION",
        "ACCEL_NB_FORKED",
        "GROUP_RANK",
    ]
    return {k: os.environ.get(k) for k in keys} | {"extra": extra}


def test_every_rank_gets_the_torchrun_environment_and_the_parent_env_is_untouched():
    before = dict(os.environ)
    out = notebook_launcher(
        _env_of_rank,
        args=("x",),
        num_processes=2,
        mixed_precision="fp16",
        cpu=True,
        reporter=ListReporter(),
        use_port=None,
    )
    assert [e["RANK"] for e in out] == ["0", "1"]
    assert {e["WORLD_SIZE"] for e in out} == {"2"} and {e["LOCAL_WORLD_SIZE"] for e in out} == {"2"}
    assert [e["LOCAL_RANK"] for e in out] == ["0", "1"]
    assert out[0]["MASTER_PORT"] == out[1]["MASTER_PORT"] and out[0]["MASTER_ADDR"] == "127.0.0.1"
    assert out[0]["ACCEL_NB_MIXED_PRECISION"] == "fp16" and out[0]["ACCELERATE_MIXED_PRECISION"] == "fp16"
    assert out[0]["ACCEL_NB_FORKED"] == "1" and out[0]["GROUP_RANK"] == "0"
    assert dict(os.environ) == before


def _prints_at_fd_level():
    import subprocess
    import sys

    rank = PartialState().process_index
    print(f"python print {rank}")
    os.write(1, f"raw fd write {rank}\n".encode())
    os.write(2, f"raw stderr {rank}\n".encode())
    subprocess.run(["echo", f"child process {rank}"], check=True)
    sys.stdout.write("no newline at the end")
    return rank


def test_output_is_captured_at_fd_level_labelled_by_rank_and_logged_to_files():
    rep = ListReporter()
    debug_launcher(_prints_at_fd_level, reporter=rep, keep_logs=True)
    for rank in (0, 1):
        out = rep.output(rank=rank)
        for text in (
            f"python print {rank}\n",
            f"raw fd write {rank}\n",
            f"raw stderr {rank}\n",
            f"child process {rank}\n",
            "no newline at the end\n",
        ):
            assert text in out, (text, out)
        assert f"raw stderr {rank}" in rep.output(rank=rank, stream="stderr")
    for e in rep.of_type(Log):  # whole lines only
        assert e.text.endswith("\n")
    log_dir = rep.started[1]["log_dir"]
    assert "child process 1" in open(os.path.join(log_dir, "rank1.log")).read()


def test_text_reporter_prefixes_lines_and_shows_one_rank_when_asked(capsys):
    debug_launcher(_prints_at_fd_level, show_ranks=1)
    out = capsys.readouterr()
    assert "[rank 1] python print 1" in out.out and "[rank 1] raw stderr 1" in out.err
    assert "[rank 0]" not in out.out + out.err
    assert out.out.startswith("Launching 2 CPU processes (gloo)")


def test_text_reporter_throttles_progress_and_formats_it():
    import io

    buf = io.StringIO()
    rep = TextReporter(stream=buf, progress_interval=3600)
    rep.start(1, {})
    for n in range(1, 101):
        rep.handle(Progress(rank=0, name="train", n=n, total=100, metrics={"loss": 0.31}, rate=2.1))
    lines = buf.getvalue().splitlines()
    assert len(lines) == 2 and all(line.startswith("[rank 0] train: ") for line in lines)
    assert "1/100 [2.1 it/s, ETA 0:47] loss=0.31" in lines[0] and "100/100 [2.1 it/s] loss=0.31" in lines[1]


def _floods():
    for i in range(20000):
        print("line", i)
    return PartialState().process_index


def test_an_output_flood_is_rate_limited_with_a_note_and_kept_whole_in_the_log():
    rep = ListReporter()
    assert debug_launcher(_floods, num_processes=1, reporter=rep, keep_logs=True) == [0]
    out = rep.output(rank=0)
    dropped = rep.of_type(Dropped)  # a running count, at most about once a second: not a note per burst
    assert 1 <= len(dropped) <= 10 and dropped[-1].count == 20000 - out.count("line ")
    assert out.count("\nline ") < 20000
    with open(os.path.join(rep.started[1]["log_dir"], "rank0.log")) as f:
        assert f.read().count("line ") == 20000


def _fails_on_rank_1():
    if PartialState().process_index == 1:
        raise ValueError("boom on purpose")
    time.sleep(60)


def test_a_raising_rank_stops_the_others_and_raises_launch_error_with_its_traceback():
    rep = ListReporter()
    with pytest.raises(LaunchError) as info:
        debug_launcher(_fails_on_rank_1, reporter=rep)
    err = info.value
    assert err.stopped == [0]  # rank 0 (sleeping 60 s) was stopped, not waited for
    assert [f.rank for f in err.failures] == [1]
    f = err.failures[0]
    assert (
        isinstance(f, RankFailure)
        and f.first
        and f.exc_type == "ValueError"
        and f.message == "boom on purpose"
    )
    assert "_fails_on_rank_1" in f.traceback and "raise ValueError" in f.traceback
    assert isinstance(f.exception, ValueError)
    text = str(err)
    assert (
        "rank 1 (first to fail) failed: ValueError: boom on purpose" in text and "rank 0 was stopped" in text
    )
    assert "accel_nb/launch" not in f.traceback  # only the user's frames
    assert rep.finished[0] is False and rep.of_type(Failure)
    assert not _no_children()


def _exits_hard():
    if PartialState().process_index == 1:
        os._exit(3)
    time.sleep(60)


def _killed():
    if PartialState().process_index == 0:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(60)


def _segfaults():
    import ctypes

    if PartialState().process_index == 0:
        ctypes.string_at(0)
    time.sleep(60)


def test_deaths_without_a_python_exception_are_reported_with_exit_code_or_signal():
    with pytest.raises(LaunchError) as info:
        debug_launcher(_exits_hard)
    f = info.value.failures[0]
    assert f.rank == 1 and f.exit_code == 3 and f.signal is None
    assert "exited with code 3" in str(info.value)

    with pytest.raises(LaunchError) as info:
        debug_launcher(_killed)
    f = info.value.failures[0]
    assert f.rank == 0 and f.signal == signal.SIGKILL and "out of memory" in str(info.value)

    with pytest.raises(LaunchError) as info:
        debug_launcher(_segfaults)
    f = info.value.failures[0]
    assert f.rank == 0 and f.signal == signal.SIGSEGV and "native code" in str(info.value)
    assert "_segfaults" in f.traceback  # faulthandler's Python stack of the crash
    assert not _no_children()


def _hangs():
    PartialState()
    print("about to hang", flush=True)
    time.sleep(120)


def test_hang_watchdog_shows_each_rank_stack_and_stops_them():
    rep = ListReporter()
    with pytest.raises(LaunchError) as info:
        debug_launcher(_hangs, timeout=1.5, reporter=rep)
    err = info.value
    assert "hung" in str(err) and {f.rank for f in err.failures} == {0, 1}
    for f in err.failures:
        assert f.kind is FailureKind.HANG and f.exc_type is None and "_hangs" in f.traceback
    stacks = [e for e in rep.events if type(e).__name__ == "Stacks"]
    assert {s.rank for s in stacks} == {0, 1} and all("in _hangs" in s.text for s in stacks)
    assert not _no_children()


def test_fork_needs_no_pickling_of_a_lock_or_an_open_file(tmp_path):
    lock = threading.Lock()
    log = open(tmp_path / "log.txt", "w")  # noqa: SIM115 - an open file is the point of the test

    def uses_lock_and_file():
        with lock:
            log.write(f"rank {PartialState().process_index}\n")
            log.flush()
        return PartialState().process_index

    try:
        assert debug_launcher(uses_lock_and_file, start_method="fork", reporter=ListReporter()) == [0, 1]
        assert debug_launcher(uses_lock_and_file, reporter=ListReporter()) == [0, 1]  # auto chose fork
    finally:
        log.close()
    assert sorted((tmp_path / "log.txt").read_text().splitlines()) == ["rank 0", "rank 0", "rank 1", "rank 1"]


def test_unpicklable_function_or_argument_is_named_before_any_spawned_process_starts():
    lock = threading.Lock()
    gen = (i for i in range(3))

    def uses_lock():
        with lock:
            return 1

    before = len(psutil.Process().children())
    with pytest.raises(PayloadError, match="'lock' captured by the function") as info:
        debug_launcher(uses_lock, start_method="spawn")
    assert "_thread.lock" in str(info.value)
    with pytest.raises(PayloadError, match=r"args\[1\]\['data'\]\[0\]"):
        debug_launcher(lambda a, b: a, args=(1, {"data": [gen]}), start_method="spawn")
    assert len(psutil.Process().children()) == before


def test_a_busy_port_is_a_clear_error_before_starting():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        with pytest.raises(LaunchSetupError, match=f"port {port} .* already in use"):
            debug_launcher(_allreduce_rank, use_port=port)


def test_bad_options_are_one_clear_error_before_anything_starts(monkeypatch):
    before = len(psutil.Process().children())
    with pytest.raises(LaunchSetupError, match="mixed_precision='fp4'"):
        debug_launcher(_allreduce_rank, mixed_precision="fp4")
    with pytest.raises(LaunchSetupError, match="start_method='thread'"):
        debug_launcher(_allreduce_rank, start_method="thread")
    with pytest.raises(ValueError, match="progress='fancy' is not a display mode"):
        debug_launcher(_allreduce_rank, progress="fancy")
    monkeypatch.setenv("ACCEL_NB_PROGRESS", "fancy")
    with pytest.raises(ValueError, match="environment variable ACCEL_NB_PROGRESS"):
        debug_launcher(_allreduce_rank)
    assert len(psutil.Process().children()) == before


def test_plan_without_gpus_uses_one_cpu_process_and_says_so(monkeypatch):
    from accel_nb import hardware

    monkeypatch.setattr(hardware, "gpu_info", lambda: [])
    plan = make_plan(LaunchOptions())
    assert plan.num_processes == 1 and not plan.use_gpu
    assert plan.headline().startswith("Launching 1 CPU process (gloo)")
    pretend_cuda_initialised(monkeypatch)
    plan = make_plan(LaunchOptions(num_processes=2))
    assert plan.start_method == "spawn" and "CUDA was initialised" in plan.spawn_reason
    with pytest.raises(LaunchSetupError, match="start_method='fork' is unsafe"):
        make_plan(LaunchOptions(num_processes=2, start_method="fork"))


def _returns_tensors():
    import torch

    rank = PartialState().process_index
    model = torch.nn.Linear(2, 1)
    loss = (model(torch.ones(1, 2)) * 0).sum() + rank
    return {"loss": loss, "model": model, "pair": (torch.arange(2), rank)}


def test_spawn_returns_tensors_and_modules_and_reports_output():
    rep = ListReporter()
    out = debug_launcher(_returns_tensors, start_method="spawn", reporter=rep)
    assert [int(o["loss"].item()) for o in out] == [0, 1]
    assert out[1]["model"].weight.shape == (1, 2) and out[1]["pair"][1] == 1
    assert rep.started[1]["start_method"] == "spawn"
    assert any(isinstance(e, Phase) and e.phase == "running" for e in rep.events)


def test_spawned_ranks_exit_codes_come_back_and_the_server_can_be_stopped():
    from accel_nb.launch import zygote

    with pytest.raises(LaunchError) as info:
        debug_launcher(_exits_hard, start_method="spawn")
    f = info.value.failures[0]
    assert f.rank == 1 and f.exit_code == 3
    assert not _no_children()
    zygote.shutdown()
    assert psutil.Process().children(recursive=True) == []


def test_spawn_without_the_server_starts_fresh_interpreters(monkeypatch):
    from accel_nb.launch import zygote

    zygote.shutdown()
    monkeypatch.setenv(zygote.ENV_SWITCH, "0")
    assert debug_launcher(_trivial, start_method="spawn", reporter=ListReporter()) == [0, 1]
    assert zygote._server is None
    assert psutil.Process().children(recursive=True) == []


def _emits_progress():
    for i in range(3):
        emit(Progress(rank=PartialState().process_index, name="train", n=i + 1, total=3))
    return True


def test_events_emitted_by_the_function_reach_the_reporter():
    rep = ListReporter()
    debug_launcher(_emits_progress, reporter=rep)
    got = [(e.rank, e.n) for e in rep.of_type(Progress)]
    assert sorted(got) == [(0, 1), (0, 2), (0, 3), (1, 1), (1, 2), (1, 3)]


def _trivial():
    return PartialState().process_index


@pytest.mark.slow
def test_fifty_launches_leak_no_processes_no_fds_and_no_ports():
    proc = psutil.Process()
    debug_launcher(_trivial, reporter=ListReporter())  # warm up lazily opened files
    fds = proc.num_fds()
    threads = proc.num_threads()
    for _ in range(50):  # fork launches
        assert debug_launcher(_trivial, reporter=ListReporter()) == [0, 1]
    assert proc.num_fds() <= fds
    assert proc.num_threads() <= threads
    assert not _no_children()
    # a fixed port is free again at once
    port = make_plan(LaunchOptions(num_processes=2, cpu=True)).master_port
    for _ in range(3):
        assert debug_launcher(_trivial, reporter=ListReporter(), use_port=port) == [0, 1]


def _first_of(batch):
    return int(batch[0].item())


def test_large_tensor_arguments_are_warned_about_with_their_size(monkeypatch, capsys):
    import torch

    monkeypatch.setenv("ACCEL_NB_LARGE_ARGS_WARN_MB", "1")
    big = torch.zeros(1024 * 1024)  # 4 MiB
    assert debug_launcher(_first_of, args=(big,), reporter=ListReporter()) == [0, 0]
    assert "of tensors" not in capsys.readouterr().out  # fork: the ranks share the parent's pages
    assert debug_launcher(_first_of, args=(big,), reporter=ListReporter(), start_method="spawn") == [0, 0]
    out = capsys.readouterr().out
    assert (
        "the arguments carry 4.0 MiB of tensors; each of the 2 ranks gets its own copy (8.0 MiB in all)"
        in out
    )


def test_bf16_on_a_gpu_without_bf16_is_one_clear_error(monkeypatch):
    from accel_nb import hardware

    t4 = [hardware.GPUInfo(i, "Tesla T4", 16 << 30, (7, 5), bf16=False) for i in range(2)]
    monkeypatch.setattr(hardware, "gpu_info", lambda: t4)
    with pytest.raises(
        LaunchSetupError,
        match=r"mixed_precision='bf16' cannot run here: GPU 0 \(Tesla T4, compute capability 7.5\) does not support",
    ):
        make_plan(LaunchOptions(mixed_precision="bf16"))
    plan = make_plan(LaunchOptions(mixed_precision="fp16"))
    assert plan.num_processes == 2 and plan.use_gpu and plan.backend == "nccl"
    assert plan.headline().startswith("Launching 2 GPU processes (nccl)")


def _matmul_threads():
    import torch

    a = torch.randn(300, 300)
    for _ in range(3):
        a @ a
    return torch.get_num_threads()


def test_fork_after_the_notebook_used_an_openmp_pool_does_not_hang(capsys):
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        a = torch.randn(300, 300)
        a @ a  # the parent's OpenMP pool now exists; it does not survive a fork
        assert debug_launcher(_matmul_threads, timeout=60, reporter=ListReporter()) == [1, 1]
        assert debug_launcher(_matmul_threads, num_processes=1, timeout=60, reporter=ListReporter()) == [1]
        assert "uses 1 torch thread" in capsys.readouterr().out
    finally:
        torch.set_num_threads(before)


def test_the_references_single_machine_arguments_are_accepted_and_inert_ones_warn_once():
    rep = ListReporter()
    with pytest.warns(
        UserWarning, match=r"monitor_interval=\.\.\.\) is accepted for compatibility and has no effect"
    ):
        out = notebook_launcher(
            _trivial,
            num_processes=2,
            cpu=True,
            reporter=rep,
            use_port=None,
            num_nodes=1,
            node_rank=0,
            rdzv_backend="static",
            max_restarts=0,
            monitor_interval=0.1,
            log_line_prefix_template=None,
        )
    assert out == [0, 1]
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the second time: no warning
        assert notebook_launcher(_trivial, num_processes=1, cpu=True, reporter=rep, monitor_interval=0.1) == [
            0
        ]
    with pytest.raises(LaunchSetupError, match="max_restarts=1.*accel-nb launch"):
        # several machines: test_multinode
        notebook_launcher(_trivial, num_processes=2, num_nodes=2, max_restarts=1)


def test_an_unknown_keyword_is_a_clear_error_naming_what_is_accepted():
    with pytest.raises(
        TypeError,
        match=r"notebook_launcher\(\) got unexpected keyword argument\(s\): bogus; it accepts .*cpu",
    ):
        notebook_launcher(_trivial, bogus=1)
    with pytest.raises(TypeError, match=r"debug_launcher\(\) got unexpected keyword argument\(s\): nproc"):
        debug_launcher(_trivial, nproc=2)


@pytest.mark.parametrize(
    "options, message",
    [
        ({"start_method": "thread"}, "start_method='thread' is not one of 'auto', 'fork', 'spawn'"),
        ({"mixed_precision": "fp32"}, "mixed_precision='fp32' is not supported .*spelled 'no'"),
        ({"num_processes": 0}, "num_processes=0 must be at least 1"),
        ({"num_processes": 2.5}, "num_processes=2.5 must be a whole number"),
        ({"gradient_accumulation_steps": 0}, "gradient_accumulation_steps=0 must be at least 1"),
        ({"timeout": -1}, "timeout=-1 must be more than 0 seconds"),
        ({"use_port": 70000}, "use_port=70000 is not a TCP port"),
        ({"use_port": "http"}, "use_port='http' is not a port number"),
        ({"show_ranks": "first"}, "show_ranks='first' names no ranks"),
        ({"env": {"A": 1}}, "env=.* must be a dict of strings to strings"),
    ],
)
def test_launch_options_are_checked_once_with_a_clear_error(options, message):
    with pytest.raises(LaunchSetupError, match=message):
        LaunchOptions(**options)


def test_launch_options_normalise_what_they_accept():
    options = LaunchOptions(mixed_precision=" BF16 ", use_port="29555", timeout="5", show_ranks="0, 2")
    assert options.mixed_precision == "bf16" and options.use_port == 29555 and options.timeout == 5.0
    assert options.show == {0, 2} and LaunchOptions().show is None


_PRE_IMPORT_SCRIPT = """
import os, sys, threading
from accel_nb import PartialState, debug_launcher
from accel_nb.launch import preimport
from accel_nb.launch.parent.reporting import ListReporter


def imported_already():
    return [name in sys.modules for name in ("torch", "torch._dynamo", "accel_nb.accelerator.accelerator")]


class Events:  # what an IPython kernel's shell.events does with the two hooks
    def __init__(self):
        self.callbacks = {"pre_run_cell": [], "post_run_cell": []}

    def register(self, event, function):
        self.callbacks[event].append(function)

    def trigger(self, event):
        for function in self.callbacks[event]:
            function(None)


class Shell:
    events = Events()


def background():
    return [t.name for t in threading.enumerate() if t.name == "accel_nb-preimport"]


ran_in = []  # the thread each pre-import ran in
real_import_modules = preimport.import_modules


def recording_import_modules():
    ran_in.append(threading.current_thread().name)
    real_import_modules()


preimport.import_modules = recording_import_modules


os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
before = dict(os.environ)
# a script: the main thread goes on importing, so a fork launch starts no background import beside it
print("SCRIPT", debug_launcher(lambda: PartialState().process_index, reporter=ListReporter()), ran_in,
      "torch._dynamo" in sys.modules)
shell = Shell()
preimport.start_when_idle(shell)  # the launcher imported in a kernel: nothing starts during the cell
print("SCHEDULED", ran_in, shell.events.callbacks["pre_run_cell"] != [])
if sys.argv[1] == "idle":
    shell.events.trigger("post_run_cell")  # the cell ends: the kernel idles, the thread imports
    shell.events.trigger("pre_run_cell")  # the next cell waits for it
    print("IDLE", ran_in, background())
# the launch finishes what is left (in this thread when no cell ended yet): ranks inherit it all
print("RANKS", debug_launcher(imported_already, reporter=ListReporter()), preimport.failures, ran_in)
print("ENV", dict(os.environ) == before)  # torch._inductor's import-time TORCHINDUCTOR_CACHE_DIR was put back
"""


@pytest.mark.parametrize("when", ["idle", "in-cell"])
def test_a_kernel_pre_imports_what_ranks_need_between_cells_and_a_script_never_in_the_background(
    tmp_path, when
):
    """The background import never runs beside the caller's own code: in a script it would race the main
    thread's torch imports (a SIGABRT); in a kernel it runs from the end of a cell to the start of the next."""
    import subprocess
    import sys

    script = tmp_path / "pre_import.py"
    script.write_text(_PRE_IMPORT_SCRIPT)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=root, OMP_NUM_THREADS="1")
    res = subprocess.run(
        [sys.executable, str(script), when], cwd=root, env=env, capture_output=True, text=True, timeout=600
    )
    assert res.returncode == 0, res.stdout + res.stderr
    lines = dict(line.split(" ", 1) for line in res.stdout.splitlines() if " " in line)
    assert lines["SCRIPT"] == "[0, 1] [] False"
    assert lines["SCHEDULED"] == "[] True"
    ran_in = "['accel_nb-preimport']" if when == "idle" else "['MainThread']"
    if when == "idle":
        assert lines["IDLE"] == f"{ran_in} []"  # imported in the background, over before the next cell
    assert lines["RANKS"] == f"[[True, True, True], [True, True, True]] {{}} {ran_in}"
    assert lines["ENV"] == "True"


def _one_dies_mid_collective():
    import torch
    import torch.distributed as dist

    state = PartialState()
    dist.barrier()
    if state.process_index == 1:
        os._exit(3)
    dist.all_reduce(torch.ones(1))  # rank 0 waits for its dead peer: gloo breaks


def test_a_rank_that_only_lost_its_peer_is_stopped_and_shown_so():
    rep = ListReporter()
    with pytest.raises(LaunchError) as info:
        debug_launcher(_one_dies_mid_collective, reporter=rep)
    err = info.value
    assert [(f.rank, f.exit_code) for f in err.failures] == [(1, 3)] and err.stopped == [0]
    assert "rank 1 (first to fail) exited with code 3" in str(err) and "rank 0 was stopped" in str(err)
    assert {e.rank for e in rep.of_type(Failure)} == {1}  # the display never showed rank 0 as failed
    assert any(isinstance(e, Phase) and e.rank == 0 and e.phase == "stopped" for e in rep.events)
