"""`EvaluationMixin`: ``validate`` / ``test`` / ``predict``, and the evaluation loop fit shares with them."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import DataLoader

from callbacks import Callback
from engine import Accelerator
from trainer.datamodule import DataModule
from trainer.hooks import HookTable
from trainer.metrics import MetricLogger, to_python
from trainer.module import TrainModule
from trainer.predict import gather_step
from trainer.state import TrainState


class EvaluationMixin:
    """The evaluation entry points of ``Trainer`` and its one evaluation loop (``_evaluate``)."""

    accelerator: Accelerator
    state: TrainState
    callbacks: list[Callback]
    module: TrainModule | None
    datamodule: DataModule | None
    _metrics: MetricLogger
    _hooks: HookTable | None
    _model: torch.nn.Module | None
    val_dataloaders: list[DataLoader]
    test_dataloaders: list[DataLoader]
    num_val_batches: list[int | None]
    num_sanity_val_batches: list[int | None]
    num_test_batches: list[int | None]

    # Defined by RunMixin (trainer/runs.py).
    _run: Any
    _setup_eval: Any
    _start_trackers: Any
    _log_to_trackers: Any
    _set_stage: Any
    _batches: Any
    _resolve_ckpt_path: Any
    _load_weights: Any

    def validate(self, module: TrainModule | None = None, dataloaders: Any = None,
                 datamodule: DataModule | None = None, ckpt_path: str | None = None,
                 verbose: bool = True) -> list[dict[str, float]]:
        """Run the validation loop once; returns the epoch metrics, one dict per loader.

        ``ckpt_path`` (``"best"``, ``"last"`` or a checkpoint folder) loads the module's weights from it first.
        """
        return self._evaluate_entry("validate", module, dataloaders, datamodule, ckpt_path, verbose)

    def test(self, module: TrainModule | None = None, dataloaders: Any = None, datamodule: DataModule | None = None,
             ckpt_path: str | None = None, verbose: bool = True) -> list[dict[str, float]]:
        """Run the test loop once; returns the epoch metrics, one dict per loader."""
        return self._evaluate_entry("test", module, dataloaders, datamodule, ckpt_path, verbose)

    def predict(self, module: TrainModule | None = None, dataloaders: Any = None,
                datamodule: DataModule | None = None, return_predictions: bool | None = None,
                ckpt_path: str | None = None) -> list[Any] | None:
        """``predict_step`` over the loader(s); returns the per-batch predictions of every process, in dataset
        order, without the samples repeated to even out the last batch (a list per loader when there are several).
        """
        folder = self._resolve_ckpt_path(ckpt_path, "predict", required=True)
        datamodule, dataloaders = self._eval_sources(datamodule, dataloaders)
        with self._run("predict", module, datamodule):
            loaders, counts = self._setup_eval("predict", dataloaders)
            if folder is not None:
                self._load_weights(folder)
            hooks = self._hooks
            assert hooks is not None and self._model is not None
            self._set_stage("predict")
            self._metrics.set_stage("predict")
            self._model.eval()
            hooks.call("on_predict_start")
            hooks.call("on_predict_epoch_start")
            results: list[list[Any]] = [[] for _ in loaders]
            with torch.no_grad():
                for dl_idx, (loader, count) in enumerate(zip(loaders, counts)):
                    for batch_idx, batch in self._batches(loader, count):
                        step_args = (batch, batch_idx) if len(loaders) == 1 else (batch, batch_idx, dl_idx)
                        hooks.call("on_predict_batch_start", *step_args)
                        prediction = self._model("predict_step", *step_args)
                        hooks.call("on_predict_batch_end", prediction, *step_args)
                        if return_predictions is not False:
                            results[dl_idx] += gather_step(self.accelerator, prediction)
            self._epoch_end("on_predict_epoch_end", log=False)
            hooks.call("on_predict_end")
        if return_predictions is False:
            return None
        return results[0] if len(results) == 1 else results

    def _evaluate_entry(self, kind: str, module: TrainModule | None, dataloaders: Any, datamodule: Any,
                        ckpt_path: str | None, verbose: bool) -> list[dict[str, float]]:
        folder = self._resolve_ckpt_path(ckpt_path, kind, required=True)
        datamodule, dataloaders = self._eval_sources(datamodule, dataloaders)
        with self._run(kind, module, datamodule):
            self._setup_eval(kind, dataloaders)
            if folder is not None:
                self._load_weights(folder)  # the module's weights only: optimizers and data do not matter here
            self._start_trackers()
            results = self._evaluate(kind)
        if verbose and self.accelerator.is_main_process:
            for index, metrics in enumerate(results):
                rows = "\n".join(f"  {name:<40} {value:.6g}" for name, value in sorted(metrics.items()))
                print(f"{kind.capitalize()} metrics{f' (dataloader {index})' if len(results) > 1 else ''}:\n{rows}")
        return results

    def _eval_sources(self, datamodule: Any, dataloaders: Any) -> tuple[DataModule | None, Any]:
        """A data module passed as ``dataloaders`` counts as one; with neither, the last run's data module."""
        if isinstance(dataloaders, DataModule):
            return dataloaders, None
        if datamodule is None and dataloaders is None:
            return self.datamodule, None
        return datamodule, dataloaders

    def _evaluate(self, stage: str) -> list[dict[str, float]]:
        """One validation or test run (or the sanity check): every loader's batches, then the epoch metrics."""
        hooks, metrics, model = self._hooks, self._metrics, self._model
        assert hooks is not None and model is not None
        x = "test" if stage == "test" else "validation"
        loaders = self.test_dataloaders if stage == "test" else self.val_dataloaders
        counts = {"test": self.num_test_batches, "validate": self.num_val_batches,
                  "sanity_check": self.num_sanity_val_batches}[stage]
        previous, was_training = self.state.stage, model.training
        self._set_stage(stage)
        metrics.set_stage(stage)
        if stage == "sanity_check":
            saved = metrics.snapshot()
            hooks.call("on_sanity_check_start")
        model.eval()
        step, batch_start, batch_end = f"{x}_step", f"on_{x}_batch_start", f"on_{x}_batch_end"
        hooks.call(f"on_{x}_start")
        hooks.call(f"on_{x}_epoch_start")
        with torch.no_grad():
            for dl_idx, (loader, count) in enumerate(zip(loaders, counts)):
                metrics.dataloader_suffix = f"/dataloader_idx_{dl_idx}" if len(loaders) > 1 else ""
                for batch_idx, batch in self._batches(loader, count):
                    metrics.new_batch(batch)
                    # As in Lightning, dataloader_idx is only passed when there are several loaders.
                    step_args = (batch, batch_idx) if len(loaders) == 1 else (batch, batch_idx, dl_idx)
                    hooks.call(batch_start, *step_args)
                    outputs = model(step, *step_args)
                    hooks.call(batch_end, outputs, *step_args)
                    if stage != "sanity_check":
                        self._log_to_trackers(metrics.step_values())
        metrics.dataloader_suffix = ""
        results = to_python(self._epoch_end(f"on_{x}_epoch_end", log=stage != "sanity_check"))
        hooks.call(f"on_{x}_end")
        if stage == "sanity_check":
            hooks.call("on_sanity_check_end")
            metrics.restore(saved)
        self._set_stage(previous)
        if previous == "train":
            metrics.set_stage("train", fresh=False)
        model.train(was_training)
        if len(loaders) <= 1:
            return [results]
        return [{k: v for k, v in results.items() if "/dataloader_idx_" not in k or k.endswith(f"/dataloader_idx_{i}")}
                for i in range(len(loaders))]

    def _epoch_end(self, hook: str, log: bool = True) -> dict[str, Any]:
        """Epoch metrics, the module's epoch-end hook, the callbacks' one, then the trackers.

        The metrics are computed before each of the two hooks (only what was logged since, the second time), so
        the module and the callbacks both read up-to-date values in ``trainer.callback_metrics``.
        """
        hooks, metrics = self._hooks, self._metrics
        assert hooks is not None
        results = metrics.end_epoch()
        hooks.call_module(hook)
        results.update(metrics.end_epoch())
        hooks.call_callbacks(hook)
        results.update(metrics.end_epoch())
        if log:
            self._log_to_trackers(metrics.epoch_values(results))
        return results
