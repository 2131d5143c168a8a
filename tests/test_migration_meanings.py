"""Issue 33's "different meanings", side by side with accelerate: the same lines under both libraries.

Each test runs the same code with ``accel_nb`` and with the reference and asserts the same result.
"""

from __future__ import annotations

import importlib
import logging

import pytest

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
