"""Descriptors that show the Trainer's parts under Lightning's attribute names (``trainer.max_epochs``,
``trainer.val_dataloaders``...), so each value has one owner and the Trainer class lists the names in one place."""

from __future__ import annotations

from typing import Any

from trainer import args as checks


class _View:
    """A Trainer attribute computed from one of its parts; ``read`` / ``write`` say how."""

    name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, obj: Any, objtype: type | None = None) -> Any:
        return self if obj is None else self.read(obj)

    def __set__(self, obj: Any, value: Any) -> None:
        self.write(obj, value)

    def read(self, obj: Any) -> Any:
        raise AttributeError(self.name)

    def write(self, obj: Any, value: Any) -> None:
        raise AttributeError(f"trainer.{self.name} is set by the trainer; it cannot be assigned.")


class ConfigField(_View):
    """``trainer.<name>`` reads ``trainer.config.<name>``; ``settable`` ones take a new count (validated), as
    Lightning lets scripts raise ``max_epochs`` before a second ``fit``. The others refuse assignment."""

    def __init__(self, settable: bool = False, minimum: int = 0) -> None:
        self.settable = settable
        self.minimum = minimum

    def read(self, obj: Any) -> Any:
        return getattr(obj.config, self.name)

    def write(self, obj: Any, value: Any) -> None:
        if not self.settable:
            raise AttributeError(f"trainer.{self.name} is read-only after construction: pass Trainer({self.name}="
                                 f"{value!r}) instead.")
        if self.name in ("max_epochs", "max_steps") and value == -1:
            value = None  # Lightning's "no limit"
        value = checks.check_count(self.name, value, self.minimum, allow_none=self.minimum == 0)
        obj.config = obj.config.replace(**{self.name: value})


class PartField(_View):
    """``trainer.<name>`` reads ``trainer.<part>.<attribute>`` (read-only unless ``settable``)."""

    def __init__(self, part: str, attribute: str, settable: bool = False) -> None:
        self.part = part
        self.attribute = attribute
        self.settable = settable

    def read(self, obj: Any) -> Any:
        return getattr(getattr(obj, self.part), self.attribute)

    def write(self, obj: Any, value: Any) -> None:
        if not self.settable:
            raise AttributeError(f"trainer.{self.name} is set by the trainer ({self.part}.{self.attribute}); it "
                                 "cannot be assigned.")
        setattr(getattr(obj, self.part), self.attribute, value)


class StageFlag(_View):
    """``trainer.<name>``: whether the trainer's stage (``trainer.state.stage``) is ``stage`` (read-only)."""

    def __init__(self, stage: str) -> None:
        self.stage = stage

    def read(self, obj: Any) -> Any:
        return obj.state.stage == self.stage
