"""``save_hyperparameters()``: capture a constructor's arguments, as Lightning does, for modules and data modules."""

from __future__ import annotations

import copy
import dataclasses
import inspect
import sys
import warnings
from collections.abc import MutableMapping, Sequence
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
            if key.startswith("__"):  # copy / pickle protocol lookups (__deepcopy__, ...): not a hyper-parameter
                raise AttributeError(key) from None
            # Names as text: Lightning allows keys of any type (an int beside strs cannot be sorted).
            raise AttributeError(f"No hyper-parameter {key!r}; saved ones: {sorted(map(str, self))}.") from None

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
        if len(args) == 1 and not isinstance(args[0], str) and not args[0]:
            return  # an empty container: nothing to save (Lightning's rule), what was saved before stays
        if frame is None:
            current = inspect.currentframe()
            frame = current.f_back if current is not None else None
        # A dataclass module calls this from __post_init__, not __init__: its init fields are the arguments (as in
        # Lightning, fields with init=False are left out).
        init_args = ({f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.init}
                     if dataclasses.is_dataclass(self) else _collect_init_args(frame))
        ignored = {ignore} if isinstance(ignore, str) else {i for i in ignore or () if isinstance(i, str)}
        init_args = {k: v for k, v in init_args.items() if k not in ignored}
        containers = [a for a in args if not isinstance(a, str)]
        if not args:
            chosen: Any = init_args
            name = "kwargs" if init_args else None
        elif len(containers) == 1:
            # One object (dict, Namespace, OmegaConf container) is the hyper-parameters; its argument's name is
            # recorded, so load_from_checkpoint passes it back under that name: cls(config=...).
            chosen = containers[0]
            name = next((k for k, v in init_args.items() if _same(v, chosen)), None)
        else:
            missing = [a for a in args if isinstance(a, str) and a not in init_args]
            if missing:
                raise ValueError(f"save_hyperparameters{tuple(args)}: {missing} are not arguments of __init__ "
                                 f"(it has {sorted(init_args)}).")
            chosen, name = {a: init_args[a] for a in args if isinstance(a, str)}, "kwargs"
        hparams = _as_hparams(chosen)
        current = self.__dict__.get("_hparams")
        if isinstance(hparams, dict) and isinstance(current, dict):
            # A subclass calling it after its parent did adds to what the parent saved (Lightning's rule).
            current.update(hparams)
            hparams = current
        for key in ignored:  # a subclass can drop what a parent saved
            hparams.pop(key, None)
        _warn_modules(hparams)
        # object.__setattr__: nn.Module's __setattr__ would work too, but this keeps the mixin framework-neutral.
        object.__setattr__(self, "_hparams", hparams)
        object.__setattr__(self, "_hparams_name", name)
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


def _warn_modules(hparams: MutableMapping[str, Any]) -> None:
    """Lightning 2.6's warning (observed) for each ``nn.Module`` kept: its weights are in the checkpoint's state
    dict already, and the hyper-parameter stores the whole module once more (pickled, in every checkpoint)."""
    for key, value in hparams.items():
        if isinstance(value, nn.Module):
            warnings.warn(f"Attribute {key!r} is an instance of `nn.Module` and is already saved during checkpointing. "
                          f"It is recommended to ignore them using `self.save_hyperparameters(ignore=[{key!r}])`.",
                          UserWarning, stacklevel=3)


_PRIMITIVES = (bool, int, float, str)


def _same(value: Any, chosen: Any) -> bool:
    """Whether init argument ``value`` is the container passed to ``save_hyperparameters`` (equal, as Lightning
    compares; a comparison that raises, e.g. of tensors, counts as different)."""
    try:
        return value is chosen or bool(value == chosen)
    except Exception:  # noqa: BLE001 - any failing __eq__/__bool__: not the same argument
        return False


def _as_hparams(value: Any) -> Any:
    """The stored form of what ``save_hyperparameters`` was given: a dict or a ``Namespace`` as an
    ``AttributeDict``, an OmegaConf container or another mutable mapping as it is (Lightning's rules).

    Raises:
        ValueError: a number, string or bool, or any other type (the error says what to pass).
    """
    argparse = sys.modules.get("argparse")  # a Namespace exists only if argparse was imported (import cost)
    if argparse is not None and isinstance(value, argparse.Namespace):
        value = vars(value)
    if isinstance(value, dict):
        return AttributeDict(value)
    if isinstance(value, _PRIMITIVES):
        raise ValueError(f"save_hyperparameters() received {value!r}: Primitives {_PRIMITIVES} are not allowed as "  # noqa: TRY004 - Lightning raises ValueError here
                         "the hyper-parameters. Pass the names of init arguments as strings "
                         "(save_hyperparameters('lr')), or one dict / Namespace / OmegaConf config.")
    if isinstance(value, MutableMapping) or type(value).__module__.startswith("omegaconf"):
        return value
    raise ValueError(f"save_hyperparameters() received a {type(value).__name__}: Unsupported config type. Pass the "
                     "names of init arguments as strings, or one dict / Namespace / OmegaConf config.")


def _collect_init_args(frame: FrameType | None) -> dict[str, Any]:
    """Arguments of the ``__init__`` frames on the stack, the most derived class winning, as Lightning collects
    them: the frames of ``__init__`` methods of hyper-parameter-saving objects, from the
    caller outwards, the outer ones winning; so a module built inside another module's ``__init__`` also sees
    that one's arguments.
    Each frame's values are the arguments' current values (an argument reassigned before the call counts as
    reassigned); ``*args`` are dropped and ``**kwargs`` expanded."""
    per_frame: list[dict[str, Any]] = []
    inside = False
    while frame is not None and frame.f_back is not None:
        values = _init_args_of(frame)
        if values is not None:
            per_frame.append(values)
            inside = True
        elif inside:
            break
        frame = frame.f_back
    merged: dict[str, Any] = {}
    for values in per_frame:  # the caller's frame first, so an enclosing (derived class's) __init__ wins
        merged.update(values)
    return merged


def _init_args_of(frame: FrameType) -> dict[str, Any] | None:
    """The arguments of ``frame`` if it is an ``__init__`` of a hyper-parameter-saving object, else None."""
    if frame.f_code.co_name != "__init__":
        return None
    info = inspect.getargvalues(frame)
    if not info.args or not isinstance(info.locals.get(info.args[0]), HyperparametersMixin):
        return None
    values = {name: info.locals[name] for name in info.args[1:] if name in info.locals}
    if info.keywords:
        values.update(info.locals.get(info.keywords) or {})
    for skipped in ("__class__", "frame", "frame_args"):
        values.pop(skipped, None)
    return values


def drop_unpicklable(hparams: MutableMapping[str, Any]) -> None:
    """Remove, with Lightning's warning, the hyper-parameters that cannot be pickled (a lambda, an open file):
    a checkpoint could not hold them (Lightning does this at the start of each run; so does the Trainer).

    Example:
        >>> import warnings
        >>> hp = {"lr": 0.1, "fn": lambda x: x}
        >>> with warnings.catch_warnings(record=True):
        ...     drop_unpicklable(hp)
        >>> hp
        {'lr': 0.1}
    """
    import pickle

    plain = (str, int, float, bool, type(None))
    for key in [k for k, v in hparams.items() if not isinstance(v, plain) and not _picklable(v, pickle)]:
        warnings.warn(f"Attribute {key!r} removed from hparams because it cannot be pickled. You can suppress this "
                      f"warning by setting `self.save_hyperparameters(ignore=[{key!r}])`; pass it again to "
                      f"load_from_checkpoint(..., {key}=...) when loading.",
                      UserWarning, stacklevel=2)
        del hparams[key]


def _picklable(value: Any, pickle: Any) -> bool:
    try:
        pickle.dumps(value)
    except (pickle.PickleError, AttributeError, RuntimeError, TypeError):
        return False
    return True
