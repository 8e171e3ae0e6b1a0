"""torch.compile for trainer runs: ``fit(torch.compile(module))`` and ``Trainer(compile=True | {...})``.

The trainer never runs the ``OptimizedModule`` shell ``torch.compile(module)`` returns: it takes the module inside
(for hooks, ``self.log``, state and checkpoints) and compiles the *step functions* (``training_step`` & co., which
call ``forward``) with the same settings, inside the DDP / FSDP2 / autocast wrappers. Checkpoint keys never carry
``_orig_mod.`` (see ``TrainModule.state_dict``), so weights load into a compiled or uncompiled module alike.
"""

from __future__ import annotations

import inspect
import sys
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

import torch

Compiler = Callable[[Callable[..., Any]], Callable[..., Any]]
PREFIX = "_orig_mod."
STEP_NAMES = ("training_step", "validation_step", "test_step", "predict_step")


def check_compile(value: Any) -> dict[str, Any] | None:
    """``Trainer(compile=...)`` as ``torch.compile`` keyword arguments (``None``: no compilation).

    Example:
        >>> check_compile(True), check_compile({"backend": "aot_eager"}), check_compile(False)
        ({}, {'backend': 'aot_eager'}, None)
    """
    if value is None or value is False:
        return None
    if value is True:
        return {}
    if isinstance(value, Mapping):
        accepted = set(inspect.signature(torch.compile).parameters) - {"model"}
        unknown = sorted(set(value) - accepted)
        if unknown:
            raise ValueError(f"Trainer(compile={dict(value)!r}) has keys torch.compile does not take: {unknown}. "
                             f"It takes {sorted(accepted)}.")
        return dict(value)
    raise TypeError(f"Trainer(compile=...) takes True, False or a dict of torch.compile arguments (e.g. "
                    f"{{'mode': 'max-autotune'}}). Received: {value!r}.")


def unwrap_compiled(module: Any) -> tuple[Any, Compiler | None]:
    """The module inside a ``torch.compile(module)`` shell and a compiler with the shell's settings.

    A plain module comes back unchanged with ``None``.
    """
    dynamo = sys.modules.get("torch._dynamo")  # imported by torch.compile: a compiled module implies it
    if dynamo is None or not isinstance(module, dynamo.eval_frame.OptimizedModule):
        return module, None
    return module._orig_mod, module.dynamo_ctx


def take_compiled(module: Any, options: dict[str, Any] | None, check: Callable[[Any], Any]) -> tuple[Any, Any]:
    """``(check(the module), its step compiler)`` for a run: a ``torch.compile(module)`` shell's settings win over
    ``Trainer(compile=...)``'s ``options``."""
    module, compiler = unwrap_compiled(module)
    return check(module), compiler or compiler_from(options)


def compiler_from(kwargs: dict[str, Any] | None) -> Compiler | None:
    """A function compiling callables with ``torch.compile(**kwargs)`` (``None`` when ``kwargs`` is)."""
    if kwargs is None:
        return None

    def compile_step(fn: Callable[..., Any]) -> Callable[..., Any]:
        return torch.compile(fn, **kwargs)

    return compile_step


def plain_name(key: str) -> str:
    """``key`` without the ``_orig_mod`` level of a ``torch.compile`` shell: ``net._orig_mod.w`` -> ``net.w``."""
    return key.replace("._orig_mod", "").replace(PREFIX, "")


def strip_prefix(state: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``state`` (a ``state_dict`` being built) with the keys below ``prefix`` made plain, in place, order kept.

    Example:
        >>> list(strip_prefix({"net._orig_mod.weight": 1, "head.bias": 2}))
        ['net.weight', 'head.bias']
    """
    if not any("_orig_mod" in key for key in state):
        return state
    items = [(prefix + plain_name(key[len(prefix):]) if key.startswith(prefix) else key, value)
             for key, value in state.items()]
    state.clear()
    state.update(items)
    metadata = getattr(state, "_metadata", None)
    if metadata is not None:  # per-submodule versions, keyed by the submodule's name
        for key in [k for k in metadata if "_orig_mod" in k]:
            metadata[plain_name(key)] = metadata.pop(key)
    return state


def with_compiled_names(module: torch.nn.Module, state: Mapping[str, Any]) -> Mapping[str, Any]:
    """``state`` keyed by ``module``'s actual names: plain keys reach compiled submodules (``_orig_mod.``) and
    keys saved from a compiled module reach uncompiled ones."""
    compiled_here = any(name.endswith("_orig_mod") for name, _ in module.named_modules())
    if not compiled_here and not any("_orig_mod" in key for key in state):
        return state
    actual = {plain_name(key): key for key in torch.nn.Module.state_dict(module, keep_vars=True)}
    renamed: dict[str, Any] = OrderedDict((actual.get(plain_name(key), key), value) for key, value in state.items())
    metadata = getattr(state, "_metadata", None)
    if metadata is not None:
        renamed._metadata = metadata  # type: ignore[attr-defined]  # torch's state-dict convention, undeclared
    return renamed
