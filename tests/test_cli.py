"""The accel-nb command, run as a real subprocess: config default, env, launch (torchrun underneath), questions."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import yaml

from accel_nb.commands.launch import torchrun_arguments
from accel_nb.config import LaunchConfig, launch_command_line, load_config
from tests.test_hardware import fake_nvml_dir  # noqa: F401 - the stand-in NVIDIA driver fixture

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(ROOT, "examples", "allreduce_script.py")
CONSOLE = os.path.join(os.path.dirname(sys.executable), "accel-nb")


def accel_nb(
    *args: str,
    cfg: str,
    stdin: str | None = None,
    console: bool = False,
    timeout: float = 240,
    cwd: str | None = None,
    env: dict | None = None,
) -> subprocess.CompletedProcess:
    """Run the CLI in a fresh process with its config file in the test's tmp dir."""
    extra = env or {}
    env = dict(os.environ, ACCEL_NB_CONFIG_FILE=cfg, OMP_NUM_THREADS="1", PYTHONPATH=ROOT)
    env.pop("CUDA_VISIBLE_DEVICES", None)
    env.update(extra)
    cmd = [CONSOLE] if console and os.path.exists(CONSOLE) else [sys.executable, "-m", "accel_nb.commands"]
    return subprocess.run(
        cmd + list(args),
        input=stdin,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd or ROOT,
    )


@pytest.fixture
def cfg(tmp_path) -> str:
    return str(tmp_path / "cfgdir" / "default_config.yaml")


def test_config_default_then_env(cfg, tmp_path):
    out = accel_nb("config", "default", cfg=cfg, console=True)
    assert out.returncode == 0, out.stderr
    assert f"accel_nb config written to {cfg}" in out.stdout
    saved = load_config(cfg)
    assert saved is not None and saved.validate() is saved
    env = accel_nb("env", cfg=cfg, console=True)
    assert env.returncode == 0, env.stderr
    for line in (
        "accel_nb version: 0.1.0",
        "PyTorch version",
        "CPU cores",
        "RAM",
        "GPUs",
        f"Launch config ({cfg})",
    ):
        assert line in env.stdout
    assert f"distributed_type: {saved.distributed_type}" in env.stdout
    # an explicit --config_file goes elsewhere and the module form works too
    other = str(tmp_path / "other.yaml")
    out = accel_nb("config", "default", "--config_file", other, "--mixed_precision", "bf16", cfg=cfg)
    assert out.returncode == 0 and other in out.stdout
    assert load_config(other).mixed_precision == "bf16"
    assert f"Launch config ({other})" in accel_nb("env", "--config_file", other, cfg=cfg).stdout


def test_no_command_prints_help(cfg):
    out = accel_nb(cfg=cfg)
    assert out.returncode == 1 and "config" in out.stdout and "launch" in out.stdout


@pytest.mark.multiproc
def test_launch_two_processes_all_reduce(cfg):
    out = accel_nb("launch", "--num_processes", "2", EXAMPLE, cfg=cfg, console=True)
    assert out.returncode == 0, out.stdout + out.stderr
    lines = [line for line in out.stdout.splitlines() if ": sum=" in line]
    assert any(
        "rank 0/2: sum=3 gathered=[1.0, 2.0] mixed_precision=no backend=gloo" in line for line in lines
    )
    assert any(
        "rank 1/2: sum=3 gathered=[1.0, 2.0] mixed_precision=no backend=gloo" in line for line in lines
    )
    assert "2 CPU process(es)" in out.stderr


@pytest.mark.multiproc
def test_launch_takes_defaults_from_the_config_and_passes_script_args(cfg):
    os.makedirs(os.path.dirname(cfg))
    with open(cfg, "w") as f:
        yaml.safe_dump(
            {
                "distributed_type": "MULTI_CPU",
                "num_processes": 2,
                "mixed_precision": "bf16",
                "use_cpu": True,
                "gradient_accumulation_steps": 4,
            },
            f,
        )
    script = os.path.join(os.path.dirname(cfg), "show_env.py")
    with open(script, "w") as f:
        f.write(
            "import os, sys\n"
            "from accel_nb import AcceleratorState\n"
            "s = AcceleratorState()\n"
            "print(f'rank {s.process_index}/{s.num_processes} mp={s.mixed_precision} '\n"
            "      f'gas={os.environ[\"ACCEL_NB_GRADIENT_ACCUMULATION_STEPS\"]} '\n"
            "      f'ref={os.environ[\"ACCELERATE_MIXED_PRECISION\"]} args={sys.argv[1:]}', flush=True)\n"
        )
    out = accel_nb("launch", script, "--lr", "0.1", "-x", cfg=cfg)
    assert out.returncode == 0, out.stdout + out.stderr
    for rank in (0, 1):
        assert f"rank {rank}/2 mp=bf16 gas=4 ref=bf16 args=['--lr', '0.1', '-x']" in out.stdout
    # a flag wins over the file
    out = accel_nb("launch", "--num_processes", "1", "--mixed_precision", "no", script, cfg=cfg)
    assert out.returncode == 0, out.stderr
    assert "rank 0/1 mp=no gas=4" in out.stdout and "rank 1/" not in out.stdout


@pytest.mark.multiproc
def test_failing_script_gives_non_zero_exit_and_a_readable_summary(cfg):
    out = accel_nb("launch", "--num_processes", "2", EXAMPLE, "--fail-on-rank", "1", cfg=cfg)
    # 1, or 134 when torch's gloo threads abort the process at exit after the exception
    assert out.returncode in (1, 134), out.stderr
    assert "rank 1 failed first: ValueError: rank 1 was asked to fail (" in out.stderr
    assert "ChildFailedError" not in out.stdout + out.stderr
    log_line = next(line for line in out.stderr.splitlines() if "its log:" in line)
    log_path = log_line.split("its log:")[1].split("(")[0].strip()
    assert os.path.isfile(log_path)
    with open(log_path) as f:
        assert "ValueError: rank 1 was asked to fail" in f.read()


@pytest.mark.multiproc
def test_rank_killed_by_a_signal_is_named(cfg, tmp_path):
    script = tmp_path / "die.py"
    script.write_text(
        "import os, signal, time\n"
        "if os.environ['RANK'] == '1':\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
        "time.sleep(30)\n"
    )
    out = accel_nb("launch", "--num_processes", "2", "--cpu", str(script), cfg=cfg)
    assert out.returncode == 128 + 9
    assert "rank 1 failed first: was killed by SIGKILL (likely out of memory" in out.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (["launch", "--num_processes", "0", "x.py"], "--num_processes=0"),
        (["launch", "--gradient_accumulation_steps", "0", "x.py"], "--gradient_accumulation_steps=0"),
        (["launch", "--main_process_port", "99999", "x.py"], "--main_process_port=99999"),
        (["launch", "--num_machines", "2", "--num_processes", "2", "x.py"], "main_process_ip"),
        (
            ["launch", "--num_machines", "2", "--machine_rank", "3", "--main_process_ip", "h", "x.py"],
            "machine_rank",
        ),
        (["launch", "--config_file", "/nonexistent.yaml", "x.py"], "--config_file='/nonexistent.yaml'"),
        (["launch", "--num_processes", "2", "no_such_script.py"], "script 'no_such_script.py' not found"),
        (["launch", "--mixed_precision", "fp9", "x.py"], "invalid choice: 'fp9'"),
        (["launch", "--num_processes", "two", "x.py"], "invalid int value: 'two'"),
    ],
)
def test_bad_launch_arguments_are_one_line_errors(cfg, args, message):
    out = accel_nb(*args, cfg=cfg)
    assert out.returncode == 2
    assert message in out.stderr
    assert "Traceback" not in out.stderr


def test_launch_refuses_gpu_config_on_a_machine_without_gpus(cfg, tmp_path):
    from accel_nb.hardware import cuda_device_count

    if cuda_device_count():
        pytest.skip("this machine has GPUs")
    os.makedirs(os.path.dirname(cfg))
    with open(cfg, "w") as f:
        f.write("distributed_type: MULTI_GPU\nnum_processes: 2\n")
    (tmp_path / "x.py").write_text("print('never')\n")
    out = accel_nb("launch", str(tmp_path / "x.py"), cfg=cfg)
    assert out.returncode == 2
    assert (
        "distributed_type='MULTI_GPU'" in out.stderr
        and "no visible CUDA GPU" in out.stderr
        and cfg in out.stderr
    )


def test_malformed_config_file_is_reported_by_launch(cfg, tmp_path):
    os.makedirs(os.path.dirname(cfg))
    with open(cfg, "w") as f:
        f.write("num_processes: 2\n  mixed_precision: bf16\n")
    out = accel_nb("launch", EXAMPLE, cfg=cfg)
    assert (
        out.returncode == 2
        and "not valid YAML" in out.stderr
        and cfg in out.stderr
        and "line 2" in out.stderr
    )


def test_questionnaire_through_stdin_validates_and_reasks(cfg):
    answers = "\n".join(
        [
            "cpu",  # compute on
            "1",  # machines
            "abc",  # processes: invalid, asked again
            "2",
            "fp17",  # mixed precision: invalid
            "bf16",
            "0",  # gradient accumulation: invalid
            "4",
            "",  # DeepSpeed (asked where it is installed): default (no)
            "",  # FSDP (asked with several processes): default (no)
            "",  # start method: default (auto)
            "",  # torch.compile backend: default (no)
        ]
    )
    out = accel_nb("config", cfg=cfg, stdin=answers + "\n", console=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "! num_processes='abc' is not valid" in out.stdout
    assert "! mixed_precision='fp17' is not valid" in out.stdout and "no, fp16, bf16" in out.stdout
    assert "! gradient_accumulation_steps='0' is not valid" in out.stdout
    assert f"accel_nb config written to {cfg}" in out.stdout
    saved = load_config(cfg)
    assert (saved.distributed_type, saved.num_processes, saved.mixed_precision) == ("MULTI_CPU", 2, "bf16")
    assert (saved.gradient_accumulation_steps, saved.start_method, saved.use_cpu) == (4, "auto", True)
    assert (
        "accel-nb launch --num_processes 2 --mixed_precision bf16 --gradient_accumulation_steps 4 --cpu"
        in out.stdout
    )


def test_questionnaire_keeps_fsdp_and_its_config(cfg):
    os.makedirs(os.path.dirname(cfg), exist_ok=True)
    with open(cfg, "w") as f:
        f.write(
            "distributed_type: FSDP\nnum_processes: 2\nuse_cpu: true\n"
            "fsdp_config:\n  fsdp_sharding_strategy: FULL_SHARD\n"
        )
    # Enter on every question keeps what the file says: FSDP (default yes), no layout
    out = accel_nb("config", cfg=cfg, stdin="\n" * 12)
    assert out.returncode == 0, out.stdout + out.stderr
    saved = load_config(cfg)
    assert (saved.distributed_type, saved.num_processes) == ("FSDP", 2)
    assert saved.extras["fsdp_config"] == {"fsdp_sharding_strategy": "FULL_SHARD"}
    assert "no effect" not in out.stdout + out.stderr


def test_questionnaire_asks_for_fsdp_and_then_the_layout_without_a_saved_fsdp_file(cfg):
    """Issue 30: `accel-nb config` asks the reference's FSDP question, then the layout (as the wizard offers)."""
    answers = [
        "cpu",  # compute on
        "1",  # machines
        "4",  # processes
        "",  # mixed precision
        "",  # gradient accumulation
        "",  # DeepSpeed (where it is installed): no
        "maybe",  # FSDP: invalid, asked again
        "yes",
        "yes",  # the layout
        "3",  # tensor-parallel size: does not divide 4, asked again
        "2",
        "",  # context-parallel size
        "",  # replicas
        "",  # start method
        "",  # torch.compile backend
    ]
    out = accel_nb("config", cfg=cfg, stdin="\n".join(answers) + "\n")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Do you want to use FullyShardedDataParallel" in out.stdout
    assert (
        "! use_fsdp='maybe' is not valid" in out.stdout and "divides the 4 processes, got '3'" in out.stdout
    )
    saved = load_config(cfg)
    assert (saved.distributed_type, saved.num_processes, saved.use_cpu) == ("FSDP", 4, True)
    assert saved.extras["parallelism_config"] == {
        "parallelism_config_dp_replicate_size": 1,
        "parallelism_config_dp_shard_size": 2,
        "parallelism_config_tp_size": 2,
        "parallelism_config_cp_size": 1,
    }
    # answering no: plain data parallel again, no layout question, the FSDP settings gone
    out = accel_nb("config", cfg=cfg, stdin="\n\n\n\n\n\nno\nno\n\n\n")
    assert out.returncode == 0, out.stdout + out.stderr
    saved = load_config(cfg)
    assert saved.distributed_type == "MULTI_CPU" and "parallelism_config" not in saved.extras


def test_questionnaire_for_several_machines(cfg):
    answers = [
        "cpu",
        "2",
        "5",
        "1",
        "",
        "not a host!",
        "10.0.0.1",
        "",
        "c10d",
        "",
        "3",
        "4",
        "",  # mixed precision
        "",  # gradient accumulation
        "",  # DeepSpeed (where it is installed)
        "",  # FSDP: no
        "",  # start method
        "",  # torch.compile backend
    ]
    out = accel_nb("config", cfg=cfg, stdin="\n".join(answers) + "\n")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "! machine_rank=5 is not valid" in out.stdout and "0 to 1" in out.stdout
    # Enter on an empty default
    assert "! main_process_ip is empty" in out.stdout and "None" not in out.stdout
    assert "! main_process_ip='not a host!'" in out.stdout
    assert "! num_processes=3 is not valid" in out.stdout and "multiple of num_machines=2" in out.stdout
    saved = load_config(cfg)
    assert (saved.num_machines, saved.machine_rank, saved.main_process_ip) == (2, 1, "10.0.0.1")
    assert (saved.main_process_port, saved.rdzv_backend, saved.num_processes) == (29500, "c10d", 4)
    assert saved.distributed_type == "MULTI_CPU"


def test_questionnaire_end_of_input_writes_nothing_and_keeps_old_file(cfg):
    assert accel_nb("config", "default", cfg=cfg).returncode == 0
    with open(cfg) as f:
        before = f.read()
    out = accel_nb("config", cfg=cfg, stdin="cpu\n1\n")
    assert out.returncode == 1 and "nothing was written" in out.stderr
    with open(cfg) as f:
        assert f.read() == before


def test_torchrun_arguments_and_equivalent_command():
    cfg = LaunchConfig(
        distributed_type="MULTI_GPU",
        num_processes=8,
        num_machines=2,
        machine_rank=1,
        main_process_ip="10.0.0.1",
        main_process_port=29400,
        mixed_precision="bf16",
    ).validate()
    args = torchrun_arguments(cfg, cfg.processes_here(), "train.py", ["--lr", "1"], "/tmp/logs")
    assert args[-3:] == ["train.py", "--lr", "1"]
    joined = " ".join(args)
    for part in (
        "--nnodes 2",
        "--node_rank 1",
        "--nproc_per_node 4",
        "--master_addr 10.0.0.1",
        "--master_port 29400",
    ):
        assert part in joined
    c10d = cfg.replace(rdzv_backend="c10d")
    assert "--rdzv_backend c10d --rdzv_endpoint 10.0.0.1:29400" in " ".join(
        torchrun_arguments(c10d, 4, "t.py", [], "/tmp/l")
    )
    assert launch_command_line(cfg) == (
        "accel-nb launch --num_processes 8 --num_machines 2 --machine_rank 1 --main_process_ip 10.0.0.1 "
        "--main_process_port 29400 --mixed_precision bf16 train.py"
    )


@pytest.mark.multiproc
def test_interrupt_stops_every_rank(cfg, tmp_path):
    import signal
    import time

    import psutil

    script = tmp_path / "sleepy.py"
    script.write_text("import os, time\nprint('started', os.environ['RANK'], flush=True)\ntime.sleep(120)\n")
    env = dict(os.environ, ACCEL_NB_CONFIG_FILE=cfg, OMP_NUM_THREADS="1", PYTHONPATH=ROOT)
    proc = subprocess.Popen(
        [sys.executable, "-m", "accel_nb.commands", "launch", "--num_processes", "2", str(script)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    try:
        agent = psutil.Process(proc.pid)
        deadline = time.monotonic() + 120
        ranks: list = []
        while time.monotonic() < deadline and len(ranks) < 2:
            ranks = [c for c in agent.children(recursive=True) if "sleepy.py" in " ".join(c.cmdline())]
            time.sleep(0.2)
        assert len(ranks) == 2, "both ranks should be running"
        time.sleep(1.0)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert "stopped by SIGINT; every rank was stopped" in err
    gone, alive = psutil.wait_procs(ranks, timeout=10)
    assert alive == []


def test_gpu_machine_defaults_through_the_driver(cfg, fake_nvml_dir):  # noqa: F811
    """With a (stand-in) driver reporting 2 A100s: defaults, report and questions follow the GPUs."""
    gpus = {"LD_LIBRARY_PATH": fake_nvml_dir, "FAKE_NVML_GPUS": "NVIDIA A100:80:8.0,NVIDIA A100:80:8.0"}
    out = accel_nb("config", "default", cfg=cfg, env=gpus)
    assert out.returncode == 0, out.stderr
    saved = load_config(cfg)
    assert (saved.distributed_type, saved.num_processes, saved.mixed_precision, saved.use_cpu) == (
        "MULTI_GPU",
        2,
        "bf16",
        False,
    )
    env = accel_nb("env", cfg=cfg, env=gpus).stdout
    assert "- GPUs: 2" in env and "GPU 1: NVIDIA A100, 80.0 GiB, compute capability 8.0, bf16 yes" in env
    out = accel_nb(
        "config", cfg=cfg, env=gpus, stdin="\n" * 11
    )  # 9 questions (FSDP with 2 processes), and DeepSpeed and Megatron-LM where they are installed
    assert out.returncode == 0, out.stdout + out.stderr
    assert (
        "Compute on (cpu/gpu) [gpu]" in out.stdout and "Detected: " in out.stdout and "2 GPU(s)" in out.stdout
    )
    assert load_config(cfg) == saved
    # CUDA_VISIBLE_DEVICES limits what the defaults see
    out = accel_nb("config", "default", cfg=cfg, env={**gpus, "CUDA_VISIBLE_DEVICES": "1"})
    assert (load_config(cfg).distributed_type, load_config(cfg).num_processes) == ("NO", 1)


def test_launch_refuses_bf16_on_gpus_without_it(cfg, fake_nvml_dir, tmp_path):  # noqa: F811
    t4s = {"LD_LIBRARY_PATH": fake_nvml_dir, "FAKE_NVML_GPUS": "Tesla T4:16:7.5,Tesla T4:16:7.5"}
    (tmp_path / "x.py").write_text("print('never')\n")
    out = accel_nb(
        "launch",
        "--num_processes",
        "2",
        "--mixed_precision",
        "bf16",
        str(tmp_path / "x.py"),
        cfg=cfg,
        env=t4s,
    )
    assert out.returncode == 2
    assert "GPU 0 (Tesla T4, compute capability 7.5) does not support bf16" in out.stderr
    assert "never" not in out.stdout


def test_busy_port_on_the_main_machine_is_refused_before_anything_starts(cfg, tmp_path):
    import socket

    (tmp_path / "x.py").write_text("print('never')\n")
    with socket.socket() as busy:
        busy.bind(("", 0))
        busy.listen()
        port = str(busy.getsockname()[1])
        for machines in (
            ["--num_machines", "2", "--machine_rank", "0", "--main_process_ip", "127.0.0.1"],
            [],
        ):
            out = accel_nb(
                "launch",
                "--cpu",
                "--num_processes",
                "2",
                "--main_process_port",
                port,
                *machines,
                str(tmp_path / "x.py"),
                cfg=cfg,
            )
            assert out.returncode == 2, out.stderr
            assert f"--main_process_port={port} is not valid: port {port}" in out.stderr
            assert "already in use" in out.stderr and "never" not in out.stdout


def test_machine_zero_must_own_the_main_address(cfg, tmp_path):
    (tmp_path / "x.py").write_text("print('never')\n")
    out = accel_nb(
        "launch",
        "--cpu",
        "--num_processes",
        "2",
        "--num_machines",
        "2",
        "--machine_rank",
        "0",
        "--main_process_ip",
        "192.0.2.7",
        str(tmp_path / "x.py"),
        cfg=cfg,
    )
    assert out.returncode == 2
    assert "192.0.2.7 is not an address of this machine" in out.stderr and "Traceback" not in out.stderr


@pytest.mark.multiproc
@pytest.mark.parametrize("machine_rank", ["0", "1"])
@pytest.mark.parametrize("backend", ["static", "c10d"])
def test_a_machine_that_never_arrives_is_a_timeout_naming_the_endpoint(cfg, tmp_path, machine_rank, backend):
    from accel_nb.launch.ports import pick_free_port

    (tmp_path / "x.py").write_text("print('never')\n")
    port = str(pick_free_port())
    out = accel_nb(
        "launch",
        "--cpu",
        "--num_processes",
        "2",
        "--num_machines",
        "2",
        "--machine_rank",
        machine_rank,
        "--main_process_ip",
        "127.0.0.1",
        "--main_process_port",
        port,
        "--rdzv_backend",
        backend,
        "--rdzv_timeout",
        "2",
        str(tmp_path / "x.py"),
        cfg=cfg,
    )
    assert out.returncode == 1, out.stderr
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("accel-nb launch: error: ") and f"127.0.0.1:{port} within 2s" in last, out.stderr
    if machine_rank == "0":
        assert "did not join" in last and "--machine_rank 1" in last
    else:
        assert "could not join the main machine" in last
    assert "never" not in out.stdout


def test_env_names_an_auto_loaded_torchtpu_backend_and_its_switch(cfg, tmp_path):
    site = tmp_path / "site"  # an installed package of torch's device-backend entry point group
    info = site / "torch_tpu-0.0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: torch-tpu\nVersion: 0.0.1\n")
    (info / "entry_points.txt").write_text("[torch.backends]\ntpu = torch_tpu:_autoload\n")
    env = {"PYTHONPATH": f"{ROOT}{os.pathsep}{site}"}
    out = accel_nb("env", cfg=cfg, env=env)
    assert out.returncode == 0, out.stderr
    assert (
        "- TorchTPU torch-tpu (tpu = torch_tpu:_autoload): auto-loaded by `import torch` "
        "(disable: TORCH_DEVICE_BACKEND_AUTOLOAD=0)"
    ) in out.stdout
    out = accel_nb("env", cfg=cfg, env={**env, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    assert "installed, not loaded (TORCH_DEVICE_BACKEND_AUTOLOAD=0)" in out.stdout
    assert "TorchTPU" not in accel_nb("env", cfg=cfg).stdout
