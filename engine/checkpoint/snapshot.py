"""Snapshots of checkpoint state into reused host buffers, for saves that finish in the background.

An asynchronous ``save_state`` must write the state as it was when it was called, while training goes on
changing the live tensors. ``SnapshotBuffers.copy`` walks the state (nested dicts, lists and tuples, as
``state_dict()`` returns them) and copies every tensor into a host buffer kept from the previous save when the
place in the state, shape and dtype are the same, so steady-state saves allocate nothing. Host-to-host copies are
queued by the walk and done at ``end()``, split between the caller's thread and one helper thread: a snapshot is
bound by memory bandwidth, and one core's memcpy leaves half of it unused (192 MB: 22-24 ms on one thread, 15-17
ms on two, on the 2-core benchmark machine). Buffers for tensors
on an accelerator are pinned host memory and filled with non-blocking copies queued on the current stream:
training kernels queued after them run after them, so the copy sees the state at the call;
``SnapshotBuffers.ready()`` waits for the copies before anything reads the buffers.

Values that are not tensors are deep-copied (a scheduler's ``last_epoch``, an optimizer's ``param_groups``).
Tensors that are the same view of the same memory (tied weights) stay one buffer, so the writer still sees
them as tied.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Hashable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import torch

Path = tuple[Hashable, ...]
_PIECE_BYTES = 8 << 20  # copies are cut into pieces of at most this, dealt alternately to the two threads
_PARALLEL_MIN = 16 << 20  # below this, a helper thread's hand-off costs more than it saves


def _bytes(tensor: torch.Tensor) -> np.ndarray:
    """A contiguous CPU tensor's memory as a flat uint8 array (no copy; any dtype, numpy's or not)."""
    return tensor.reshape(-1).view(torch.uint8).numpy()


def _alias_key(tensor: torch.Tensor) -> tuple[Any, ...]:
    return (tensor.device, tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tensor.dtype,
            tuple(tensor.shape), tuple(tensor.stride()))


class SnapshotBuffers:
    """Host copies of checkpoint state, in buffers reused from one save to the next.

    >>> buffers = SnapshotBuffers()
    >>> live = {"w": torch.ones(2)}
    >>> buffers.begin()
    >>> snap = buffers.copy(live, ("model",))
    >>> buffers.end()
    >>> live["w"].add_(1)  # training goes on
    tensor([2., 2.])
    >>> buffers.ready()
    >>> snap["w"]
    tensor([1., 1.])
    >>> buffers.nbytes
    8
    """

    def __init__(self) -> None:
        self._buffers: dict[Path, torch.Tensor] = {}
        self._used: set[Path] = set()
        self._aliases: dict[tuple[Any, ...], torch.Tensor] = {}
        self._queued_on_device = False  # non-blocking copies queued since begin()
        self._event: Any = None  # a CUDA event recorded after the last of them
        self._host_copies: list[tuple[np.ndarray, np.ndarray]] = []  # (buffer, source) bytes, done at end()
        self._helper: ThreadPoolExecutor | None = None
        self._helper_pid = 0

    @property
    def nbytes(self) -> int:
        """Host memory held by the buffers, in bytes."""
        return sum(b.untyped_storage().nbytes() for b in self._buffers.values())

    def begin(self) -> None:
        """Start a new snapshot (every ``copy`` of one save comes between ``begin`` and ``end``)."""
        self._used.clear()
        self._aliases.clear()
        self._host_copies.clear()
        self._queued_on_device = False

    def end(self) -> None:
        """Do the queued host copies; release the buffers this snapshot did not use (the state changed shape)."""
        try:
            self._copy_host()
        finally:
            self._host_copies.clear()
        for path in set(self._buffers) - self._used:
            del self._buffers[path]
        self._aliases.clear()
        if self._queued_on_device:
            if self._event is None:
                self._event = torch.cuda.Event()
            self._event.record()  # on the current stream: after every copy this snapshot queued
        else:
            self._event = None

    def copy(self, value: Any, path: Path) -> Any:
        """A copy of ``value`` whose tensors live in this object's buffers; ``path`` names its place in the state."""
        if isinstance(value, torch.Tensor):
            return self._tensor(value, path)
        if isinstance(value, dict):
            items = {k: self.copy(v, (*path, k)) for k, v in value.items()}
            return self._same_kind(value, items)
        if isinstance(value, list):
            return [self.copy(v, (*path, i)) for i, v in enumerate(value)]
        if isinstance(value, tuple) and not hasattr(value, "_fields"):
            return tuple(self.copy(v, (*path, i)) for i, v in enumerate(value))
        return copy.deepcopy(value)

    @staticmethod
    def _same_kind(original: dict[Any, Any], items: dict[Any, Any]) -> dict[Any, Any]:
        """A dict of ``original``'s class with its attributes (``state_dict()``'s ``_metadata``) kept."""
        try:
            out = type(original)()
        except TypeError:  # a dict subclass that needs arguments: a plain dict holds the same items
            return items
        out.update(items)
        for name, attr in getattr(original, "__dict__", {}).items():
            setattr(out, name, copy.deepcopy(attr))
        return out

    def _tensor(self, tensor: torch.Tensor, path: Path) -> torch.Tensor:
        tensor = tensor.detach()
        if type(tensor) is not torch.Tensor or tensor.layout != torch.strided or tensor.is_meta:
            # Tensor subclasses (DTensor, ...) and sparse layouts: a plain copy, not worth a buffer of their own.
            return tensor.to("cpu", copy=True)
        key = _alias_key(tensor)
        tied = self._aliases.get(key)
        if tied is not None:
            return tied
        buffer = self._buffers.get(path)
        on_device = tensor.device.type != "cpu"
        if buffer is None or buffer.shape != tensor.shape or buffer.dtype != tensor.dtype:
            pin = on_device and torch.cuda.is_available()
            buffer = torch.empty(tensor.shape, dtype=tensor.dtype, device="cpu", pin_memory=pin)
            self._buffers[path] = buffer
        self._used.add(path)
        if tensor.device.type == "cpu" and tensor.is_contiguous() and not (tensor.is_conj() or tensor.is_neg()):
            # Plain memcpys (at end()): measured 2-3x faster than copy_ on a busy 2-core host (no OpenMP hand-off).
            self._host_copies.append((_bytes(buffer), _bytes(tensor)))
        else:
            non_blocking = tensor.device.type == "cuda" and buffer.is_pinned()
            buffer.copy_(tensor, non_blocking=non_blocking)
            self._queued_on_device |= non_blocking
        self._aliases[key] = buffer
        return buffer

    def _copy_host(self) -> None:
        pieces = [(dst[start:start + _PIECE_BYTES], src[start:start + _PIECE_BYTES])
                  for dst, src in self._host_copies for start in range(0, max(dst.size, 1), _PIECE_BYTES)]
        total = sum(dst.size for dst, _ in self._host_copies)
        if total < _PARALLEL_MIN or (os.cpu_count() or 1) < 2:
            for dst, src in pieces:
                np.copyto(dst, src)
            return
        if self._helper is None or self._helper_pid != os.getpid():  # a forked child has no helper thread
            self._helper = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ember-snapshot")
            self._helper_pid = os.getpid()
        helped = self._helper.submit(_copy_all, pieces[1::2])  # np.copyto releases the GIL
        try:
            _copy_all(pieces[0::2])
        finally:
            helped.result()

    def ready(self) -> None:
        """Wait until every copy queued by this snapshot has landed in the buffers."""
        if self._event is not None:
            self._event.synchronize()


def _copy_all(pieces: list[tuple[np.ndarray, np.ndarray]]) -> None:
    for dst, src in pieces:
        np.copyto(dst, src)
