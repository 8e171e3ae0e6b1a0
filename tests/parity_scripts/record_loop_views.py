"""Record what Lightning's public loop attributes (``trainer.fit_loop`` & co.) read at each hook of a small run.

    /tmp/venv-pl44/bin/python tests/parity_scripts/record_loop_views.py [--ember]

Prints one line per hook: the hook's name and the values of the attributes below, so Ember's views
(``trainer.compat.loop_views``) can be compared with Lightning's (``--ember`` runs the same module on Ember).
"""

from __future__ import annotations

import sys
from typing import Any

import torch
from torch.utils.data import DataLoader, TensorDataset

if "--ember" in sys.argv:
    from callbacks import Callback
    from trainer import Trainer
    from trainer import TrainModule as LightningModule
else:
    from lightning.pytorch import Callback, LightningModule, Trainer

FIELDS = ("fit_loop.max_epochs", "fit_loop.min_epochs", "fit_loop.max_steps", "fit_loop.min_steps",
          "fit_loop.total_batch_idx", "fit_loop.batch_idx", "fit_loop.done",
          "fit_loop.restarting", "fit_loop.epoch_loop.global_step", "fit_loop.epoch_loop.max_steps",
          "fit_loop.epoch_loop.total_batch_idx", "fit_loop.epoch_loop.batch_idx")
PROGRESS = ("fit_loop.epoch_progress", "fit_loop.epoch_loop.batch_progress", "fit_loop.epoch_loop.val_loop.batch_progress",
            "validate_loop.batch_progress", "test_loop.batch_progress", "predict_loop.batch_progress")


def read(trainer: Any, path: str) -> Any:
    value = trainer
    for part in path.split("."):
        try:
            value = getattr(value, part)
        except Exception as error:  # noqa: BLE001 - a recorder: show what failed
            return f"<{type(error).__name__}>"
    return value


def progress(trainer: Any, path: str) -> str:
    def counts(tracker: Any) -> str:
        return "/".join(str(getattr(tracker, k, "-")) for k in ("ready", "started", "processed", "completed"))
    p = read(trainer, path)
    if isinstance(p, str):
        return p
    last = getattr(p, "is_last_batch", "")
    return f"total={counts(p.total)} current={counts(p.current)}{' last' if last is True else ''}"


class Recorder(Callback):
    def _show(self, trainer: Any, hook: str) -> None:
        values = " ".join(f"{f.split('.', 1)[1]}={read(trainer, f)}" for f in FIELDS)
        print(f"{hook}: {values}")
        for path in PROGRESS:
            print(f"    {path}: {progress(trainer, path)}")


def _recording(hook: str) -> Any:
    return lambda self, trainer, *args: self._show(trainer, hook)


for _hook in ("on_train_start", "on_train_epoch_start", "on_train_batch_start", "on_train_batch_end",
              "on_validation_start", "on_validation_batch_end", "on_validation_end", "on_train_epoch_end",
              "on_train_end", "on_test_batch_end", "on_test_end", "on_predict_batch_end", "on_predict_end"):
    setattr(Recorder, _hook, _recording(_hook))


class Model(LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(2, 1)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self.net(batch[0]).sum()

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.net(batch[0])

    test_step = validation_step

    def predict_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self.net(batch[0])

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def main() -> None:
    data = DataLoader(TensorDataset(torch.randn(6, 2)), batch_size=2)
    kw: dict[str, Any] = {"enable_progress_bar": False, "enable_model_summary": False, "logger": False,
                          "enable_checkpointing": False}
    trainer = Trainer(max_epochs=2, limit_val_batches=2, val_check_interval=2, num_sanity_val_steps=0,
                      accumulate_grad_batches=2, callbacks=[Recorder()], **kw)
    trainer.fit(Model(), data, data)
    Recorder()._show(trainer, "after fit")
    trainer.test(trainer.lightning_module if hasattr(trainer, "lightning_module") else None, data, verbose=False)
    Recorder()._show(trainer, "after test")
    trainer.predict(trainer.lightning_module, data)
    Recorder()._show(trainer, "after predict")
    print("epoch_batch_indices", read(trainer, "predict_loop.epoch_batch_indices"))


if __name__ == "__main__":
    main()
