"""`TrainModule`: a ``torch.nn.Module`` with Lightning's steps, hooks and ``self.log``."""

from __future__ import annotations

import inspect
import os
import weakref
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from engine.operations import recursively_apply
from trainer.checkpoint.loading import load_module
from trainer.data_hooks import DataHooks
from trainer.errors import MisconfigurationError
from trainer.export import to_onnx, to_torchscript
from trainer.hparams import HyperparametersMixin
from trainer.metrics.logger import LogOptions, ReduceFx, metric_collection_items
from trainer.optim import clip_gradients, clip_settings
from trainer.tools.compiling import strip_prefix, with_compiled_names

if TYPE_CHECKING:
    from typing_extensions import Self

    from engine import Accelerator
    from trainer.host import ModuleHost


class TrainModule(DataHooks, HyperparametersMixin, torch.nn.Module):
    """A model plus how to train it: steps, ``configure_optimizers``, hooks and ``self.log``.

    A ``LightningModule`` that uses the common subset runs after swapping its base class for this one. The
    trainer is referenced weakly and kept out of ``state_dict``, pickling and ``deepcopy``.

    Example:
        >>> class Regressor(TrainModule):
        ...     def __init__(self, lr: float = 0.1) -> None:
        ...         super().__init__()
        ...         self.save_hyperparameters()
        ...         self.net = torch.nn.Linear(3, 1)
        ...     def training_step(self, batch, batch_idx):
        ...         x, y = batch
        ...         loss = torch.nn.functional.mse_loss(self.net(x), y)
        ...         self.log("train/loss", loss)
        ...         return loss
        ...     def configure_optimizers(self):
        ...         return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)
        >>> Regressor().hparams
        {'lr': 0.1}
    """

    automatic_optimization: bool = True
    __jit_unused_properties__: ClassVar[list[str]]  # these two are set below the class
    __jit_ignored_attributes__: ClassVar[list[str]]
    strict_loading: bool | None = None  # load_from_checkpoint's strict when it is not given (None: True)
    # Lightning's names of the .ckpt keys holding the module's hyper-parameters (trainer.checkpoint.lightning_format).
    CHECKPOINT_HYPER_PARAMS_KEY, CHECKPOINT_HYPER_PARAMS_NAME, CHECKPOINT_HYPER_PARAMS_TYPE = (
        "hyper_parameters", "hparams_name", "hparams_type")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._trainer_ref: weakref.ReferenceType[ModuleHost] | None = None

    @classmethod
    def load_from_checkpoint(cls, checkpoint_path: str | os.PathLike[str], map_location: Any = None,
                             hparams_file: str | os.PathLike[str] | None = None, strict: bool | None = None,
                             weights_only: bool | None = None, **kwargs: Any) -> Self:
        """Rebuild the module from a checkpoint's saved hyper-parameters and load its weights.

        Args:
            checkpoint_path: a ``.ckpt`` file (``ModelCheckpoint``, ``trainer.save_checkpoint``, or Lightning's),
                or a checkpoint folder (sharded backends, older runs).
            map_location: the device to move the module to (default: the CPU).
            hparams_file: a YAML file whose hyper-parameters replace the saved ones.
            strict: require the weights' keys to match the module's exactly (default True).
            weights_only: ``False`` allows unpickling hyper-parameters that are not plain data, and Lightning
                files that need unpickling (only for checkpoints you trust); by default such a hyper-parameter
                must be passed again in ``kwargs``.
            **kwargs: hyper-parameters overriding the saved ones (e.g. a backbone left out of them).

        Example (``MyModel`` saved with ``self.save_hyperparameters()``)::

            model = MyModel.load_from_checkpoint("runs/checkpoints/epoch=9-step=500.ckpt", lr=1e-4)
            model.eval()
        """
        return load_module(cls, checkpoint_path, map_location, hparams_file, strict, weights_only, kwargs)

    # -- the trainer it runs in -------------------------------------------------------------------------------
    @property
    def trainer(self) -> Any:  # the whole Trainer for user code; the module itself asks only ModuleHost's names
        """The ``Trainer`` running this module (raises when it is not attached to one)."""
        trainer = self._attached_trainer()
        if trainer is None and not self.__dict__.get("_jit_is_scripting"):  # torch.jit reads every attribute
            raise RuntimeError(f"{type(self).__name__} is not attached to a `Trainer`: `self.trainer` is available "
                               "inside trainer.fit / validate / test / predict (and after them, while the trainer "
                               "exists).")
        return trainer

    @trainer.setter
    def trainer(self, trainer: ModuleHost | None) -> None:
        """Attach the module and the TrainModules inside it to ``trainer`` (``None`` detaches them), as Lightning
        allows; the Trainer does it itself at the start of each run. Held by weak reference: the module never keeps
        a trainer alive."""
        ref = None if trainer is None else weakref.ref(trainer)
        for child in self.modules():
            if isinstance(child, TrainModule):
                child._trainer_ref = ref

    def _host(self) -> ModuleHost:
        """The attached trainer as the module's own code sees it (``trainer.host``); raises as ``self.trainer``."""
        host: ModuleHost = self.trainer
        return host

    @property
    def _trainer(self) -> ModuleHost | None:
        """Lightning's ``module._trainer``: the attached trainer or ``None`` (code and tests written for Lightning
        assign it to attach a module by hand, e.g. to call ``self.log`` outside a run)."""
        return self._attached_trainer()

    @_trainer.setter
    def _trainer(self, trainer: ModuleHost | None) -> None:
        self._trainer_ref = None if trainer is None else weakref.ref(trainer)

    @property
    def fabric(self) -> None:
        """Lightning's ``module.fabric``: always ``None`` (Ember has no Fabric; a module runs in a ``Trainer``)."""
        return None

    @property
    def accelerator(self) -> Accelerator:
        """The engine ``Accelerator`` of the trainer (for ``gather``, ``reduce``, ``print``, ...)."""
        return self._host().accelerator

    @property
    def device(self) -> torch.device:
        """The device of the module's first parameter or buffer (the trainer's device when it has none)."""
        for tensor in self.parameters():
            return tensor.device
        for buffer in self.buffers():
            return buffer.device
        trainer = self._attached_trainer()
        return trainer.accelerator.device if trainer is not None else torch.device("cpu")

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of the module's first floating-point parameter or buffer (torch's default dtype without one),
        as Lightning's ``LightningModule.dtype``: e.g. to build tensors in a step that match the weights."""
        tensors = (t for source in (self.parameters(), self.buffers()) for t in source if t.is_floating_point())
        return next((t.dtype for t in tensors), torch.get_default_dtype())

    @property
    def global_rank(self) -> int:
        """This process's rank among all processes (0 without a trainer)."""
        trainer = self._attached_trainer()
        return trainer.global_rank if trainer is not None else 0

    @property
    def local_rank(self) -> int:
        """This process's rank on its machine (0 without a trainer)."""
        trainer = self._attached_trainer()
        return trainer.local_rank if trainer is not None else 0

    @property
    def logger(self) -> Any:
        """``trainer.logger``: the first Lightning-style logger of the run (``None`` without one or a trainer)."""
        trainer = self._attached_trainer()
        return trainer.logger if trainer is not None else None

    @property
    def loggers(self) -> list[Any]:
        """``trainer.loggers``: every Lightning-style logger of the run (``[]`` without a trainer)."""
        trainer = self._attached_trainer()
        return trainer.loggers if trainer is not None else []

    @property
    def global_step(self) -> int:
        """Optimizer steps taken so far (0 without a trainer)."""
        trainer = self._attached_trainer()
        return trainer.global_step if trainer is not None else 0

    @property
    def current_epoch(self) -> int:
        """The training epoch in progress (0 without a trainer)."""
        trainer = self._attached_trainer()
        return trainer.current_epoch if trainer is not None else 0

    def _attached_trainer(self) -> ModuleHost | None:
        ref = self.__dict__.get("_trainer_ref")
        return None if ref is None else ref()

    def __getstate__(self) -> dict[str, Any]:
        # A weakref cannot be pickled or deep-copied, and a copy must not drive the original's trainer anyway.
        state = dict(self.__dict__)
        state["_trainer_ref"] = None
        return state

    # -- state without torch.compile's shells -----------------------------------------------------------------
    def state_dict(self, *args: Any, destination: Any = None, prefix: str = "", keep_vars: bool = False) -> Any:
        """``nn.Module.state_dict`` without ``_orig_mod.`` in the keys of ``torch.compile``d submodules, so a
        checkpoint loads into a compiled or uncompiled module alike."""
        state = super().state_dict(*args, destination=destination, prefix=prefix, keep_vars=keep_vars)
        return strip_prefix(state, prefix)

    def load_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True, assign: bool = False) -> Any:
        """``nn.Module.load_state_dict`` accepting plain keys for compiled submodules (and the reverse)."""
        return super().load_state_dict(with_compiled_names(self, state_dict), strict=strict, assign=assign)

    # -- logging ----------------------------------------------------------------------------------------------
    def log(self, name: str, value: Any, prog_bar: bool = False, logger: bool = True, on_step: bool | None = None,
            on_epoch: bool | None = None, reduce_fx: ReduceFx = "mean", enable_graph: bool = False,
            sync_dist: bool | None = None, add_dataloader_idx: bool = True, batch_size: int | None = None,
            rank_zero_only: bool = False) -> None:
        """Record a scalar metric; it reaches ``trainer.callback_metrics``, the trackers and (``prog_bar``) the bar.

        Args:
            name: the metric name (``"train/loss"``).
            value: a number, a one-element tensor (kept as a detached tensor: no device sync here), or a
                torchmetrics ``Metric``: its last ``forward`` value per step, ``compute()`` at the epoch end, then
                ``reset()``; it syncs its own state across processes (``sync_dist`` is not applied to it).
            prog_bar: show it in the progress bar.
            logger: send it to the trackers.
            on_step: keep the per-step value (default: True in training batches, False elsewhere).
            on_epoch: aggregate it over the epoch (default: the opposite of ``on_step``'s default). With both,
                the names logged are ``{name}_step`` and ``{name}_epoch``.
            reduce_fx: the epoch aggregate: ``"mean"`` (weighted by batch size), ``"sum"``, ``"max"``, ``"min"``,
                or a callable reducing a 1-D tensor of the epoch's values.
            enable_graph: keep the autograd graph (not detached).
            sync_dist: reduce across processes with ``reduce_fx``. ``None`` (the default): validation and test
                epoch values are exact over the whole dataset (every sample counted once, padding repeats
                dropped, the same value on every process); training values stay per process, as in Lightning.
                ``True`` also reduces each step value when it is logged (one collective per call) and training
                epoch values; ``False`` keeps Lightning's per-process values everywhere. Every process must log
                the same names in the same order.
            add_dataloader_idx: with several evaluation loaders, append ``/dataloader_idx_{i}`` to the name.
            batch_size: the weight of this value in the epoch mean (default: inferred from the batch).
            rank_zero_only: accepted for Lightning compatibility; only the main process logs to trackers anyway.
        """
        del rank_zero_only
        ref = self.__dict__.get("_trainer_ref")  # inlined _attached_trainer: this runs on every logged value
        trainer = None if ref is None else ref()
        if trainer is None:
            raise RuntimeError(f"self.log({name!r}, ...) was called on a module that is not attached to a Trainer: "
                               "call it from inside training_step / validation_step / a hook during trainer.fit.")
        trainer.log_value(name, value, LogOptions(prog_bar, logger, on_step, on_epoch, reduce_fx, sync_dist,
                                                  batch_size, enable_graph, add_dataloader_idx))

    def log_dict(self, dictionary: Mapping[str, Any] | Any, prog_bar: bool = False, logger: bool = True,
                 on_step: bool | None = None, on_epoch: bool | None = None, reduce_fx: ReduceFx = "mean",
                 enable_graph: bool = False, sync_dist: bool | None = None, add_dataloader_idx: bool = True,
                 batch_size: int | None = None, rank_zero_only: bool = False) -> None:
        """``self.log`` for every item of ``dictionary`` (a dict, or a torchmetrics ``MetricCollection``)."""
        collection = metric_collection_items(dictionary)
        if collection is not None:
            dictionary = collection
        if not isinstance(dictionary, Mapping):
            raise TypeError(f"log_dict takes a dict of name -> value. Received: {type(dictionary).__name__}.")
        for name, value in dictionary.items():
            self.log(name, value, prog_bar, logger, on_step, on_epoch, reduce_fx, enable_graph, sync_dist,
                     add_dataloader_idx, batch_size, rank_zero_only)

    @property
    def device_mesh(self) -> Any:
        """The ``("data_parallel", "tensor_parallel")`` device mesh under ``ModelParallelStrategy`` (split the model
        with it in ``configure_model``); ``None`` under every other strategy, as in Lightning."""
        return self.__dict__.get("_device_mesh")

    def all_gather(self, data: Any, group: Any = None, sync_grads: bool = False) -> Any:
        """Every process's ``data`` (tensors, possibly nested in lists / dicts) stacked along a new first dim, as
        Lightning's ``all_gather`` (in one process: ``data`` as it is). ``sync_grads``: gradients flow back."""
        if group is not None:
            raise ValueError("all_gather(group=...) is not supported: Ember gathers over every process. Gather a "
                             "subgroup with torch.distributed yourself.")
        if self._host().accelerator.num_processes == 1:
            return data

        def stack(tensor: torch.Tensor) -> torch.Tensor:
            if sync_grads:
                from torch.distributed.nn.functional import all_gather  # differentiable; imported when asked

                return torch.stack(all_gather(tensor.contiguous()))
            parts = [torch.empty_like(tensor) for _ in range(torch.distributed.get_world_size())]
            torch.distributed.all_gather(parts, tensor.contiguous())
            return torch.stack(parts)

        return recursively_apply(stack, data)

    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print`` on the main process only, through the progress bar while one is enabled (so a bar being
        drawn is not broken), as in Lightning."""
        trainer = self._attached_trainer()
        if trainer is not None and not trainer.accelerator.is_main_process:
            return
        bar = getattr(trainer, "progress_bar_callback", None)
        if bar is not None and bar.is_enabled:
            bar.print(*args, **kwargs)
        else:
            print(*args, **kwargs)

    # -- optimisation -----------------------------------------------------------------------------------------
    def freeze(self) -> Self:
        """Every parameter without gradients and the module in eval mode, for inference; returns the module."""
        for param in self.parameters():
            param.requires_grad = False
        return self.eval()

    def unfreeze(self) -> Self:
        """Every parameter with gradients again and the module in training mode; returns the module."""
        for param in self.parameters():
            param.requires_grad = True
        return self.train()

    def configure_optimizers(self) -> Any:
        """Return the optimizers and schedulers (any of Lightning's forms, see ``trainer.optim.parse_optimizers``)."""
        raise MisconfigurationError(f"{type(self).__name__} does not define configure_optimizers: add e.g. "
                                  "`def configure_optimizers(self): return torch.optim.AdamW(self.parameters())`.")

    def optimizers(self, use_pl_optimizer: bool = True) -> Any:
        """The prepared optimizer (or a list of them); ``step()`` counts as a global step under manual optimisation.

        Each is a ``torch.optim.Optimizer`` whose ``step`` / ``zero_grad`` respect gradient accumulation.
        """
        del use_pl_optimizer
        optimizers = self._host().module_optimizers()
        return optimizers[0] if len(optimizers) == 1 else list(optimizers)

    def lr_schedulers(self) -> Any:
        """The schedulers from ``configure_optimizers`` (one, a list, or ``None``), for manual optimisation."""
        schedulers = [config.scheduler for config in self._host().lr_scheduler_configs]
        if not schedulers:
            return None
        return schedulers[0] if len(schedulers) == 1 else schedulers

    def manual_backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        """Backward through the engine (scaling, accumulation), firing ``on_before_backward`` / ``on_after_backward``."""
        if self.automatic_optimization:
            raise RuntimeError("manual_backward is for manual optimisation: set `self.automatic_optimization = "
                               "False` in __init__, or return the loss from training_step and let the trainer "
                               "run backward.")
        self._host().strategy.backward(loss, None, *args, **kwargs)  # Lightning's route (code wraps it)

    def backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        """The backward of each training step (automatic optimisation) and of ``manual_backward``, called between
        ``on_before_backward`` and ``on_after_backward`` with the loss already divided by the accumulation factor;
        override to customise (e.g. ``loss.backward(retain_graph=True)``). Default: the engine's backward (fp16
        loss scaling, DeepSpeed's engine), which an override reaches with ``super().backward(loss)``.

        Example:
            >>> class KeepGraph(TrainModule):
            ...     def backward(self, loss, *args, **kwargs):
            ...         loss.backward(retain_graph=True)  # fp16: call super().backward(loss, retain_graph=True)
        """
        self._host().engine_backward(loss, *args, **kwargs)

    def toggle_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        """Freeze the parameters of the trainer's other optimizers (until ``untoggle_optimizer``), e.g. for GANs.

        As Lightning: a parameter no optimizer holds keeps its ``requires_grad``. Outside a trainer (no optimizers
        known), every parameter ``optimizer`` does not hold is frozen.
        """
        owned = {id(p) for group in optimizer.param_groups for p in group["params"]}
        trainer = self._attached_trainer()
        others = list(trainer.optimizers or []) if trainer is not None else []
        params = ([p for opt in others for group in opt.param_groups for p in group["params"]] if others
                  else list(self.parameters()))
        saved: dict[torch.Tensor, bool] = {}
        for param in params:
            if param in saved:
                continue
            saved[param] = param.requires_grad
            if id(param) not in owned:
                param.requires_grad = False
        self.__dict__["_toggled_requires_grad"] = saved

    def untoggle_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        """Restore the ``requires_grad`` flags that ``toggle_optimizer`` changed."""
        del optimizer
        for param, requires_grad in self.__dict__.pop("_toggled_requires_grad", {}).items():
            param.requires_grad = requires_grad

    def clip_gradients(self, optimizer: torch.optim.Optimizer, gradient_clip_val: float | None = None,
                       gradient_clip_algorithm: str | None = None) -> None:
        """Clip the gradients of ``optimizer``'s parameters through the engine (``"norm"`` default, or ``"value"``).

        As Lightning: a value or algorithm not given is the trainer's (``Trainer(gradient_clip_val=...,
        gradient_clip_algorithm=...)``), and one given that differs from the trainer's is an error.
        """
        trainer = self._attached_trainer()
        config = trainer.config if trainer is not None else None
        if config is not None:
            gradient_clip_val, gradient_clip_algorithm = clip_settings(config, gradient_clip_val,
                                                                        gradient_clip_algorithm)
        clip_gradients(self.accelerator, optimizer, gradient_clip_val, gradient_clip_algorithm)

    def configure_gradient_clipping(self, optimizer: torch.optim.Optimizer, gradient_clip_val: float | None = None,
                                    gradient_clip_algorithm: str | None = None) -> None:
        """Called before each optimizer step with the trainer's clipping settings; override to customise (without
        an override the trainer clips by itself, with the same result)."""
        self.clip_gradients(optimizer, gradient_clip_val=gradient_clip_val,  # by name, as Lightning calls it
                            gradient_clip_algorithm=gradient_clip_algorithm)

    def optimizer_step(self, epoch: int, batch_idx: int, optimizer: torch.optim.Optimizer,
                       optimizer_closure: Any = None) -> None:
        """Step ``optimizer``; override for e.g. learning-rate warm-up (call ``optimizer.step(closure=...)``)."""
        optimizer.step(closure=optimizer_closure)

    def optimizer_zero_grad(self, epoch: int, batch_idx: int, optimizer: torch.optim.Optimizer) -> None:
        """Zero ``optimizer``'s gradients after its step."""
        optimizer.zero_grad()

    def lr_scheduler_step(self, scheduler: Any, metric: Any) -> None:
        """Step ``scheduler`` (with the monitored value for ``ReduceLROnPlateau``)."""
        if metric is None:
            scheduler.step()
        else:
            scheduler.step(metric)

    # -- steps and data (override what you use) ---------------------------------------------------------------
    def training_step(self, *args: Any, **kwargs: Any) -> Any:
        """Return the loss tensor, a dict with a ``"loss"`` key, or ``None`` to skip the batch."""
        raise MisconfigurationError(f"{type(self).__name__} does not define training_step(self, batch, batch_idx).")

    def validation_step(self, *args: Any, **kwargs: Any) -> Any:
        """One validation batch; log metrics with ``self.log``."""
        raise MisconfigurationError(f"{type(self).__name__} does not define validation_step(self, batch, batch_idx).")

    def test_step(self, *args: Any, **kwargs: Any) -> Any:
        """One test batch; log metrics with ``self.log``."""
        raise MisconfigurationError(f"{type(self).__name__} does not define test_step(self, batch, batch_idx).")

    def predict_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> Any:
        """One prediction batch (default: ``self(batch)``)."""
        return self(batch)

    def configure_model(self) -> None:
        """Build layers late (called once at the start of each run, before ``configure_optimizers``)."""

    def configure_callbacks(self) -> Any:
        """Callbacks this module needs, added to the trainer's (replacing ones of the same class)."""
        return []

    # -- hooks (see callbacks.base for when each fires) -------------------------------------------------------
    def on_fit_start(self) -> None: ...
    def on_fit_end(self) -> None: ...
    def on_train_start(self) -> None: ...
    def on_train_end(self) -> None: ...
    def on_train_epoch_start(self) -> None: ...
    def on_train_epoch_end(self) -> None: ...
    def on_train_batch_start(self, batch: Any, batch_idx: int) -> int | None: ...
    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None: ...
    def on_validation_start(self) -> None: ...
    def on_validation_end(self) -> None: ...
    def on_validation_epoch_start(self) -> None: ...
    def on_validation_epoch_end(self) -> None: ...
    def on_validation_batch_start(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None: ...
    def on_validation_batch_end(self, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None: ...
    def on_test_start(self) -> None: ...
    def on_test_end(self) -> None: ...
    def on_test_epoch_start(self) -> None: ...
    def on_test_epoch_end(self) -> None: ...
    def on_test_batch_start(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None: ...
    def on_test_batch_end(self, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None: ...
    def on_predict_start(self) -> None: ...
    def on_predict_end(self) -> None: ...
    def on_predict_epoch_start(self) -> None: ...
    def on_predict_epoch_end(self) -> None: ...
    def on_predict_batch_start(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None: ...
    def on_predict_batch_end(self, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None: ...
    # The mode hooks of evaluation runs (before ``on_validation_start`` / after ``on_validation_end``, test and
    # predict alike). Not overridden, the trainer puts the model in eval mode and afterwards restores each
    # submodule's own mode; an override replaces that (``super()`` does Lightning's default: eval / train).
    def on_validation_model_eval(self) -> None:
        self.eval()

    def on_validation_model_train(self) -> None:
        self.train()

    def on_test_model_eval(self) -> None:
        self.eval()

    def on_test_model_train(self) -> None:
        self.train()

    def on_predict_model_eval(self) -> None:
        self.eval()

    def on_before_backward(self, loss: torch.Tensor) -> None: ...
    def on_after_backward(self) -> None: ...
    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None: ...
    def on_before_zero_grad(self, optimizer: torch.optim.Optimizer) -> None: ...
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None: ...
    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None: ...

    to_onnx, to_torchscript = to_onnx, to_torchscript  # exports for serving (trainer/export.py)


# torch.jit.script(module) compiles every property not listed here (Lightning lists its own): these read the trainer
# or hold Python objects, and a scripted module runs without a trainer. The class's annotated settings are left
# out too (their annotations are strings here, which TorchScript cannot resolve once a module sets one).
TrainModule.__jit_unused_properties__ = sorted(name for name, value in inspect.getmembers(TrainModule)
                                               if isinstance(value, property))
TrainModule.__jit_ignored_attributes__ = sorted(n for n in TrainModule.__annotations__ if not n.startswith("__"))
