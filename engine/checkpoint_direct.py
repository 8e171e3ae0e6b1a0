"""Loading a model's safetensors file straight into its parameters and buffers, with no intermediate tensor.

``model.load_state_dict(safetensors.load_file(path))`` copies every tensor out of a memory map of the file,
page fault by page fault: on a 200 MB model that is ~5x slower than the kernel copying the bytes into place
with one ``preadv`` per tensor, which is what ``read_into_module`` does. It is a fast path for the common case
only: it declines (returns False, having changed nothing) whenever ``load_state_dict`` could do something other
than copy the bytes in, so the caller then takes the ordinary path, which also produces torch's own errors:

* a module overrides ``_load_from_state_dict`` / ``load_state_dict`` or has load-state-dict hooks;
* the file's names differ from the model's state-dict names (missing, unexpected, or ``strict=False``);
* a target is not a contiguous CPU tensor of the file's dtype and shape.
"""

from __future__ import annotations

import json
import os
import struct
from typing import Any

import torch

from engine.checkpoint_io import _SAFETENSORS_DTYPES, ALIASES_KEY

_DTYPES = {code: dtype for dtype, code in _SAFETENSORS_DTYPES.items()}
_DEFAULT_LOAD = torch.nn.Module._load_from_state_dict
_DEFAULT_LOAD_STATE_DICT = torch.nn.Module.load_state_dict


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


def read_into_module(model: torch.nn.Module, path: str, strict: bool = True) -> bool:
    """Read the safetensors file ``path`` directly into ``model``'s tensors; False (nothing changed) if declined.

    >>> import tempfile
    >>> from engine.checkpoint_io import save_safetensors
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
            for target, offset, size in plan:
                if size:
                    _read_exactly(fd, memoryview(target.view(-1).view(torch.uint8).numpy()), offset, path)
    return True


def _read_exactly(fd: int, view: memoryview, offset: int, path: str) -> None:
    while view.nbytes:
        got = os.preadv(fd, [view], offset)
        if got == 0:
            raise OSError(f"{path} ended early while reading it (truncated after it was verified?).")
        view, offset = view[got:], offset + got
