"""Let go of DeepSpeed's references to the process groups when the engine destroys them (issue 39, item 3).

``destroy_process_group`` only drops torch's own registry entries: a gloo group is really closed, and its threads
(``gloo_tcp_loop``, ``pt_gloo_runloop``) end, when the last reference goes. DeepSpeed keeps its groups in many
places (seen with deepspeed 0.19.8, ZeRO-2 on gloo): ``deepspeed.utils.groups._WORLD_GROUP``, the engine's
``data_parallel_group`` / ``seq_data_parallel_group``, the ZeRO optimizer's ``dp_process_group`` /
``real_dp_process_group``, and every parameter's ``_dp_group``. An engine kept as a script's global until
interpreter shutdown then keeps two groups, and four gloo threads, running while the C++ static destructors run,
which aborts the process ("terminate called without an active exception") in a fraction of exits.

Also held: the default arguments of ``deepspeed.comm.torch.TorchBackend.barrier`` / ``monitored_barrier``
(``group=GroupMember.WORLD``, evaluated when DeepSpeed is imported, after the group exists). The release below
sets every attribute and default argument that holds a group (or a list of them) to ``None`` / an empty list,
after the groups are destroyed: by attribute *type*, not name, so a DeepSpeed that renames or adds one
is covered too. The engine is not usable for collectives afterwards, exactly like the destroyed groups.
"""

from __future__ import annotations

import contextlib
import gc
import sys
import weakref
from collections.abc import Iterable
from typing import Any

import torch.distributed as dist

from engine.state import PartialState

# The DeepSpeed engines prepared in this process: weak, so that an engine deleted early is not kept.
_ENGINES: weakref.WeakSet[Any] = weakref.WeakSet()  # DeepSpeedEngines (deepspeed ships no types)
_GROUP_MODULES = ("deepspeed.utils.groups", "deepspeed.comm.comm", "deepspeed.comm.torch")


def track_engine(engine: Any) -> None:
    """Release ``engine``'s references to the process groups when they are destroyed."""
    _ENGINES.add(engine)
    PartialState.register_teardown(release_deepspeed_groups)


def release_deepspeed_groups() -> None:
    """Drop every reference the tracked engines (and DeepSpeed's module globals) hold to a process group."""
    for engine in list(_ENGINES):
        with contextlib.suppress(Exception):
            for parameter in engine.module.parameters():
                _drop_groups(vars(parameter))
    _ENGINES.clear()
    # DeepSpeed's own objects, wherever they are reachable from: the engine, its ZeRO optimizer and ZeRO-3's
    # parameter offload, the zero.Init context that partitioned the parameters (held by their closures), ...
    for obj in gc.get_objects():
        module = vars(type(obj)).get("__module__")  # a class's own entry (a descriptor on some C types)
        if isinstance(module, str) and module.startswith("deepspeed"):
            namespace = getattr(obj, "__dict__", None)
            if isinstance(namespace, dict):
                _drop_groups(namespace)
    for name in _GROUP_MODULES:
        module = sys.modules.get(name)
        if module is not None:
            _drop_groups(vars(module))
            for value in list(vars(module).values()):
                _drop_default_groups(value)
                if isinstance(value, type) and value.__module__ == name:
                    for member in list(vars(value).values()):
                        _drop_default_groups(member)


def _drop_default_groups(function: Any) -> None:
    """A default argument evaluated at import: ``TorchBackend.barrier(group=GroupMember.WORLD)`` holds the default
    group when DeepSpeed was imported after ``init_process_group`` (as the engine imports it). ``None`` means the
    default group to every torch collective, so the defaults keep their meaning."""
    defaults = getattr(function, "__defaults__", None)
    if defaults and any(_is_group(value) for value in defaults):
        function.__defaults__ = tuple(None if _is_group(value) else value for value in defaults)
    keyword_defaults = getattr(function, "__kwdefaults__", None)
    if keyword_defaults:
        _drop_groups(keyword_defaults)


def _drop_groups(namespace: dict[str, Any]) -> None:
    for key, value in list(namespace.items()):
        if _is_group(value):
            namespace[key] = None
        elif isinstance(value, list) and value and all(_is_group(item) for item in value):
            namespace[key] = []
        elif isinstance(value, dict) and value and _all_groups(value.values()):
            namespace[key] = {}


def _all_groups(values: Iterable[Any]) -> bool:
    return all(_is_group(value) for value in values)


def _is_group(value: Any) -> bool:
    return isinstance(value, dist.ProcessGroup)
