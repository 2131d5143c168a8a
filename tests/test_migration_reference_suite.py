"""What the reference's own test suite met under a rename (issue 38's remaining goal), side by side.

Each test runs the lines of one of accelerate's tests (or test scripts) that failed under
``accelerate`` -> ``accel_nb`` under both libraries where the reference runs them here, and asserts
the same result.
"""

from __future__ import annotations

import importlib

import pytest
import torch

from tests.dist_helpers import run_ranks

pytest.importorskip("accelerate")

LIBRARIES = ("accel_nb", "accelerate")


# -- test_utils/scripts/test_ops.py imports copy_tensor_to_devices ----------------------------------
def _copy_from_the_main_process(library):
    operations = importlib.import_module(f"{library}.utils.operations")
    state = importlib.import_module(library).PartialState(cpu=True)
    tensor = torch.tensor([1, 2, 3], dtype=torch.int) if state.is_main_process else None
    copied = operations.copy_tensor_to_devices(tensor)
    shape, code = operations.gather_tensor_shape(tensor)
    return copied.tolist(), copied.dtype, list(shape), operations.TENSOR_INT_TO_DTYPE[code]


@pytest.mark.multiproc
@pytest.mark.parametrize("world_size", [1, 2])
def test_copy_tensor_to_devices_gives_every_process_the_main_process_tensor(world_size):
    got = run_ranks(_copy_from_the_main_process, world_size=world_size, args=("accel_nb",))
    assert got == [([1, 2, 3], torch.int32, [3], torch.int32)] * world_size
    from accel_nb.utils import copy_tensor_to_devices  # also at accel_nb.utils, as the reference's

    assert copy_tensor_to_devices is importlib.import_module("accel_nb.ops").copy_tensor_to_devices


def test_the_dtype_codes_are_the_references():
    reference = importlib.import_module("accelerate.utils.operations")
    ours = importlib.import_module("accel_nb.utils.operations")
    assert ours.TENSOR_TYPE_TO_INT == reference.TENSOR_TYPE_TO_INT
    assert ours.TENSOR_INT_TO_DTYPE == reference.TENSOR_INT_TO_DTYPE


# -- tests/test_scheduler.py marks a step as skipped through optimizer._is_overflow -------------------
def _lambda_schedule(library):
    accelerator = importlib.import_module(library).Accelerator(cpu=True)
    model = torch.nn.Linear(2, 4)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda=lambda n: 1 - n / 10)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    lrs = []
    for overflow in (False, True, False):
        optimizer._is_overflow = overflow  # what the fp16 scaler's skipped step sets
        scheduler.step()
        lrs.append((scheduler.get_last_lr()[0], optimizer.step_was_skipped))
    return lrs


@pytest.mark.multiproc
def test_a_step_marked_overflowed_holds_the_schedule_like_the_reference():
    ours, reference = (run_ranks(_lambda_schedule, world_size=1, args=(lib,))[0] for lib in LIBRARIES)
    assert ours == reference == [(0.9, False), (0.9, True), (0.8, False)]


# -- test_utils/scripts/test_script.py: state.destroy_process_group() after AcceleratorState._reset_state()
def _state_after_reset(library):
    accelerator = importlib.import_module(library).Accelerator(cpu=True)
    state = accelerator.state
    importlib.import_module(f"{library}.state").AcceleratorState._reset_state()
    seen = {
        "main": state.is_main_process,
        "local_main": state.is_local_main_process,
        "last": state.is_last_process,
        "distributed": state.use_distributed,
    }
    state.wait_for_everyone()
    with state.main_process_first(), state.local_main_process_first():
        pass
    with state.split_between_processes([1, 2, 3, 4]) as mine:
        seen["split"] = list(mine)
    with pytest.raises(AttributeError, match="This happens if `AcceleratorState._reset_state"):
        _ = state.device  # the topology copied into the AcceleratorState is gone, as in the reference
    state.destroy_process_group()
    return seen


@pytest.mark.multiproc
def test_a_reset_accelerator_state_still_answers_from_the_partial_state_like_the_reference():
    ours, reference = (run_ranks(_state_after_reset, world_size=2, args=(lib,)) for lib in LIBRARIES)
    assert ours == reference
    assert [r["split"] for r in ours] == [[1, 2], [3, 4]]
