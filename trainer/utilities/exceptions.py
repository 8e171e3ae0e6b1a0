"""Lightning's ``lightning.pytorch.utilities.exceptions`` names: ``MisconfigurationException`` (a ``ValueError``)
and ``SIGTERMException``, the ``SystemExit`` that ``fit`` raises after a preemption signal (SIGTERM by default:
the checkpoint is written and the trackers finished first; ``Trainer(preemption_signals=...)`` picks the signals).

Example:
    >>> from trainer.utilities.exceptions import MisconfigurationException, SIGTERMException
    >>> issubclass(MisconfigurationException, ValueError), issubclass(SIGTERMException, SystemExit)
    (True, True)
"""

from callbacks.exceptions import MisconfigurationException
from trainer.loop.signals import Preempted as SIGTERMException

__all__ = ["MisconfigurationException", "SIGTERMException"]
