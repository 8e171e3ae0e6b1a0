"""``seed_everything`` and the dataloader-worker seeding it enables, as in Lightning.

``seed_everything(seed, workers=True)`` seeds Python, NumPy and torch (every device), and records the seed in
``PL_GLOBAL_SEED`` (processes the Trainer starts inherit it) and the workers flag in ``PL_SEED_WORKERS``. With
``workers=True`` the Trainer gives every loader without a ``worker_init_fn`` ``worker_init_function``, which
derives each worker's seeds from (base seed, worker id, global rank) exactly as Lightning's
``pl_worker_init_function`` does, so the same seed gives the same augmentations as in Lightning.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from trainer.utilities.rank_zero import rank_prefixed_message, rank_zero_only, rank_zero_warn

log = logging.getLogger("trainer")

MAX_SEED_VALUE = 4294967295  # 2**32 - 1: numpy's bound
MIN_SEED_VALUE = 0


def seed_everything(seed: int | None = None, workers: bool = False, verbose: bool = True) -> int:
    """Seed ``random``, ``numpy`` and ``torch`` with ``seed`` and return it.

    Args:
        seed: the seed; ``None`` reads ``PL_GLOBAL_SEED`` (0, with a warning, when it is not set either).
        workers: give the Trainer's dataloaders a ``worker_init_fn`` that seeds every worker distinctly
            (per worker id and global rank); a loader's own ``worker_init_fn`` is kept.
        verbose: log ``"Seed set to N"`` (logger ``"trainer"``, info level).

    Example:
        >>> seed_everything(42, verbose=False)
        42
        >>> import os; os.environ["PL_GLOBAL_SEED"], os.environ["PL_SEED_WORKERS"]
        ('42', '0')
    """
    if seed is None:
        env_seed = os.environ.get("PL_GLOBAL_SEED")
        if env_seed is None:
            seed = 0
            if verbose:
                rank_zero_warn(f"No seed found, seed set to {seed}")
        else:
            try:
                seed = int(env_seed)
            except ValueError:
                raise ValueError(f"Invalid seed in PL_GLOBAL_SEED: {env_seed!r}; set it to an integer in "
                                 f"[{MIN_SEED_VALUE}, {MAX_SEED_VALUE}] or unset it.") from None
    elif not isinstance(seed, int):
        try:
            seed = int(seed)
        except (TypeError, ValueError):
            raise TypeError(f"seed_everything(seed=...) takes an int. Received: {seed!r}.") from None
    if not MIN_SEED_VALUE <= seed <= MAX_SEED_VALUE:
        raise ValueError(f"seed_everything({seed}) is out of bounds: numpy accepts seeds from {MIN_SEED_VALUE} to "
                         f"{MAX_SEED_VALUE}.")
    if verbose:
        log.info(rank_prefixed_message(f"Seed set to {seed}", rank_zero_only.rank))
    os.environ["PL_GLOBAL_SEED"] = str(seed)
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # seeds every CUDA device too
    os.environ["PL_SEED_WORKERS"] = f"{int(workers)}"
    return seed


def reset_seed() -> None:
    """Seed again with what ``seed_everything`` last set (nothing when it was never called)."""
    seed = os.environ.get("PL_GLOBAL_SEED")
    if seed is None:
        return
    seed_everything(int(seed), workers=bool(int(os.environ.get("PL_SEED_WORKERS", "0"))), verbose=False)


def seed_workers_requested() -> bool:
    """Whether ``seed_everything(..., workers=True)`` asked for seeded dataloader workers."""
    return os.environ.get("PL_SEED_WORKERS", "0") == "1"


def worker_init_function(worker_id: int, rank: int | None = None) -> None:
    """Seed torch, ``random`` and numpy in a dataloader worker from (base seed, worker id, global rank).

    The same derivation as Lightning's ``pl_worker_init_function``: two workers, or the same worker on two
    ranks, never share a stream, and a seed gives the same streams as in Lightning.
    """
    global_rank = rank if rank is not None else rank_zero_only.rank
    if global_rank is None:
        raise RuntimeError("worker_init_function needs the global rank: pass rank=, or set rank_zero_only.rank "
                           "(the Trainer sets it when a run starts).")
    # torch seeds worker i with base_seed + i: back out the base so all its bits are used.
    base_seed = torch.initial_seed() - worker_id
    seeds = _seed_sequence(base_seed, worker_id, global_rank, count=4)
    torch.manual_seed(seeds[0])
    random.seed((seeds[1] << 32) | seeds[2])
    np.random.seed(np.random.SeedSequence([base_seed, worker_id, global_rank]).generate_state(4))


# Lightning's name (lightning.fabric.utilities.seed.pl_worker_init_function), so a port changes only the import.
pl_worker_init_function = worker_init_function


def _seed_sequence(base_seed: int, worker_id: int, global_rank: int, count: int) -> list[int]:
    """MurmurHash3's finalizer over (seed, worker, rank), then a 64-bit LCG: Lightning's derivation, bit for bit."""
    mask = (1 << 64) - 1
    combined = (base_seed << 32) | (worker_id << 16) | global_rank
    combined ^= combined >> 33
    combined = (combined * 0xFF51AFD7ED558CCD) & mask
    combined ^= combined >> 33
    combined = (combined * 0xC4CEB9FE1A85EC53) & mask
    combined ^= combined >> 33
    seeds = []
    for _ in range(count):
        combined = (combined * 6364136223846793005 + 1) & mask  # Knuth's MMIX constants
        seeds.append(combined)
    return seeds


@contextlib.contextmanager
def isolate_rng(include_cuda: bool = True) -> Iterator[None]:
    """Restore the python / numpy / torch (and CUDA) random states on exit, as Lightning's ``isolate_rng``.

    Example:
        >>> _ = torch.manual_seed(0); first = torch.rand(1)
        >>> _ = torch.manual_seed(0)
        >>> with isolate_rng():
        ...     _ = torch.rand(3)
        >>> torch.equal(torch.rand(1), first)
        True
    """
    states = (random.getstate(), np.random.get_state(), torch.get_rng_state(),
              torch.cuda.get_rng_state_all() if include_cuda and torch.cuda.is_available() else None)
    try:
        yield
    finally:
        random.setstate(states[0])
        np.random.set_state(states[1])
        torch.set_rng_state(states[2])
        if states[3] is not None:
            torch.cuda.set_rng_state_all(states[3])


def attach_worker_init(loader: Any, rank: int) -> Any:
    """Give ``loader`` (a ``DataLoader`` with workers and no ``worker_init_fn``) the seeded init, when requested.

    Returns the loader (changed in place); loaders without workers, or with the user's own init, are left alone.
    """
    if not seed_workers_requested() or not isinstance(loader, torch.utils.data.DataLoader):
        return loader
    if loader.num_workers > 0 and loader.worker_init_fn is None:
        import functools

        # DataLoader freezes most attributes after __init__, but worker_init_fn stays assignable.
        loader.worker_init_fn = functools.partial(worker_init_function, rank=rank)
    return loader
