"""Several machines: two hosts made on this machine (network namespaces + a veth pair) run one job.

Each test creates its own namespaces and veth pair (unique names per run) and deletes them; it
skips without root or iproute2. The ranks talk over the veth link only, as two machines would.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(ROOT, "examples", "allreduce_script.py")

# the timeout is a safety net: a test runs one or two jobs of 4 ranks, a few minutes on a loaded machine
pytestmark = [pytest.mark.multiproc, pytest.mark.timeout(1200)]


@dataclass
class Host:
    namespace: str
    interface: str
    ip: str

    def command(self, *args: str) -> list[str]:
        """``args`` run inside this host's network namespace."""
        return ["ip", "netns", "exec", self.namespace, *args]


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


@contextlib.contextmanager
def two_hosts() -> Iterator[tuple[Host, Host]]:
    """Two network namespaces joined by a veth pair on a private /30; always deleted afterwards."""
    if shutil.which("ip") is None:
        pytest.skip("iproute2 (the ip command) is not installed")
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    tag = f"{os.getpid() % 100000:05d}{secrets.token_hex(2)}"  # interface names: at most 15 characters
    net = f"10.{secrets.randbelow(256)}.{secrets.randbelow(256)}.{4 * secrets.randbelow(64)}"
    base = net.rsplit(".", 1)[0] + "." + str(int(net.rsplit(".", 1)[1]) + 1)
    hosts = (
        Host(f"anb{tag}a", f"anb{tag}0", base),
        Host(f"anb{tag}b", f"anb{tag}1", base.rsplit(".", 1)[0] + "." + str(int(base.rsplit(".", 1)[1]) + 1)),
    )
    made: list[str] = []
    try:
        for host in hosts:
            try:
                _ip("netns", "add", host.namespace)
            except subprocess.CalledProcessError as exc:
                pytest.skip(f"cannot create a network namespace here: {exc.stderr.strip()}")
            made.append(host.namespace)
        a, b = hosts
        _ip(
            "link",
            "add",
            a.interface,
            "netns",
            a.namespace,
            "type",
            "veth",
            "peer",
            "name",
            b.interface,
            "netns",
            b.namespace,
        )
        for host in hosts:
            _ip("-n", host.namespace, "addr", "add", f"{host.ip}/30", "dev", host.interface)
            _ip("-n", host.namespace, "link", "set", host.interface, "up")
            _ip("-n", host.namespace, "link", "set", "lo", "up")
        yield hosts
    finally:
        for name in made:  # deleting a namespace deletes the veth end inside it, and so the pair
            subprocess.run(["ip", "netns", "del", name], capture_output=True)


def launch_on(host: Host, machine_rank: int, main: Host, port: int, *args: str, cfg: str) -> subprocess.Popen:
    env = dict(os.environ, ACCEL_NB_CONFIG_FILE=cfg, OMP_NUM_THREADS="1", PYTHONPATH=ROOT)
    for name in ("GLOO_SOCKET_IFNAME", "CUDA_VISIBLE_DEVICES", "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"):
        env.pop(name, None)
    cmd = host.command(
        sys.executable,
        "-m",
        "accel_nb.commands",
        "launch",
        "--cpu",
        "--num_machines",
        "2",
        "--machine_rank",
        str(machine_rank),
        "--main_process_ip",
        main.ip,
        "--main_process_port",
        str(port),
        *args,
    )
    return subprocess.Popen(
        cmd,
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def finish(*procs: subprocess.Popen, timeout: float = 600) -> list[tuple[int, str, str]]:
    # a safety net only (a run takes about a minute, two or three on a loaded machine): waits on the exit
    results = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=timeout)
            results.append((proc.returncode, out, err))
    finally:  # a launch that did not finish: stop the agent and its ranks (their own session)
        for proc in procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.communicate()
    return results


@pytest.mark.parametrize("backend", ["static", "c10d"])
def test_two_machines_two_processes_each_all_reduce(tmp_path, backend):
    cfg = str(tmp_path / "default_config.yaml")
    with two_hosts() as (main, other):
        procs = [
            launch_on(
                host,
                rank,
                main,
                29400,
                "--num_processes",
                "4",
                "--rdzv_backend",
                backend,
                "--rdzv_timeout",
                "120",
                EXAMPLE,
                cfg=cfg,
            )
            for rank, host in enumerate((main, other))
        ]
        results = finish(*procs)
    ranks_by_machine: dict[int, list[int]] = {0: [], 1: []}
    for machine, (code, out, err) in enumerate(results):
        assert code == 0, f"machine {machine} failed:\n{out}\n{err}"
        assert f"machine {machine} of 2, meeting at {main.ip}:29400, {backend} rendezvous" in err
        for line in out.splitlines():
            found = re.match(
                r"\[machine(\d) rank(\d)\]:rank (\d)/4: sum=10 gathered=\[1.0, 2.0, 3.0, 4.0\]", line
            )
            if found:
                label_machine, label_rank, rank = map(int, found.groups())
                assert label_machine == machine and label_rank == rank, line
                ranks_by_machine[machine].append(rank)
    # every rank printed the right sum; each machine ran two of them
    assert sorted(ranks_by_machine[0] + ranks_by_machine[1]) == [0, 1, 2, 3], results
    assert len(ranks_by_machine[0]) == len(ranks_by_machine[1]) == 2
    if backend == "static":  # machine_rank decides the global ranks
        assert sorted(ranks_by_machine[1]) == [2, 3]


RESTART_EXAMPLE = os.path.join(ROOT, "examples", "elastic_restart.py")


def _launch_restart_example(project: str, cfg: str, nproc: int, *extra: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, ACCEL_NB_CONFIG_FILE=cfg, OMP_NUM_THREADS="1", PYTHONPATH=ROOT)
    cmd = [
        sys.executable,
        "-m",
        "accel_nb.commands",
        "launch",
        "--cpu",
        "--num_processes",
        str(nproc),
        "--max_restarts",
        "1",
        RESTART_EXAMPLE,
        "--project",
        project,
        *extra,
    ]
    return subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)


def _check_resumed_like_uninterrupted(straight: str, killed: str, exact: bool = True) -> None:
    """The killed run's losses, step by step, and final weights equal the uninterrupted run's.

    ``exact=False`` for more than 2 ranks: the ring all-reduce adds 4 gradients in an order that
    follows DDP's buckets, which are laid out again at the first step after a restart, so the
    weights agree to float32 rounding (measured: 3e-9 relative on one machine as on two).
    """
    import json
    import math

    def steps(project: str) -> list[dict]:
        with open(os.path.join(project, "steps.jsonl")) as f:
            return [json.loads(line) for line in f]

    reference = {s["step"]: s["loss"] for s in steps(straight)}
    assert sorted(reference) == list(range(1, 13))
    logged = steps(killed)
    first = [s["step"] for s in logged if s["started_at"] == 0]
    second = [s["step"] for s in logged if s["started_at"] == 6]
    assert len(first) + len(second) == len(logged)
    assert first[:7] == list(range(1, 8)) and len(first) <= 8  # killed after step 7
    assert second == list(range(7, 13))  # resumed after the checkpoint of step 6
    for s in logged:
        assert math.isclose(s["loss"], reference[s["step"]], rel_tol=0 if exact else 1e-6), (s, reference)
    with open(os.path.join(straight, "result.json")) as f, open(os.path.join(killed, "result.json")) as g:
        a, b = json.load(f), json.load(g)
    # started_at 12 for the uninterrupted run: its agent restarted a group that had finished (a rank
    # that died at exit, seen when gloo's threads outlived the interpreter; tests/test_exit_teardown.py)
    assert (a["started_at"], b["started_at"]) == (0, 6), (a, b)
    assert math.isclose(a["weights_sum"], b["weights_sum"], rel_tol=0 if exact else 1e-7), (a, b)


def test_killed_worker_is_restarted_and_resumes_from_the_last_save_state(tmp_path):
    cfg = str(tmp_path / "default_config.yaml")
    straight, killed = str(tmp_path / "straight"), str(tmp_path / "killed")
    out = _launch_restart_example(straight, cfg, 2)
    assert out.returncode == 0, out.stdout + out.stderr
    out = _launch_restart_example(killed, cfg, 2, "--kill-rank", "1", "--kill-at-step", "7")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "rank 1: killing myself after step 7" in out.stdout
    assert "restart 1: resumed from" in out.stdout and "checkpoint_1 at step 6" in out.stdout
    _check_resumed_like_uninterrupted(straight, killed)


def test_restart_across_two_machines_resumes_like_an_uninterrupted_run(tmp_path):
    """c10d: rank 3 (machine 1) dies; both machines' ranks restart, resume, and match an uninterrupted 2x2 run."""
    cfg = str(tmp_path / "default_config.yaml")
    straight, killed = str(tmp_path / "straight"), str(tmp_path / "killed")
    with two_hosts() as (main, other):
        for project, kill in ((straight, ()), (killed, ("--kill-rank", "3", "--kill-at-step", "7"))):
            procs = [
                launch_on(
                    host,
                    rank,
                    main,
                    29400,
                    "--num_processes",
                    "4",
                    "--rdzv_backend",
                    "c10d",
                    "--rdzv_timeout",
                    "120",
                    "--max_restarts",
                    "1",
                    RESTART_EXAMPLE,
                    "--project",
                    project,
                    *kill,
                    cfg=cfg,
                )
                for rank, host in enumerate((main, other))
            ]
            results = finish(*procs)
            for machine, (code, out, err) in enumerate(results):
                assert code == 0, f"machine {machine} failed:\n{out}\n{err}"
    assert "rank 3: killing myself after step 7" in results[1][1]
    _check_resumed_like_uninterrupted(straight, killed, exact=False)


NOTEBOOK_SIDE = """
import json, sys
import torch
from accel_nb import PartialState, gather, notebook_launcher, reduce

def job():  # the collectives of examples/allreduce_script.py, which the other machine runs
    state = PartialState()
    mine = torch.tensor([state.process_index + 1.0])
    total = reduce(mine, reduction="sum").item()
    everyone = gather(mine).tolist()
    state.wait_for_everyone()
    return [state.process_index, state.num_processes, state.local_process_index, total, everyone]

rank, addr, port, backend = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]
results = notebook_launcher(job, num_processes=2, cpu=True, num_nodes=2, node_rank=rank, master_addr=addr,
                            use_port=port, rdzv_backend=backend, rdzv_conf={"timeout": 120}, progress="text")
print("RESULTS", json.dumps(results), flush=True)
"""


@pytest.mark.parametrize("backend, notebook_machine", [("static", 0), ("c10d", 1)])
def test_notebook_launcher_on_one_machine_joins_accel_nb_launch_on_the_other(
    tmp_path, backend, notebook_machine
):
    import json

    cfg = str(tmp_path / "default_config.yaml")
    side = tmp_path / "notebook_side.py"
    side.write_text(NOTEBOOK_SIDE)
    with two_hosts() as hosts:
        main = hosts[0]
        nb_host, cli_host = hosts[notebook_machine], hosts[1 - notebook_machine]
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT, ACCEL_NB_CONFIG_FILE=cfg)
        env.pop("GLOO_SOCKET_IFNAME", None)
        notebook = subprocess.Popen(
            nb_host.command(sys.executable, str(side), str(notebook_machine), main.ip, "29400", backend),
            env=env,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        cli = launch_on(
            cli_host,
            1 - notebook_machine,
            main,
            29400,
            "--num_processes",
            "4",
            "--rdzv_backend",
            backend,
            "--rdzv_timeout",
            "120",
            EXAMPLE,
            cfg=cfg,
        )
        (nb_code, nb_out, nb_err), (cli_code, cli_out, cli_err) = finish(notebook, cli)
    assert nb_code == 0, nb_out + nb_err
    assert cli_code == 0, cli_out + cli_err
    results = json.loads(nb_out.split("RESULTS", 1)[1])
    mine = [r[0] for r in results]
    everyone = [1.0, 2.0, 3.0, 4.0]
    assert [r[1:] for r in results] == [[4, 0, 10.0, everyone], [4, 1, 10.0, everyone]], results
    theirs = sorted(
        int(m.group(1)) for m in re.finditer(r"rank (\d)/4: sum=10 gathered=\[1.0, 2.0, 3.0, 4.0\]", cli_out)
    )
    assert sorted(mine + theirs) == [0, 1, 2, 3], (results, cli_out)
    if backend == "static":  # machine_rank decides: the notebook's machine 0 holds ranks 0 and 1
        assert mine == [0, 1]


def test_notebook_machine_options_bad_input_is_one_clear_error(capfd):
    import socket

    from accel_nb import notebook_launcher
    from accel_nb.launch.errors import LaunchSetupError
    from accel_nb.launch.ports import pick_free_port

    def launch(**options):
        return notebook_launcher(print, num_processes=1, cpu=True, num_nodes=2, progress="text", **options)

    with pytest.raises(LaunchSetupError, match="node_rank=2 must be smaller than num_nodes=2"):
        launch(node_rank=2, master_addr="127.0.0.1")
    with pytest.raises(
        LaunchSetupError, match="master_addr='192.0.2.7': 192.0.2.7 is not an address of this machine"
    ):
        launch(node_rank=0, master_addr="192.0.2.7")
    with socket.socket() as busy:
        busy.bind(("", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(
            LaunchSetupError, match=f"use_port={port}: port {port} on 127.0.0.1 is already in use"
        ):
            launch(node_rank=0, master_addr="127.0.0.1", use_port=port)
    with pytest.raises(LaunchSetupError, match="elastic restarts"):
        launch(node_rank=0, master_addr="127.0.0.1", max_restarts=1)
    with pytest.raises(LaunchSetupError, match="reads only 'timeout'"):
        launch(node_rank=0, master_addr="127.0.0.1", rdzv_conf={"read_timeout": 5})
    port = pick_free_port()
    loopback = pytest.warns(
        UserWarning, match="loopback address, but num_nodes=2: machines other than this one"
    )
    with loopback, pytest.raises(LaunchSetupError) as never:
        launch(node_rank=0, master_addr="127.0.0.1", use_port=port, rdzv_conf={"timeout": 2})
    assert f"did not join the rendezvous at 127.0.0.1:{port} within 2s: start them with node_rank 1" in str(
        never.value
    )
    port = pick_free_port()
    with pytest.warns(UserWarning, match="loopback"), pytest.raises(LaunchSetupError) as unreachable:
        launch(node_rank=1, master_addr="localhost", use_port=port, rdzv_conf={"timeout": 2})
    assert f"could not join the main machine at localhost:{port} within 2s" in str(unreachable.value)
    # torch's C++ store retries (with C++ stacks) went to a file the error names, not above the error
    assert "torch's own messages: " in str(unreachable.value)
    assert "frame #" not in capfd.readouterr().err


def test_accelerate_magic_flags_for_several_machines():
    from accel_nb.notebook.magic_flags import launch_options, parse_accelerate_line

    line = (
        "-n 2 --cpu --num_nodes 2 --node_rank 1 --master_addr 10.0.0.1 --rdzv_backend c10d --rdzv_timeout 30"
    )
    options = launch_options(parse_accelerate_line(line), None)
    assert (options.num_nodes, options.node_rank, options.master_addr) == (2, 1, "10.0.0.1")
    assert (options.rdzv_backend, options.rdzv_timeout, options.num_processes) == ("c10d", 30.0, 2)
    plain = launch_options(parse_accelerate_line("-n 2 --cpu"), None)
    assert (plain.num_nodes, plain.node_rank, plain.rdzv_backend, plain.rdzv_timeout) == (
        1,
        0,
        "static",
        None,
    )
