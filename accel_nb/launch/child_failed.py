"""A failed launch that ``except ChildFailedError:`` also catches: what the reference's launchers raise.

torch's elastic agent (behind the reference's ``notebook_launcher``) raises
``torch.distributed.elastic.multiprocessing.errors.ChildFailedError`` when a rank fails;
``notebook_launcher`` raises this ``LaunchError`` instead, which is accel_nb's error (every failing
rank in ``.failures``) and an instance of ``ChildFailedError`` too. Importing this module imports
torch's elastic package, so the launcher imports it only once a launch has failed.

    try:
        notebook_launcher(train, num_processes=2)
    except ChildFailedError as err:        # code written for the reference
        print(err.get_first_failure())      # (rank, accel_nb's RankFailure)
"""

from __future__ import annotations

from typing import Any

from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

from . import errors

__all__ = ["LaunchError", "as_child_failed"]


class LaunchError(errors.LaunchError, ChildFailedError):
    """accel_nb's ``LaunchError`` that is also torch's ``ChildFailedError`` (same name, same report)."""

    name = "notebook_launcher"

    def get_first_failure(self) -> tuple[int, Any]:
        """(rank, its ``RankFailure``) of the first rank to fail; torch's gives a ``ProcessFailure`` there."""
        first = self.first
        return (first.rank, first) if first is not None else (-1, None)

    def format_msg(self, boarder_delim: str = "=", section_delim: str = "-") -> str:
        """The report (``str(err)``), in place of torch's table of failures."""
        return self.report()


def as_child_failed(err: errors.LaunchError) -> LaunchError:
    """``err`` as the ``LaunchError`` that is also a ``ChildFailedError`` (the same fields)."""
    if isinstance(err, ChildFailedError):
        return err  # type: ignore[return-value]
    new = LaunchError(err.failures, headline=err.headline, stopped=err.stopped, log_dir=err.log_dir)
    new.__dict__.update(err.__dict__)
    return new
