"""Accelerator API: prepare, mixed precision on CPU, fp16 skipped steps, schedulers, clipping,
bad input, logging, and the collectives on 2 real gloo ranks."""

from __future__ import annotations

import os

import pytest
import torch
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset

from accel_nb import events
from accel_nb.accelerator import AcceleratedOptimizer, AcceleratedScheduler, Accelerator
from accel_nb.data import DataLoaderShard
from accel_nb.state import _reset_all_states
from tests.dist_helpers import run_ranks

pytestmark = pytest.mark.usefixtures("fresh_state")  # tests/conftest.py: one process, fresh state


def _setup(n=12, bs=4, lr=0.1, **acc_kw):
    torch.manual_seed(0)
    acc = Accelerator(**acc_kw)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    x = torch.randn(n, 4)
    dl = DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=bs)
    return acc, model, opt, dl


# -- prepare -----------------------------------------------------------------------------------------
def test_prepare_keeps_order_and_passes_unknown_objects_through():
    acc, model, opt, dl = _setup()
    sched = torch.optim.lr_scheduler.StepLR(opt, 1)
    other = {"not": "preparable"}
    out = acc.prepare(sched, other, dl, model, opt, 3)
    assert (
        isinstance(out[0], AcceleratedScheduler) and out[1] is other and isinstance(out[2], DataLoaderShard)
    )
    assert out[3] is model and isinstance(out[4], AcceleratedOptimizer) and out[5] == 3
    assert acc._models == [model] and acc._optimizers == [out[4]] and acc._schedulers == [out[0]]
    assert acc._dataloaders == [out[2]] and out[0].optimizers == [out[4]]
    assert acc.prepare(other) is other


def test_preparing_prepared_objects_gives_them_back_tracked_once():
    acc, model, opt, dl = _setup()
    sched = torch.optim.lr_scheduler.StepLR(opt, 1)
    first = acc.prepare(model, opt, dl, sched)
    again = acc.prepare(*first)  # a rerun notebook cell
    assert all(a is b for a, b in zip(first, again, strict=True))
    assert acc._models == [first[0]] and acc._optimizers == [first[1]]
    assert acc._dataloaders == [first[2]] and acc._schedulers == [first[3]]
    other = Accelerator()  # the cell that made the Accelerator ran again too: it adopts them
    assert all(a is b for a, b in zip(first, other.prepare(*first), strict=True))
    assert other._models == [first[0]] and other._dataloaders == [first[2]]
    assert not hasattr(opt, "_accel_nb_prepared")  # the user's optimizer itself is not the prepared one
    assert acc.prepare(opt) is not first[1]


def _prepare_the_model_inside_ddp():
    acc = Accelerator(cpu=True)
    ddp = acc.prepare(torch.nn.Linear(2, 2))
    assert acc.prepare(ddp) is ddp and len(acc._models) == 1
    try:
        acc.prepare(ddp.module)
    except ValueError as exc:
        return str(exc)
    return "wrapped twice"


@pytest.mark.multiproc
def test_preparing_the_model_inside_a_prepared_ddp_is_a_clear_error():
    for message in run_ranks(_prepare_the_model_inside_ddp, 2):
        assert "already prepared and wrapped; pass the object that prepare() returned" in message


def test_unknown_mixed_precision_is_a_clear_error():
    with pytest.raises(ValueError, match="mixed_precision='fp4'.*choose one of no, fp16, bf16, fp8"):
        Accelerator(mixed_precision="fp4")


def test_no_fp8_recipe_handler_as_no_fp8_run_is_possible():
    # the reference's config_yaml_templates/run_me.py reads it (tests/test_reference_examples.py)
    assert Accelerator().fp8_recipe_handler is None


def test_unknown_argument_is_a_clear_error():
    with pytest.raises(TypeError, match="unexpected keyword argument 'dispatch_everything'"):
        Accelerator(dispatch_everything=True)


def test_defaults_come_from_launcher_environment(monkeypatch):
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "bf16")  # the reference library's spelling
    monkeypatch.setenv("ACCEL_NB_GRADIENT_ACCUMULATION_STEPS", "3")
    acc = Accelerator()
    assert acc.mixed_precision == "bf16" and acc.gradient_accumulation_steps == 3
    assert acc.scaler is None
    _reset_all_states()
    assert Accelerator(gradient_accumulation_steps=2).gradient_accumulation_steps == 2


def test_backward_needs_a_tensor():
    acc, model, opt, dl = _setup()
    with pytest.raises(TypeError, match="not loss.item"):
        acc.backward(1.5)


def test_backward_on_an_unprepared_model_is_plain_autograd_divided_by_accumulation():
    acc, model, opt, dl = _setup(gradient_accumulation_steps=2)
    x = torch.randn(3, 4)
    acc.backward(model(x).sum())
    got = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    (model(x).sum() / 2).backward()
    assert all(torch.allclose(a, p.grad) for a, p in zip(got, model.parameters()))


# -- accumulation (single process) --------------------------------------------------------------------
def test_accumulate_syncs_every_n_steps_and_at_the_end_of_the_loader():
    acc, model, opt, dl = _setup(n=40, bs=4, gradient_accumulation_steps=4)  # 10 batches
    model, opt, dl = acc.prepare(model, opt, dl)
    syncs, steps = [], []
    for i, (x, y) in enumerate(dl, start=1):
        with acc.accumulate(model):
            before = model[0].weight.detach().clone()
            acc.backward(torch.nn.functional.mse_loss(model(x), y))
            opt.step()
            opt.zero_grad()
            if acc.sync_gradients:
                syncs.append(i)
                assert all(p.grad is None for p in model.parameters())  # zeroed after the real step
            else:
                assert model[0].weight.grad is not None  # kept for the next batch
            if not torch.equal(before, model[0].weight):
                steps.append(i)
    assert syncs == [4, 8, 10] and steps == [4, 8, 10]
    assert acc.step == 0  # reset at the end of the loader: the next epoch starts a fresh window


# -- schedulers ----------------------------------------------------------------------------------------
def test_scheduler_steps_once_per_process_unless_split_batches():
    acc, model, opt, dl = _setup()
    popt = acc.prepare(opt)
    for split, expected in ((False, 3), (True, 1)):
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
        wrapped = AcceleratedScheduler(sched, [popt], split_batches=split, num_processes=3)
        popt.step()
        wrapped.step()
        assert sched.last_epoch == expected


def test_scheduler_waits_while_accumulating_and_never_passes_onecycle_total():
    acc, model, opt, dl = _setup(gradient_accumulation_steps=2)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=3)
    model, popt, psched = acc.prepare(model, opt, sched)
    psched.num_processes = 2  # as on 2 processes: two scheduler steps per optimizer step
    for _ in range(6):
        with acc.accumulate(model):
            popt.step()
            psched.step()
    assert sched.last_epoch == 3  # stopped at total_steps instead of raising


# -- mixed precision on CPU ----------------------------------------------------------------------------
def _dtype_seen_inside(acc, model, x):
    seen = []
    handle = model[0].register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    out = model(x)
    handle.remove()
    return seen[0], out.dtype


@pytest.mark.parametrize("mp,dtype", [("bf16", torch.bfloat16), ("fp16", torch.float16)])
def test_mixed_precision_on_cpu_trains(mp, dtype):
    acc, model, opt, dl = _setup(n=16, mixed_precision=mp)
    model, opt, dl = acc.prepare(model, opt, dl)
    inner, outer = _dtype_seen_inside(acc, model, torch.randn(2, 4))
    assert inner == dtype and outer == torch.float32  # autocast inside, fp32 outputs
    assert (acc.scaler is not None) == (mp == "fp16")
    with acc.autocast():
        assert torch.mm(torch.randn(2, 2), torch.randn(2, 2)).dtype == dtype
    start = model[0].weight.detach().clone()
    losses = []
    for _ in range(5):
        for x, y in dl:
            loss = torch.nn.functional.mse_loss(model(x), y)
            acc.backward(loss)
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
    assert not torch.equal(start, model[0].weight)
    assert losses[-1] < losses[0]
    plain = acc.unwrap_model(model, keep_fp32_wrapper=False)
    assert _dtype_seen_inside(acc, plain, torch.randn(2, 4))[0] == torch.float32


def test_fp16_inf_gradient_skips_optimizer_and_scheduler():
    acc, model, opt, dl = _setup(mixed_precision="fp16")
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    model, opt, sched = acc.prepare(model, opt, sched)
    x = torch.randn(4, 4)
    acc.backward(model(x).mean())
    model[0].weight.grad[0, 0] = float("inf")
    before = [p.detach().clone() for p in model.parameters()]
    scale = acc.scaler.get_scale()
    opt.step()
    sched.step()
    opt.zero_grad()
    assert opt.step_was_skipped and acc.optimizer_step_was_skipped
    assert all(torch.equal(a, p) for a, p in zip(before, model.parameters()))
    assert sched.get_last_lr() == [0.1] and acc.scaler.get_scale() < scale
    acc.backward(model(x).mean())
    opt.step()
    sched.step()
    assert not opt.step_was_skipped and sched.get_last_lr() == [0.05]
    assert not torch.equal(before[0], model[0].weight)


def test_fp16_clip_grad_norm_unscales_first():
    acc, model, opt, dl = _setup(mixed_precision="fp16")
    model, opt = acc.prepare(model, opt)
    x = torch.randn(4, 4)
    acc.backward(model(x).mean() * 0.01)
    scaled = torch.norm(torch.stack([p.grad.norm() for p in model.parameters()]))
    norm = acc.clip_grad_norm_(model.parameters(), max_norm=1e9)
    assert torch.isclose(norm * acc.scaler.get_scale(), scaled, rtol=1e-3)
    opt.step()
    opt.zero_grad()
    acc.backward(model(x).mean() * 0.01)
    acc.clip_grad_value_(model.parameters(), 0.01)
    assert all(p.grad.abs().max() <= 0.01 + 1e-8 for p in model.parameters())


def test_clip_grad_norm_without_scaler_is_torchs():
    acc, model, opt, dl = _setup()
    model(torch.randn(3, 4)).sum().backward()
    expected = torch.norm(torch.stack([p.grad.norm() for p in model.parameters()]))
    assert torch.isclose(acc.clip_grad_norm_(model.parameters(), 0.5), expected)
    after = torch.norm(torch.stack([p.grad.norm() for p in model.parameters()]))
    assert after <= 0.5 + 1e-5


# -- checkpoint contract, logging, helpers ------------------------------------------------------------
def test_register_for_checkpointing_checks_objects():
    acc, *_ = _setup()

    class Counter:
        def state_dict(self):
            return {}

        def load_state_dict(self, sd):
            pass

    c = Counter()
    acc.register_for_checkpointing(c)
    assert acc._custom_objects == [c]
    with pytest.raises(ValueError, match=r"Item at index 1, `object`"):  # the reference's words
        acc.register_for_checkpointing(Counter(), object())
    assert acc._custom_objects == [c]


def test_project_configuration_and_save(tmp_path):
    acc = Accelerator(project_dir=str(tmp_path))
    assert acc.project_configuration.project_dir == str(tmp_path) and acc.project_dir == str(tmp_path)
    acc.save({"w": torch.ones(2)}, tmp_path / "obj.pt")
    assert torch.equal(torch.load(tmp_path / "obj.pt")["w"], torch.ones(2))
    acc.save({"w": torch.ones(2)}, str(tmp_path / "obj.safetensors"), safe_serialization=True)
    from safetensors.torch import load_file

    assert torch.equal(load_file(str(tmp_path / "obj.safetensors"))["w"], torch.ones(2))


def test_log_metrics_emits_a_metrics_event_inside_a_launch():
    acc, *_ = _setup()
    assert acc.log_metrics({"loss": 1.0}) is False  # outside a launch: nothing to send to
    got = []
    events.set_event_sink(got.append)
    try:
        assert acc.log_metrics({"loss": torch.tensor(0.5), "acc": 0.9}, step=7)
        acc.log({"lr": 0.1})
    finally:
        events.set_event_sink(None)
    assert got[0] == events.Metrics(rank=0, values={"loss": 0.5, "acc": 0.9}, step=7)
    assert got[1].values == {"lr": 0.1} and got[1].step is None


def test_single_process_helpers():
    acc, model, opt, dl = _setup(n=10)
    assert acc.num_processes == 1 and acc.is_main_process and acc.is_local_main_process
    assert acc.device.type == "cpu" and acc.process_index == 0
    t = torch.arange(3)
    assert torch.equal(acc.gather(t), t) and torch.equal(acc.gather_for_metrics(t), t)
    assert torch.equal(acc.reduce(t), t) and torch.equal(acc.pad_across_processes(t), t)
    with acc.split_between_processes([1, 2, 3]) as part:
        assert part == [1, 2, 3]
    with acc.main_process_first():
        acc.wait_for_everyone()
    pdl = acc.prepare(dl)
    assert [len(b[0]) for b in acc.skip_first_batches(pdl, 2)] == [2]
    assert acc.free_memory(model, opt) == [None, None] and acc._dataloaders == []


# -- two real processes --------------------------------------------------------------------------------
class _Stream(torch.utils.data.IterableDataset):
    def __init__(self, n):
        self.n = n

    def __iter__(self):
        return iter([(torch.tensor(i),) for i in range(self.n)])


def _collectives_on_two_ranks():
    acc = Accelerator()
    r = acc.process_index
    model = acc.prepare(torch.nn.Linear(2, 2))
    # gather_for_metrics over an uneven dataset (13 samples, 2 ranks x batch 4 -> last round padded)
    ds = TensorDataset(torch.arange(13), torch.arange(13) * 10)
    dl = acc.prepare(DataLoader(ds, batch_size=4))
    ids, labels, objects = [], [], []
    for x, y in dl:
        gx, gy = acc.gather_for_metrics((x, y))
        ids += gx.tolist()
        labels += gy.tolist()
        objects += acc.gather_for_metrics([f"s{i}" for i in x.tolist()], use_gather_object=True)
    stream = []
    for (x,) in acc.prepare(DataLoader(_Stream(11), batch_size=2)):
        stream += acc.gather_for_metrics(x).tolist()
    red = acc.reduce(torch.tensor([r + 1.0]), reduction="mean")
    padded = acc.pad_across_processes(torch.ones(r + 1), dim=0)
    with acc.split_between_processes(list(range(5))) as part:
        mine = part
    return {
        "ddp": isinstance(model, DistributedDataParallel),
        "len": len(dl),
        "ids": ids,
        "labels": labels,
        "objects": objects,
        "mean": red.item(),
        "padded": padded.tolist(),
        "mine": mine,
        "stream": stream,
    }


@pytest.mark.multiproc
def test_collectives_and_gather_for_metrics_on_two_ranks():
    r0, r1 = run_ranks(_collectives_on_two_ranks, 2)
    for res in (r0, r1):
        assert res["ddp"] and res["len"] == 2
        assert res["ids"] == list(range(13))  # exactly len(dataset), in order, duplicates dropped
        assert res["labels"] == [i * 10 for i in range(13)]
        assert res["objects"] == [f"s{i}" for i in range(13)]
        assert res["mean"] == 1.5
        assert res["stream"] == list(range(11))  # iterable dataset: the padded round is trimmed too
    assert r0["padded"] == [1.0, 0.0] and r1["padded"] == [1.0, 1.0]
    assert r0["mine"] == [0, 1, 2] and r1["mine"] == [3, 4]


def _gather_for_metrics_split_batches():
    acc = Accelerator(split_batches=True)
    dl = acc.prepare(DataLoader(TensorDataset(torch.arange(11)), batch_size=4))
    got = []
    for (x,) in dl:
        got += acc.gather_for_metrics(x).tolist()
    return len(dl), got


@pytest.mark.multiproc
def test_gather_for_metrics_with_split_batches():
    for n, got in run_ranks(_gather_for_metrics_split_batches, 2):
        assert n == 3 and got == list(range(11))


def _scheduler_on_two_ranks():
    acc = Accelerator()
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (s + 1))
    model, opt, sched = acc.prepare(model, opt, sched)
    acc.backward(model(torch.ones(1, 2)).sum())
    opt.step()
    sched.step()
    return sched.scheduler.last_epoch, os.environ["RANK"]


@pytest.mark.multiproc
def test_scheduler_counts_both_processes_batches():
    assert [r[0] for r in run_ranks(_scheduler_on_two_ranks, 2)] == [2, 2]


def _fp16_overflow_on_one_rank():
    acc = Accelerator(mixed_precision="fp16")
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = acc.prepare(model, opt)
    skipped = []
    for big in (True, False):
        x = torch.ones(2, 4) * 0.01
        if big and acc.process_index == 1:
            x = x * 1e30  # only this rank's gradient overflows; the all-reduce spreads the inf
        acc.backward(model(x).mean() * 0.01)
        opt.step()
        opt.zero_grad()
        skipped.append(opt.step_was_skipped)
    return skipped, [p.detach().numpy().tolist() for p in acc.unwrap_model(model).parameters()]


@pytest.mark.multiproc
def test_fp16_skip_is_the_same_on_every_rank():
    (s0, w0), (s1, w1) = run_ranks(_fp16_overflow_on_one_rank, 2)
    assert s0 == s1 == [True, False]
    assert w0 == w1


def _bf16_ddp_training():
    acc = Accelerator(mixed_precision="bf16")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    x = torch.randn(32, 4)
    model, opt, dl = acc.prepare(
        model, opt, DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4)
    )
    losses = []
    for _ in range(3):
        for xb, yb in dl:
            loss = torch.nn.functional.mse_loss(model(xb), yb)
            acc.backward(loss)
            opt.step()
            opt.zero_grad()
            losses.append(acc.reduce(loss.detach(), reduction="mean").item())
    return losses, [p.detach().numpy().tolist() for p in acc.unwrap_model(model).parameters()]


@pytest.mark.multiproc
def test_bf16_trains_on_two_ranks():
    (l0, w0), (l1, w1) = run_ranks(_bf16_ddp_training, 2)
    assert w0 == w1 and l0 == l1
    assert l0[-1] < l0[0]


def test_deepcopy_of_a_prepared_mixed_precision_model_runs_the_copy():
    import copy

    acc, model, opt, dl = _setup(mixed_precision="bf16")
    model = acc.prepare(model)
    twin = copy.deepcopy(model)
    with torch.no_grad():
        for p in twin.parameters():
            p.zero_()
    x = torch.randn(2, 4)
    assert torch.equal(twin(x), torch.zeros(2, 1)) and not torch.equal(model(x), torch.zeros(2, 1))
    assert twin(x).dtype == torch.float32


def _prepare_dispatched_model():
    acc = Accelerator()
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
    model.hf_device_map = {"0": "cpu", "1": "disk"}
    try:
        acc.prepare(model)
    except ValueError as exc:
        return str(exc)
    return None


@pytest.mark.multiproc
def test_a_model_dispatched_over_devices_cannot_be_trained_on_several_processes():
    for message in run_ranks(_prepare_dispatched_model, 2):
        assert (
            message and "dispatched over several devices" in message and "one device per process" in message
        )


def test_reference_kwargs_handlers_are_understood():
    utils = pytest.importorskip("accelerate.utils")  # the reference library's own handler objects
    DistributedDataParallelKwargs, GradScalerKwargs = (
        utils.DistributedDataParallelKwargs,
        utils.GradScalerKwargs,
    )

    acc = Accelerator(
        mixed_precision="fp16",
        kwargs_handlers=[
            DistributedDataParallelKwargs(find_unused_parameters=True),
            GradScalerKwargs(init_scale=1024.0),
        ],
    )
    assert acc.ddp_kwargs == {"find_unused_parameters": True} and acc.scaler.get_scale() == 1024.0
    _reset_all_states()
    with pytest.raises(ValueError, match="kwargs_handlers got object"):
        Accelerator(kwargs_handlers=[object()])


@pytest.mark.gpu
@pytest.mark.parametrize("mp", ["fp16", "bf16"])
def test_cuda_placement_pinned_batches_and_mixed_precision(mp):
    if mp == "bf16" and not torch.cuda.is_bf16_supported():
        with pytest.raises(ValueError, match="not supported by GPU 0"):
            Accelerator(mixed_precision="bf16")
        return
    acc, model, opt, _ = _setup(n=32, mixed_precision=mp)
    x = torch.randn(32, 4)
    dl = DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8, pin_memory=True)
    model, opt, dl = acc.prepare(model, opt, dl)
    assert acc.device.type == "cuda" and next(model.parameters()).device.type == "cuda"
    assert (acc.scaler is not None) == (mp == "fp16")
    for xb, yb in dl:
        assert xb.device == acc.device and yb.device == acc.device
        out = model(xb)
        assert out.dtype == torch.float32
        acc.backward(torch.nn.functional.mse_loss(out, yb))
        opt.step()
        opt.zero_grad()
    assert all(torch.isfinite(p).all() for p in model.parameters())
