"""notebook_launcher from a REAL Jupyter kernel (jupyter_client + ipykernel), as a user runs it."""

from __future__ import annotations

import json
import re

import psutil
import pytest

from tests.cuda_pretend import KERNEL_PRETEND, KERNEL_STOP_PRETENDING
from tests.kernel_helpers import KernelSession
from tests.process_helpers import assert_no_descendants, live_descendants

pytestmark = [pytest.mark.kernel, pytest.mark.multiproc]

SETUP = """
import os, time, threading
from accel_nb import notebook_launcher, debug_launcher, PartialState, LaunchError
"""


@pytest.fixture(scope="module")
def kernel():
    with KernelSession(env={"ACCEL_NB_PROGRESS": "text"}) as k:
        out = k.run(SETUP, timeout=120)
        assert out.error is None, out.traceback
        yield k


def _live_children(k: KernelSession) -> list:
    return live_descendants(psutil.Process(k.pid))


def _assert_no_children(k: KernelSession, within: float = 5.0) -> None:
    assert_no_descendants(psutil.Process(k.pid), within)


def test_two_processes_return_their_rank_from_a_notebook_lambda(kernel):
    out = kernel.run(
        "r = notebook_launcher(lambda: PartialState().process_index, num_processes=2)\nprint('RESULT', r)"
    )
    assert out.error is None, out.traceback
    assert "RESULT [0, 1]" in out.stdout
    assert out.stdout.startswith("Launching 2 CPU processes (gloo) with fork")
    _assert_no_children(kernel)


def test_rank_output_appears_in_the_launching_cell_labelled_by_rank(kernel):
    out = kernel.run(
        "import logging, sys\n"
        "nb_log = logging.getLogger('nbtest')\n"
        "nb_log.addHandler(logging.StreamHandler(sys.stderr))\n"
        "nb_log.setLevel(logging.INFO)\n"
        "def hello():\n"
        "    s = PartialState()\n"
        "    print('hello from', s.process_index)\n"
        "    nb_log.info('logged from %d', s.process_index)\n"
        "    display({'shown': s.process_index})\n"
        "    import asyncio\n"
        "    asyncio.run(asyncio.sleep(0))  # the kernel's running event loop is not the rank's\n"
        "    os.write(2, b'C-level stderr\\n')\n"
        "    return s.num_processes\n"
        "print(notebook_launcher(hello, num_processes=2))"
    )
    assert out.error is None, out.traceback
    assert "[rank 0] hello from 0" in out.stdout and "[rank 1] hello from 1" in out.stdout
    assert "[ranks 0,1] C-level stderr" in out.stderr  # the same line from both ranks, shown once
    assert "[rank 1] logged from 1" in out.stderr  # a handler made in the notebook writes into the capture
    assert "[rank 1] {'shown': 1}" in out.stdout  # display() inside a rank prints its text form
    assert "[2, 2]" in out.stdout


def test_a_failing_rank_shows_its_traceback_and_raises_launch_error(kernel):
    out = kernel.run(
        "def train():\n"
        "    if PartialState().process_index == 1:\n"
        "        raise ValueError('loss is nan')\n"
        "    time.sleep(60)\n"
        "notebook_launcher(train, num_processes=2)"
    )
    assert out.error is not None and out.error["ename"] == "LaunchError"
    assert "[rank 1] failed: ValueError: loss is nan" in out.stderr
    # the user's frame, with its source line, shown once: in the error, not again in the live output
    assert "raise ValueError('loss is nan')" in out.traceback
    assert "raise ValueError" not in out.stderr + out.stdout
    assert "rank 1 (first to fail) failed: ValueError: loss is nan" in out.traceback
    assert "rank 0 was stopped" in out.traceback
    check = kernel.run(
        "try:\n"
        "    notebook_launcher(train, num_processes=2)\n"
        "except LaunchError as e:\n"
        "    print('FAILURES', [(f.rank, f.exc_type, f.first) for f in e.failures], e.stopped)"
    )
    assert "FAILURES [(1, 'ValueError', True)] [0]" in check.stdout
    _assert_no_children(kernel)


def test_a_rank_that_calls_os_exit_is_reported_with_its_exit_code(kernel):
    out = kernel.run(
        "def quits():\n"
        "    if PartialState().process_index == 1:\n"
        "        os._exit(3)\n"
        "    time.sleep(60)\n"
        "notebook_launcher(quits, num_processes=2)"
    )
    assert out.error is not None and out.error["ename"] == "LaunchError"
    assert "rank 1 (first to fail) exited with code 3" in out.traceback
    _assert_no_children(kernel)


def test_fork_runs_a_function_using_a_lock_and_an_open_file_spawn_names_them_before_start(kernel):
    out = kernel.run(
        "import tempfile\n"
        "lock = threading.Lock()\n"
        "log = tempfile.TemporaryFile('w+')\n"
        "def uses_lock():\n"
        "    with lock:\n"
        "        log.write('x')\n"
        "        return PartialState().process_index\n"
        "print('RESULT', notebook_launcher(uses_lock, num_processes=2))"
    )
    assert out.error is None, out.traceback
    assert "RESULT [0, 1]" in out.stdout
    out = kernel.run("notebook_launcher(uses_lock, num_processes=2, start_method='spawn')")
    assert out.error is not None and out.error["ename"] == "PayloadError"
    assert "the global 'lock' used by the function 'uses_lock'" in out.error["evalue"]
    assert "Launching" not in out.stdout  # nothing started
    assert "accel_nb/" not in out.traceback  # the user's cell line only, none of the launcher's frames
    out = kernel.run(
        "batches = (i for i in range(3))\n"
        "notebook_launcher(lambda b: 1, args=(batches,), num_processes=2, start_method='spawn')"
    )
    assert out.error is not None and "args[0]" in out.error["evalue"] and "generator" in out.error["evalue"]
    assert "Launching" not in out.stdout
    _assert_no_children(kernel)


def test_errors_show_the_users_frames_only_and_spawned_tracebacks_show_notebook_lines(kernel):
    out = kernel.run(
        "def fails():\n"
        "    x = 1\n"
        "    raise KeyError('no such column')\n"
        "notebook_launcher(fails, num_processes=2, start_method='spawn')",
        timeout=180,
    )
    assert out.error is not None and out.error["ename"] == "LaunchError"
    assert "accel_nb/" not in out.traceback, out.traceback
    # the user's line
    assert "notebook_launcher(fails, num_processes=2, start_method='spawn')" in out.traceback
    # the rank's frame shows the cell's source line
    assert "raise KeyError('no such column')" in out.traceback
    out = kernel.run("notebook_launcher(fails, num_processes=0)")
    assert out.error is not None and out.error["ename"] == "LaunchSetupError"
    assert "accel_nb/" not in out.traceback and "num_processes=0 must be at least 1" in out.traceback
    _assert_no_children(kernel)


def test_hang_watchdog_shows_where_each_rank_is_stuck(kernel):
    out = kernel.run(
        "def stuck():\n"
        "    PartialState()\n"
        "    time.sleep(300)\n"
        "notebook_launcher(stuck, num_processes=2, timeout=2)",
        timeout=60,
    )
    assert out.error is not None and out.error["ename"] == "LaunchError"
    assert "the launch hung" in out.traceback
    assert "[rank 0] Python stacks (hang watchdog)" in out.stderr and "[rank 1] Python stacks" in out.stderr
    assert "in stuck" in out.stderr
    _assert_no_children(kernel)


def test_interrupting_the_kernel_shows_every_ranks_stack_stops_them_and_raises_keyboard_interrupt(kernel):
    msg_id = kernel.kc.execute(
        "def forever():\n"
        "    rank = PartialState().process_index\n"
        "    print('rank running', rank, flush=True)\n"
        "    time.sleep(300)\n"
        "notebook_launcher(forever, num_processes=2)"
    )
    seen = kernel.wait_for_text(msg_id, "running 1")  # both ranks run (rank 1's line may come second)
    seen += kernel.wait_for_text(msg_id, "running 0") if "running 0" not in seen else ""
    assert "running 0" in seen and "running 1" in seen
    assert len(_live_children(kernel)) >= 2
    kernel.interrupt()  # the stop button
    out = kernel.collect(msg_id, timeout=30)
    assert out.error is not None and out.error["ename"] == "KeyboardInterrupt"
    for rank in (0, 1):  # where every rank was when the user stopped it
        assert f"[rank {rank}] Python stacks (when stopped)" in out.stderr, out.stderr
    assert out.stderr.count("in forever") >= 2
    assert "interrupted: every rank was stopped" in out.stderr
    # the cell's error is a short summary with each rank's line, none of the launcher's frames
    tb = out.traceback
    assert "the launch was interrupted: every rank was stopped" in tb, tb
    for rank in (0, 1):
        assert re.search(
            rf"rank {rank}: at forever, line 4 of <ipython-input-|rank {rank}: at forever, line 4 of ", tb
        ), tb
    for internal in ("supervisor.py", "_read_and_reap", "selectors.py", "accel_nb/"):
        assert internal not in tb, (internal, tb)
    _assert_no_children(kernel, within=5.0)
    # the next launch works at once
    again = kernel.run("print(notebook_launcher(lambda: 7, num_processes=2))")
    assert "[7, 7]" in again.stdout, again.text


def test_a_rank_that_only_lost_its_peer_is_reported_as_stopped_not_as_a_second_failure(kernel):
    out = kernel.run(
        "import torch, torch.distributed as dist\n"
        "def one_dies():\n"
        "    state = PartialState()\n"
        "    dist.barrier()\n"
        "    if state.process_index == 1:\n"
        "        os._exit(3)\n"
        "    dist.all_reduce(torch.ones(1))  # rank 0 waits for the dead peer: gloo breaks\n"
        "try:\n"
        "    notebook_launcher(one_dies, num_processes=2)\n"
        "except LaunchError as e:\n"
        "    print('FAILURES', [(f.rank, f.kind.value, f.exc_type) for f in e.failures], 'STOPPED', e.stopped)\n"
        "    print(str(e))",
        timeout=120,
    )
    assert out.error is None, out.traceback
    assert "FAILURES [(1, 'exit_code', None)] STOPPED [0]" in out.stdout, out.text
    assert "Connection closed by peer" not in out.stdout + out.stderr  # not shown as rank 0's own failure
    _assert_no_children(kernel)


def test_after_cuda_was_touched_the_launch_uses_spawn_and_names_the_line(kernel):
    # no GPU here: the touch goes through torch.cuda's lazy initialisation (and fails), which the
    # recorder notes; tests/cuda_pretend then makes the probe report "CUDA initialised"
    out = kernel.run(
        "import torch\n"
        "import accel_nb.notebook.launcher\n"
        "try:\n"
        "    torch.cuda.current_device()\n"
        "except Exception:\n"
        "    pass\n" + KERNEL_PRETEND + "def where():\n"
        "    s = PartialState()\n"
        "    return (s.process_index, os.environ.get('ACCEL_NB_FORKED'))\n"
        "try:\n"
        "    print('RESULT', notebook_launcher(where, num_processes=2))\n"
        "finally:\n"
        "    " + KERNEL_STOP_PRETENDING,
        timeout=180,
    )
    assert out.error is None, out.traceback
    assert "RESULT [(0, None), (1, None)]" in out.stdout  # spawned, not forked
    lines = [line for line in out.stdout.splitlines() if "using spawn instead of fork" in line]
    assert len(lines) == 1
    assert "CUDA was initialised in this kernel before the launch by line 4 of a notebook cell" in lines[0]
    assert "torch.cuda.current_device()" in lines[0]
    _assert_no_children(kernel)


def test_two_hundred_launches_in_a_row_hold_no_more_fds_threads_or_processes_than_after_the_first(kernel):
    # with the live widget: a display thread per launch that sends comm messages makes ipykernel open
    # one zmq pipe (an anon_inode:[eventfd]) per thread, closed only ~10 s after the thread ends
    out = kernel.run(
        "import psutil\n"
        "from tests.process_helpers import live_descendants\n"
        "me = psutil.Process()\n"
        "def held():\n"
        "    return me.num_fds(), len(os.listdir('/proc/self/task')), len(live_descendants(me))\n"
        "notebook_launcher(lambda: 0, num_processes=2, cpu=True, progress='widget')\n"
        "from accel_nb.launch import preimport\n"
        "preimport.wait()  # the one background import of the session is over\n"
        "after_first = held()\n"
        "ok = all(notebook_launcher(lambda: PartialState().process_index, num_processes=2, cpu=True,\n"
        "                           progress='widget') == [0, 1]\n"
        "         for _ in range(200))\n"
        "import json\n"
        "print('HELD', json.dumps([ok, after_first, held()]))",
        timeout=600,
    )
    assert out.error is None, out.traceback
    ok, first, last = json.loads(out.stdout.split("HELD", 1)[1])
    assert ok is True
    fds, threads, processes = last
    assert fds <= first[0] and threads <= first[1] and processes == 0, (first, last)
    _assert_no_children(kernel)


def test_a_training_function_with_accelerator_trains_on_two_processes(kernel):
    pytest.importorskip("accel_nb.accelerator")
    out = kernel.run(
        "import torch\n"
        "from accel_nb import Accelerator, set_seed\n"
        "def train(steps=30):\n"
        "    set_seed(0)\n"
        "    accelerator = Accelerator()\n"
        "    x = torch.linspace(-1, 1, 64).unsqueeze(1)\n"
        "    data = torch.utils.data.TensorDataset(x, 3 * x + 1)\n"
        "    loader = torch.utils.data.DataLoader(data, batch_size=8, shuffle=True)\n"
        "    model = torch.nn.Linear(1, 1)\n"
        "    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "    model, opt, loader = accelerator.prepare(model, opt, loader)\n"
        "    for epoch in range(steps):\n"
        "        for xb, yb in loader:\n"
        "            loss = torch.nn.functional.mse_loss(model(xb), yb)\n"
        "            accelerator.backward(loss)\n"
        "            opt.step(); opt.zero_grad()\n"
        "    final = accelerator.reduce(loss.detach(), reduction='mean')\n"
        "    return accelerator.num_processes, float(final), accelerator.unwrap_model(model).weight.item()\n"
        "res = notebook_launcher(train, num_processes=2)\n"
        "print('TRAINED', res)",
        timeout=180,
    )
    assert out.error is None, out.traceback
    res = eval(out.stdout.split("TRAINED", 1)[1].strip())
    (n0, loss0, w0), (n1, loss1, w1) = res
    assert n0 == n1 == 2
    assert loss0 == pytest.approx(loss1) and loss0 < 0.05
    assert w0 == pytest.approx(w1) and w0 == pytest.approx(3.0, abs=0.2)  # both ranks hold the same weights
    _assert_no_children(kernel)


def test_the_default_display_in_a_kernel_is_the_live_widget(kernel):
    out = kernel.run(
        "def counts():\n"
        "    from accel_nb import progress\n"
        "    total = 0\n"
        "    for i in progress(range(5), desc='count'):\n"
        "        total += i\n"
        "    print('counted', total)\n"
        "    return total\n"
        "print('RESULT', notebook_launcher(counts, num_processes=2, progress='widget'))",
        timeout=120,
    )
    assert out.error is None, out.traceback
    assert "RESULT [10, 10]" in out.stdout
    assert any(c["msg_type"] == "comm_open" for c in out.comms)  # a widget was created for the launch
    _assert_no_children(kernel)


def test_ranks_and_the_spawn_server_die_with_a_crashed_kernel():
    import os
    import signal

    with KernelSession(env={"ACCEL_NB_PROGRESS": "text"}) as k:
        out = k.run(
            SETUP + "print(notebook_launcher(lambda: os.getpid(), num_processes=2, start_method='spawn'))",
            timeout=180,
        )
        assert out.error is None, out.traceback
        msg_id = k.kc.execute(
            "def forever():\n"
            "    print('pid', os.getpid(), flush=True)\n"
            "    time.sleep(300)\n"
            "notebook_launcher(forever, num_processes=2)"
        )
        k.wait_for_text(msg_id, "pid ", count=2)
        descendants = k.children()
        assert len(descendants) >= 3  # two ranks and the spawn server
        os.kill(k.pid, signal.SIGKILL)  # the kernel crashes
        gone, alive = psutil.wait_procs(descendants, timeout=10)
        assert alive == []


def test_a_cell_that_imports_the_launcher_and_torch_distributed_and_a_failing_launch_leave_the_kernel_alive():
    """A fresh kernel: the pre-import of torch runs between cells only, never beside the cell's own
    torch imports (the cell that imported both used to kill the kernel with SIGABRT in torch's start-up)."""
    with KernelSession(env={"ACCEL_NB_PROGRESS": "text"}) as k:
        out = k.run(
            "from accel_nb import notebook_launcher, LaunchError\n"
            "import torch.distributed.elastic.multiprocessing.errors\n"
            "print('FIRST CELL done')",
            timeout=180,
        )
        assert out.error is None and "FIRST CELL done" in out.stdout, (out.traceback, out.stdout)
        out = k.run(  # this cell waited for the import that ran while the kernel was idle
            "import sys, threading\n"
            "print('IMPORTED', 'torch._dynamo' in sys.modules,\n"
            "      [t.name for t in threading.enumerate() if t.name == 'accel_nb-preimport'])",
            timeout=180,
        )
        assert out.error is None and "IMPORTED True []" in out.stdout, (out.traceback, out.stdout)
        out = k.run(
            "def boom():\n"
            "    raise ValueError('boom in the rank')\n"
            "try:\n"
            "    notebook_launcher(boom, num_processes=2)\n"
            "except LaunchError as err:\n"
            "    print('RAISED', type(err).__name__, 'boom in the rank' in str(err))",
            timeout=180,
        )
        assert out.error is None and "RAISED LaunchError True" in out.stdout, (out.traceback, out.stdout)
