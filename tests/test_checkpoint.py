"""save_state / load_state / save_model with the real Accelerator: naming, rotation, atomic folders,
tied weights, safe loading, and every bad-input error."""

from __future__ import annotations

import copy
import json
import os

import pytest
import torch
from torch import nn

from accel_nb.checkpoint import (
    MANIFEST_NAME,
    ProjectConfiguration,
    is_complete_checkpoint,
    list_checkpoints,
)
from accel_nb.serialization import CheckpointError, index_checkpoint, load_safetensors_into
from accel_nb.state import _reset_all_states
from tests.dist_helpers import run_ranks

pytestmark = pytest.mark.usefixtures("fresh_state")  # tests/conftest.py: one process, fresh state


class TiedLM(nn.Module):
    def __init__(self, vocab=50, dim=16, layers=3):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(nn.Linear(dim, dim) for _ in range(layers))
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, ids):
        h = self.embed(ids)
        for b in self.blocks:
            h = torch.tanh(b(h))
        return self.head(h)


class Box:
    def __init__(self, value):
        self.value = value

    def state_dict(self):
        return {"value": self.value}

    def load_state_dict(self, state):
        self.value = state["value"]


def _setup(project=None, mixed_precision="no", **config):
    from accel_nb import Accelerator

    torch.manual_seed(0)
    pc = ProjectConfiguration(project, **config) if project else None
    accelerator = Accelerator(cpu=True, mixed_precision=mixed_precision, project_config=pc)
    model = TiedLM()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1 / (s + 1))
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    return accelerator, model, optimizer, scheduler


def _train_step(accelerator, model, optimizer, scheduler):
    ids = torch.randint(0, 50, (4, 5))
    loss = model(ids).logsumexp(-1).mean()
    accelerator.backward(loss)
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad()


# -- configuration ----------------------------------------------------------------------------------
def test_project_configuration_defaults_and_validation():
    pc = ProjectConfiguration("runs/a")
    assert (
        pc.logging_dir == "runs/a"
        and pc.iteration == 0
        and pc.checkpoints_dir == os.path.join("runs/a", "checkpoints")
    )
    with pytest.raises(ValueError, match="total_limit=0"):
        ProjectConfiguration("x", total_limit=0)
    import accel_nb

    assert accel_nb.ProjectConfiguration is ProjectConfiguration


def test_save_state_needs_a_folder():
    accelerator, *_ = _setup()
    with pytest.raises(CheckpointError, match="pass output_dir.*automatic_checkpoint_naming=True"):
        accelerator.save_state()
    with pytest.raises(CheckpointError, match="load_state\\(\\) needs a folder"):
        accelerator.load_state()


# -- round trip -------------------------------------------------------------------------------------
def test_round_trip_restores_everything(tmp_path):
    accelerator, model, optimizer, scheduler = _setup()
    box = Box(torch.arange(3))
    accelerator.register_for_checkpointing(box)
    for _ in range(3):
        _train_step(accelerator, model, optimizer, scheduler)
    accelerator.step = 11
    path = accelerator.save_state(tmp_path / "ckpt")
    assert path == str(tmp_path / "ckpt") and is_complete_checkpoint(path)
    expected_state = {k: v.clone() for k, v in model.state_dict().items()}
    expected_opt = copy.deepcopy(optimizer.state_dict())  # the live one changes in place
    expected_lr = scheduler.get_last_lr()
    expected_next = torch.rand(2)  # what the RNG produces right after the save point

    for _ in range(2):  # move everything on
        _train_step(accelerator, model, optimizer, scheduler)
    box.value = torch.zeros(1)
    accelerator.step = 0
    assert not torch.equal(model.state_dict()["blocks.0.weight"], expected_state["blocks.0.weight"])

    assert accelerator.load_state(path) == path
    for k, v in model.state_dict().items():
        assert torch.equal(v, expected_state[k]), k
    assert model.head.weight is model.embed.weight  # still tied
    got = optimizer.state_dict()
    assert got["param_groups"] == expected_opt["param_groups"]
    for key, st in expected_opt["state"].items():
        for name, value in st.items():
            assert torch.equal(torch.as_tensor(got["state"][key][name]), torch.as_tensor(value))
    assert scheduler.get_last_lr() == expected_lr
    assert torch.equal(box.value, torch.arange(3))
    assert accelerator.step == 11
    assert torch.equal(torch.rand(2), expected_next)


def test_manifest_is_written_last_and_describes_the_files(tmp_path):
    accelerator, *_ = _setup()
    path = accelerator.save_state(tmp_path / "c")
    manifest = json.loads(open(os.path.join(path, MANIFEST_NAME)).read())
    assert manifest["world_size"] == 1 and manifest["version"] == 1
    assert set(manifest["files"]) == set(os.listdir(path)) - {MANIFEST_NAME}
    for name, info in manifest["files"].items():
        assert info["size"] == os.path.getsize(os.path.join(path, name))
    # tied weights are stored once, with the alias recorded
    index = index_checkpoint(os.path.join(path, "model.safetensors"))
    assert index.aliases == {"head.weight": "embed.weight"}


def test_fp16_grad_scaler_is_saved(tmp_path):
    try:
        accelerator, model, optimizer, scheduler = _setup(mixed_precision="fp16")
    except (ValueError, RuntimeError) as exc:  # pragma: no cover - depends on the torch build
        pytest.skip(f"fp16 not available on this CPU build: {exc}")
    if accelerator.scaler is None:
        pytest.skip("no grad scaler for fp16 on this device")
    accelerator.scaler.scale(torch.ones(()))  # the scale exists once something was scaled
    accelerator.scaler.update(1234.0)
    path = accelerator.save_state(tmp_path / "c")
    assert "scaler.pt" in os.listdir(path)
    accelerator.scaler.update(8.0)
    accelerator.load_state(path)
    assert accelerator.scaler.get_scale() == 1234.0


def test_replacing_a_checkpoint_leaves_no_temp_folders(tmp_path):
    accelerator, model, optimizer, scheduler = _setup()
    target = tmp_path / "c"
    accelerator.save_state(target)
    _train_step(accelerator, model, optimizer, scheduler)
    accelerator.save_state(target)
    assert sorted(os.listdir(tmp_path)) == ["c"]
    saved = index_checkpoint(target / "model.safetensors")
    fresh = TiedLM()
    load_safetensors_into(fresh, saved)
    assert torch.equal(fresh.blocks[0].weight, accelerator.unwrap_model(model).blocks[0].weight)


def test_refuses_to_replace_a_folder_that_is_not_a_checkpoint(tmp_path):
    accelerator, *_ = _setup()
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("precious")
    with pytest.raises(CheckpointError, match="refusing to replace .*mine.*not an accel_nb checkpoint"):
        accelerator.save_state(tmp_path / "mine")
    assert (tmp_path / "mine" / "notes.txt").read_text() == "precious"


# -- automatic naming and rotation ----------------------------------------------------------------------
def test_automatic_naming_rotation_and_latest(tmp_path):
    project = str(tmp_path / "proj")
    accelerator, model, optimizer, scheduler = _setup(
        project, automatic_checkpoint_naming=True, total_limit=2
    )
    paths = []
    for _ in range(4):
        _train_step(accelerator, model, optimizer, scheduler)
        paths.append(accelerator.save_state())
    assert [os.path.basename(p) for p in paths] == [f"checkpoint_{i}" for i in range(4)]
    assert list_checkpoints(project) == paths[2:]
    assert accelerator.project_configuration.iteration == 4
    last = {k: v.clone() for k, v in model.state_dict().items()}
    # a half-written folder (no manifest) with a higher number is never taken for a checkpoint
    os.makedirs(os.path.join(project, "checkpoints", "checkpoint_9"))
    _reset_all_states()
    fresh, model2, _, _ = _setup(project, automatic_checkpoint_naming=True, total_limit=2)
    assert fresh.load_state() == paths[3]
    for k, v in model2.state_dict().items():
        assert torch.equal(v, last[k])
    # the next save does not reuse a name that exists, even an incomplete one
    assert os.path.basename(fresh.save_state()) == "checkpoint_10"
    assert [os.path.basename(p) for p in list_checkpoints(project)] == ["checkpoint_3", "checkpoint_10"]
    assert os.path.isdir(
        os.path.join(project, "checkpoints", "checkpoint_9")
    )  # unknown folders are left alone


def test_interrupted_replace_is_recovered(tmp_path):
    """A save killed between moving the old checkpoint away and the new one in loses nothing."""
    accelerator, model, *_ = _setup()
    target = tmp_path / "c"
    accelerator.save_state(target)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    os.rename(target, tmp_path / ".old-c-999999999")  # as left by a process that died mid-swap
    with pytest.warns(UserWarning, match="loading the checkpoint it replaced"):
        assert accelerator.load_state(target).endswith(".old-c-999999999")
    accelerator.save_state(target)  # the next save restores the old one first, then replaces it
    assert sorted(os.listdir(tmp_path)) == ["c"]
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k])


# -- save_model ---------------------------------------------------------------------------------------
def test_save_model_shards_and_reloads_with_ties(tmp_path):
    accelerator, model, optimizer, scheduler = _setup()
    _train_step(accelerator, model, optimizer, scheduler)
    files = accelerator.save_model(model, tmp_path / "out", max_shard_size="2KB")
    names = sorted(os.listdir(tmp_path / "out"))
    shards = [n for n in names if n.endswith(".safetensors")]
    assert len(shards) >= 3 and "model.safetensors.index.json" in names
    assert sorted(os.path.basename(f) for f in files) == names
    weight_map = json.loads((tmp_path / "out" / "model.safetensors.index.json").read_text())["weight_map"]
    assert "head.weight" not in weight_map and "embed.weight" in weight_map  # saved once
    fresh = TiedLM()
    load_safetensors_into(fresh, tmp_path / "out")
    for k, v in accelerator.unwrap_model(model).state_dict().items():
        assert torch.equal(fresh.state_dict()[k], v), k
    assert fresh.head.weight is fresh.embed.weight

    class Untied(TiedLM):  # a model without the tie gets the alias filled from the saved tensor
        def __init__(self):
            super().__init__()
            self.head.weight = nn.Parameter(torch.zeros(50, 16))

    untied = Untied()
    load_safetensors_into(untied, tmp_path / "out")
    assert torch.equal(untied.head.weight, untied.embed.weight)


@pytest.mark.parametrize("offload", ["disk", "cpu"])
def test_save_model_reads_the_weights_of_an_offloaded_model(tmp_path, offload):
    import accel_nb

    accelerator, _, _, _ = _setup()
    torch.manual_seed(1)
    model = TiedLM()
    expected = {k: v.clone() for k, v in model.state_dict().items()}
    if offload == "disk":
        accel_nb.disk_offload(model, str(tmp_path / "offload"), execution_device="cpu")
    else:
        accel_nb.cpu_offload(model, execution_device="cpu")
    assert any(p.device.type == "meta" for p in model.parameters())  # what plain state_dict() cannot save
    accelerator.save_model(model, tmp_path / "out")
    fresh = TiedLM()
    load_safetensors_into(fresh, tmp_path / "out")
    for k, v in expected.items():
        assert torch.equal(fresh.state_dict()[k], v), k
    assert fresh.head.weight is fresh.embed.weight


def _save_model_on_ranks(out):
    from accel_nb import Accelerator

    torch.manual_seed(0)
    accelerator = Accelerator(cpu=True)
    model = accelerator.prepare(TiedLM())
    files = accelerator.save_model(model, out, max_shard_size="3KB")
    accelerator.wait_for_everyone()
    return [os.path.basename(f) for f in files], {
        k: v.numpy().copy() for k, v in accelerator.unwrap_model(model).state_dict().items()
    }


@pytest.mark.multiproc
def test_save_model_writes_on_the_main_process_only(tmp_path):
    out = str(tmp_path / "out")
    (files0, weights), (files1, _) = run_ranks(_save_model_on_ranks, 2, args=(out,))
    assert files1 == [] and len(files0) >= 3 and files0[-1] == "model.safetensors.index.json"
    fresh = TiedLM()
    load_safetensors_into(fresh, out)
    for k, v in fresh.state_dict().items():
        assert (v.numpy() == weights[k]).all(), k


# -- bad input ---------------------------------------------------------------------------------------
def _saved(tmp_path):
    accelerator, model, optimizer, scheduler = _setup()
    _train_step(accelerator, model, optimizer, scheduler)
    return accelerator, model, accelerator.save_state(tmp_path / "c")


def test_truncated_weights_file_is_named_and_nothing_changes(tmp_path):
    accelerator, model, path = _saved(tmp_path)
    weights = os.path.join(path, "model.safetensors")
    with open(weights, "r+b") as f:
        f.truncate(os.path.getsize(weights) - 100)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(
        CheckpointError, match=r"model.safetensors has \d+ bytes but the checkpoint manifest says"
    ):
        accelerator.load_state(path)
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k])


def test_corrupted_bytes_are_caught(tmp_path):
    accelerator, _, path = _saved(tmp_path)
    weights = os.path.join(path, "model.safetensors")
    data = bytearray(open(weights, "rb").read())
    data[-5] ^= 0xFF  # flip a byte inside the tensor data
    open(weights, "wb").write(bytes(data))
    with pytest.raises(CheckpointError, match="model.safetensors does not match its checksum"):
        accelerator.load_state(path)


def test_missing_file_and_missing_manifest(tmp_path):
    accelerator, _, path = _saved(tmp_path)
    os.remove(os.path.join(path, "optimizer.bin"))
    with pytest.raises(CheckpointError, match="optimizer.bin is missing from the checkpoint"):
        accelerator.load_state(path)
    os.remove(os.path.join(path, MANIFEST_NAME))
    with pytest.raises(CheckpointError, match="not a complete checkpoint"):
        accelerator.load_state(path)
    with pytest.raises(CheckpointError, match="does not exist"):
        accelerator.load_state(tmp_path / "nowhere")


def test_model_shape_mismatch_names_the_tensor(tmp_path):
    from accel_nb import Accelerator

    _, _, path = _saved(tmp_path)
    _reset_all_states()
    accelerator = Accelerator(cpu=True)
    other = TiedLM(dim=8)
    optimizer = torch.optim.AdamW(other.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    other, optimizer, scheduler = accelerator.prepare(other, optimizer, scheduler)
    before = {k: v.clone() for k, v in other.state_dict().items()}
    with pytest.raises(
        CheckpointError,
        match=r"'blocks.0.weight': checkpoint \[16, 16\] in model.safetensors, TiedLM \[8, 8\]",
    ):
        accelerator.load_state(path)
    for k, v in other.state_dict().items():
        assert torch.equal(v, before[k])


def test_different_objects_are_a_clear_error(tmp_path):
    from accel_nb import Accelerator

    _, _, path = _saved(tmp_path)
    _reset_all_states()
    accelerator = Accelerator(cpu=True)
    accelerator.prepare(TiedLM())
    with pytest.raises(CheckpointError, match=r"holds 1 optimizer\(s\) but this Accelerator has 0"):
        accelerator.load_state(path)


def test_pickled_objects_need_an_explicit_opt_in(tmp_path):
    accelerator, *_ = _setup()
    box = Box({"when": Box(3)})  # an arbitrary Python object inside the state
    accelerator.register_for_checkpointing(box)
    path = accelerator.save_state(tmp_path / "c")
    box.value = None
    with pytest.raises(
        CheckpointError, match=r"custom_checkpoint_0.bin holds Python objects.*weights_only=False"
    ):
        accelerator.load_state(path)
    assert box.value is None  # refused before anything was applied
    accelerator.load_state(path, weights_only=False)
    assert box.value["when"].value == 3


def test_a_failing_save_raises_and_leaves_no_temp_folder(tmp_path):
    accelerator, *_ = _setup()
    previous = accelerator.save_state(tmp_path / "c")

    class Broken(Box):
        def state_dict(self):
            raise RuntimeError("disk on fire")

    accelerator.register_for_checkpointing(Broken(1))
    with pytest.raises(
        CheckpointError, match=r"save_state\(.*c\) failed on rank 0: RuntimeError: disk on fire"
    ):
        accelerator.save_state(tmp_path / "c")
    assert sorted(os.listdir(tmp_path)) == ["c"] and is_complete_checkpoint(previous)


@pytest.mark.gpu
def test_round_trip_on_cuda(tmp_path):
    from accel_nb import Accelerator

    accelerator = Accelerator()
    assert accelerator.device.type == "cuda"
    torch.manual_seed(0)
    model = TiedLM()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    model, optimizer = accelerator.prepare(model, optimizer)
    loss = model(torch.randint(0, 50, (4, 5), device=accelerator.device)).logsumexp(-1).mean()
    accelerator.backward(loss)
    optimizer.step()
    path = accelerator.save_state(tmp_path / "c")
    expected = {k: v.clone() for k, v in model.state_dict().items()}
    expected_next = torch.rand(3, device="cuda")
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    accelerator.load_state(path)
    for k, v in model.state_dict().items():
        assert v.device.type == "cuda" and torch.equal(v, expected[k]), k
    assert torch.equal(torch.rand(3, device="cuda"), expected_next)  # the CUDA RNG was restored
    files = accelerator.save_model(model, tmp_path / "out", max_shard_size="2KB")
    fresh = TiedLM()
    load_safetensors_into(fresh, tmp_path / "out")
    assert len(files) > 2 and torch.equal(fresh.blocks[0].weight, expected["blocks.0.weight"].cpu())


def test_pickle_weights_when_not_safe(tmp_path):
    accelerator, model, optimizer, scheduler = _setup()
    _train_step(accelerator, model, optimizer, scheduler)
    path = accelerator.save_state(tmp_path / "c", safe_serialization=False)
    assert "pytorch_model.bin" in os.listdir(path) and "model.safetensors" not in os.listdir(path)
    expected = {k: v.clone() for k, v in model.state_dict().items()}
    _train_step(accelerator, model, optimizer, scheduler)
    accelerator.load_state(path)  # a plain state dict of tensors passes the safe loader
    for k, v in model.state_dict().items():
        assert torch.equal(v, expected[k]), k
