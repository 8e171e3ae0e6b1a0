"""Lightning's ``lightning.pytorch.utilities.exceptions`` names: ``MisconfigurationException`` (a ``ValueError``).

Example:
    >>> from trainer.utilities.exceptions import MisconfigurationException
    >>> issubclass(MisconfigurationException, ValueError)
    True
"""

from callbacks.exceptions import MisconfigurationException

__all__ = ["MisconfigurationException"]
