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
import shutil
import tempfile
import warnings
from collections.abc import Iterator
from typing import Any

from callbacks import BatchSizeFinder, LearningRateFinder
from engine.random import capture_rng_state, restore_rng_state
from trainer.compat.keywords import accepts_model
from trainer.config import TrainerConfig
from trainer.datamodule import DataModule
from trainer.loop.data import resolve_loaders, resolve_shaped
from trainer.module import TrainModule
from trainer.tools import batch_size as sizes
from trainer.tools.compiling import unwrap_compiled
from trainer.tools.lr_finder import MODES, LRFinder, LRSweep
from trainer.utilities.exceptions import MisconfigurationException

LR_NAMES = ("lr", "learning_rate")
METHODS = sizes.METHODS


def check_tuner_configuration(train_dataloaders: Any, val_dataloaders: Any, dataloaders: Any, method: str) -> None:
    """Lightning's checks of ``method`` against the loaders given: ``dataloaders`` is for the evaluation methods,
    ``train_dataloaders`` / ``val_dataloaders`` for ``"fit"``."""
    if method not in METHODS:
        raise ValueError(f"method {method!r} is invalid. Should be one of {METHODS}.")
    if method == "fit" and dataloaders is not None:
        raise MisconfigurationException(f"In tuner with method={method!r}, `dataloaders` argument should be None, "
                                        "please consider setting `train_dataloaders` and `val_dataloaders` instead.")
    if method != "fit" and (train_dataloaders is not None or val_dataloaders is not None):
        raise MisconfigurationException(f"In tuner with `method`={method!r}, `train_dataloaders` and "
                                        "`val_dataloaders` arguments should be None, please consider setting "
                                        "`dataloaders` instead.")


class Tuner:
    """Searches for a learning rate or batch size with a trainer's settings.

    Example:
        >>> import torch
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
        >>> _ = torch.manual_seed(0)  # the same data whatever ran before in this process
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
                dataloaders: Any = None, datamodule: DataModule | None = None, method: str = "fit",
                min_lr: float = 1e-8, max_lr: float = 1.0, num_training: int = 100, mode: str = "exponential",
                early_stop_threshold: float | None = 4.0, update_attr: bool = True,
                attr_name: str = "") -> LRFinder | None:
        """Sweep the learning rate from ``min_lr`` to ``max_lr`` over ``num_training`` optimizer steps.

        Returns the ``LRFinder`` (``results``, ``suggestion()``, ``plot(path)``). With ``update_attr`` the
        suggestion is written to ``attr_name`` (default: the module's or its hparams' ``lr`` /
        ``learning_rate``). ``val_dataloaders`` is accepted for Lightning compatibility (no validation runs).
        """
        if method != "fit":
            raise MisconfigurationException(f"method='fit' is the only valid configuration to run lr finder. "
                                            f"Received: method={method!r}.")
        check_tuner_configuration(train_dataloaders, val_dataloaders, dataloaders, method)
        if any(isinstance(c, LearningRateFinder) for c in self.trainer.callbacks):
            raise ValueError("Trainer is already configured with a `LearningRateFinder` callback.Please remove it if "
                             "you want to use the Tuner.")
        return self.search_lr(module, train_dataloaders, datamodule, min_lr=min_lr, max_lr=max_lr,
                              num_training=num_training, mode=mode, early_stop_threshold=early_stop_threshold,
                              update_attr=update_attr, attr_name=attr_name)

    def search_lr(self, module: TrainModule, train_dataloaders: Any = None, datamodule: DataModule | None = None,
                  *, min_lr: float = 1e-8, max_lr: float = 1.0, num_training: int = 100, mode: str = "exponential",
                  early_stop_threshold: float | None = 4.0, update_attr: bool = True,
                  attr_name: str = "") -> LRFinder | None:
        """The sweep itself, shared by ``lr_find`` and the ``LearningRateFinder`` callback."""
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
        with self._restored(module, datamodule):
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
    def scale_batch_size(self, module: TrainModule, train_dataloaders: Any = None, val_dataloaders: Any = None,
                         dataloaders: Any = None, datamodule: DataModule | None = None, method: str = "fit",
                         mode: str = "power", steps_per_trial: int = 3, init_val: int = 2, max_trials: int = 25,
                         batch_arg_name: str = "batch_size", margin: float = 0.05,
                         max_val: int = sizes.DEFAULT_MAX_VAL) -> int | None:
        """The largest batch size that runs ``method`` (``"fit"``, ``"validate"``, ``"test"``, ``"predict"``)
        without running out of memory, written to ``batch_arg_name`` (see ``trainer.tools.batch_size`` for the
        search: doubling with ``"power"``, then bisecting with ``"binsearch"``, minus ``margin``).

        The loaders are rebuilt from the module's (or data module's) ``*_dataloader()`` for every trial, so they
        must read ``batch_arg_name`` (on the module, its hparams, the data module or its hparams). Each trial runs
        ``steps_per_trial`` batches from the same weights; the weights and random state are restored afterwards.
        """
        check_tuner_configuration(train_dataloaders, val_dataloaders, dataloaders, method)
        if self.trainer.accelerator.num_processes > 1:
            raise ValueError("Tuning the batch size is currently not supported with distributed strategies: an "
                             "out-of-memory trial on one rank would end the others. Find the size on one device, "
                             "then launch with it.")
        if any(isinstance(c, BatchSizeFinder) for c in self.trainer.callbacks):
            raise ValueError("Trainer is already configured with a `BatchSizeFinder` callback.Please remove it if "
                             "you want to use the Tuner.")
        if isinstance(train_dataloaders, DataModule):
            datamodule, train_dataloaders = train_dataloaders, None
        if train_dataloaders is not None or val_dataloaders is not None or dataloaders is not None:
            raise MisconfigurationException(
                "The Batch size finder cannot be used with dataloaders passed directly to `.fit()`. Please disable "
                "the feature or incorporate the dataloader into your LightningModule or LightningDataModule "
                f"(build it in *_dataloader() from self.{batch_arg_name}).")
        if datamodule is not None:  # as the fit Lightning's Tuner runs: the data module's data exists to measure
            datamodule.prepare_data()
            datamodule.setup(method)
        size = self.search_batch_size(module, datamodule, method, mode=mode, steps_per_trial=steps_per_trial,
                                      init_val=init_val, max_trials=max_trials, batch_arg_name=batch_arg_name,
                                      margin=margin, max_val=max_val)
        self._show_loaders(module, datamodule, method)
        return size

    def _show_loaders(self, module: TrainModule, datamodule: DataModule | None, method: str) -> None:
        """Leave the trainer as Lightning's tuner does: the module and data module attached, and
        ``trainer.train_dataloader`` (and the other loaders of ``method``) built at the size found. They are not
        prepared: the next run prepares its own."""
        module.trainer = self.trainer
        self.trainer.datamodule = datamodule
        plan = self.trainer.plan
        kinds = ["train", "val"] if method == "fit" else ["val" if method == "validate" else method]
        for kind in kinds:
            plan.show_loaders(kind, *resolve_shaped(kind, None, datamodule, module))

    def search_batch_size(self, module: TrainModule, datamodule: DataModule | None, method: str = "fit", *,
                          mode: str = "power", steps_per_trial: int = 3, init_val: int = 2, max_trials: int = 25,
                          batch_arg_name: str = "batch_size", margin: float = 0.05,
                          max_val: int = sizes.DEFAULT_MAX_VAL) -> int | None:
        """The search itself, shared by ``scale_batch_size`` and the ``BatchSizeFinder`` callback."""
        module = unwrap_compiled(module)[0]
        mode = sizes.check_search_arguments(mode, steps_per_trial, init_val, max_trials, margin, max_val)
        if method != "fit":  # Lightning's order: several evaluation loaders are refused first
            self._loader_of(module, datamodule, method)
        holders = sizes.attribute_holders(module, datamodule, batch_arg_name)
        if not holders:
            raise MisconfigurationException(f"Field {batch_arg_name} not found in `model`, `datamodule`, nor their "
                                            f"`hparams` attributes. Add {type(module).__name__}.{batch_arg_name} "
                                            "(read by its *_dataloader()), or pass batch_arg_name=<its name>.")
        if hasattr(module, batch_arg_name) and batch_arg_name in (getattr(module, "hparams", None) or {}):
            warnings.warn(f"Field `model.{batch_arg_name}` and `model.hparams.{batch_arg_name}` are mutually "
                          f"exclusive! `model.{batch_arg_name}` will be used as the initial batch size for scaling. "
                          "If this is not the intended behavior, please remove either one.", UserWarning,
                          stacklevel=4)
        length = self._dataset_length(self._loader_of(module, datamodule, method))
        if self._skipped_on_fast_dev_run("batch size scaler"):
            return None

        def fits(size: int) -> bool:
            return self._trial_fits(module, datamodule, method, steps_per_trial)

        with self._restored(module, datamodule):
            search = sizes.SizeSearch(fits, lambda size: sizes.write_size(holders, batch_arg_name, size),
                                      start=sizes.read_size(holders, batch_arg_name), dataset_length=length,
                                      mode=mode, init_val=init_val, max_trials=max_trials, margin=margin,
                                      max_val=max_val)
            return search.run()

    def _trial_fits(self, module: TrainModule, datamodule: DataModule | None, method: str, steps: int) -> bool:
        """Run ``method`` for ``steps`` batches at the size the attribute holds now; False on out-of-memory."""
        limit = {"fit": {"max_steps": steps}, "validate": {"limit_val_batches": steps},
                 "test": {"limit_test_batches": steps}, "predict": {"limit_predict_batches": steps}}[method]
        trainer = self._search_trainer(callbacks=[], **limit)
        out_of_memory = False
        try:
            if method == "fit":
                trainer.fit(module, datamodule=datamodule)
            elif method == "predict":
                trainer.predict(module, datamodule=datamodule, return_predictions=False)
            else:
                getattr(trainer, method)(module, datamodule=datamodule, verbose=False)
        except (RuntimeError, MemoryError) as error:
            if not sizes.is_oom_error(error):  # read from the module at call time: a test may patch it there
                raise
            out_of_memory = True
            return False
        finally:
            del trainer
            sizes.free_memory(out_of_memory)
        return True

    @staticmethod
    def _loader_of(module: TrainModule, datamodule: DataModule | None, method: str) -> Any:
        """The one loader ``method`` runs on, built from the module or data module (several evaluation loaders
        are refused: the search sizes one)."""
        kind = {"fit": "train", "validate": "val"}.get(method, method)
        loaders = resolve_loaders(kind, None, datamodule, module)
        if len(loaders) > 1:
            raise MisconfigurationException(f"The Batch size finder cannot be used with multiple {kind} dataloaders "
                                            f"(received {len(loaders)}): search with one, then use the size for all.")
        if not loaders:
            raise MisconfigurationException(
                f"The Batch size finder needs {type(module).__name__}.{kind}_dataloader() (or the data module's): "
                "it rebuilds the loader for every size it tries.")
        return loaders[0]

    @staticmethod
    def _dataset_length(loader: Any) -> int | None:
        """The samples a loader's dataset holds (None: unknown, e.g. an iterable dataset)."""
        try:
            return len(loader.dataset)
        except (TypeError, AttributeError, NotImplementedError):
            return None

    # -- the search's own trainer ----------------------------------------------------------------------------
    def _search_trainer(self, callbacks: list[Any], max_steps: int | None = None, **limits: Any) -> Any:
        """The user's trainer's settings (precision, accumulation, clipping, limits...) for a short search run:
        its own step count (or ``limits``: the evaluation batches of a trial), folder and callbacks, no validation
        while fitting, no trackers, bar, summary, seed or signals."""
        config, acc = self.trainer.config, self.trainer.accelerator
        overrides: dict[str, Any] = {
            "accelerator": "cpu" if acc.device.type == "cpu" else "auto", "max_epochs": -1, "max_time": None,
            "max_steps": config.max_steps if max_steps is None else max_steps, "fast_dev_run": False,
            "overfit_batches": 0.0, "limit_val_batches": 0, "num_sanity_val_steps": 0, "log_with": None,
            "logger": None, "project_dir": self._folder, "default_root_dir": None, "callbacks": callbacks,
            "enable_progress_bar": False, "enable_model_summary": False, "enable_checkpointing": False,
            "preemption_signals": None, "seed": None, "deterministic": False, "profiler": None, "devices": "auto",
            "strategy": "auto", "num_nodes": 1}
        return type(self.trainer).from_config(dataclasses.replace(config, **{**overrides, **limits}))

    @contextlib.contextmanager
    def _restored(self, module: TrainModule, datamodule: DataModule | None = None) -> Iterator[None]:
        """Run a search, then put back the module's weights and buffers, the random state, and the trainer the
        module and data module were attached to (the search's trainers attach them to themselves)."""
        weights = copy.deepcopy(module.state_dict())
        rng = capture_rng_state()
        trainer, data_ref = module._trainer, getattr(datamodule, "_trainer_ref", None)
        self._folder = tempfile.mkdtemp(prefix="ember-tuner-")
        try:
            yield
        finally:
            module.load_state_dict(weights)
            restore_rng_state(rng)
            shutil.rmtree(self._folder, ignore_errors=True)
            module.trainer = trainer  # the module and its inner TrainModules
            if datamodule is not None:
                datamodule._trainer_ref = data_ref


def _has(owner: Any, name: str) -> bool:
    return name in owner if isinstance(owner, dict) else hasattr(owner, name)


def _assign(owner: Any, name: str, value: Any) -> None:
    if isinstance(owner, dict):
        owner[name] = value
    else:
        setattr(owner, name, value)
