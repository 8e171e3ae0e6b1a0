"""`RunPlan`: what a run iterates and how it optimises, prepared through the engine once per entry point.

The plan holds the prepared loaders and their batch counts, the validation cadence, the prepared model and the
optimisation mode (automatic or manual, which module methods are overridden). ``fit`` / ``validate`` /
``test`` / ``predict`` build their part of it at set-up; the loop only reads it.
"""

from __future__ import annotations

import functools
import time
import warnings
from collections.abc import Callable, Iterator
from itertools import islice
from typing import Any, Protocol, TypeGuard

import torch
from torch.utils.data import DataLoader

from engine import Accelerator, broadcast_object_list
from engine.precision.policy import Precision
from engine.prepare.optimizer import zeroes_plainly
from trainer import args as checks
from trainer.config import TrainerConfig
from trainer.datamodule import DataModule
from trainer.loop.combined import CombinedTrainData, check_train_mode, prepare_combined, training_combination
from trainer.loop.data import (
    PlacedBatches,
    check_loaders,
    check_not_empty,
    check_val_loop,
    limit_batches,
    loader_length,
    no_data,
    request_loaders,
    resolve_shaped,
    warn_unresumable,
    without_shuffle,
)
from trainer.loop.hooks import overrides
from trainer.loop.reload import ReloadSchedule, epoch_shown, first_validating_epoch, stage_shown
from trainer.loop.router import StepRouter, step_function
from trainer.loop.stepping import check_evaluable
from trainer.loop.transfer import Transfer, batch_transfer, transferred
from trainer.module import TrainModule
from trainer.optim import (
    ManualOptimizer,
    NoOptimizer,
    SchedulerConfig,
    check_custom_schedulers,
    check_one_optimizer,
    parse_optimizers,
)
from trainer.state import TrainState
from trainer.strategies.base import Strategy
from trainer.tools.compiling import Compiler, take_compiled
from trainer.utilities.combined_loader import CombinedLoader
from trainer.utilities.seed import attach_worker_init, isolate_rng
from trainer.utilities.tree import Shape, unflatten

_SOURCE_OF = {"validate": "val", "test": "test", "predict": "predict"}



class ResumableLoader(Protocol):
    """A loader that tells and takes its position (the engine's prepared loaders, ``StatefulDataLoader``)."""

    def __iter__(self) -> Iterator[Any]: ...
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state_dict: dict[str, Any]) -> None: ...


def _resumable(loader: object) -> TypeGuard[ResumableLoader]:
    """Whether ``loader`` has a ``state_dict`` (the engine's loaders also load one)."""
    return callable(getattr(loader, "state_dict", None))

class RunPlan:
    """The prepared objects of the trainer's runs, and the cadence read off them.

    ``prepared`` lists what was prepared through the engine, in order: a resumed run must prepare the same
    sequence, or loader and model states would land on the wrong objects.
    """

    def __init__(self, accelerator: Accelerator, strategy: Strategy | None = None,
                 state: TrainState | None = None) -> None:
        self.accelerator = accelerator
        self.state = state  # the trainer's: what the loader hooks see (trainer.sanity_checking, current_epoch)
        self.strategy = strategy  # trainer.strategy (a ModelParallelStrategy's module splits itself)
        self.prepared: list[str] = []
        self.train_loader: DataLoader | CombinedTrainData | None = None
        self.train_source: DataLoader | CombinedLoader | None = None
        self.first_train_loader: Any = None  # the (first) training loader as given, before preparing
        self.combined: CombinedLoader | None = None  # several training loaders (None: the one-loader path)
        self.transfer: Transfer | None = None  # the batch-transfer hooks (None: none overridden)
        self.shapes: dict[str, Shape | None] = {}  # how each kind's evaluation loaders were given ("val", ...)
        self._given: dict[str, list[Any]] = {}  # each kind's loaders as given, before the engine prepared them
        self.num_training_batches: int | None = 0
        self.val_loaders: list[DataLoader] = []
        self.num_val_batches: list[int | None] = []
        self.num_sanity_val_batches: list[int | None] = []
        self.val_every: int | None = None  # validate every N batches; None: once per validating epoch
        self.val_seconds: float | None = None  # val_check_interval as a time: validate after this much training
        self._val_clock = 0.0
        self.test_loaders: list[DataLoader] = []
        self.num_test_batches: list[int | None] = []
        self.predict_loaders: list[DataLoader] = []
        self.num_predict_batches: list[int | None] = []
        self.model: torch.nn.Module | None = None  # the prepared StepRouter around the module
        self._model_for: tuple[TrainModule, bool] | None = None
        self.training_step: Callable[..., Any] | None = None
        self.compiler: Compiler | None = None  # compiles the module's steps (set per run by the trainer)
        self.optimizers: list[torch.optim.Optimizer] = []
        self.module_optimizers: list[torch.optim.Optimizer] = []  # what module.optimizers() returns
        self.scheduler_configs: list[SchedulerConfig] = []
        self.automatic = True
        self.custom_optimizer_step = self.custom_zero_grad = self.clip = self.custom_clipping = False
        self.custom_backward = False  # the module overrides backward: the trainer calls it instead of the engine's
        self.torch_optimizer: torch.optim.Optimizer | None = None  # automatic: the one optimizer, unwrapped
        self.plain_zero_grad = False  # its zero_grad is torch's own (engine.prepare.optimizer.clear_grads may replace it)
        # reload_dataloaders_every_n_epochs: the schedule, where the loaders come from, and which epochs built the
        # loaders held now (None: reloading is off, or the fit's loaders were passed in: nothing to ask again).
        self.reload: ReloadSchedule | None = None
        self._reload_from: tuple[TrainerConfig, DataModule | None, TrainModule] | None = None
        self._reload_train: bool = False
        self._reload_val: bool = False
        self._held: tuple[float, float] = (0.0, 0.0)  # (training, validation) loaders' epochs

    # -- fit ------------------------------------------------------------------------------------------------
    def attach(self, module: Any, compile_options: dict[str, Any] | None, check: Callable[[Any], Any]) -> Any:
        """The module a run trains or evaluates (``check``-ed, out of a ``torch.compile`` shell), keeping its step
        compiler for this run (the shell's settings win over ``Trainer(compile=...)``'s ``compile_options``)."""
        module, self.compiler = take_compiled(module, compile_options, check)
        return module

    def show_loaders(self, kind: str, loaders: list[DataLoader], shape: Shape | None = None) -> None:
        """Make ``loaders`` the trainer's ``{kind}`` loaders (``"train"``, ``"val"``, ``"test"``, ``"predict"``),
        in the ``shape`` they were given in, without preparing them: what the tuner leaves behind, as Lightning's
        does (the next run prepares its own)."""
        self._given[kind] = list(loaders[:1] if kind == "train" else loaders)
        if kind == "train":
            self.train_loader = loaders[0] if loaders else None
        else:
            setattr(self, f"{kind}_loaders", list(loaders))
            self.shapes[kind] = shape

    def setup_fit(self, config: TrainerConfig, module: TrainModule, datamodule: DataModule | None,
                  train_dataloaders: Any, val_dataloaders: Any,
                  manual_hooks: tuple[Callable[[torch.optim.Optimizer], None], Callable[[], None]],
                  sanity_check: bool = False) -> None:
        """Prepare the training and validation loaders, the model, the optimizers and schedulers for ``fit``.

        ``manual_hooks`` are the (before step, after step) calls the trainer wants around a manual
        ``optimizer.step()``. ``sanity_check``: the fit starts with one (if the configuration asks for it).
        """
        name = type(module).__name__
        manual = not module.automatic_optimization
        self.transfer = batch_transfer(module, datamodule, self.accelerator.device)
        # As Lightning: with a sanity check to run, the validation loaders are asked for first, under an isolated
        # random state, so loaders built from the global generator get the data they get there (the loaders are
        # still prepared training first, the order a checkpoint's loader states follow).
        sanity_first = (sanity_check and config.num_sanity_val_steps != 0 and bool(config.limit_val_batches)
                        and overrides(module, TrainModule, "validation_step"))
        if sanity_first:  # trainer.sanity_checking reads True inside the hook, as in Lightning
            with isolate_rng(), stage_shown(self.state, "sanity_check"):
                val, self.shapes["val"] = self._request_val(config, val_dataloaders, datamodule, module)
        given = request_loaders("train", train_dataloaders, datamodule, module)
        if given is None:
            raise no_data("train", "fit", module)
        combined = training_combination(given)
        if not sanity_first:  # Lightning asks at the first validation: the hook reads that validation's epoch
            with epoch_shown(self.state, first_validating_epoch(config.check_val_every_n_epoch)):
                val, self.shapes["val"] = self._request_val(config, val_dataloaders, datamodule, module)
        val = check_val_loop(val, val_dataloaders, datamodule, module)
        if combined is None:
            self._set_train_loader(config, check_loaders("train", given))
        else:
            self._set_combined_train(config, combined)
        self._set_val_loaders(config, val)
        self._setup_reload(config, datamodule, module, train_dataloaders is None, val_dataloaders is None)
        backend = self.accelerator.backend
        if backend.prepares_jointly:  # DeepSpeed: the model is built with its optimizer and scheduler
            if manual:
                raise ValueError(f"{name} uses manual optimisation, which the DeepSpeed strategy does not run (its "
                                 "engine steps the optimizer inside backward). Use automatic optimisation, or "
                                 "strategy='ddp' / 'fsdp'.")
            self._configure_model(module)
            optimizers, configs = self._optimizers_of(module, manual)
            backend.configure_training(accumulation_steps=config.accumulation,
                                       micro_batch_size=getattr(self.first_train_loader, "batch_size", None),
                                       clip_value=config.gradient_clip_val,
                                       clip_algorithm=config.gradient_clip_algorithm or "norm")
            prepared = self.prepare_model(module, training=True, together=[*optimizers, *(c.scheduler for c in
                                                                                         configs)],
                                          precision=config.resolved_precision)
        else:
            self.prepare_model(module, training=True, precision=config.resolved_precision)
            optimizers, configs = self._optimizers_of(module, manual)
            result = self.accelerator.prepare(*optimizers, *(c.scheduler for c in configs)) if optimizers else ()
            prepared = list(result) if isinstance(result, tuple) else [result]
        self.optimizers = prepared[:len(optimizers)]
        self.prepared += [f"{len(optimizers)} optimizer(s)", f"{len(configs)} scheduler(s)"]
        self.scheduler_configs = configs  # the user's schedulers: stepped once per step on every process
        before, after = manual_hooks
        self.module_optimizers = ([ManualOptimizer(o, before, after, module) for o in self.optimizers] if manual
                                  else list(self.optimizers))
        self.automatic = not manual
        self.custom_optimizer_step = overrides(module, TrainModule, "optimizer_step")
        self.custom_zero_grad = overrides(module, TrainModule, "optimizer_zero_grad")
        self.custom_backward = overrides(module, TrainModule, "backward")
        if self.optimizers:
            self.torch_optimizer = getattr(self.optimizers[0], "optimizer", self.optimizers[0])
            self.plain_zero_grad = zeroes_plainly(self.torch_optimizer)
        # Without an override the trainer clips by itself (engine call, no detour through the module).
        self.custom_clipping = any(overrides(module, TrainModule, name)
                                   for name in ("configure_gradient_clipping", "clip_gradients"))
        self.clip = config.gradient_clip_val is not None or self.custom_clipping

    @property
    def module(self) -> TrainModule | None:
        """The module the prepared model steps (``None`` before a set-up)."""
        return None if self._model_for is None else self._model_for[0]

    def _prepare_loader(self, loader: Any) -> Any:
        # With batch-transfer hooks, the hooks move each batch to the device (not the loader).
        if not isinstance(loader, DataLoader):  # another iterable of batches: read as it is, batches placed
            placed = self.transfer is None and self.accelerator.device_placement
            return PlacedBatches(loader, self.accelerator.device) if placed else loader
        return self.accelerator.prepare(loader, device_placement=[False] if self.transfer is not None else None)

    @staticmethod
    def _request_val(config: TrainerConfig, given: Any, datamodule: DataModule | None,
                     module: TrainModule) -> tuple[list[DataLoader], Shape | None]:
        return resolve_shaped("val", given, datamodule, module) if config.limit_val_batches else ([], None)

    def _set_train_loader(self, config: TrainerConfig, loader: DataLoader) -> None:
        """The one-loader path: the loop iterates the prepared loader itself."""
        if config.overfit_batches:
            loader = without_shuffle(loader)
        self.train_source = loader  # as given (not prepared): what a learning-rate search inside fit trains on
        self.first_train_loader = loader
        self._given["train"] = [loader]
        # seed_everything(..., workers=True): Lightning's per-worker seeding for loaders without their own init.
        self.train_loader = self._prepare_loader(attach_worker_init(loader, self.accelerator.process_index))
        self.prepared.append("train loader")
        self.combined = None
        check_not_empty(loader, self.train_loader, self.accelerator.num_processes)
        self.num_training_batches = limit_batches(loader_length(self.train_loader), config.limit("train"),
                                                  "limit_train_batches")

    def _set_combined_train(self, config: TrainerConfig, combined: CombinedLoader) -> None:
        """Several training loaders: each prepared on its own, walked together in ``combined``'s mode."""
        self.train_source, self.combined = combined, combined
        self.first_train_loader = combined.flattened[0] if combined.flattened else None
        self.train_loader, self.num_training_batches = prepare_combined(
            combined, lambda loader: self._prepare_loader(attach_worker_init(loader, self.accelerator.process_index)),
            config.overfit_batches, config.limit("train"))
        self.prepared += ["train loader"] * len(combined.flattened)
        self._given["train"] = self.train_loader.sources
        check_train_mode(combined)  # after the count, which Lightning has set when it refuses the mode

    def _shown(self, kind: str, prepared: list[Any]) -> list[Any]:
        """The loaders ``trainer.{kind}_dataloader(s)`` shows: in one process the loaders as given (the user's own
        objects, as Lightning hands them back there), across processes the prepared ones, which read this process's
        share (Lightning's carry a DistributedSampler then)."""
        given = self._given.get(kind)
        one_process = self.accelerator.num_processes == 1
        return given if one_process and given is not None and len(given) == len(prepared) else prepared

    def _shaped(self, kind: str, loaders: list[Any]) -> Any:
        loaders = self._shown(kind, loaders) if kind != "predict" else loaders
        shape = self.shapes.get(kind)
        if shape is None or not loaders:
            return None if shape is None else loaders
        return unflatten(loaders, shape)

    @property
    def val_dataloaders(self) -> Any:
        """``trainer.val_dataloaders``: the prepared loaders in the shape they were given (one loader, a list...)."""
        return self._shaped("val", self.val_loaders)

    @property
    def test_dataloaders(self) -> Any:
        return self._shaped("test", self.test_loaders)

    @property
    def predict_dataloaders(self) -> Any:
        """The prepared predict loaders, always (they record the batch indices the prediction writers read;
        Lightning's are rebuilt for that in every run too)."""
        return self._shaped("predict", self.predict_loaders)

    @property
    def train_dataloader(self) -> Any:
        """``trainer.train_dataloader``: the loader, or the combined collection of loaders (see ``_shown``)."""
        if self.combined is not None:
            return unflatten(self._shown("train", list(self.combined.flattened)), self.combined.shape)
        return None if self.train_loader is None else self._shown("train", [self.train_loader])[0]

    @staticmethod
    def _optimizers_of(module: TrainModule, manual: bool) -> tuple[list[torch.optim.Optimizer], list[SchedulerConfig]]:
        optimizers, configs = parse_optimizers(module.configure_optimizers(), manual)
        check_custom_schedulers(configs, manual, overrides(module, TrainModule, "lr_scheduler_step"),
                                type(module).__name__)
        if not optimizers:
            warnings.warn(f"`LightningModule.configure_optimizers` returned `None`, this fit will run with no "
                          f"optimizer: {type(module).__name__}'s steps run forward, backward and the hooks, and no "
                          "weight changes. Return an optimizer to train.", UserWarning, stacklevel=5)
            optimizers = [NoOptimizer()]
        check_one_optimizer(module, optimizers, manual)
        return optimizers, configs

    def _set_val_loaders(self, config: TrainerConfig, val: list[DataLoader]) -> None:
        self._given["val"] = list(val)
        self.val_loaders = [self._prepare_loader(loader) for loader in val]
        self.prepared += ["val loader"] * len(val)
        self.num_val_batches = [limit_batches(loader_length(v), config.limit("val"), "limit_val_batches")
                                for v in self.val_loaders]
        sanity = config.num_sanity_val_steps or 0  # resolved to an int (0, -1: all, or a count): `or` only types it
        self.num_sanity_val_batches = [n if sanity == -1 else (sanity if n is None else min(sanity, n))
                                       for n in self.num_val_batches]
        self.val_every = None
        self.val_seconds = checks.val_check_seconds(config.val_check_interval)
        if not self.val_loaders or self.val_seconds is not None:
            return
        n_train, interval = self.num_training_batches, config.val_interval
        if checks.is_int(interval):
            if config.check_val_every_n_epoch is not None and n_train is not None and interval > n_train:
                raise ValueError(f"Trainer(val_check_interval={interval}) is larger than the {n_train} training "
                                 "batches of an epoch, so validation would never run: `val_check_interval` must be "
                                 "less than or equal to the number of the training batches. Lower it, or set "
                                 "check_val_every_n_epoch=None to validate every val_check_interval batches across "
                                 "epochs.")
            self.val_every = int(interval)
        elif n_train is not None:
            self.val_every = max(1, int(n_train * interval))
        elif interval != 1.0:
            raise ValueError(f"Trainer(val_check_interval={interval}) is a fraction of the epoch, but the training "
                             "loader has no length: pass an int number of batches.")

    # -- validate / test / predict ----------------------------------------------------------------------------
    def setup_eval(self, kind: str, config: TrainerConfig, module: TrainModule, datamodule: DataModule | None,
                   dataloaders: Any) -> tuple[list[DataLoader], list[int | None]]:
        """Prepare the loaders of ``kind`` (``"validate"``, ``"test"``, ``"predict"``) and the model."""
        check_evaluable(module, kind)
        source = _SOURCE_OF[kind]
        self.transfer = batch_transfer(module, datamodule, self.accelerator.device)
        # Lightning's order: the model is configured, its gradients cleared, then the loaders are asked for.
        self.prepare_model(module, training=False, precision=config.resolved_precision)
        module.zero_grad()
        loaders, self.shapes[source] = resolve_shaped(source, dataloaders, datamodule, module, kind)
        if not loaders and self.shapes[source] is None:  # an empty list given: no batches, as in Lightning
            raise no_data(source, kind, module)
        if kind == "validate":
            self._set_val_loaders(config, loaders)
            return self.val_loaders, self.num_val_batches
        limit = config.limit(kind)  # "test" or "predict"
        prepared = [self._prepare_loader(loader) for loader in loaders]
        self.prepared += [f"{kind} loader"] * len(loaders)
        self._given[kind] = list(loaders)
        counts = [limit_batches(loader_length(p), limit, f"limit_{kind}_batches") for p in prepared]
        if kind == "test":
            self.test_loaders, self.num_test_batches = prepared, counts
        else:
            self.predict_loaders, self.num_predict_batches = prepared, counts
        return prepared, counts

    def prepare_model(self, module: TrainModule, training: bool, together: list[Any] | None = None,
                      precision: Precision | None = None) -> list[Any]:
        """Wrap the module for this setup once (again only to add DDP / FSDP2 when an evaluation came first).

        ``together``: optimizers and schedulers the backend builds with the model (DeepSpeed; the module's
        ``configure_model`` already ran): prepared in the same call, and returned prepared.
        ``precision``: the run's (``TrainerConfig.resolved_precision``); a true one converts the module to its
        dtype and runs its steps in it (the engine does the mixed kinds).
        """
        if self._model_for is not None and self._model_for[0] is module and (self._model_for[1] or not training):
            return []
        if together is None:
            self._configure_model(module)  # before a true precision converts the layers it builds
        if precision is not None and precision.kind != "true":
            precision = None  # the engine's autocast does the mixed kinds; the router only converts true ones
        router = StepRouter(module, self.compiler, precision)  # a true precision converts the module there
        if together is None:
            self.model, prepared = self.accelerator.prepare_model(router, evaluation_mode=not training), []
        else:
            self.model, *prepared = self.accelerator.prepare(router, *together) if together else (
                self.accelerator.prepare(router),)
        self.prepared.append("model" if training else "model (evaluation)")
        self._model_for = (module, training)
        # Unwrapped (one process, no DDP / FSDP2 / compile / autocast wrapper, no hooks), the module's step is
        # called directly: the same call minus nn.Module.__call__ and the router (~2 us per step on a slow CPU).
        bare = (self.model is router and self.compiler is None and precision is None
                and "forward" not in vars(router)
                and not (router._forward_hooks or router._forward_pre_hooks or router._backward_hooks))
        self.training_step = (step_function(module, "training_step", 2) if bare
                              else functools.partial(self.model, "training_step"))
        return prepared

    def _configure_model(self, module: TrainModule) -> None:
        """``module.configure_model()`` where it is overridden (where the strategy needs it, it must be)."""
        if not overrides(module, TrainModule, "configure_model"):
            if self.strategy is not None and self.strategy.requires_configure_model:
                raise TypeError("When using the ModelParallelStrategy, you are required to override the "
                                "`configure_model()` hook in the LightningModule and apply parallelization there.")
            return
        module.configure_model()
        if self.strategy is not None:
            self.strategy.check_parallelized(module)

    # -- cadence ----------------------------------------------------------------------------------------------
    def val_in_epoch(self, config: TrainerConfig, epoch: int) -> bool:
        every = config.check_val_every_n_epoch
        return bool(self.val_loaders) and (every is None or (epoch + 1) % every == 0)

    def start_val_clock(self) -> None:
        """Training starts (or a validation ended): the time towards a time-based validation counts from now."""
        self._val_clock = time.monotonic()

    def time_due(self, config: TrainerConfig, epoch: int) -> bool:
        """Whether ``val_check_interval``'s time has passed since the last validation (in a validating epoch);
        process 0's clock decides for every process (they must validate together)."""
        if self.val_seconds is None or not self.val_in_epoch(config, epoch):
            return False
        due = [time.monotonic() - self._val_clock >= self.val_seconds]
        if self.accelerator.num_processes > 1:
            due = broadcast_object_list(due)
        if due[0]:
            self.start_val_clock()
        return bool(due[0])

    def val_due(self, config: TrainerConfig, epoch: int, batch_idx: int, micro_step: int) -> bool:
        """Whether validation runs after training batch ``batch_idx`` (``micro_step`` counts across epochs)."""
        if self.val_every is None or not self.val_in_epoch(config, epoch):
            return False
        if config.check_val_every_n_epoch is None:
            return micro_step % self.val_every == 0
        return (batch_idx + 1) % self.val_every == 0

    # -- reload_dataloaders_every_n_epochs ---------------------------------------------------------------------
    def _setup_reload(self, config: TrainerConfig, datamodule: DataModule | None, module: TrainModule,
                      train_asked: bool, val_asked: bool) -> None:
        every = config.reload_dataloaders_every_n_epochs
        self.reload = None if not every else ReloadSchedule(every, config.check_val_every_n_epoch,
                                                            sanity=config.num_sanity_val_steps != 0)
        self._reload_from = (config, datamodule, module)
        self._reload_train, self._reload_val = train_asked, val_asked and bool(self.val_loaders)
        self._held = (0.0, self.reload.first_val if self.reload is not None else 0.0)

    def start_epoch(self, state: TrainState) -> None:
        """An epoch starts: the training loader is asked for again when the schedule says so (before the
        samplers' ``set_epoch`` and ``on_train_epoch_start``, as in Lightning), then the samplers learn the epoch."""
        if self.reload is not None and self._reload_train and self.reload.train_epoch(state.epoch) != self._held[0]:
            self._rebuild_train(state, self.reload.train_epoch(state.epoch), carry=False)
        self.set_epoch(state.epoch)

    def reload_val(self, state: TrainState) -> None:
        """A validation inside ``fit`` starts: the validation loaders are asked for again when the schedule says
        so (before ``on_validation_start``, as in Lightning)."""
        if self.reload is None or not self._reload_val or self._reload_from is None:
            return
        epoch = self.reload.val_epoch(state.epoch)
        if epoch == self._held[1]:
            return
        config, datamodule, module = self._reload_from
        old, names = list(self.val_loaders), list(self.prepared)
        with epoch_shown(state, int(epoch)):
            val, shape = resolve_shaped("val", None, datamodule, module)
        if len(val) != len(old):
            raise ValueError(f"val_dataloader() returned {len(val)} loader(s) at epoch {state.epoch}, where it gave "
                             f"{len(old)} before: with reload_dataloaders_every_n_epochs, return as many loaders each "
                             "time (a checkpoint restores each one's place).")
        self.shapes["val"] = shape
        self._set_val_loaders(config, val)
        self.prepared[:] = names  # a rebuilt loader takes its predecessor's place, not a new one
        self.accelerator.replace_dataloaders(old, self.val_loaders)
        self._held = (self._held[0], epoch)

    def _train_loaders(self) -> list[DataLoader]:
        loader = self.train_loader
        return list(loader.loaders) if isinstance(loader, CombinedTrainData) else [] if loader is None else [loader]

    def _rebuild_train(self, state: TrainState, epoch: int, carry: bool) -> None:
        """Ask for the training loader as of ``epoch`` and prepare it in the old one's place; ``carry``: it takes
        over the old one's (restored) position."""
        assert self._reload_from is not None
        config, datamodule, module = self._reload_from
        old, names = self._train_loaders(), list(self.prepared)
        with epoch_shown(state, epoch):
            given = request_loaders("train", None, datamodule, module)
        combined = training_combination(given)
        if combined is None:
            self._set_train_loader(config, check_loaders("train", given))
        else:
            self._set_combined_train(config, combined)
        new = self._train_loaders()
        if len(new) != len(old):
            raise ValueError(f"train_dataloader() returned {len(new)} loader(s) at epoch {epoch}, where it gave "
                             f"{len(old)} before: with reload_dataloaders_every_n_epochs, return as many loaders each "
                             "time (a checkpoint restores each one's place).")
        self.prepared[:] = names
        self.accelerator.replace_dataloaders(old, new)
        if carry:
            for before, after in zip(old, new):
                if _resumable(before) and _resumable(after):
                    after.load_state_dict(before.state_dict())
        self._held = (float(epoch), self._held[1])

    def set_epoch(self, epoch: int) -> None:
        # Shuffling samplers need the epoch, also when an epoch was cut short (limit_train_batches, -1, stops).
        set_epoch = getattr(self.train_loader, "set_epoch", None)
        if callable(set_epoch):
            set_epoch(epoch)

    def estimated_steps(self, config: TrainerConfig) -> int | float:
        """Optimizer steps ``fit`` will take (``inf`` when unbounded)."""
        per_epoch, epochs, max_steps = self.num_training_batches, config.max_epochs, config.max_steps
        if per_epoch is None or epochs is None:
            return max_steps if max_steps is not None else float("inf")
        steps = -(-per_epoch // config.accumulation) * epochs
        return min(steps, max_steps) if max_steps is not None else steps

    def line_up_loaders(self, state: TrainState) -> None:
        """After a resume, bring the restored loaders to where ``state`` says the run is.

        A checkpoint is taken at a boundary, when the loop may not have asked the loader for its end yet: the
        last batch was handed out, or a limited epoch stopped reading early. The training loader's pass is then
        finished here without fetching a batch (its sampler state moves past the epoch, as in the run that saved
        it). Validation passes never span a checkpoint, so a restored one starts from its first batch.

        With ``reload_dataloaders_every_n_epochs``, the training loader the uninterrupted run was reading is asked
        for again first (as of the epoch that built it) and takes over the restored position, under an isolated
        random state (the uninterrupted run drew for it before the checkpoint). At the start of a reloading epoch
        the loop asks for a fresh one instead, as the uninterrupted run did.
        """
        if self.reload is not None and self._reload_train:
            epoch = self.reload.train_epoch(state.epoch)
            if epoch != self._held[0] and (epoch < state.epoch or state.batch_in_epoch > 0):
                with isolate_rng():
                    self._rebuild_train(state, epoch, carry=True)
        warn_unresumable(self._train_loaders(), state.batch_in_epoch)
        loader, count = self.train_loader, self.num_training_batches
        if isinstance(loader, CombinedTrainData):
            loader.line_up(state.batch_in_epoch, count)
            loader = None
        position = loader.state_dict() if _resumable(loader) else None
        if _resumable(loader) and position is not None and position["batches_yielded"] > 0:
            done = position["iteration"] < state.epoch or (count is not None and state.batch_in_epoch >= count)
            length = loader_length(loader)  # an unsized loader always ran to its end: nothing to finish
            if done and length is not None:
                loader.load_state_dict({**position, "batches_yielded": length})
                for _ in loader:
                    raise AssertionError("a loader restored at its end yielded a batch")
        for val_loader in self.val_loaders:
            if _resumable(val_loader):
                position = val_loader.state_dict()
                if position["batches_yielded"]:
                    val_loader.load_state_dict({**position, "batches_yielded": 0})

    def train_batches(self, start: int) -> Iterator[tuple[int, Any]]:
        """``(batch_idx, batch)`` of this epoch's training batches from ``start`` (see ``batches``), through the
        batch-transfer hooks where the module overrides them."""
        return transferred(batches(self.train_loader, self.num_training_batches, start), self.transfer, 0)

    def syncs(self, batch_idx: int, factor: int) -> bool:
        """Whether training batch ``batch_idx`` closes an accumulation window of ``factor`` batches.

        The window position comes from the stored batch index, so accumulation lines up after a resume; the last
        batch of an epoch (also a limited one) always closes its window, as in Lightning.
        """
        return (batch_idx + 1) % factor == 0 or batch_idx + 1 == self.num_training_batches


def batches(loader: Any, count: int | None, start: int = 0) -> Iterator[tuple[int, Any]]:
    """``(batch_idx, batch)`` for the first ``count`` batches of ``loader``, numbered from ``start``.

    ``start`` is the number of batches of this epoch already done before a resume; the prepared loader
    continues from its own restored position (the engine saves it), so nothing is skipped here. A loop that
    breaks early drops this iterator, and the engine's loader ends its pass when its generator is collected
    (at once in CPython), so no explicit close is needed.
    """
    if count is not None and start >= count:
        return iter(())
    it = iter(loader)
    # All of a loader is read to its end (not cut by islice), so its pass finishes and the position it saves at
    # an epoch end is "this epoch done" (see RunPlan.line_up_loaders for limited epochs).
    if count is None or count == loader_length(loader):
        return enumerate(it, start)
    return enumerate(islice(it, count - start), start)
