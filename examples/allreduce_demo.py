"""A real 2-process gloo run: every rank contributes its rank + 1, all-reduces, prints the sum.

Example:
    python examples/allreduce_demo.py            # starts 2 ranks of itself
"""

import os
import socket
import subprocess
import sys


def rank_main() -> None:
    import torch

    from accel_nb import PartialState, gather, reduce

    state = PartialState()
    mine = torch.tensor([float(state.process_index + 1)])
    total = reduce(mine, reduction="sum")
    everyone = gather(mine)
    print(
        f"[rank {state.process_index}/{state.num_processes} {state.backend} on {state.device}] "
        f"contributed {mine.item():g}, all-reduce sum = {total.item():g}, gathered = {everyone.tolist()}",
        flush=True,
    )
    state.destroy_process_group()


def main(num_processes: int = 2) -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank in range(num_processes):
        env = dict(
            os.environ,
            RANK=str(rank),
            WORLD_SIZE=str(num_processes),
            LOCAL_RANK=str(rank),
            LOCAL_WORLD_SIZE=str(num_processes),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
        )
        procs.append(subprocess.Popen([sys.executable, __file__], env=env))
    codes = [p.wait() for p in procs]
    return max(codes)


if __name__ == "__main__":
    if "RANK" in os.environ:
        rank_main()
    else:
        sys.exit(main())
