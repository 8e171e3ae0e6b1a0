"""The ``Accelerator`` and the parts it owns that nothing else uses: ``Preparer`` and ``PreparedObjects`` (what
``prepare`` does and keeps), ``Checkpointer`` (``save_state`` / ``load_state`` / ``save`` / ``save_model``) and
``ProcessControl`` (barriers, per-process decorators, triggers). Its other parts have folders of their own:
``engine.backends`` (what differs between backends, the device mesh) and ``engine.tracking`` (the trackers)."""

from engine.accelerator.accelerator import Accelerator

__all__ = ["Accelerator"]
