"""``save_hyperparameters()``: capture a constructor's arguments, as Lightning does, for modules and data modules."""

from __future__ import annotations

import copy
import dataclasses
import inspect
import sys
import warnings
from collections.abc import Mapping, Sequence
from types import FrameType
from typing import Any

from torch import nn


class AttributeDict(dict):
    """A dict whose keys are also attributes (``hparams.lr`` and ``hparams["lr"]``).

    Example:
        >>> hp = AttributeDict(lr=0.1)
        >>> hp.lr, hp["lr"]
        (0.1, 0.1)
    """

    def __getattr__(self, key: str) -> Any:
        try:
            return self[key]
        except KeyError:
            raise AttributeError(f"No hyper-parameter {key!r}; saved ones: {sorted(self)}.") from None

    def __setattr__(self, key: str, value: Any) -> None:
        self[key] = value

    def __delattr__(self, key: str) -> None:
        del self[key]


class HyperparametersMixin:
    """Adds ``save_hyperparameters``, ``hparams`` and ``hparams_initial`` (shared by TrainModule and DataModule)."""

    def save_hyperparameters(self, *args: Any, ignore: Sequence[str] | str | None = None,
                             frame: FrameType | None = None, logger: bool = True) -> None:
        """Store the arguments of the calling ``__init__`` (and its parents' ``__init__``) in ``self.hparams``.

        Args:
            args: nothing (all init arguments); names of init arguments to keep; or a single dict / Namespace
                to use as the hyper-parameters.
            ignore: init argument names to leave out (e.g. a backbone module).
            frame: the frame to read the arguments from (default: the caller's).
            logger: send them to the trackers as the run configuration.

        Example:
            >>> class Net(HyperparametersMixin):
            ...     def __init__(self, lr: float = 0.1, depth: int = 2) -> None:
            ...         self.save_hyperparameters()
            >>> Net(lr=0.5).hparams
            {'lr': 0.5, 'depth': 2}
        """
        if frame is None:
            current = inspect.currentframe()
            frame = current.f_back if current is not None else None
        # A dataclass module calls this from __post_init__, not __init__: its init fields are the arguments (as in
        # Lightning, fields with init=False are left out).
        init_args = ({f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.init}
                     if dataclasses.is_dataclass(self) else _collect_init_args(frame, self))
        # An argparse.Namespace can only exist if argparse was imported: not importing it keeps `import trainer`
        # ~5 ms cheaper.
        argparse = sys.modules.get("argparse")
        if len(args) == 1 and argparse is not None and isinstance(args[0], argparse.Namespace):
            chosen = dict(vars(args[0]))
        elif len(args) == 1 and isinstance(args[0], Mapping):
            chosen = dict(args[0])
        elif args:
            names = [a for a in args if isinstance(a, str)]
            if len(names) != len(args):
                raise TypeError(f"save_hyperparameters takes argument names (str) or one dict/Namespace. Received: "
                                f"{args!r:.200}.")
            missing = [n for n in names if n not in init_args]
            if missing:
                raise ValueError(f"save_hyperparameters{tuple(names)}: {missing} are not arguments of __init__ "
                                 f"(it has {sorted(init_args)}).")
            chosen = {n: init_args[n] for n in names}
        else:
            chosen = init_args
        ignored = {ignore} if isinstance(ignore, str) else set(ignore or ())
        hparams = AttributeDict({k: v for k, v in chosen.items() if k not in ignored})
        _warn_modules(hparams)
        # object.__setattr__: nn.Module's __setattr__ would work too, but this keeps the mixin framework-neutral.
        object.__setattr__(self, "_hparams", hparams)
        object.__setattr__(self, "_hparams_initial", copy.deepcopy(hparams))
        object.__setattr__(self, "_log_hyperparams", logger)

    @property
    def hparams(self) -> AttributeDict:
        """The saved hyper-parameters (empty until ``save_hyperparameters`` is called); mutable."""
        hparams = self.__dict__.get("_hparams")
        if hparams is None:
            hparams = AttributeDict()
            object.__setattr__(self, "_hparams", hparams)
        return hparams

    @property
    def hparams_initial(self) -> AttributeDict:
        """A copy of the hyper-parameters as first saved (later edits to ``hparams`` do not show here)."""
        return copy.deepcopy(self.__dict__.get("_hparams_initial") or AttributeDict())


def _warn_modules(hparams: Mapping[str, Any]) -> None:
    """Lightning 2.6's warning (observed) for each ``nn.Module`` kept: its weights are in the checkpoint's state
    dict already, and the hyper-parameter stores the whole module once more (pickled, in every checkpoint)."""
    for key, value in hparams.items():
        if isinstance(value, nn.Module):
            warnings.warn(f"Attribute {key!r} is an instance of `nn.Module` and is already saved during checkpointing. "
                          f"It is recommended to ignore them using `self.save_hyperparameters(ignore=[{key!r}])`.",
                          UserWarning, stacklevel=3)


def _collect_init_args(frame: FrameType | None, obj: Any) -> dict[str, Any]:
    """Arguments of every ``__init__`` frame of ``obj`` on the stack, the most derived class winning."""
    per_frame: list[dict[str, Any]] = []
    while frame is not None and frame.f_code.co_name == "__init__":
        info = inspect.getargvalues(frame)
        if not info.args or info.locals.get(info.args[0]) is not obj:
            break
        # *args are dropped and **kwargs expanded, as Lightning does.
        values = {name: info.locals[name] for name in info.args[1:] if name in info.locals}
        if info.keywords:
            values.update(info.locals.get(info.keywords) or {})
        values.pop("__class__", None)
        per_frame.append(values)
        frame = frame.f_back
    merged: dict[str, Any] = {}
    for values in per_frame:  # innermost (the base class) first, so derived classes override
        merged.update(values)
    return merged
