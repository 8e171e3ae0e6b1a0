"""``Accelerator.save_model``: a model's weights as one file or as shards with an index, Hugging Face style.

Names: ``model.safetensors`` (``pytorch_model.bin``) when the weights fit in one shard; otherwise
``model-00001-of-00003.safetensors`` ... plus ``model.safetensors.index.json`` (``pytorch_model-...bin`` and
``pytorch_model.bin.index.json``) mapping every weight to its file. Tied weights are stored once.
"""

from __future__ import annotations

import functools
import json
import os
import re
from collections.abc import Mapping

import torch

from engine.checkpoint.io import atomic_write, dedupe_shared, save_bytes, save_safetensors, save_torch


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def plan_shards(state_dict: Mapping[str, torch.Tensor], max_bytes: int) -> list[list[str]]:
    """Split names, in order, into shards of at most ``max_bytes`` (a bigger tensor gets a shard of its own)."""
    shards: list[list[str]] = [[]]
    size = 0
    for name, tensor in state_dict.items():
        nbytes = _nbytes(tensor) if isinstance(tensor, torch.Tensor) else 0
        if shards[-1] and size + nbytes > max_bytes:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += nbytes
    return shards


def shard_file_names(count: int, safe_serialization: bool) -> tuple[list[str], str]:
    """The shard file names and the index file name."""
    stem, extension = ("model", ".safetensors") if safe_serialization else ("pytorch_model", ".bin")
    if count == 1:
        return [f"{stem}{extension}"], f"{stem}{extension}.index.json"
    return [f"{stem}-{i:05d}-of-{count:05d}{extension}" for i in range(1, count + 1)], f"{stem}{extension}.index.json"


def _remove_stale(directory: str, keep: set[str], safe_serialization: bool) -> None:
    """Delete weight files of an earlier save_model that the new one does not overwrite (mixing is wrong)."""
    stem, extension = ("model", ".safetensors") if safe_serialization else ("pytorch_model", ".bin")
    pattern = re.compile(rf"^{stem}(-\d{{5}}-of-\d{{5}})?{re.escape(extension)}(\.index\.json)?$")
    for name in os.listdir(directory):
        if pattern.match(name) and name not in keep:
            os.unlink(os.path.join(directory, name))


def write_model(state_dict: Mapping[str, torch.Tensor], directory: str, max_bytes: int,
                safe_serialization: bool) -> list[str]:
    """Write ``state_dict`` into ``directory`` (created if needed); returns the files written."""
    os.makedirs(directory, exist_ok=True)
    tensors, aliases = dedupe_shared(state_dict) if safe_serialization else (dict(state_dict), {})
    shards = plan_shards(tensors, max_bytes)
    names, index_name = shard_file_names(len(shards), safe_serialization)
    written = []
    for shard, name in zip(shards, names):
        part = {key: tensors[key] for key in shard}
        # Each tied name travels with the tensor it aliases, so the shard restores it on load.
        part.update({alias: tensors[target] for alias, target in aliases.items() if target in part})
        if safe_serialization:
            atomic_write(os.path.join(directory, name), functools.partial(save_safetensors, part))
        else:
            atomic_write(os.path.join(directory, name), functools.partial(save_torch, part))
        written.append(name)
    keep = set(names)
    if len(shards) > 1:
        index = {"metadata": {"total_size": sum(_nbytes(t) for t in tensors.values())},
                 "weight_map": {key: name for shard, name in zip(shards, names) for key in shard}}
        atomic_write(os.path.join(directory, index_name),
                     lambda path: save_bytes(json.dumps(index, indent=2, sort_keys=True).encode(), path))
        written.append(index_name)
        keep.add(index_name)
    _remove_stale(directory, keep, safe_serialization)
    return written
