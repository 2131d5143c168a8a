"""The XLA launch path's decisions and its relay, in the main environment (no torch_xla needed).

Which launch a runtime gets (XLA devices, or CPU/GPU processes), the clear errors for a bad mix,
the host's environment, and the relay socket that carries every ordinal's events to the host.
The launches themselves run in tests/xla (the XLA environment).
"""

from __future__ import annotations

import multiprocessing
import os
import threading
import time

import pytest

from accel_nb import events
from accel_nb.launch.channel import EventReader, EventWriter
from accel_nb.launch.errors import LaunchSetupError
from accel_nb.launch.options import LaunchOptions
from accel_nb.launch.plan import LaunchPlan
from accel_nb.launch.xla.launcher import Relay, XlaLauncher, choose_xla, xla_headline
from accel_nb.xla_detect import XlaRuntime

CPU2 = {"PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": "2"}


def test_an_xla_runtime_is_chosen_unless_cpu_is_asked():
    runtime = choose_xla(LaunchOptions(), env=CPU2, installed=True)
    assert (runtime.device, runtime.num_devices) == ("CPU", 2)
    assert choose_xla(LaunchOptions(num_processes=2), env=CPU2, installed=True).num_devices == 2
    assert choose_xla(LaunchOptions(cpu=True), env=CPU2, installed=True) is None
    assert choose_xla(LaunchOptions(xla=False), env=CPU2, installed=True) is None
    assert choose_xla(LaunchOptions(), env=CPU2, installed=False) is None  # no torch_xla: a CPU/GPU launch
    assert choose_xla(LaunchOptions(), env={}, installed=True) is None  # torch_xla but no device configured


@pytest.mark.parametrize(
    ("options", "installed", "expected"),
    [
        (LaunchOptions(num_processes=3), True, "num_processes=3 but this XLA runtime has 2 devices"),
        (LaunchOptions(start_method="fork"), True, "start_method='fork' cannot start an XLA launch"),
        (LaunchOptions(num_nodes=2, node_rank=0), True, "num_nodes > 1 with XLA devices"),
        (LaunchOptions(xla=True), False, "torch_xla is not installed in this environment"),
        (LaunchOptions(xla=True, cpu=True), True, "cpu=True and xla=True"),
    ],
)
def test_a_bad_mix_is_one_clear_error(options, installed, expected):
    with pytest.raises(LaunchSetupError, match=expected.replace("(", r"\(").replace(")", r"\)")):
        choose_xla(options, env=CPU2, installed=installed)
    with pytest.raises(LaunchSetupError, match="no XLA device is configured"):
        choose_xla(LaunchOptions(xla=True), env={}, installed=True)
    with pytest.raises(LaunchSetupError, match="must be True, False or None"):
        LaunchOptions(xla="yes")
    with pytest.raises(
        LaunchSetupError, match="PJRT_DEVICE=CUDA: accel_nb launches on XLA's TPU and CPU devices only"
    ):
        choose_xla(LaunchOptions(), env={"PJRT_DEVICE": "CUDA"}, installed=True)
    assert choose_xla(LaunchOptions(xla=False), env={"PJRT_DEVICE": "CUDA"}, installed=True) is None
    with pytest.raises(
        LaunchSetupError, match="ACCEL_NB_XLA_START_METHOD='forkserver' is not 'fork' or 'spawn'"
    ):
        choose_xla(LaunchOptions(), env={**CPU2, "ACCEL_NB_XLA_START_METHOD": "forkserver"}, installed=True)


def test_the_host_gets_accel_nb_settings_not_torchrun_ranks():
    options = LaunchOptions(mixed_precision="bf16", gradient_accumulation_steps=2, env={"MY_FLAG": "1"})
    plan = LaunchPlan(
        options, 2, False, "spawn", None, 0, launcher=XlaLauncher(XlaRuntime("CPU", 2, "PJRT_DEVICE=CPU"))
    )
    env = plan.rank_env(0)
    assert env["PJRT_DEVICE"] == "CPU" and env["CPU_NUM_DEVICES"] == "2" and env["MY_FLAG"] == "1"
    assert env["ACCEL_NB_MIXED_PRECISION"] == "bf16" and env["ACCEL_NB_GRADIENT_ACCUMULATION_STEPS"] == "2"
    for name in ("RANK", "WORLD_SIZE", "MASTER_PORT", "ACCEL_NB_USE_CPU", "ACCELERATE_USE_CPU"):
        assert name not in env  # torch_xla gives each ordinal its rank; XLA must not be told "use the CPU"
    assert plan.backend == "xla"
    assert xla_headline(plan).startswith("Launching on 2 XLA CPU devices through torch_xla.launch")
    tpu = LaunchPlan(
        LaunchOptions(),
        8,
        False,
        "spawn",
        None,
        0,
        launcher=XlaLauncher(XlaRuntime("TPU", 8, "8 Google PCI devices")),
    )
    assert tpu.headline().startswith("Launching on 8 TPU devices") and "CPU_NUM_DEVICES" not in tpu.rank_env(
        0
    )
    # a session (ranks kept between cells) is refused on XLA, naming what works
    assert "torch_xla.launch runs a function once" in tpu.launcher.session_problem(tpu)


def test_the_magic_takes_xla_from_the_saved_config():
    from accel_nb.config import LaunchConfig
    from accel_nb.notebook.magic_flags import launch_options, parse_accelerate_line

    cfg = LaunchConfig(distributed_type="XLA", num_processes=8, mixed_precision="bf16")
    options = launch_options(parse_accelerate_line(""), cfg)
    assert options.xla is True and options.cpu is False and options.num_processes == 8
    assert launch_options(parse_accelerate_line("--cpu"), cfg).xla is None  # --cpu wins over the config
    if choose_xla(LaunchOptions(), installed=None) is None:  # this environment has no XLA runtime
        with pytest.raises(LaunchSetupError, match="an XLA launch was asked"):
            choose_xla(options)


def _ordinal_like_client(path: str, rank: int, count: int) -> None:
    """What an ordinal process does: connect to the relay and send events (big ones too) as fast as it can."""
    import socket

    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(path)
    writer = EventWriter(sock.detach())
    for i in range(count):
        writer.send(
            events.Log(rank=rank, stream="stdout", text=f"{rank}:{i}:" + "x" * (i * 997 % 70000) + "\n")
        )
    writer.send(events.Result(rank=rank, value=[rank] * 3))
    writer.close()


@pytest.mark.multiproc
def test_the_relay_forwards_whole_events_of_several_processes(tmp_path):
    r, w = os.pipe()
    host_writer = EventWriter(w)
    reader = EventReader(r, rank=0)
    relay = Relay(str(tmp_path / "relay.sock"), host_writer)
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_ordinal_like_client, args=(relay.path, k, 40)) for k in range(3)]
    got: list[events.Event] = []

    def drain() -> None:  # the launch's supervisor does this in the notebook
        while not reader.eof:
            got.extend(reader.read_available())
            time.sleep(0.005)

    draining = threading.Thread(target=drain)
    draining.start()
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    relay.close(wait=10)
    host_writer.close()
    draining.join(30)
    assert not os.path.exists(relay.path)
    for k in range(3):
        lines = [e.text.split(":")[1] for e in got if isinstance(e, events.Log) and e.rank == k]
        assert lines == [str(i) for i in range(40)]  # each process's events whole and in order
        assert [e.value for e in got if isinstance(e, events.Result) and e.rank == k] == [[k] * 3]
    reader.close()
