"""Lightning's ``lightning.pytorch.utilities`` names: seeding, rank-zero helpers, ``AttributeDict``, types,
``CombinedLoader``.

Example:
    >>> from trainer.utilities import rank_zero_only, seed_everything
    >>> seed_everything(7, workers=True, verbose=False)
    7
"""

from trainer.hparams import AttributeDict
from trainer.utilities.combined_loader import CombinedLoader
from trainer.utilities.enums import GradClipAlgorithmType
from trainer.utilities.parsing import is_picklable
from trainer.utilities.rank_zero import (
    rank_zero_debug,
    rank_zero_deprecation,
    rank_zero_info,
    rank_zero_only,
    rank_zero_warn,
)
from trainer.utilities.seed import reset_seed, seed_everything, worker_init_function

__all__ = ["AttributeDict", "CombinedLoader", "GradClipAlgorithmType", "is_picklable", "rank_zero_debug", "rank_zero_deprecation",
           "rank_zero_info", "rank_zero_only",
           "rank_zero_warn", "reset_seed", "seed_everything", "worker_init_function"]
