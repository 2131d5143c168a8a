"""Safetensors I/O in the Hugging Face sharded layout: sizes, shards, index, ties, bad files."""

from __future__ import annotations

import json
import os
import struct

import pytest
import torch
from torch import nn

from accel_nb.serialization import (
    ALIASES_KEY,
    CheckpointError,
    index_checkpoint,
    load_safetensors_into,
    load_safetensors_state_dict,
    parse_size,
    read_safetensors_header,
    save_sharded_safetensors,
    tensor_info,
)


class TiedLM(nn.Module):
    def __init__(self, vocab=64, dim=16, layers=3):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(nn.Linear(dim, dim) for _ in range(layers))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.embed.weight  # tied

    def forward(self, x):
        h = self.embed(x)
        for b in self.blocks:
            h = torch.relu(b(h))
        return self.head(self.norm(h))


def _same(a: nn.Module, b: nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert list(sa) == list(sb)
    for k in sa:
        assert torch.equal(sa[k], sb[k]), k


# -- sizes -------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "text,expected",
    [
        ("10GB", 10 * 10**9),
        ("500MB", 500 * 10**6),
        ("2GiB", 2 * 2**30),
        ("1.5KB", 1500),
        ("64 kib", 65536),
        (123, 123),
        ("77", 77),
    ],
)
def test_parse_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("bad", ["10XB", "", "GB", -5, 0, "abc"])
def test_parse_size_rejects_nonsense(bad):
    with pytest.raises(ValueError, match="size"):
        parse_size(bad)


# -- save + index + load -----------------------------------------------------------------------------
def test_single_file_when_it_fits(tmp_path):
    torch.manual_seed(0)
    model = TiedLM()
    files = save_sharded_safetensors(model.state_dict(), tmp_path)
    assert [os.path.basename(f) for f in files] == ["model.safetensors"]
    assert sorted(os.listdir(tmp_path)) == ["model.safetensors"]  # no temp files left behind
    index = index_checkpoint(tmp_path)
    assert index.files == [str(tmp_path / "model.safetensors")]
    assert index.aliases == {"head.weight": "embed.weight"}
    assert "head.weight" not in index.weight_map  # saved once
    fresh = TiedLM()
    load_safetensors_into(fresh, index)
    _same(model, fresh)
    assert fresh.head.weight is fresh.embed.weight


def test_sharded_layout_matches_the_ecosystem(tmp_path):
    torch.manual_seed(0)
    model = TiedLM(vocab=128, dim=32, layers=4)
    files = save_sharded_safetensors(model.state_dict(), tmp_path, max_shard_size="5KB")
    names = sorted(os.listdir(tmp_path))
    shards = [n for n in names if n.endswith(".safetensors")]
    assert len(shards) >= 3 and "model.safetensors.index.json" in names
    assert shards[0] == f"model-00001-of-{len(shards):05d}.safetensors"
    index_json = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert set(index_json) == {"metadata", "weight_map"}
    assert set(index_json["metadata"]) == {"total_size", "save_id", "aliases"}
    sd = model.state_dict()
    saved = {k: v for k, v in sd.items() if k != "head.weight"}
    assert set(index_json["weight_map"]) == set(saved)
    assert set(index_json["weight_map"].values()) == set(shards)
    assert index_json["metadata"]["total_size"] == sum(v.numel() * v.element_size() for v in saved.values())
    # every shard but one-tensor ones stays under the limit
    for shard in shards:
        tensors, meta = read_safetensors_header(str(tmp_path / shard))
        assert meta["format"] == "pt"
        size = sum(h.offsets[1] - h.offsets[0] for h in tensors.values())
        assert size <= 5000 or len(tensors) == 1
    assert files[-1].endswith("model.safetensors.index.json")
    # the reference ecosystem reads it (safetensors' own loader, shard by shard)
    from safetensors.torch import load_file

    merged = {}
    for shard in shards:
        merged.update(load_file(str(tmp_path / shard)))
    for k, v in saved.items():
        assert torch.equal(merged[k], v)
    fresh = TiedLM(vocab=128, dim=32, layers=4)
    load_safetensors_into(fresh, tmp_path / "model.safetensors.index.json")
    _same(model, fresh)
    assert tensor_info(index_checkpoint(tmp_path), "head.weight") == (torch.float32, (128, 32))


def test_resave_replaces_stale_shards_and_index(tmp_path):
    sd = {f"w{i}": torch.full((100,), float(i)) for i in range(6)}
    save_sharded_safetensors(sd, tmp_path, max_shard_size=450)
    assert len([n for n in os.listdir(tmp_path) if n.endswith(".safetensors")]) == 6
    save_sharded_safetensors(sd, tmp_path, max_shard_size=900)
    assert len([n for n in os.listdir(tmp_path) if n.endswith(".safetensors")]) == 3
    save_sharded_safetensors(sd, tmp_path)
    assert sorted(os.listdir(tmp_path)) == ["model.safetensors"]
    assert torch.equal(load_safetensors_state_dict(tmp_path)["w5"], sd["w5"])


def test_views_and_noncontiguous_tensors_are_written_correctly(tmp_path):
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    sd = {
        "base": base,
        "same": base,  # exact alias
        "row": base[1],  # shares storage, different view
        "t": base.t(),  # non-contiguous view
        "empty": torch.zeros(0),
        "half": torch.randn(3, 3, dtype=torch.bfloat16),
    }
    save_sharded_safetensors(sd, tmp_path)
    out = load_safetensors_state_dict(tmp_path)
    for k, v in sd.items():
        assert out[k].dtype == v.dtype and torch.equal(out[k], v), k
    assert index_checkpoint(tmp_path).aliases == {"same": "base"}
    assert out["same"] is out["base"]


def test_transformers_reads_our_shards(tmp_path):
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=32)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config).eval()
    config.save_pretrained(tmp_path)
    save_sharded_safetensors(model.state_dict(), tmp_path, max_shard_size="20KB")
    assert (tmp_path / "model.safetensors.index.json").exists()
    loaded = transformers.GPT2LMHeadModel.from_pretrained(tmp_path).eval()
    ids = torch.randint(0, 100, (1, 8))
    with torch.no_grad():
        assert torch.equal(model(ids).logits, loaded(ids).logits)
    assert loaded.lm_head.weight.data_ptr() == loaded.transformer.wte.weight.data_ptr()


def test_metadata_is_kept(tmp_path):
    save_sharded_safetensors({"a": torch.ones(2)}, tmp_path, metadata={"step": 7})
    index = index_checkpoint(tmp_path / "model.safetensors")
    assert index.metadata["step"] == "7" and ALIASES_KEY not in index.metadata


def test_meta_and_non_tensor_entries_are_refused(tmp_path):
    with pytest.raises(CheckpointError, match="'m'.*meta device"):
        save_sharded_safetensors({"m": torch.empty(2, device="meta")}, tmp_path)
    with pytest.raises(CheckpointError, match="'n'.*not a tensor"):
        save_sharded_safetensors({"n": 3}, tmp_path)


# -- bad input ---------------------------------------------------------------------------------------
def _sharded(tmp_path):
    torch.manual_seed(0)
    model = TiedLM()
    save_sharded_safetensors(model.state_dict(), tmp_path, max_shard_size="3KB")
    shards = sorted(n for n in os.listdir(tmp_path) if n.endswith(".safetensors"))
    return model, shards


def test_truncated_file_names_the_file_and_nothing_is_loaded(tmp_path):
    model, shards = _sharded(tmp_path)
    victim = tmp_path / shards[-1]
    data = victim.read_bytes()
    victim.write_bytes(data[: len(data) - 10])
    fresh = TiedLM()
    before = {k: v.clone() for k, v in fresh.state_dict().items()}
    with pytest.raises(CheckpointError, match=rf"{shards[-1]} is truncated.*tensor '.*'"):
        load_safetensors_into(fresh, tmp_path)
    for k, v in fresh.state_dict().items():
        assert torch.equal(v, before[k])


def test_truncated_inside_header(tmp_path):
    save_sharded_safetensors({"a": torch.ones(4)}, tmp_path)
    path = tmp_path / "model.safetensors"
    path.write_bytes(path.read_bytes()[:20])
    with pytest.raises(CheckpointError, match="model.safetensors is truncated"):
        index_checkpoint(tmp_path)
    path.write_bytes(b"abc")
    with pytest.raises(CheckpointError, match="truncated"):
        index_checkpoint(path)


def test_corrupted_header_and_trailing_garbage(tmp_path):
    save_sharded_safetensors({"a": torch.ones(4)}, tmp_path)
    path = tmp_path / "model.safetensors"
    good = path.read_bytes()
    (n,) = struct.unpack("<Q", good[:8])
    path.write_bytes(good[:8] + b"\xff" * n + good[8 + n :])
    with pytest.raises(CheckpointError, match="corrupted safetensors header"):
        index_checkpoint(path)
    path.write_bytes(good + b"junk")
    with pytest.raises(CheckpointError, match="trailing bytes"):
        index_checkpoint(path)
    path.write_bytes(good.replace(b'"F32"', b'"F64"'))
    with pytest.raises(CheckpointError, match="tensor 'a'"):
        index_checkpoint(path)


def test_missing_shard_names_shard_and_index(tmp_path):
    _, shards = _sharded(tmp_path)
    os.remove(tmp_path / shards[1])
    with pytest.raises(
        CheckpointError, match=rf"shard {shards[1]} named by .*model.safetensors.index.json is missing"
    ):
        index_checkpoint(tmp_path)


def test_index_naming_a_missing_tensor(tmp_path):
    _, shards = _sharded(tmp_path)
    index_path = tmp_path / "model.safetensors.index.json"
    data = json.loads(index_path.read_text())
    data["weight_map"]["blocks.9.weight"] = shards[0]
    index_path.write_text(json.dumps(data))
    with pytest.raises(CheckpointError, match=rf"tensor 'blocks.9.weight' is in {shards[0]}.*no such tensor"):
        index_checkpoint(tmp_path)


def test_shape_mismatch_missing_and_unexpected_are_listed_together(tmp_path):
    _sharded(tmp_path)
    other = TiedLM(dim=8)
    with pytest.raises(
        CheckpointError, match=r"shape mismatch.*'blocks.0.weight': checkpoint \[16, 16\].*TiedLM \[8, 8\]"
    ):
        load_safetensors_into(other, tmp_path)
    fewer = TiedLM(layers=2)
    with pytest.raises(CheckpointError, match=r"unexpected key\(s\): blocks.2.bias, blocks.2.weight"):
        load_safetensors_into(fewer, tmp_path)
    more = TiedLM(layers=4)
    with pytest.raises(
        CheckpointError, match=r"missing key\(s\): blocks.3.bias, blocks.3.weight.*strict=False"
    ):
        load_safetensors_into(more, tmp_path)
    result = load_safetensors_into(more, tmp_path, strict=False)
    assert result.missing_keys == ["blocks.3.bias", "blocks.3.weight"] and result.unexpected_keys == []


def test_folder_without_a_checkpoint(tmp_path):
    (tmp_path / "pytorch_model.bin").write_bytes(b"x")
    with pytest.raises(CheckpointError, match="no safetensors checkpoint.*pytorch_model.bin"):
        index_checkpoint(tmp_path)
    with pytest.raises(CheckpointError, match="does not exist"):
        index_checkpoint(tmp_path / "nope.safetensors")


def test_pickle_layout_when_not_safe(tmp_path):
    sd = {f"w{i}": torch.full((100,), float(i)) for i in range(4)}
    save_sharded_safetensors(sd, tmp_path, max_shard_size=900, safe_serialization=False)
    names = sorted(os.listdir(tmp_path))
    assert names == [
        "pytorch_model-00001-of-00002.bin",
        "pytorch_model-00002-of-00002.bin",
        "pytorch_model.bin.index.json",
    ]
    part = torch.load(tmp_path / names[0], weights_only=True)
    assert torch.equal(part["w0"], sd["w0"])


def test_shards_from_two_saves_are_not_mixed(tmp_path):
    """A re-save killed after rewriting some shards (same shard count) must not load as one model."""
    sd = {f"w{i}": torch.full((100,), float(i)) for i in range(4)}
    save_sharded_safetensors(sd, tmp_path / "a", max_shard_size=900)
    newer = {k: v + 1 for k, v in sd.items()}
    save_sharded_safetensors(newer, tmp_path / "b", max_shard_size=900)
    shard = "model-00001-of-00002.safetensors"
    os.replace(tmp_path / "b" / shard, tmp_path / "a" / shard)  # as if the new save died after shard 1
    with pytest.raises(CheckpointError, match=rf"shard {shard} does not belong to the save described by"):
        index_checkpoint(tmp_path / "a")
