"""Accelerator methods and options a migrated script calls, side by side with accelerate (2 gloo ranks
where the behaviour is distributed): get_state_dict, the save/load pre-hooks, trigger_sync_in_backward,
join_uneven_inputs, profile, AutocastKwargs, ProfileKwargs and GradientAccumulationPlugin."""

from __future__ import annotations

import importlib
import os

import pytest
import torch

from accel_nb.accelerator.sync_contexts import shard_sampler
from tests.dist_helpers import run_ranks

pytest.importorskip("accelerate")
pytestmark = pytest.mark.multiproc

LIBRARIES = ["accel_nb", "accelerate"]


def _accelerator(library, **kwargs):
    return importlib.import_module(library).Accelerator(cpu=True, **kwargs)


def _utils(library):
    return importlib.import_module(f"{library}.utils")


def _rank_data(rank, n=4):
    g = torch.Generator().manual_seed(100 + rank)
    return torch.randn(n, 3, generator=g), torch.randn(n, 1, generator=g)


def _state_dict_and_trigger(library):
    """get_state_dict's keys both ways, and the gradients after no_sync + trigger_sync_in_backward."""
    torch.manual_seed(0)
    acc = _accelerator(library)
    model = torch.nn.Linear(3, 1)
    model = acc.prepare(model)
    x, y = _rank_data(acc.process_index)
    with acc.no_sync(model):
        loss_a = torch.nn.functional.mse_loss(model(x[:2]), y[:2])
    acc.backward(loss_a)
    unsynced = model.module.weight.grad.clone() if hasattr(model, "module") else model.weight.grad.clone()
    with acc.trigger_sync_in_backward(model):
        acc.backward(torch.nn.functional.mse_loss(model(x[2:]), y[2:]))
    inner = acc.unwrap_model(model)
    return {
        "unwrapped": sorted(acc.get_state_dict(model)),
        "wrapped": sorted(acc.get_state_dict(model, unwrap=False)),
        "unsynced": unsynced,
        "grad": inner.weight.grad.clone(),
    }


@pytest.mark.parametrize("library", LIBRARIES)
def test_get_state_dict_and_trigger_sync_in_backward(library):
    results = run_ranks(_state_dict_and_trigger, world_size=2, args=(library,))
    for r in results:
        assert r["unwrapped"] == ["bias", "weight"]
        assert r["wrapped"] == ["module.bias", "module.weight"]
    # the first backward stayed local, the triggered one all-reduced the sum of both
    assert not torch.allclose(results[0]["unsynced"], results[1]["unsynced"])
    assert torch.allclose(results[0]["grad"], results[1]["grad"])


def test_trigger_sync_gradients_equal_the_reference():
    ours = run_ranks(_state_dict_and_trigger, world_size=2, args=("accel_nb",))
    theirs = run_ranks(_state_dict_and_trigger, world_size=2, args=("accelerate",))
    for a, b in zip(ours, theirs):
        assert torch.allclose(a["grad"], b["grad"], atol=1e-6)


def _hooks(library, folder):
    """Save and load with pre-hooks that take the second model out of the library's hands."""
    torch.manual_seed(0)
    acc = _accelerator(library)
    first, second = acc.prepare(torch.nn.Linear(3, 2), torch.nn.Linear(2, 1))
    calls = []

    def save_hook(models, weights, output_dir):
        calls.append(("save", len(models), [sorted(k.removeprefix("module.") for k in w) for w in weights]))
        if acc.is_main_process:
            torch.save(acc.unwrap_model(models[1]).state_dict(), os.path.join(output_dir, "second.pt"))
        weights.pop(1)

    def load_hook(models, input_dir):
        calls.append(("load", len(models), os.path.basename(input_dir)))
        acc.unwrap_model(models[1]).load_state_dict(torch.load(os.path.join(input_dir, "second.pt")))
        models.pop(1)

    save_handle = acc.register_save_state_pre_hook(save_hook)
    load_handle = acc.register_load_state_pre_hook(load_hook)
    saved = [p.detach().clone() for p in (*first.parameters(), *second.parameters())]
    acc.save_state(folder)
    acc.wait_for_everyone()  # the reference's save_state returns before process 0's hook has written
    with torch.no_grad():
        for p in (*first.parameters(), *second.parameters()):
            p.zero_()
    acc.load_state(folder)
    restored = all(torch.equal(a, b) for a, b in zip(saved, (*first.parameters(), *second.parameters())))
    save_handle.remove()
    load_handle.remove()
    acc.save_state(folder + "_again")
    acc.wait_for_everyone()
    acc.load_state(folder + "_again")
    return calls, restored


@pytest.mark.parametrize("library", LIBRARIES)
def test_save_and_load_pre_hooks(tmp_path, library):
    results = run_ranks(_hooks, world_size=2, args=(library, str(tmp_path / "ckpt")))
    for calls, restored in results:
        assert restored
        # called once each on every process, with every model; removed handles are not called again
        assert calls == [
            ("save", 2, [["bias", "weight"], ["bias", "weight"]]),
            ("load", 2, "ckpt"),
        ]


def _uneven(even_batches):
    """5 samples in batches of 1 over 2 ranks: 3 batches on rank 0, 2 on rank 1 without even batches."""
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(0)
    acc = _accelerator("accel_nb")
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(TensorDataset(torch.randn(5, 3), torch.randn(5, 1)), batch_size=1)
    model, optimizer, loader = acc.prepare(model, optimizer, loader)
    steps = 0
    with acc.join_uneven_inputs([model], even_batches=even_batches):
        inside = shard_sampler(loader).even_batches
        for x, y in loader:
            acc.backward(torch.nn.functional.mse_loss(model(x), y))
            optimizer.step()
            optimizer.zero_grad()
            steps += 1
    return steps, inside, shard_sampler(loader).even_batches, acc.unwrap_model(model).weight.detach().clone()


def test_join_uneven_inputs_lets_ranks_with_fewer_batches_finish():
    results = run_ranks(_uneven, world_size=2, args=(False,), timeout=60)
    assert [r[0] for r in results] == [3, 2]
    assert [r[1] for r in results] == [False, False]  # the override holds inside the block...
    assert [r[2] for r in results] == [True, True]  # ...and is undone after it
    assert torch.allclose(results[0][3], results[1][3])  # the joined rank kept the weights in step
    even = run_ranks(_uneven, world_size=2, args=(None,), timeout=60)
    assert [r[0] for r in even] == [3, 3]


def test_join_uneven_inputs_is_a_no_op_on_one_process():
    from accel_nb import Accelerator

    acc = Accelerator(cpu=True)
    model = acc.prepare(torch.nn.Linear(2, 2))
    with acc.join_uneven_inputs([model], even_batches=False) as joined:
        assert joined == [model]


def _profile(library, folder, use_handler_arg):
    utils = _utils(library)
    handler = utils.ProfileKwargs(activities=["cpu"], record_shapes=True, output_trace_dir=folder)
    if use_handler_arg:
        acc = _accelerator(library)
        context = acc.profile(handler)
    else:
        acc = _accelerator(library, kwargs_handlers=[handler])
        context = acc.profile()
    with context as prof:
        torch.mm(torch.ones(8, 8), torch.ones(8, 8))
    names = {e.key for e in prof.key_averages()}
    return "aten::mm" in names, sorted(os.listdir(folder))


@pytest.mark.parametrize("library", LIBRARIES)
@pytest.mark.parametrize("use_handler_arg", [True, False])
def test_profile_writes_one_chrome_trace_per_process(tmp_path, library, use_handler_arg):
    folder = str(tmp_path / "traces")
    results = run_ranks(_profile, world_size=2, args=(library, folder, use_handler_arg))
    for saw_mm, files in results:
        assert saw_mm
        assert files == ["profile_0.json", "profile_1.json"]


@pytest.mark.parametrize("library", LIBRARIES)
def test_profile_without_handler_profiles_and_writes_nothing(tmp_path, library, monkeypatch):
    monkeypatch.chdir(tmp_path)
    results = run_ranks(_profile_plain, world_size=1, args=(library,))
    assert results == [True]
    assert os.listdir(tmp_path) == []


def _profile_plain(library):
    acc = _accelerator(library)
    with acc.profile() as prof:
        torch.mm(torch.ones(4, 4), torch.ones(4, 4))
    return "aten::mm" in {e.key for e in prof.key_averages()}


def _autocast(library):
    utils = _utils(library)
    acc = _accelerator(library, mixed_precision="bf16", kwargs_handlers=[utils.AutocastKwargs(enabled=False)])
    layer = torch.nn.Linear(2, 2)
    with acc.autocast():
        off = layer(torch.ones(1, 2)).dtype
    with acc.autocast(autocast_handler=utils.AutocastKwargs(enabled=True)):
        on = layer(torch.ones(1, 2)).dtype
    return str(off), str(on)


@pytest.mark.parametrize("library", LIBRARIES)
def test_autocast_kwargs_set_the_autocast(library):
    assert run_ranks(_autocast, world_size=1, args=(library,)) == [("torch.float32", "torch.bfloat16")]


def _plugin_accumulation(library, sync_each_batch):
    """Two accumulation steps: the gradients after the first (non-updating) backward, per rank."""
    utils = _utils(library)
    plugin = utils.GradientAccumulationPlugin(num_steps=2, sync_each_batch=sync_each_batch)
    acc = _accelerator(library, gradient_accumulation_plugin=plugin)
    torch.manual_seed(0)
    model = acc.prepare(torch.nn.Linear(3, 1))
    x, y = _rank_data(acc.process_index)
    with acc.accumulate(model):
        acc.backward(torch.nn.functional.mse_loss(model(x), y))
        first = (acc.sync_gradients, acc.unwrap_model(model).weight.grad.clone())
    with acc.accumulate(model):
        acc.backward(torch.nn.functional.mse_loss(model(x), y))
        second = (acc.sync_gradients, acc.unwrap_model(model).weight.grad.clone())
    return acc.gradient_accumulation_steps, first, second


@pytest.mark.parametrize("sync_each_batch", [False, True])
def test_gradient_accumulation_plugin_matches_the_reference(sync_each_batch):
    ours = run_ranks(_plugin_accumulation, world_size=2, args=("accel_nb", sync_each_batch))
    theirs = run_ranks(_plugin_accumulation, world_size=2, args=("accelerate", sync_each_batch))
    for a, b in zip(ours, theirs):
        assert a[0] == b[0] == 2
        assert a[1][0] == b[1][0] is False and a[2][0] == b[2][0] is True
        assert torch.allclose(a[1][1], b[1][1], atol=1e-6) and torch.allclose(a[2][1], b[2][1], atol=1e-6)
    # with sync_each_batch the first, non-updating backward is already all-reduced
    assert torch.allclose(ours[0][1][1], ours[1][1][1]) is sync_each_batch


def test_gradient_accumulation_plugin_and_steps_together_is_an_error():
    from accel_nb import Accelerator
    from accel_nb.utils import GradientAccumulationPlugin

    with pytest.raises(ValueError, match="not both"):
        Accelerator(
            cpu=True, gradient_accumulation_steps=2, gradient_accumulation_plugin=GradientAccumulationPlugin()
        )


def test_unwrap_model_keep_torch_compile():
    from accel_nb import Accelerator

    acc = Accelerator(cpu=True)
    model = torch.nn.Linear(2, 2)
    compiled = torch.compile(acc.prepare(model))
    assert acc.unwrap_model(compiled, keep_torch_compile=False) is model
    assert acc.unwrap_model(compiled)._orig_mod is model


def _window_across_epochs(library):
    """sync_gradients per batch over two passes of a 3-batch loader with num_steps=2."""
    from torch.utils.data import DataLoader

    utils = _utils(library)
    plugin = utils.GradientAccumulationPlugin(num_steps=2, sync_with_dataloader=False)
    acc = _accelerator(library, gradient_accumulation_plugin=plugin)
    model, loader = acc.prepare(torch.nn.Linear(1, 1), DataLoader(torch.ones(6, 1), batch_size=1))
    flags = []
    for _ in range(2):
        for x in loader:
            with acc.accumulate(model):
                acc.backward(model(x).sum())
                flags.append(acc.sync_gradients)
    return flags


def test_sync_with_dataloader_false_runs_the_window_across_epochs():
    ours = run_ranks(_window_across_epochs, world_size=2, args=("accel_nb",))
    theirs = run_ranks(_window_across_epochs, world_size=2, args=("accelerate",))
    assert ours == theirs
    assert ours[0] == [False, True, False, True, False, True]
