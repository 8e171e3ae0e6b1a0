"""``engine.checkpoint_state`` is ``engine.checkpoint.state``: this name stays while ``trainer/checkpoint/`` and
``callbacks/`` import it, so that their own changes merge without touching these lines."""

from engine.checkpoint.state import *  # every public name, as before the move
