"""Data loader costs: resuming mid-epoch, and per-batch overhead of a prepared loader against a raw DataLoader.

(a) Resume cost. A 1,000,000-sample shuffled map-style dataset; a loader restored (``load_state_dict``) at batch
100,000 of its epoch, then its first batch fetched, against a fresh loader's first batch (both pay for the
epoch's permutation; the difference is what skipping 100,000 batches costs: goal well under 0.1 s). Shown for
one process (batch 8) and for rank 0 of 2 (batch 4 per process, simulated in this process): both skip 800,000
indices without fetching a sample.

(b) Per-batch overhead. Full epochs of a raw ``DataLoader`` and of the same loader prepared (without and with
device placement on the CPU), ``num_workers=0``, interleaved rounds; the figure is the median time per batch
and the prepared loader's excess over raw, in microseconds.

Run: ``python benchmarks/data_loader.py [--rounds 7 --batches 3000]``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.data.loader import prepare_data_loader

SAMPLES = 1_000_000
RESUME_AT = 100_000


class Indices(Dataset):
    """Sample ``i`` is ``i``: the cheapest possible fetch, so skipping costs show."""

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, i: int) -> int:
        return i


def _prepared(batch_size: int, procs: int, **kwargs: Any) -> DataLoader:
    torch.manual_seed(0)
    return prepare_data_loader(DataLoader(Indices(), batch_size=batch_size, shuffle=True), num_processes=procs,
                               process_index=0, **kwargs)


def _first_batch_seconds(loader: DataLoader) -> tuple[float, Any]:
    start = time.perf_counter()
    batch = next(iter(loader))
    return time.perf_counter() - start, batch


def resume_cost(rounds: int) -> list[dict[str, float]]:
    """For one process (batch 8) and rank 0 of 2 (batch 4): median seconds of a fresh loader's first batch
    (``fresh``), of a restore at ``RESUME_AT`` plus its first batch (``resumed``), and of reaching that batch by
    iterating (``walk``, timed once: what a loader without a saved position costs)."""
    results = []
    for procs, batch_size in ((1, 8), (2, 4)):
        # A real mid-epoch state (it holds the epoch's shuffling seed), moved to batch RESUME_AT.
        source = _prepared(batch_size, procs)
        batches = iter(source)
        next(batches)
        saved = source.state_dict()
        del batches
        saved["batches_yielded"] = RESUME_AT
        expected = None
        fresh_times, resumed_times = [], []
        for _ in range(rounds):
            fresh_times.append(_first_batch_seconds(_prepared(batch_size, procs))[0])
            loader = _prepared(batch_size, procs)
            start = time.perf_counter()
            loader.load_state_dict(saved)
            batch = _first_batch_seconds(loader)[1]
            resumed_times.append(time.perf_counter() - start)
            expected = expected if expected is not None else batch
            assert torch.equal(batch, expected)
        # The resumed batch is the one an uninterrupted epoch yields there (checked once: it is slow to walk).
        loader = _prepared(batch_size, procs)
        loader.load_state_dict({**saved, "batches_yielded": 0})
        start = time.perf_counter()
        walked = next(b for i, b in enumerate(loader) if i == RESUME_AT)
        walk = time.perf_counter() - start
        assert torch.equal(walked, expected), "resumed batch differs from the uninterrupted one"
        results.append({"processes": procs, "batch_size": batch_size, "fresh": statistics.median(fresh_times),
                        "resumed": statistics.median(resumed_times), "walk": walk})
    return results


def _epoch_time(loader: DataLoader) -> float:
    start = time.perf_counter()
    for _ in loader:
        pass
    return time.perf_counter() - start


def per_batch_overhead(rounds: int, batches: int) -> dict[str, dict[str, float]]:
    """Median microseconds per batch of a raw and a prepared loader, by dataset then loader kind."""
    results: dict[str, dict[str, float]] = {}
    for name, dataset, batch_size in (
        ("list of ints, batch 32", list(range(batches * 32)), 32),
        ("TensorDataset (32 floats + label), batch 64", TensorDataset(torch.randn(batches * 64, 32),
                                                                      torch.randint(0, 10, (batches * 64,))), 64),
    ):
        def raw(dataset: Any = dataset, batch_size: int = batch_size) -> DataLoader:
            return DataLoader(dataset, batch_size=batch_size, shuffle=True)

        loaders = {
            "raw DataLoader": raw(),
            "prepared": prepare_data_loader(raw(), num_processes=1, process_index=0),
            "prepared + device=cpu": prepare_data_loader(raw(), device=torch.device("cpu"), num_processes=1,
                                                         process_index=0, put_on_device=True),
        }
        times: dict[str, list[float]] = {key: [] for key in loaders}
        for _ in range(rounds):
            for key, loader in loaders.items():
                times[key].append(_epoch_time(loader) / batches * 1e6)
        results[name] = {key: statistics.median(values) for key, values in times.items()}
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--batches", type=int, default=3000)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"(a) restore at batch {RESUME_AT:,} of a {SAMPLES:,}-sample epoch, then fetch one batch (median of "
          f"{args.rounds})")
    for r in resume_cost(args.rounds):
        print(f"  {r['processes']} process(es), batch {r['batch_size']}: fresh first batch {r['fresh'] * 1e3:7.1f} ms"
              f" | restored at {RESUME_AT:,} + first batch {r['resumed'] * 1e3:7.1f} ms | cost of the skip "
              f"{(r['resumed'] - r['fresh']) * 1e3:6.1f} ms (iterating there: {r['walk']:.2f} s)")
    print(f"(b) per-batch time, num_workers=0, {args.batches} batches per epoch, median of {args.rounds} "
          "interleaved rounds")
    for name, medians in per_batch_overhead(args.rounds, args.batches).items():
        base = medians["raw DataLoader"]
        print(f"  {name}:")
        for key, median in medians.items():
            extra = "" if key == "raw DataLoader" else f"  (+{median - base:5.2f} us)"
            print(f"    {key:24s} {median:8.2f} us/batch{extra}")


if __name__ == "__main__":
    main()
