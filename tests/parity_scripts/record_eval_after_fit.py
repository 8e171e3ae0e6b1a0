"""Record which weights Lightning's ``validate`` / ``test`` / ``predict`` use after ``fit`` when given no model and
no ``ckpt_path`` (tests/trainer/test_eval_after_fit.py asserts the same rule on Ember).

    /tmp/venv-pl/bin/python tests/parity_scripts/record_eval_after_fit.py /tmp/rec

A linear regression whose validation loss is lowest at epoch 1 of 4 (the learning rate then overshoots), so the
best checkpoint's weights differ from the final ones. Printed per case, as JSON: which weights the call used
("best", "last" or "current": compared with the checkpoint files and the module's weights after fit), the warning
and error messages Lightning gave (their text, with the checkpoint paths left out), on lines starting with "RECORD ".
"""

from __future__ import annotations

import json
import os
import sys
import warnings

import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader, TensorDataset


class Overshoot(LightningModule):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Linear(2, 1)
        self.used: list[float] = []

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def _evaluate(self, batch, name):
        self.used.append(float(self.net.weight.detach().sum()))
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.log(name, loss)

    def validation_step(self, batch, batch_idx):
        self._evaluate(batch, "val_loss")

    def test_step(self, batch, batch_idx):
        self._evaluate(batch, "test_loss")

    def predict_step(self, batch, batch_idx):
        self.used.append(float(self.net.weight.detach().sum()))
        return self.net(batch[0])

    def configure_optimizers(self):
        # A learning rate that grows 3x per epoch: the first epochs improve, the later ones overshoot.
        optimizer = torch.optim.SGD(self.parameters(), lr=0.05)
        return [optimizer], [torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=3.0)]


def data() -> DataLoader:
    x = torch.linspace(-1, 1, 16).reshape(8, 2)
    return DataLoader(TensorDataset(x, x @ torch.tensor([[1.5], [-0.5]])), batch_size=4)


def weight_sum(path: str) -> float:
    return float(torch.load(path, weights_only=True)["state_dict"]["net.weight"].sum())


def run(root: str, case: str) -> dict:
    checkpoint: list = {
        "monitored": [ModelCheckpoint(monitor="val_loss", mode="min", save_top_k=1, save_last=True)],
        "default": [],
        "none": [],
        "fast": [],
        "never": [ModelCheckpoint(monitor="val_loss", save_top_k=0)],
        "two": [ModelCheckpoint(monitor="val_loss", mode="min", save_top_k=1, filename="a-{epoch}"),
                ModelCheckpoint(monitor="val_loss", mode="max", save_top_k=1, filename="b-{epoch}")],
    }[case.split(":")[0]]
    trainer = Trainer(max_epochs=4, default_root_dir=os.path.join(root, case), callbacks=checkpoint,
                      enable_checkpointing=not case.startswith("none"), logger=False, fast_dev_run=case == "fast", enable_progress_bar=False,
                      enable_model_summary=False)
    module = Overshoot()
    trainer.fit(module, data(), data())
    final = float(module.net.weight.detach().sum())
    best = trainer.checkpoint_callback.best_model_path if trainer.checkpoint_callback else ""
    kinds = {"current": final}
    if best:
        kinds["best"] = weight_sum(best)
    out: dict = {"case": case, "distinct": kinds.get("best") != final}
    for method in ("validate", "test", "predict"):
        module.used.clear()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                call = getattr(trainer, method)
                if case.endswith(":model"):
                    call(module, dataloaders=data())
                else:
                    call(dataloaders=data())
                used = module.used[0] if module.used else None
                after = float(module.net.weight.detach().sum())
                out[method] = {"used": [k for k, v in kinds.items() if v == used],
                               "module_weights_after": [k for k, v in kinds.items() if v == after]}
            except Exception as error:  # noqa: BLE001 - recorded
                out[method] = {"error": type(error).__name__, "message": str(error)}
        out[method]["warnings"] = [str(w.message).replace(root, "<root>") for w in caught
                                   if "ckpt_path" in str(w.message) or "checkpoint" in str(w.message)]
    return out


def main() -> None:
    root = sys.argv[1]
    for case in ("monitored", "monitored:model", "default", "none", "two", "fast", "never"):
        print("RECORD", json.dumps(run(root, case)), flush=True)


if __name__ == "__main__":
    main()
