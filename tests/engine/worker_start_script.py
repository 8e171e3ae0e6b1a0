"""A prepared loader whose forked workers can be made to hang inside fork (for tests/engine/test_worker_start.py).

``--stall-epoch E``: the first worker forked for epoch E blocks in an ``after_in_child`` fork hook, before Python
returns from ``os.fork()`` in it, as issue 39's stuck worker did (``--stall always``: every fork of that epoch).
Prints the batches of 3 epochs and the global RNG's next draws as JSON."""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
from torch.utils.data import DataLoader, Dataset

from engine.data.loader import prepare_data_loader


class Noisy(Dataset):
    """Each item draws from its worker's RNG, so the batches show the worker seeds too."""

    def __len__(self) -> int:
        return 12

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.tensor([float(index), torch.rand(()).item()])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--stall-epoch", type=int, default=-1)
    parser.add_argument("--always", action="store_true")
    parser.add_argument("--flag", default="")
    parser.add_argument("--persistent", action="store_true")
    args = parser.parse_args()

    armed = [False]

    def stall() -> None:  # runs in the child, inside os.fork(), before the worker's own code
        if armed[0] and (args.always or not os.path.exists(args.flag)):
            with open(args.flag, "a") as handle:
                handle.write(f"{os.getpid()}\n")
            time.sleep(3600)

    os.register_at_fork(after_in_child=stall)
    torch.manual_seed(0)
    loader = prepare_data_loader(DataLoader(Noisy(), batch_size=3, shuffle=True, num_workers=2,
                                            persistent_workers=args.persistent), num_processes=1, process_index=0)
    epochs = []
    for epoch in range(3):
        loader.set_epoch(epoch)
        armed[0] = epoch == args.stall_epoch
        epochs.append([batch.tolist() for batch in loader])
        armed[0] = False
    print(json.dumps({"batches": epochs, "after": torch.rand(3).tolist()}))


if __name__ == "__main__":
    main()
