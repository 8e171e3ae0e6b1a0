"""Trainer overhead: per-step time of ``Trainer.fit`` against raw loops, and the cost of ``import trainer``.

Same model and data as ``step_overhead.py`` (tiny MLP, batch 64, CPU, one thread). The trainer's module logs
its loss every step (``self.log``), the csv tracker writes every ``log_every_n_steps`` (default 50) optimizer
steps, and the progress bar is on but writes to a non-terminal (so it prints one line per epoch). Each Trainer
round is one epoch of ``--steps`` batches, timed from ``on_train_epoch_start`` to ``on_train_epoch_end`` (fit's
one-time set-up excluded, everything per epoch and per step included). The Trainer reads its batches through a
``DataLoader`` (it takes no other input), so ``raw + DataLoader`` is the fair baseline; ``raw`` indexes a list.

``python -c "import trainer"`` is timed against ``python -c "import torch"`` in interleaved fresh interpreters.

Run: ``python benchmarks/trainer_overhead.py [--rounds 31 --steps 300 --import-rounds 10]``. Every variant
trains the same model object on the same batch tensors (``step_overhead.share_model_and_data``; turn it off with
``--separate-models``), and each excess is the median of per-round differences. The variants
are columns of ``benchmarks/run_all.py`` too, which owns the list of loops compared.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.step_overhead import _data, _model


class _Cycle(Dataset):
    """``steps`` ready-made batches, cycling over the benchmark's 64 (the loader does no collation)."""

    def __init__(self, batches: list[tuple[torch.Tensor, torch.Tensor]], steps: int) -> None:
        self.batches, self.steps = batches, steps

    def __len__(self) -> int:
        return self.steps

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.batches[index % len(self.batches)]


class RawLoaderLoop:
    """The raw loop over one epoch of a plain DataLoader (no collation, like the Trainer's), iterator included."""

    def __init__(self) -> None:
        self.model, self.data = _model(), _data()
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.01)

    def run_steps(self, steps: int) -> tuple[float, float]:
        """Wall and CPU seconds for one epoch of ``steps`` steps."""
        model, opt = self.model, self.opt
        loader = DataLoader(_Cycle(self.data, steps), batch_size=None)
        start, cpu = time.perf_counter(), time.thread_time()
        for x, y in loader:
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
        return time.perf_counter() - start, time.thread_time() - cpu


class TrainerLoop:
    """A Trainer that runs one epoch of ``steps`` batches per ``run_steps`` call and times it from the inside."""

    def __init__(self, log_every_n_steps: int = 50, logging: bool = True, tracker: str | None = "") -> None:
        from callbacks import Callback
        from trainer import Trainer, TrainModule

        class Classifier(TrainModule):
            def __init__(self) -> None:
                super().__init__()
                self.net = _model()

            def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
                x, y = batch
                loss = torch.nn.functional.cross_entropy(self.net(x), y)
                if logging:
                    self.log("loss", loss)
                return loss

            def configure_optimizers(self) -> torch.optim.Optimizer:
                return torch.optim.SGD(self.parameters(), lr=0.01)

        class EpochTimer(Callback):
            seconds = cpu_seconds = 0.0

            def on_train_epoch_start(self, trainer: Any, module: Any) -> None:
                self.started, self.cpu_started = time.perf_counter(), time.thread_time()

            def on_train_epoch_end(self, trainer: Any, module: Any) -> None:
                self.seconds = time.perf_counter() - self.started
                self.cpu_seconds = time.thread_time() - self.cpu_started

        self.timer = EpochTimer()
        self.folder = tempfile.TemporaryDirectory(prefix="ember-bench-")
        self.trainer = Trainer(max_epochs=0, log_with=tracker if tracker != "" else ("csv" if logging else None), project_dir=self.folder.name,
                               num_sanity_val_steps=0, enable_checkpointing=False,
                               enable_model_summary=False, log_every_n_steps=log_every_n_steps,
                               callbacks=[self.timer])
        self.module = Classifier()
        self.data = _data()
        self.sink = io.StringIO()  # not a terminal: the progress bar prints one line per epoch

    def run_steps(self, steps: int) -> tuple[float, float]:
        """Wall and CPU seconds for one epoch of ``steps`` steps."""
        self.trainer.max_epochs = (self.trainer.max_epochs or 0) + 1
        self.sink.seek(0)
        self.sink.truncate()
        with contextlib.redirect_stdout(self.sink):
            self.trainer.fit(self.module, DataLoader(_Cycle(self.data, steps), batch_size=None))
        return self.timer.seconds, self.timer.cpu_seconds


class LightningLoop:
    """``TrainerLoop`` with Lightning's Trainer (when installed): the same module, CSVLogger, one epoch per call.

    Lightning's progress bar is off: its tqdm bar redraws every batch even when stdout is not a terminal, which
    would charge it for output that Ember's bar (one line per epoch there) does not write.
    """

    def __init__(self, log_every_n_steps: int = 50) -> None:
        import logging
        import warnings

        import lightning.pytorch as pl  # type: ignore[import-not-found]
        from lightning.pytorch.loggers import CSVLogger  # type: ignore[import-not-found]

        logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)  # "GPU available: ..." and the like
        warnings.filterwarnings("ignore", module="lightning")  # e.g. "consider increasing num_workers"

        class Classifier(pl.LightningModule):  # type: ignore[misc]
            def __init__(self) -> None:
                super().__init__()
                self.net = _model()

            def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
                x, y = batch
                loss = torch.nn.functional.cross_entropy(self.net(x), y)
                self.log("loss", loss)
                return loss

            def configure_optimizers(self) -> torch.optim.Optimizer:
                return torch.optim.SGD(self.parameters(), lr=0.01)

        class EpochTimer(pl.Callback):  # type: ignore[misc]
            seconds = cpu_seconds = 0.0

            def on_train_epoch_start(self, trainer: Any, module: Any) -> None:
                self.started, self.cpu_started = time.perf_counter(), time.thread_time()

            def on_train_epoch_end(self, trainer: Any, module: Any) -> None:
                self.seconds = time.perf_counter() - self.started
                self.cpu_seconds = time.thread_time() - self.cpu_started

        self.timer = EpochTimer()
        self.folder = tempfile.TemporaryDirectory(prefix="ember-bench-")
        self.trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=0, logger=CSVLogger(self.folder.name),
                                  enable_checkpointing=False, enable_model_summary=False, enable_progress_bar=False,
                                  num_sanity_val_steps=0, log_every_n_steps=log_every_n_steps,
                                  callbacks=[self.timer])
        self.module = Classifier()
        self.data = _data()

    def run_steps(self, steps: int) -> tuple[float, float]:
        """Wall and CPU seconds for one epoch of ``steps`` steps."""
        self.trainer.fit_loop.max_epochs += 1
        self.trainer.fit(self.module, DataLoader(_Cycle(self.data, steps), batch_size=None))
        return self.timer.seconds, self.timer.cpu_seconds


TRAINER_VARIANTS: dict[str, Callable[[], Any]] = {
    "raw + DataLoader": RawLoaderLoop,
    "trainer": TrainerLoop,
    "trainer, tracker every step": lambda: TrainerLoop(log_every_n_steps=1),
    "trainer, logging off": lambda: TrainerLoop(logging=False),
}
if importlib.util.find_spec("lightning") is not None:
    TRAINER_VARIANTS["lightning"] = LightningLoop


def import_times(modules: list[str], rounds: int) -> dict[str, float]:
    """Median wall seconds of ``python -c "import <module>"`` for each module, in interleaved fresh interpreters."""
    times: dict[str, list[float]] = {name: [] for name in modules}
    for _ in range(rounds):
        for name, samples in times.items():
            start = time.perf_counter()
            subprocess.run([sys.executable, "-c", f"import {name}"], cwd=ROOT, check=True)
            samples.append(time.perf_counter() - start)
    return {name: statistics.median(samples) for name, samples in times.items()}


def import_overhead(rounds: int) -> tuple[float, float]:
    """Median wall seconds of ``python -c "import torch"`` and of ``python -c "import trainer"``."""
    times = import_times(["torch", "trainer"], rounds)
    return times["torch"], times["trainer"]


def main() -> None:
    from benchmarks.step_overhead import (
        make_engine,
        make_raw,
        measure_rounds,
        paired_excess,
        share_model_and_data,
    )

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=31)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--import-rounds", type=int, default=10)
    parser.add_argument("--separate-models", action="store_true",
                        help="give each variant its own model and batches (see share_model_and_data)")
    args = parser.parse_args()
    if not args.separate_models:
        share_model_and_data()
    variants = {"raw": make_raw, "engine": make_engine, **TRAINER_VARIANTS}
    wall, cpu = measure_rounds(variants, args.rounds, args.steps)
    print(f"{args.rounds} interleaved rounds of {args.steps} steps; 'over X' = median over rounds of (loop - X) in "
          f"the same round; CPU = this thread's time")
    print(f"{'loop':<30}{'us/step':>9}{'over raw':>10}{'over raw+DL':>13}{'cpu us/step':>13}{'over raw':>10}"
          f"{'over raw+DL':>13}")
    for name in wall:
        print(f"{name:<30}{statistics.median(wall[name]):>9.1f}{paired_excess(wall, name, 'raw'):>+10.1f}"
              f"{paired_excess(wall, name, 'raw + DataLoader'):>+13.1f}{statistics.median(cpu[name]):>13.1f}"
              f"{paired_excess(cpu, name, 'raw'):>+10.1f}{paired_excess(cpu, name, 'raw + DataLoader'):>+13.1f}")
    torch_s, trainer_s = import_overhead(args.import_rounds)
    print(f"\nimport torch: {torch_s:.3f} s, import trainer: {trainer_s:.3f} s, "
          f"trainer over torch: {trainer_s - torch_s:+.3f} s")


if __name__ == "__main__":
    main()
