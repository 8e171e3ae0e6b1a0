"""The data module in checkpoints and profiles as Lightning has it: its state under its class's ``__qualname__`` in
the ``.ckpt`` dict (both ways), its hooks timed as ``[LightningDataModule]{class}.{hook}``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader

from callbacks import ModelCheckpoint
from tests.trainer import lightning_roundtrip as roundtrip
from tests.trainer.helpers import QUIET, Regressor, data
from trainer import DataModule, Trainer
from trainer.profiling import SimpleProfiler


class Data(DataModule):
    def __init__(self, loader: DataLoader | None = None) -> None:
        super().__init__()
        self.loader = loader if loader is not None else data()
        self.loaded: dict[str, Any] | None = None

    def train_dataloader(self) -> DataLoader:
        return self.loader

    def state_dict(self) -> dict[str, Any]:
        return {"seen": 7}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.loaded = state_dict


def test_the_state_is_under_the_class_qualname_and_resumes(tmp_path: Path) -> None:
    callback = ModelCheckpoint(dirpath=tmp_path, filename="last")
    Trainer(**{**QUIET, "enable_checkpointing": True}, max_epochs=1, callbacks=[callback]).fit(Regressor(),
                                                                                              datamodule=Data())
    checkpoint = torch.load(tmp_path / "last.ckpt")
    assert checkpoint[Data.__qualname__] == {"seen": 7}  # Lightning's key: what Lightning restores from
    resumed = Data()
    Trainer(**QUIET, max_epochs=2).fit(Regressor(), datamodule=resumed, ckpt_path=tmp_path / "last.ckpt")
    assert resumed.loaded == {"seen": 7}


def test_a_lightning_file_restores_the_data_modules_state(tmp_path: Path) -> None:
    checkpoint = torch.load(roundtrip.LIGHTNING_CKPT)
    checkpoint[Data.__qualname__] = {"seen": 3}  # where Lightning writes a data module's non-empty state
    path = tmp_path / "lightning.ckpt"
    torch.save(checkpoint, path)
    datamodule = Data(roundtrip.loader())
    Trainer(**QUIET, max_epochs=3).fit(roundtrip.Net(), datamodule=datamodule, ckpt_path=path)
    assert datamodule.loaded == {"seen": 3}


def test_the_data_modules_hooks_are_profiled_under_lightnings_names(tmp_path: Path) -> None:
    profiler = SimpleProfiler()
    trainer = Trainer(**{**QUIET, "enable_checkpointing": True}, max_steps=1, profiler=profiler,
                      default_root_dir=tmp_path)
    trainer.fit(Regressor(), datamodule=Data())
    for hook in ("prepare_data", "setup", "state_dict", "teardown"):  # timed whether overridden or not
        durations = profiler.recorded_durations[f"[LightningDataModule]Data.{hook}"]
        assert len(durations) == 1 and durations[0] > 0, hook
