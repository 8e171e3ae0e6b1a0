"""``lightning.pytorch.core.datamodule``'s name: ``LightningDataModule`` (Ember's ``DataModule``)."""

from trainer.datamodule import DataModule

LightningDataModule = DataModule

__all__ = ["LightningDataModule"]
