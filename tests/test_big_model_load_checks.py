"""Checks before loading, and a model left as it was when loading or dispatching fails."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from accel_nb.big_model import (
    CheckpointLoadError,
    DeviceMapError,
    cpu_offload,
    dispatch_model,
    init_empty_weights,
    load_checkpoint_and_dispatch,
    load_checkpoint_in_model,
)
from accel_nb.serialization import save_sharded_safetensors
from tests.test_big_model import Stack

MISSING_GPU = torch.cuda.device_count() if torch.cuda.is_available() else 0  # a GPU this machine lacks


def _empty() -> Stack:
    with init_empty_weights():
        return Stack().eval()


def _state(model: nn.Module) -> list[tuple[str, int, str, torch.Tensor]]:
    """What the model holds: each slot's tensor object, device, and a copy of its values (if any)."""
    out = []
    for name, t in list(model.named_parameters(remove_duplicate=False)) + list(model.named_buffers()):
        values = None if t.device.type == "meta" else t.detach().clone()
        out.append((name, id(t), str(t.device), values))
    return out


def _assert_unchanged(model: nn.Module, before) -> None:
    after = _state(model)
    assert [(n, i, d) for n, i, d, _ in after] == [(n, i, d) for n, i, d, _ in before]
    for (name, _, _, old), (_, _, _, new) in zip(before, after):
        assert (old is None and new is None) or torch.equal(old, new), name
    hooked = [n for n, m in model.named_modules() if "forward" in m.__dict__]
    assert not hooked, f"hooks left on {hooked}"
    assert not hasattr(model, "hf_device_map") and not hasattr(model, "_accel_nb_engine")


@pytest.fixture()
def ckpt(tmp_path):
    torch.manual_seed(0)
    ref = Stack().eval()
    save_sharded_safetensors(ref.state_dict(), str(tmp_path / "ckpt"), max_shard_size="8KB")
    return ref, str(tmp_path / "ckpt")


def test_integer_checkpoint_tensor_for_a_float_parameter_is_refused_before_reading(tmp_path):
    from safetensors.torch import save_file

    torch.manual_seed(0)
    sd = {k: v.clone() for k, v in Stack().state_dict().items() if k != "head.weight"}
    sd["blocks.3.fc1.weight"] = torch.ones_like(sd["blocks.3.fc1.weight"], dtype=torch.int64)
    save_file(sd, str(tmp_path / "model.safetensors"))
    for load in (
        lambda m: load_checkpoint_in_model(m, str(tmp_path / "model.safetensors")),
        lambda m: load_checkpoint_and_dispatch(m, str(tmp_path), device_map={"": "cpu"}),
    ):
        model = _empty()
        before = _state(model)
        with pytest.raises(CheckpointLoadError) as info:
            load(model)
        msg = str(info.value)
        assert (
            "'blocks.3.fc1.weight' is torch.int64 in model.safetensors but torch.float32 in the model" in msg
        )
        assert "Nothing was loaded" in msg
        _assert_unchanged(model, before)
    real = Stack()  # a model with weights keeps them
    before = _state(real)
    with pytest.raises(CheckpointLoadError, match="dtype mismatch"):
        load_checkpoint_in_model(real, str(tmp_path / "model.safetensors"))
    _assert_unchanged(real, before)


def test_a_gpu_this_machine_lacks_is_named_before_anything_moves(ckpt):
    _, path = ckpt
    gpu = f"GPU {MISSING_GPU}"
    model = _empty()
    before = _state(model)
    with pytest.raises(DeviceMapError) as info:
        load_checkpoint_and_dispatch(model, path, max_memory={MISSING_GPU: "1GB", "cpu": "1GB"})
    assert f"max_memory names {gpu} but this machine has" in str(info.value)
    _assert_unchanged(model, before)
    with pytest.raises(DeviceMapError, match=f"device_map names {gpu} but"):
        load_checkpoint_and_dispatch(model, path, device_map={"": f"cuda:{MISSING_GPU}"})
    _assert_unchanged(model, before)
    with pytest.raises(DeviceMapError, match=f"device_map names {gpu} but"):
        load_checkpoint_in_model(
            model, path, device_map={"embed": MISSING_GPU, "scale": "cpu", "blocks": "cpu", "head": "cpu"}
        )
    _assert_unchanged(model, before)
    torch.manual_seed(0)
    real = Stack().eval()
    before = _state(real)
    with pytest.raises(DeviceMapError, match=f"device_map names {gpu} but"):
        dispatch_model(real, {"": MISSING_GPU})
    with pytest.raises(DeviceMapError, match=f"execution_device names {gpu} but"):
        cpu_offload(real, execution_device=MISSING_GPU)
    _assert_unchanged(real, before)


class NoForward(nn.Module):
    """Holds a weight but has no forward of its own: cannot be a device-map entry by itself."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(4))


class WithHolder(Stack):
    def __init__(self) -> None:
        super().__init__()
        self.holder = NoForward()


def test_a_dispatch_failing_part_way_leaves_the_loaded_model_as_it_was(tmp_path):
    torch.manual_seed(0)
    ref = WithHolder().eval()
    save_sharded_safetensors(ref.state_dict(), str(tmp_path / "ckpt"), max_shard_size="8KB")
    with init_empty_weights():
        model = WithHolder().eval()
    before = _state(model)
    # every block is loaded and hooked before the last entry turns out to have no forward
    dm = {"embed": "cpu", "scale": "cpu", "blocks": "cpu", "head": "cpu", "holder": "cpu"}
    with pytest.raises(DeviceMapError, match="'holder' .*has no forward"):
        load_checkpoint_and_dispatch(model, str(tmp_path / "ckpt"), device_map=dm)
    _assert_unchanged(model, before)  # all still on meta, the same objects, no hooks


def test_a_dispatch_of_real_weights_failing_part_way_changes_nothing(tmp_path):
    torch.manual_seed(1)
    model = Stack().eval()
    ids = torch.randint(0, 50, (2, 5))
    with torch.no_grad():
        want = model(ids)
    before = _state(model)
    dm = {"embed": "cpu", "scale": "cpu", "head": "cpu"}
    dm.update({f"blocks.{i}": "cpu" for i in range(5)})
    dm["blocks.5"] = "disk"  # in-memory weights for disk need an offload folder: found after 5 blocks
    with pytest.raises(DeviceMapError, match="no offload folder"):
        dispatch_model(model, dm, main_device="cpu", buffered=True)
    _assert_unchanged(model, before)
    with torch.no_grad():
        assert torch.equal(model(ids), want)


def test_pickle_weights_for_disk_without_an_offload_folder_load_nothing(tmp_path):
    torch.manual_seed(2)
    torch.save(Stack().state_dict(), str(tmp_path / "w.pt"))
    model = _empty()
    before = _state(model)
    dm = {"embed": "cpu", "scale": "cpu", "head": "cpu", "blocks": "disk"}
    with pytest.raises(CheckpointLoadError, match=r"sends blocks\.0\..* to 'disk'.*offload_folder=.*Nothing"):
        load_checkpoint_in_model(model, str(tmp_path / "w.pt"), device_map=dm, allow_pickle=True)
    _assert_unchanged(model, before)
