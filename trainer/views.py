"""Descriptors that show the Trainer's parts under Lightning's attribute names (``trainer.max_epochs``,
``trainer.val_dataloaders``...), so each value has one owner and the Trainer class lists the names in one place."""

from __future__ import annotations

from typing import Any

from trainer import args as checks


class ConfigField:
    """``trainer.<name>`` reads ``trainer.config.<name>``; ``settable`` ones take a new count (validated), as
    Lightning lets scripts raise ``max_epochs`` before a second ``fit``. The others refuse assignment."""

    def __init__(self, settable: bool = False, minimum: int = 0) -> None:
        self.settable = settable
        self.minimum = minimum
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, obj: Any, objtype: type | None = None) -> Any:
        if obj is None:
            return self
        return getattr(obj.config, self.name)

    def __set__(self, obj: Any, value: Any) -> None:
        if not self.settable:
            raise AttributeError(f"trainer.{self.name} is read-only after construction: pass Trainer({self.name}="
                                 f"{value!r}) instead.")
        if self.name in ("max_epochs", "max_steps") and value == -1:
            value = None  # Lightning's "no limit"
        value = checks.check_count(self.name, value, self.minimum, allow_none=self.minimum == 0)
        obj.config = obj.config.replace(**{self.name: value})


class PartField:
    """``trainer.<name>`` reads ``trainer.<part>.<attribute>`` (read-only unless ``settable``)."""

    def __init__(self, part: str, attribute: str, settable: bool = False) -> None:
        self.part = part
        self.attribute = attribute
        self.settable = settable
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, obj: Any, objtype: type | None = None) -> Any:
        if obj is None:
            return self
        return getattr(getattr(obj, self.part), self.attribute)

    def __set__(self, obj: Any, value: Any) -> None:
        if self.settable:
            setattr(getattr(obj, self.part), self.attribute, value)
            return
        raise AttributeError(f"trainer.{self.name} is set by the trainer ({self.part}.{self.attribute}); it cannot "
                             "be assigned.")


class StageFlag:
    """``trainer.<name>``: whether the trainer's stage (``trainer.state.stage``) is ``stage`` (read-only)."""

    def __init__(self, stage: str) -> None:
        self.stage = stage

    def __get__(self, obj: Any, objtype: type | None = None) -> Any:
        if obj is None:
            return self
        return obj.state.stage == self.stage

    def __set__(self, obj: Any, value: Any) -> None:
        raise AttributeError(f"whether the trainer is in stage {self.stage!r} is read-only (see trainer.state.stage).")
