"""Migration names whose meaning is distributed, on 2 real gloo ranks, side by side with accelerate."""

from __future__ import annotations

import importlib
import logging

import pytest
import torch

from tests.dist_helpers import run_ranks

pytest.importorskip("accelerate")
pytestmark = pytest.mark.multiproc


def _log_lines(library, path):
    """Rank-labelled lines logged three ways into one shared file; the file's lines come back."""
    state_cls = importlib.import_module(f"{library}.state").PartialState
    get_logger = importlib.import_module(f"{library}.logging").get_logger
    state = state_cls(cpu=True)
    rank = state.process_index
    logger = get_logger(f"migration.{library}", log_level="INFO")
    handler = logging.FileHandler(path)  # append mode: each write lands at the end, in time order
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger.logger.addHandler(handler)
    logger.logger.propagate = False
    try:
        logger.info(f"main only from {rank}")
        state.wait_for_everyone()
        if rank == 1:
            import time

            time.sleep(0.5)  # rank 1 would be last anyway; in_order must put rank 0 first regardless
        for step in range(2):
            logger.info(f"in order {step} from {rank}", in_order=True)
        state.wait_for_everyone()
        logger.debug(f"debug from {rank}", main_process_only=False)  # below INFO: dropped
        logger.warning(f"every rank {rank}", main_process_only=False)
        state.wait_for_everyone()
    finally:
        handler.close()
        logger.logger.removeHandler(handler)
    with open(path) as f:
        return f.read().splitlines()


@pytest.mark.parametrize("library", ["accel_nb", "accelerate"])
def test_get_logger_main_process_only_and_in_order(tmp_path, library):
    path = str(tmp_path / "log.txt")
    lines = run_ranks(_log_lines, world_size=2, args=(library, path))[0]
    assert lines[:5] == [
        "[RANK 0] main only from 0",
        "[RANK 0] in order 0 from 0",
        "[RANK 1] in order 0 from 1",
        "[RANK 0] in order 1 from 0",
        "[RANK 1] in order 1 from 1",
    ]
    assert sorted(lines[5:]) == ["[RANK 0] every rank 0", "[RANK 1] every rank 1"]


def _draws_after_sync(library):
    state = importlib.import_module(library).Accelerator(cpu=True)  # the reference needs one
    sync = importlib.import_module(f"{library}.utils").synchronize_rng_states
    torch.manual_seed(100 + state.process_index)  # every rank starts different
    generator = torch.Generator().manual_seed(7 + state.process_index)
    before = torch.rand(3)
    sync(["torch", "generator"], generator=generator)
    return before, torch.rand(3), torch.rand(2, generator=generator)


def test_synchronize_rng_states_gives_every_rank_the_main_process_numbers():
    ours = run_ranks(_draws_after_sync, world_size=2, args=("accel_nb",))
    theirs = run_ranks(_draws_after_sync, world_size=2, args=("accelerate",))
    assert not torch.equal(ours[0][0], ours[1][0])
    for rank in range(2):
        assert torch.equal(ours[rank][1], ours[0][1]) and torch.equal(ours[rank][2], ours[0][2])
        assert all(torch.equal(a, b) for a, b in zip(ours[rank], theirs[rank], strict=True))


def _unwrap_prepared(library):
    accelerator_cls = importlib.import_module(library).Accelerator
    extract = importlib.import_module(f"{library}.utils").extract_model_from_parallel
    accelerator = accelerator_cls(cpu=True, mixed_precision="bf16")
    model = torch.nn.Linear(3, 2)
    prepared = accelerator.prepare(model)
    wrapped = type(prepared).__name__
    kept = extract(prepared)
    autocast_kept = kept(torch.ones(1, 3)).dtype  # the mixed-precision forward returns fp32 outputs
    with torch.autocast("cpu", dtype=torch.bfloat16):
        inside_autocast = kept(torch.ones(1, 3)).dtype
    plain = extract(prepared, keep_fp32_wrapper=False)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        plain_in_autocast = plain(torch.ones(1, 3)).dtype
    return (
        wrapped,
        kept is model,
        plain is model,
        str(autocast_kept),
        str(inside_autocast),
        str(plain_in_autocast),
    )


def test_extract_model_from_parallel_on_a_prepared_ddp_model_like_the_reference():
    ours = run_ranks(_unwrap_prepared, world_size=2, args=("accel_nb",))
    theirs = run_ranks(_unwrap_prepared, world_size=2, args=("accelerate",))
    assert ours == theirs
    assert ours[0][:3] == ("DistributedDataParallel", True, True)
    assert ours[0][4:] == ("torch.float32", "torch.bfloat16")  # the fp32 wrapper removed


def _grads_with_comm_hook(hook):
    from torch.nn.parallel import DistributedDataParallel

    from accel_nb.state import PartialState
    from accel_nb.utils import DistributedDataParallelKwargs

    state = PartialState(cpu=True)
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(8, 1))
    DistributedDataParallelKwargs(comm_hook=hook).register_comm_hook(model)
    torch.manual_seed(state.process_index)
    model(torch.randn(4, 8)).sum().backward()
    return model.module.weight.grad.clone()


@pytest.mark.parametrize("hook", ["fp16"])  # torch has bf16 compression for NCCL only
def test_ddp_comm_hook_compresses_the_allreduce(hook):
    plain = run_ranks(_grads_with_comm_hook, world_size=2, args=("no",))
    compressed = run_ranks(_grads_with_comm_hook, world_size=2, args=(hook,))
    assert torch.equal(compressed[0], compressed[1])
    dtype = torch.float16 if hook == "fp16" else torch.bfloat16
    assert torch.allclose(compressed[0], plain[0].to(dtype).float(), rtol=1e-2, atol=1e-2)
    assert not torch.equal(compressed[0], plain[0])  # really went through the lower precision


def _handlers_reach_ddp(library):
    import datetime

    module = importlib.import_module(library)
    utils = importlib.import_module(f"{library}.utils")
    handlers = [
        utils.DistributedDataParallelKwargs(find_unused_parameters=True, bucket_cap_mb=5, comm_hook="fp16"),
        utils.InitProcessGroupKwargs(backend="gloo", timeout=datetime.timedelta(seconds=123)),
    ]
    if library == "accelerate":  # the reference wants the enum member, not its value
        handlers[0] = utils.DistributedDataParallelKwargs(
            find_unused_parameters=True, bucket_cap_mb=5, comm_hook=utils.DDPCommunicationHookType.FP16
        )
    accelerator = module.Accelerator(cpu=True, kwargs_handlers=handlers)
    torch.manual_seed(0)
    model = accelerator.prepare(torch.nn.Linear(8, 1))
    torch.manual_seed(accelerator.process_index)
    accelerator.backward(model(torch.randn(4, 8)).sum())
    return model.find_unused_parameters, model.module.weight.grad.clone()


def test_kwargs_handlers_reach_ddp_and_its_comm_hook_like_the_reference():
    ours = run_ranks(_handlers_reach_ddp, world_size=2, args=("accel_nb",))
    theirs = run_ranks(_handlers_reach_ddp, world_size=2, args=("accelerate",))
    assert ours[0][0] is theirs[0][0] is True
    assert torch.equal(ours[0][1], theirs[0][1]) and torch.equal(ours[0][1], ours[1][1])


def _join_warnings(library):
    """The warnings of join_uneven_inputs where it cannot act, as the reference's test script checks them."""
    import warnings
    from unittest.mock import Mock

    from torch.utils.data import DataLoader, IterableDataset

    class Stream(IterableDataset):
        def __iter__(self):
            yield from torch.arange(3)

    top = importlib.import_module(library)
    acc = top.Accelerator(cpu=True)
    model = acc.prepare(torch.nn.Linear(1, 1))
    acc.prepare(DataLoader(Stream(), batch_size=1))
    kinds = importlib.import_module(f"{library}.utils").DistributedType
    saved = acc.state.distributed_type
    # the reference joins on GPUs only (below): its script's view, MULTI_GPU, for both (gloo DDP joins alike)
    acc.state.distributed_type = kinds.MULTI_GPU
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with acc.join_uneven_inputs([model], even_batches=False):
                pass
    finally:
        acc.state.distributed_type = saved
    iterable = [str(w.message) for w in caught if "map-style" in str(w.message)]
    acc.state.distributed_type = kinds.FSDP
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with acc.join_uneven_inputs([Mock()]):  # nothing to join: a no-op, not torch's Join on a Mock
                pass
    finally:
        acc.state.distributed_type = saved
    not_ddp = [str(w.message) for w in caught if issubclass(w.category, UserWarning)]
    return (
        any("only supported for map-style datasets" in m for m in iterable),
        any("only supported for multi-GPU" in m for m in not_ddp),
    )


@pytest.mark.parametrize("library", ["accel_nb", "accelerate"])
def test_join_uneven_inputs_warns_where_the_reference_does(library):
    # issue 38, item 15: a rename of the reference's test_distributed_data_loop matches these two messages;
    # under FSDP/DeepSpeed/XLA join_uneven_inputs does nothing (accel_nb applied Join to whatever it got)
    assert run_ranks(_join_warnings, world_size=2, args=(library,)) == [(True, True)] * 2


def _reference_join_loop():
    """The reference script's test_can_join_uneven_inputs on CPU: 3 samples, batch 1, even_batches=False."""
    from torch.utils.data import DataLoader, TensorDataset

    from accel_nb import Accelerator, DataLoaderConfiguration

    acc = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(even_batches=False))
    ddp_model = acc.prepare(torch.nn.Linear(1, 1))
    loader = acc.prepare(DataLoader(TensorDataset(torch.arange(3)), batch_size=1))
    seen = []
    with acc.join_uneven_inputs([ddp_model]):
        for index, batch in enumerate(loader):
            ddp_model(batch[0].float().unsqueeze(-1)).sum().backward()
            seen.append(index)
    acc.wait_for_everyone()
    return seen, type(ddp_model).__name__


def test_join_uneven_inputs_joins_ddp_on_cpu_processes():
    # accel_nb applies torch's Join on gloo (MULTI_CPU) too; the reference 1.15 warns that it has no effect
    # there and this very loop then hangs (rank 0's second backward waits for rank 1), so it is run on
    # accel_nb only (docs/migration.md: deliberate differences)
    assert run_ranks(_reference_join_loop, world_size=2, timeout=60) == [
        ([0, 1], "DistributedDataParallel"),
        ([0], "DistributedDataParallel"),
    ]
