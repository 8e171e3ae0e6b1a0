"""Checkpoint file I/O: durable writes that checksum as they go, safetensors without copies, safe loading.

Every checkpoint file is written once, through ``DurableWriter``: bytes go straight from tensor memory to the
file descriptor (no Python-side copy), their checksum (``engine.checkpoint.checksum``) is computed on a worker thread
while the write runs (hashing and ``os.write`` both release the GIL), and the file is fsynced on close. So the
manifest's checksums cost no extra pass over the data, and most of the fsync overlaps with writing.

Loading never unpickles arbitrary objects unless asked: tensors come from safetensors or
``torch.load(weights_only=True)``; a file that needs full unpickling raises ``UnsafeCheckpointError`` naming the
file and the opt-in argument.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import re
import secrets
import struct
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Executor, Future
from typing import TYPE_CHECKING, Any

import torch

from engine.checkpoint.checksum import CHUNK_BYTES, FileRecord, default_algorithm, new_hasher

if TYPE_CHECKING:
    from typing_extensions import Self

_SMALL_WRITE = 64 << 10  # torch.save emits many tiny zip headers; batch them into one syscall
_PARALLEL_MIN = 1 << 20  # below this, hashing inline is cheaper than a thread hand-off
_FLUSH_BYTES = 64 << 20  # start writing back to disk every this many bytes, so close()'s fsync waits for little
_fdatasync = getattr(os, "fdatasync", os.fsync)
ALIASES_KEY = "ember_aliases"  # safetensors metadata: names dropped because they alias another tensor

_SAFETENSORS_DTYPES: dict[torch.dtype, str] = {
    torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
    torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
    torch.bool: "BOOL", torch.float8_e4m3fn: "F8_E4M3", torch.float8_e5m2: "F8_E5M2",
    torch.uint16: "U16", torch.uint32: "U32", torch.uint64: "U64",
}


class CheckpointError(RuntimeError):
    """A checkpoint could not be saved or loaded."""


class CorruptCheckpointError(CheckpointError):
    """A checkpoint file is missing, truncated or does not match its recorded checksum."""


def mismatch(folder: str, path: str, actual: FileRecord, expected: FileRecord) -> CorruptCheckpointError:
    """The error for a file of checkpoint ``folder`` whose size or checksum differs from its manifest record."""
    return CorruptCheckpointError(
        f"Checkpoint {folder} is corrupted: {path} has {actual.size} bytes with {actual.algorithm} {actual.digest}, "
        f"its manifest says {expected.size} bytes with {expected.digest}.")


class UnsafeCheckpointError(CheckpointError):
    """A checkpoint file can only be loaded by full unpickling, which the caller did not allow."""


def _write_all(fd: int, view: memoryview) -> None:
    while view.nbytes:
        written = os.write(fd, view)
        view = view[written:]


def _byte_view(data: Any) -> memoryview:
    view = memoryview(data)
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


class DurableWriter:
    """A new file, written unbuffered, checksummed while written and fsynced on ``close()``.

    Args:
        path: the file to create (truncated if it exists).
        pool: an executor with two threads: one hashes each large chunk while the main thread writes it, the
            other starts writing back what is already written (``fdatasync``) while the next chunks are written.
            None does both inline, at close.
        algorithm: the checksum (``engine.checkpoint.checksum.ALGORITHMS``); by default xxh3_64x16m if xxhash is
            installed, else crc32.
    """

    def __init__(self, path: str, pool: Executor | None = None, algorithm: str | None = None) -> None:
        self.path = path
        self._pool = pool
        self._algorithm = algorithm or default_algorithm()
        self._hasher = new_hasher(self._algorithm)
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0), 0o644)
        self._small = bytearray()
        self._size = 0
        self._unflushed = 0
        self._flushing: Future[None] | None = None
        self.record: FileRecord | None = None

    def write(self, data: Any) -> int:
        view = _byte_view(data)
        size = view.nbytes
        if size < _SMALL_WRITE:
            self._small += view
            if len(self._small) >= _SMALL_WRITE:
                self._flush_small()
            return size
        self._flush_small()
        for start in range(0, size, CHUNK_BYTES):
            self._write_chunk(view[start:start + CHUNK_BYTES])
        return size

    def _flush_small(self) -> None:
        if self._small:
            chunk = memoryview(self._small)
            self._write_chunk(chunk)
            chunk.release()
            self._small = bytearray()

    def _write_chunk(self, chunk: memoryview) -> None:
        if self._pool is not None and chunk.nbytes >= _PARALLEL_MIN:
            pending = self._pool.submit(self._hasher.update, chunk)
            try:
                _write_all(self._fd, chunk)
            finally:
                pending.result()  # wait, even on error: the caller may free the buffer once write() returns
        else:
            _write_all(self._fd, chunk)
            self._hasher.update(chunk)
        self._size += chunk.nbytes
        self._unflushed += chunk.nbytes
        if self._pool is not None and self._unflushed >= _FLUSH_BYTES and (
                self._flushing is None or self._flushing.done()):
            self._flushing = self._pool.submit(_fdatasync, self._fd)
            self._unflushed = 0

    def flush(self) -> None:
        """Accepted for file-object compatibility; durability comes from ``close()``."""

    def close(self) -> FileRecord:
        """Write what is buffered, fsync, close; returns the file's size and checksum."""
        if self.record is None:
            try:
                self._flush_small()
                self._wait_flushing()
                os.fsync(self._fd)
            except BaseException:
                self.abort()
                raise
            os.close(self._fd)
            self.record = FileRecord(self._size, self._algorithm, self._hasher.hexdigest())
        return self.record

    def _wait_flushing(self) -> None:
        # Never close the descriptor under a running fdatasync: the number could be reused by another file.
        if self._flushing is not None:
            flushing, self._flushing = self._flushing, None
            flushing.result()

    def abort(self) -> None:
        """Close without the final fsync (the caller is discarding the file)."""
        if self.record is None:
            try:
                self._wait_flushing()
            except OSError:
                pass
            finally:
                os.close(self._fd)
            self.record = FileRecord(-1, self._algorithm, "")

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


# -- writing ------------------------------------------------------------------------------------------------
@contextlib.contextmanager
def _without_zip_crc32() -> Iterator[None]:
    """Skip torch.save's own CRC-32 of every zip record: the manifest's checksum already covers the whole file,
    ``torch.load`` never checks it, and miniz's byte-at-a-time CRC costs about as much as writing the bytes."""
    get = getattr(torch.serialization, "get_crc32_options", None)
    set_ = getattr(torch.serialization, "set_crc32_options", None)
    if get is None or set_ is None:
        yield
        return
    previous = get()
    set_(False)
    try:
        yield
    finally:
        set_(previous)


def save_torch(obj: Any, path: str, pool: Executor | None = None) -> FileRecord:
    """``torch.save(obj)`` into a new durable file."""
    with DurableWriter(path, pool) as writer, _without_zip_crc32():
        torch.save(obj, writer)  # type: ignore[arg-type]  # it takes any writable object; its stub says IO[bytes]
    return writer.close()


def save_bytes(data: bytes, path: str) -> FileRecord:
    """Write ``data`` into a new durable file."""
    with DurableWriter(path) as writer:
        writer.write(data)
    return writer.close()


def dedupe_shared(tensors: Mapping[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Drop names that are the very same view of a tensor kept under another name (tied weights).

    Returns the tensors to write and ``{dropped_name: kept_name}``. Tensors that merely overlap in memory are
    kept: each is written as its own bytes.
    """
    kept: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = {}
    seen: dict[tuple[Any, ...], str] = {}
    for name, tensor in tensors.items():
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"safetensors can only store tensors, but {name!r} is a {type(tensor).__name__}: save "
                            "it with safe_serialization=False.")
        if tensor.numel() == 0:
            kept[name] = tensor
            continue
        key = (tensor.device, tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tensor.dtype,
               tuple(tensor.shape), tuple(tensor.stride()))
        if key in seen:
            aliases[name] = seen[key]
        else:
            seen[key] = name
            kept[name] = tensor
    return kept, aliases


def _raw_bytes(tensor: torch.Tensor) -> memoryview:
    flat = tensor.detach().to("cpu").contiguous().reshape(-1)
    if flat.numel() == 0:
        return memoryview(b"")
    return byte_view(flat)


def byte_view(tensor: torch.Tensor) -> memoryview:
    """A contiguous CPU ``tensor``'s bytes, reinterpreted without a copy (numpy keeps the tensor alive)."""
    array = tensor.view(-1).view(torch.uint8).numpy()
    return memoryview(array)  # type: ignore[arg-type]  # numpy's stubs give ndarray __buffer__ on Python >= 3.12 only


def save_safetensors(tensors: Mapping[str, torch.Tensor], path: str, pool: Executor | None = None,
                     metadata: Mapping[str, str] | None = None) -> FileRecord:
    """Write ``tensors`` in the safetensors format, straight from tensor memory into a new durable file.

    Tied tensors are stored once; the dropped names are recorded in the metadata and restored by
    ``load_safetensors``.
    """
    kept, aliases = dedupe_shared(tensors)
    meta = {"format": "pt", **(metadata or {})}
    if aliases:
        meta[ALIASES_KEY] = json.dumps(aliases, sort_keys=True)
    header: dict[str, Any] = {"__metadata__": meta}
    # Widest dtypes first, so every tensor's data starts aligned to its element size.
    order = sorted(kept, key=lambda n: (-kept[n].element_size(), n))
    offset = 0
    for name in order:
        tensor = kept[name]
        code = _SAFETENSORS_DTYPES.get(tensor.dtype)
        if code is None:
            raise TypeError(f"safetensors cannot store {name!r} of dtype {tensor.dtype}: save with "
                            "safe_serialization=False.")
        nbytes = tensor.numel() * tensor.element_size()
        header[name] = {"dtype": code, "shape": list(tensor.shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)
    with DurableWriter(path, pool) as writer:
        writer.write(struct.pack("<Q", len(encoded)) + encoded)
        for name in order:
            writer.write(_raw_bytes(kept[name]))
    return writer.close()


def fsync_dir(path: str) -> None:
    """Make a directory's entries (created, renamed, removed files) durable."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: str | os.PathLike[str], write: Callable[[str], FileRecord]) -> FileRecord:
    """Call ``write(temp_path)`` for a temporary sibling, then rename it over ``path`` in one step."""
    path = os.path.abspath(os.fspath(path))
    parent, name = os.path.split(path)
    os.makedirs(parent, exist_ok=True)
    temp = os.path.join(parent, f".{name}.tmp-{secrets.token_hex(6)}")
    try:
        record = write(temp)
        os.replace(temp, path)
    except BaseException:
        if os.path.exists(temp):
            os.unlink(temp)
        raise
    fsync_dir(parent)
    return record


# -- reading ------------------------------------------------------------------------------------------------
def load_torch(path: str, *, allow_unsafe_pickle: bool = False, map_location: Any = "cpu") -> Any:
    """``torch.load`` with ``weights_only=True``; full unpickling only with ``allow_unsafe_pickle``."""
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as err:
        if not allow_unsafe_pickle:
            reason = str(err).strip().splitlines()
            detail = next((line for line in reversed(reason) if "GLOBAL" in line or "Unsupported" in line), "")
            detail = detail.split(". Please use")[0]  # torch's allow-listing advice: not what this caller needs
            raise UnsafeCheckpointError(
                f"{path} holds Python objects that only a full unpickle can rebuild, and unpickling can run code "
                f"stored in the file{f' ({detail.strip()})' if detail else ''}. If you trust this checkpoint, "
                "pass load_state(..., allow_unsafe_pickle=True).") from None
    return torch.load(path, map_location=map_location, weights_only=False)


def load_safetensors(path: str) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file (memory-mapped, on CPU), with tied names restored."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    tensors = load_file(path, device="cpu")
    with safe_open(path, framework="pt") as handle:
        metadata = handle.metadata() or {}
    for alias, target in json.loads(metadata.get(ALIASES_KEY, "{}")).items():
        tensors[alias] = tensors[target]
    return tensors


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]i?b|b)?\s*$", re.IGNORECASE)
_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_size(size: int | str) -> int:
    """Bytes in ``size``: an int, or digits and a unit such as ``"5MB"``, ``"10GB"``, ``"512MiB"``.

    >>> parse_size("5MB"), parse_size("1KiB"), parse_size(300)
    (5000000, 1024, 300)
    """
    if isinstance(size, int) and not isinstance(size, bool) and size > 0:
        return size
    match = _SIZE.match(size) if isinstance(size, str) else None
    if match is None or float(match.group(1)) <= 0:
        raise ValueError(f"max_shard_size must be a positive int or digits followed by a unit like '5MB' or "
                         f"'10GB', got {size!r}.")
    return int(float(match.group(1)) * _UNITS[(match.group(2) or "b").lower()])
