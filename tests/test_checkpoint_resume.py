"""Resume exactness and crash safety with real processes (2 gloo ranks on CPU)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch
from torch import nn

from tests.dist_helpers import run_ranks

pytestmark = pytest.mark.multiproc

TOTAL_STEPS = 10  # 40 samples / (2 ranks x batch 4) = 5 batches per epoch: the save lands mid-epoch 0
HALF = 7  # ... and the resumed run crosses an epoch boundary (epoch 1 starts at step 5)


class DropNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 1))

    def forward(self, x):
        return self.body(x)


class Counter:
    """A registered object: how many samples this run has seen."""

    def __init__(self):
        self.seen = 0

    def state_dict(self):
        return {"seen": self.seen}

    def load_state_dict(self, state):
        self.seen = state["seen"]


def _train(ckpt: str, start: int, stop: int, save: bool, reference_skip: bool = False):
    """Train steps [start, stop) on this rank; load the checkpoint first when start > 0.

    ``reference_skip``: resume as the reference's examples do, the rest of the interrupted epoch through
    ``accelerator.skip_first_batches(loader, start % 5)``, then ``loader`` again.
    """
    from torch.utils.data import DataLoader, TensorDataset

    from accel_nb import Accelerator
    from accel_nb.utils import set_seed

    set_seed(1234)
    accelerator = Accelerator(cpu=True)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(40, 6, generator=g)
    y = x.sum(dim=1, keepdim=True) + 0.1 * torch.randn(40, 1, generator=g)
    loader = DataLoader(TensorDataset(x, y), batch_size=4, shuffle=True)
    model = DropNet()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.5)
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    counter = Counter()
    accelerator.register_for_checkpointing(counter)
    if start:
        accelerator.load_state(ckpt)
        assert counter.seen == start * 4, counter.seen
    losses, step = [], start
    resume_skip = start % 5 if reference_skip else 0
    while step < stop:
        active = accelerator.skip_first_batches(loader, resume_skip) if resume_skip else loader
        resume_skip = 0
        for xb, yb in active:
            loss = nn.functional.mse_loss(model(xb), yb)
            accelerator.backward(loss)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            counter.seen += len(xb)
            losses.append(loss.item())
            step += 1
            if step == stop:
                break
    if save:
        accelerator.save_state(ckpt)
    # numpy arrays travel back by value (tensors would go through shared memory of an exited process)
    weights = {k: v.detach().numpy().copy() for k, v in accelerator.unwrap_model(model).state_dict().items()}
    return losses, weights, torch.rand(1).item()


@pytest.fixture(scope="module")
def half_run(tmp_path_factory):
    """2 ranks train HALF steps and save_state: (checkpoint folder, per-rank results)."""
    ckpt = str(tmp_path_factory.mktemp("half") / "ckpt")
    return ckpt, run_ranks(_train, 2, args=(ckpt, 0, HALF, True))


def test_resume_is_bitwise_exact(tmp_path, half_run):
    ckpt, first = half_run
    full = run_ranks(_train, 2, args=(str(tmp_path / "unused"), 0, TOTAL_STEPS, False))
    assert sorted(os.listdir(ckpt)) == [
        "checkpoint.json",
        "custom_checkpoint_0.bin",
        "model.safetensors",
        "optimizer.bin",
        "rank_0.pt",
        "rank_1.pt",
        "scheduler.bin",
    ]
    second = run_ranks(_train, 2, args=(ckpt, HALF, TOTAL_STEPS, False))  # a brand-new process group
    for rank in range(2):
        full_losses, full_weights, full_rand = full[rank]
        resumed = first[rank][0] + second[rank][0]
        assert len(resumed) == TOTAL_STEPS
        assert resumed == full_losses, f"rank {rank}: losses differ"  # bitwise: float equality
        for k, v in full_weights.items():
            assert (second[rank][1][k] == v).all(), f"rank {rank}: {k} differs"
        assert second[rank][2] == full_rand  # the RNG stream continues exactly
    assert full[0][0] != full[1][0]  # ranks saw different batches: the test would notice a mix-up


def test_the_reference_resume_pattern_is_exact_too(tmp_path, half_run):
    # load_state, then skip_first_batches(loader, resume_step) for the rest of the epoch (the reference's
    # complete_nlp_example.py): the skipped batches are not skipped again in the next epoch, and the
    # resumed run is the uninterrupted one
    ckpt, first = half_run
    full = run_ranks(_train, 2, args=(str(tmp_path / "unused"), 0, TOTAL_STEPS, False))
    second = run_ranks(_train, 2, args=(ckpt, HALF, TOTAL_STEPS, False, True))
    for rank in range(2):
        assert first[rank][0] + second[rank][0] == full[rank][0], f"rank {rank}: losses differ"
        for k, v in full[rank][1].items():
            assert (second[rank][1][k] == v).all(), f"rank {rank}: {k} differs"
        assert second[rank][2] == full[rank][2]


def _bad_world(ckpt: str):
    from accel_nb import Accelerator
    from accel_nb.serialization import CheckpointError

    accelerator = Accelerator(cpu=True)
    accelerator.prepare(DropNet())
    try:
        accelerator.load_state(ckpt)
    except CheckpointError as exc:
        return str(exc)
    return None


def test_world_size_mismatch_is_a_clear_error(half_run):
    ckpt, _ = half_run
    (message,) = run_ranks(_bad_world, 1, args=(ckpt,))
    assert message and "saved by 2 processes but this run has 1" in message and "checkpoint.json" in message


# -- crash safety ---------------------------------------------------------------------------------
_SAVER = textwrap.dedent(
    """
    import sys, torch
    from torch import nn
    from accel_nb import Accelerator
    from accel_nb.checkpoint import ProjectConfiguration
    torch.manual_seed(0)
    project = sys.argv[1]
    accelerator = Accelerator(cpu=True, project_config=ProjectConfiguration(project, automatic_checkpoint_naming=True, total_limit=2))
    model = nn.Sequential(*[nn.Linear(1024, 1024) for _ in range(12)])   # ~50 MB of weights
    optimizer = torch.optim.Adam(model.parameters())
    model, optimizer = accelerator.prepare(model, optimizer)
    i = 0
    while True:
        with torch.no_grad():
            for p in model.parameters():
                p.fill_(float(i))
        path = accelerator.save_state()
        print("saved", i, path, flush=True)
        i += 1
    """
)


def _kill_during_save(project: str) -> bool:
    """Start the saving loop, SIGKILL it while a save is in flight; True when the kill landed there."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.getcwd()}
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        env.pop(k, None)
    proc = subprocess.Popen(
        [sys.executable, "-c", _SAVER, project],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    ckdir = os.path.join(project, "checkpoints")
    try:
        saved = 0
        while saved < 2:
            line = proc.stdout.readline()
            assert line, f"the saving process died: {proc.stderr.read()}"
            saved += line.startswith("saved")
        deadline = time.time() + 60
        while time.time() < deadline:  # wait until a save's temp folder exists and has files in it
            temps = [e for e in os.listdir(ckdir) if e.startswith(".tmp-")]
            try:
                if temps and os.listdir(os.path.join(ckdir, temps[0])):
                    break
            except FileNotFoundError:  # that save just finished
                pass
            time.sleep(0.002)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return any(e.startswith(".tmp-") for e in os.listdir(ckdir))


def test_sigkill_during_save_keeps_the_previous_checkpoint(tmp_path):
    from accel_nb import Accelerator
    from accel_nb.checkpoint import ProjectConfiguration, list_checkpoints
    from accel_nb.serialization import CheckpointError
    from accel_nb.state import _reset_all_states

    for attempt in range(4):
        project = str(tmp_path / f"proj{attempt}")
        if _kill_during_save(project):
            break
    else:
        pytest.fail("the SIGKILL never landed during a save in 4 attempts; the test proved nothing")
    ckdir = os.path.join(project, "checkpoints")
    complete = list_checkpoints(project)
    assert complete, "no complete checkpoint survived"
    newest_index = int(os.path.basename(complete[-1]).split("_")[1])

    # a fresh run loads the newest complete checkpoint (never the half-written one) and saves on
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        os.environ.pop(k, None)
    _reset_all_states()
    try:
        torch.manual_seed(0)
        config = ProjectConfiguration(project, automatic_checkpoint_naming=True, total_limit=2)
        accelerator = Accelerator(cpu=True, project_config=config)
        model = nn.Sequential(*[nn.Linear(1024, 1024) for _ in range(12)])
        optimizer = torch.optim.Adam(model.parameters())
        model, optimizer = accelerator.prepare(model, optimizer)
        (half_written,) = [e for e in os.listdir(ckdir) if e.startswith(".tmp-")]
        with pytest.raises(CheckpointError, match="not a complete checkpoint"):
            accelerator.load_state(os.path.join(ckdir, half_written))
        assert accelerator.load_state() == complete[-1]
        assert all(torch.all(p == float(newest_index)) for p in model.parameters())
        nxt = accelerator.save_state()
        assert os.path.basename(nxt) == f"checkpoint_{newest_index + 1}"
        assert not [
            e for e in os.listdir(ckdir) if e.startswith(".tmp-")
        ]  # the dead save's temp folder is gone
        assert len(list_checkpoints(project)) == 2  # total_limit
    finally:
        _reset_all_states()


def _load_expecting_failure(ckpt: str):
    from torch.utils.data import DataLoader, TensorDataset

    from accel_nb import Accelerator
    from accel_nb.serialization import CheckpointError

    torch.manual_seed(5)
    accelerator = Accelerator(cpu=True)
    model = DropNet()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.5)
    loader = DataLoader(TensorDataset(torch.randn(40, 6), torch.randn(40, 1)), batch_size=4, shuffle=True)
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    accelerator.register_for_checkpointing(Counter())
    before = {k: v.clone() for k, v in model.state_dict().items()}
    try:
        accelerator.load_state(ckpt)
    except CheckpointError as exc:
        unchanged = all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
        return str(exc), unchanged
    return None, None


def test_a_rank_that_cannot_load_stops_every_rank_before_any_change(tmp_path, half_run):
    import json
    import shutil

    from accel_nb.checkpoint.layout import file_digest

    ckpt = str(tmp_path / "ckpt")
    shutil.copytree(half_run[0], ckpt)
    # rank 1's own file now holds an object the safe loader refuses (the manifest is updated to match)
    rank_file = os.path.join(ckpt, "rank_1.pt")
    torch.save({"rng": Counter(), "dataloaders": []}, rank_file)
    manifest_path = os.path.join(ckpt, "checkpoint.json")
    manifest = json.loads(open(manifest_path).read())
    manifest["files"]["rank_1.pt"] = {"size": os.path.getsize(rank_file), "digest": file_digest(rank_file)}
    open(manifest_path, "w").write(json.dumps(manifest))
    (msg0, unchanged0), (msg1, _) = run_ranks(_load_expecting_failure, 2, args=(ckpt,))
    assert "rank_1.pt holds Python objects" in msg1 and "weights_only=False" in msg1
    assert msg0.startswith("load_state changed nothing: rank 1 could not use the checkpoint") and unchanged0


# -- epoch boundaries: a resumed loader continues with the next epoch's shuffle --------------------
PER_EPOCH = 4  # 24 samples / (2 ranks x batch 3)
SAVE_POINTS = {  # name: (epoch, batches of that epoch done, saved inside the inner loop?)
    "mid0": (0, 2, True),
    "end0": (0, PER_EPOCH, False),  # after the inner loop: the usual place
    "last1": (1, PER_EPOCH, True),  # right after the last batch, before the loop ends
    "end1": (1, PER_EPOCH, False),
}


def _epochs_run(ckpt_dir: str, variant: str, resume_from: str | None):
    """3 epochs of the usual loop over a shuffled loader: (this rank's sample order, a last draw).

    Without ``resume_from``: the whole run, saving a checkpoint at every SAVE_POINTS place. With it:
    a fresh prepared loader loads that checkpoint and runs to the end of epoch 2. ``workers``: the
    DataLoader has its own generator and a persistent worker (which keeps its iterator between
    epochs, so the saved run's next epoch draws no base seed while the resumed loader's first does).
    """
    from torch.utils.data import DataLoader, TensorDataset

    from accel_nb import Accelerator
    from accel_nb.utils import DataLoaderConfiguration, set_seed

    set_seed(77)
    config = DataLoaderConfiguration(use_seedable_sampler=variant == "seedable")
    accelerator = Accelerator(cpu=True, dataloader_config=config)
    extra = {}
    if variant == "workers":
        extra = {"num_workers": 1, "persistent_workers": True, "generator": torch.Generator().manual_seed(3)}
    loader = accelerator.prepare(
        DataLoader(TensorDataset(torch.arange(24)), batch_size=3, shuffle=True, **extra)
    )
    start_epoch, order = 0, []
    if resume_from:
        accelerator.load_state(os.path.join(ckpt_dir, resume_from))
        epoch, done, _ = SAVE_POINTS[resume_from]
        start_epoch = epoch + 1 if done == PER_EPOCH else epoch
    for epoch in range(start_epoch, 3):
        if variant in ("set_epoch", "seedable"):
            loader.set_epoch(epoch)
        for step, (xb,) in enumerate(loader):
            order.append(xb.tolist())
            torch.rand(1)  # the training step's own draws (dropout etc.) move torch's RNG on
            if resume_from is None:
                for name, (e, done, inside) in SAVE_POINTS.items():
                    if inside and (e, done) == (epoch, step + 1):
                        accelerator.save_state(os.path.join(ckpt_dir, name))
        if resume_from is None:
            for name, (e, _, inside) in SAVE_POINTS.items():
                if not inside and e == epoch:
                    accelerator.save_state(os.path.join(ckpt_dir, name))
    return order, torch.rand(1).item()


@pytest.mark.parametrize(
    "variant, points",
    [
        ("plain", ["mid0", "end0", "last1", "end1"]),
        ("set_epoch", ["end0", "end1"]),
        ("seedable", ["mid0", "end1"]),
        ("workers", ["end0", "last1"]),
    ],
)
def test_resume_at_an_epoch_boundary_continues_with_the_next_shuffle(tmp_path, variant, points):
    ckpt_dir = str(tmp_path)
    full_runs = run_ranks(_epochs_run, 2, args=(ckpt_dir, variant, None))
    full = [order for order, _ in full_runs]
    for rank in range(2):
        assert len(full[rank]) == 3 * PER_EPOCH
        orders = [full[rank][e * PER_EPOCH : (e + 1) * PER_EPOCH] for e in range(3)]
        assert len({str(o) for o in orders}) == 3, (
            "epochs share a shuffle: the test could not tell them apart"
        )
    # ranks share one permutation
    assert sorted(sum(full[0][:PER_EPOCH] + full[1][:PER_EPOCH], [])) == list(range(24))
    for name in points:
        resumed = run_ranks(_epochs_run, 2, args=(ckpt_dir, variant, name))  # fresh processes
        epoch, done, _ = SAVE_POINTS[name]
        already = epoch * PER_EPOCH + done
        for rank in range(2):
            assert resumed[rank][0] == full[rank][already:], f"{name}, rank {rank}: the resumed order differs"
            assert resumed[rank][1] == full_runs[rank][1], f"{name}, rank {rank}: torch's RNG stream differs"
