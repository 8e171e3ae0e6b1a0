"""The random state of a prepared loader's look-ahead batch: what lets a resumed run collate it again exactly.

A prepared loader collates batch k+1 before it yields batch k, as Accelerate's does: random draws made while
collating (a masking collator, augmentation in ``__getitem__``) come in Accelerate's order, mask(b0), mask(b1),
dropout(b0), mask(b2), ... A checkpoint taken after step k therefore holds global RNG states that are already
past batch k+1's draws, while batch k+1 itself was never yielded. The resumed run must hand out that same
batch k+1 without drawing again from the restored states, so the loader keeps the RNG state from just before it
collated its look-ahead batch, saves it with its position, and the resumed run collates that batch once more
under it, then puts the live (restored) state back.

Taking that state costs a few us per batch (``engine.random.RNGSnapshots``), so it is taken only where a
collation can draw at all: in this process (workers draw from per-batch seeds instead) and unless the pipeline
is known to draw nothing (torch's default collate over in-memory tensors, lists and their subsets).
"""

from __future__ import annotations

import base64
import json
import random
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np
import torch
from torch.utils.data import ConcatDataset, DataLoader, StackDataset, Subset, TensorDataset
from torch.utils.data._utils.collate import default_collate, default_convert

from engine.random import RawRNGState, RNGSnapshots, cuda_rng_in_use, restore_snapshot, snapshot_rng

T = TypeVar("T")

_PLAIN_COLLATES = (default_collate, default_convert)


def _reads_without_rng(dataset: Any) -> bool:
    """Whether fetching items of ``dataset`` surely draws no random number (only exact library types qualify:
    a subclass may override ``__getitem__``)."""
    kind = type(dataset)
    if kind in (TensorDataset, list, tuple, range):
        return True
    if kind is Subset:
        return _reads_without_rng(dataset.dataset)
    if kind is ConcatDataset:
        return all(_reads_without_rng(d) for d in dataset.datasets)
    if kind is StackDataset:
        parts = dataset.datasets
        return all(_reads_without_rng(d) for d in (parts.values() if isinstance(parts, dict) else parts))
    return False


def ahead_snapshots(loader: DataLoader, dataset: Any) -> RNGSnapshots | None:
    """What to call before collating each look-ahead batch of a pass (None: nothing to keep).

    Workers collate with their own per-batch seeds, so only a main-process loader whose collation may draw keeps
    states. Decided per pass: CUDA generators may have come into use since the last one.
    """
    if loader.num_workers > 0:
        return None
    if any(loader.collate_fn is plain for plain in _PLAIN_COLLATES) and _reads_without_rng(dataset):
        return None
    return RNGSnapshots(cuda_rng_in_use())


def as_saved(state: RawRNGState | torch.Tensor | None) -> torch.Tensor | None:
    """A kept look-ahead state as checkpoint data (one restored from a checkpoint already is).

    One uint8 tensor holding JSON (bytes in base64), so that it can sit in the loader's ``generator_states``
    beside the sampler generators' states: ``weights_only``-safe, read back without running code, and outside
    the position keys, which stay the same on every rank.
    """
    if state is None or isinstance(state, torch.Tensor):
        return state
    torch_state, (py_version, py_state, py_gauss), (np_kind, np_keys, np_pos, np_has_gauss, np_gauss), cuda = state
    values: dict[str, Any] = {"torch": _b64(torch_state), "python": [py_version, list(py_state), py_gauss],
                              "numpy": [np_kind, np_keys.tolist(), int(np_pos), int(np_has_gauss), float(np_gauss)]}
    if cuda is not None:
        values["cuda"] = [_b64(c) for c in cuda]
    return torch.frombuffer(bytearray(json.dumps(values).encode()), dtype=torch.uint8)


def _restore(saved: torch.Tensor) -> None:
    """Inverse of ``as_saved``: make those the process's RNG states."""
    values = json.loads(saved.cpu().numpy().tobytes())
    torch.set_rng_state(_bytes(values["torch"]))
    version, py_state, gauss = values["python"]
    random.setstate((version, tuple(py_state), gauss))
    kind, keys, pos, has_gauss, np_gauss = values["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), pos, has_gauss, np_gauss))
    if "cuda" in values:
        torch.cuda.set_rng_state_all([_bytes(b) for b in values["cuda"]])


def _b64(state: torch.Tensor) -> str:
    return base64.b64encode(state.numpy().tobytes()).decode()


def _bytes(text: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8)


def collate_again(saved: torch.Tensor | None, read: Callable[[], T]) -> T:
    """``read()`` under the RNG state ``saved`` (the one the interrupted run collated it under), leaving this
    process's RNG state as it was: the draws ``read`` makes were already made before the checkpoint.

    With ``saved=None`` the draws are only kept from shifting the live state (batches skipped on resume).
    """
    live = snapshot_rng(cuda_rng_in_use())
    try:
        if saved is not None:
            _restore(saved)
        return read()
    finally:
        restore_snapshot(live)
