"""BatchSamplerShard / IterableDatasetShard / SkipBatchSampler / SeedableRandomSampler against ENGINE.md section 3.

Ranks are simulated with ``process_index`` / ``num_processes`` in one process.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.utils.data import BatchSampler, RandomSampler, SequentialSampler

from engine.data.samplers import (
    BatchSamplerShard,
    IterableDatasetShard,
    SeedableRandomSampler,
    SkipBatchSampler,
    iter_batches_from,
)


def r(a: int, b: int) -> list[int]:
    return list(range(a, b))


# (N, bs, drop_last, split, even, P, expected batches per rank), rows of ENGINE.md section 3.
SHARD_VECTORS: list[tuple[int, int, bool, bool, bool, int, list[list[list[int]]]]] = [
    (24, 3, False, False, True, 2, [[r(0, 3), r(6, 9), r(12, 15), r(18, 21)], [r(3, 6), r(9, 12), r(15, 18), r(21, 24)]]),
    (24, 3, True, False, True, 2, [[r(0, 3), r(6, 9), r(12, 15), r(18, 21)], [r(3, 6), r(9, 12), r(15, 18), r(21, 24)]]),
    (21, 3, False, False, True, 2, [[r(0, 3), r(6, 9), r(12, 15), r(18, 21)], [r(3, 6), r(9, 12), r(15, 18), [0, 1, 2]]]),
    (22, 3, False, False, True, 2, [[r(0, 3), r(6, 9), r(12, 15), r(18, 21)], [r(3, 6), r(9, 12), r(15, 18), [21, 0, 1]]]),
    (20, 3, False, False, True, 2, [[r(0, 3), r(6, 9), r(12, 15), [18, 19, 0]], [r(3, 6), r(9, 12), r(15, 18), [1, 2, 3]]]),
    (20, 3, True, False, True, 2, [[r(0, 3), r(6, 9), r(12, 15)], [r(3, 6), r(9, 12), r(15, 18)]]),
    (2, 3, False, False, True, 2, [[[0, 1, 0]], [[1, 0, 1]]]),
    (2, 3, True, False, True, 2, [[], []]),
    (2, 3, True, False, False, 2, [[], []]),
    (21, 3, False, False, False, 2, [[r(0, 3), r(6, 9), r(12, 15), r(18, 21)], [r(3, 6), r(9, 12), r(15, 18)]]),
    (22, 3, False, False, False, 2, [[r(0, 3), r(6, 9), r(12, 15), r(18, 21)], [r(3, 6), r(9, 12), r(15, 18), [21]]]),
    (20, 3, False, False, False, 2, [[r(0, 3), r(6, 9), r(12, 15), [18, 19]], [r(3, 6), r(9, 12), r(15, 18)]]),
    (2, 3, False, False, False, 2, [[[0, 1]], []]),
    (24, 4, False, True, True, 2, [[[i, i + 1] for i in range(0, 24, 4)], [[i + 2, i + 3] for i in range(0, 24, 4)]]),
    (22, 4, False, True, True, 2, [[[i, i + 1] for i in range(0, 24, 4)],
                                   [[i + 2, i + 3] for i in range(0, 20, 4)] + [[0, 1]]]),
    (21, 4, False, True, True, 2, [[[i, i + 1] for i in range(0, 20, 4)] + [[20, 0]],
                                   [[i + 2, i + 3] for i in range(0, 20, 4)] + [[1, 2]]]),
    (21, 4, False, True, False, 2, [[[i, i + 1] for i in range(0, 20, 4)] + [[20]],
                                    [[i + 2, i + 3] for i in range(0, 20, 4)]]),
    (2, 4, False, True, True, 2, [[[0, 1]], [[0, 1]]]),
    (5, 4, False, False, True, 2, [[[0, 1, 2, 3]], [[4, 0, 1, 2]]]),
    (10, 2, False, False, True, 3, [[[0, 1], [6, 7]], [[2, 3], [8, 9]], [[4, 5], [0, 1]]]),
    (10, 2, False, False, False, 3, [[[0, 1], [6, 7]], [[2, 3], [8, 9]], [[4, 5]]]),
    (7, 6, False, True, True, 3, [[[0, 1], [6, 0]], [[2, 3], [1, 2]], [[4, 5], [3, 4]]]),
]


def _shards(n: int, bs: int, drop: bool, split: bool, even: bool, procs: int) -> list[BatchSamplerShard]:
    return [BatchSamplerShard(BatchSampler(range(n), bs, drop), procs, rank, split, even) for rank in range(procs)]


@pytest.mark.parametrize("n,bs,drop,split,even,procs,expected", SHARD_VECTORS)
def test_batch_sampler_shard_vectors(n: int, bs: int, drop: bool, split: bool, even: bool, procs: int,
                                     expected: list[list[list[int]]]) -> None:
    shards = _shards(n, bs, drop, split, even, procs)
    assert [list(s) for s in shards] == expected
    if not (split and not even):  # split + uneven over-reports len() on purpose (Accelerate's quirk)
        assert [len(s) for s in shards] == [len(e) for e in expected]


@pytest.mark.parametrize("n,bs,drop,split,even,procs,expected", SHARD_VECTORS)
def test_batch_sampler_shard_resumes_at_every_batch(n: int, bs: int, drop: bool, split: bool, even: bool,
                                                   procs: int, expected: list[list[list[int]]]) -> None:
    # The index-level skip (jumping whole rounds) must give exactly the tail of the full sequence.
    for shard, batches in zip(_shards(n, bs, drop, split, even, procs), expected):
        for k in range(len(batches) + 1):
            assert list(iter_batches_from(shard, k)) == batches[k:], (shard.process_index, k)


VARYING = [[0, 1, 2], [3, 4], [5, 6, 7, 8], [9, 10, 11], [12, 13]]


@pytest.mark.parametrize("even,expected", [
    (False, [[[0, 1, 2], [5, 6, 7, 8], [12, 13]], [[3, 4], [9, 10, 11]]]),
    (True, [[[0, 1, 2], [5, 6, 7, 8], [12, 13]], [[3, 4], [9, 10, 11], [0, 1, 2]]]),
])
def test_variable_size_batches(even: bool, expected: list[list[list[int]]]) -> None:
    shards = [BatchSamplerShard(VARYING, 2, rank, even_batches=even) for rank in range(2)]
    assert [list(s) for s in shards] == expected
    for shard, batches in zip(shards, expected):
        assert [list(iter_batches_from(shard, k)) for k in range(4)] == [batches[k:] for k in range(4)]


def test_large_resume_jumps_rounds_and_matches_the_full_order() -> None:
    gen = torch.Generator().manual_seed(3)
    for split in (False, True):
        for rank in range(3):
            full = list(BatchSamplerShard(BatchSampler(RandomSampler(range(1001), generator=gen), 6, False), 3,
                                          rank, split))
            gen.manual_seed(3)
            state = gen.get_state()
            for k in (0, 1, 2, 17, len(full) - 1, len(full)):
                gen.set_state(state)
                shard = BatchSamplerShard(BatchSampler(RandomSampler(range(1001), generator=gen), 6, False), 3,
                                          rank, split)
                assert list(iter_batches_from(shard, k)) == full[k:]
            gen.manual_seed(3)


def test_split_batches_needs_a_multiple_of_the_process_count() -> None:
    with pytest.raises(ValueError, match=r"batch_size=3 and num_processes=2.*batch size of 4"):
        BatchSamplerShard(BatchSampler(range(10), 3, False), 2, 0, split_batches=True)
    with pytest.raises(ValueError, match="batch_size=5 and num_processes=2"):
        IterableDatasetShard(range(10), batch_size=5, num_processes=2, split_batches=True)


@pytest.mark.parametrize("n,bs,drop,expected", [
    (10, 2, False, [[0, 1, 4, 5, 8, 9], [2, 3, 6, 7, 0, 1]]),
    (10, 2, True, [[0, 1, 4, 5], [2, 3, 6, 7]]),
    (3, 2, False, [[0, 1], [2, 0]]),
])
def test_iterable_dataset_shard_vectors(n: int, bs: int, drop: bool, expected: list[list[int]]) -> None:
    shards = [IterableDatasetShard(range(n), batch_size=bs, drop_last=drop, num_processes=2, process_index=rank)
              for rank in range(2)]
    assert [list(s) for s in shards] == expected
    assert [len(s) for s in shards] == [len(e) for e in expected]


def test_iterable_dataset_shard_split_and_epoch() -> None:
    shards = [IterableDatasetShard(range(10), batch_size=4, num_processes=2, process_index=rank, split_batches=True)
              for rank in range(2)]
    assert [list(s) for s in shards] == [[0, 1, 4, 5, 8, 9], [2, 3, 6, 7, 0, 1]]
    assert [len(s) for s in shards] == [6, 6]

    class Shuffled(torch.utils.data.IterableDataset):
        def __init__(self) -> None:
            self.generator = torch.Generator()

        def __iter__(self) -> Any:
            return iter(torch.randperm(8, generator=self.generator).tolist())

    shard = IterableDatasetShard(Shuffled(), batch_size=2, num_processes=2)
    shard.set_epoch(5)
    first = list(shard)
    shard.set_epoch(5)  # without a dataset set_epoch, the dataset generator is reseeded with the epoch
    assert list(shard) == first


def test_skip_batch_sampler_keeps_geometry_and_length() -> None:
    inner = BatchSampler(SequentialSampler(range(10)), 4, False)
    skipped = SkipBatchSampler(inner, 1)
    assert list(skipped) == [[4, 5, 6, 7], [8, 9]]
    assert (len(skipped), skipped.batch_size, skipped.drop_last, skipped.total_length) == (2, 4, False, 3)
    assert list(iter_batches_from(skipped, 1)) == [[8, 9]]
    assert list(SkipBatchSampler(inner, 5)) == [] and len(SkipBatchSampler(inner, 5)) == 0


def test_plain_batch_sampler_skip_consumes_indices_only() -> None:
    class Counting(torch.utils.data.Sampler[int]):
        def __init__(self) -> None:
            self.seen = 0

        def __iter__(self) -> Any:
            for i in range(100):
                self.seen += 1
                yield i

        def __len__(self) -> int:
            return 100

    sampler = Counting()
    assert list(iter_batches_from(BatchSampler(sampler, 7, True), 13)) == [list(range(91, 98))]
    assert sampler.seen == 100
    assert list(iter_batches_from(BatchSampler(range(10), 3, True), 2)) == [[6, 7, 8]]


def test_seedable_random_sampler_replays_epochs() -> None:
    sampler = SeedableRandomSampler(range(20), data_seed=11)
    epoch0, epoch1 = list(sampler), list(sampler)
    assert epoch0 != epoch1 and sorted(epoch0) == list(range(20))
    sampler.set_epoch(0)
    assert list(sampler) == epoch0
    before = torch.get_rng_state()
    assert list(SeedableRandomSampler(range(20), data_seed=11)) == epoch0
    assert torch.equal(before, torch.get_rng_state())  # draws nothing from the global RNG
    assert list(SeedableRandomSampler(range(20), data_seed=0)) != list(SeedableRandomSampler(range(20), data_seed=1))


@pytest.mark.parametrize("split", [False, True])
def test_real_count_marks_exactly_the_padding_of_even_batches(split: bool) -> None:
    """Keeping the first real_count indices of every batch on every process yields each sample exactly once."""
    from torch.utils.data import BatchSampler

    from engine.data.samplers import BatchSamplerShard

    for procs in (2, 3):
        for size in (2, 3, 4, 6):
            if split and size % procs:
                continue
            for n in range(1, 20):
                kept: list[int] = []
                for rank in range(procs):
                    shard = BatchSamplerShard(BatchSampler(range(n), size, False), procs, rank, split)
                    for j, batch in enumerate(shard):
                        real = shard.real_count(j)
                        kept += batch if real is None else batch[:real]
                assert sorted(kept) == list(range(n)), (procs, size, n)
    uneven = BatchSamplerShard(BatchSampler(range(5), 2, False), 2, 1, split, even_batches=False)
    assert [uneven.real_count(j) for j in range(len(uneven))] == [None] * len(uneven)
