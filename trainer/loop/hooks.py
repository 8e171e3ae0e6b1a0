"""`HookTable`: which callbacks and module methods override each hook, resolved once per run.

Resolving overrides up front means a hook nobody overrides costs one dict lookup and an empty loop per call,
instead of a Python call into every callback.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

from callbacks.base import HOOK_NAMES, Callback

# Lightning 2.6's order at the epoch ends: callbacks, then the module; at the training epoch's end a callback that
# declares ``epoch_end_after_module`` (ModelCheckpoint, EarlyStopping) comes after the module, so it sees what the
# module logged there.
EPOCH_END_HOOKS = frozenset({"on_train_epoch_end", "on_validation_epoch_end", "on_test_epoch_end",
                             "on_predict_epoch_end"})
# Hooks only a module has (Lightning's ModelHooks): the evaluation runs' eval / train mode switches.
MODULE_ONLY_HOOKS = ("on_validation_model_eval", "on_validation_model_train", "on_test_model_eval",
                     "on_test_model_train", "on_predict_model_eval")


class HookTable:
    """Calls one hook on the callbacks that override it, then on the module if it overrides it.

    Args:
        trainer: passed as the first argument of every callback hook.
        module: passed as the second argument of every callback hook; its own hooks are called without both.
        callbacks: in calling order.
        module_base: the class whose hook methods count as "not overridden" (``TrainModule``).
        profiler: a ``trainer.profiling.Profiler``: every overrider is then timed as ``[Callback]{class}.{hook}``
            / ``[LightningModule]{class}.{hook}``, and the loops read it here to time their steps.

    Example:
        >>> class Echo(Callback):
        ...     def on_fit_start(self, trainer, module):
        ...         print("fit starts", trainer, module)
        >>> HookTable("T", object(), [Echo(), Callback()], module_base=object).call("on_fit_start")  # doctest: +ELLIPSIS
        fit starts T <object object at ...>
    """

    def __init__(self, trainer: Any, module: Any, callbacks: Sequence[Callback], module_base: type,
                 profiler: Any = None) -> None:
        self.profiler = profiler  # a trainer.profiling.Profiler timing every hook call, or None
        self._callbacks: dict[str, tuple[Callable[..., Any], ...]] = {}
        self._module: dict[str, Callable[..., Any] | None] = {}
        # Every overrider of each hook in calling order (callbacks, then the module), each taking the hook's own
        # arguments: the per-step hooks loop over these tuples directly, which costs nothing when one is empty.
        self.overriders: dict[str, tuple[Callable[..., Any], ...]] = {}
        # Asked only of callbacks that declare it (a recording wrapper of the base method is no declaration).
        # A Mock callback declares nothing (its answer is another Mock).
        skipped = [frozenset(cb.skipped_hooks) if type(cb).__module__ != "unittest.mock" else frozenset()
                   for cb in callbacks]
        # The callback behind each hook (a hook may be a plain function set on the instance: LambdaCallback).
        self._owners: dict[str, tuple[Callback, ...]] = {}
        for name in (*HOOK_NAMES, *MODULE_ONLY_HOOKS):  # a callback never overrides the module-only ones
            self._owners[name] = tuple(cb for cb, skip in zip(callbacks, skipped)
                                       if overrides(cb, Callback, name) and name not in skip)
            self._callbacks[name] = tuple(functools.partial(getattr(cb, name), trainer, module)
                                          for cb in self._owners[name])
            self._module[name] = getattr(module, name) if overrides(module, module_base, name) else None
            if profiler is not None and profiler.records:  # each overrider timed under its own action name (Lightning's naming)
                self._callbacks[name] = tuple(profiler.wrap(f"[Callback]{type(cb).__name__}.{name}", hook)
                                              for cb, hook in zip(self._owners[name], self._callbacks[name]))
                if self._module[name] is not None:
                    action = f"[LightningModule]{type(module).__name__}.{name}"  # Lightning's label
                    self._module[name] = profiler.wrap(action, self._module[name])
            module_hook = self._module[name]
            self.overriders[name] = self._callbacks[name] + ((module_hook,) if module_hook else ())

    def call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """Callbacks, then the module; returns what the module's hook returned (``None`` if not overridden).
        ``kwargs``: arguments Lightning passes by name (``setup(stage=...)``, ``teardown(stage=...)``)."""
        for hook in self._callbacks[name]:
            hook(*args, **kwargs)
        module_hook = self._module[name]
        return None if module_hook is None else module_hook(*args, **kwargs)

    def call_module(self, name: str, *args: Any) -> Any:
        module_hook = self._module[name]
        return None if module_hook is None else module_hook(*args)

    def call_callbacks(self, name: str, *args: Any, after_module: bool | None = None) -> None:
        """The callbacks' ``name`` hook; ``after_module`` True / False: only the callbacks whose
        ``epoch_end_after_module`` is True / False (``None``: all)."""
        for owner, hook in zip(self._owners[name], self._callbacks[name]):
            if after_module is None or owner.epoch_end_after_module == after_module:
                hook(*args)

    def has(self, name: str) -> bool:
        """Whether anything overrides ``name``."""
        return bool(self._callbacks[name]) or self._module[name] is not None


def overrides_unwrapped(obj: Any, base: type, name: str) -> bool:
    """``overrides``, except that an instance wrapper of the object's own method (``functools.wraps`` /
    ``update_wrapper``: a recording or timing wrapper) counts only if that method does, as Lightning's
    ``is_overridden`` reads it."""
    wrapped = getattr(getattr(obj, "__dict__", {}).get(name), "__wrapped__", None)
    if wrapped is not None and getattr(wrapped, "__self__", None) is obj:
        return getattr(type(obj), name, None) is not getattr(base, name, None)
    return overrides(obj, base, name)


def overrides(obj: Any, base: type, name: str) -> bool:
    """Whether ``obj`` defines ``name`` differently from ``base`` (or ``base`` lacks it): its class does, or the
    instance holds its own value. ``model.validation_step = None`` switches a step (or hook) off, as in Lightning.

    Example:
        >>> class Base:
        ...     def validation_step(self): ...
        >>> class Model(Base):
        ...     def validation_step(self): ...
        >>> model = Model()
        >>> overrides(model, Base, "validation_step"), overrides(Base(), Base, "validation_step")
        (True, False)
        >>> model.validation_step = None
        >>> overrides(model, Base, "validation_step")
        False
    """
    instance = getattr(obj, "__dict__", {})
    if name in instance:
        return instance[name] is not None
    if hasattr(base, name) and (type(obj).__module__ == "unittest.mock" or
                                type(getattr(type(obj), name, None)).__module__ == "unittest.mock"):
        return True  # a Mock callback (spec=Callback), or a hook patched on the class: called, as Lightning does
    own = getattr(type(obj), name, None)
    if own is None:
        return False
    return own is not getattr(base, name, None)
