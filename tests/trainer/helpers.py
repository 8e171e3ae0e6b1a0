"""Small fakes for the trainer tests: data, a tiny regression module, and recording callback / module."""

from __future__ import annotations

import os
from typing import Any

import torch
from torch.utils.data import DataLoader, TensorDataset

from callbacks import Callback, ModelCheckpoint
from callbacks.base import HOOK_NAMES
from trackers import GeneralTracker
from trainer import Trainer, TrainModule

# Keyword arguments that keep a test Trainer quiet and free of files.
QUIET: dict[str, Any] = {"log_with": None, "enable_progress_bar": False, "enable_model_summary": False,
                         "num_sanity_val_steps": 0, "enable_checkpointing": False}
# QUIET for a trainer given its own ModelCheckpoint: Lightning refuses one with enable_checkpointing=False, and
# none is added when one is given.
SAVING: dict[str, Any] = {k: v for k, v in QUIET.items() if k != "enable_checkpointing"}


def quiet(callbacks: Any = ()) -> dict[str, Any]:
    """QUIET, or SAVING when ``callbacks`` hold a ModelCheckpoint."""
    return SAVING if any(isinstance(c, ModelCheckpoint) for c in callbacks or ()) else QUIET


def data(n: int = 16, batch_size: int = 4, features: int = 3, seed: int = 0, shuffle: bool = False) -> DataLoader:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n, features, generator=generator)
    y = x.sum(dim=1, keepdim=True) + 0.1 * torch.randn(n, 1, generator=generator)
    return DataLoader(TensorDataset(x, y), batch_size=batch_size, shuffle=shuffle)


def indexed(n: int, batch_size: int) -> DataLoader:
    """Batches of ``(index, index as a feature)``, to check which samples were seen in which order."""
    idx = torch.arange(n)
    return DataLoader(TensorDataset(idx, idx.float().unsqueeze(1)), batch_size=batch_size)


class Regressor(TrainModule):
    """Linear regression that logs its loss in training and validation."""

    def __init__(self, lr: float = 0.05, features: int = 3) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = torch.nn.Linear(features, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = torch.nn.functional.mse_loss(self(x), y)
        self.log("train/loss", loss)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val/loss", torch.nn.functional.mse_loss(self(x), y))

    def test_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("test/loss", torch.nn.functional.mse_loss(self(x), y))

    def predict_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self(batch[0])

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


class MemoryTracker(GeneralTracker):
    """Keeps every ``log`` call as ``(step, values)`` and the run configuration."""

    name = "memory"
    requires_logging_directory = False

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[tuple[int | None, dict[str, Any]]] = []
        self.config: dict[str, Any] | None = None

    @property
    def tracker(self) -> list[tuple[int | None, dict[str, Any]]]:
        return self.rows

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        self.config = dict(values)

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        self.rows.append((step, dict(values)))

    def logged(self, key: str) -> list[tuple[int | None, Any]]:
        """``(step, value)`` of every row holding ``key``."""
        return [(step, values[key]) for step, values in self.rows if key in values]


def _recorder(name: str) -> Any:
    def hook(self: Any, *args: Any, **kwargs: Any) -> None:  # setup / teardown get stage= (Lightning's call)
        self.events.append(name)

    hook.__name__ = name
    return hook


def _recorder_init(self: Any, events: list[str] | None = None) -> None:
    self.events = [] if events is None else events


# Every hook of the Callback base, overridden so the trainer calls it (only overridden hooks are called).
Recorder = type("Recorder", (Callback,), {"__init__": _recorder_init, **{n: _recorder(n) for n in HOOK_NAMES}})


def module_recording(base: type[TrainModule], events: list[str], hooks: tuple[str, ...]) -> TrainModule:
    """An instance of a subclass of ``base`` whose ``hooks`` append ``"module:<hook>"`` to ``events``."""

    def make(name: str) -> Any:
        def hook(self: Any, *args: Any, **kwargs: Any) -> None:
            events.append(f"module:{name}")

        return hook

    cls = type(f"Recording{base.__name__}", (base,), {name: make(name) for name in hooks})
    return cls()


def fit(module: TrainModule | None = None, loader: DataLoader | None = None, val: Any = None,
        **trainer_kwargs: Any) -> Trainer:
    """Fit ``module`` (a Regressor by default) quietly and return the trainer."""
    trainer = Trainer(**{**QUIET, **trainer_kwargs})
    trainer.fit(module or Regressor(), loader if loader is not None else data(), val)
    return trainer


def damage(path: str | os.PathLike[str], count: int = 16) -> str:
    """Flip ``count`` bytes of a checkpoint's first tensor data, so the file still loads and only its checks tell:
    in a ``.ckpt`` file, the bytes of the first tensor storage stored (the module's weights); in a checkpoint
    folder, the last bytes of ``model.safetensors``. Returns the file changed."""
    import struct
    import zipfile

    target = os.fspath(path)
    if os.path.isdir(target):
        target = os.path.join(target, "model.safetensors")
    with open(target, "rb") as handle:
        raw = bytearray(handle.read())
    if os.path.basename(target) == "model.safetensors":
        for i in range(count):
            raw[-1 - i] ^= 0xFF
    else:
        with zipfile.ZipFile(target) as archive:
            info = next(i for i in archive.infolist() if "/data/" in i.filename and i.file_size >= 4)
        name_length, extra_length = struct.unpack("<HH", raw[info.header_offset + 26:info.header_offset + 30])
        start = info.header_offset + 30 + name_length + extra_length
        for i in range(min(count, info.file_size)):
            raw[start + i] ^= 0xFF
    with open(target, "wb") as handle:
        handle.write(bytes(raw))
    return target
