"""``PossibleUserWarning``: a warning about a setting that is allowed but probably not what was meant.

Lightning's name (``lightning.pytorch.utilities.warnings``; ``trainer.utilities.warnings`` re-exports it), used
for e.g. a ``log_every_n_steps`` larger than the number of training batches, so a filter written for Lightning
(``warnings.filterwarnings("ignore", category=PossibleUserWarning)``) works unchanged.

Example:
    >>> issubclass(PossibleUserWarning, UserWarning)
    True
"""

from __future__ import annotations


class PossibleUserWarning(UserWarning):
    """A setting that is allowed but is likely a mistake (the message says which and why)."""


__all__ = ["PossibleUserWarning"]
