"""``engine.checkpoint_io`` is ``engine.checkpoint.io``: this name stays while ``trainer/checkpoint/`` and
``callbacks/`` import it, so that their own changes merge without touching these lines."""

from engine.checkpoint.io import *  # every public name, as before the move
