"""``Throughput``: rolling rates (batches, samples, items, FLOPs per second) from running totals; ``measure_flops``.

Lightning's ``lightning.fabric.utilities.throughput`` names, with its metric keys and its window rule (the
``*_per_sec`` values appear only once ``window_size`` updates were made), written for Ember's engine so a custom
loop can use it as well as ``callbacks.ThroughputMonitor``. ``trainer.utilities.throughput`` re-exports it under
the path a ported import looks for.

Example:
    >>> meter = Throughput(window_size=2)
    >>> meter.update(time=1.0, batches=1, samples=4)
    >>> meter.update(time=3.0, batches=2, samples=8)
    >>> meter.compute()
    {'time': 3.0, 'batches': 2, 'samples': 8, 'device/batches_per_sec': 0.5, 'device/samples_per_sec': 2.0}
"""

from __future__ import annotations

import warnings
from collections import deque
from collections.abc import Callable

import torch

# Dense (no sparsity) peak FLOP/s of one device from NVIDIA's data sheets, for the chips a model-FLOPs-utilisation
# figure is usually wanted on. A chip missing here gives no ``mfu`` unless ``available_flops`` is passed.
_PEAK_FLOPS: dict[str, dict[str, float]] = {
    "h100": {"float32": 67e12, "tfloat32": 494.7e12, "bfloat16": 989.4e12, "float16": 989.4e12},
    "h200": {"float32": 67e12, "tfloat32": 494.7e12, "bfloat16": 989.4e12, "float16": 989.4e12},
    "a100": {"float32": 19.5e12, "tfloat32": 156e12, "bfloat16": 312e12, "float16": 312e12},
    "l4": {"float32": 30.3e12, "tfloat32": 60e12, "bfloat16": 121e12, "float16": 121e12},
}


class _RunningTotal:
    """The last ``size`` values of one running total, which must grow at every update."""

    def __init__(self, name: str, size: int) -> None:
        self.name = name
        self.values: deque[float] = deque(maxlen=size)

    def push(self, value: float) -> None:
        if self.values and value <= self.values[-1]:
            # a counter passed per batch instead of as a running total would silently give nonsense rates
            raise ValueError(f"Throughput.update({self.name}=...) must grow at every call: received {value!r} after "
                             f"{self.values[-1]!r}. Pass the running total since the start, not the per-batch amount.")
        self.values.append(value)

    @property
    def full(self) -> bool:
        return len(self.values) == self.values.maxlen

    @property
    def span(self) -> float:
        return self.values[-1] - self.values[0]


class Throughput:
    """Rates over the last ``window_size`` updates of running totals (Lightning's ``Throughput``).

    ``compute()`` always gives ``time``, ``batches``, ``samples`` (and ``lengths``) as last passed; once the window
    is full it adds ``device/batches_per_sec``, ``device/samples_per_sec`` (``device/items_per_sec`` with
    lengths), and with ``world_size > 1`` the totals over devices without the ``device/`` part. FLOPs passed to
    ``update`` (per device, per update) give ``device/flops_per_sec`` (``flops_per_sec`` over devices) and, with
    ``available_flops``, ``device/mfu``.

    Args:
        available_flops: peak FLOP/s of one device (for ``device/mfu``).
        world_size: number of devices; rates are multiplied by it for the global values.
        window_size: updates the rates are computed over (at least 2: a rate needs two points).
        separator: joins ``device`` and the metric name.
    """

    def __init__(self, available_flops: float | None = None, world_size: int = 1, window_size: int = 100,
                 separator: str = "/") -> None:
        if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
            raise ValueError(f"Throughput(world_size=...) must be an int >= 1 (the number of devices). "
                             f"Received: world_size={world_size!r}.")
        if not isinstance(window_size, int) or isinstance(window_size, bool) or window_size < 2:
            raise ValueError(f"Throughput(window_size=...) must be an int >= 2: a rate needs the first and the last "
                             f"of at least two updates. Received: window_size={window_size!r}; pass window_size=2 "
                             "or more (default 100).")
        if not isinstance(separator, str):
            raise TypeError(f"Throughput(separator=...) must be a str such as '/' or '|'. Received: {separator!r}.")
        self.available_flops = available_flops
        self.world_size = world_size
        self.window_size = window_size
        self.separator = separator
        self._time = _RunningTotal("time", window_size)
        self._batches = _RunningTotal("batches", window_size)
        self._samples = _RunningTotal("samples", window_size)
        self._lengths = _RunningTotal("lengths", window_size)
        self._flops: deque[float] = deque(maxlen=window_size)  # per update, not a running total

    def update(self, *, time: float, batches: int, samples: int, lengths: int | None = None,
               flops: float | None = None) -> None:
        """Record running totals: seconds elapsed, batches and samples (and items) seen on this device so far,
        and the FLOPs this device spent since the previous update."""
        if samples < batches:
            raise ValueError(f"Throughput.update: samples ({samples}) must be at least batches ({batches}); both are "
                             "running totals, a batch holding at least one sample.")
        if lengths is not None and lengths < samples:
            raise ValueError(f"Throughput.update: lengths ({lengths}) must be at least samples ({samples}); both are "
                             "running totals, a sample holding at least one item.")
        self._time.push(time)
        self._batches.push(batches)
        self._samples.push(samples)
        if lengths is not None:
            self._lengths.push(lengths)
            if len(self._lengths.values) != len(self._samples.values):
                raise RuntimeError("Throughput.update: lengths were passed on some updates and not on others; pass "
                                   "them on every update or never.")
        if flops is not None:
            self._flops.append(flops * self.world_size)  # the whole job's FLOPs, assuming equal devices

    def compute(self) -> dict[str, int | float]:
        """The last totals, and the rates once the window is full (see the class docstring for the keys)."""
        device = f"device{self.separator}"
        scale = self.world_size
        out: dict[str, int | float] = {"time": self._time.values[-1], "batches": int(self._batches.values[-1]),
                                       "samples": int(self._samples.values[-1])}
        if self._lengths.values:
            out["lengths"] = int(self._lengths.values[-1])
        seconds = self._time.span
        if self._time.full:
            per_device = {"batches_per_sec": self._batches.span / seconds,
                          "samples_per_sec": self._samples.span / seconds}
            if self._lengths.full:
                per_device["items_per_sec"] = self._lengths.span / seconds
            for name, rate in per_device.items():
                out[device + name] = rate
                if scale > 1:
                    out[name] = rate * scale
        if len(self._flops) == self._flops.maxlen:
            # the first update's FLOPs were spent before the window's first time point
            job_rate = (sum(self._flops) - self._flops[0]) / seconds
            if scale > 1:
                out["flops_per_sec"] = job_rate
            out[device + "flops_per_sec"] = job_rate / scale
            if self.available_flops:
                out[device + "mfu"] = job_rate / scale / self.available_flops
        return out

    def reset(self) -> None:
        """Forget every update (a new measurement starts)."""
        for total in (self._time, self._batches, self._samples, self._lengths):
            total.values.clear()
        self._flops.clear()


def measure_flops(model: torch.nn.Module, forward_fn: Callable[[], torch.Tensor],
                  loss_fn: Callable[[torch.Tensor], torch.Tensor] | None = None) -> int:
    """FLOPs of one call of ``forward_fn`` (and, with ``loss_fn``, of the loss and its backward pass).

    Build the model and its input on the ``meta`` device to count without computing. ``model`` is the module
    ``forward_fn`` runs (kept for Lightning's signature).

    Example:
        >>> layer = torch.nn.Linear(4, 2, device="meta")
        >>> x = torch.randn(3, 4, device="meta")
        >>> measure_flops(layer, lambda: layer(x))  # 2 * 3 * 4 * 2
        48
    """
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter:
        result = forward_fn()
        if loss_fn is not None:
            loss_fn(result).backward()
    return int(counter.get_total_flops())


def get_available_flops(device: torch.device, dtype: torch.dtype) -> int | None:
    """Peak FLOP/s of ``device`` computing in ``dtype``, for the CUDA chips Ember knows; otherwise ``None``.

    Example:
        >>> get_available_flops(torch.device("cpu"), torch.float32) is None
        True
    """
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device).lower()
    # "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB": a word of the name is the chip, or starts with it and "-"
    chip = next((known for known in _PEAK_FLOPS for word in name.split()
                 if word == known or word.startswith(f"{known}-")), None)
    if chip is None:
        warnings.warn(f"FLOPs not found for {name!r}: pass ThroughputMonitor(..., available_flops=...) to get "
                      "`device/mfu`.", UserWarning, stacklevel=2)
        return None
    key = str(dtype).removeprefix("torch.")
    if key == "float32" and torch.get_float32_matmul_precision() != "highest":
        key = "tfloat32"  # TF32 matmuls are on
    peak = _PEAK_FLOPS[chip].get(key)
    return None if peak is None else int(peak)


__all__ = ["Throughput", "get_available_flops", "measure_flops"]
