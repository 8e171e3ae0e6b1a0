"""Issue 39's hang, reproduced: a forked loader worker stuck inside ``fork`` while gloo's threads make thread states.

gloo's threads create a Python thread state each time a finished collective frees a tensor whose Python object
it holds (pybind11's ``gil_scoped_acquire`` in ``TensorImpl::decref_pyobject``), taking the lock that guards the
interpreter's thread-state list without the GIL. CPython before 3.11.10 / 3.12 takes that lock in a forked child
before making it anew (CPython gh-112275): a fork while a gloo thread holds it leaves the child waiting forever,
and the DataLoader that forked it waits for its batch forever (engine/data/worker_start.py).

This makes that instant common: a 1-process gloo group whose threads churn (async all-reduces of tensors the
caller drops at once), and a prepared loader with 2 forked workers read for many short epochs. Per mode it prints
the epochs, the epochs whose workers hung (without the guard: the rank's worker limit, ``--hang-limit`` seconds,
ends the epoch with ``LoaderWorkerTimeout``) and the workers the guard replaced (with the guard: the epoch
completes, with the same batches).

    python benchmarks/fork_hang.py --epochs 200 --mode both
"""

from __future__ import annotations

import argparse
import os
import tempfile
import threading
import time
import warnings
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

from engine.data import state
from engine.data.loader import prepare_data_loader
from engine.data.workers import LoaderWorkerTimeout

FORKS = state.starts_by_fork


def churn(stop: threading.Event) -> None:
    """Keep gloo's threads freeing tensors whose Python objects they hold (a thread state each)."""
    while not stop.is_set():
        works = [dist.all_reduce(torch.ones(64), async_op=True) for _ in range(8)]
        del works


def run(guard: bool, epochs: int, hang_limit: float) -> dict[str, Any]:
    state.starts_by_fork = FORKS if guard else (lambda context: False)
    loader = prepare_data_loader(DataLoader(list(range(8)), batch_size=4, num_workers=2), num_processes=1,
                                 process_index=0, worker_timeout=hang_limit)
    expected = [[0, 1, 2, 3], [4, 5, 6, 7]]
    hung = replaced = wrong = 0
    start = time.monotonic()
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                batches = [batch.tolist() for batch in loader]
                wrong += batches != expected
            except LoaderWorkerTimeout:
                hung += 1
        replaced += sum("had not started" in str(w.message) for w in caught)
    state.starts_by_fork = FORKS
    return {"epochs": epochs, "hung": hung, "replaced": replaced, "wrong": wrong,
            "seconds": round(time.monotonic() - start)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=200)
    parser.add_argument("--mode", choices=["guard", "no-guard", "both"], default="both")
    parser.add_argument("--hang-limit", type=float, default=10.0, help="seconds before an unguarded epoch counts as hung")
    parser.add_argument("--start-limit", default="3", help="EMBER_LOADER_WORKER_START_S for the guarded run")
    args = parser.parse_args()
    os.environ["EMBER_LOADER_WORKER_START_S"] = args.start_limit
    with tempfile.TemporaryDirectory() as folder:
        dist.init_process_group("gloo", init_method=f"file://{folder}/store", rank=0, world_size=1)
        stop = threading.Event()
        threads = [threading.Thread(target=churn, args=(stop,), daemon=True) for _ in range(2)]
        for thread in threads:
            thread.start()
        modes = {"guard": [True], "no-guard": [False], "both": [False, True]}[args.mode]
        for guard in modes:
            result = run(guard, args.epochs, args.hang_limit)
            print(f"guard {'on ' if guard else 'off'}: {result}", flush=True)
        stop.set()
        for thread in threads:
            thread.join()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
