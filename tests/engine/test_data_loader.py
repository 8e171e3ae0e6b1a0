"""Prepared loaders in one process: batches, end_of_dataloader, remainder, GradientState, errors, skipping."""

from __future__ import annotations

import gc
import random
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset

from engine import Accelerator, DataLoaderConfiguration, GradientState
from engine.data.loader import (
    DataLoaderDispatcher,
    DataLoaderShard,
    SkipDataLoader,
    prepare_data_loader,
    skip_first_batches,
)


class Numbers(IterableDataset):
    """0..n-1 as an iterable dataset (with a length unless ``sized=False``)."""

    def __init__(self, n: int, sized: bool = True) -> None:
        self.n, self.sized = n, sized

    def __iter__(self) -> Any:
        return iter(range(self.n))

    def __len__(self) -> int:
        if not self.sized:
            raise TypeError("unsized")
        return self.n


def _walk(accelerator: Accelerator, loader: DataLoader) -> dict[str, Any]:
    """Batches, GradientState.end_of_dataloader at each batch, remainder and gather_for_metrics at the last."""
    batches, ends, remainder, gathered = [], [], None, None
    for batch in loader:
        batches.append(batch.tolist())
        ends.append(GradientState().end_of_dataloader)
        remainder = GradientState().remainder
        gathered = accelerator.gather_for_metrics(batch).tolist()
    return {"batches": batches, "ends": ends, "remainder": remainder, "gathered": gathered}


@pytest.mark.parametrize("source", ["map", "iterable"])
def test_single_process_table_row(source: str) -> None:
    accelerator = Accelerator(cpu=True)
    data = list(range(10)) if source == "map" else Numbers(10)
    loader = accelerator.prepare(DataLoader(data, batch_size=4))
    # With device placement an iterable dataset is dispatched (ENGINE.md 2.4); both are honest DataLoaders.
    assert isinstance(loader, DataLoaderShard if source == "map" else DataLoaderDispatcher)
    assert isinstance(loader, DataLoader) and loader.__class__.__name__ != "DataLoader"
    assert (len(loader), loader.total_batch_size, loader.total_dataset_length) == (3, 4, 10)
    assert _walk(accelerator, loader) == {"batches": [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]], "ends": [False, False, True],
                                          "remainder": 2, "gathered": [8, 9]}
    assert loader.iteration == 1 and not GradientState().in_dataloader


def test_end_of_dataloader_is_set_before_the_last_batch_and_the_next_batch_is_read_first() -> None:
    fetched: list[int] = []

    class Recording(Dataset):
        def __len__(self) -> int:
            return 6

        def __getitem__(self, i: int) -> int:
            fetched.append(i)
            return i

    loader = prepare_data_loader(DataLoader(Recording(), batch_size=2), num_processes=1, process_index=0)
    seen = []
    for batch in loader:
        # Accelerate's order: batch k+1 is read (and collated) before batch k is yielded.
        seen.append((batch.tolist(), loader.end_of_dataloader, sorted(fetched)))
        assert GradientState().active_dataloader is loader
    assert seen == [([0, 1], False, [0, 1, 2, 3]), ([2, 3], False, list(range(6))), ([4, 5], True, list(range(6)))]
    assert GradientState().active_dataloader is None


def test_break_unregisters_and_nested_loaders_stack() -> None:
    outer = prepare_data_loader(DataLoader(list(range(6)), batch_size=2), num_processes=1, process_index=0)
    inner = prepare_data_loader(DataLoader(list(range(2)), batch_size=1), num_processes=1, process_index=0)
    for _ in outer:
        assert GradientState().active_dataloader is outer
        for _ in inner:
            assert GradientState().active_dataloader is inner
        assert GradientState().active_dataloader is outer
        break
    gc.collect()
    assert GradientState().active_dataloader is None and not GradientState().end_of_dataloader


def test_empty_loader_and_device_placement() -> None:
    empty = prepare_data_loader(DataLoader([], batch_size=2), num_processes=1, process_index=0)
    assert list(empty) == [] and empty.iteration == 1 and GradientState().active_dataloader is None
    placed = prepare_data_loader(DataLoader(list(range(3)), batch_size=2), device=torch.device("meta"),
                                 num_processes=1, process_index=0, put_on_device=True, non_blocking=True)
    assert [b.device.type for b in placed] == ["meta", "meta"]


def test_set_epoch_reaches_the_sampler_and_iteration_counts_epochs() -> None:
    class EpochSampler(torch.utils.data.Sampler[int]):
        def __init__(self) -> None:
            self.epochs: list[int] = []

        def set_epoch(self, epoch: int) -> None:
            self.epochs.append(epoch)

        def __iter__(self) -> Any:
            return iter(range(4))

        def __len__(self) -> int:
            return 4

    sampler = EpochSampler()
    loader = prepare_data_loader(DataLoader(list(range(4)), batch_size=2, sampler=sampler), num_processes=2,
                                 process_index=1)
    for _ in range(2):
        assert [b.tolist() for b in loader] == [[2, 3]]
    loader.set_epoch(7)
    list(loader)
    assert sampler.epochs == [0, 1, 7, 7] and loader.iteration == 8


def test_skip_first_batches_keeps_remainder_and_reports_its_length() -> None:
    accelerator = Accelerator(cpu=True)
    loader = accelerator.prepare(DataLoader(list(range(10)), batch_size=4))
    skipped = accelerator.skip_first_batches(loader, 1)
    assert isinstance(skipped, DataLoaderShard) and len(skipped) == 2
    assert _walk(accelerator, skipped) == {"batches": [[4, 5, 6, 7], [8, 9]], "ends": [False, True],
                                           "remainder": 2, "gathered": [8, 9]}
    iterable = accelerator.skip_first_batches(accelerator.prepare(DataLoader(Numbers(10), batch_size=4)), 2)
    assert len(iterable) == 1 and [b.tolist() for b in iterable] == [[8, 9]]
    plain = skip_first_batches(DataLoader(Numbers(10), batch_size=4), 1)
    assert isinstance(plain, SkipDataLoader) and len(plain) == 2 and next(iter(plain)).tolist() == [4, 5, 6, 7]


def test_remainder_unknown_for_unsized_iterable_and_minus_one_with_drop_last() -> None:
    accelerator = Accelerator(cpu=True, device_placement=False)  # no dispatch: each process reads its share
    unsized = accelerator.prepare(DataLoader(Numbers(10, sized=False), batch_size=4))
    assert isinstance(unsized, DataLoaderShard) and _walk(accelerator, unsized)["remainder"] == -1
    sized = accelerator.prepare(DataLoader(Numbers(10), batch_size=4))
    assert _walk(accelerator, sized)["remainder"] == 2  # known from len(): duplicates can be dropped
    dropped = accelerator.prepare(DataLoader(list(range(10)), batch_size=4, drop_last=True))
    assert _walk(accelerator, dropped) == {"batches": [[0, 1, 2, 3], [4, 5, 6, 7]], "ends": [False, True],
                                           "remainder": -1, "gathered": [4, 5, 6, 7]}


def test_single_process_dispatcher() -> None:
    accelerator = Accelerator(cpu=True)
    loader = accelerator.prepare(DataLoader(Numbers(10), batch_size=4))  # iterable + device placement: dispatch
    assert isinstance(loader, DataLoaderDispatcher) and len(loader) == 3
    assert _walk(accelerator, loader) == {"batches": [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]], "ends": [False, False, True],
                                          "remainder": 2, "gathered": [8, 9]}


# -- bad input --------------------------------------------------------------------------------------------------
def test_split_batches_with_indivisible_batch_size_names_the_values() -> None:
    with pytest.raises(ValueError, match=r"batch_size=3 and num_processes=2: use a batch size of 4"):
        prepare_data_loader(DataLoader(list(range(10)), batch_size=3), num_processes=2, process_index=0,
                            split_batches=True)


def test_dispatch_without_device_placement_is_refused() -> None:
    with pytest.raises(ValueError, match="dispatch_batches=True needs put_on_device=True.*got put_on_device=False"):
        prepare_data_loader(DataLoader(list(range(4))), num_processes=1, process_index=0, dispatch_batches=True)
    accelerator = Accelerator(cpu=True, device_placement=False,
                              dataloader_config=DataLoaderConfiguration(dispatch_batches=True))
    with pytest.raises(ValueError, match="put_on_device=False"):
        accelerator.prepare(DataLoader(list(range(4))))


def test_load_state_dict_from_a_different_loader_is_refused() -> None:
    shuffled = prepare_data_loader(DataLoader(list(range(8)), batch_size=2, shuffle=True), num_processes=1,
                                   process_index=0)
    ordered = prepare_data_loader(DataLoader(list(range(8)), batch_size=2), num_processes=1, process_index=0)
    with pytest.raises(ValueError, match="holds 1 generator state.*loader has 0 generator"):
        ordered.load_state_dict(shuffled.state_dict())


# -- random state ---------------------------------------------------------------------------------------------
class Augmented(Dataset):
    """Each sample carries draws from torch, random and numpy, as augmentation would."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[int, float, float, float]:
        return i, torch.rand(()).item(), random.random(), float(np.random.rand())


def test_iterating_draws_from_the_global_rng_exactly_as_a_plain_loader() -> None:
    # Accelerate's one-process loader is a plain DataLoader underneath: per epoch, one draw for the iterator seed,
    # then one for RandomSampler's seed. Same order, same global stream after it; python and numpy untouched.
    def epochs(loader: DataLoader) -> list[Any]:
        torch.manual_seed(0)
        out = [[b.tolist() for b in loader] for _ in range(2)]
        return [out, torch.rand(2).tolist()]

    plain = DataLoader(list(range(12)), batch_size=4, shuffle=True)
    loader = prepare_data_loader(DataLoader(list(range(12)), batch_size=4, shuffle=True), num_processes=1,
                                 process_index=0)
    before = (random.getstate(), np.random.get_state()[1].copy())
    expected, got = epochs(plain), epochs(loader)
    assert got == expected and got[0][0] != got[0][1]  # still a new order every epoch
    assert before[0] == random.getstate() and (before[1] == np.random.get_state()[1]).all()


def test_workers_draw_from_per_batch_seeds_independent_of_worker_count() -> None:
    def epoch(workers: int) -> list[list[Any]]:
        torch.manual_seed(5)
        loader = prepare_data_loader(DataLoader(Augmented(8), batch_size=2, num_workers=workers), num_processes=1,
                                     process_index=0)
        return [[t.tolist() for t in b] for b in loader]

    one, two = epoch(1), epoch(2)
    assert one == two
    draws = [x for batch in one for x in batch[1]]
    assert len(set(draws)) == len(draws)  # different samples, different draws
