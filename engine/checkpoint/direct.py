"""Reading checkpoint files straight into tensor memory: a model's weights into place, a torch file's tensors.

Both read with ``preadv`` (the kernel copies the bytes from the page cache into the tensor) in pieces that a
thread pool reads side by side: loading is bound by memory bandwidth, which one core's copy leaves half unused.

**Model weights** (``read_into_module``).

``model.load_state_dict(safetensors.load_file(path))`` copies every tensor out of a memory map of the file,
page fault by page fault: on a 200 MB model that is ~5x slower than the kernel copying the bytes into place
with one ``preadv`` per tensor, which is what ``read_into_module`` does. It is a fast path for the common case
only: it declines (returns False, having changed nothing) whenever ``load_state_dict`` could do something other
than copy the bytes in, so the caller then takes the ordinary path, which also produces torch's own errors:

* a module overrides ``_load_from_state_dict`` / ``load_state_dict`` or has load-state-dict hooks;
* the file's names differ from the model's state-dict names (missing, unexpected, or ``strict=False``);
* a target is not a contiguous CPU tensor of the file's dtype and shape.

**Torch files** (``read_torch_file``: an optimizer's state, 400 MB for a 200 MB model under AdamW). ``torch.load``
reads each storage with one copy on the calling thread. Here ``torch.load(map_location="meta")`` unpickles the
structure alone (safely: ``weights_only``) and tells where each storage's bytes start in the file; the storages
are then allocated and read in pieces by the pool. It declines (returns None) for anything but plain tensors in
dicts, lists and tuples, so the caller then uses ``torch.load`` itself, which also produces torch's own errors.
"""

from __future__ import annotations

import json
import os
import struct
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, wait
from typing import Any

import torch

from engine.checkpoint.checksum import CHUNK_BYTES, CHUNKED, FileRecord, chunk_hasher, combine_chunks
from engine.checkpoint.io import _SAFETENSORS_DTYPES, ALIASES_KEY, byte_view, mismatch

_DTYPES = {code: dtype for dtype, code in _SAFETENSORS_DTYPES.items()}
_DEFAULT_LOAD = torch.nn.Module._load_from_state_dict
_DEFAULT_LOAD_STATE_DICT = torch.nn.Module.load_state_dict
_PIECE_BYTES = 8 << 20  # pieces read by the pool: small enough to balance two threads, large enough to amortise
_HASH_PIECE = 512 << 10  # read then hashed while still in the core's cache (L2: 0.5-2 MB)
_PLAIN = (int, float, str, bool, bytes, type(None), torch.dtype, torch.device)


def _plain(model: torch.nn.Module) -> bool:
    """Whether ``load_state_dict`` on ``model`` would only copy each tensor into place."""
    for module in model.modules():
        cls = type(module)
        if cls._load_from_state_dict is not _DEFAULT_LOAD or cls.load_state_dict is not _DEFAULT_LOAD_STATE_DICT:
            return False
        if module._load_state_dict_pre_hooks or module._load_state_dict_post_hooks:
            return False
    return True


def _header(fd: int) -> tuple[dict[str, Any], int]:
    (length,) = struct.unpack("<Q", os.pread(fd, 8, 0))
    return json.loads(os.pread(fd, length, 8)), 8 + length


def read_into_module(model: torch.nn.Module, path: str, strict: bool = True, pool: Executor | None = None) -> bool:
    """Read the safetensors file ``path`` directly into ``model``'s tensors; False (nothing changed) if declined.

    >>> import tempfile
    >>> from engine.checkpoint.io import save_safetensors
    >>> path = os.path.join(tempfile.mkdtemp(), "model.safetensors")
    >>> saved = torch.nn.Linear(2, 2)
    >>> _ = save_safetensors(saved.state_dict(), path)
    >>> model = torch.nn.Linear(2, 2)
    >>> read_into_module(model, path), torch.equal(model.weight, saved.weight)
    (True, True)
    """
    if not strict or not _plain(model):
        return False
    targets = model.state_dict()
    with open(path, "rb") as handle:
        fd = handle.fileno()
        header, base = _header(fd)
        aliases = json.loads((header.pop("__metadata__", None) or {}).get(ALIASES_KEY, "{}"))
        if set(header) | set(aliases) != set(targets):
            return False
        plan = []
        for name, entry in header.items():
            target, dtype = targets[name], _DTYPES.get(entry["dtype"])
            if (dtype != target.dtype or list(target.shape) != entry["shape"] or target.device.type != "cpu"
                    or not target.is_contiguous()):
                return False
            start, end = entry["data_offsets"]
            if end - start != target.numel() * target.element_size():
                return False
            plan.append((target, base + start, end - start))
        for alias, kept in aliases.items():
            # Tied names must be tied in the model too: reading the kept one then fills both.
            if targets[alias].untyped_storage().data_ptr() != targets[kept].untyped_storage().data_ptr():
                return False
        with torch.no_grad():
            _read_all(fd, [(byte_view(target), offset) for target, offset, size in plan if size], path, pool)
    return True


def read_torch_file(path: str, pool: Executor | None = None, expected: FileRecord | None = None) -> Any | None:
    """What ``torch.load(path, map_location="cpu", weights_only=True)`` returns, read in parallel; None if declined.

    With ``expected`` (a ``xxh3_64x16m`` record from the manifest) the file is verified in the same pass: each
    16 MiB chunk is one task that reads its bytes (into the tensors, or a scratch buffer between them) in
    cache-sized pieces and hashes each piece right after reading it. ``CorruptCheckpointError`` if it differs;
    the caller must check the file itself when this declines.

    >>> import tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "optimizer.bin")
    >>> saved = {"state": {0: {"step": torch.tensor(3.0), "exp_avg": torch.arange(6.0).view(2, 3)}}, "lr": 0.1}
    >>> torch.save(saved, path)
    >>> loaded = read_torch_file(path) or torch.load(path, weights_only=True)  # None: declined (a torch without meta offsets)
    >>> torch.equal(loaded["state"][0]["exp_avg"], saved["state"][0]["exp_avg"]), loaded["lr"]
    (True, 0.1)
    """
    if sys.byteorder != "little":
        return None
    try:
        skeleton = torch.load(path, map_location="meta", weights_only=True)
    except Exception:  # noqa: BLE001 - torch.load on the ordinary path raises the error worth showing
        return None
    storages: dict[int, torch.Tensor] = {}
    reads: list[tuple[memoryview, int]] = []

    def real(meta: torch.Tensor) -> torch.Tensor | None:
        if (type(meta) is not torch.Tensor or meta.layout != torch.strided or meta.requires_grad
                or meta.is_conj() or meta.is_neg()):
            return None
        storage = meta.untyped_storage()
        offset = getattr(storage, "_checkpoint_offset", None)
        if not isinstance(offset, int):
            return None  # a torch without storage offsets on meta loads (< 2.5), or a legacy-format file
        if offset not in storages:
            storages[offset] = torch.empty(storage.nbytes(), dtype=torch.uint8)
            if storage.nbytes():
                reads.append((byte_view(storages[offset]), offset))
        tensor = torch.empty(0, dtype=meta.dtype)
        return tensor.set_(storages[offset].untyped_storage(), meta.storage_offset(), meta.shape, meta.stride())

    rebuilt = _rebuild(skeleton, real)
    if rebuilt is _DECLINED:
        return None
    with open(path, "rb") as handle:
        fd = handle.fileno()
        if expected is None or expected.algorithm != CHUNKED:
            _read_all(fd, reads, path, pool)
            return rebuilt
        size = os.fstat(fd).st_size
        chunks = _chunk_parts(reads, size)
        if chunks is None:
            return None
        if pool is None:
            digests = [_read_and_hash(fd, parts, path) for parts in chunks]
        else:
            pending = [pool.submit(_read_and_hash, fd, parts, path) for parts in chunks]
            wait(pending)  # every chunk, even after a failure: the descriptor is closed on return
            digests = [done.result() for done in pending]
    actual = FileRecord(size, CHUNKED, combine_chunks(digests))
    if actual != expected:
        raise mismatch(os.path.dirname(path), path, actual, expected)
    return rebuilt


Part = tuple[int, int, "memoryview | None", int]  # file offset, length, destination (None: between tensors), start


def _chunk_parts(reads: list[tuple[memoryview, int]], size: int) -> list[list[Part]] | None:
    """The whole file as checksum chunks of parts; None if the storages overlap or run past the end."""
    cover: list[tuple[int, int, memoryview | None]] = []
    position = 0
    for view, offset in sorted(reads, key=lambda read: read[1]):
        if offset < position or offset + view.nbytes > size:
            return None
        if offset > position:
            cover.append((position, offset - position, None))
        cover.append((offset, view.nbytes, view))
        position = offset + view.nbytes
    if position < size:
        cover.append((position, size - position, None))
    chunks: list[list[Part]] = [[] for _ in range(0, size, CHUNK_BYTES)]
    for offset, length, destination in cover:
        at = offset
        while at < offset + length:
            end = min(offset + length, (at // CHUNK_BYTES + 1) * CHUNK_BYTES)
            chunks[at // CHUNK_BYTES].append((at, end - at, destination, at - offset))
            at = end
    return chunks


def _read_and_hash(fd: int, parts: list[Part], path: str) -> bytes:
    """Read one checksum chunk into place, hashing each cache-sized piece just read; the chunk's digest."""
    hasher = chunk_hasher()
    for offset, length, view, start in parts:
        for done in range(0, length, _HASH_PIECE):
            size = min(_HASH_PIECE, length - done)
            piece = memoryview(bytearray(size)) if view is None else view[start + done:start + done + size]
            _read_exactly(fd, piece, offset + done, path)
            hasher.update(piece)
    return hasher.digest()


_DECLINED = object()


def _rebuild(value: Any, real: Callable[[torch.Tensor], torch.Tensor | None]) -> Any:
    """``value`` with every meta tensor replaced by ``real(tensor)``; ``_DECLINED`` if anything is unusual."""
    if isinstance(value, torch.Tensor):
        tensor = real(value)
        return _DECLINED if tensor is None else tensor
    if isinstance(value, _PLAIN):
        return value
    if type(value) in (list, tuple):
        items = [_rebuild(item, real) for item in value]
        return _DECLINED if any(item is _DECLINED for item in items) else type(value)(items)
    if type(value) is dict:
        pairs = {key: _rebuild(item, real) for key, item in value.items()}
        return _DECLINED if any(item is _DECLINED for item in pairs.values()) else pairs
    return _DECLINED


def _pieces(reads: list[tuple[memoryview, int]]) -> Iterator[tuple[memoryview, int]]:
    for view, offset in reads:
        for start in range(0, view.nbytes, _PIECE_BYTES):
            yield view[start:start + _PIECE_BYTES], offset + start


def _read_all(fd: int, reads: list[tuple[memoryview, int]], path: str, pool: Executor | None) -> None:
    """Fill each view with the file's bytes at its offset; pieces side by side on ``pool`` (preadv drops the GIL)."""
    if pool is None:
        for view, offset in reads:
            _read_exactly(fd, view, offset, path)
        return
    pending = [pool.submit(_read_exactly, fd, view, offset, path) for view, offset in _pieces(reads)]
    wait(pending)  # every piece, even after a failure: the caller closes the descriptor once this returns
    for done in pending:
        done.result()


def _read_exactly(fd: int, view: memoryview, offset: int, path: str) -> None:
    while view.nbytes:
        got = os.preadv(fd, [view], offset)
        if got == 0:
            raise OSError(f"{path} ended early while reading it (truncated after it was verified?).")
        view, offset = view[got:], offset + got
