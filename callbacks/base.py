"""`Callback`: Lightning's hook names and signatures, and the one place that says when each hook fires.

Timeline
========

Every hook below is called on the callbacks (in ``Trainer.callbacks`` order) and then on the module (same name,
without the ``trainer, module`` arguments), as in Lightning 2.6. At the four ``*_epoch_end`` hooks the epoch's
metrics are computed into ``trainer.callback_metrics`` before each call (callbacks, then the module; at
``on_train_epoch_end`` the callbacks that declare ``epoch_end_after_module`` (``ModelCheckpoint``,
``EarlyStopping``) run after the module, so they see what it logged there), then the epoch metrics go to the
trackers. ``[...]`` marks hooks that only fire
under a condition. ``dataloader_idx`` is only passed to evaluation hooks and steps when there are several loaders.

``fit``::

    setup(stage="fit")                          # after prepare_data, on every process
    on_fit_start
    [sanity check: only with validation data and num_sanity_val_steps != 0]
        on_sanity_check_start
        on_validation_start
        on_validation_epoch_start
            on_validation_batch_start(batch, batch_idx[, dataloader_idx])
            on_validation_batch_end(outputs, batch, batch_idx[, dataloader_idx])   # per batch
        on_validation_epoch_end
        on_validation_end
        on_sanity_check_end                     # sanity metrics are dropped here
    on_train_start
    for each epoch:
        on_train_epoch_start
        for each batch:
            on_train_batch_start(batch, batch_idx)     # the module returning -1 ends the epoch here
            # training_step(batch, batch_idx)
            [on the first micro-batch of an accumulation window only:]
                on_before_zero_grad(optimizer)         # the torch optimizer, as in Lightning 2.6
                # optimizer.zero_grad()
            on_before_backward(loss)
            # backward (the loss divided by the accumulation factor)
            on_after_backward
            [on the last micro-batch of an accumulation window only:]
                on_before_optimizer_step(optimizer)    # gradients synced, not clipped (still scaled under fp16)
                # gradient clipping, optimizer.step(), step-interval schedulers
            on_train_batch_end(outputs, batch, batch_idx)
            # step metrics go to the trackers every log_every_n_steps optimizer steps
            [validation, when val_check_interval / check_val_every_n_epoch say so:
                on_validation_start ... on_validation_end as above, without the sanity hooks]
            # after an optimizer step: step-interval ReduceLROnPlateau schedulers, then the stop check
            # (max_steps, max_time, trainer.should_stop on any process): a stop ends the epoch here
        on_train_epoch_end                      # callbacks, module, ModelCheckpoint / EarlyStopping, trackers
        # epoch-interval schedulers (ReduceLROnPlateau reads the metrics logged so far)
    on_train_end
    on_fit_end
    teardown(stage="fit")

Under manual optimisation (``automatic_optimization = False``) the batch is ``on_train_batch_start``,
``training_step`` (inside it: ``manual_backward`` fires ``on_before_backward`` / ``on_after_backward``, and each
``optimizer.step()`` fires ``on_before_optimizer_step``), ``on_train_batch_end``.

``validate`` / ``test`` (``X`` is ``validation`` or ``test``)::

    setup(stage="validate" | "test")
    on_X_start
    on_X_epoch_start
        on_X_batch_start(batch, batch_idx[, dataloader_idx])
        on_X_batch_end(outputs, batch, batch_idx[, dataloader_idx])     # per batch, per data loader
    on_X_epoch_end                              # epoch metrics computed, callbacks, module, trackers
    on_X_end
    teardown(stage)

``predict``::

    setup(stage="predict")
    on_predict_start
    on_predict_epoch_start
        on_predict_batch_start(batch, batch_idx[, dataloader_idx])
        on_predict_batch_end(outputs, batch, batch_idx[, dataloader_idx])
    on_predict_epoch_end                        # callbacks, then the module
    on_predict_end
    teardown(stage="predict")

``on_exception(trainer, module, exception)`` runs when any of the above raises, before the error propagates
(``teardown`` then does not run).
``on_save_checkpoint`` / ``on_load_checkpoint`` run when a checkpoint is written / restored. Inside ``fit``,
checkpoints (``ModelCheckpoint``, preemption, ``max_time``) are written at two boundaries only: after a batch is
completely done (optimizer step, validation, plateau schedulers, stop decision), and after
``on_train_epoch_end`` and the epoch schedulers (the ``TrainState`` already pointing at the next epoch). A save
asked for anywhere else waits for the next boundary, so a resumed run never repeats or skips a hook.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import torch

from callbacks.protocols import TrainerView

HOOK_NAMES = (
    "setup", "teardown", "on_fit_start", "on_fit_end", "on_sanity_check_start", "on_sanity_check_end",
    "on_train_start", "on_train_end", "on_train_epoch_start", "on_train_epoch_end", "on_train_batch_start",
    "on_train_batch_end", "on_validation_start", "on_validation_end", "on_validation_epoch_start",
    "on_validation_epoch_end", "on_validation_batch_start", "on_validation_batch_end", "on_test_start",
    "on_test_end", "on_test_epoch_start", "on_test_epoch_end", "on_test_batch_start", "on_test_batch_end",
    "on_predict_start", "on_predict_end", "on_predict_epoch_start", "on_predict_epoch_end",
    "on_predict_batch_start", "on_predict_batch_end", "on_before_backward", "on_after_backward",
    "on_before_optimizer_step", "on_before_zero_grad", "on_exception", "on_save_checkpoint", "on_load_checkpoint",
)


class Callback:
    """Base class of trainer callbacks: override the hooks you need (see the module docstring for when each fires).

    Only overridden hooks are called, so an unused hook costs nothing per step. A callback with state returns it
    from ``state_dict`` (JSON-able values and tensors) and restores it in ``load_state_dict``; it is stored in
    checkpoints under ``state_key``.

    Example:
        >>> class CountBatches(Callback):
        ...     def __init__(self) -> None:
        ...         self.batches = 0
        ...     def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        ...         self.batches += 1
        ...     def state_dict(self) -> dict:
        ...         return {"batches": self.batches}
        ...     def load_state_dict(self, state_dict: dict) -> None:
        ...         self.batches = state_dict["batches"]
        >>> CountBatches().state_key
        'CountBatches'
    """

    #: Where this callback's ``on_train_epoch_end`` runs: ``False`` before the module's (Lightning's place for
    #: most callbacks), ``True`` after it, for a callback that reads what the module logged there
    #: (``ModelCheckpoint`` and ``EarlyStopping``, Lightning's "monitoring" callbacks, set it).
    epoch_end_after_module: ClassVar[bool] = False
    #: The running module's ``log`` / ``log_dict``, lent to every callback as each run starts (as Lightning), so a
    #: hook can call ``self.log("name", value)``.
    log: Callable[..., None]
    log_dict: Callable[..., None]

    @property
    def skipped_hooks(self) -> frozenset[str]:
        """Hooks this callback overrides but does not need in the run about to start (read once as each run
        starts, before ``setup``): the trainer then never calls them in that run. The default is none; a
        callback whose per-batch hook has nothing to do in some configuration (a progress bar writing to a
        file) returns it here, so the per-batch path costs nothing. A property, not a method: the callback's
        public methods are Lightning's hooks and nothing else (Lightning's tests and tools enumerate them)."""
        return frozenset()

    @property
    def state_key(self) -> str:
        """The key of this callback's state in a checkpoint; unique per trainer (override when several instances
        of one class keep state, e.g. by including their arguments)."""
        return type(self).__qualname__

    def state_dict(self) -> dict[str, Any]:
        """This callback's state for a checkpoint (empty: nothing to save)."""
        return {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore what ``state_dict`` returned."""

    # -- set-up and tear-down ---------------------------------------------------------------------------------
    def setup(self, trainer: TrainerView, pl_module: torch.nn.Module, stage: str) -> None:
        """Start of fit / validate / test / predict (``stage`` is one of those names), after ``prepare_data``."""

    def teardown(self, trainer: TrainerView, pl_module: torch.nn.Module, stage: str) -> None:
        """End of fit / validate / test / predict."""

    def on_fit_start(self, trainer: TrainerView, pl_module: torch.nn.Module) -> None:
        """Fit begins: model, optimizers and data loaders are prepared."""

    def on_fit_end(self, trainer: TrainerView, pl_module: torch.nn.Module) -> None:
        """Fit ends (after ``on_train_end``)."""

    def on_sanity_check_start(self, trainer: TrainerView, pl_module: torch.nn.Module) -> None:
        """The validation sanity check begins."""

    def on_sanity_check_end(self, trainer: TrainerView, pl_module: torch.nn.Module) -> None:
        """The validation sanity check ended."""

    # -- training ---------------------------------------------------------------------------------------------
    def on_train_start(self, trainer: TrainerView, pl_module: torch.nn.Module) -> None:
        """Training begins (after the sanity check)."""

    def on_train_end(self, trainer: TrainerView, pl_module: torch.nn.Module) -> None:
        """Training ended (the last epoch is done or a stop condition was met)."""

    def on_train_epoch_start(self, trainer: TrainerView, pl_module: torch.nn.Module) -> None:
        """A training epoch begins."""

    def on_train_epoch_end(self, trainer: TrainerView, pl_module: torch.nn.Module) -> None:
        """A training epoch ended (after any epoch-end validation; ModelCheckpoint / EarlyStopping run after the
        module's own ``on_train_epoch_end``, other callbacks before it, as in Lightning)."""

    def on_train_batch_start(self, trainer: TrainerView, pl_module: torch.nn.Module,
                             batch: Any, batch_idx: int) -> None:
        """Before ``training_step``."""

    def on_train_batch_end(self, trainer: TrainerView, pl_module: torch.nn.Module, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        """After the batch's backward (and optimizer step, on the last micro-batch of an accumulation window).

        ``outputs`` is what ``training_step`` returned, with the loss detached.
        """

    def on_before_backward(self, trainer: TrainerView, pl_module: torch.nn.Module,
                           loss: torch.Tensor) -> None:
        """Before ``backward(loss)``; ``loss`` is already divided by ``accumulate_grad_batches``, as in Lightning."""

    def on_after_backward(self, trainer: TrainerView, pl_module: torch.nn.Module) -> None:
        """After ``backward``; gradients may not be synced across processes yet while accumulating."""

    def on_before_optimizer_step(self, trainer: TrainerView, pl_module: torch.nn.Module,
                                 optimizer: torch.optim.Optimizer) -> None:
        """Before ``optimizer.step()`` and before gradient clipping (under fp16 the gradients are still scaled)."""

    def on_before_zero_grad(self, trainer: TrainerView, pl_module: torch.nn.Module,
                            optimizer: torch.optim.Optimizer) -> None:
        """After ``training_step`` on an accumulation window's first batch, before ``optimizer.zero_grad()`` and the
        backward (Lightning 2.6's place); ``optimizer`` is the torch optimizer."""

    # -- validation / test / predict --------------------------------------------------------------------------
    def on_validation_start(self, trainer: TrainerView, pl_module: torch.nn.Module) -> None:
        """A validation run (or the sanity check) begins; the module is in eval mode."""

    def on_validation_end(self, trainer: TrainerView, pl_module: torch.nn.Module) -> None:
        """A validation run ended; its epoch metrics are in ``trainer.callback_metrics``."""

    def on_validation_epoch_start(self, trainer: TrainerView, pl_module: torch.nn.Module) -> None:
        """Before the first validation batch."""

    def on_validation_epoch_end(self, trainer: TrainerView, pl_module: torch.nn.Module) -> None:
        """After the last validation batch (module first, then callbacks)."""

    def on_validation_batch_start(self, trainer: TrainerView, pl_module: torch.nn.Module,
                                  batch: Any, batch_idx: int,
                                  dataloader_idx: int = 0) -> None:
        """Before ``validation_step``."""

    def on_validation_batch_end(self, trainer: TrainerView, pl_module: torch.nn.Module,
                                outputs: Any, batch: Any,
                                batch_idx: int, dataloader_idx: int = 0) -> None:
        """After ``validation_step``."""

    def on_test_start(self, trainer: TrainerView, pl_module: torch.nn.Module) -> None:
        """A test run begins."""

    def on_test_end(self, trainer: TrainerView, pl_module: torch.nn.Module) -> None:
        """A test run ended."""

    def on_test_epoch_start(self, trainer: TrainerView, pl_module: torch.nn.Module) -> None:
        """Before the first test batch."""

    def on_test_epoch_end(self, trainer: TrainerView, pl_module: torch.nn.Module) -> None:
        """After the last test batch (module first, then callbacks)."""

    def on_test_batch_start(self, trainer: TrainerView, pl_module: torch.nn.Module,
                            batch: Any, batch_idx: int,
                            dataloader_idx: int = 0) -> None:
        """Before ``test_step``."""

    def on_test_batch_end(self, trainer: TrainerView, pl_module: torch.nn.Module,
                          outputs: Any, batch: Any, batch_idx: int,
                          dataloader_idx: int = 0) -> None:
        """After ``test_step``."""

    def on_predict_start(self, trainer: TrainerView, pl_module: torch.nn.Module) -> None:
        """A predict run begins."""

    def on_predict_end(self, trainer: TrainerView, pl_module: torch.nn.Module) -> None:
        """A predict run ended."""

    def on_predict_epoch_start(self, trainer: TrainerView, pl_module: torch.nn.Module) -> None:
        """Before the first predict batch."""

    def on_predict_epoch_end(self, trainer: TrainerView, pl_module: torch.nn.Module) -> None:
        """After the last predict batch (module first, then callbacks)."""

    def on_predict_batch_start(self, trainer: TrainerView, pl_module: torch.nn.Module,
                               batch: Any, batch_idx: int,
                               dataloader_idx: int = 0) -> None:
        """Before ``predict_step``."""

    def on_predict_batch_end(self, trainer: TrainerView, pl_module: torch.nn.Module, outputs: Any, batch: Any,
                             batch_idx: int, dataloader_idx: int = 0) -> None:
        """After ``predict_step`` (``outputs`` is this process's prediction, before gathering)."""

    # -- errors and checkpoints -------------------------------------------------------------------------------
    def on_exception(self, trainer: TrainerView, pl_module: torch.nn.Module,
                     exception: BaseException) -> None:
        """Something raised inside fit / validate / test / predict; the exception propagates afterwards."""

    def on_save_checkpoint(self, trainer: TrainerView, pl_module: torch.nn.Module,
                           checkpoint: dict[str, Any]) -> None:
        """A checkpoint is being written: add entries to ``checkpoint`` (JSON-able values and tensors)."""

    def on_load_checkpoint(self, trainer: TrainerView, pl_module: torch.nn.Module,
                           checkpoint: dict[str, Any]) -> None:
        """A checkpoint was read: ``checkpoint`` holds what ``on_save_checkpoint`` added."""
