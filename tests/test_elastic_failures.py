"""Which failed rank ``accel-nb launch`` names first, from torchrun's failure records and the ranks' logs."""

from __future__ import annotations

import os
import signal
from types import SimpleNamespace

from accel_nb.launch.elastic.agent_failures import failure_summary, order_failures


def _log(log_dir, local_rank: int, text: str, mtime: float) -> None:
    folder = log_dir / "run_0" / "attempt_0" / str(local_rank)
    folder.mkdir(parents=True)
    path = folder / "stderr.log"
    path.write_text(text)
    os.utime(path, (mtime, mtime))


def _failure(local_rank: int, exitcode: int, timestamp: int = 1000) -> SimpleNamespace:
    return SimpleNamespace(local_rank=local_rank, exitcode=exitcode, timestamp=timestamp)


def test_a_rank_that_raised_comes_before_one_aborted_in_the_same_second(tmp_path):
    # rank 0: gloo's threads aborted it after its peer vanished; nothing Python in its log, and the
    # log was last written before rank 1's traceback (seen in CI: rank 0 was named first)
    _log(tmp_path, 0, "[default0]:step 3\n", mtime=100.0)
    _log(
        tmp_path,
        1,
        "[default1]:Traceback (most recent call last):\n"
        "[default1]:ValueError: rank 1 was asked to fail (test)\n",
        mtime=200.0,
    )
    failures = {0: _failure(0, -signal.SIGABRT), 1: _failure(1, 1)}
    assert [rank for rank, _ in order_failures(failures, str(tmp_path))] == [1, 0]
    summary = failure_summary(failures, "train.py", str(tmp_path))
    assert "rank 1 failed first: ValueError: rank 1 was asked to fail (test) (exited with code 1)" in summary
    assert "also failed: rank(s) 0" in summary


def test_a_peer_loss_printed_by_cpp_is_a_symptom(tmp_path):
    _log(
        tmp_path,
        0,
        "terminate called after throwing an instance of 'gloo::IoException'\n"
        "  what():  [pair.cc:534] Connection closed by peer [127.0.0.1]:4242\n",
        mtime=100.0,
    )
    _log(tmp_path, 1, "RuntimeError: bad shapes\n", mtime=200.0)
    failures = {0: _failure(0, -signal.SIGABRT, 999), 1: _failure(1, 1, 1000)}
    assert [rank for rank, _ in order_failures(failures, str(tmp_path))] == [1, 0]


def test_a_rank_killed_without_a_traceback_is_still_the_cause_when_it_died_first(tmp_path):
    _log(tmp_path, 0, "", mtime=100.0)
    _log(tmp_path, 1, "RuntimeError: something unrelated\n", mtime=200.0)
    failures = {0: _failure(0, -signal.SIGKILL, 999), 1: _failure(1, -signal.SIGTERM, 1000)}
    ordered = order_failures(failures, str(tmp_path))
    assert [rank for rank, _ in ordered] == [0, 1]
    assert "rank 0 failed first: was killed by SIGKILL" in failure_summary(failures, "t.py", str(tmp_path))
