"""Loading a checkpoint never runs code stored in it unless the caller opts in (DESIGN.md promise 3)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch

from engine.checkpoint.checksum import hash_file
from engine.checkpoint.folders import MANIFEST_NAME
from engine.checkpoint.io import UnsafeCheckpointError
from tests.engine.test_checkpoint import Run


class Payload:
    """Unpickling this creates ``marker``: stands for any code an attacker could make a pickle run."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (self.marker, "w"))


def plant(folder: Path, name: str, marker: Path) -> None:
    """Replace ``name`` by a malicious pickle and fix up the manifest, as someone controlling the folder could."""
    torch.save({"state": Payload(str(marker)), "step": 0}, folder / name)
    manifest = json.loads((folder / MANIFEST_NAME).read_text())
    algorithm = next(key for key in manifest["files"][name] if key != "size")
    manifest["files"][name] = hash_file(str(folder / name), algorithm).to_json()
    (folder / MANIFEST_NAME).write_text(json.dumps(manifest))


@pytest.mark.parametrize("name", ["optimizer.bin", "scheduler.bin", "scaler.pt", "random_states_0.pkl",
                                  "custom_checkpoint_0.pkl", "custom_checkpoint_1.pkl", "dataloader_0_0.bin",
                                  "pytorch_model.bin"])
def test_a_planted_pickle_is_refused_and_never_run(tmp_path: Path, name: str) -> None:
    run = Run()
    run.train(stop_at=3)
    folder = Path(run.acc.save_state(str(tmp_path / "ckpt"), safe_serialization=name != "pytorch_model.bin"))
    before = [p.detach().clone() for p in run.model.parameters()]
    marker = tmp_path / "pwned"
    plant(folder, name, marker)

    with pytest.raises(UnsafeCheckpointError, match=rf"{folder / name}.*allow_unsafe_pickle=True"):
        run.acc.load_state(str(folder))
    assert not marker.exists()
    assert all(torch.equal(a, b) for a, b in zip(before, run.model.parameters()))  # refused before applying


def test_a_pickle_planted_in_the_model_file_is_not_run_either(tmp_path: Path) -> None:
    run = Run()
    folder = Path(run.acc.save_state(str(tmp_path / "ckpt")))
    marker = tmp_path / "pwned"
    plant(folder, "model.safetensors", marker)
    with pytest.raises(Exception, match="(?i)header|safetensor|deserializ"):
        run.acc.load_state(str(folder))
    assert not marker.exists()


class Word:
    def __init__(self, text: str) -> None:
        self.text = text


class Vocabulary:
    """A registered object whose state holds arbitrary Python objects: saving works, loading needs opt-in."""

    def __init__(self) -> None:
        self.words: set[str] = set()

    def state_dict(self) -> dict[str, Any]:
        return {"words": [Word(text) for text in sorted(self.words)]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.words = {word.text for word in state["words"]}


def test_objects_needing_full_unpickling_load_only_with_allow_unsafe_pickle(tmp_path: Path) -> None:
    run = Run()
    vocab = Vocabulary()
    vocab.words = {"ember", "torch"}
    run.acc.register_for_checkpointing(vocab)
    folder = run.acc.save_state(str(tmp_path / "ckpt"))

    fresh = Run()
    restored = Vocabulary()
    fresh.acc.register_for_checkpointing(restored)
    with pytest.raises(UnsafeCheckpointError, match=r"custom_checkpoint_2\.pkl.*allow_unsafe_pickle=True"):
        fresh.acc.load_state(folder)
    assert restored.words == set()
    fresh.acc.load_state(folder, allow_unsafe_pickle=True)
    assert restored.words == {"ember", "torch"}

    # The opt-in really is what stands between a planted payload and its execution.
    marker = tmp_path / "pwned"
    plant(Path(folder), "scaler.pt", marker)
    with pytest.raises(Exception):  # noqa: B017 - the payload's return value is not a scaler state
        fresh.acc.load_state(folder, allow_unsafe_pickle=True)
    assert os.path.exists(marker)
