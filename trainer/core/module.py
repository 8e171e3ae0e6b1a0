"""``lightning.pytorch.core.module``'s name: ``LightningModule`` (Ember's ``TrainModule``)."""

from trainer.module import TrainModule

LightningModule = TrainModule

__all__ = ["LightningModule"]
