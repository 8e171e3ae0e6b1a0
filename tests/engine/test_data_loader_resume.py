"""Exact data position in one process: a loader restored at any batch continues as if never interrupted.

A "fresh process" is simulated by resetting the engine state, re-seeding the global RNGs with *other* values
(a new process starts with different state) and building and preparing the loader again; only the saved loader
state and the saved global RNG state (what ``save_state`` stores) may decide what happens next.
"""

from __future__ import annotations

import copy
import random
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, TensorDataset, default_collate

from engine import Accelerator, DataLoaderConfiguration
from engine.random import capture_rng_state, restore_rng_state
from engine.state import AcceleratorState, GradientState

EPOCHS = 2


class Augmented(Dataset):
    """Each sample carries draws from torch, random and numpy, as augmentation in ``__getitem__`` would."""

    def __init__(self, n: int, fetched: list[int] | None = None) -> None:
        self.n, self.fetched = n, fetched

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[int, float, float, float]:
        if self.fetched is not None:
            self.fetched.append(i)
        return i, torch.rand(()).item(), random.random(), float(np.random.rand())


class Stream(IterableDataset):
    def __len__(self) -> int:
        return 11

    def __iter__(self) -> Any:
        return iter(range(11))


class NoisyStream(IterableDataset):
    """An iterable dataset whose items carry draws from torch, random and numpy (augmentation while streaming)."""

    def __len__(self) -> int:
        return 11

    def __iter__(self) -> Any:
        for i in range(11):
            yield i, torch.rand(()).item(), random.random(), float(np.random.rand())


def noisy_collate(samples: list[Any]) -> list[torch.Tensor]:
    """default_collate, then noise from the global torch RNG (a masking collator)."""
    batch = default_collate(samples)
    return [*batch, torch.rand(len(samples))]


def gauss_collate(samples: list[Any]) -> list[torch.Tensor]:
    """default_collate, then one gaussian from random and one from numpy: each caches the other of its pair, which
    the next batch's draw consumes without moving the generator's words (engine.random.RNGSnapshots)."""
    return [*default_collate(samples), torch.tensor([random.gauss(0.0, 1.0), float(np.random.randn())])]


def _fresh(make: Any, seedable: bool = False, dispatch: bool | None = None) -> DataLoader:
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    config = DataLoaderConfiguration(use_seedable_sampler=seedable, dispatch_batches=dispatch)
    accelerator = Accelerator(cpu=True, dataloader_config=config)
    return accelerator.prepare(make())


def _checkpoint(loader: DataLoader) -> dict[str, Any]:
    return {"loader": copy.deepcopy(loader.state_dict()), "rng": capture_rng_state()}


def _train(loader: Any, checkpoints: list[tuple[int, dict[str, Any]]] | None = None) -> list[Any]:
    """A training loop: per step the batch and one draw of the model's own randomness (think dropout)."""
    steps: list[Any] = []
    while loader.iteration < EPOCHS:
        for batch in loader:
            dropout = torch.rand(1).item()
            steps.append(([t.tolist() for t in batch] if isinstance(batch, list) else batch.tolist(), dropout))
            if checkpoints is not None:
                checkpoints.append((len(steps), _checkpoint(loader)))
        if checkpoints is not None:  # between epochs too
            checkpoints.append((len(steps), _checkpoint(loader)))
    return steps


def _assert_resumes_everywhere(make: Any, seedable: bool = False, dispatch: bool | None = None) -> None:
    random.seed(1234)
    np.random.seed(1234)
    torch.manual_seed(1234)
    loader = _fresh(make, seedable, dispatch)
    checkpoints = [(0, _checkpoint(loader))]
    full = _train(loader, checkpoints)
    assert len(checkpoints) == len(full) + EPOCHS + 1
    for n, (done, saved) in enumerate(checkpoints):
        random.seed(n + 99)
        np.random.seed(n + 99)
        torch.manual_seed(n + 99)
        resumed = _fresh(make, seedable, dispatch)
        resumed.load_state_dict(saved["loader"])
        restore_rng_state(saved["rng"])
        assert _train(resumed) == full[done:], f"resumed after {done} steps"


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("seedable", [False, True])
def test_resume_at_every_batch_equals_the_uninterrupted_run(workers: int, seedable: bool) -> None:
    _assert_resumes_everywhere(lambda: DataLoader(Augmented(10), batch_size=3, shuffle=True, num_workers=workers),
                               seedable)


def test_resume_dispatched_iterable_dataset() -> None:
    # Iterable datasets cannot skip without reading: the skipped batches are read again and dropped.
    _assert_resumes_everywhere(lambda: DataLoader(Stream(), batch_size=3))


def test_resume_with_a_user_generator_and_persistent_workers() -> None:
    def make() -> DataLoader:
        return DataLoader(Augmented(8), batch_size=3, shuffle=True, num_workers=2, persistent_workers=True,
                          generator=torch.Generator().manual_seed(int(torch.randint(0, 10**6, ()))))

    _assert_resumes_everywhere(make)


def test_resume_fetches_no_skipped_sample() -> None:
    fetched: list[int] = []
    loader = _fresh(lambda: DataLoader(Augmented(40, fetched), batch_size=4, shuffle=True))
    order = [b[0].tolist() for b in loader]
    batches = iter(loader)  # epoch 1, saved after 7 batches
    epoch1 = [next(batches)[0].tolist() for _ in range(7)]
    saved = copy.deepcopy(loader.state_dict())
    epoch1 += [b[0].tolist() for b in batches]
    assert epoch1 != order and saved["iteration"] == 1 and saved["batches_yielded"] == 7
    fetched.clear()
    resumed = _fresh(lambda: DataLoader(Augmented(40, fetched), batch_size=4, shuffle=True))
    resumed.load_state_dict(saved)
    assert [b[0].tolist() for b in resumed] == epoch1[7:]
    assert sorted(fetched) == sorted(i for batch in epoch1[7:] for i in batch)


def test_state_dict_is_plain_data() -> None:
    loader = _fresh(lambda: DataLoader(Augmented(6), batch_size=2, shuffle=True))
    iterator = iter(loader)
    next(iterator)
    state = loader.state_dict()
    assert state["iteration"] == 0 and state["batches_yielded"] == 1 and isinstance(state["seed"], int)
    assert all(isinstance(s, torch.Tensor) for s in state["generator_states"])
    torch.save(state, buffer := __import__("io").BytesIO())
    buffer.seek(0)
    assert torch.load(buffer, weights_only=True)["batches_yielded"] == 1


def test_save_state_and_load_state_carry_the_position(tmp_path: Any) -> None:
    def fresh() -> tuple[Accelerator, DataLoader]:
        AcceleratorState._reset_state(True)
        GradientState._reset_state()
        accelerator = Accelerator(cpu=True)
        return accelerator, accelerator.prepare(DataLoader(Augmented(10), batch_size=3, shuffle=True))

    torch.manual_seed(0)
    accelerator, loader = fresh()
    full = []
    for _ in range(EPOCHS):
        for batch in loader:
            full.append(([t.tolist() for t in batch], torch.rand(1).item()))
            if len(full) == 3:
                accelerator.save_state(str(tmp_path / "checkpoint"))
    torch.manual_seed(5)  # a restarted process: other global state until load_state
    accelerator, loader = fresh()
    accelerator.load_state(str(tmp_path / "checkpoint"))
    assert _train(loader) == full[3:]


# The loader collates batch k+1 before it yields batch k (Accelerate's order), so a checkpoint after step k holds
# RNG states past batch k+1's draws: the resumed run must collate that batch again under the state it was first
# collated under. Each collation path that draws in this process is checked at every batch.


@pytest.mark.parametrize("workers", [0, 2])
def test_resume_with_a_collator_drawing_from_the_global_rng(workers: int) -> None:
    _assert_resumes_everywhere(lambda: DataLoader(Augmented(10), batch_size=3, shuffle=True, num_workers=workers,
                                                  collate_fn=noisy_collate))


def test_resume_with_a_collator_drawing_gaussians() -> None:
    # Only the collator draws from random and numpy here, so every other batch moves neither generator's words.
    _assert_resumes_everywhere(lambda: DataLoader(TensorDataset(torch.arange(10.0)), batch_size=3, shuffle=True,
                                                  collate_fn=gauss_collate))


def test_resume_a_dispatched_iterable_dataset_that_draws() -> None:
    # Process 0 reads a step ahead; a resumed pass also reads the skipped steps again, without shifting the stream.
    _assert_resumes_everywhere(lambda: DataLoader(NoisyStream(), batch_size=3))


def test_resume_an_iterable_dataset_that_draws_read_in_each_process() -> None:
    _assert_resumes_everywhere(lambda: DataLoader(NoisyStream(), batch_size=3, collate_fn=noisy_collate),
                               dispatch=False)


def test_a_pipeline_that_cannot_draw_keeps_no_random_state() -> None:
    # Keeping the look-ahead batch's RNG state costs ~30 us a batch: not spent where collation cannot draw.
    def mid_epoch(make: Any) -> dict[str, Any]:
        loader = _fresh(make)
        iterator = iter(loader)
        next(iterator)
        return loader.state_dict()

    tensors = TensorDataset(torch.arange(12.0))
    for plain in (DataLoader(tensors, batch_size=3, shuffle=True), DataLoader(list(range(12)), batch_size=3),
                  DataLoader(tensors, batch_size=3, num_workers=2)):  # workers draw from per-batch seeds
        assert mid_epoch(lambda: plain)["lookahead"] == []  # noqa: B023 (called at once)
    for drawing in (DataLoader(tensors, batch_size=3, collate_fn=noisy_collate), DataLoader(Augmented(12), 3)):
        state = mid_epoch(lambda: drawing)  # noqa: B023 (called at once)
        assert state["lookahead"] == ["ahead"] and state["generator_states"][-1].dtype == torch.uint8


def test_a_position_saved_before_the_look_ahead_states_still_loads() -> None:
    # Checkpoints from before this format hold no "lookahead" key and only the samplers' states: the loader goes
    # on from the saved batch (its look-ahead batch collated from the live random state, as it was then).
    def make() -> DataLoader:
        return DataLoader(Augmented(12), batch_size=3, shuffle=True)

    loader = _fresh(make)
    batches = iter(loader)
    next(batches)
    state = loader.state_dict()
    assert state["lookahead"] == ["ahead"]
    rest = [b[0].tolist() for b in batches]
    old = {k: v for k, v in state.items() if k != "lookahead"}
    old["generator_states"] = state["generator_states"][:-1]
    resumed = _fresh(make)
    resumed.load_state_dict(old)
    assert [b[0].tolist() for b in resumed] == rest
