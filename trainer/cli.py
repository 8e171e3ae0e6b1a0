"""`CLI` (also ``LightningCLI``): build the model, data and ``Trainer`` from YAML configs and flags with jsonargparse.

``python train.py fit --config cfg.yaml --model.lr 0.01`` (or ``ember fit ...``) parses the ``fit`` /
``validate`` / ``test`` / ``predict`` subcommand, instantiates ``model`` / ``data`` / ``trainer`` (classes chosen
by ``class_path`` / ``init_args`` where a base class is given), optionally an ``optimizer`` and ``lr_scheduler``,
saves the resolved config into the run folder and runs ``trainer.<subcommand>(...)``. Needs the ``cli`` extra
(``pip install "ember-train[cli]"``); ``import trainer`` never imports jsonargparse.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import os
import re
import sys
from collections.abc import Sequence
from typing import Any

import torch

from engine.keywords import close_matches
from trainer.datamodule import DataModule
from trainer.module import TrainModule
from trainer.tools.cli_config import (
    ConfigMismatchError,
    check_against_saved,
    finished_run_best,
    save_config,
    saved_config_path,
)
from trainer.trainer import Trainer

SUBCOMMANDS: dict[str, set[str]] = {  # each Trainer method and the arguments the CLI fills itself
    "fit": {"module", "model", "train_dataloaders", "val_dataloaders", "datamodule"},
    "validate": {"module", "model", "dataloaders", "datamodule"},
    "test": {"module", "model", "dataloaders", "datamodule"},
    "predict": {"module", "model", "dataloaders", "datamodule"},
}
# Trainer keywords whose defaults are sentinels: declared here with the values those sentinels stand for.
_TRAINER_EXTRAS: dict[str, tuple[Any, Any, str]] = {
    # Not given: left out, so the Trainer's own default applies, as with Trainer() in a script (one rule for both).
    "log_with": (str | list[str] | None, argparse.SUPPRESS,
                 ("trackers: 'csv', 'tensorboard', 'wandb', 'comet_ml', a list, 'all' or null (none); not given: "
                  "the Trainer's default logger (Lightning's: TensorBoard when installed, else CSV, in "
                  "{project_dir}/lightning_logs/version_N)")),
    "project_dir": (str | None, "runs", "the run folder: checkpoints, tracker files and the saved config.yaml"),
    "preemption_signals": (list[str | int] | None, ["SIGTERM"], "signals that save a checkpoint and exit"),
}


def _jsonargparse() -> Any:
    try:
        import jsonargparse
    except ImportError:
        raise ImportError("The Ember CLI needs jsonargparse: pip install \"ember-train[cli]\" (or "
                          "\"jsonargparse[signatures]\").") from None
    return jsonargparse


class CLI:
    """Lightning's ``LightningCLI`` for Ember: a config-file command line for a model, its data and the ``Trainer``.

    Args:
        model_class: the ``TrainModule`` class, or a base class whose subclasses are chosen by ``class_path``
            (with ``subclass_mode_model=True``); ``None``: any ``TrainModule`` subclass by ``class_path``.
        datamodule_class: the same for the ``DataModule`` (optional).
        trainer_class: the trainer class (``Trainer``).
        trainer_defaults: defaults for the trainer's arguments (the command line and configs override them).
        seed_everything_default: ``--seed_everything``'s default (``True``: a random seed, saved in the config).
        parser_kwargs: passed to each subcommand's ``jsonargparse.ArgumentParser`` (e.g. ``default_config_files``).
        subclass_mode_model / subclass_mode_data: accept any subclass given by ``class_path``.
        args: the arguments to parse (default ``sys.argv[1:]``).
        run: run the subcommand (``False``: only instantiate; then no subcommand is given).
        auto_configure_optimizers: add ``--optimizer`` / ``--lr_scheduler``; when given they replace the model's
            ``configure_optimizers``.
        save_config_callback / save_config_kwargs: Lightning's switches: ``None`` saves (and checks) no config;
            ``{"overwrite": True}`` replaces a different saved config, like ``--allow_config_change``.

    The resolved config is written to ``{trainer.project_dir}/config.yaml``. A resume (``--ckpt_path``) reads that
    file as its first config, and a config that differs from it is refused unless ``--allow_config_change``.

    Example:
        >>> import tempfile
        >>> class Regressor(TrainModule):
        ...     def __init__(self, lr: float = 0.1) -> None:
        ...         super().__init__()
        ...         self.net = torch.nn.Linear(3, 1)
        >>> cli = CLI(Regressor, run=False, args=["--model.lr", "0.5", "--trainer.log_with", "null",
        ...                                       "--trainer.project_dir", tempfile.mkdtemp()])
        >>> cli.config["model"]["lr"], type(cli.trainer).__name__
        (0.5, 'Trainer')
    """

    def __init__(self, model_class: type[TrainModule] | None = None,
                 datamodule_class: type[DataModule] | None = None, trainer_class: type[Trainer] = Trainer,
                 trainer_defaults: dict[str, Any] | None = None, seed_everything_default: bool | int = True,
                 parser_kwargs: dict[str, Any] | None = None, subclass_mode_model: bool = False,
                 subclass_mode_data: bool = False, args: Sequence[str] | None = None, run: bool = True,
                 auto_configure_optimizers: bool = True, save_config_callback: Any = True,
                 save_config_kwargs: dict[str, Any] | None = None) -> None:
        self._ja = _jsonargparse()
        self.model_class = model_class or TrainModule
        self.subclass_mode_model = subclass_mode_model or model_class is None
        self.datamodule_class = datamodule_class
        self.subclass_mode_data = subclass_mode_data
        self.trainer_class = trainer_class
        self.trainer_defaults = dict(trainer_defaults or {})
        self.seed_everything_default = seed_everything_default
        self.parser_kwargs = dict(parser_kwargs or {})
        self.auto_configure_optimizers = auto_configure_optimizers
        # Lightning's names: save_config_callback=None saves nothing; {"overwrite": True} replaces a saved config.
        self.save_config = save_config_callback is not None and save_config_callback is not False
        self.overwrite_config = bool((save_config_kwargs or {}).get("overwrite", False))
        argv = list(sys.argv[1:] if args is None else args)
        self.subcommand: str | None = None
        self.parser = self._build_parser(run)
        self.config = self._resume_with_saved_config(argv) if run else None
        if self.config is None:
            self.config = self._parse(argv, run)
        self.subcommand = self.config["subcommand"] if run else None
        section = self.config[self.subcommand] if self.subcommand else self.config
        self._seed(section)
        instantiate = getattr(self.parser, "instantiate", None) or self.parser.instantiate_classes
        self.config_init = instantiate(self.config)
        init = self.config_init[self.subcommand] if self.subcommand else self.config_init
        self.model: TrainModule = init["model"]
        self.datamodule: DataModule | None = init.get("data")
        self.trainer: Trainer = init["trainer"]
        self._configure_optimizers(init)
        self._save_config(section)
        if run and self.subcommand is not None:  # the parser requires a subcommand when it runs one
            method_args = {k: v for k, v in init.items() if k in self._method_keys[self.subcommand]}
            if self.datamodule is not None:
                method_args["datamodule"] = self.datamodule
            if self.subcommand != "fit" and method_args.get("ckpt_path") == "best":
                method_args["ckpt_path"] = finished_run_best(self.trainer) or "best"
            getattr(self.trainer, self.subcommand)(self.model, **method_args)

    # -- the parser ----------------------------------------------------------------------------------------------
    def _build_parser(self, run: bool) -> Any:
        if not run:
            parser = self._new_parser()
            self._method_keys: dict[str | None, list[str]] = {None: []}
            return parser
        root = self._ja.ArgumentParser(prog=self.parser_kwargs.get("prog"), exit_on_error=False, allow_abbrev=False,
                                       description="Train, validate, test or predict with an Ember Trainer.")
        commands = root.add_subcommands(required=True, dest="subcommand")
        self._method_keys = {}
        self._subparsers: dict[str, Any] = {}
        for name, skip in SUBCOMMANDS.items():
            parser = self._new_parser()
            self._method_keys[name] = parser.add_method_arguments(self.trainer_class, name, skip=skip) or []
            # Every subcommand takes it, so that a fit run's saved config.yaml (which holds it) loads in all.
            parser.add_argument("--allow_config_change", action="store_true",
                                help="replace a different config.yaml saved in the run folder (default: refuse)"
                                if name == "fit" else "evaluate a model whose config differs from the one saved in "
                                "the run folder (default: refuse)")
            self._subparsers[name] = parser
            doc = inspect.getdoc(getattr(self.trainer_class, name)) or ""
            commands.add_subcommand(name, parser, help=doc.splitlines()[0] if doc else name)
        return root

    def _new_parser(self) -> Any:
        ja = self._ja
        kwargs = {"exit_on_error": False, "allow_abbrev": False, **self.parser_kwargs}
        kwargs.pop("prog", None)
        parser = ja.ArgumentParser(**kwargs)
        parser.add_argument("-c", "--config", action=ja.ActionConfigFile, help="a YAML config (several: merged in "
                            "order, later ones win; flags after a --config override it)")
        parser.add_argument("--seed_everything", type=bool | int, default=self.seed_everything_default,
                            help="seed for engine.set_seed: an int, true (a random seed, saved) or false")
        self._add_trainer(parser)
        if self.subclass_mode_model:
            parser.add_subclass_arguments(self.model_class, "model", required=True, fail_untyped=False)
        else:
            parser.add_class_arguments(self.model_class, "model", fail_untyped=False)
        if self.datamodule_class is not None or self.subclass_mode_model:
            base = self.datamodule_class or DataModule
            if self.subclass_mode_data or self.datamodule_class is None:
                parser.add_subclass_arguments(base, "data", required=False, fail_untyped=False)
            else:
                parser.add_class_arguments(base, "data", fail_untyped=False)
        if self.auto_configure_optimizers:
            parser.add_subclass_arguments(torch.optim.Optimizer, "optimizer", skip={"params"}, required=False,
                                          fail_untyped=False, instantiate=False)
            schedulers = (torch.optim.lr_scheduler.LRScheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)
            parser.add_subclass_arguments(schedulers, "lr_scheduler", skip={"optimizer"}, required=False,
                                          fail_untyped=False, instantiate=False)
        return parser

    def _add_trainer(self, parser: Any) -> None:
        signature = inspect.signature(self.trainer_class.__init__)
        plain = (type(None), bool, int, float, str, list, dict)
        # A keyword whose default is a sentinel or an object cannot be written to (or read from) YAML.
        skip = {name for name, p in signature.parameters.items()
                if p.default is not inspect.Parameter.empty and not isinstance(p.default, plain)}
        parser.add_class_arguments(self.trainer_class, "trainer", fail_untyped=False, skip=skip,
                                   instantiate=True)
        for name, (kind, default, help_text) in _TRAINER_EXTRAS.items():
            if name in skip:
                parser.add_argument(f"--trainer.{name}", type=kind, default=default, help=help_text)
        if self.trainer_defaults:
            parser.set_defaults({f"trainer.{k}": v for k, v in self.trainer_defaults.items()})

    # -- parsing -------------------------------------------------------------------------------------------------
    def _parse(self, argv: list[str], run: bool) -> Any:
        try:
            return self.parser.parse_args(argv)
        except self._ja.ArgumentError as error:
            message = str(error) + self._close_matches(str(error), argv[0] if argv else None)
            raise SystemExit(f"error: {message}") if run else ValueError(message) from None

    def _close_matches(self, message: str, command: str | None = None) -> str:
        """A 'did you mean' line for an unknown key named in a jsonargparse error (``command``: the subcommand
        when the message does not name it)."""
        bad = re.findall(r"(?:accept option|Option|Key|arguments:\s*--)\s*'?\"?([\w.\-]+)", message)
        if not bad:
            return ""
        name = bad[-1].lstrip("-")
        subcommand = re.search(r"Subcommand '(\w+)'", message)
        candidates = set(self._known_keys(subcommand.group(1) if subcommand else command))
        elsewhere = [sub for sub in getattr(self, "_subparsers", {}) if name in self._known_keys(sub)]
        if name not in candidates and elsewhere:  # a real key, of another subcommand: say so, not "did you mean"
            return f"\n{name!r} is an option of {' / '.join(elsewhere)} only."
        class_path = re.search(r"class_path '([\w.]+)'", message)
        if class_path:
            candidates |= set(_init_parameters(class_path.group(1)))
        # The dotted key when one is close (trainer.max_epochs), else the last part (lr inside init_args).
        full = close_matches(name, candidates) if "." in name else []
        close = [c for c in full or close_matches(name.split(".")[-1], {c.split(".")[-1] for c in candidates})
                 if c != name]
        return f"\nDid you mean: {', '.join(close)}?" if close else ""

    def _known_keys(self, subcommand: str | None = None) -> list[str]:
        subparsers = getattr(self, "_subparsers", {})
        parsers = [subparsers[subcommand]] if subcommand in subparsers else list(subparsers.values()) or [self.parser]
        keys: list[str] = []
        for parser in parsers:
            keys += [a.dest for a in parser._actions if a.dest not in ("help",)]
        return keys

    def _resume_with_saved_config(self, argv: list[str]) -> Any:
        """A subcommand with ``--ckpt_path`` in a run folder with a saved config: that config first, then the
        arguments (a resumed ``fit``, or ``test`` / ``validate`` / ``predict`` of a finished run).

        Returns ``None`` otherwise (the arguments are then parsed alone).
        """
        if not argv or argv[0] not in SUBCOMMANDS or _flag_value(argv, "--ckpt_path") in (None, "null"):
            return None
        folder = _flag_value(argv, "--trainer.project_dir")
        if folder is None:
            try:  # the folder may come from a --config file: parse once without the saved config to find it
                folder = self._parse(argv, run=True)[argv[0]]["trainer"].get("project_dir")
            except SystemExit:
                folder = _TRAINER_EXTRAS["project_dir"][1]
        if not folder or not os.path.exists(saved_config_path(folder)):
            return None
        return self._parse([argv[0], "--config", saved_config_path(folder), *argv[1:]], run=True)

    def _seed(self, section: Any) -> None:
        seed = section.get("seed_everything")
        self._random_seed = seed is True
        if seed is True:
            seed = int(torch.randint(0, 2**31 - 1, ()).item())
            section["seed_everything"] = seed  # saved, so the run can be repeated
        if seed is not False and seed is not None:
            from engine import set_seed

            set_seed(int(seed))

    # -- after instantiation ---------------------------------------------------------------------------------
    def _configure_optimizers(self, init: Any) -> None:
        optimizer, scheduler = init.get("optimizer"), init.get("lr_scheduler")
        if not optimizer:
            return
        self.model.__class__ = _with_configured_optimizers(type(self.model), optimizer, scheduler)

    def _save_config(self, section: Any) -> None:
        parser = self._subparsers[self.subcommand] if self.subcommand else self.parser
        resolved = parser.dump(section, skip_unset=False, skip_validation=True)
        folder = self.trainer.accelerator.project_dir
        if not folder or not self.save_config:
            return
        # A seed drawn for this run (seed_everything: true) differs every time: not a change of experiment.
        ignore = ("seed_everything",) if self._random_seed else ()
        allowed = bool(section.get("allow_config_change")) or self.overwrite_config
        # Evaluating a run may use other data, loaders or trainer flags; the model must be the run's.
        only = None if self.subcommand in (None, "fit") else ("model",)
        check_against_saved(folder, resolved, allow_change=allowed, ignore=ignore, only=only)
        unchanged = os.path.exists(saved_config_path(folder)) and not allowed  # checked equal just above
        if self.subcommand in (None, "fit") and self.trainer.accelerator.is_main_process and not unchanged:
            self.saved_config_path = save_config(folder, resolved)


def _flag_value(argv: list[str], flag: str) -> str | None:
    """The value given to ``flag`` (``--flag value`` or ``--flag=value``; the last one wins), else ``None``."""
    found = None
    for i, item in enumerate(argv):
        if item == flag and i + 1 < len(argv):
            found = argv[i + 1]
        elif item.startswith(flag + "="):
            found = item.split("=", 1)[1]
    return found


def _init_parameters(class_path: str) -> list[str]:
    try:
        cls = _import(class_path)
    except (ImportError, AttributeError, ValueError):
        return []
    return [p for p in inspect.signature(cls.__init__).parameters if p not in ("self", "args", "kwargs")]


def _import(class_path: str) -> Any:
    module, _, name = class_path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def _instantiate(config: Any, *args: Any) -> Any:
    config = config.as_dict() if hasattr(config, "as_dict") else dict(config)
    init = config.get("init_args") or {}
    return _import(config["class_path"])(*args, **dict(init))


def _with_configured_optimizers(cls: type[TrainModule], optimizer: Any, scheduler: Any) -> type[TrainModule]:
    """``cls`` with ``configure_optimizers`` building the CLI's optimizer (and scheduler); same name and module."""

    def configure_optimizers(self: TrainModule) -> Any:
        built = optimizer if isinstance(optimizer, torch.optim.Optimizer) else _instantiate(optimizer,
                                                                                             self.parameters())
        if not scheduler:
            return built
        sched = _instantiate(scheduler, built)
        if isinstance(sched, torch.optim.lr_scheduler.ReduceLROnPlateau):
            return {"optimizer": built, "lr_scheduler": {"scheduler": sched, "monitor": getattr(
                sched, "monitor", "val/loss")}}
        return {"optimizer": built, "lr_scheduler": sched}

    return type(cls.__name__, (cls,), {"configure_optimizers": configure_optimizers, "__module__": cls.__module__,
                                       "__qualname__": cls.__qualname__, "__doc__": cls.__doc__})


LightningCLI = CLI


def console_main(argv: Sequence[str]) -> int:
    """``ember fit|validate|test|predict ...``: the model and data are chosen by ``class_path`` in the config."""
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # class paths name modules next to the config, as `python -m` would
    argv = list(argv)
    calls = [argv]
    if argv and ("-h" in argv or "--help" in argv):
        # Also list the init arguments of the classes the configs / flags name (jsonargparse's --model.help).
        calls += [[argv[0], f"--{key}.help", path] for key, path in _named_classes(argv)]
    for args in calls:
        try:
            CLI(None, None, subclass_mode_model=True, subclass_mode_data=True, args=args,
                parser_kwargs={"prog": "ember"})
        except ConfigMismatchError as refused:  # the user's choice to make: one line that says how, no traceback
            print(f"error: {refused}", file=sys.stderr)
            return 2
        except SystemExit as done:
            if isinstance(done.code, str):
                print(done.code, file=sys.stderr)
                return 2
            if done.code:
                return int(done.code)
    return 0


def _named_classes(argv: list[str]) -> list[tuple[str, str]]:
    """``(key, class_path)`` of the model and data named in ``argv``'s ``--config`` files and flags."""
    import yaml

    found: dict[str, str] = {}
    for i, item in enumerate(argv[:-1]):
        if item in ("-c", "--config") and os.path.exists(argv[i + 1]):
            with open(argv[i + 1], encoding="utf-8") as handle:
                config = yaml.safe_load(handle) or {}
            for key in ("model", "data"):
                section = config.get(key)
                path = section.get("class_path") if isinstance(section, dict) else section
                if isinstance(path, str):
                    found[key] = path
        elif item in ("--model", "--data", "--model.class_path", "--data.class_path"):
            found[item[2:].split(".")[0]] = argv[i + 1]
    return sorted(found.items())


__all__ = ["CLI", "LightningCLI", "console_main"]
