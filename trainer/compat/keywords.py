"""The Trainer keywords only Lightning has, resolved to what Ember does instead (or refused with the reason).

``Trainer.__init__`` calls ``resolve_lightning`` once, with its ``TrainerConfig``; the frozen
``LightningChoices`` it returns is all the Trainer keeps of them. Every keyword here works or fails at
construction:

- ``logger``: ``None`` or ``True`` (Lightning's default logger: TensorBoard when installed, else CSV, under
  ``default_root_dir``; ``None`` with ``log_with=...``: those trackers), ``False`` (no logging), a ``trainer.loggers.Logger``, an
  Ember ``GeneralTracker``, any object with Lightning's logger methods (driven by ``trainer.loggers.adapter``), or
  an iterable of those. Loggers hand their tracker to the engine (one logging path).
- ``default_root_dir``: Ember's ``project_dir``.
- ``strategy`` / ``devices`` / ``num_nodes`` / ``accelerator``: see ``trainer.strategies`` and
  ``trainer.compat.launching``.
- ``benchmark``: ``torch.backends.cudnn.benchmark`` (``None``: unchanged, or off with ``deterministic``).
- ``inference_mode``: evaluation under ``torch.inference_mode()`` (default) or ``torch.no_grad()``.
- ``sync_batchnorm``: BatchNorm layers become ``SyncBatchNorm`` when several processes train.
- ``barebones``: no logging (here), checkpointing, progress bar, model summary or sanity check (in
  ``TrainerConfig``; conflicting keywords raise, as in Lightning).
- ``enable_autolog_hparams``: send the module's / data module's hyperparameters to the loggers.
- ``plugins``: a cluster environment (``trainer.plugins.environments``; ``SLURMEnvironment()`` by itself under
  a SLURM batch job).
- ``reload_dataloaders_every_n_epochs``: checked here (an int >= 0), run by the loop (``trainer/loop/reload.py``).
- ``model_registry`` and ``use_distributed_sampler=False`` with several processes: refused with what to do instead.
"""

from __future__ import annotations

import functools
import inspect
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

import torch

from callbacks import Callback, ModelCheckpoint
from callbacks.exceptions import MisconfigurationException
from trackers import GeneralTracker
from trainer.compat.launching import check_accelerator, launch_and_exit, parse_devices, processes_to_start
from trainer.compat.max_time import max_time_timer
from trainer.compat.spawn import SpawnLauncher, in_process_launcher
from trainer.loggers import CSVLogger, Logger, TensorBoardLogger
from trainer.loggers.adapter import (
    LoggerTracker,
    RunListener,
    is_logger_like,
    lightning_run_folder,
    not_a_logger,
)
from trainer.loggers.logger import DummyLogger, TrackerLogger, VersionedLogger
from trainer.plugins.environments import ClusterEnvironment, resolve_environment
from trainer.strategies import DDPStrategy, Strategy, resolve_strategy
from trainer.utilities.rank_zero import rank_zero_info

DEFAULT_PROJECT_DIR = "runs"  # the project folder when neither project_dir nor default_root_dir is given

__all__ = ["LightningChoices", "accepts_model", "launch_and_exit", "logger_views", "resolve_lightning"]
F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class LightningChoices:
    """What the Lightning-only keywords decided, once, when the Trainer was built."""

    log_with: Any
    project_dir: Any
    loggers: tuple[Any, ...] = ()  # Ember's Logger views, and duck-typed logger objects as given
    accelerator_kwargs: dict[str, Any] = field(default_factory=dict)
    # trainer.strategy: the strategy object (a name became the object it stands for), resolved once.
    strategy: Strategy = field(default_factory=DDPStrategy)
    processes: int = 1  # > 1: a plain process must start this many workers
    cpu: bool = True
    cluster: ClusterEnvironment | None = None  # plugins=[...]'s environment, or SLURM's when detected
    # "ddp_spawn" / "ddp_fork" / "ddp_notebook" in a plain process: each call starts the workers (not the script).
    launcher: SpawnLauncher | None = None

    def default_callbacks(self, config: Any) -> list[Callback]:
        """The callbacks Lightning adds by itself: a ``Timer`` for ``max_time``, then the default
        ``ModelCheckpoint`` (see ``default_checkpoint``)."""
        given = [config.callbacks] if isinstance(config.callbacks, Callback) else list(config.callbacks or [])
        added = [max_time_timer(config, given), self.default_checkpoint(config)]
        return [callback for callback in added if callback is not None]

    def default_checkpoint(self, config: Any) -> Callback | None:
        """Lightning's default ``ModelCheckpoint`` (the newest epoch-end checkpoint kept) when checkpointing is on
        and none was given; its folder is the trainer's default one (``checkpoint_dirs``), set at ``setup``.

        A ``ModelCheckpoint`` given with checkpointing off (``enable_checkpointing=False``, or ``barebones``) is a
        contradiction, refused as Lightning does rather than silently saving or silently not."""
        given = [config.callbacks] if isinstance(config.callbacks, Callback) else list(config.callbacks or [])
        found = [c for c in given if isinstance(c, ModelCheckpoint)]
        if found and not config.enable_checkpointing:
            raise MisconfigurationException(
                "Trainer was configured with `enable_checkpointing=False` but found `ModelCheckpoint` in callbacks "
                f"list (received: {type(found[0]).__name__}(dirpath={found[0].dirpath!r})): remove it, or drop "
                "enable_checkpointing=False" + (" and barebones=True." if config.barebones else "."))
        if not config.enable_checkpointing or config.fast_dev_run or any(
                isinstance(c, ModelCheckpoint) for c in given):
            return None
        return ModelCheckpoint()

    def checkpoint_dirs(self, accelerator: Any) -> tuple[str | None, str | None]:
        """``(log_dir, versions)``: the first file logger's run folder, where ``ModelCheckpoint`` saves by default
        (``{log_dir}/checkpoints``, Lightning's place), and the folder of its ``version_N`` siblings when the
        version was picked automatically (``ckpt_path="last"`` looks in their checkpoints too, so a restarted
        script finds the run it continues). ``(None, None)`` without a file logger."""
        first = next((view for view in self.loggers if run_folder(view) is not None), None)
        if first is None:
            return None, None
        versioned = isinstance(first, VersionedLogger) and first.auto_version
        found = [run_folder(first), first.root_dir if versioned else None]
        if accelerator.num_processes > 1:
            from engine import broadcast_object_list

            found = broadcast_object_list(found)  # the version folder rank 0 picked
        return found[0], found[1]

    def launch_if_asked(self, precision: str | None) -> None:
        """With ``devices > 1`` in a plain process: run the script in that many workers and exit (never returns);
        not for the in-process launchers, whose calls start the workers."""
        if self.processes > 1 and self.launcher is None:
            launch_and_exit(self.processes, self.cpu, precision, self.strategy.kind == "fsdp")


def logger_views(loggers: tuple[Any, ...], trackers: list[Any], fast_dev_run: bool = False,
                 trackers_asked: bool = False, main_process: bool = True) -> list[Any]:
    """``trainer.loggers``: the given ``loggers``, or views of the ``trackers`` that ``log_with`` started; under
    ``fast_dev_run`` (which logs nothing), and on the other processes (trackers run on the main one only), one
    ``DummyLogger`` where there would have been loggers (given ones, or trackers asked for with ``log_with``), as
    Lightning's loggers do nothing off rank 0."""
    views: list[Any] = list(loggers) if loggers else [TrackerLogger(tracker) for tracker in trackers]
    if fast_dev_run:
        return [DummyLogger()] if loggers or trackers_asked else []
    if not views and trackers_asked and not main_process:
        return [DummyLogger()]
    return views


def log_dir(loggers: list[Any], root_dir: str) -> str | None:
    """``trainer.log_dir``: the first logger's run folder (``save_dir`` for the others, as Lightning), or the root."""
    if not loggers:
        return root_dir
    first = loggers[0]
    if isinstance(first, (VersionedLogger, TrackerLogger)):
        return first.log_dir
    return getattr(first, "save_dir", None)  # a duck-typed logger may have none


def convert_module(config: Any, module: torch.nn.Module, world_size: int) -> None:
    """``sync_batchnorm``: BatchNorm layers become ``SyncBatchNorm`` (in place) when several processes train."""
    if config.sync_batchnorm and world_size > 1:
        torch.nn.SyncBatchNorm.convert_sync_batchnorm(module)


def accepts_model(method: F) -> F:
    """Let ``fit`` / ``validate`` / ``test`` / ``predict`` take Lightning's ``model=`` for Ember's ``module=``, and
    run them in worker processes when the Trainer has an in-process launcher (``trainer.compat.spawn``)."""
    signature = inspect.signature(method)

    @functools.wraps(method)
    def wrapper(self: Any, *args: Any, model: Any = None, **kwargs: Any) -> Any:
        if model is not None:
            if args or kwargs.get("module") is not None:
                raise TypeError(f"{method.__name__}() got the module twice (model= and module= / positionally): "
                                "pass it once.")
            kwargs["module"] = model
        launcher = getattr(self, "_launcher", None)  # a Trainer's (the Tuner's methods take model= too)
        if launcher is not None:  # every Trainer entry point goes through here: the one place the workers start
            bound = signature.bind(self, *args, **kwargs)
            bound.apply_defaults()
            arguments = dict(bound.arguments)
            del arguments["self"]
            return launcher.launch(self, method.__name__, arguments)
        return method(self, *args, **kwargs)

    return cast(F, wrapper)  # method's signature, plus model= (functools.wraps keeps the rest)


def resolve_lightning(config: Any, unset: Any) -> LightningChoices:
    """Check the Lightning-only keywords of ``config`` (a ``TrainerConfig``) and decide what Ember does for each."""
    check_accelerator(config.accelerator)
    _refuse_unsupported(config.model_registry, config.reload_dataloaders_every_n_epochs)
    cluster = resolve_environment(config.plugins)
    for name in ("inference_mode", "sync_batchnorm", "barebones", "use_distributed_sampler", "enable_autolog_hparams"):
        if not isinstance(getattr(config, name), bool):
            raise TypeError(f"Trainer({name}=...) must be True or False. Received: {getattr(config, name)!r}.")
    benchmark, deterministic = config.benchmark, config.deterministic
    if benchmark is not None and not isinstance(benchmark, bool):
        raise TypeError(f"Trainer(benchmark=...) must be True, False or None. Received: {benchmark!r}.")
    if benchmark and deterministic:
        raise ValueError("Trainer(benchmark=True, deterministic=True) contradict each other: cuDNN benchmarking "
                         "picks non-deterministic kernels. Drop one of them.")
    if benchmark is not None or deterministic:
        torch.backends.cudnn.benchmark = bool(benchmark)  # Lightning: deterministic turns benchmarking off
    project_dir = _root_dir(config.default_root_dir, config.project_dir, unset)
    logger = False if config.barebones else config.logger
    if logger is None and config.log_with is unset and not isinstance(config.accelerator, (str, type(None))):
        # An Accelerator was given: the trackers set on it (its log_with) log.
        log_with, loggers = unset, list[Logger]()
    else:
        log_with, loggers = _loggers(logger, config.log_with, project_dir, unset)
    devices = parse_devices(config.devices, config.accelerator)
    processes = processes_to_start(devices, config.num_nodes)
    if cluster is not None and devices is not None:
        cluster.validate_settings(devices, config.num_nodes)
    launcher = in_process_launcher(config.strategy, processes)
    _, strategy, accelerator_kwargs = resolve_strategy(config.strategy, max(_world_size(), processes),
                                                       config.num_nodes)
    strategy.check_precision(config.precision)
    if not config.use_distributed_sampler and max(_world_size(), processes) > 1:
        raise ValueError("Trainer(use_distributed_sampler=False) with several processes is not supported: Ember "
                         "always shards each loader across the processes (every sample seen once, promise 8). "
                         "Leave it True, and shard the dataset yourself only for a custom IterableDataset.")
    cpu = config.accelerator == "cpu" or not torch.cuda.is_available()
    if config.sync_batchnorm and cpu and max(_world_size(), processes) > 1:
        raise ValueError("Trainer(sync_batchnorm=True) on the CPU with several processes cannot work: torch's "
                         "SyncBatchNorm runs on GPUs only. Leave sync_batchnorm=False on the CPU (each process then "
                         "normalises with its own batch statistics).")
    return LightningChoices(log_with=log_with, project_dir=project_dir, loggers=tuple(loggers),
                            accelerator_kwargs=accelerator_kwargs, strategy=strategy,
                            processes=processes, cpu=cpu, cluster=cluster, launcher=launcher)


def defaults_from_environment(keywords: dict[str, Any], names: tuple[str, ...],
                              environ: Any = None) -> dict[str, Any]:
    """``keywords`` plus Lightning's ``PL_TRAINER_<NAME>`` environment variables for the keywords not given
    (``PL_TRAINER_MAX_STEPS=7``, ``PL_TRAINER_LOGGER=False``); values are Python literals, else strings.

    Example:
        >>> defaults_from_environment({"max_epochs": 2}, ("max_epochs", "max_steps", "logger"),
        ...                           {"PL_TRAINER_MAX_STEPS": "7", "PL_TRAINER_MAX_EPOCHS": "9"})
        {'max_epochs': 2, 'max_steps': 7}
    """
    import ast

    environ = os.environ if environ is None else environ
    merged = dict(keywords)
    for name in names:
        raw = environ.get(f"PL_TRAINER_{name.upper()}")
        if raw is None or name in keywords:
            continue
        try:
            merged[name] = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            merged[name] = raw
    return merged


def say_what_limits_mean(keywords: dict[str, Any]) -> None:
    """Lightning's info lines for a limit given as 1 / 1.0 (one batch, or all of them: easy to mix up), e.g.
    "`Trainer(limit_val_batches=1)` was configured so 1 batch will be used." Said only for keywords given."""
    for name in ("limit_train_batches", "limit_val_batches", "limit_test_batches", "limit_predict_batches",
                 "overfit_batches", "val_check_interval"):
        value = keywords.get(name)
        if value is None or isinstance(value, bool) or value not in (1, 1.0):
            continue
        if name == "val_check_interval":
            meaning = ("validation will run after every batch" if isinstance(value, int)
                       else "validation will run at the end of the training epoch")
        else:
            meaning = "1 batch will be used" if isinstance(value, int) else "100% of the batches will be used"
        rank_zero_info(f"`Trainer({name}={value})` was configured so {meaning}.")


def _refuse_unsupported(model_registry: Any, reload_every: Any) -> None:
    if model_registry is not None:
        raise ValueError(f"Trainer(model_registry={model_registry!r}) is not supported: Ember uploads nothing; "
                         "load local checkpoints with load_from_checkpoint.")
    if not isinstance(reload_every, int) or isinstance(reload_every, bool) or reload_every < 0:
        from trainer.utilities.exceptions import (
            MisconfigurationException,  # a ValueError, as Lightning raises
        )

        raise MisconfigurationException(f"`reload_dataloaders_every_n_epochs` should be an int >= 0, got "
                                        f"{reload_every}. Trainer(reload_dataloaders_every_n_epochs=...) must be an "
                                        f"int >= 0. Received: {reload_every!r}.")


def _root_dir(default_root_dir: Any, project_dir: Any, unset: Any) -> Any:
    """The run's folder, ``~`` expanded (as Lightning's ``default_root_dir``: not a folder named ``~``)."""
    if project_dir is not unset and project_dir is not None:
        project_dir = os.path.expanduser(os.fspath(project_dir))
    if default_root_dir is None:
        return project_dir
    root = os.path.expanduser(os.fspath(default_root_dir))
    if project_dir is not unset and project_dir is not None and project_dir != root:
        raise ValueError(f"Trainer(default_root_dir={root!r}, project_dir={project_dir!r}) name two folders for one "
                         "run: pass only one (they are the same setting).")
    return root


def default_logger(root: str) -> Logger:
    """Lightning's default logger: ``TensorBoardLogger(root)`` when tensorboard is installed, else ``CSVLogger(root)``
    (both write into ``{root}/lightning_logs/version_N``)."""
    import importlib.util

    if importlib.util.find_spec("tensorboard") is not None:
        return TensorBoardLogger(root)
    return CSVLogger(root)


def run_folder(view: Any) -> str | None:
    """A given logger's run folder, where ``ModelCheckpoint`` saves by default: an Ember logger's ``log_dir``, a
    duck-typed one's ``{save_dir}/{name}/{version}`` (Lightning's rule), ``None`` for remote-style ones."""
    return view.log_dir if isinstance(view, Logger) else lightning_run_folder(view)


def _loggers(logger: Any, log_with: Any, project_dir: Any, unset: Any) -> tuple[Any, list[Any]]:
    """``(log_with for the engine, the Logger views)``.

    Neither ``logger=`` nor ``log_with=`` (or ``logger=True``): Lightning's default logger, under the project
    folder (``default_root_dir`` / ``project_dir``, default ``"runs"``).
    """
    if logger is None and log_with is not unset:
        return log_with, []
    if logger is not None and log_with is not unset:
        raise ValueError(f"Trainer(logger=..., log_with={log_with!r}) both choose the trackers: pass only one "
                         "(logger= takes Lightning-style loggers, log_with= tracker names).")
    if logger is False:
        return None, []
    root = DEFAULT_PROJECT_DIR if project_dir is unset or project_dir is None else os.fspath(project_dir)
    if logger is None or logger is True:
        default = default_logger(root)
        return [logger_tracker(default)], [default]
    # As Lightning: an iterable is a collection of loggers (a MagicMock iterates as empty: no logger), anything
    # else one logger. A string is refused, not split into characters.
    iterable = isinstance(logger, Iterable) and not isinstance(logger, (str, bytes, Logger, GeneralTracker))
    items = list(logger) if iterable else [logger]
    views: list[Any] = []
    trackers: list[GeneralTracker] = []
    for item in items:
        if isinstance(item, Logger):
            views.append(item)
            trackers.append(logger_tracker(item))
        elif isinstance(item, GeneralTracker):
            trackers.append(item)
        elif is_logger_like(item):  # Lightning calls any object's logger methods: the adapter makes its calls
            views.append(item)
            trackers.append(LoggerTracker(item))
        else:
            raise not_a_logger(item)
    return trackers, views


def logger_tracker(logger: Logger) -> GeneralTracker:
    """What the engine runs for an Ember ``Logger``: a ``LoggerTracker`` calling its methods (a user's subclass
    builds one as its tracker; a built-in logger's writes into its own tracker, the run). ``LitLogger``'s tracker is
    told of each run itself (a ``RunListener``) and is run as it is."""
    own = logger.tracker
    if isinstance(own, (LoggerTracker, RunListener)):
        return own
    return LoggerTracker(logger, run=own)


def _world_size() -> int:
    from engine.environment import read_launch

    return read_launch(os.environ).world_size
