"""Random number generators: seeding, cross-rank synchronisation, and capture/restore as plain tensors.

RNG states are stored as tensors and JSON-safe values (never pickled Python objects), so a checkpoint can be
loaded with ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import ctypes
import enum
import random
import struct
import sys
from types import MethodType
from typing import Any, cast

import numpy as np
import torch

from engine.state import PartialState


class RNGType(str, enum.Enum):
    """The generators ``rng_types`` / ``synchronize_rng_states`` can name (those Ember's backends use)."""

    TORCH = "torch"
    CUDA = "cuda"
    GENERATOR = "generator"


def set_seed(seed: int, device_specific: bool = False, deterministic: bool = False) -> None:
    """Seed python, numpy, torch (and CUDA); ``device_specific`` adds the process index to the seed."""
    if device_specific:
        seed += PartialState().process_index
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)
    if deterministic:
        torch.use_deterministic_algorithms(True)


def synchronize_rng_state(rng_type: str, generator: torch.Generator | None = None) -> None:
    """Give every rank rank 0's state of one generator (``"torch"``, ``"cuda"`` or ``"generator"``)."""
    state = PartialState()
    if not state.use_distributed:
        return
    if rng_type == "torch":
        rng_state = torch.get_rng_state()
    elif rng_type == "cuda":
        rng_state = torch.cuda.get_rng_state()
    elif rng_type == "generator":
        if generator is None:
            return
        rng_state = generator.get_state()
    else:
        raise ValueError(f"Unknown rng_type {rng_type!r}: use 'torch', 'cuda' or 'generator'.")
    from engine.operations import broadcast

    rng_state = rng_state.to(state.device)
    broadcast(rng_state, from_process=0)
    rng_state = rng_state.cpu()
    if rng_type == "torch":
        torch.set_rng_state(rng_state)
    elif rng_type == "cuda":
        torch.cuda.set_rng_state(rng_state)
    else:
        assert generator is not None
        generator.set_state(rng_state)


def synchronize_rng_states(rng_types: list[str], generator: torch.Generator | None = None) -> None:
    for rng_type in rng_types:
        synchronize_rng_state(str(getattr(rng_type, "value", rng_type)), generator)


RawRNGState = tuple[torch.Tensor, Any, Any, "list[torch.Tensor] | None"]


def snapshot_rng(cuda: bool = False) -> RawRNGState:
    """This process's torch, python and numpy (and, with ``cuda``, CUDA) RNG states as the libraries give them.

    The cheap half of ``capture_rng_state`` (about 30 us, most of it numpy's): for a state that is taken often
    and rarely saved. ``restore_snapshot`` puts it back; ``saved_rng_state`` makes it checkpoint data.
    """
    return (torch.get_rng_state(), random.getstate(), np.random.get_state(),
            torch.cuda.get_rng_state_all() if cuda else None)


def cuda_rng_in_use() -> bool:
    """Whether CUDA generators exist in this process (their state is then part of the RNG state)."""
    return torch.cuda.is_available() and torch.cuda.is_initialized()


class RNGSnapshots:
    """``snapshot_rng()`` for a caller that takes it often (before every batch) and rarely keeps it.

    Python's ``random.getstate`` builds 625 ints each time (~7-12 us) and numpy's ``get_state`` copies its key
    word by word (~20 us). Each is read again only when its generator moved since it was last read, which is
    checked by comparing the raw Mersenne Twister words (2.5 kB, ~0.5 us): numpy publishes their address
    (``BitGenerator.ctypes.state_address``); CPython's ``random`` keeps them right after the object header. Both
    generators also cache one gaussian outside those words (``gauss_next``, numpy's ``has_gauss``), which a draw
    can consume without moving them: Python's is read again when its ``gauss_next`` changed, numpy's every time
    while one is cached (its cache cannot be read without ``get_state``). Each fast path is
    used only if the words it reads are, when created, exactly what ``getstate`` / ``get_state`` return (on
    CPython only, where ``id`` is the object's address); otherwise that state is read in full every time.
    Torch's state costs ~0.6 us.
    """

    _MT_BYTES = 4 + 624 * 4  # Python: the position, then the key words; numpy: the key words, then the position

    def __init__(self, cuda: bool = False) -> None:
        self.cuda = cuda
        self._python: Any = random.getstate()
        self._python_view: Any = None  # a ctypes char array over the words (its .raw: one C-level copy, ~0.3 us)
        self._python_words = b""
        # The object the module-level functions draw from (they are its bound methods; typeshed types them as plain
        # functions).
        self._python_owner: Any = cast(MethodType, random.getstate).__self__
        if sys.implementation.name == "cpython" and type(self._python_owner).__basicsize__ >= \
                object.__basicsize__ + self._MT_BYTES:
            at = id(self._python_owner) + object.__basicsize__
            words = ctypes.string_at(at, self._MT_BYTES)
            _, key, _ = self._python
            if int.from_bytes(words[:4], "little", signed=True) == key[-1] and \
                    words[4:] == struct.pack("<624I", *key[:-1]):
                self._python_view, self._python_words = (ctypes.c_char * self._MT_BYTES).from_address(at), words
        self._numpy: Any = np.random.get_state(legacy=True)  # legacy=True is the default: a tuple for an MT19937
        self._numpy_view: Any = None
        self._numpy_words = b""
        address = getattr(getattr(np.random.mtrand._rand._bit_generator, "ctypes", None), "state_address", None)
        if isinstance(self._numpy, tuple) and self._numpy[0] == "MT19937" and isinstance(address, int):
            words = ctypes.string_at(address, self._MT_BYTES)
            if words[:-4] == self._numpy[1].astype("<u4").tobytes() and \
                    int.from_bytes(words[-4:], "little") == self._numpy[2]:
                self._numpy_view, self._numpy_words = (ctypes.c_char * self._MT_BYTES).from_address(address), words

    def __call__(self) -> RawRNGState:
        return (torch.default_generator.get_state(), self._python_state(), self._numpy_state(),
                torch.cuda.get_rng_state_all() if self.cuda else None)

    def _python_state(self) -> Any:
        if self._python_view is None:
            return random.getstate()
        words = self._python_view.raw
        # A cached gaussian is consumed without moving the words: then gauss_next is no longer the one read.
        if words != self._python_words or self._python_owner.gauss_next is not self._python[2]:
            self._python, self._python_words = random.getstate(), words
        return self._python

    def _numpy_state(self) -> Any:
        if self._numpy_view is None:
            return np.random.get_state()
        words = self._numpy_view.raw
        if words != self._numpy_words or self._numpy[3]:
            self._numpy, self._numpy_words = np.random.get_state(), words
        return self._numpy


def restore_snapshot(raw: RawRNGState) -> None:
    """Inverse of ``snapshot_rng``."""
    torch.set_rng_state(raw[0])
    random.setstate(raw[1])
    np.random.set_state(raw[2])
    if raw[3] is not None:
        torch.cuda.set_rng_state_all(raw[3])


def saved_rng_state(raw: RawRNGState) -> dict[str, Any]:
    """``snapshot_rng``'s states as tensors and lists (``weights_only``-safe), as ``capture_rng_state`` gives."""
    torch_state, (py_version, py_state, py_gauss), np_state, cuda = raw
    np_kind, np_keys, np_pos, np_has_gauss, np_gauss = np_state
    out: dict[str, Any] = {
        "python": {"version": py_version, "state": torch.tensor(py_state, dtype=torch.int64), "gauss": py_gauss},
        "numpy": {"kind": np_kind, "keys": torch.from_numpy(np_keys.astype(np.int64)), "pos": int(np_pos),
                  "has_gauss": int(np_has_gauss), "gauss": float(np_gauss)},
        "torch": torch_state,
    }
    if cuda is not None:
        out["cuda"] = cuda
    return out


def capture_rng_state() -> dict[str, Any]:
    """This process's python, numpy, torch and CUDA RNG states as tensors and lists (``weights_only``-safe)."""
    return saved_rng_state(snapshot_rng(cuda=cuda_rng_in_use()))


def restore_rng_state(saved: dict[str, Any]) -> None:
    """Inverse of ``capture_rng_state``."""
    py = saved["python"]
    random.setstate((py["version"], tuple(int(x) for x in py["state"].tolist()), py["gauss"]))
    npy = saved["numpy"]
    np.random.set_state((npy["kind"], npy["keys"].numpy().astype(np.uint32), npy["pos"], npy["has_gauss"],
                         npy["gauss"]))
    torch.set_rng_state(saved["torch"])
    if "cuda" in saved and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(saved["cuda"])
