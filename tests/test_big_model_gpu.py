"""Big-model dispatch and the streaming offload engine on a CUDA GPU (skipped without one)."""

from __future__ import annotations

import pytest
import torch

from accel_nb.big_model import (
    compute_module_sizes,
    cpu_offload,
    init_empty_weights,
    load_checkpoint_and_dispatch,
)
from accel_nb.serialization import save_sharded_safetensors
from tests.test_big_model import Stack

pytestmark = pytest.mark.gpu


def _ref():
    torch.manual_seed(0)
    return Stack(d=64, n=8).eval()


def test_gpu_plus_cpu_plus_disk_matches_cpu(tmp_path):
    ref = _ref()
    save_sharded_safetensors(ref.state_dict(), str(tmp_path / "ckpt"), max_shard_size="40KB")
    ids = torch.randint(0, 50, (4, 16))
    with torch.no_grad():
        want = ref(ids)
    dm = {
        "embed": 0,
        "scale": 0,
        "head": 0,
        "blocks.0": 0,
        "blocks.1": 0,
        "blocks.2": "cpu",
        "blocks.3": "cpu",
        "blocks.4": "disk",
        "blocks.5": "cpu",
        "blocks.6": "disk",
        "blocks.7": 0,
    }
    with init_empty_weights():
        m = Stack(d=64, n=8).eval()
    m = load_checkpoint_and_dispatch(
        m, str(tmp_path / "ckpt"), device_map=dm, offload_folder=str(tmp_path / "off")
    )
    engine = m._accel_nb_engine
    assert engine.device == torch.device("cuda", 0) and len(engine._buffers) == 2
    assert engine.units and all(u.source in ("cpu", "disk") for u in engine.units)
    assert all(u.packed is None or u.packed.is_pinned() for u in engine.units)
    with torch.no_grad():
        for _ in range(3):  # first pass learns the order, later ones prefetch along it
            got = m(ids)
            assert got.device.type == "cpu"  # outputs come back to the inputs' device
            assert torch.allclose(got, want, atol=1e-5)
    assert m.blocks[2].fc1.weight.device.type == "meta"
    assert engine.bytes_streamed > 0


def test_cpu_offload_to_gpu_streams_with_two_buffers():
    ref = _ref()
    ids = torch.randint(0, 50, (2, 8))
    with torch.no_grad():
        want = ref(ids)
    m = _ref()
    cpu_offload(m, execution_device=0)
    with torch.no_grad():
        got = m(ids.cuda())
    assert got.device.type == "cuda" and torch.allclose(got.cpu(), want, atol=1e-5)
    assert len(m._accel_nb_engine._buffers) == 2


def test_auto_map_on_gpu_with_budget(tmp_path):
    ref = _ref()
    save_sharded_safetensors(ref.state_dict(), str(tmp_path / "ckpt"))
    with init_empty_weights():
        m = Stack(d=64, n=8).eval()
    sizes = compute_module_sizes(m)
    budget = {0: sizes["embed"] + 5 * sizes["blocks.0"], "cpu": "1GiB"}
    m = load_checkpoint_and_dispatch(
        m, str(tmp_path / "ckpt"), device_map="auto", max_memory=budget, no_split_module_classes=["Block"]
    )
    assert {0, "cpu"} <= set(m.hf_device_map.values())
    ids = torch.randint(0, 50, (2, 8))
    with torch.no_grad():
        assert torch.allclose(m(ids), ref(ids), atol=1e-5)


def test_planned_headroom_is_what_the_engine_allocates_on_the_gpu(tmp_path):
    from accel_nb.big_model import infer_auto_device_map

    ref = _ref()
    save_sharded_safetensors(ref.state_dict(), str(tmp_path / "ckpt"))
    with init_empty_weights():
        m = Stack(d=64, n=8).eval()
    sizes = compute_module_sizes(m)
    budget = {0: sizes[""] // 2, "cpu": "1GiB"}
    dm = infer_auto_device_map(m, budget, ["Block"])
    assert {0, "cpu"} == set(dm.values()) and dm.plan.headroom[0] > 0
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated(0)
    m = load_checkpoint_and_dispatch(
        m, str(tmp_path / "ckpt"), device_map=dict(dm), no_split_module_classes=["Block"]
    )
    engine = m._accel_nb_engine
    allocated = sum(b.data.numel() for b in engine._buffers)
    assert allocated == dm.plan.headroom[0]  # Stack's only buffer ('scale') sits on GPU 0 itself
    on_gpu = torch.cuda.memory_allocated(0) - before
    # weights + engine buffers stay in the budget (the caching allocator rounds each tensor to 512 B)
    assert on_gpu <= budget[0] + 16 * 1024, (on_gpu, budget[0])
    ids = torch.randint(0, 50, (2, 8))
    with torch.no_grad():
        assert torch.allclose(m(ids), ref(ids), atol=1e-5)
