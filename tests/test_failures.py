"""The failure model: one wording per kind, no sentinel in the words, one rule for who failed first."""

from __future__ import annotations

import pickle

from accel_nb.events import Failure, FailureKind
from accel_nb.launch.errors import LaunchError, RankFailure
from accel_nb.launch.failures import FirstToFail, describe, first_failure


def _exit_code(rank: int = 1) -> RankFailure:
    return RankFailure(rank, None, "the process ended abruptly", exit_code=3, kind=FailureKind.EXIT_CODE)


def test_each_kind_reads_naturally_without_a_sentinel():
    assert (
        describe(_exit_code())
        == "rank 1 exited with code 3 without a Python exception: the process ended abruptly"
    )
    killed = RankFailure(0, None, "killed by SIGKILL", exit_code=-9, signal=9, kind=FailureKind.SIGNAL)
    assert describe(killed).startswith("rank 0 died from SIGKILL: likely out of memory")
    assert (
        describe(RankFailure(2, None, "no progress for 5 s", kind=FailureKind.HANG))
        == "rank 2 hung: no progress for 5 s"
    )
    assert describe(RankFailure(1, "ValueError", "boom")) == "rank 1 failed: ValueError: boom"
    for words in (describe(_exit_code()), describe(killed)):
        assert "ExitCode" not in words and "None" not in words


def test_the_forms_a_reporter_uses():
    event = Failure(1, None, "the process ended abruptly", "", kind=FailureKind.EXIT_CODE, exit_code=3)
    assert describe(event, who="[rank 1]", brief=True).startswith("[rank 1] exited with code 3 without")
    assert describe(event, form="label") == "exit code 3"
    assert (
        describe(Failure(1, "ValueError", "bad\nmore", ""), form="detail", brief=True)
        == "ValueError: bad ..."
    )
    stopped = Failure(0, "KeyboardInterrupt", "", "", kind=FailureKind.INTERRUPTED)
    assert describe(stopped, who="") == "stopped: KeyboardInterrupt"


def test_first_to_fail_is_the_first_recorded_and_leads_the_error():
    order = FirstToFail()
    assert [order.record(1), order.record(0)] == [True, False] and order.rank == 1
    failures = [RankFailure(0, "RuntimeError", "peer"), _exit_code(1)]
    failures[1].first = True
    assert first_failure(failures) is failures[1]
    err = LaunchError(failures)
    assert (
        str(err)
        .splitlines()[0]
        .startswith("rank 1 (first to fail) exited with code 3 without a Python exception")
    )
    again = pickle.loads(pickle.dumps(err))
    assert again.failures[0].kind is FailureKind.EXIT_CODE and again.failures[0].first


def test_accel_nb_launch_words_torchrun_failures_with_the_same_model():
    from accel_nb.launch.elastic.agent_failures import ended
    from accel_nb.launch.failures import first_failure_line

    assert first_failure_line(ended(1, 1), "ValueError: boom") == (
        "rank 1 failed first: ValueError: boom (exited with code 1)"
    )
    assert first_failure_line(ended(0, -9), None).startswith(
        "rank 0 failed first: was killed by SIGKILL (likely out of memory"
    )
    assert first_failure_line(ended(0, -6), "RuntimeError: x").startswith(
        "rank 0 failed first: RuntimeError: x (then the process got SIGABRT (aborted by native code"
    )
