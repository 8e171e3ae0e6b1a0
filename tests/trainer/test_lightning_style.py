"""Lightning-style modules and data modules run after changing only their imports (see lightning_style.py)."""

from __future__ import annotations

import pytest
import torch

from tests.trainer.helpers import QUIET
from tests.trainer.lightning_style import BlobsDataModule, LitClassifier, LitGAN
from trainer import Trainer

FORMS = ["optimizer", "list", "two_lists", "dict", "dict_config", "plateau", "list_of_dicts"]


@pytest.mark.parametrize("form", FORMS)
def test_classifier_with_its_own_loaders_in_every_optimizer_form(form: str) -> None:
    torch.manual_seed(0)
    model = LitClassifier(optimizer_form=form)
    trainer = Trainer(**{**QUIET, "num_sanity_val_steps": 2}, max_epochs=3)
    trainer.fit(model)
    assert trainer.global_step == 12  # 64 samples / 16 per batch, 3 epochs
    assert len(model.epoch_losses) == 3 and model.epoch_losses[-1] < model.epoch_losses[0]
    assert float(trainer.callback_metrics["val_acc"]) > 0.8
    # The module passed: its current weights (without it, Lightning's rule loads the best checkpoint, and this
    # Trainer keeps none: tests/trainer/test_eval_after_fit.py).
    [results] = trainer.test(model, verbose=False)
    assert results["test_acc"] > 0.8
    predictions = trainer.predict(model)
    assert torch.cat(predictions).shape == (20,)


def test_datamodule_and_manual_gan() -> None:
    torch.manual_seed(0)
    dm = BlobsDataModule()
    model = LitClassifier()
    trainer = Trainer(**QUIET, max_epochs=2)
    trainer.fit(model, datamodule=dm)
    assert dm.prepared and dm.stages == ["fit"]
    assert trainer.validate(model, datamodule=dm, verbose=False)[0]["val_acc"] > 0.8
    assert len(torch.cat(trainer.predict(model, datamodule=dm))) == 32
    assert dm.stages == ["fit", "validate", "predict"]

    gan = LitGAN()
    trainer = Trainer(**QUIET, max_epochs=2)
    with pytest.warns(UserWarning, match="You passed in a `val_dataloader` but have no `validation_step`. Skipping val loop: LitGAN has no validation_step"):
        trainer.fit(gan, datamodule=BlobsDataModule())
    assert trainer.global_step == 2 * 4 * 2  # two optimizer steps per batch, 4 batches, 2 epochs
    assert all(gan.optimizer_types)
    assert [s.get_last_lr()[0] for s in gan.lr_schedulers()] == [pytest.approx(2.5e-4)] * 2
    assert {"g_loss", "d_loss"} <= set(trainer.progress_bar_metrics)
