"""All-reduce across the ranks of `accel-nb launch`: every rank adds its rank + 1, then prints the sum.

    accel-nb launch --num_processes 2 examples/allreduce_script.py
    accel-nb launch --num_processes 2 examples/allreduce_script.py --fail-on-rank 1   # see a failure report

Each rank prints one line such as ``rank 1/2: sum=3.0 gathered=[1.0, 2.0] mixed_precision=no``.
"""

import argparse
import os

import torch

from accel_nb import PartialState, gather, reduce


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--fail-on-rank", type=int, default=None, help="raise ValueError on this rank")
    parser.add_argument("--scale", type=float, default=1.0, help="multiply every contribution")
    args = parser.parse_args()

    state = PartialState()
    mine = torch.tensor([(state.process_index + 1) * args.scale])
    total = reduce(mine, reduction="sum")
    everyone = gather(mine)
    mixed = os.environ.get("ACCEL_NB_MIXED_PRECISION", "no")
    print(
        f"rank {state.process_index}/{state.num_processes}: sum={total.item():g} "
        f"gathered={everyone.tolist()} mixed_precision={mixed} backend={state.backend}",
        flush=True,
    )
    if args.fail_on_rank == state.process_index:
        raise ValueError(f"rank {state.process_index} was asked to fail")
    state.wait_for_everyone()
    state.destroy_process_group()


if __name__ == "__main__":
    main()
