"""Ray Train's Lightning integration (``ray.train.lightning``) at Ember's path: a script ports by its imports.

Ray Train starts the workers, makes the process group (Ember adopts it and leaves it to Ray) and restarts a failed
run from the newest checkpoint reported to it. What Ember adds:

- ``RayTrainReportCallback`` reports the metrics and a checkpoint at every epoch end (and at a preemption). Each
  worker writes only its own part, into a folder on its own disk (``save_state(local_parts=True)``): no shared file
  system is needed. Ray merges the workers' folders into one checkpoint in its storage; process 0's part holds the
  manifest listing every part's files with their checksums, so a merged checkpoint verifies only when complete.
- ``RayLightningEnvironment`` takes the ranks from Ray's context, asks Ray's preemption notice at step boundaries
  (Ray runs the training function in a thread, where no signal handler can be installed), and offers Ray's older
  reported checkpoints as stand-ins when the one passed to ``fit(ckpt_path=...)`` is damaged.
- ``RayDDPStrategy`` / ``RayFSDPStrategy`` / ``RayDeepSpeedStrategy`` are Ember's strategies under Ray's names.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

try:
    import ray.train
except ImportError as _error:  # the optional dependency: say how to get it
    raise ImportError("trainer.integrations.ray needs Ray Train, which is not installed: pip install "
                      "'ember-train[ray]' (or ray[train]).") from _error

from callbacks import Callback
from trainer.loop.signals import Preempted
from trainer.plugins.environments import ClusterEnvironment
from trainer.strategies import DDPStrategy, DeepSpeedStrategy, FSDPStrategy

# The Ember checkpoint folder inside each reported Ray checkpoint (Ray's Lightning integration names its file so;
# here it is a folder): resume with fit(ckpt_path=os.path.join(checkpoint_dir, CHECKPOINT_NAME)).
CHECKPOINT_NAME = "checkpoint.ckpt"
# Older reported checkpoints fetched from remote storage as stand-ins for a damaged newest one (each is a download).
_REMOTE_FALLBACKS = 2


def _v2() -> bool:
    from ray.train.v2._internal.constants import is_v2_enabled  # Ray's own switch (RAY_TRAIN_V2_ENABLED)

    return is_v2_enabled()


@dataclass
class RayDDPStrategy(DDPStrategy):
    """Ember's DDP over the process group Ray Train made, on the device Ray chose (``ray.train.lightning``'s name)."""


@dataclass
class RayFSDPStrategy(FSDPStrategy):
    """Ember's FSDP2 over Ray Train's process group (``ray.train.lightning``'s name)."""


@dataclass
class RayDeepSpeedStrategy(DeepSpeedStrategy):
    """Ember's DeepSpeed over Ray Train's process group (``ray.train.lightning``'s name)."""


class RayLightningEnvironment(ClusterEnvironment):
    """The ranks of a Ray Train worker, Ray's preemption notice, and Ray's older checkpoints as fall-backs.

    Args:
        preemption_check_every: ask Ray's preemption notice at every N-th step boundary. Each ask is a collective
            of the workers through Ray (``ray.train.get_preemption_info`` waits for every worker), so not every
            step; a preempted node has Ray's drain deadline (minutes on clouds) to save.
        preemption_info: what is asked (default ``ray.train.get_preemption_info``; Ray Train v2). It must return
            the same value on every worker, as Ray's does.
    """

    ends_failed_processes = True  # Ray ends the worker group on a failure and reports the worker's traceback

    def __init__(self, preemption_check_every: int = 10,
                 preemption_info: Callable[[], Any] | None = None) -> None:
        if not isinstance(preemption_check_every, int) or preemption_check_every < 1:
            raise ValueError(f"RayLightningEnvironment(preemption_check_every=...) must be a positive int (step "
                             f"boundaries between asks). Received: {preemption_check_every!r}.")
        if preemption_info is None and _v2():
            preemption_info = ray.train.get_preemption_info
        self.preemption_check_every = preemption_check_every
        self._preemption_info = preemption_info  # None (Ray Train v1): no notice to ask
        self._boundaries = 0
        self._notice: str | None = None

    @property
    def creates_processes_externally(self) -> bool:
        return True

    @property
    def main_address(self) -> str:
        return os.environ.get("MASTER_ADDR", "127.0.0.1")

    @property
    def main_port(self) -> int:
        return int(os.environ.get("MASTER_PORT", "29500"))

    @staticmethod
    def detect() -> bool:
        try:
            ray.train.get_context().get_world_rank()
        except Exception:  # noqa: BLE001 - outside a Ray Train worker Ray raises (its type differs by version)
            return False
        return True

    def world_size(self) -> int:
        return ray.train.get_context().get_world_size()

    def global_rank(self) -> int:
        return ray.train.get_context().get_world_rank()

    def local_rank(self) -> int:
        return ray.train.get_context().get_local_rank()

    def node_rank(self) -> int:
        return ray.train.get_context().get_node_rank()

    def preemption_notice(self) -> str | None:
        self._boundaries += 1
        if self._preemption_info is None or self._boundaries % self.preemption_check_every:
            return self._notice
        info = self._preemption_info()
        if info is not None and self._notice is None:
            ranks = getattr(info, "preempted_ranks", None)
            self._notice = f"Ray Train's preemption notice (ranks {ranks} preempted)"
        return self._notice

    def fallbacks(self, ckpt_path: str) -> list[str]:
        """The ``CHECKPOINT_NAME`` folders of the run's older reported checkpoints, newest first, when
        ``ckpt_path`` is one of Ray's (``ray.train.get_all_reported_checkpoints``, Ray Train v2)."""
        if os.path.basename(os.path.normpath(ckpt_path)) != CHECKPOINT_NAME or not _v2():
            return []
        latest = ray.train.get_checkpoint()
        reported = [item.checkpoint for item in ray.train.get_all_reported_checkpoints()]
        older = [c for c in reported if latest is None or c.path != latest.path]
        found: list[str] = []
        for checkpoint in reversed(older):  # reported oldest first
            local = _local_folder(checkpoint, fetch=len(found) < _REMOTE_FALLBACKS)
            if local is not None:
                found.append(os.path.join(local, CHECKPOINT_NAME))
        return found


def _local_folder(checkpoint: Any, fetch: bool) -> str | None:
    """Where ``checkpoint`` can be read on this worker: its own path on a local (or mounted) storage, else a copy
    downloaded once into a folder named after it (the same path on every worker); None when not ``fetch``."""
    import pyarrow.fs  # Ray Train's storage layer: installed with it

    if isinstance(checkpoint.filesystem, pyarrow.fs.LocalFileSystem):
        return checkpoint.path
    if not fetch:
        return None
    target = os.path.join(tempfile.gettempdir(), "ember-ray-fallbacks", os.path.basename(checkpoint.path))
    if not os.path.isdir(target):
        checkpoint.to_directory(target)
    return target


def prepare_trainer(trainer: Any) -> Any:
    """Check that ``trainer`` runs under Ray Train as it should; returns it (``ray.train.lightning``'s function).

    Raises:
        TypeError: the strategy is not a Ray strategy, or the cluster environment not ``RayLightningEnvironment``.
    """
    strategy = trainer.strategy
    if not isinstance(strategy, (RayDDPStrategy, RayFSDPStrategy, RayDeepSpeedStrategy)):
        raise TypeError(f"prepare_trainer: Trainer(strategy={type(strategy).__name__}(...)) is not one for Ray "
                           "Train. Pass strategy=RayDDPStrategy() (or RayFSDPStrategy / RayDeepSpeedStrategy) from "
                           "trainer.integrations.ray.")
    environment = trainer.cluster_environment
    if environment is not None and not isinstance(environment, RayLightningEnvironment):
        raise TypeError(f"prepare_trainer: Trainer(plugins=[{type(environment).__name__}()]) is not Ray's "
                           "environment. Pass plugins=[RayLightningEnvironment()] from trainer.integrations.ray.")
    return trainer


class RayTrainReportCallback(Callback):
    """Reports the metrics and a checkpoint to Ray Train at every epoch end (``ray.train.lightning``'s callback).

    The checkpoint is taken at the boundary right after the epoch's end hooks (a resume continues exactly from
    it), each worker writing its own part into ``local_dir``; Ray merges the parts in its storage. The metrics are
    ``trainer.callback_metrics`` as the epoch ended, plus ``epoch`` and ``step``; ``result.metrics`` holds the
    last ones. A preemption stop (Ray's notice or a signal) reports its checkpoint too, before the run ends.

    Args:
        checkpoint_upload_mode / validation: passed to ``ray.train.report`` (Ray Train v2; default: a synchronous
            upload).
        local_dir: a folder on this worker's own disk for the parts before upload (default: the temp folder).
    """

    CHECKPOINT_NAME = CHECKPOINT_NAME

    def __init__(self, checkpoint_upload_mode: Any = None, validation: Any = False,
                 local_dir: str | os.PathLike[str] | None = None) -> None:
        if not _v2() and (checkpoint_upload_mode is not None or validation):
            raise ValueError(f"RayTrainReportCallback(checkpoint_upload_mode={checkpoint_upload_mode!r}, "
                             f"validation={validation!r}) needs Ray Train v2: unset RAY_TRAIN_V2_ENABLED=0.")
        self.checkpoint_upload_mode = checkpoint_upload_mode
        self.validation = validation
        self.local_dir = None if local_dir is None else os.fspath(local_dir)
        self._root: str | None = None

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        metrics = self._metrics(trainer)  # as the epoch ends; saved and reported at the boundary that follows
        trainer.run_at_boundary(lambda: self._report(trainer, metrics))

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        if isinstance(exception, Preempted):  # stopped at an agreed boundary with every worker: report it
            self._report(trainer, self._metrics(trainer))
            if _v2():
                # Ray Train v2 takes a report in when its controller next polls the workers; the run ends with an
                # error right after this, so wait until the report is in (or the restart would miss it).
                ray.train.get_all_reported_checkpoints()

    @staticmethod
    def _metrics(trainer: Any) -> dict[str, Any]:
        metrics = {name: value.item() if hasattr(value, "item") else value
                   for name, value in trainer.callback_metrics.items()}
        metrics["epoch"], metrics["step"] = trainer.current_epoch, trainer.global_step
        return metrics

    def _part_root(self) -> str:
        if self._root is None:
            context = ray.train.get_context()
            base = self.local_dir or tempfile.gettempdir()
            name = f"ember-ray-{context.get_experiment_name()}-rank{context.get_world_rank()}"
            self._root = os.path.join(base, name)
            shutil.rmtree(self._root, ignore_errors=True)  # a previous attempt's parts: already uploaded or void
        return self._root

    def _report(self, trainer: Any, metrics: dict[str, Any]) -> None:
        part = os.path.join(self._part_root(), f"epoch={metrics['epoch']}-step={metrics['step']}")
        shutil.rmtree(part, ignore_errors=True)
        trainer.checkpointer.write(os.path.join(part, CHECKPOINT_NAME), local_parts=True)
        options: dict[str, Any] = {}
        if _v2():
            from ray.train import CheckpointUploadMode

            mode = self.checkpoint_upload_mode or CheckpointUploadMode.SYNC
            options = {"checkpoint_upload_mode": mode, "validation": self.validation}
        ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(part), **options)
        trainer.accelerator.wait_for_everyone()  # every part is handed over before any worker goes on
        mode = options.get("checkpoint_upload_mode")
        if mode is None or not mode.default_delete_local_checkpoint_after_upload():
            shutil.rmtree(part, ignore_errors=True)  # uploaded; an asynchronous upload deletes it itself


__all__ = ["CHECKPOINT_NAME", "RayDDPStrategy", "RayDeepSpeedStrategy", "RayFSDPStrategy", "RayLightningEnvironment",
           "RayTrainReportCallback", "prepare_trainer"]
