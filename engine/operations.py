"""Collectives and nested-structure helpers (Accelerate's ``utils.operations``) on plain ``torch.distributed``.

Every function accepts a tensor or a nested list/tuple/dict of tensors. In a single process they return their
input (``gather``) or a copy (``reduce``) without touching ``torch.distributed``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.distributed as dist

from engine.state import PartialState


class DistributedOperationException(Exception):
    """A collective was called with inputs that do not match across processes (checked in debug mode:
    ``PartialState().debug = True`` or ``ACCELERATE_DEBUG_MODE=1``)."""


def is_tensor_like(data: Any) -> bool:
    return isinstance(data, torch.Tensor)


def _rebuilt(mapping: Any, items: dict[Any, Any]) -> Any:
    """``items`` in a mapping of ``mapping``'s own class (dict, OrderedDict, a dict subclass such as a tokenizer's
    BatchEncoding), which takes a dict (``Mapping`` itself declares no constructor)."""
    return type(mapping)(items)


def recursively_apply(func: Callable[..., Any], data: Any, *args: Any, test_type: Callable[[Any], bool] = is_tensor_like,
                      error_on_other_type: bool = False, **kwargs: Any) -> Any:
    """Apply ``func`` to every leaf of ``data`` that passes ``test_type``, keeping the container types."""
    if isinstance(data, (tuple, list)):
        mapped = [recursively_apply(func, o, *args, test_type=test_type, error_on_other_type=error_on_other_type,
                                    **kwargs) for o in data]
        if isinstance(data, tuple) and hasattr(data, "_fields"):  # namedtuple
            return type(data)(*mapped)
        return type(data)(mapped)
    if isinstance(data, Mapping):
        return _rebuilt(data, {k: recursively_apply(func, v, *args, test_type=test_type,
                                                    error_on_other_type=error_on_other_type, **kwargs)
                               for k, v in data.items()})
    if test_type(data):
        return func(data, *args, **kwargs)
    if error_on_other_type:
        raise TypeError(f"Unsupported type {type(data).__name__} passed to `{func.__name__}`: only nested "
                        "lists/tuples/dicts of torch.Tensor are accepted. Use `gather_object` for Python objects.")
    return data


def send_to_device(data: Any, device: torch.device | str | int | None, non_blocking: bool = False,
                   skip_keys: list[str] | str | None = None) -> Any:
    """Move every tensor (or object with ``.to``) in a nested structure to ``device``.

    Runs on every batch: tensors are tested first, a tensor already on ``device`` is returned as is, and a
    list/tuple whose items are all already in place is returned itself (no new container).
    """
    if isinstance(data, torch.Tensor):
        if data.device == device or (data.device.type == "cpu" == getattr(device, "type", None)):
            return data  # ("cpu:0", the MULTI_CPU device, is the same memory as "cpu")
        return data.to(device, non_blocking=non_blocking)
    if isinstance(skip_keys, str):
        skip_keys = [skip_keys]
    if isinstance(data, (tuple, list)):
        # The usual batch, a tuple of tensors already in place, is checked in this one call.
        cpu = getattr(device, "type", device) == "cpu"
        for item in data:
            if not isinstance(item, torch.Tensor) or not (item.is_cpu if cpu else item.device == device):
                break
        else:
            return data
        moved = [send_to_device(t, device, non_blocking, skip_keys) for t in data]
        if all(m is d for m, d in zip(moved, data)):
            return data
        return type(data)(*moved) if hasattr(data, "_fields") else type(data)(moved)
    if isinstance(data, Mapping):
        skip = skip_keys or ()
        return _rebuilt(data, {k: v if k in skip else send_to_device(v, device, non_blocking, skip_keys)
                               for k, v in data.items()})
    to = getattr(data, "to", None)
    if callable(to):
        try:
            return to(device, non_blocking=non_blocking)
        except TypeError:
            return to(device)
    return data


def find_device(data: Any) -> torch.device | None:
    """The device of the first tensor in a nested list/tuple/dict (None when there is no tensor)."""
    if isinstance(data, Mapping):
        data = list(data.values())
    if isinstance(data, (tuple, list)):
        for item in data:
            device = find_device(item)
            if device is not None:
                return device
        return None
    return data.device if isinstance(data, torch.Tensor) else None


def _verify_operation(tensor: Any, operation: str, ndim_only: bool = False) -> None:
    """In debug mode, raise ``DistributedOperationException`` on every rank when the inputs of a collective do not
    match across processes (shapes, or only the number of dimensions with ``ndim_only``), or sit on another device
    type than the process's. Outside debug mode a mismatch hangs, aborts or silently mixes data, as in torch.

    Every rank exchanges what it has before any rank decides, so all of them raise the same error (Accelerate
    raises the device error on the offending rank only, and the others wait forever).
    """
    state = PartialState()
    if not (state.use_distributed and state.debug):
        return
    shapes = recursively_apply(lambda t: list(t.shape), tensor)
    ndims = recursively_apply(lambda t: t.ndim, tensor)
    device = find_device(tensor)
    mine = (shapes, None if device is None else device.type, ndims)
    everyone: list[Any] = [None] * state.num_processes
    dist.all_gather_object(everyone, mine)
    name = f"engine.operations.{operation}"
    wrong_device = [i for i, (_, kind, _) in enumerate(everyone) if kind not in (None, state.device.type)]
    if wrong_device:
        detail = "\n  - ".join(f"Process {i}: {everyone[i][1]}" for i in wrong_device)
        raise DistributedOperationException(
            f"One or more of the tensors passed to `{name}` were not on {state.device.type}, the device type this "
            f"process group is configured for:\n  - {detail}\nMove them with `.to(accelerator.device)` before "
            f"calling `{operation}`.")
    if ndim_only:
        same = all(n == everyone[0][2] for _, _, n in everyone)
        hint = (f"`{operation}` pads one dimension; every process must pass tensors with the same number of "
                "dimensions (and the same structure).")
    else:
        same = all(s == everyone[0][0] for s, _, _ in everyone)
        hint = "Pad them first with `pad_across_processes`, or make every process pass the same shapes."
    if not same:
        detail = "\n  - ".join(f"Process {i}: {s}" for i, (s, _, _) in enumerate(everyone))
        raise DistributedOperationException(
            "Cannot apply desired operation due to shape mismatches. All shapes across devices must be valid.\n\n"
            f"Operation: `{name}`\nInput shapes:\n  - {detail}\n{hint}")


def _gather_one(tensor: torch.Tensor, group: Any = None) -> torch.Tensor:
    if tensor.ndim == 0:
        tensor = tensor.clone()[None]
    if not tensor.is_contiguous():
        tensor = tensor.contiguous()
    state = PartialState()
    size = state.num_processes if group is None else dist.get_world_size(group)
    if state.backend == "gloo":
        parts = [torch.empty_like(tensor) for _ in range(size)]
        dist.all_gather(parts, tensor, group=group)
        return torch.cat(parts, dim=0)
    out = torch.empty((size * tensor.shape[0], *tensor.shape[1:]), dtype=tensor.dtype, device=tensor.device)
    dist.all_gather_into_tensor(out, tensor, group=group)
    return out


def gather(tensor: Any, group: Any = None) -> Any:
    """Concatenate ``tensor`` from every process (or those of ``group``) along dim 0, in rank order (0-d tensors
    become 1-d).

    In a single process the input is returned unchanged.
    """
    state = PartialState()
    if not state.use_distributed:
        return tensor
    _verify_operation(tensor, "gather")
    return recursively_apply(_gather_one, tensor, group=group, error_on_other_type=True)


def gather_object(obj: Any, group: Any = None) -> list[Any]:
    """Gather a picklable iterable from every process (or those of ``group``) and flatten one level: ``[0, 'x']``
    x 2 ranks -> 4 items."""
    state = PartialState()
    if not state.use_distributed:
        return obj
    everyone: list[Any] = [None] * (state.num_processes if group is None else dist.get_world_size(group))
    dist.all_gather_object(everyone, obj, group=group)
    flat: list[Any] = []
    for rank, part in enumerate(everyone):
        try:
            flat.extend(part)
        except TypeError:
            raise TypeError(f"gather_object needs an iterable on every process (it flattens one level); process "
                            f"{rank} passed {type(part).__name__}: wrap it in a list, e.g. `[value]`.") from None
    return flat


_REDUCTIONS = ("sum", "mean", "max", "min", "none")


def reduce(tensor: Any, reduction: str = "mean", scale: float = 1.0) -> Any:
    """All-reduce ``tensor`` (``"sum"``, ``"mean"``, ``"max"``, ``"min"``); ``"none"`` returns it unchanged.

    ``scale`` is accepted for Accelerate compatibility, where it applies on XLA only: it has no effect here.
    """
    if reduction not in _REDUCTIONS:
        raise ValueError(f"reduce(reduction={reduction!r}) is not one of {_REDUCTIONS}.")
    if reduction == "none":
        return tensor  # documented behaviour (Accelerate sums anyway)
    state = PartialState()

    def one(t: torch.Tensor) -> torch.Tensor:
        out = t.clone()
        if state.use_distributed:
            op = {"max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}.get(reduction, dist.ReduceOp.SUM)
            dist.all_reduce(out, op=op)
            if reduction == "mean":
                out /= state.num_processes
        return out

    _verify_operation(tensor, "reduce")
    return recursively_apply(one, tensor, error_on_other_type=True)


def broadcast(tensor: Any, from_process: int = 0) -> Any:
    """Copy ``tensor`` from ``from_process`` into every process's tensor, in place; returns it."""
    state = PartialState()
    if not state.use_distributed:
        return tensor

    def one(t: torch.Tensor) -> torch.Tensor:
        dist.broadcast(t, src=from_process)
        return t

    _verify_operation(tensor, "broadcast")
    return recursively_apply(one, tensor, error_on_other_type=True)


def wait_for_everyone() -> None:
    """Barrier across all processes (``PartialState().wait_for_everyone()``); a no-op in a single process."""
    PartialState().wait_for_everyone()


def broadcast_object_list(object_list: list[Any], from_process: int = 0) -> list[Any]:
    """Replace the items of ``object_list`` on every process by those of ``from_process``; returns the list."""
    state = PartialState()
    if state.use_distributed:
        dist.broadcast_object_list(object_list, src=from_process)
    return object_list


def copy_tensor_to_devices(tensor: torch.Tensor | None = None) -> torch.Tensor:
    """Send a tensor that exists on one process (``None`` on the others) to every process.

    Unlike ``broadcast``, the receiving processes need not know its shape or dtype. Exactly one process must pass a
    tensor (Accelerate sums the tensors when several do; here that is an error on every rank).

    >>> copy_tensor_to_devices(torch.tensor([1, 2, 3]))
    tensor([1, 2, 3])
    """
    state = PartialState()
    if not state.use_distributed:
        if tensor is None:
            raise ValueError("copy_tensor_to_devices(None) in a single process: there is no other process to copy "
                             "the tensor from. Pass the tensor.")
        return tensor
    everyone: list[Any] = [None] * state.num_processes
    dist.all_gather_object(everyone, None if tensor is None else (tuple(tensor.shape), tensor.dtype))
    owners = [rank for rank, info in enumerate(everyone) if info is not None]
    if len(owners) != 1:
        raise ValueError(f"copy_tensor_to_devices needs a tensor on exactly one process and None on the others; "
                         f"processes {owners} passed a tensor. Pass None on every process but the source.")
    shape, dtype = everyone[owners[0]]
    if tensor is None:
        tensor = torch.empty(shape, dtype=dtype, device=state.device)
    else:
        tensor = tensor.to(state.device).contiguous()
    dist.broadcast(tensor, src=owners[0])
    return tensor


def pad_across_processes(tensor: Any, dim: int = 0, pad_index: int = 0, pad_first: bool = False) -> Any:
    """Pad every tensor along ``dim`` to the largest size across processes so they can be gathered."""
    state = PartialState()

    def one(t: torch.Tensor) -> torch.Tensor:
        if dim >= t.ndim or dim < -t.ndim or not state.use_distributed:
            return t
        size = torch.tensor(t.shape, device=t.device)[None]
        sizes = _gather_one(size)
        longest = int(sizes[:, dim].max())
        if longest == t.shape[dim]:
            return t
        new_shape = list(t.shape)
        new_shape[dim] = longest
        out = t.new_full(new_shape, pad_index)
        index = [slice(None)] * t.ndim
        index[dim] = slice(longest - t.shape[dim], longest) if pad_first else slice(0, t.shape[dim])
        out[tuple(index)] = t
        return out

    # Sizes may differ along `dim`, but every process must take part in the same size exchanges.
    _verify_operation(tensor, "pad_across_processes", ndim_only=True)
    return recursively_apply(one, tensor, error_on_other_type=True)


def concatenate(data: list[Any], dim: int = 0) -> Any:
    """Concatenate a list of (nested) batches along ``dim``; batches of different shapes raise naming them."""
    first = data[0]
    if isinstance(first, (tuple, list)):
        return type(first)(concatenate([d[i] for d in data], dim=dim) for i in range(len(first)))
    if isinstance(first, Mapping):
        return _rebuilt(first, {k: concatenate([d[k] for d in data], dim=dim) for k in first})
    if not isinstance(first, torch.Tensor):
        raise TypeError(f"Can only concatenate tensors, got {type(first).__name__}.")
    shapes = [tuple(d.shape) for d in data]
    if any(s[:dim] + s[dim + 1:] != shapes[0][:dim] + shapes[0][dim + 1:] for s in shapes):
        raise RuntimeError(f"Cannot concatenate dispatched batches of different shapes {shapes}: make the batches "
                           "the same shape (pad in collate_fn), or use dispatch_batches=False.")
    return torch.cat(data, dim=dim)


def find_batch_size(data: Any) -> int | None:
    """The size of dim 0 of the first tensor found in a nested batch."""
    if isinstance(data, (tuple, list)):
        for item in data:
            size = find_batch_size(item)
            if size is not None:
                return size
        return None
    if isinstance(data, Mapping):
        for item in data.values():
            size = find_batch_size(item)
            if size is not None:
                return size
        return None
    if isinstance(data, torch.Tensor):
        return int(data.shape[0]) if data.ndim > 0 else None
    return None


def _holds_structures(items: list[Any] | tuple[Any, ...]) -> bool:
    return any(isinstance(item, (torch.Tensor, Mapping, list, tuple)) for item in items)


def sample_count(data: Any) -> int | None:
    """Samples in a nested batch (or a step's output): dim 0 of its first tensor with a dim, or the length of a
    list of plain values (strings, ids); None when nothing tells.

    Example:
        >>> sample_count({"ids": ["a", "b", "c"]}), sample_count((torch.tensor(1.0), torch.zeros(4, 2)))
        (3, 4)
    """
    if isinstance(data, torch.Tensor):
        return int(data.shape[0]) if data.ndim else None
    if isinstance(data, Mapping):
        return next((c for c in map(sample_count, data.values()) if c is not None), None)
    if isinstance(data, (list, tuple)):
        if _holds_structures(data):
            return next((c for c in map(sample_count, data) if c is not None), None)
        return len(data)
    return None


def first_samples(data: Any, keep: int, size: int | None = None) -> Any:
    """The first ``keep`` samples of every per-sample part of a nested batch (or a step's output).

    Per-sample parts are tensors with a dim (cut along dim 0) and lists of plain values (strings, ids); 0-d
    tensors, named tuples of plain values and other objects are kept whole. With ``size`` (the batch's sample
    count), only parts of exactly ``size`` samples are cut, so a part that is not per-sample stays as it is.
    Containers keep their types (named tuples included).

    Example:
        >>> first_samples((torch.arange(4), ["a", "b", "c", "d"], torch.tensor(7)), 1)
        (tensor([0]), ['a'], tensor(7))
        >>> first_samples({"x": torch.arange(4), "table": torch.arange(6)}, 2, size=4)
        {'x': tensor([0, 1]), 'table': tensor([0, 1, 2, 3, 4, 5])}
    """
    if isinstance(data, torch.Tensor):
        return data[:keep] if data.ndim and (size is None or data.shape[0] == size) else data
    if isinstance(data, Mapping):
        return _rebuilt(data, {k: first_samples(v, keep, size) for k, v in data.items()})
    if isinstance(data, (list, tuple)):
        named = hasattr(data, "_fields")
        if not _holds_structures(data):  # one plain value per sample
            return data if named or (size is not None and len(data) != size) else type(data)(data[:keep])
        items = [first_samples(item, keep, size) for item in data]
        return type(data)(*items) if named else type(data)(items)
    return data


def gather_for_metrics(input_data: Any, use_gather_object: bool, group: Any, remainder: int) -> Any:
    """``gather`` over ``group`` (``"local"``: this process holds every result already), then only the first
    ``remainder`` samples when it is positive: the last batch's true size, before the sharded loader padded it
    with duplicates (-1 when unknown or not at the end of a loader, 0 when nothing was padded)."""
    try:
        recursively_apply(lambda x: x, input_data, error_on_other_type=True)
        all_tensors = True
    except TypeError:
        all_tensors = False
    use_gather_object = use_gather_object or not all_tensors
    if group == "local":
        data = input_data
    else:
        data = gather_object(input_data, group=group) if use_gather_object else gather(input_data, group=group)
    if remainder <= 0:
        return data
    if use_gather_object:
        return data[:remainder]
    # A 0-d tensor is only ever left so by a single process's gather, where nothing was padded.
    return first_samples(data, remainder)


def convert_outputs_to_fp32(data: Any) -> Any:
    """Cast every fp16/bf16 tensor in a model's output to fp32 (the autocast forward wrapper's last step)."""
    def to_fp32(t: torch.Tensor) -> torch.Tensor:
        return t.float() if t.dtype in (torch.float16, torch.bfloat16) else t

    return recursively_apply(to_fp32, data)
