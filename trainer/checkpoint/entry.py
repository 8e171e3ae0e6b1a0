"""``TrainerEntry``: the trainer's part of every engine checkpoint, as a value both ways; ``Attached``.

The format of what it saves, and the rule that it holds only plain values, are in ``trainer.checkpoint.format``.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

import torch

from callbacks import Callback
from engine.checkpoint.io import CheckpointError
from trainer.checkpoint.format import FORMAT, VERSION, check_format, check_plain
from trainer.checkpoint.hparams_io import hparams_record
from trainer.checkpoint.identity import identity_of, new_run_id
from trainer.loop.hooks import overrides
from trainer.metrics.logger import MetricLogger
from trainer.metrics.tracking import TrackerLink
from trainer.profiling import Profiler, datamodule_hook
from trainer.state import TrainState
from trainer.utilities.rank_zero import rank_zero_warn


@dataclass
class Attached:
    """What the trainer's runs work on: the callbacks, the module and the data module (one shared record: the
    trainer shows them as ``trainer.callbacks`` / ``module`` / ``datamodule``; the entry saves their state)."""

    callbacks: list[Callback]
    module: Any = None  # the TrainModule being (or last) run
    datamodule: Any = None


class TrainerEntry:
    """The trainer's entry in engine checkpoints: built from, and restored into, the parts it is given.

    The engine calls ``state_dict()`` on every process at each ``save_state`` (the checkpoint hooks run
    everywhere; the main process writes the result) and ``load_state_dict()`` at each ``load_state``, so the
    state travels as a value both ways.

    Args:
        state: the run's counters.
        attached: the callbacks (their ``state_dict`` by ``state_key``), the module and data module (their
            hyper-parameters; the data module's state; their ``on_save_checkpoint`` / ``on_load_checkpoint``).
        metrics: ``callback_metrics`` are saved, so a resumed ``ModelCheckpoint`` / ``EarlyStopping`` compares
            with the values it saw.
        prepared: what the run prepared through the engine, in order (a resume must prepare the same).
        trackers: the trackers' run identities, so a resumed run reopens the same runs.
        owner: what callback hooks receive as their first argument (the trainer, held weakly: no cycle).
        profiler: times the data module's ``state_dict`` / ``load_state_dict`` (Lightning's action names).

    ``run_id`` names the run (``trainer.checkpoint.identity``): drawn here, replaced by a loaded checkpoint's.
    """

    def __init__(self, state: TrainState, attached: Attached, metrics: MetricLogger, prepared: list[str],
                 trackers: TrackerLink, owner: Any, profiler: Profiler | None = None) -> None:
        self.state = state
        self.attached = attached
        self.metrics = metrics
        self.prepared = prepared
        self.trackers = trackers
        self._owner = weakref.ref(owner)
        self.profiler = profiler
        self.run_id = new_run_id()
        self.job: str | None = None  # the cluster's job key (Checkpointer), recorded in every checkpoint

    @property
    def owner(self) -> Any:
        """What callback hooks receive (the trainer), or None once it is gone."""
        return self._owner()

    # -- saving -------------------------------------------------------------------------------------------------
    def identity_entry(self) -> dict[str, Any]:
        """What a weights-only checkpoint records besides the weights: the counters, the hyper-parameters and
        the run identity (no hooks run: Lightning's weights-only checkpoints hold no callback state)."""
        return {"trainer": {"state": self.state.state_dict()},
                "run": identity_of(self.run_id, self.attached.module, self.job),
                "hyper_parameters": self._hparams()}

    def state_dict(self) -> dict[str, Any]:
        """The entry of a checkpoint taken now; runs the ``on_save_checkpoint`` hooks (callbacks, then module)."""
        extra: dict[str, Any] = {"epoch": self.state.epoch, "global_step": self.state.global_step}
        trainer_state = self.trainer_state()  # the callbacks' state_dict before their on_save_checkpoint: Lightning's order
        views = self._lightning_views()
        extra.update(views)
        self._call_hooks("on_save_checkpoint", extra)
        for key, value in views.items():  # read-only views of what the engine saves itself: not saved twice
            if extra.get(key) is value:
                del extra[key]
        metrics = {name: value.detach().cpu() if isinstance(value, torch.Tensor) else value
                   for name, value in self.metrics.callback_metrics.items()
                   if isinstance(value, (torch.Tensor, int, float))}
        # What load_from_checkpoint rebuilds the module and data module from (non-plain values sealed).
        hparams = self._hparams()
        payload = {"format": FORMAT, "version": VERSION, "run": identity_of(self.run_id, self.attached.module, self.job),
                   "trainer": trainer_state,
                   "trackers": self.trackers.state_dict(), "checkpoint": extra, "callback_metrics": metrics,
                   "prepared": list(self.prepared), "hyper_parameters": hparams}
        check_plain(payload, "checkpoint")
        return payload

    def _hparams(self) -> dict[str, Any]:
        """The module's and data module's hyper-parameters, encoded (``hparams_io.hparams_record``)."""
        return {**hparams_record(self.attached.module, "module"), **hparams_record(self.attached.datamodule,
                                                                                    "datamodule")}

    def _lightning_views(self) -> dict[str, Any]:
        """Lightning's keys of the checkpoint dict that ``on_save_checkpoint`` hooks read: ``state_dict``,
        ``optimizer_states`` and ``lr_schedulers`` (each scheduler's ``state_dict()``), built only when a hook is
        overridden (the engine saves these itself, in its own files)."""
        module, owner = self.attached.module, self._owner()
        hooked = any(overrides(c, Callback, "on_save_checkpoint") for c in self.attached.callbacks) or (
            module is not None and _module_saves(module))
        if not hooked or owner is None or module is None:
            return {}
        return {"state_dict": module.state_dict(),
                "optimizer_states": [optimizer.state_dict() for optimizer in owner.optimizers],
                "lr_schedulers": [config.scheduler.state_dict() for config in owner.lr_scheduler_configs]}

    def trainer_state(self) -> dict[str, Any]:
        """``TrainState``, every callback's state (by ``state_key``), the data module's state."""
        callbacks: dict[str, Any] = {}
        for callback in self.attached.callbacks:
            state = callback.state_dict()
            if state:
                if callback.state_key in callbacks:
                    raise ValueError(f"Two callbacks save state under the key {callback.state_key!r}: override "
                                     "`state_key` so each is unique (e.g. include its arguments).")
                callbacks[callback.state_key] = state
        found: dict[str, Any] = {"state": self.state.state_dict(), "callbacks": callbacks, "datamodule": {}}
        datamodule = self.attached.datamodule
        if datamodule is not None:
            found["datamodule"] = datamodule_hook(self.profiler, datamodule, "state_dict")()
            # Lightning's .ckpt key for that state (lightning_format.compose writes it there too).
            found["datamodule_key"] = type(datamodule).__qualname__
        return found

    # -- loading ------------------------------------------------------------------------------------------------
    def load_state_dict(self, payload: dict[str, Any]) -> None:
        """Restore a checkpoint's entry into the parts: counters, callbacks, data module, trackers, metrics,
        then the ``on_load_checkpoint`` hooks."""
        check_format(payload)
        if payload["prepared"] != self.prepared:
            raise CheckpointError(
                f"The checkpoint was saved after the trainer prepared {payload['prepared']}, but this run prepared "
                f"{self.prepared}, so loader and model states would land on the wrong objects. Resume with the "
                "same sequence of trainer calls as the run that saved it (e.g. the same validate() before fit()).")
        self.load_trainer_state(payload["trainer"])
        self.run_id = (payload.get("run") or {}).get("id") or self.run_id  # the resumed run is the checkpoint's
        self.trackers.load_state_dict(payload["trackers"])
        device = self.trackers.accelerator.device
        self.metrics.callback_metrics.update({name: value.to(device) if isinstance(value, torch.Tensor) else value
                                              for name, value in payload["callback_metrics"].items()})
        self._call_hooks("on_load_checkpoint", payload["checkpoint"])

    def load_trainer_state(self, state_dict: dict[str, Any]) -> None:
        """Restore what ``trainer_state`` returned (callbacks matched by ``state_key``)."""
        self.state.load_state_dict(state_dict["state"])
        saved = state_dict["callbacks"]
        keys = {id(callback): saved_key(callback, saved) for callback in self.attached.callbacks}
        missing = saved.keys() - set(keys.values())
        if missing:  # their state is not restored: say so, in Lightning's words
            rank_zero_warn("Be aware that when using `ckpt_path`, callbacks used to create the checkpoint need to be "
                           f"provided during `Trainer` instantiation. Please add the following callbacks: "
                           f"{sorted(missing)}.")
        for callback in self.attached.callbacks:
            key = keys[id(callback)]
            if key is not None:
                callback.load_state_dict(saved[key])
        if self.attached.datamodule is not None and state_dict.get("datamodule"):
            datamodule_hook(self.profiler, self.attached.datamodule, "load_state_dict")(state_dict["datamodule"])

    def _call_hooks(self, name: str, checkpoint: dict[str, Any]) -> None:
        """``on_save_checkpoint`` / ``on_load_checkpoint`` on the callbacks, then the module."""
        module = self.attached.module
        for callback in self.attached.callbacks:
            if overrides(callback, Callback, name):
                getattr(callback, name)(self._owner(), module, checkpoint)
        if module is not None:  # TrainModule's own hooks do nothing
            getattr(module, name)(checkpoint)


def _module_saves(module: Any) -> bool:
    """Whether the module overrides ``on_save_checkpoint`` (``TrainModule``'s does nothing)."""
    from trainer.module import TrainModule  # trainer.module imports the checkpoint package: import here

    return not isinstance(module, TrainModule) or overrides(module, TrainModule, "on_save_checkpoint")


def saved_key(callback: Callback, saved: dict[str, Any]) -> str | None:
    """The key ``callback``'s state is under in ``saved``: its ``state_key``; for a subclass of a callback whose key
    starts with its class name, also the key a checkpoint written before keys named the subclass holds (the base
    class's name, e.g. ``EarlyStopping{...}`` for a subclass of ``EarlyStopping``); None if neither is there."""
    key = callback.state_key
    if key in saved:
        return key
    own = type(callback).__qualname__
    if key.startswith(own):
        for base in type(callback).__mro__[1:]:
            legacy = base.__qualname__ + key[len(own):]
            if legacy in saved:
                return legacy
    return None
