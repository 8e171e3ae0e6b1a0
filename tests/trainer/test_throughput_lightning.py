"""``ThroughputMonitor`` built Lightning's way (``batch_size_fn=...``): Lightning's metrics, values and schedule.

Every expected row below was recorded from real Lightning 2.6.5 (``lightning.pytorch.callbacks.ThroughputMonitor``
with a logger that records ``log_metrics``) under the same deterministic clock. Documented differences: Ember's
training rows are logged at the step count after the optimizer step (Lightning's logger sees it before: 0, 1, ...),
and ``predict`` runs no trackers in Ember, so its values reach ``trainer.log_metrics`` and ``monitor.last`` only.
"""

from __future__ import annotations

import types
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
import torch

import callbacks.throughput_stages as stages
from callbacks import ThroughputMonitor
from engine.throughput import Throughput, measure_flops
from tests.trainer.helpers import QUIET, MemoryTracker, Regressor, data
from trainer import Trainer

FLOPS_WARNING = "When using the `ThroughputMonitor`, you need to define a `flops_per_batch` attribute"


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Replace ``time.perf_counter`` as the monitor's module sees it by the given readings, in order."""

    def install(readings: list[float]) -> None:
        ticks: Iterator[float] = iter(readings)
        monkeypatch.setattr(stages, "time", types.SimpleNamespace(perf_counter=lambda: next(ticks)))

    return install


class Flops(Regressor):
    flops_per_batch = 10


def _monitors(key: str, prefix: str) -> bool:
    name = key.removeprefix(prefix)
    return key.startswith(prefix) and (name in ("time", "batches", "samples", "lengths") or "device" in name
                                       or name.endswith("_per_sec"))


def rows(tracker: MemoryTracker, prefix: str) -> list[tuple[int | None, dict[str, Any]]]:
    """The monitor's values (``<prefix>time`` ...) of each tracker row holding some, with the row's step."""
    return [(step, {k: v for k, v in values.items() if _monitors(k, prefix)}) for step, values in tracker.rows
            if any(_monitors(k, prefix) for k in values)]


def test_fit_logs_lightnings_train_metrics_every_step_once_the_window_fills(clock: Any) -> None:
    # Lightning's test_throughput_monitor_fit: the rates appear at the 4th update (window_size=4)
    clock([0.0] + [0.5 + i for i in range(1, 6)])
    tracker = MemoryTracker()
    monitor = ThroughputMonitor(length_fn=lambda batch: 3 * 2, batch_size_fn=lambda batch: 3, window_size=4,
                                separator="|", available_flops=100)
    trainer = Trainer(**{**QUIET, "log_with": [tracker]}, max_steps=5, log_every_n_steps=1, callbacks=[monitor])
    trainer.fit(Flops(), data(n=40))
    rates = {"train|device|batches_per_sec": 1.0, "train|device|samples_per_sec": 3.0,
             "train|device|items_per_sec": 6.0, "train|device|flops_per_sec": 10.0, "train|device|mfu": 0.1}
    assert rows(tracker, "train|") == [
        (1, {"train|time": 1.5, "train|batches": 1, "train|samples": 3, "train|lengths": 6}),
        (2, {"train|time": 2.5, "train|batches": 2, "train|samples": 6, "train|lengths": 12}),
        (3, {"train|time": 3.5, "train|batches": 3, "train|samples": 9, "train|lengths": 18}),
        (4, {**rates, "train|time": 4.5, "train|batches": 4, "train|samples": 12, "train|lengths": 24}),
        (5, {**rates, "train|time": 5.5, "train|batches": 5, "train|samples": 15, "train|lengths": 30}),
    ]
    assert monitor.available_flops == 100


def test_validation_inside_fit_is_not_training_time(clock: Any) -> None:
    # readings: train start, batch 1, batch 2, validation start, its batch, batch 3, batch 4, validation, its batch.
    # Lightning logged train/time 7, 11, then 15 = 11 + (23 - 19): the 2 s before and 6 s of validation are left out.
    clock([0, 7, 11, 13, 19, 23, 29, 31, 37])
    tracker = MemoryTracker()
    monitor = ThroughputMonitor(batch_size_fn=lambda batch: 1, window_size=2)
    trainer = Trainer(**{**QUIET, "log_with": [tracker], "num_sanity_val_steps": 2}, max_steps=4, val_check_interval=2,
                      log_every_n_steps=1, limit_val_batches=1, callbacks=[monitor])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(Regressor(), data(n=40), data(n=8))
    assert rows(tracker, "train/") == [
        (1, {"train/time": 7, "train/batches": 1, "train/samples": 1}),
        (2, {"train/time": 11, "train/batches": 2, "train/samples": 2, "train/device/batches_per_sec": 0.25,
             "train/device/samples_per_sec": 0.25}),
        (3, {"train/time": 15, "train/batches": 3, "train/samples": 3, "train/device/batches_per_sec": 0.25,
             "train/device/samples_per_sec": 0.25}),
        (4, {"train/time": 21, "train/batches": 4, "train/samples": 4, "train/device/batches_per_sec": 1 / 6,
             "train/device/samples_per_sec": 1 / 6}),
    ]
    # each validation inside fit starts afresh and logs at "validation batches so far" (1, then 2)
    assert rows(tracker, "validate/") == [(1, {"validate/time": 6, "validate/batches": 1, "validate/samples": 1}),
                                          (2, {"validate/time": 6, "validate/batches": 1, "validate/samples": 1})]
    # the module has no flops_per_batch: Lightning's warning, once
    assert sum(FLOPS_WARNING in str(w.message) for w in caught) == 1


@pytest.mark.parametrize("log_every_n_steps", [1, 3])
def test_accumulation_logs_whole_optimizer_steps_on_lightnings_schedule(clock: Any, log_every_n_steps: int) -> None:
    # Lightning's test_throughput_monitor_fit_gradient_accumulation: 5 batches an epoch, 2 per step, 2 epochs
    clock([0.0] + [0.5 + i for i in range(1, 11)])
    tracker = MemoryTracker()
    monitor = ThroughputMonitor(length_fn=lambda batch: 6, batch_size_fn=lambda batch: 3, window_size=4,
                                separator="|", available_flops=100)
    trainer = Trainer(**{**QUIET, "log_with": [tracker]}, max_epochs=2, limit_train_batches=5, limit_val_batches=0,
                      log_every_n_steps=log_every_n_steps, accumulate_grad_batches=2, callbacks=[monitor])
    trainer.fit(Flops(), data(n=40))
    logged = [(step, values["train|batches"], values["train|time"], values.get("train|device|mfu"))
              for step, values in rows(tracker, "train|")]
    every_step = [(1, 2, 2.5, None), (2, 4, 4.5, 0.1), (3, 5, 5.5, 0.1), (4, 7, 7.5, 0.1), (5, 9, 9.5, 0.1),
                  (6, 10, 10.5, 0.1)]
    if log_every_n_steps == 1:
        assert logged == every_step
    else:  # Lightning: optimizer steps 3 and 6, the window full by then
        assert logged == [(3, 5, 5.5, 0.1), (6, 10, 10.5, 0.1)]


@pytest.mark.parametrize("fn", ["validate", "test", "predict"])
def test_evaluation_logs_every_n_batches_and_keeps_counting_over_calls(clock: Any, fn: str) -> None:
    # Lightning's test_throughput_monitor_eval with a clock: a fresh window per call, counters carried over, and
    # steps that do not repeat (3, 6, then 9, 12)
    clock([0, 1, 2, 3, 4, 5, 6, 100, 101, 102, 103, 104, 105, 106])
    tracker = MemoryTracker()
    monitor = ThroughputMonitor(batch_size_fn=lambda batch: 3, window_size=3, separator="|", available_flops=100)
    trainer = Trainer(**{**QUIET, "log_with": [tracker]}, log_every_n_steps=3, limit_val_batches=6,
                      limit_test_batches=6, limit_predict_batches=6, callbacks=[monitor])
    sent: list[tuple[int | None, dict[str, Any]]] = []
    forward = trainer.log_metrics
    trainer.log_metrics = lambda values, step=None: (sent.append((step, dict(values))), forward(values, step))[-1]
    module = Flops()
    for _ in range(2):
        getattr(trainer, fn)(module, data(n=40))
    rates = {f"{fn}|device|batches_per_sec": 1.0, f"{fn}|device|samples_per_sec": 3.0,
             f"{fn}|device|flops_per_sec": 10.0, f"{fn}|device|mfu": 0.1}
    assert sent == [
        (3, {**rates, f"{fn}|time": 3, f"{fn}|batches": 3, f"{fn}|samples": 9}),
        (6, {**rates, f"{fn}|time": 6, f"{fn}|batches": 6, f"{fn}|samples": 18}),
        (9, {**rates, f"{fn}|time": 3, f"{fn}|batches": 9, f"{fn}|samples": 27}),
        (12, {**rates, f"{fn}|time": 6, f"{fn}|batches": 12, f"{fn}|samples": 36}),
    ]
    assert monitor.last == sent[-1][1]
    # validate and test rows reach the trackers at those steps; predict starts no trackers in Ember
    assert rows(tracker, f"{fn}|") == ([] if fn == "predict" else sent)


def test_world_size_adds_totals_over_devices(clock: Any) -> None:
    # Lightning's Throughput(world_size=4): per-device rates times the world size, without the "device/" part
    meter = Throughput(world_size=4, window_size=2, available_flops=50)
    meter.update(time=1.0, batches=1, samples=2, lengths=4, flops=10)
    meter.update(time=3.0, batches=2, samples=4, lengths=8, flops=10)
    assert meter.compute() == {"time": 3.0, "batches": 2, "samples": 4, "lengths": 8, "device/batches_per_sec": 0.5,
                               "device/samples_per_sec": 1.0, "batches_per_sec": 2.0, "samples_per_sec": 4.0,
                               "device/items_per_sec": 2.0, "items_per_sec": 8.0, "flops_per_sec": 20.0,
                               "device/flops_per_sec": 5.0, "device/mfu": 0.1}
    # the monitor's world_size= (an Ember extension: Lightning's monitor passes the trainer's) reaches the meter
    clock([0, 1, 2, 4])
    tracker = MemoryTracker()
    monitor = ThroughputMonitor(batch_size_fn=lambda batch: 2, window_size=2, world_size=2)
    Trainer(**{**QUIET, "log_with": [tracker]}, max_steps=3, log_every_n_steps=1, callbacks=[monitor]).fit(
        Flops(), data(n=40))
    assert rows(tracker, "train/")[-1] == (3, {"train/time": 4, "train/batches": 3, "train/samples": 6,
                                               "train/device/batches_per_sec": 0.5,
                                               "train/device/samples_per_sec": 1.0, "train/batches_per_sec": 1.0,
                                               "train/samples_per_sec": 2.0, "train/device/flops_per_sec": 5.0,
                                               "train/flops_per_sec": 10.0})


def test_measure_flops_counts_forward_and_backward() -> None:
    with torch.device("meta"):
        model = torch.nn.Linear(32, 2)
        x = torch.randn(2, 32)
    forward = measure_flops(model, lambda: model(x))
    assert forward == 2 * 2 * 32 * 2
    assert measure_flops(model, lambda: model(x), lambda y: y.sum()) > forward


@pytest.mark.parametrize(("kwargs", "error", "says"), [
    ({"batch_size_fn": lambda b: 1, "window_size": 1}, ValueError, "window_size=1"),
    ({"batch_size_fn": 4}, TypeError, "batch_size_fn=4"),
    ({"batch_size_fn": None, "window_size": 4}, TypeError, "batch_size_fn=None"),
    ({"batch_size_fn": lambda b: 1, "length_fn": "tokens"}, TypeError, "length_fn='tokens'"),
    ({"batch_size_fn": lambda b: 1, "window": 20}, ValueError, "window=20"),
    ({"batch_size_fn": lambda b: 1, "windowsize": 20}, TypeError, "windowsize"),
    ({"batch_size_fn": lambda b: 1, "available_flops": -1}, ValueError, "available_flops=-1"),
])
def test_bad_arguments_name_the_value_and_the_fix(kwargs: dict[str, Any], error: type[Exception], says: str) -> None:
    with pytest.raises(error, match=says.replace("(", r"\(")):
        ThroughputMonitor(**kwargs)


def test_embers_form_is_unchanged() -> None:
    monitor = ThroughputMonitor(window=2)
    tracker = MemoryTracker()
    Trainer(**{**QUIET, "log_with": [tracker]}, max_epochs=1, callbacks=[monitor]).fit(Regressor(), data(n=16))
    assert [step for step, _ in tracker.logged("throughput/samples_per_sec")] == [2, 4]
    assert not any(key.startswith("train/") for _, values in tracker.rows for key in values)


def test_the_peak_flops_lookup_is_the_callbacks_module_name(monkeypatch: pytest.MonkeyPatch) -> None:
    # Lightning's tests patch lightning.pytorch.callbacks.throughput_monitor.get_available_flops (Ember's
    # callbacks.throughput): the monitor must read that name when a run is set up.
    import callbacks.throughput as monitor_module

    asked: list[tuple[torch.device, torch.dtype]] = []

    def fake(device: torch.device, dtype: torch.dtype) -> int:
        asked.append((device, dtype))
        return 100

    monkeypatch.setattr(monitor_module, "get_available_flops", fake)
    monitor = ThroughputMonitor(batch_size_fn=lambda batch: 3)
    Trainer(**QUIET, max_steps=1, callbacks=[monitor]).fit(Flops(), data(n=8))
    assert monitor.available_flops == 100 and asked == [(torch.device("cpu"), torch.float32)]
