"""Exit with gloo collectives still in flight while a DDP model holds the group (the exit-abort mechanism).

Each rank wraps a model in DistributedDataParallel (kept alive in a global until interpreter exit),
starts many asynchronous all_reduces, waits for the first only and returns. Gloo's threads then free
the rest while the process exits; before accel_nb released the DDP reducer's hold on the group at
exit, that aborted the rank ("terminate called without an active exception") every time.

    python -m torch.distributed.run --nproc_per_node 2 tests/scripts/pending_work_exit.py [--destroy]

``--destroy``: the script destroys the group itself first (the DDP model still holds it).
"""

import sys

import torch
import torch.distributed as dist

from accel_nb import PartialState

state = PartialState(cpu=True)
rank = state.process_index
MODEL = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 4))
# each work gloo frees also frees a tensor Python knew (its only reference left is the work's)
works = [dist.all_reduce(torch.zeros(4096), async_op=True) for _ in range(1000)]
works[0].wait()
del works
if "--destroy" in sys.argv:
    state.destroy_process_group()
print(f"rank {rank}: returned", flush=True)
