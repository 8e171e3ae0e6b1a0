"""What ``TrainModule.log`` records: step values, epoch aggregates, and what goes to the trackers when.

Values stay (detached) tensors on their device until a log interval or an epoch ends, so logging costs no host
sync per step. Epoch aggregates are folded every ``_FOLD_EVERY`` values (one stack per metric), which bounds
memory on long epochs without a tensor op per step.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch

from callbacks.exceptions import MisconfigurationException

ReduceFx = str | Callable[[torch.Tensor], torch.Tensor]
_REDUCE_NAMES = ("mean", "sum", "max", "min")
_TORCH_REDUCE = {torch.mean: "mean", torch.sum: "sum", torch.max: "max", torch.min: "min"}
_FOLD_EVERY = 64
# Lightning's defaults: per step inside training batches, per epoch everywhere else.
_STEP_STAGES = {"train"}
_LOGGING_STAGES = ("train", "validate", "test", "sanity_check")
# Evaluation epoch values are reduced across processes unless the user says sync_dist=False (promise 8).
_EXACT_STAGES = {"validate", "test", "sanity_check"}
# What a batch made only of padding repeats adds to an epoch aggregate: nothing.
_NEUTRAL = {"mean": 0.0, "sum": 0.0, "max": float("-inf"), "min": float("inf")}


class LogOptions(NamedTuple):
    """How one ``self.log`` call records its value (see ``TrainModule.log`` for each option's meaning)."""

    prog_bar: bool = False
    logger: bool = True
    on_step: bool | None = None
    on_epoch: bool | None = None
    reduce_fx: ReduceFx = "mean"
    sync_dist: bool | None = None
    batch_size: int | None = None
    enable_graph: bool = False
    add_dataloader_idx: bool = True


DEFAULT_OPTIONS = LogOptions()


@dataclass(eq=False)
class _Metric:
    """One logged name within one stage, with its options and its values so far."""

    name: str
    options: tuple[Any, ...]
    prog_bar: bool
    logger: bool
    on_step: bool
    on_epoch: bool
    reduce: str  # "mean" | "sum" | "max" | "min" | "custom"
    reduce_fn: Callable[[torch.Tensor], torch.Tensor] | None
    sync_dist: bool  # the epoch value is reduced across processes
    sync_step: bool  # each step value is reduced when logged (only when sync_dist=True was asked for)
    step_key: str
    epoch_key: str
    step_value: Any = None
    step_fresh: bool = False
    values: list[Any] = field(default_factory=list)
    weights: list[float] = field(default_factory=list)
    total: torch.Tensor | None = None
    weight: float = 0.0
    dirty: bool = False  # epoch values were added since the last end_epoch
    metric: Any = None  # a torchmetrics Metric logged under this name: it accumulates and syncs its own state
    metric_reset: bool = False  # the Metric was reset after this epoch's end hooks already
    dataloader_idx: int | None = None  # the evaluation loader it was first logged in (several loaders), else None

    def fold(self) -> None:
        """Fold the buffered values into ``total`` (a custom reduction keeps every value instead)."""
        if not self.values or self.reduce == "custom":
            return
        stacked = _stack(self.values)
        if self.reduce == "mean":
            weights = torch.tensor(self.weights, dtype=stacked.dtype, device=stacked.device)
            part = (stacked * weights).sum()
            self.weight += sum(self.weights)
        elif self.reduce == "sum":
            part = stacked.sum()
        elif self.reduce == "max":
            part = stacked.max()
        else:
            part = stacked.min()
        if self.total is None:
            self.total = part
        elif self.reduce in ("mean", "sum"):
            self.total = self.total + part
        else:
            self.total = torch.maximum(self.total, part) if self.reduce == "max" else torch.minimum(self.total, part)
        self.values.clear()
        self.weights.clear()

    def reset_epoch(self) -> None:
        self.values.clear()
        self.weights.clear()
        self.total, self.weight, self.dirty = None, 0.0, False
        if self.metric is not None and not self.metric_reset:  # once per epoch end, as Lightning
            self.metric.reset()
        self.metric_reset = False


class MetricLogger:
    """The trainer's record of ``self.log`` calls (Lightning's ``ResultCollection`` plus logger connector).

    The trainer sets ``stage`` / ``in_epoch_hook`` / ``batch`` as it runs; the module's ``log`` calls ``log``.
    ``reduce`` is the engine's all-reduce (``accelerator.reduce``) and ``gather`` its all-gather.

    Example:
        >>> metrics = MetricLogger(num_processes=1, reduce=None, gather=None)
        >>> metrics.set_stage("validate")
        >>> metrics.new_batch(torch.zeros(4, 2))
        4
        >>> metrics.log("acc", torch.tensor(1.0))
        >>> metrics.new_batch(torch.zeros(2, 2))
        2
        >>> metrics.log("acc", torch.tensor(0.25))
        >>> round(float(metrics.end_epoch()["acc"]), 4)  # (4 * 1.0 + 2 * 0.25) / 6
        0.75
    """

    def __init__(self, num_processes: int, reduce: Callable[[torch.Tensor, str], torch.Tensor] | None,
                 gather: Callable[[torch.Tensor], torch.Tensor] | None) -> None:
        self.num_processes = num_processes
        self._reduce = reduce
        self._gather = gather
        self.stage = "idle"
        self.in_epoch_hook = False
        self.dataloader_suffix = ""
        self.dataloader_idx: int | None = None  # the evaluation loader running, when there are several
        self.batch: Any = None
        self._batch_size: int | None = None
        self._padding = False  # the current batch holds only samples repeated to even out processes
        self._default_on_step = False
        self._default_on_epoch = True
        self._stages: dict[str, dict[str, _Metric]] = {}
        self._records: dict[str, _Metric] = {}
        self.callback_metrics: dict[str, Any] = {}
        self.progress_bar_metrics: dict[str, Any] = {}
        self.logged_metrics: dict[str, Any] = {}

    # -- what the trainer tells it ----------------------------------------------------------------------------
    def set_stage(self, stage: str, fresh: bool = True) -> None:
        """Switch to ``stage``; ``fresh`` starts its records anew (each validation run), else keeps them."""
        self.stage = stage
        if fresh or stage not in self._stages:
            for record in self._stages.get(stage, {}).values():
                if record.metric is not None:  # a new run of the stage starts its Metric objects afresh
                    record.metric.reset()
            self._stages[stage] = {}
        self._records = self._stages[stage]
        self._update_defaults()

    def set_epoch_hook(self, in_epoch_hook: bool) -> None:
        """Inside an epoch-level training hook, ``self.log`` defaults to per-epoch values."""
        self.in_epoch_hook = in_epoch_hook
        self._update_defaults()

    def new_batch(self, batch: Any, padding: bool = False) -> int:
        """The batch the next ``log`` calls belong to; returns its size (see ``batch_size``).

        ``padding``: the batch holds only samples repeated to give every process as many batches (see
        ``trainer.evaluation.exact``); what is logged for it does not count in the epoch values.
        """
        self.batch = batch
        self._padding = padding
        # batch_size's fast path, inlined: this runs once per training batch.
        first = batch[0] if isinstance(batch, (tuple, list)) and batch else None
        size = first.shape[0] if isinstance(first, torch.Tensor) and first.ndim else batch_size(batch)
        self._batch_size = size
        return size

    def _update_defaults(self) -> None:
        per_step = self.stage in _STEP_STAGES and not self.in_epoch_hook
        self._default_on_step, self._default_on_epoch = per_step, not per_step

    # -- the module's log -------------------------------------------------------------------------------------
    def log(self, name: str, value: Any, options: LogOptions = DEFAULT_OPTIONS) -> None:
        """Record ``value`` under ``name`` as ``options`` say (``TrainModule.log`` builds them)."""
        prog_bar, logger, on_step, on_epoch, reduce_fx, sync_dist, batch_size, enable_graph, add_dataloader_idx = \
            options
        if on_step is None:
            on_step = self._default_on_step
        if on_epoch is None:
            on_epoch = self._default_on_epoch
        suffix = self.dataloader_suffix if add_dataloader_idx else ""
        key = name + suffix
        # A lambda written inline is a new object at every call; its code object identifies it.
        reduce_key = reduce_fx if type(reduce_fx) is str else getattr(reduce_fx, "__code__", reduce_fx)
        record_options = (prog_bar, logger, on_step, on_epoch, reduce_key, sync_dist)
        record = self._records.get(key)
        if record is None or record.options != record_options:
            record = self._register(key, record_options, reduce_fx, suffix)
        if type(value) is not torch.Tensor and is_torchmetric(value):
            self._log_metric_object(record, value, enable_graph)
            return
        if isinstance(value, torch.Tensor):
            if value.ndim:  # a 0-d tensor (the usual loss) is a scalar: numel() is only asked of the others
                if value.numel() != 1:
                    raise ValueError(f"self.log({name!r}, value) needs a scalar; got a tensor of shape "
                                     f"{tuple(value.shape)}. Reduce it (e.g. .mean()) or log its parts under "
                                     "separate names.")
                value = value.reshape(())
            if not enable_graph:
                value = value.detach()
        elif not isinstance(value, (int, float)):
            raise LogValueError(f"`self.log({name}, {value})` was called, but `{type(value).__name__}` values cannot "
                                f"be logged: self.log({name!r}, value) takes a number or a one-element tensor. Log "
                                "several values with self.log_dict.")
        else:  # as Lightning: a number becomes a tensor of the default dtype (callback_metrics[...].item() works)
            value = torch.tensor(float(value), dtype=torch.get_default_dtype())
        if on_step:
            if record.sync_step and self.num_processes > 1:
                value = self._sync_step_value(record, value)
            record.step_value = value
            record.step_fresh = True
            if self.stage not in _EXACT_STAGES:  # as Lightning: evaluation step values reach the trackers and the
                self.callback_metrics[record.step_key] = value  # bar, never callback_metrics (epoch values do)
                if on_epoch:
                    self.callback_metrics[record.name] = value
            if prog_bar:
                self.progress_bar_metrics[record.step_key] = value
        if on_epoch:
            record.dirty = True
            if self._padding:
                if record.reduce == "custom":
                    return  # a custom reduction sees only real values (gathered with their count)
                value = torch.full_like(value, _NEUTRAL[record.reduce]) if isinstance(value, torch.Tensor) \
                    else _NEUTRAL[record.reduce]
            record.values.append(value)
            if record.reduce == "mean":
                weight = batch_size if batch_size is not None else self._current_batch_size()
                record.weights.append(0 if self._padding else weight)
            if len(record.values) >= _FOLD_EVERY:
                record.fold()

    def _log_metric_object(self, record: _Metric, metric: Any, enable_graph: bool) -> None:
        """A torchmetrics ``Metric``, as in Lightning: the value of its last ``forward`` per step, ``compute()`` at
        the epoch end (``reset()`` after the epoch-end hooks); the Metric syncs its own state, so ``sync_dist`` is
        not applied again."""
        # Only a sync_dist=True the user wrote: evaluation's default (None, exact across processes) is not theirs.
        if record.sync_step and record.metric is None:
            warnings.warn(f"self.log({record.name!r}, <{type(metric).__name__}>, sync_dist=True): a torchmetrics "
                          "Metric syncs its own state across processes in compute(), so sync_dist is not applied "
                          "to it (it would sync twice). Drop sync_dist=True for Metric objects.", UserWarning,
                          stacklevel=4)
        record.metric = metric
        if record.on_step:
            value = metric._forward_cache  # the batch value of the last `metric(preds, target)` call
            if value is not None:  # only update() was called: no step value, as in Lightning
                value = _as_scalar(record.name, value, enable_graph)
                record.step_value = value
                record.step_fresh = True
                self.callback_metrics[record.step_key] = value
                if record.on_epoch:
                    self.callback_metrics[record.name] = value
                if record.prog_bar:
                    self.progress_bar_metrics[record.step_key] = value
        if record.on_epoch:
            record.dirty = True

    def _register(self, key: str, options: tuple[Any, ...], reduce_fx: ReduceFx, suffix: str = "") -> _Metric:
        prog_bar, logger, on_step, on_epoch, _, sync_dist = options
        if self.stage not in _LOGGING_STAGES:
            where = "predict" if self.stage == "predict" else "this hook (outside training and evaluation batches)"
            raise RuntimeError(f"self.log({key!r}, ...) is not supported in {where}: log from training_step, "
                               "validation_step, test_step or the on_train_* / on_validation_* / on_test_* hooks.")
        if not isinstance(key, str) or not key:
            raise TypeError(f"self.log needs a non-empty str name. Received: {key!r}.")
        if not (on_step or on_epoch):
            raise MisconfigurationException(f"`self.log(on_step=False, on_epoch=False)` is not useful: self.log("
                                            f"{key!r}, ...) would record nothing. Set on_step or on_epoch to True "
                                            "(or leave them None for the defaults).")
        reduce, reduce_fn = _parse_reduce(key, reduce_fx)
        # None (the default): exact across processes in evaluation, per process in training (Lightning's
        # meaning, which an explicit sync_dist=False keeps everywhere).
        sync_epoch = self.stage in _EXACT_STAGES if sync_dist is None else bool(sync_dist)
        existing = self._records.get(key)
        if existing is not None:
            raise ValueError(f"{key!r} was already logged in this stage with (prog_bar, logger, on_step, on_epoch, "
                             f"reduce_fx, sync_dist)={existing.options}, now with {options}. Log it with the same "
                             "options everywhere, or use a different name.")
        both = on_step and on_epoch
        base = key[:len(key) - len(suffix)]
        record = _Metric(name=key, options=options, prog_bar=prog_bar, logger=logger, on_step=on_step,
                         on_epoch=on_epoch, reduce=reduce, reduce_fn=reduce_fn, sync_dist=sync_epoch,
                         sync_step=sync_dist is True,
                         # Lightning's names: the loader suffix after _step / _epoch ("loss_epoch/dataloader_idx_0").
                         step_key=f"{base}_step{suffix}" if both else key,
                         epoch_key=f"{base}_epoch{suffix}" if both else key)
        record.dataloader_idx = self.dataloader_idx
        self._records[key] = record
        return record

    def set_loader(self, dataloader_idx: int | None) -> None:
        """The evaluation loader whose batches run now (``None``: one loader, or between loaders): names logged
        with ``add_dataloader_idx`` get its suffix, and every name logged now belongs to its results."""
        self.dataloader_idx = dataloader_idx
        self.dataloader_suffix = "" if dataloader_idx is None else f"/dataloader_idx_{dataloader_idx}"

    def loader_results(self, results: dict[str, Any], count: int) -> list[dict[str, Any]]:
        """``results`` (epoch values by name) split per evaluation loader, as Lightning's: a name belongs to the
        loader it was logged in (``add_dataloader_idx=False`` names too); one logged outside the loaders (an
        epoch-end hook) to every loader's results."""
        owner = {r.epoch_key: r.dataloader_idx for r in self._records.values()}
        return [{k: v for k, v in results.items() if owner.get(k) is None or owner.get(k) == i} for i in range(count)]

    def _current_batch_size(self) -> int:
        if self._batch_size is None:  # no batch announced (a hook outside the batch loop)
            self._batch_size = batch_size(self.batch)
        return self._batch_size

    def _sync_step_value(self, record: _Metric, value: Any) -> torch.Tensor:
        assert self._reduce is not None and self._gather is not None
        tensor = torch.as_tensor(value, dtype=torch.float32) if not isinstance(value, torch.Tensor) else value
        if not tensor.is_floating_point():
            tensor = tensor.float()
        if record.reduce == "custom":
            assert record.reduce_fn is not None
            return record.reduce_fn(self._gather(tensor.reshape(1)))
        return self._reduce(tensor, record.reduce)

    # -- when an epoch (or an evaluation run) ends ------------------------------------------------------------
    def end_epoch(self) -> dict[str, Any]:
        """Compute the epoch values of the current stage logged since the last call (collectives for
        ``sync_dist`` ones, in log order; every process must have logged the same names).

        Returns the values keyed as they are logged; ``callback_metrics`` and ``progress_bar_metrics`` are updated.
        """
        results: dict[str, Any] = {}
        for record in self._records.values():
            if not record.dirty:
                continue
            record.dirty = False
            value = self._compute(record)
            results[record.epoch_key] = value
            self.callback_metrics[record.epoch_key] = value
            if record.on_step:
                self.callback_metrics[record.name] = value
            if record.prog_bar:
                self.progress_bar_metrics[record.epoch_key] = value
        return results

    def reset_epoch(self) -> None:
        """Forget the current stage's epoch aggregates (a new training epoch starts)."""
        for record in self._records.values():
            record.reset_epoch()

    def _compute(self, record: _Metric) -> torch.Tensor:
        if record.metric is not None:
            # Reset later (reset_metric_objects), as in Lightning: epoch-end hooks may still read the Metric.
            return _as_scalar(record.name, record.metric.compute(), False)
        if record.reduce == "custom":
            assert record.reduce_fn is not None
            values = _stack(record.values).float() if record.values else torch.zeros(0)
            if record.sync_dist and self.num_processes > 1:
                values = self._gather_uneven(values)
            return record.reduce_fn(values)
        record.fold()
        assert record.total is not None
        total = record.total
        if record.reduce == "mean":
            weight = torch.tensor(record.weight, dtype=total.dtype, device=total.device)
            if record.sync_dist and self.num_processes > 1:
                assert self._reduce is not None
                # The global batch-size-weighted mean: sum of value*size over every rank / sum of sizes.
                both = self._reduce(torch.stack([total, weight]), "sum")
                total, weight = both[0], both[1]
            return total / weight
        if record.sync_dist and self.num_processes > 1:
            assert self._reduce is not None
            return self._reduce(total, record.reduce)
        return total

    def _gather_uneven(self, values: torch.Tensor) -> torch.Tensor:
        """Every process's 1-D ``values``, concatenated in rank order, when their lengths may differ."""
        assert self._gather is not None
        count = torch.tensor([values.numel()], device=values.device)
        counts = self._gather(count).tolist()
        padded = torch.full((max(counts),), float("nan"), device=values.device)
        padded[:values.numel()] = values
        gathered = self._gather(padded).reshape(len(counts), -1)
        return torch.cat([row[:n] for row, n in zip(gathered, counts)])

    # -- what goes to the trackers ----------------------------------------------------------------------------
    def step_values(self) -> dict[str, Any]:
        """The on-step values logged since the last call, for the trackers (marks them as sent)."""
        values: dict[str, Any] = {}
        for record in self._records.values():
            if record.step_fresh:
                record.step_fresh = False
                if record.logger:
                    values[record.step_key] = record.step_value
        self.logged_metrics.update(values)
        return values

    def epoch_values(self, results: dict[str, Any]) -> dict[str, Any]:
        """The subset of ``end_epoch``'s results that goes to the trackers."""
        values = {record.epoch_key: results[record.epoch_key] for record in self._records.values()
                  if record.logger and record.epoch_key in results}
        self.logged_metrics.update(values)
        return values

    def metric_objects(self) -> list[Any]:
        """The torchmetrics Metrics logged in the current stage so far."""
        return [record.metric for record in self._records.values() if record.metric is not None]

    def reset_metric_objects(self) -> None:
        """Reset the current stage's torchmetrics Metrics once the epoch's end hooks have run."""
        for record in self._records.values():
            if record.metric is not None:
                record.metric.reset()
                record.metric_reset = True

    def clear_results(self) -> None:
        """Forget the public results (``callback_metrics`` & co.): a new ``validate`` / ``test`` run starts."""
        self.callback_metrics, self.progress_bar_metrics, self.logged_metrics = {}, {}, {}

    def snapshot(self) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        """Copies of the public dicts (the sanity check restores them, so its values never reach callbacks)."""
        return dict(self.callback_metrics), dict(self.progress_bar_metrics), dict(self.logged_metrics)

    def restore(self, saved: tuple[dict[str, Any], dict[str, Any], dict[str, Any]]) -> None:
        self.callback_metrics, self.progress_bar_metrics, self.logged_metrics = (dict(d) for d in saved)


def batch_size(batch: Any) -> int:
    """Samples in ``batch``: dim 0 of its first tensor, or 1 when it holds none (Lightning's fallback).

    Example:
        >>> batch_size((torch.zeros(8, 3), torch.zeros(8))), batch_size({"text": ["a", "b"]})
        (8, 1)
    """
    # The usual shapes first: this runs once per training batch.
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.ndim else 1
    if isinstance(batch, (tuple, list)) and batch:
        first = batch[0]
        if isinstance(first, torch.Tensor) and first.ndim:
            return int(first.shape[0])
    size = _first_dim(batch)
    return 1 if size is None else size


def _first_dim(data: Any) -> int | None:
    """Dim 0 of the first non-scalar tensor in a nested batch (lists, tuples, dicts), or None."""
    if isinstance(data, torch.Tensor):
        return int(data.shape[0]) if data.ndim else None
    items = data.values() if isinstance(data, Mapping) else data if isinstance(data, (tuple, list)) else ()
    for item in items:
        size = _first_dim(item)
        if size is not None:
            return size
    return None


def to_python(values: dict[str, Any]) -> dict[str, Any]:
    """Turn tensor values into Python numbers with one device sync per device (one stack and one ``tolist``)."""
    out = dict(values)
    groups: dict[torch.device, list[str]] = {}
    for key, value in values.items():
        if isinstance(value, torch.Tensor):
            groups.setdefault(value.device, []).append(key)
    for keys in groups.values():
        tensors = [values[k] for k in keys]
        numbers = torch.stack([t.reshape(()).to(torch.float64) for t in tensors]).tolist()
        for key, tensor, number in zip(keys, tensors, numbers):
            out[key] = number if tensor.is_floating_point() else (bool(number) if tensor.dtype == torch.bool
                                                                  else int(number))
    return out


class LogValueError(TypeError, ValueError):
    """``self.log`` got a value it cannot log (Lightning raises a ``ValueError``, Ember a ``TypeError``: both)."""


def _parse_reduce(key: str, reduce_fx: ReduceFx) -> tuple[str, Callable[[torch.Tensor], torch.Tensor] | None]:
    if isinstance(reduce_fx, str):
        reduce_fx = reduce_fx.lower()  # Lightning's names in any case, "avg" for "mean"
        reduce_fx = "mean" if reduce_fx == "avg" else reduce_fx
        if reduce_fx not in _REDUCE_NAMES:
            raise ValueError(f"self.log({key!r}, reduce_fx={reduce_fx!r}): use one of {_REDUCE_NAMES} or a callable "
                             "that reduces a 1-D tensor of the epoch's values to a scalar.")
        return reduce_fx, None
    if reduce_fx in _TORCH_REDUCE:
        return _TORCH_REDUCE[reduce_fx], None
    if callable(reduce_fx):
        return "custom", reduce_fx
    raise TypeError(f"self.log({key!r}, reduce_fx=...) must be one of {_REDUCE_NAMES} or a callable. Received: "
                    f"{reduce_fx!r}.")


def _stack(values: list[Any]) -> torch.Tensor:
    device = next((v.device for v in values if isinstance(v, torch.Tensor)), torch.device("cpu"))
    tensors = [v if isinstance(v, torch.Tensor) else torch.tensor(v, device=device) for v in values]
    stacked = torch.stack(tensors)
    # Aggregate in at least float32: bf16 / fp16 sums over an epoch would lose most of their digits.
    return stacked if stacked.dtype in (torch.float32, torch.float64) else stacked.float()


def is_torchmetric(value: Any) -> bool:
    """Whether ``value`` is a ``torchmetrics.Metric``; never imports torchmetrics (a Metric implies it is loaded)."""
    torchmetrics = sys.modules.get("torchmetrics")
    return torchmetrics is not None and isinstance(value, torchmetrics.Metric)


def metric_collection_items(value: Any) -> dict[str, Any] | None:
    """The ``{name: Metric}`` of a ``torchmetrics.MetricCollection`` (what ``log_dict`` logs), else ``None``."""
    torchmetrics = sys.modules.get("torchmetrics")
    if torchmetrics is None or not isinstance(value, torchmetrics.MetricCollection):
        return None
    return dict(value.items(keep_base=False, copy_state=False))


def _as_scalar(name: str, value: Any, enable_graph: bool) -> torch.Tensor:
    if not isinstance(value, torch.Tensor) or value.numel() != 1:
        raise ValueError(f"The torchmetrics Metric logged as {name!r} returned {type(value).__name__} "
                         f"({value!r:.80}); self.log needs a scalar tensor. Log a Metric whose compute() returns one "
                         "value, or log the entries of its result under separate names with self.log_dict.")
    value = value if enable_graph else value.detach()
    return value.reshape(()) if value.ndim else value
