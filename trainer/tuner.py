"""`Tuner`: Lightning's learning-rate finder (``lr_find``) and batch-size finder (``scale_batch_size``).

Each search runs the real ``fit`` loop of a short-lived trainer with the same precision, accumulation and
clipping as yours, on its own ``Accelerator`` (so nothing it prepares lands in your trainer's checkpoints). The
module's weights and buffers and the global random state are restored afterwards: training after tuning starts
exactly where it would have without it (only the tuned attribute changed).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import gc
import shutil
import tempfile
import warnings
from collections.abc import Iterator
from typing import Any

import torch

from engine.random import capture_rng_state, restore_rng_state
from trainer.compat.keywords import accepts_model
from trainer.config import TrainerConfig
from trainer.datamodule import DataModule
from trainer.module import TrainModule
from trainer.tools.compiling import unwrap_compiled
from trainer.tools.lr_finder import MODES, LRFinder, LRSweep

LR_NAMES = ("lr", "learning_rate")
_OOM_MESSAGES = ("out of memory", "CUDA error: out of memory", "cuDNN error: CUDNN_STATUS_NOT_SUPPORTED")


def is_out_of_memory(error: BaseException) -> bool:
    """Whether ``error`` means the batch did not fit: a ``MemoryError`` (CPU), CUDA's ``OutOfMemoryError`` or an
    out-of-memory ``RuntimeError``."""
    if isinstance(error, MemoryError):
        return True
    if isinstance(error, getattr(torch.cuda, "OutOfMemoryError", ())):
        return True
    return isinstance(error, RuntimeError) and any(m in str(error) for m in _OOM_MESSAGES)


class Tuner:
    """Searches for a learning rate or batch size with a trainer's settings.

    Example:
        >>> from torch.utils.data import DataLoader, TensorDataset
        >>> class Regressor(TrainModule):
        ...     def __init__(self, lr: float = 0.01) -> None:
        ...         super().__init__()
        ...         self.lr = lr
        ...         self.net = torch.nn.Linear(3, 1)
        ...     def training_step(self, batch, batch_idx):
        ...         return torch.nn.functional.mse_loss(self.net(batch[0]), batch[1])
        ...     def configure_optimizers(self):
        ...         return torch.optim.SGD(self.parameters(), lr=self.lr)
        >>> x = torch.randn(256, 3)
        >>> loader = DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8)
        >>> from trainer import Trainer
        >>> trainer = Trainer(log_with=None, enable_progress_bar=False, enable_model_summary=False)
        >>> finder = Tuner(trainer).lr_find(Regressor(), loader, num_training=30, update_attr=False)
        >>> len(finder.results["lr"]) <= 30, finder.suggestion() is not None
        (True, True)
    """

    def __init__(self, trainer: Any) -> None:
        # A trainer.Trainer, recognised by its config: the Trainer imports this module for LearningRateFinder,
        # so this one does not import the Trainer (no import circle); searches build type(trainer) trainers.
        if not isinstance(getattr(trainer, "config", None), TrainerConfig) or not hasattr(trainer, "fit"):
            raise TypeError(f"Tuner(trainer) takes a trainer.Trainer. Received: {type(trainer).__name__}.")
        self.trainer = trainer

    # -- learning rate ---------------------------------------------------------------------------------------
    @accepts_model
    def lr_find(self, module: TrainModule, train_dataloaders: Any = None, val_dataloaders: Any = None,
                datamodule: DataModule | None = None, min_lr: float = 1e-8, max_lr: float = 1.0,
                num_training: int = 100, mode: str = "exponential", early_stop_threshold: float | None = 4.0,
                update_attr: bool = True, attr_name: str = "") -> LRFinder | None:
        """Sweep the learning rate from ``min_lr`` to ``max_lr`` over ``num_training`` optimizer steps.

        Returns the ``LRFinder`` (``results``, ``suggestion()``, ``plot(path)``). With ``update_attr`` the
        suggestion is written to ``attr_name`` (default: the module's or its hparams' ``lr`` /
        ``learning_rate``). ``val_dataloaders`` is accepted for Lightning compatibility (no validation runs).
        """
        del val_dataloaders
        module = unwrap_compiled(module)[0]
        for name, value in (("min_lr", min_lr), ("max_lr", max_lr)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"lr_find({name}=...) must be a number > 0. Received: {value!r}.")
        # As Lightning: min_lr above max_lr sweeps downwards; num_training=1 gives one point (no suggestion).
        if isinstance(num_training, bool) or not isinstance(num_training, int) or num_training < 1:
            raise ValueError(f"lr_find(num_training=...) must be an int >= 1. Received: {num_training!r}.")
        if mode not in MODES:
            raise ValueError(f"lr_find(mode=...) must be one of {list(MODES)}. Received: {mode!r}.")
        if early_stop_threshold is not None and not early_stop_threshold > 1:
            raise ValueError("lr_find(early_stop_threshold=...) must be a number > 1 or None. Received: "
                             f"{early_stop_threshold!r}.")
        if self._skipped_on_fast_dev_run("learning rate finder"):
            return None
        targets = self._lr_targets(module, datamodule, attr_name) if update_attr else []
        finder = LRFinder(float(min_lr), float(max_lr), num_training, mode)
        with self._restored(module):
            trainer = self._search_trainer(max_steps=num_training, callbacks=[LRSweep(finder, early_stop_threshold)])
            trainer.fit(module, train_dataloaders, datamodule=datamodule)
        suggestion = finder.suggestion()
        if targets and suggestion is not None:
            for owner, name in targets:  # every holder of the name, as Lightning's lightning_setattr
                _assign(owner, name, suggestion)
            self.trainer.accelerator.print(f"Learning rate set to {suggestion:.6g}")
        return finder

    def _skipped_on_fast_dev_run(self, search: str) -> bool:
        """Lightning skips both searches under ``fast_dev_run`` (a smoke test, not a tuning run), with its warning;
        the search then returns None."""
        if not self.trainer.config.fast_dev_run:
            return False
        if self.trainer.accelerator.is_main_process:
            warnings.warn(f"Skipping {search} since `fast_dev_run` is enabled.", UserWarning, stacklevel=3)
        return True

    @staticmethod
    def _lr_targets(module: TrainModule, datamodule: DataModule | None, attr_name: str) -> list[tuple[Any, str]]:
        """Where the suggestion goes: the first of ``attr_name`` (or ``lr`` / ``learning_rate``) found on the module
        or its hparams, then the data module, written to each of them that holds it (attribute and hparams)."""
        names = (attr_name,) if attr_name else LR_NAMES
        holders = [module, module.hparams] + ([datamodule, datamodule.hparams] if datamodule is not None else [])
        for name in names:
            found = [(owner, name) for owner in holders if _has(owner, name)]
            if found:
                return found
        raise AttributeError(f"When using the learning rate finder either specify `attr_name` or make sure that the "
                             f"model or datamodule should have one of these fields: {list(names)}. "
                             f"{type(module).__name__} has none: add the attribute and read it in "
                             "configure_optimizers, or pass update_attr=False and use finder.suggestion() yourself.")

    # -- batch size ------------------------------------------------------------------------------------------
    @accepts_model
    def scale_batch_size(self, module: TrainModule, train_dataloaders: Any = None,
                         datamodule: DataModule | None = None, mode: str = "power", steps_per_trial: int = 3,
                         init_val: int = 2, max_trials: int = 25, batch_arg_name: str = "batch_size",
                         max_val: int | None = None) -> int | None:
        """The largest batch size that trains, found by doubling (``"power"``) and then, with ``"binsearch"``,
        bisecting between the last size that fit and the first that did not; written to ``batch_arg_name``.

        The loaders are rebuilt from the module's (or data module's) ``train_dataloader()`` for every trial, so
        they must read ``batch_arg_name``. A trial fails on out-of-memory (CUDA's, or a ``MemoryError`` on the
        CPU); ``max_val`` caps the search. Each trial trains ``steps_per_trial`` steps from the same weights.
        """
        module = unwrap_compiled(module)[0]
        if mode not in ("power", "binsearch"):
            raise ValueError(f"scale_batch_size(mode=...) must be 'power' or 'binsearch'. Received: {mode!r}.")
        for name, value in (("steps_per_trial", steps_per_trial), ("init_val", init_val), ("max_trials", max_trials)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"scale_batch_size({name}=...) must be an int >= 1. Received: {value!r}.")
        if max_val is not None and (not isinstance(max_val, int) or max_val < init_val):
            raise ValueError(f"scale_batch_size(max_val={max_val!r}) must be an int >= init_val ({init_val}).")
        if train_dataloaders is not None:
            raise ValueError("scale_batch_size cannot resize loaders passed directly: build them in "
                             f"train_dataloader() from self.{batch_arg_name} (on the module or a data module).")
        if self.trainer.accelerator.num_processes > 1:
            raise RuntimeError("scale_batch_size runs in one process (an out-of-memory trial on one rank would end "
                               "the others): find the size on one device, then launch with it.")
        if self._skipped_on_fast_dev_run("batch size scaler"):
            return None
        owner = self._batch_owner(module, datamodule, batch_arg_name)
        with self._restored(module):
            size = self._search_batch_size(module, datamodule, owner, batch_arg_name, mode, steps_per_trial,
                                           init_val, max_trials, max_val)
        _assign(owner, batch_arg_name, size)
        self.trainer.accelerator.print(f"Batch size set to {size}")
        return size

    def _search_batch_size(self, module: TrainModule, datamodule: DataModule | None, owner: Any, name: str,
                           mode: str, steps: int, size: int, max_trials: int, max_val: int | None) -> int:
        good, bad = 0, None  # the largest size that fit, the smallest that did not
        for _ in range(max_trials):
            _assign(owner, name, size)
            if self._trial_fits(module, datamodule, steps):
                good = size
                if (max_val is not None and size >= max_val) or self._dataset_exhausted(module, datamodule, size):
                    break  # the configured limit, or a larger batch would hold the same samples
                if bad is None:
                    size = size * 2 if max_val is None else min(size * 2, max_val)
                    continue
            else:
                bad = size
                if good == 0:  # nothing fit yet: halve until something does
                    if size == 1:
                        raise RuntimeError("scale_batch_size: even a batch of 1 runs out of memory.")
                    size //= 2
                    continue
                if mode == "power":
                    break  # the last size that fit
            if bad is None or bad - good <= 1:
                break
            size = (good + bad) // 2  # binsearch between what fit and what did not
        return good

    def _trial_fits(self, module: TrainModule, datamodule: DataModule | None, steps: int) -> bool:
        trainer = self._search_trainer(max_steps=steps, callbacks=[])
        try:
            trainer.fit(module, datamodule=datamodule)
        except BaseException as error:
            if not is_out_of_memory(error):
                raise
            return False
        finally:
            del trainer
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        return True

    @staticmethod
    def _dataset_exhausted(module: TrainModule, datamodule: DataModule | None, size: int) -> bool:
        source = datamodule if datamodule is not None else module
        try:
            return size >= len(source.train_dataloader().dataset)
        except (TypeError, AttributeError, NotImplementedError):
            return False

    @staticmethod
    def _batch_owner(module: TrainModule, datamodule: DataModule | None, name: str) -> Any:
        for owner in ([datamodule] if datamodule is not None else []) + [module]:
            for candidate in (owner, owner.hparams):
                if _has(candidate, name):
                    return candidate
        where = f"{type(datamodule).__name__} or {type(module).__name__}" if datamodule else type(module).__name__
        raise AttributeError(f"scale_batch_size needs {where}.{name} (or hparams.{name}), read by train_dataloader()"
                             f": add it, or pass batch_arg_name=<the attribute's name>.")

    # -- the search's own trainer ----------------------------------------------------------------------------
    def _search_trainer(self, max_steps: int, callbacks: list[Any]) -> Any:
        """The user's trainer's settings (precision, accumulation, clipping, limits...) for a short search run:
        its own step count, folder and callbacks, no validation, trackers, bar, summary, seed or signals."""
        config, acc = self.trainer.config, self.trainer.accelerator
        return type(self.trainer).from_config(dataclasses.replace(
            config, accelerator="cpu" if acc.device.type == "cpu" else "auto", max_steps=max_steps, max_epochs=-1,
            max_time=None, fast_dev_run=False, overfit_batches=0.0, limit_val_batches=0, num_sanity_val_steps=0, log_with=None, logger=None,
            project_dir=self._folder, default_root_dir=None, callbacks=callbacks, enable_progress_bar=False,
            enable_model_summary=False, enable_checkpointing=False, preemption_signals=None, seed=None,
            deterministic=False, profiler=None, devices="auto", strategy="auto", num_nodes=1))

    @contextlib.contextmanager
    def _restored(self, module: TrainModule) -> Iterator[None]:
        """Run a search, then put back the module's weights and buffers and the random state."""
        weights = copy.deepcopy(module.state_dict())
        rng = capture_rng_state()
        self._folder = tempfile.mkdtemp(prefix="ember-tuner-")
        try:
            yield
        finally:
            module.load_state_dict(weights)
            restore_rng_state(rng)
            shutil.rmtree(self._folder, ignore_errors=True)
            module._trainer_ref = None  # the search's trainer is gone; the user's attaches it again


def _has(owner: Any, name: str) -> bool:
    return name in owner if isinstance(owner, dict) else hasattr(owner, name)


def _assign(owner: Any, name: str, value: Any) -> None:
    if isinstance(owner, dict):
        owner[name] = value
    else:
        setattr(owner, name, value)
