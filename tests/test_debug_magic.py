"""``%accelerate debug``'s words after a one-shot launch: the ``%accelerate start`` line with the cell's flags."""

from __future__ import annotations

import pytest

from accel_nb.notebook.debug_magic import start_line


@pytest.mark.parametrize(
    ("cell_line", "start"),
    [
        ("-n 2 --cpu", "%accelerate start -n 2 --cpu"),
        ("-n 2 --cpu --return model,history --rank 1", "%accelerate start -n 2 --cpu"),
        (
            "--rank=all --timeout 30 --mixed_precision bf16 -n 4",
            "%accelerate start --timeout 30 --mixed_precision bf16 -n 4",
        ),
        ("--start_method spawn --use_port 29600", "%accelerate start --start_method spawn --use_port 29600"),
        ("", "%accelerate start"),
    ],
)
def test_start_line_keeps_the_launch_flags_and_drops_the_cells(cell_line, start):
    assert start_line(cell_line) == start
