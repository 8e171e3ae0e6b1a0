"""Lightning's ``lightning.pytorch.utilities.enums`` names.

Example:
    >>> from trainer.utilities import GradClipAlgorithmType
    >>> GradClipAlgorithmType("norm") == "NORM", str(GradClipAlgorithmType.VALUE)
    (True, 'value')
"""

from trainer.states import LightningEnum


class GradClipAlgorithmType(LightningEnum):
    """``Trainer(gradient_clip_algorithm=...)`` / ``clip_gradients(..., gradient_clip_algorithm=...)`` as an enum:
    ``VALUE`` clamps each gradient element, ``NORM`` scales all gradients to a total norm."""

    VALUE = "value"
    NORM = "norm"


__all__ = ["GradClipAlgorithmType"]
