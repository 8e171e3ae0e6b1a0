"""``engine.checkpointing`` is ``engine.checkpoint.folders``: this name stays while ``trainer/checkpoint/`` and
``callbacks/`` import it, so that their own changes merge without touching these lines."""

from engine.checkpoint.folders import *  # every public name, as before the move
