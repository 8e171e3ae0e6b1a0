"""Lightning's ``lightning.pytorch.utilities.warnings`` names: ``PossibleUserWarning``.

Example:
    >>> from trainer.utilities.warnings import PossibleUserWarning
    >>> issubclass(PossibleUserWarning, UserWarning)
    True
"""

from callbacks.warnings import PossibleUserWarning

__all__ = ["PossibleUserWarning"]
