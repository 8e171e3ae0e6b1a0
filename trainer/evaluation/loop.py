"""`EvaluationLoop`: the validation / test loop (fit's validation and sanity check included), predict's loop,
and the epoch end that computes metrics between the module's and the callbacks' epoch-end hooks."""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any

import torch

from engine import Accelerator
from trainer.evaluation.batch_counts import BatchCounts
from trainer.evaluation.exact import drop_padding, metric_states_kept
from trainer.evaluation.predict import gather_step
from trainer.loop.hooks import HookTable
from trainer.loop.plan import RunPlan, batches
from trainer.loop.transfer import transferred
from trainer.metrics.logger import MetricLogger, to_python
from trainer.metrics.tracking import TrackerLink
from trainer.profiling import profile, profiled_iter
from trainer.state import TrainState
from trainer.states import RunningStage, TrainerFn
from trainer.utilities.rank_zero import rank_zero_warn
from trainer.utilities.seed import isolate_rng


class EvaluationLoop:
    """Runs evaluation passes over the plan's loaders; the run's ``HookTable`` is passed to each call."""

    def __init__(self, accelerator: Accelerator, state: TrainState, plan: RunPlan, metrics: MetricLogger,
                 trackers: TrackerLink, inference_mode: bool = True) -> None:
        self.accelerator = accelerator
        self.state = state
        self.plan = plan
        self.metrics = metrics
        self.trackers = trackers
        # Lightning's Trainer(inference_mode=True): evaluation runs under torch.inference_mode (else no_grad).
        # Not under FSDP2 (as Lightning's FSDP strategy): the parameters it gathers in an evaluation forward would
        # be inference tensors, which the next training forward cannot update in place.
        self.grad_off = (torch.inference_mode if inference_mode and accelerator.backend.allows_inference_mode
                         else torch.no_grad)
        self.batch_counts = BatchCounts()  # what trainer.fit_loop / validate_loop ... report (loop_views)

    def run(self, stage: str, hooks: HookTable) -> list[dict[str, float]]:
        """One validation or test run (or the sanity check): every loader's batches, then the epoch metrics."""
        if stage == "sanity_check":
            with isolate_rng():  # as Lightning: the sanity check leaves the training's random streams untouched
                return self._run(stage, hooks)
        return self._run(stage, hooks)

    def _run(self, stage: str, hooks: HookTable) -> list[dict[str, float]]:
        metrics, plan, model, module = self.metrics, self.plan, self.plan.model, self.plan.module
        assert model is not None and module is not None
        inside_fit = self.state.fn == TrainerFn.FITTING  # the stage is set before setup, outside fit too
        if stage == "validate" and inside_fit:  # reload_dataloaders_every_n_epochs
            plan.reload_val(self.state)
        x = "test" if stage == "test" else "validation"
        loaders = plan.test_loaders if stage == "test" else plan.val_loaders
        counts = {"test": plan.num_test_batches, "validate": plan.num_val_batches,
                  "sanity_check": plan.num_sanity_val_batches}[stage]
        previous = self.state.stage
        alone = not inside_fit  # a validate() / test() call, outside fit: its rows are not training rows
        if alone:  # its results replace the last run's (Lightning)
            metrics.clear_results()
        self.state.stage = RunningStage(stage)
        metrics.set_stage(stage)
        if stage == "sanity_check":
            saved = metrics.snapshot()
            hooks.call("on_sanity_check_start")
        # Inside fit, as Lightning: no_grad, never inference_mode, since what validation creates may take part in
        # training afterwards (e.g. a pruning mask computed at the validation epoch's end).
        grad_off = torch.no_grad if self.state.fn == TrainerFn.FITTING else self.grad_off
        with grad_off():  # the whole run, its start and end hooks included, as in Lightning
            modes = to_eval_mode(x, hooks, module, model)
            results = self._passes(x, stage, hooks, model, loaders, counts, alone)
            if hooks.has(f"on_{x}_model_train"):
                hooks.call_module(f"on_{x}_model_train")
                sync_wrapper_modes(module, model)
            else:
                restore_modes(module, model, modes)
        if stage == "sanity_check":
            hooks.call("on_sanity_check_end")
            metrics.restore(saved)
        self.state.stage = previous
        if previous == "train":
            metrics.set_stage("train", fresh=False)
        if len(loaders) <= 1:
            return [results]
        return metrics.loader_results(results, len(loaders))

    def _passes(self, x: str, stage: str, hooks: HookTable, model: Any, loaders: list[Any],
                counts: list[int | None], alone: bool) -> dict[str, Any]:
        """``on_{x}_start`` to ``on_{x}_end``: every loader's batches and the epoch metrics (``alone``: a
        validate() / test() call outside fit, whose tracker rows are not training rows)."""
        metrics = self.metrics
        step, batch_start, batch_end = f"{x}_step", f"on_{x}_batch_start", f"on_{x}_batch_end"
        counted = self._counted_as(stage)
        if counted is not None:
            self.batch_counts.start_run(counted, self.state.epoch)
        hooks.call(f"on_{x}_start")
        hooks.call(f"on_{x}_epoch_start")
        for dl_idx, (loader, count) in enumerate(zip(loaders, counts)):
            metrics.set_loader(dl_idx if len(loaders) > 1 else None)
            numbered = transferred(batches(loader, count), self.plan.transfer, dl_idx)
            for batch_idx, batch in profiled_iter(hooks.profiler, f"{x}_dataloader_next", numbered):
                batch, padding = drop_padding(loader, batch_idx, batch)  # exact across processes
                metrics.new_batch(batch, padding)
                # As in Lightning, dataloader_idx is only passed when there are several loaders.
                step_args = (batch, batch_idx) if len(loaders) == 1 else (batch, batch_idx, dl_idx)
                # Only repeats: the step runs (every process in step) but no torchmetrics Metric keeps it.
                kept = metric_states_kept(model, metrics.metric_objects()) if padding else nullcontext()
                with kept:
                    hooks.call(batch_start, *step_args)
                    with profile(hooks.profiler, step):
                        outputs = model(step, *step_args)
                    if counted is not None:
                        self.batch_counts.step_done(counted)
                    hooks.call(batch_end, outputs, *step_args)
                if counted is not None:
                    self.batch_counts.batch_done(counted)
                if counted is not None:  # not the sanity check; loggers: at the loader's batch count (Lightning)
                    self.trackers.log(metrics.step_values(), new_row=alone,
                                      logger_step=self.trackers.steps.eval_batch(counted, dl_idx))
        metrics.set_loader(None)
        if counted is not None:
            self.batch_counts.end_run(counted)
        logged = stage != "sanity_check"
        results = to_python(self.epoch_end(f"on_{x}_epoch_end", hooks, log=logged, new_row=alone))
        hooks.call(f"on_{x}_end")
        return results

    def _counted_as(self, stage: str) -> str | None:
        """The ``BatchCounts`` loop a run of ``stage`` counts in (the sanity check counts in none)."""
        if stage == "sanity_check":
            return None
        return "fit_validate" if stage == "validate" and self.state.fn == TrainerFn.FITTING else stage

    def predict(self, hooks: HookTable, return_predictions: bool | None) -> list[list[Any]]:
        """``predict_step`` over the plan's predict loaders; per loader, every process's predictions in order."""
        plan, model, module = self.plan, self.plan.model, self.plan.module
        assert model is not None and module is not None
        loaders, counts = plan.predict_loaders, plan.num_predict_batches
        self.state.stage = RunningStage.PREDICTING
        self.metrics.set_stage("predict")
        with self.grad_off():  # the whole run, its start and end hooks included, as in Lightning
            modes = to_eval_mode("predict", hooks, module, model)
            try:
                return self._predict_passes(hooks, model, loaders, counts, return_predictions)
            finally:
                restore_modes(module, model, modes)

    def _predict_passes(self, hooks: HookTable, model: Any, loaders: list[Any], counts: list[int | None],
                        return_predictions: bool | None) -> list[list[Any]]:
        self.batch_counts.start_run("predict", self.state.epoch)
        hooks.call("on_predict_start")
        hooks.call("on_predict_epoch_start")
        results: list[list[Any]] = [[] for _ in loaders]
        warned = False
        for dl_idx, (loader, count) in enumerate(zip(loaders, counts)):
            numbered = transferred(batches(loader, count), self.plan.transfer, dl_idx)
            for batch_idx, batch in profiled_iter(hooks.profiler, "predict_dataloader_next", numbered):
                step_args = (batch, batch_idx) if len(loaders) == 1 else (batch, batch_idx, dl_idx)
                hooks.call("on_predict_batch_start", *step_args)
                with profile(hooks.profiler, "predict_step"):
                    prediction = model("predict_step", *step_args)
                if prediction is None and not warned:  # once a run, as Lightning's (its words)
                    rank_zero_warn("predict returned None if it was on purpose, ignore this warning...")
                    warned = True
                self.batch_counts.step_done("predict")
                hooks.call("on_predict_batch_end", prediction, *step_args)
                self.batch_counts.batch_done("predict")
                if return_predictions is not False:
                    results[dl_idx] += gather_step(self.accelerator, prediction)
        self.batch_counts.end_run("predict")
        self.batch_counts.predictions = results[0] if len(results) == 1 else results
        self.epoch_end("on_predict_epoch_end", hooks, log=False)
        hooks.call("on_predict_end")
        return results

    def epoch_end(self, hook: str, hooks: HookTable, log: bool = True, new_row: bool = False) -> dict[str, Any]:
        """Epoch metrics, then Lightning 2.6's order: the callbacks' epoch-end hook, then the module's (at the
        training epoch's end: the callbacks, the module, then those declaring ``epoch_end_after_module``); the trackers.

        The metrics are computed before each hook call (only what was logged since, after the first), so every
        hook reads up-to-date values in ``trainer.callback_metrics``.
        """
        metrics = self.metrics
        results = metrics.end_epoch()
        training = hook == "on_train_epoch_end"
        hooks.call_callbacks(hook, after_module=False if training else None)
        results.update(metrics.end_epoch())
        hooks.call_module(hook)
        results.update(metrics.end_epoch())
        if training:
            hooks.call_callbacks(hook, after_module=True)
            results.update(metrics.end_epoch())
        metrics.reset_metric_objects()  # torchmetrics Metrics: reset after every epoch-end hook could read them
        if log:
            self.trackers.log(metrics.epoch_values(results), new_row=new_row)
        return results


def to_eval_mode(x: str, hooks: HookTable, module: torch.nn.Module, model: torch.nn.Module) -> dict[str, bool]:
    """Put the prepared ``model`` (around ``module``) in eval mode for an evaluation run (``x``: ``"validation"``,
    ``"test"``, ``"predict"``), through the module's ``on_{x}_model_eval`` where it overrides it; returns each
    submodule's mode before, which the run's end restores (as Lightning: one kept in eval mode stays so)."""
    modes = {name: m.training for name, m in module.named_modules()}
    if hooks.has(f"on_{x}_model_eval"):
        hooks.call_module(f"on_{x}_model_eval")
        sync_wrapper_modes(module, model)
    else:
        model.eval()
        module.eval()  # the step router shares the module's children, not the module itself
    return modes


def restore_modes(module: torch.nn.Module, model: torch.nn.Module, modes: dict[str, bool]) -> None:
    for name, m in module.named_modules():
        if name in modes:  # a submodule added during the run keeps its own mode
            m.training = modes[name]
    sync_wrapper_modes(module, model)


def sync_wrapper_modes(module: torch.nn.Module, model: torch.nn.Module) -> None:
    """The wrappers around ``module`` (DDP, the step router) take its mode (after its own mode hook)."""
    inner = set(module.modules())
    for wrapper in model.modules():
        if wrapper not in inner:
            wrapper.training = module.training


def print_results(kind: str, results: list[dict[str, float]]) -> None:
    """The metrics table ``validate`` / ``test`` print (one per loader)."""
    for index, metrics in enumerate(results):
        rows = "\n".join(f"  {name:<40} {value:.6g}" for name, value in sorted(metrics.items()))
        print(f"{kind.capitalize()} metrics{f' (dataloader {index})' if len(results) > 1 else ''}:\n{rows}")
