"""``GradientState``: whether this micro-step syncs gradients, and which prepared data loader is being iterated."""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Any

from engine.config import GradientAccumulationPlugin


@dataclass
class _GradientRecord:
    plugin: GradientAccumulationPlugin
    sync_gradients: bool = True
    active_dataloader: Any = None
    dataloader_references: list[Any] = field(default_factory=lambda: [None])


class GradientState:
    """Whether this micro-step syncs gradients, and which prepared data loader is being iterated.

    ``end_of_dataloader`` and ``remainder`` read the active (innermost) loader; with none they are False / -1.
    """

    _shared: _GradientRecord | None = None

    def __init__(self, gradient_accumulation_plugin: GradientAccumulationPlugin | None = None) -> None:
        if GradientState._shared is None:
            GradientState._shared = _GradientRecord(gradient_accumulation_plugin or GradientAccumulationPlugin())
        elif gradient_accumulation_plugin is not None:
            GradientState._shared.plugin = gradient_accumulation_plugin

    @property
    def _record(self) -> _GradientRecord:
        if GradientState._shared is None:
            GradientState._shared = _GradientRecord(GradientAccumulationPlugin())
        return GradientState._shared

    @property
    def initialized(self) -> bool:
        return GradientState._shared is not None

    @classmethod
    def _reset_state(cls) -> None:
        GradientState._shared = None

    @property
    def plugin_kwargs(self) -> dict[str, Any]:
        """The plugin's non-default settings; ``num_steps`` always (as Accelerate, whose default is None)."""
        plugin = self._record.plugin
        return {"num_steps": plugin.num_steps, **plugin.to_kwargs()}

    # The properties read on every step go to the shared record directly (falling back to `_record`, which
    # creates it): each saved attribute lookup is a few hundred nanoseconds per training step.
    @property
    def num_steps(self) -> int:
        return (GradientState._shared or self._record).plugin.num_steps

    @num_steps.setter
    def num_steps(self, value: int) -> None:
        self._record.plugin.num_steps = value

    @property
    def adjust_scheduler(self) -> bool:
        return self._record.plugin.adjust_scheduler

    @property
    def sync_with_dataloader(self) -> bool:
        return self._record.plugin.sync_with_dataloader

    @property
    def sync_each_batch(self) -> bool:
        return self._record.plugin.sync_each_batch

    @property
    def sync_gradients(self) -> bool:
        return (GradientState._shared or self._record).sync_gradients

    def _set_sync_gradients(self, sync_gradients: bool) -> None:
        (GradientState._shared or self._record).sync_gradients = sync_gradients

    @property
    def active_dataloader(self) -> Any:
        ref = (GradientState._shared or self._record).active_dataloader
        return ref() if ref is not None else None

    @property
    def dataloader_references(self) -> list[Any]:
        return [ref() if ref is not None else None for ref in self._record.dataloader_references]

    @property
    def in_dataloader(self) -> bool:
        return self.active_dataloader is not None

    @property
    def end_of_dataloader(self) -> bool:
        loader = self.active_dataloader
        return bool(loader.end_of_dataloader) if loader is not None else False

    @property
    def remainder(self) -> int:
        loader = self.active_dataloader
        return int(loader.remainder) if loader is not None else -1

    def _add_dataloader(self, dataloader: Any) -> None:
        record = self._record
        record.active_dataloader = weakref.ref(dataloader)
        record.dataloader_references.append(record.active_dataloader)

    def _remove_dataloader(self, dataloader: Any) -> None:
        record = self._record
        record.dataloader_references = [
            ref for ref in record.dataloader_references if ref is None or ref() not in (dataloader, None)]
        if not record.dataloader_references:
            record.dataloader_references = [None]
        record.active_dataloader = record.dataloader_references[-1]

    def __repr__(self) -> str:
        return (f"Sync Gradients: {self.sync_gradients}\nAt end of current dataloader: {self.end_of_dataloader}\n"
                f"Extra samples added: {self.remainder}\nGradient accumulation plugin: {self.plugin_kwargs}\n")

