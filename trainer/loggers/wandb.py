"""`WandbLogger`: Lightning's Weights & Biases logger as a view over Ember's ``WandBTracker``."""

from __future__ import annotations

import os
from typing import Any

import torch

from trackers import WandBTracker
from trainer.loggers.logger import Logger, check_prefix
from trainer.utilities.rank_zero import rank_zero_only


class WandbLogger(Logger):
    """A wandb run: ``wandb.init(project=project, name=name, id=version or id, dir=dir or save_dir, ...)``.

    Args:
        name: the run's display name.
        save_dir / dir: where wandb writes its files (``dir`` wins).
        version / id: resume this run id.
        offline: ``mode="offline"`` (files for a later ``wandb sync``).
        anonymous: ``anonymous="allow"``.
        project: the project (default ``WANDB_PROJECT`` or ``"lightning_logs"``).
        log_model / experiment / checkpoint_name: not supported (clear errors; see docs/porting/lightning.md).
        prefix: not supported (a clear error).
        **kwargs: passed to ``wandb.init``.

    Example:
        >>> logger = WandbLogger(project="demo", offline=True)
        >>> logger.name, logger.version
        ('demo', None)
    """

    def __init__(self, name: str | None = None, save_dir: str | os.PathLike[str] = ".", version: str | None = None,
                 offline: bool = False, dir: str | os.PathLike[str] | None = None, id: str | None = None,
                 anonymous: bool | None = None, project: str | None = None, log_model: bool | str = False,
                 experiment: Any = None, prefix: str = "", checkpoint_name: str | None = None,
                 **kwargs: Any) -> None:
        super().__init__()
        check_prefix("WandbLogger", prefix)
        if log_model:
            raise ValueError(f"WandbLogger(log_model={log_model!r}) is not supported: Ember does not upload "
                             "checkpoints to wandb. Log them yourself with logger.experiment.log_artifact(...) "
                             "(e.g. in a callback's on_save_checkpoint).")
        if experiment is not None or checkpoint_name is not None:
            raise ValueError("WandbLogger(experiment=..., checkpoint_name=...) are not supported: let the logger "
                             "create the run (pass id=/version= to continue an existing one).")
        self._save_dir = os.fspath(dir if dir is not None else save_dir)
        self._project = project or os.environ.get("WANDB_PROJECT", "lightning_logs")
        self._id = version or id
        self._offline = bool(offline)
        init = dict(kwargs)
        if name is not None:
            init["name"] = name
        if self._id is not None:
            init.update(id=self._id, resume="allow")
        if offline:
            init["mode"] = "offline"
        if anonymous is not None:
            init["anonymous"] = "allow" if anonymous else "never"
        self._init_kwargs = init

    @property
    def name(self) -> str:
        """The project name (Lightning's meaning)."""
        return self._project

    @property
    def version(self) -> str | None:
        """The run id (``None`` until the run starts, unless one was given)."""
        run = None if self._tracker is None else self._tracker.tracker
        return run.id if run is not None else self._id

    @property
    def save_dir(self) -> str:
        return self._save_dir

    @property
    def experiment(self) -> Any:
        """The ``wandb`` run (rank 0)."""
        return super().experiment

    def watch(self, model: torch.nn.Module, log: str | None = "gradients", log_freq: int = 100,
              log_graph: bool = True) -> None:
        """``run.watch(model, ...)``: log gradients / parameters every ``log_freq`` steps."""
        if rank_zero_only.rank == 0:
            self.experiment.watch(model, log=log, log_freq=log_freq, log_graph=log_graph)

    def _build_tracker(self) -> WandBTracker:
        return GlobalStepWandBTracker(self._project, logging_dir=self._save_dir, **self._init_kwargs)


class GlobalStepWandBTracker(WandBTracker):
    """The tracker of a ``WandbLogger``: the step goes in as the metric ``trainer/global_step``, the x axis of every
    other metric, as Lightning's logger logs it, rather than as wandb's own step, which must only grow: the
    Trainer passes Lightning's steps (each evaluation batch at its count in the loop), which start again at 0."""

    def start(self) -> None:
        super().start()
        run = self.tracker
        if callable(getattr(run, "define_metric", None)):
            run.define_metric("trainer/global_step")
            run.define_metric("*", step_metric="trainer/global_step", step_sync=True)

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        super().log(values if step is None else {**values, "trainer/global_step": step}, **kwargs)
