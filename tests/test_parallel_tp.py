"""ParallelismConfig and tensor parallel × FSDP2 through Accelerator.prepare, on real gloo ranks on CPU.

One 4-process launch (dp_shard=2 × tp=2) trains a small transformers Llama built from a config and
checks, against the same loop on one plain process: the losses, gradient norms and final weights over
20 steps; the mesh and each rank's coordinates; each rank's measured share of the parameter bytes;
the batches each rank read; FSDP2's view-tensor warning not shown, an in-place op on the logits refused;
gather_for_metrics keeping each sample once; a plan naming a missing module; save_state/load_state resuming exactly;
save_model writing one full safetensors model. The rest are checks that need no processes.
"""

from __future__ import annotations

import logging
import os
import warnings

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from accel_nb.env_names import ENV_USE_PARALLELISM_CONFIG, PARALLELISM_ENV
from accel_nb.parallel import ParallelismConfig
from tests.dist_helpers import run_ranks

pytestmark = pytest.mark.usefixtures("fresh_state")  # tests/conftest.py: one process, fresh state

STEPS = 20


def _llama() -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=True,  # the embedding and the output layer share one weight: split once, kept tied
    )
    return LlamaForCausalLM(config)


def _tokens() -> TensorDataset:
    g = torch.Generator().manual_seed(1)
    return TensorDataset(torch.randint(0, 64, (8 * (STEPS + 3), 12), generator=g))


def _train(folder: str | None, sizes: dict | None, batch_size: int) -> dict:
    """STEPS clipped SGD-with-momentum steps of the Llama; on the parallel run also the checks listed in the module doc."""
    from accel_nb import Accelerator
    from accel_nb import ParallelismConfig as TopLevel
    from accel_nb.fsdp.sharding import local_shard_bytes

    acc = Accelerator(parallelism_config=TopLevel(**sizes) if sizes else None)
    out: dict = {}
    model = _llama()
    if sizes:
        mesh = acc.torch_device_mesh
        out["mesh"] = (tuple(mesh.mesh_dim_names), tuple(mesh.shape))
        out["coords"] = (acc.data_parallel_shard_rank, acc.tensor_parallel_rank, acc.data_parallel_rank)
        out["tp_group"] = mesh["tp"].mesh.tolist()
        # a plan naming a module the model lacks: a clear error before any collective, nothing changed
        plan, acc.parallelism_config.tp_plan = (
            acc.parallelism_config.tp_plan,
            {"model.layers.*.mlp.nope": "colwise"},
        )
        try:
            acc.prepare(_llama())
        except ValueError as exc:
            out["bad_plan"] = str(exc)
        acc.parallelism_config.tp_plan = plan
    full_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    planned = sum(p.numel() * p.element_size() for n, p in model.named_parameters() if "norm" not in n)
    opt = torch.optim.SGD(
        model.parameters(), lr=0.5, momentum=0.9
    )  # AdamW would blow rounding up (1/sqrt(v))
    model, opt, dl = acc.prepare(model, opt, DataLoader(_tokens(), batch_size=batch_size))
    batches = iter(dl)
    losses, norms, seen = [], [], []

    def step(x, first=False):
        with warnings.catch_warnings(record=True) as said:
            result = model(input_ids=x, labels=x)
        if first and sizes:  # issue 41, item 5: what FSDP2 warned about the output, and an in-place op on it
            out["view_warnings"] = [
                str(w.message) for w in said if "returned a view tensor" in str(w.message)
            ]
            out["logits_is_view"] = result.logits._base is not None
            try:
                result.logits.div_(2.0)
                out["inplace"] = "allowed"
            except RuntimeError as exc:
                out["inplace"] = str(exc)
        loss = result.loss
        acc.backward(loss)
        norms.append(float(acc.clip_grad_norm_(model.parameters(), 1.0)))
        opt.step()
        opt.zero_grad()
        return acc.reduce(loss.detach(), "mean").item()

    redistributed: list[str] = []  # DTensor's "N sequential all_reduce operations" warning (clipping)
    catcher = logging.Handler()
    catcher.emit = lambda record: redistributed.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger("torch.distributed.tensor._redistribute").addHandler(catcher)
    for i in range(STEPS):
        (x,) = next(batches)
        seen.append(x[:, 0].tolist())
        losses.append(step(x, first=i == 0))
    logging.getLogger("torch.distributed.tensor._redistribute").removeHandler(catcher)
    out["redistributed"] = [m for m in redistributed if "sequential" in m]
    out.update(
        losses=losses,
        norms=norms,
        seen=seen,
        weights={k: v.detach().cpu().numpy().copy() for k, v in acc.get_state_dict(model).items()},
        param_bytes=local_shard_bytes(model.parameters()),
        full_bytes=full_bytes,
        planned_bytes=planned,
    )
    if folder is None:
        return out
    out["gathered"] = acc.gather(torch.tensor([float(acc.process_index)])).tolist()
    out["still_tied"] = (
        acc.unwrap_model(model).lm_head.weight is acc.unwrap_model(model).model.embed_tokens.weight
    )
    # gather_for_metrics: each sample once (the two ranks of a tp group read the same), padding dropped
    evaluation = acc.prepare(DataLoader(TensorDataset(torch.arange(10)), batch_size=2))
    out["metrics"] = [v for (x,) in evaluation for v in acc.gather_for_metrics(x).tolist()]
    out["metric_objects"] = [v for (x,) in evaluation for v in acc.gather_for_metrics(x.tolist(), True)]
    # resume exactly: three steps after save_state, then load_state and the same three batches again
    acc.save_state(os.path.join(folder, "ckpt"))
    acc.save_model(model, os.path.join(folder, "weights"))
    nxt = [next(batches)[0] for _ in range(3)]
    after = [step(x) for x in nxt]
    acc.load_state(os.path.join(folder, "ckpt"))
    again = [step(x) for x in nxt]
    out.update(after=after, again=again)
    return out


@pytest.mark.multiproc
def test_tp2_x_fsdp2_on_four_ranks_matches_one_process_and_round_trips(tmp_path):
    reference = _train(None, None, batch_size=8)
    # timeout: a hang guard only (4 ranks importing transformers on a loaded 2-core machine are slow)
    ranks = run_ranks(
        _train, world_size=4, args=(str(tmp_path), {"dp_shard_size": 2, "tp_size": 2}, 4), timeout=600
    )
    main = ranks[0]
    # the mesh: tp innermost (ranks 0,1 and 2,3 split the layers), dp_shard outermost
    assert main["mesh"] == (("dp_shard", "tp"), (2, 2))
    assert [r["coords"] for r in ranks] == [(0, 0, 0), (0, 1, 0), (1, 0, 0), (1, 1, 0)]
    assert [r["tp_group"] for r in ranks] == [[0, 1], [0, 1], [2, 3], [2, 3]]
    # both ranks of a tp group read the same batches; the two dp_shard groups read different ones
    assert ranks[0]["seen"] == ranks[1]["seen"] and ranks[2]["seen"] == ranks[3]["seen"]
    assert ranks[0]["seen"] != ranks[2]["seen"]
    # a bad plan: named, with the fix
    assert "'model.layers.*.mlp.nope'" in main["bad_plan"] and "does not have" in main["bad_plan"]
    # FSDP2's "returned a view tensor ... will silently drop the pre-backward hook ... wrong gradients"
    # (issue 41, item 5): the view is the logits leaving the plan through DTensor's to_local; autograd
    # refuses an in-place op on it (loudly, nothing changed: the losses and norms below still match),
    # so prepare does not show that warning
    for r in ranks:
        assert r["logits_is_view"] and r["view_warnings"] == [], r["view_warnings"]
        assert "is a view and is being modified inplace" in r["inplace"], r["inplace"]
        # the gradient norm's reduce over dp_shard x tp is one all_reduce on the flattened mesh (torch
        # warned on every rank about two sequential ones, advising to flatten: nothing a user can do)
        assert r["redistributed"] == [], r["redistributed"]
    # training equals the one-process run (global batch 8 both ways) to float32 rounding
    np.testing.assert_allclose(main["losses"], reference["losses"], rtol=1e-5)
    np.testing.assert_allclose(main["norms"][:STEPS], reference["norms"], rtol=1e-4)
    assert sorted(main["weights"]) == sorted(reference["weights"]) and ranks[1]["weights"] == {}
    for name, value in reference["weights"].items():
        np.testing.assert_allclose(main["weights"][name], value, rtol=1e-4, atol=5e-5, err_msg=name)
    # bytes: every planned weight is split 4 ways (tp × dp_shard), the norms 2 ways (dp_shard only)
    planned, full = reference["planned_bytes"], reference["full_bytes"]
    assert reference["param_bytes"] == full
    assert sum(r["param_bytes"] for r in ranks) == planned + 2 * (full - planned)
    for r in ranks:
        assert r["param_bytes"] == planned // 4 + (full - planned) // 2
    assert main["gathered"] == [0.0, 1.0, 2.0, 3.0]
    assert sorted(main["metrics"]) == list(range(10)) == sorted(ranks[3]["metric_objects"])
    # save_state / load_state: the three steps after the checkpoint come out the same after loading it
    assert main["again"] == main["after"]
    assert main["still_tied"]
    assert {"fsdp_model", "fsdp_optimizer"} <= set(os.listdir(tmp_path / "ckpt"))
    # save_model: one full model that a plain Llama loads
    from safetensors.torch import load_file

    plain = _llama()
    missing, unexpected = plain.load_state_dict(
        load_file(str(tmp_path / "weights" / "model.safetensors")), strict=False
    )
    assert missing in ([], ["lm_head.weight"]) and unexpected == []  # a tied weight is written once
    for name, value in main["weights"].items():
        np.testing.assert_array_equal(plain.state_dict()[name].numpy(), value, err_msg=name)


def _tp_only(folder: str) -> dict:
    """Tensor parallel alone (tp over both ranks, no FSDP), laid out from the launch environment; also a
    model transformers split itself (``from_pretrained(tp_plan="auto")``), which prepare does not split again."""
    from accel_nb import Accelerator
    from accel_nb.fsdp.sharding import local_shard_bytes

    acc = Accelerator()  # the ParallelismConfig comes from ACCEL_NB_USE_PARALLELISM_CONFIG / ..._TP_SIZE
    model = _llama()
    opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    model, opt, dl = acc.prepare(model, opt, DataLoader(_tokens(), batch_size=8))
    batches = iter(dl)

    def step(x):
        loss = model(input_ids=x, labels=x).loss
        acc.backward(loss)
        norm = float(acc.clip_grad_norm_(model.parameters(), 1.0))
        opt.step()
        opt.zero_grad()
        return loss.item(), norm

    out = {
        "mesh": tuple(acc.torch_device_mesh.mesh_dim_names),
        "first": [step(next(batches)[0]) for _ in range(5)],
    }
    acc.save_state(os.path.join(folder, "ckpt"))
    nxt = [next(batches)[0] for _ in range(2)]
    out["after"] = [step(x) for x in nxt]
    acc.load_state(os.path.join(folder, "ckpt"))
    out["again"] = [step(x) for x in nxt]
    out["param_bytes"] = local_shard_bytes(model.parameters())
    out["ddp"] = type(model).__name__
    from transformers import LlamaForCausalLM

    split = acc.prepare(LlamaForCausalLM.from_pretrained(os.path.join(folder, "pretrained"), tp_plan="auto"))
    (x,) = next(iter(DataLoader(_tokens(), batch_size=8)))
    out["pretrained_loss"] = split(input_ids=x, labels=x).loss.item()
    return out


@pytest.mark.multiproc
def test_tensor_parallel_alone_from_the_launch_environment_trains_and_resumes(tmp_path):
    env = {ENV_USE_PARALLELISM_CONFIG: "true", PARALLELISM_ENV["tp_size"][0]: "2"}
    _llama().save_pretrained(str(tmp_path / "pretrained"))
    ranks = run_ranks(_tp_only, world_size=2, args=(str(tmp_path),), env=env, timeout=600)  # a hang guard
    reference = _train(None, None, batch_size=8)
    assert ranks[0]["mesh"] == ("tp",) and ranks[0]["ddp"] == "LlamaForCausalLM"  # no DDP wrapper
    for rank in ranks:  # both ranks read every batch; the losses and norms are the one-process run's
        np.testing.assert_allclose([loss for loss, _ in rank["first"]], reference["losses"][:5], rtol=1e-5)
        np.testing.assert_allclose([norm for _, norm in rank["first"]], reference["norms"][:5], rtol=1e-4)
        assert rank["again"] == rank["after"]
        # planned weights halved, the norms whole on both ranks
        planned, full = reference["planned_bytes"], reference["full_bytes"]
        assert rank["param_bytes"] == planned // 2 + (full - planned)
        assert rank["pretrained_loss"] == pytest.approx(reference["losses"][0], rel=1e-5)


# ------------------------------------------------------------------ no processes needed


def test_sizes_default_to_one_and_must_be_whole_numbers():
    pc = ParallelismConfig()
    assert (pc.dp_replicate_size, pc.dp_shard_size, pc.tp_size, pc.cp_size) == (1, 1, 1, 1)
    assert pc.total_size == 1 and pc.active_mesh_dims == []
    for bad in ({"tp_size": 0}, {"dp_shard_size": -2}, {"cp_size": 1.5}):
        with pytest.raises(ValueError, match="must be a whole number >= 1"):
            ParallelismConfig(**bad)
    with pytest.raises(ValueError, match="does not compose with plain replicated data parallel"):
        ParallelismConfig(dp_replicate_size=2, tp_size=2)
    with pytest.raises(ValueError, match="tp_plan='bogus'"):
        ParallelismConfig(tp_size=2, tp_plan="bogus")


def test_the_layout_names_dimensions_and_coordinates_in_mesh_order():
    pc = ParallelismConfig(dp_replicate_size=2, dp_shard_size=2, tp_size=2)
    assert pc.mesh_shape() == (("dp_replicate", "dp_shard", "tp"), (2, 2, 2))
    assert pc.dp_dim_names == ["dp_replicate", "dp_shard"] and pc.non_dp_dim_names == ["tp"]
    assert pc.fsdp_dim_names == ["dp_replicate", "dp_shard_cp"] and pc.dp_shard_cp_dim_names == ["dp_shard"]
    assert pc.data_parallel_size == 4 and pc.non_data_parallel_size == 2
    assert pc.coordinates(5) == {"dp_replicate": 1, "dp_shard": 0, "cp": 0, "tp": 1}
    assert [pc.data_parallel_rank(r) for r in range(8)] == [0, 0, 1, 1, 2, 2, 3, 3]


def test_sizes_that_do_not_multiply_to_the_processes_are_a_clear_error():
    with pytest.raises(ValueError) as info:
        ParallelismConfig(dp_shard_size=2, tp_size=2).check_world_size(8)
    message = str(info.value)
    assert "multiplies to 4 processes but this run has 8" in message and "dp_shard_size=4" in message
    # the Accelerator checks before it builds a mesh or prepares anything (one process here)
    from accel_nb import Accelerator

    with pytest.raises(ValueError, match="multiplies to 2 processes but this run has 1"):
        Accelerator(parallelism_config=ParallelismConfig(tp_size=2))
    with pytest.raises(TypeError, match="ParallelismConfig"):
        Accelerator(parallelism_config={"tp_size": 2})
    with pytest.raises(ValueError, match="multiplies to 2 processes but this run has 1"):
        Accelerator(parallelism_config=ParallelismConfig(cp_size=2))  # context parallel: same check


def test_sizes_come_from_the_launch_environment(monkeypatch):
    monkeypatch.setenv(PARALLELISM_ENV["tp_size"][0], "2")
    monkeypatch.setenv(PARALLELISM_ENV["dp_shard_size"][1], "4")  # the reference's spelling
    pc = ParallelismConfig(cp_size=1)
    assert (pc.dp_shard_size, pc.tp_size, pc.cp_size) == (4, 2, 1)
    from accel_nb.parallel.config import parallelism_from_env

    assert parallelism_from_env() is None
    monkeypatch.setenv("ACCELERATE_USE_PARALLELISM_CONFIG", "true")
    assert parallelism_from_env().total_size == 8
    assert ENV_USE_PARALLELISM_CONFIG.startswith("ACCEL_NB_")


def test_one_process_without_sizes_has_no_mesh():
    from accel_nb import Accelerator

    acc = Accelerator(parallelism_config=ParallelismConfig())
    assert acc.torch_device_mesh is None and acc.parallelism_config.total_size == 1
    assert acc.tensor_parallel_rank == 0 and acc.data_parallel_shard_rank == 0


def test_plans_resolve_to_module_names_or_fail_clearly():
    from accel_nb.parallel.tensor_parallel import resolve_plan

    model = _llama()
    plan = resolve_plan(model, "auto", 2)  # transformers' own plan, with the model's prefixes
    assert plan["model.layers.1.mlp.down_proj"] == "rowwise" and plan["lm_head"] == "colwise_gather_output"
    mlp = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.ReLU(), torch.nn.Linear(6, 4))
    assert resolve_plan(mlp, {"0": "colwise", "2": "rowwise"}, 2) == {"0": "colwise", "2": "rowwise"}
    with pytest.raises(ValueError, match="has no tensor-parallel plan"):
        resolve_plan(mlp, "auto", 2)
    with pytest.raises(ValueError, match="does not have: '3'"):
        resolve_plan(mlp, {"3": "colwise"}, 2)
    with pytest.raises(ValueError, match="does not divide 6"):
        resolve_plan(mlp, {"0": "colwise"}, 4)
    with pytest.raises(ValueError, match="not a tensor-parallel style"):
        resolve_plan(mlp, {"0": "diagonal"}, 2)
    with pytest.raises(ValueError, match="ReLU"):
        resolve_plan(mlp, {"1": "colwise"}, 2)
    # tied weights: split the same way or not at all
    tied = torch.nn.Sequential(torch.nn.Embedding(8, 4), torch.nn.Linear(4, 8, bias=False))
    tied[1].weight = tied[0].weight
    assert resolve_plan(tied, {"0": "embedding_rowwise", "1": "colwise_gather_output"}, 2)
    with pytest.raises(ValueError, match="splits the tied weight 0.weight = 1.weight in different ways"):
        resolve_plan(tied, {"0": "embedding_colwise", "1": "colwise"}, 2)
    with pytest.raises(ValueError, match="1: not planned"):
        resolve_plan(tied, {"0": "embedding_rowwise"}, 2)


def test_the_reference_paths_import():
    import accel_nb
    from accel_nb.parallelism_config import ParallelismConfig as AtReferencePath
    from accel_nb.utils import ParallelismConfig as InUtils
    from accel_nb.utils import TorchContextParallelConfig, TorchTensorParallelConfig

    assert accel_nb.ParallelismConfig is AtReferencePath is InUtils is ParallelismConfig
    assert ParallelismConfig(tp_size=2).tp_handler == TorchTensorParallelConfig()
    assert ParallelismConfig(cp_size=2).cp_handler.cp_comm_strategy == "allgather"
    with pytest.raises(ValueError, match="cp_comm_strategy"):
        TorchContextParallelConfig(cp_comm_strategy="ring")


def test_launch_flags_and_config_file_set_the_ranks_environment(tmp_path):
    from accel_nb.commands.launch import config_for_launch
    from accel_nb.commands.main import build_parser
    from accel_nb.config import ConfigError
    from accel_nb.config.command_line import launch_command_line

    parser = build_parser()
    flags = ["launch", "--cpu", "--num_processes", "4", "--parallelism_config_tp_size", "2"]
    cfg = config_for_launch(
        parser.parse_args([*flags, "--parallelism_config_dp_shard_size", "2", "train.py"])
    )
    env = cfg.to_env()
    assert env["ACCEL_NB_USE_PARALLELISM_CONFIG"] == env["ACCELERATE_USE_PARALLELISM_CONFIG"] == "true"
    assert env["ACCEL_NB_PARALLELISM_CONFIG_TP_SIZE"] == env["PARALLELISM_CONFIG_TP_SIZE"] == "2"
    assert env["PARALLELISM_CONFIG_DP_SHARD_SIZE"] == "2"
    assert "--parallelism_config_tp_size 2" in launch_command_line(cfg)
    with pytest.raises(ConfigError, match="multiplies to 4 processes but this run has 8"):
        config_for_launch(
            parser.parse_args(
                [
                    "launch",
                    "--cpu",
                    "--num_processes",
                    "8",
                    *flags[4:],
                    "--parallelism_config_dp_shard_size",
                    "2",
                    "x.py",
                ]
            )
        )
    # a config file in the reference's layout (parallelism_config: {parallelism_config_tp_size: 2})
    path = tmp_path / "cfg.yaml"
    path.write_text(
        "compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_CPU\nnum_processes: 2\nuse_cpu: true\n"
        "parallelism_config:\n  parallelism_config_tp_size: 2\n"
    )
    cfg = config_for_launch(parser.parse_args(["launch", "--config_file", str(path), "train.py"]))
    assert cfg.to_env()["PARALLELISM_CONFIG_TP_SIZE"] == "2"
    path.write_text(
        path.read_text().replace("parallelism_config_tp_size: 2", "parallelism_config_tq_size: 2")
    )
    with pytest.raises(ConfigError, match="unknown key 'parallelism_config_tq_size'"):
        config_for_launch(parser.parse_args(["launch", "--config_file", str(path), "train.py"]))


def test_the_config_questionnaire_asks_for_the_layout_with_fsdp(monkeypatch):
    import io

    from accel_nb.commands.config import parallelism_questions
    from accel_nb.config import LaunchConfig

    cfg = LaunchConfig(distributed_type="FSDP", num_processes=8, use_cpu=True).validate()
    # yes; tp 3 does not divide 8 (tp asked again); tp 2, cp 1 with 4 replicas leaves FSDP no shard (all asked
    # again); tp 2, cp 2 with 4 replicas is 16 (asked again); tp 2, cp 1, 2 replicas
    answers = iter(["yes", "3", "2", "1", "4", "2", "2", "4", "2", "1", "2"])
    monkeypatch.setattr("builtins.input", lambda prompt="": next(answers))
    out = io.StringIO()
    new = parallelism_questions(cfg, out)
    assert new.extras["parallelism_config"] == {
        "parallelism_config_dp_replicate_size": 2,
        "parallelism_config_dp_shard_size": 2,
        "parallelism_config_tp_size": 2,
        "parallelism_config_cp_size": 1,
    }
    assert "divides the 8 processes, got '3'" in out.getvalue()
    assert (
        "tp_size 2 × cp_size 2 × dp_replicate_size 4 = 16 does not divide the 8 processes" in out.getvalue()
    )
    assert "leaves FSDP no processes to shard over (dp_shard_size 1 of the 8 processes)" in out.getvalue()
    assert new.to_env()["PARALLELISM_CONFIG_DP_REPLICATE_SIZE"] == "2"
    answers = iter(["no"])  # no: the layout is dropped
    assert "parallelism_config" not in parallelism_questions(new, io.StringIO()).extras


def test_the_mesh_is_built_as_the_references_build_device_mesh(monkeypatch):
    """The reference's _get_mesh and the joint dimensions build_device_mesh flattens, with the same keys
    (its test suite patches init_device_mesh and compares them); accel_nb's own extra flattening for
    clipping happens where accel_nb builds its mesh (get_device_mesh)."""
    import torch.distributed.device_mesh as device_mesh

    reference = pytest.importorskip("accelerate.parallelism_config")
    flattened: list = []

    class FakeMesh:
        def __init__(self, shape, names):
            self.shape, self.mesh_dim_names, self.device_type = shape, names, "cpu"

        def __getitem__(self, key):
            mesh = self

            class Sub:
                def _flatten(self, name):
                    flattened.append((key, name))
                    return mesh

            return Sub()

    monkeypatch.setattr(
        device_mesh, "init_device_mesh", lambda device, shape, mesh_dim_names: FakeMesh(shape, mesh_dim_names)
    )
    for sizes in (
        {"dp_replicate_size": 2, "dp_shard_size": 2},
        {"dp_shard_size": 2, "tp_size": 2},
        {"cp_size": 2},
    ):
        ours, theirs = ParallelismConfig(**sizes), reference.ParallelismConfig(**sizes)
        assert ours._get_mesh() == theirs._get_mesh()
        flattened.clear()
        ours.build_device_mesh("cpu")
        mine = list(flattened)
        flattened.clear()
        theirs.build_device_mesh("cpu")
        assert mine == flattened
    assert ParallelismConfig()._get_mesh() == reference.ParallelismConfig()._get_mesh() == ()
    flattened.clear()
    ParallelismConfig(dp_shard_size=2, tp_size=2).get_device_mesh("cpu")
    assert flattened[-1] == (("dp_shard", "tp"), "dp_shard_tp")  # one all_reduce for a TP gradient norm
