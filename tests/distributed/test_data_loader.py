"""Prepared loaders on 2 real gloo processes: the ENGINE.md section 3 table, skipping, resume, dispatch errors.

Many cases share one spawn (each spawn costs about a second).
"""

from __future__ import annotations

import copy
import os
import random
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset

from engine import Accelerator, DataLoaderConfiguration, GradientState
from engine.random import capture_rng_state, restore_rng_state
from engine.state import AcceleratorState


class Numbers(IterableDataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self) -> Any:
        return iter(range(self.n))

    def __len__(self) -> int:
        return self.n


class Augmented(Dataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[int, float, float, float]:
        return i, torch.rand(()).item(), random.random(), float(np.random.rand())


def _walk(accelerator: Accelerator, loader: DataLoader, gather: bool = True) -> dict[str, Any]:
    batches, ends, remainders, gathered = [], [], [], None
    for batch in loader:
        batches.append(batch.tolist())
        ends.append(GradientState().end_of_dataloader)
        remainders.append(GradientState().remainder)
        if gather:
            gathered = accelerator.gather_for_metrics(batch).tolist()
    return {"batches": batches, "ends": ends, "remainders": remainders, "gathered": gathered}


def _table() -> dict[str, Any]:
    """Every row of the prepared-loader table (N items, bs=4), plus skip_first_batches after it."""
    def run(data: Any, gather: bool = True, drop_last: bool = False, skip: int = 0, **config: Any) -> dict[str, Any]:
        accelerator = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(**config))
        loader = accelerator.prepare(DataLoader(data, batch_size=4, drop_last=drop_last))
        if skip:
            loader = accelerator.skip_first_batches(loader, skip)
        return {**_walk(accelerator, loader, gather), "len": len(loader), "type": type(loader).__name__}

    return {
        "default10": run(list(range(10))),
        "drop10": run(list(range(10)), drop_last=True),
        "default8": run(list(range(8))),
        "default3": run(list(range(3))),
        "split10": run(list(range(10)), split_batches=True),
        "uneven10": run(list(range(10)), gather=False, even_batches=False),
        "dispatch10": run(list(range(10)), dispatch_batches=True),
        "dispatch3": run(list(range(3)), dispatch_batches=True),
        "iterable10": run(Numbers(10)),
        "iterable_shard10": run(Numbers(10), dispatch_batches=False),
        "skip1": run(list(range(10)), skip=1),
        "dispatch_skip1": run(list(range(10)), dispatch_batches=True, skip=1),
        "unsynced_shuffle": _unsynced_shuffle(),
    }


def _unsynced_shuffle() -> list[list[int]]:
    """Ranks with different global RNGs and no generator synchronisation still shard one permutation."""
    torch.manual_seed(int(os.environ["RANK"]))
    accelerator = Accelerator(cpu=True, rng_types=[])
    loader = accelerator.prepare(DataLoader(list(range(16)), batch_size=2, shuffle=True))
    return [i for _ in range(2) for batch in loader for i in batch.tolist()]


def test_prepared_loader_table(run_distributed: Any) -> None:
    r0, r1 = run_distributed(_table)
    expected = {  # case: (rank 0 batches, rank 1 batches, remainder at the last batch, gathered last batch)
        "default10": ([[0, 1, 2, 3], [8, 9, 0, 1]], [[4, 5, 6, 7], [2, 3, 4, 5]], 2, [8, 9]),
        "drop10": ([[0, 1, 2, 3]], [[4, 5, 6, 7]], -1, list(range(8))),
        "default8": ([[0, 1, 2, 3]], [[4, 5, 6, 7]], 0, list(range(8))),
        "default3": ([[0, 1, 2, 0]], [[1, 2, 0, 1]], 3, [0, 1, 2]),
        "split10": ([[0, 1], [4, 5], [8, 9]], [[2, 3], [6, 7], [0, 1]], 2, [8, 9]),
        "uneven10": ([[0, 1, 2, 3], [8, 9]], [[4, 5, 6, 7]], 2, None),
        "dispatch10": ([[0, 1, 2, 3], [8]], [[4, 5, 6, 7], [9]], 2, [8, 9]),
        "dispatch3": ([[0, 1]], [[2, 0]], 3, [0, 1, 2]),
        "iterable10": ([[0, 1, 2, 3], [8]], [[4, 5, 6, 7], [9]], 2, [8, 9]),
        # Ember: the remainder comes from the real length, so the duplicates are dropped (Accelerate keeps them).
        "iterable_shard10": ([[0, 1, 2, 3], [8, 9, 0, 1]], [[4, 5, 6, 7], [2, 3, 4, 5]], 2, [8, 9]),
        # Ember: skip_first_batches keeps the remainder (Accelerate returns [8, 9, 0, 1]).
        "skip1": ([[8, 9, 0, 1]], [[2, 3, 4, 5]], 2, [8, 9]),
        "dispatch_skip1": ([[8]], [[9]], 2, [8, 9]),
    }
    # The prepare-time seed is broadcast, so both ranks shuffle alike and each sample is read once per epoch.
    both = [r0["unsynced_shuffle"], r1["unsynced_shuffle"]]
    assert [sorted(both[0][:8] + both[1][:8]), sorted(both[0][8:] + both[1][8:])] == [list(range(16))] * 2
    for case, (batches0, batches1, remainder, gathered) in expected.items():
        for rank, (got, batches) in enumerate(((r0[case], batches0), (r1[case], batches1))):
            assert got["batches"] == batches, (case, rank)
            assert got["ends"] == [False] * (len(batches) - 1) + [True], (case, rank)
            assert got["remainders"][-1] == remainder, (case, rank)
            assert got["gathered"] == gathered, (case, rank)
            assert got["len"] == len(batches), (case, rank)
    assert r0["dispatch10"]["remainders"] == [-1, 2] and r0["dispatch10"]["type"] == "DataLoaderDispatcher"
    assert r0["iterable_shard10"]["type"] == "DataLoaderShard"


EPOCHS = 2


def _train(loader: Any, checkpoints: list[Any] | None = None) -> list[Any]:
    steps: list[Any] = []
    draws = 1 + int(os.environ["RANK"])  # ranks consume their global RNG differently (as rank-specific work does)
    while loader.iteration < EPOCHS:
        for batch in loader:
            steps.append(([t.tolist() for t in batch], torch.rand(draws).tolist()))  # the draw stands for dropout
            if checkpoints is not None:
                checkpoints.append((len(steps), copy.deepcopy(loader.state_dict()), capture_rng_state()))
        if checkpoints is not None:
            checkpoints.append((len(steps), copy.deepcopy(loader.state_dict()), capture_rng_state()))
    return steps


def _fresh(workers: int, seedable: bool, n: int, rng_types: list[str]) -> Any:
    """A newly prepared loader in a reset engine (what a restarted process builds)."""
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    accelerator = Accelerator(cpu=True, rng_types=rng_types,
                              dataloader_config=DataLoaderConfiguration(use_seedable_sampler=seedable))
    # Ranks are forkserver children, whose default would start a new forkserver per worker pool (~3 s);
    # forking workers is what a torchrun-launched Linux job does.
    context = "fork" if workers else None
    return accelerator.prepare(DataLoader(Augmented(n), batch_size=2, shuffle=True, num_workers=workers,
                                          multiprocessing_context=context))


def _resume_everywhere() -> dict[str, Any]:
    """Uninterrupted 2-epoch runs, then a restart from every checkpoint; returns the mismatches."""
    rank = int(os.environ["RANK"])
    report: dict[str, Any] = {}
    # ("torch" also synchronises the global RNG at each epoch start: a mid-epoch restart must not do it again.)
    for workers, seedable, n, rng_types in ((0, False, 20, ["generator"]), (0, True, 20, ["generator"]),
                                            (2, False, 12, ["generator"]), (2, True, 12, ["generator"]),
                                            (0, False, 12, ["torch", "generator"])):
        random.seed(7)
        np.random.seed(7)
        torch.manual_seed(7)
        checkpoints: list[Any] = []
        loader = _fresh(workers, seedable, n, rng_types)
        checkpoints.append((0, copy.deepcopy(loader.state_dict()), capture_rng_state()))
        full = _train(loader, checkpoints)
        failures = []
        for i, (done, loader_state, rng_state) in enumerate(checkpoints):
            random.seed(1000 * rank + i)  # a fresh process: other random state, on every rank differently
            np.random.seed(1000 * rank + i)
            torch.manual_seed(1000 * rank + i)
            resumed = _fresh(workers, seedable, n, rng_types)
            resumed.load_state_dict(loader_state)
            restore_rng_state(rng_state)
            if _train(resumed) != full[done:]:
                failures.append(done)
        report[f"workers={workers},seedable={seedable},rng_types={rng_types}"] = {
            "failures": failures, "checked": len(checkpoints), "order": [s[0][0] for s in full],
            "state": {k: v for k, v in checkpoints[3][1].items() if k != "generator_states"}}
    return report


def test_resume_at_every_batch_on_two_processes(run_distributed: Any) -> None:
    r0, r1 = run_distributed(_resume_everywhere, daemon=False)  # ranks start DataLoader workers
    for case in r0:
        assert r0[case]["failures"] == [] and r1[case]["failures"] == [], case
        assert r0[case]["checked"] >= 8
        # The two processes saw disjoint halves of each epoch, and their saved positions agree.
        epoch = len(r0[case]["order"]) // EPOCHS
        seen = [i for part in (r0, r1) for batch in part[case]["order"][:epoch] for i in batch]
        assert sorted(seen) == list(range(len(seen))), case
        assert r0[case]["state"] == r1[case]["state"], case


class Ragged(Dataset):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.zeros(3 if i < 4 else 5)


def _dispatch_shape_error() -> str:
    accelerator = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(dispatch_batches=True))
    loader = accelerator.prepare(DataLoader(Ragged(), batch_size=4))
    try:
        list(loader)
    except RuntimeError as error:
        return str(error)
    return "no error"


def test_dispatching_batches_of_different_shapes_fails_on_every_process(run_distributed: Any) -> None:
    r0, r1 = run_distributed(_dispatch_shape_error, timeout=60)
    assert "different shapes [(4, 3), (4, 5)]" in r0 and "dispatch_batches=False" in r0
    assert r1.startswith("Process 0 failed to read the next batch") and "(4, 3), (4, 5)" in r1


def _resume_dispatched_everywhere() -> dict[str, Any]:
    """A dispatcher whose samples draw from the global RNGs, restarted from every checkpoint of 2 epochs.

    Process 0 reads every step (and one ahead) and pads the short last step with the epoch's first rows, which a
    restarted pass reads again: both must come out as they did, under the states they were first read under.
    """
    def fresh() -> Any:
        AcceleratorState._reset_state(True)
        GradientState._reset_state()
        accelerator = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(dispatch_batches=True))
        return accelerator.prepare(DataLoader(Augmented(11), batch_size=2, shuffle=True))

    rank = int(os.environ["RANK"])
    random.seed(7)
    np.random.seed(7)
    torch.manual_seed(7)
    loader = fresh()
    checkpoints: list[Any] = [(0, copy.deepcopy(loader.state_dict()), capture_rng_state())]
    full = _train(loader, checkpoints)
    failures = []
    for i, (done, loader_state, rng_state) in enumerate(checkpoints):
        random.seed(1000 * rank + i)
        np.random.seed(1000 * rank + i)
        torch.manual_seed(1000 * rank + i)
        resumed = fresh()
        resumed.load_state_dict(loader_state)
        restore_rng_state(rng_state)
        if _train(resumed) != full[done:]:
            failures.append(done)
    return {"failures": failures, "checked": len(checkpoints), "type": type(loader).__name__,
            "last": full[len(full) // EPOCHS - 1][0]}


def test_a_dispatcher_resumes_exactly_with_random_samples_and_padding(run_distributed: Any) -> None:
    r0, r1 = run_distributed(_resume_dispatched_everywhere)
    assert r0["type"] == "DataLoaderDispatcher" and r0["checked"] == 3 * EPOCHS + EPOCHS + 1
    assert r0["failures"] == [] and r1["failures"] == []
    assert len(r0["last"][0]) == 2 and r0["last"][0] != r1["last"][0]  # the padded last step: 3 real rows + 1
