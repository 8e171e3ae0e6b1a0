"""Lightning's in-process launchers: ``Trainer(strategy="ddp_spawn" | "ddp_fork" | "ddp_notebook", devices=N)``.

Built in one plain process (a notebook, a test runner, a script), such a Trainer starts no processes at
construction. Each ``fit`` / ``validate`` / ``test`` / ``predict`` call starts ``N`` workers instead
(``"ddp_spawn"``: fresh interpreters, everything handed over is pickled; ``"ddp_fork"`` / ``"ddp_notebook"``:
forked copies of this process, nothing pickled), runs the stage in them as a launched DDP run, and brings rank 0's
results back to this process: the module's weights (into the very module object passed), the stage's return
value, the metrics, the counters and the callbacks' state.

Each worker rebuilds the Trainer from what it pickles as (its keywords and counters, ``trainer.compat.pickling``):
its constructor then sees a launched process (``RANK`` / ``WORLD_SIZE`` / ``MASTER_ADDR`` / ...) and builds the
distributed engine, exactly as under ``ember launch``.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import socket
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from typing import Any

import torch
from torch.multiprocessing import ProcessRaisedException

from callbacks import Callback, ModelCheckpoint
from engine.launch.watch import LAUNCHER_PID_VARIABLE, watch_launcher
from engine.state import AcceleratorState
from trainer.compat.pickling import rebuild_trainer, reduce_trainer
from trainer.states import TrainerFn, TrainerStatus

# Lightning's names for the in-process launchers and the start method each uses.
START_METHODS = {"ddp_spawn": "spawn", "ddp_fork": "fork", "ddp_notebook": "fork"}


def in_process_launcher(strategy: Any, processes: int) -> SpawnLauncher | None:
    """The launcher for ``Trainer(strategy=strategy)`` when this plain process must start ``processes`` workers
    at each call (``None``: not one of the three names, or nothing to start)."""
    method = START_METHODS.get(strategy.lower()) if isinstance(strategy, str) else None
    if method is None or processes <= 1:
        return None
    if method not in multiprocessing.get_all_start_methods():
        raise ValueError(f"Trainer(strategy={strategy!r}) forks its worker processes, but this platform "
                         f"({sys.platform}) cannot fork: use strategy='ddp_spawn' (the module and data must then "
                         "pickle), or launch the script with `ember launch`.")
    return SpawnLauncher(strategy.lower(), method, processes)


@dataclass(frozen=True)
class SpawnLauncher:
    """Runs one Trainer entry point in ``processes`` workers started with ``start_method``; rank 0's results
    come back to the caller."""

    name: str  # the strategy name, for messages
    start_method: str  # "spawn" or "fork"
    processes: int

    def launch(self, trainer: Any, stage: str, arguments: dict[str, Any]) -> Any:
        """``trainer.<stage>(**arguments)`` in the workers; returns what rank 0's call returned, after loading its
        weights, metrics, counters and callback state into ``trainer`` and the caller's module."""
        module = arguments.get("module") or trainer.attached.module
        if module is None:
            raise ValueError(f"trainer.{stage}() got no module and none was fitted before: pass the module, e.g. "
                             f"trainer.{stage}(model, dataloaders).")
        datamodule = arguments.get("datamodule") or trainer.datamodule
        # What was attached by an earlier call goes too: a call without a module uses it (and ckpt_path="best").
        payload = (reduce_trainer(trainer)[1], stage, arguments, module, datamodule)
        sent = self._pickled(payload) if self.start_method == "spawn" else payload
        with tempfile.TemporaryDirectory(prefix="ember-spawn-") as folder:
            try:  # torch terminates the other workers at the first failure: a failure never leaves this waiting
                torch.multiprocessing.start_processes(
                    _worker, args=(self.processes, _free_port(), os.getpid(), sent, folder), nprocs=self.processes,
                    join=True, start_method=self.start_method)
            except ProcessRaisedException as error:
                raise _first_failure(folder, error) from error
            result = torch.load(os.path.join(folder, "rank0.pt"), weights_only=False)  # rank 0 of this very call
        _recover(trainer, stage, module, datamodule, result)
        return result["value"]

    def _pickled(self, payload: tuple[Any, ...]) -> bytes:
        """``payload`` pickled for the spawned interpreters, or an error naming the object that cannot go."""
        (_, keywords, _), _, arguments, module, datamodule = payload
        main_file = getattr(sys.modules.get("__main__"), "__file__", None)
        named = {"the module": module, "the datamodule": datamodule, "the Trainer's callbacks": keywords.get("callbacks"),
                 **{f"{key}=" : value for key, value in arguments.items() if key not in ("module", "datamodule")}}
        for what, value in named.items():
            if value is not None and type(value).__module__ == "__main__" and main_file is None:
                # Pickle stores a class by name; a spawned interpreter has no notebook cell to import it from.
                raise pickle.PicklingError(self._advice(what, value, "its class is defined in an interactive session "
                                                        "(a notebook or the REPL), which spawned processes cannot "
                                                        "import"))
            try:
                pickle.dumps(value)
            except Exception as error:  # any reason pickle gives (lambdas, local classes, open handles, locks)
                raise pickle.PicklingError(self._advice(what, value, f"it cannot be pickled ({error})")) from error
        return pickle.dumps(payload)

    def _advice(self, what: str, value: Any, reason: str) -> str:
        return (f"Trainer(strategy={self.name!r}) hands {what} ({type(value).__qualname__}) to {self.processes} new "
                f"Python processes, but {reason}. Define its class (and any function it holds) at the top level of "
                "an importable module, or use strategy='ddp_fork' / 'ddp_notebook' (Linux and macOS: the workers "
                "are forked copies of this process and nothing is pickled).")


def _worker(rank: int, processes: int, port: int, caller: int, sent: Any, folder: str) -> None:
    """One worker: the launch environment, the Trainer rebuilt (now distributed), the stage, rank 0's results."""
    os.environ.update({"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(processes),
                       "LOCAL_WORLD_SIZE": str(processes), "GROUP_RANK": "0", "NODE_RANK": "0",
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), LAUNCHER_PID_VARIABLE: str(caller)})
    watch_launcher()  # the worker exits within a second if the caller dies (a killed notebook kernel)
    # A forked worker inherits the caller's one-process engine state: drop it, so the rebuilt Trainer's engine
    # reads this worker's launch variables and joins the process group (a spawned worker starts without one).
    AcceleratorState._reset_state(reset_partial_state=True)
    (cls, keywords, state), stage, arguments, module, datamodule = (
        pickle.loads(sent) if isinstance(sent, bytes) else sent)
    trainer = rebuild_trainer(cls, keywords, state)
    clock = _FailureClock()
    trainer.attached.callbacks.insert(0, clock)  # first: it times the failure before anything else runs
    if arguments.get("module") is None:
        trainer._attach(module, datamodule)  # as attached in the caller: the call itself still names no module
    try:
        value = getattr(trainer, stage)(**arguments)
        if rank == 0:
            torch.save(_results(trainer, module, value), os.path.join(folder, "rank0.pt"))
    except BaseException:
        # When, where and what: the caller reports the first failure (the others fail in their next collective).
        # Written aside and renamed: the caller may read the folder while a later rank is still writing its record.
        writing = os.path.join(folder, f"writing-{rank}.txt")
        with open(writing, "w") as record:
            record.write(f"{clock.failed_at or time.time()} {os.getpid()}\n{traceback.format_exc()}")
        os.replace(writing, os.path.join(folder, f"failed-{rank}.txt"))
        raise
    finally:
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


class _FailureClock(Callback):
    """When this worker's run failed: its ``on_exception`` runs before the failure path tears the process group
    down, i.e. before the other workers can fail because of this one."""

    def __init__(self) -> None:
        self.failed_at: float | None = None

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self.failed_at = time.time()


def _first_failure(folder: str, error: ProcessRaisedException) -> ProcessRaisedException:
    """torch's report names the first worker it saw fail; once one rank fails, the others fail too (their next
    collective finds the process group gone), so the rank that failed first, with its traceback, is the cause."""
    records: list[tuple[float, int, int, str]] = []
    for name in os.listdir(folder):
        if name.startswith("failed-"):
            with open(os.path.join(folder, name)) as record:
                stamp, pid = record.readline().split()
                records.append((float(stamp), int(name[len("failed-"):-len(".txt")]), int(pid), record.read()))
    if not records:  # a worker killed by a signal: torch's report is all there is
        return error
    _, rank, first_pid, text = min(records)
    return ProcessRaisedException(f"\n\n-- Process {rank} terminated with the following error (the first of "
                                  f"{len(records)} worker(s) to fail):\n{text}", rank, first_pid)


def _results(trainer: Any, module: torch.nn.Module, value: Any) -> dict[str, Any]:
    """What rank 0 hands back: plain CPU values only (the process and its devices end with the call)."""
    entry = trainer.state_dict()
    return {
        "value": _to_cpu(value),
        "weights": {name: tensor.detach().cpu() for name, tensor in module.state_dict().items()},
        "state": entry["state"],
        # ModelCheckpoint's own state holds paths relative to its run folder: its bookkeeping goes back absolute.
        "callbacks": {key: _to_cpu(state) for key, state in entry["callbacks"].items()
                      if key not in {callback.state_key for callback in trainer.checkpoint_callbacks}},
        "checkpoints": [_checkpoint_record(callback) for callback in trainer.checkpoint_callbacks],
        "metrics": {name: _to_cpu(getattr(trainer.metric_logger, name))
                    for name in ("callback_metrics", "logged_metrics", "progress_bar_metrics")},
    }


def _recover(trainer: Any, stage: str, module: torch.nn.Module, datamodule: Any, result: dict[str, Any]) -> None:
    """Load rank 0's results into the caller's ``trainer`` and ``module``."""
    module.load_state_dict(result["weights"])
    trainer._attach(module, datamodule)  # trainer.lightning_module is the caller's module, as after any call
    trainer.state.load_state_dict(result["state"])
    trainer.state.fn, trainer.state.status = TrainerFn(stage), TrainerStatus.FINISHED
    for callback in trainer.attached.callbacks:
        if callback.state_key in result["callbacks"]:
            callback.load_state_dict(result["callbacks"][callback.state_key])
    for callback, record in zip(trainer.checkpoint_callbacks, result["checkpoints"], strict=False):
        for name, value in record.items():
            setattr(callback, name, value)
    for name, values in result["metrics"].items():
        setattr(trainer.metric_logger, name, values)


def _checkpoint_record(callback: ModelCheckpoint) -> dict[str, Any]:
    """A ``ModelCheckpoint``'s bookkeeping with absolute paths (``best_model_path``, ``last_model_path``, the
    top-k scores behind ``best_model_score`` / ``best_k_models``, ``dirpath``)."""
    return {"dirpath": callback.dirpath, "best_model_path": callback.best_model_path,
            "last_model_path": callback.last_model_path, "_scores": dict(callback._scores),
            "current_score": _to_cpu(callback.current_score)}


def _to_cpu(value: Any) -> Any:
    """``value`` with every tensor moved to the CPU (lists, tuples and dicts followed)."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, dict):
        return {key: _to_cpu(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)) and type(value) in (list, tuple):
        return type(value)(_to_cpu(item) for item in value)
    return value


def _free_port() -> int:
    """A TCP port nobody listens on now, for the workers' rendezvous on 127.0.0.1."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
