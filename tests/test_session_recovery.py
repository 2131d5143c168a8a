"""After a broken collective, a session names the sharded models and their optimizers still bound to the old group.

A Python ``WarmSession`` of 2 gloo ranks holds an FSDP-wrapped model, a ``fully_shard`` model,
an optimizer over each and a process group kept in a variable. A cell in which rank 0 raises while
rank 1 waits in ``all_reduce`` breaks the group; the session forms a fresh one and says which of
those names still hold the old group (they cannot be re-bound: their shards were made over it).
Plain collectives work again on the same workers, and the list empties once those names are gone.
"""

from __future__ import annotations

import pytest

from accel_nb.launch.errors import LaunchError
from accel_nb.launch.options import LaunchOptions
from accel_nb.launch.session.warm_session import WarmSession

pytestmark = [pytest.mark.multiproc, pytest.mark.slow]

BUILD = (
    "import torch, torch.distributed as dist\n"
    "from accel_nb import PartialState\n"
    "from torch.distributed.fsdp import FullyShardedDataParallel, fully_shard\n"
    "from torch.distributed.device_mesh import init_device_mesh\n"
    "state = PartialState()\n"
    "wrapped = FullyShardedDataParallel(torch.nn.Sequential(torch.nn.Linear(4, 4)), device_id=torch.device('cpu'))\n"
    "wrapped_opt = torch.optim.SGD(wrapped.parameters(), lr=0.1)\n"
    "sharded = torch.nn.Sequential(torch.nn.Linear(4, 4))\n"
    "fully_shard(sharded, mesh=init_device_mesh('cpu', (2,)))\n"
    "sharded_opt = torch.optim.AdamW(sharded.parameters(), lr=0.1)\n"
    "plain = torch.nn.Linear(2, 2)\n"
    "plain_opt = torch.optim.SGD(plain.parameters(), lr=0.1)\n"
    "kept = [dist.new_group([0, 1])]\n"
)


def test_sharded_models_their_optimizers_and_kept_groups_are_named_after_a_fresh_group():
    with WarmSession(LaunchOptions(num_processes=2, cpu=True), say=lambda line: None) as s:
        s.run(BUILD)
        pids = [p.pid for p in s.procs]
        with pytest.raises(LaunchError) as info:
            s.run(
                "if dist.get_rank() == 0:\n    raise RuntimeError('rank 0 gave up')\ndist.all_reduce(torch.ones(1))\n"
            )
        said = str(info.value)
        assert "a fresh one was formed on the same workers: their namespaces are kept" in said, said
        expected = [
            "wrapped (FullyShardedDataParallel wrapped with the old group) on ranks 0,1",
            "sharded (FSDPSequential sharded over the old group) on ranks 0,1",
            "wrapped_opt (SGD over the parameters of a model bound to the old group) on ranks 0,1",
            "sharded_opt (AdamW over the parameters of a model bound to the old group) on ranks 0,1",
            "kept[0] (a process group of the old group) on ranks 0,1",
        ]
        for item in expected:
            assert item in said and item in s.describe(), (item, said)
        assert "plain" not in said.split("still bound", 1)[1], said
        assert s.run(
            "t = torch.ones(1); dist.all_reduce(t); (t.item(), state.num_processes, state.process_index)"
        ) == [
            (2.0, 2, 0),
            (2.0, 2, 1),
        ]
        assert [p.pid for p in s.procs] == pids
        s.run("del wrapped, wrapped_opt")
        left = s.describe()
        assert "wrapped" not in left and "sharded_opt (AdamW" in left and "kept[0]" in left, left
        s.run("del sharded, sharded_opt, kept")
        assert "still bound" not in s.describe(), s.describe()


def test_a_ddp_model_with_a_comm_hook_is_re_bound_and_averages_gradients_over_the_new_group():
    with WarmSession(LaunchOptions(num_processes=2, cpu=True), say=lambda line: None) as s:
        s.run(
            "import torch, torch.distributed as dist\n"
            "from accel_nb import PartialState\n"
            "from torch.distributed.algorithms.ddp_comm_hooks import default_hooks\n"
            "state = PartialState()\n"
            "torch.manual_seed(0)\n"
            "class MyDDP(torch.nn.parallel.DistributedDataParallel):  # a subclass, held in a list: re-bound too\n"
            "    pass\n"
            "held = [MyDDP(torch.nn.Linear(2, 1))]\n"
            "ddp = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))\n"
            "ddp.register_comm_hook(dist.group.WORLD, default_hooks.allreduce_hook)  # its state: the old group\n"
            "opt = torch.optim.SGD(ddp.parameters(), lr=0.1)\n"
            "g = torch.Generator().manual_seed(10 + state.process_index)  # each rank its own data\n"
        )
        with pytest.raises(LaunchError) as info:
            s.run(
                "if dist.get_rank() == 1:\n    raise RuntimeError('rank 1 gave up')\ndist.all_reduce(torch.ones(1))\n"
            )
        said = str(info.value)
        assert (
            "ddp (DistributedDataParallel) on ranks 0,1 now synchronise over the new group (re-bound)" in said
        ), said
        assert "still bound" not in said and "re-bound to the re-formed process group: ddp" in s.describe()
        step = (
            "x = torch.randn(8, 4, generator=g)\n"
            "ddp(x).pow(2).mean().backward(); opt.step(); opt.zero_grad()\n"
            "(ddp.process_group is dist.group.WORLD, ddp.module.weight.detach().clone())"
        )
        (same0, w0), (same1, w1) = s.run(step)
        assert same0 and same1
        assert bool((w0 == w1).all()), (w0, w1)  # different data, equal replicas: gradients were averaged
        assert s.run("held[0].process_group is dist.group.WORLD") == [True, True]
