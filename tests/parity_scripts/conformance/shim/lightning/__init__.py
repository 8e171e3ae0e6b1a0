"""The conformance run's fake ``lightning`` package: Ember's names under Lightning's paths (see
``ember_lightning_shim``). Only ever on ``sys.path`` for the conformance runner's Ember side."""

import sys

import ember_lightning_shim as _shim

_shim.install()
# Replace this module by the shim's root module, whose names resolve to Ember's (``lightning.Trainer``...).
_root = _shim.ShimModule(__name__, _shim.PUBLIC[__name__], internal=False)
from trainer.checkpoint.lightning_format import LIGHTNING_VERSION

_root.__dict__.update(__file__=__file__, __spec__=__spec__, __version__=LIGHTNING_VERSION)
sys.modules[__name__] = _root
