"""What the fork guard (engine/data/worker_start.py) costs: epochs of a prepared loader with 2 forked workers,
with the guard and without it, interleaved. Prints the median time to the first batch and to the epoch's end.

    python benchmarks/worker_start_guard.py [--rounds 4] [--epochs 20]
"""

from __future__ import annotations

import argparse
import statistics
import time

from torch.utils.data import DataLoader

from engine.data import state
from engine.data.loader import prepare_data_loader

FORKS = state.starts_by_fork


def epoch_times(guard: bool, epochs: int) -> list[tuple[float, float]]:
    """(first batch, whole epoch) seconds of each epoch; without the guard the loader believes it does not fork."""
    state.starts_by_fork = FORKS if guard else (lambda context: False)
    loader = prepare_data_loader(DataLoader(list(range(12)), batch_size=3, num_workers=2), num_processes=1,
                                 process_index=0)
    times = []
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        start = time.perf_counter()
        first = None
        for _ in loader:
            if first is None:
                first = time.perf_counter() - start
        times.append((first or 0.0, time.perf_counter() - start))
    state.starts_by_fork = FORKS
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=20)
    args = parser.parse_args()
    results: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
    for _ in range(args.rounds):
        for guard in (False, True):
            results[guard] += epoch_times(guard, args.epochs)
    for guard in (False, True):
        first = statistics.median(t[0] for t in results[guard]) * 1000
        whole = statistics.median(t[1] for t in results[guard]) * 1000
        print(f"guard {'on ' if guard else 'off'}: first batch {first:.1f} ms, epoch {whole:.1f} ms "
              f"(medians of {len(results[guard])} epochs)")


if __name__ == "__main__":
    main()
