"""``lightning.pytorch.core.optimizer``'s name: ``LightningOptimizer``."""

from trainer.optim import LightningOptimizer

__all__ = ["LightningOptimizer"]
