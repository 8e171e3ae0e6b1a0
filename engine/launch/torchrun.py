"""``ember launch`` and ``ember config``: a thin front over torchrun (``torch.distributed.run``).

``ember launch`` turns its few flags (and the defaults saved by ``ember config``) into torchrun arguments, so
rendezvous, elastic restarts and multi-node jobs behave exactly as torchrun's, and passes Ember's settings to
the workers through the environment variables the engine reads (``ACCELERATE_MIXED_PRECISION``,
``ACCELERATE_USE_CPU``, ``ACCELERATE_USE_FSDP``, ``ACCELERATE_DEBUG_MODE``). Every worker runs the script through
``run_script`` (this module as ``python -m engine.launch``), which prints a failing rank's traceback once and makes the process exit
promptly, so torchrun tears the whole group down within seconds instead of waiting for a collective timeout.

    ember config --nproc-per-node 2 --mixed-precision bf16      # saved defaults
    ember launch train.py --lr 0.1                              # uses them
    ember launch --nnodes 2 --node-rank 0 --nproc-per-node 4 --rdzv-endpoint node0:29400 train.py
    ember launch --num_processes 8 --num_machines 2 --machine_rank 0 --main_process_ip node0 train.py  # the same

Every flag takes torchrun's spelling and ``accelerate launch``'s (``engine.launch.settings``), and ``--config-file``
reads the file ``accelerate config`` writes as well as Ember's.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import runpy
import sys
import threading
import traceback
from collections.abc import Sequence
from typing import Any

from engine.launch.config import (
    DEEPSPEED_VARIABLES,
    PARALLELISM_DEFAULTS,
    PARALLELISM_VARIABLES,
    PRECISIONS,
    LaunchConfig,
    LaunchSettingError,
    default_config_path,
    read_config_file,
    save_config,
)
from engine.launch.settings import is_accelerate_config, load_settings_file, resolve_aliases, settings_from
from engine.launch.watch import LAUNCHER_PID_VARIABLE

EXIT_GRACE_S = 5.0  # after a failure, at most this long for atexit handlers before the process is ended
# Errors a rank sees when another rank died under it: secondary, reported in one line, not as a traceback.
_PEER_FAILURE_MARKERS = ("Connection closed by peer", "Connection reset by peer", "Broken pipe",
                         "NCCL communicator was aborted", "remote process exited or there was a network error")


# -- ember launch -------------------------------------------------------------------------------------------
def torchrun_arguments(config: LaunchConfig, script: str, script_args: Sequence[str],
                       module: bool = False) -> list[str]:
    """The ``torch.distributed.run`` argument list for ``config``; the workers run ``python -m engine.launch``."""
    argv = ["--nproc-per-node", str(config.resolved_nproc_per_node()), "--max-restarts", str(config.max_restarts)]
    if config.multi_node:
        backend = config.rdzv_backend or "c10d"
        argv += ["--nnodes", config.nnodes, "--rdzv-backend", backend, "--rdzv-endpoint", str(config.rdzv_endpoint),
                 "--rdzv-id", config.rdzv_id or "ember"]
        if backend == "static":  # the c10d rendezvous numbers the nodes itself (torchrun warns if given one)
            argv += ["--node-rank", str(config.node_rank)]
    else:
        argv.append("--standalone")  # one node: torchrun's local rendezvous on a free port
    argv += ["-m", "engine.launch", *(["-m"] if module else []), script, *script_args]
    return argv


def worker_environment(config: LaunchConfig) -> dict[str, str]:
    """The environment variables that carry Ember's settings to every worker."""
    env = {"ACCELERATE_MIXED_PRECISION": config.mixed_precision,
           "ACCELERATE_USE_CPU": "true" if config.cpu else "false",
           "ACCELERATE_USE_FSDP": "true" if config.use_fsdp else "false"}
    if config.debug:  # as `accelerate launch --debug`: collectives check their inputs across ranks
        env["ACCELERATE_DEBUG_MODE"] = "true"
    # The variables `accelerate launch --use_deepspeed` sets, in its spelling of the values.
    env["ACCELERATE_USE_DEEPSPEED"] = "true" if config.use_deepspeed else "false"
    for key, value in (config.deepspeed_config or {}).items():
        env[DEEPSPEED_VARIABLES[key]] = str(value).lower() if isinstance(value, bool) else str(value)
    if config.use_parallelism_config:  # as accelerate launch: the Accelerator builds ParallelismConfig() from them
        env["ACCELERATE_USE_PARALLELISM_CONFIG"] = "true"
        given = config.parallelism_config or {}
        for key, value in {**PARALLELISM_DEFAULTS, **given}.items():
            if key != "parallelism_config_cp_comm_strategy":
                env[PARALLELISM_VARIABLES[key]] = str(value)
        if int(given.get("parallelism_config_cp_size", 1)) > 1:  # Accelerate sets the strategy only then
            strategy = given.get("parallelism_config_cp_comm_strategy", "allgather")
            env[PARALLELISM_VARIABLES["parallelism_config_cp_comm_strategy"]] = str(strategy)
    if "OMP_NUM_THREADS" not in os.environ and config.uses_cpu():
        # torchrun would set 1 thread per process; on CPU the cores are the compute, so share them out instead.
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // config.resolved_nproc_per_node()))
    return env


def launch(config: LaunchConfig, script: str, script_args: Sequence[str], module: bool = False) -> int:
    """Run ``script`` under torchrun with ``config``; returns the exit status (0, or non-zero on failure)."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    if not module and not os.path.isfile(script):
        raise SystemExit(f"ember launch: the training script {script!r} does not exist (use -m for a module).")
    if config.use_deepspeed and importlib.util.find_spec("deepspeed") is None:
        # Refused before any process starts: every worker would fail the same way at its Accelerator.
        raise LaunchSettingError("use_deepspeed: the deepspeed package is not installed: pip install "
                                 "\"ember-train[deepspeed]\".")
    os.environ.update(worker_environment(config))
    # torchrun shares its rendezvous TCPStore with the workers by default, and after an elastic restart workers
    # can read the previous attempt's addresses from it and fail to connect (pytorch/pytorch#135712). A store
    # of their own per attempt avoids that; the user can still opt back in by setting the variable to 0.
    os.environ.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    # The workers watch this process and exit within a second of its death (engine.launch.watch): the agent
    # starts them in sessions of their own, so nothing else would end them if it were killed.
    os.environ[LAUNCHER_PID_VARIABLE] = str(os.getpid())
    try:
        run(parse_args(torchrun_arguments(config, script, script_args, module)))
    except ChildFailedError as failed:
        rank, failure, original = _root_cause(failed)
        where = ("its traceback is printed above" if original else
                 "it saw another process fail, whose traceback is in that process's output (maybe on another node)")
        print(f"[ember] launch failed: rank {rank} (local rank {failure.local_rank}, pid {failure.pid}) exited "
              f"with code {failure.exitcode}; {where}. All workers here were stopped.", file=sys.stderr, flush=True)
        return 1
    except SignalException as signalled:  # Ctrl-C or a scheduler's SIGTERM: torchrun has stopped the workers
        print(f"[ember] launch stopped by {signalled.sigval.name}; all workers were stopped.", file=sys.stderr,
              flush=True)
        return 128 + int(signalled.sigval)
    return 0


def _root_cause(failed: Any) -> tuple[int, Any, bool]:
    """(rank, failure, whether it is the original error) of the failure to report."""
    # A rank that recorded an error file (run_script does for an original exception, not for a rank that only
    # saw a peer die) is the root cause.
    recorded = [(f.timestamp, rank, f) for rank, f in failed.failures.items() if os.path.isfile(str(f.error_file))]
    if recorded:
        _, rank, failure = min(recorded, key=lambda item: item[:2])
        return rank, failure, True
    # Else the first that exited by itself (a positive code), rather than one the agent stopped with a signal.
    exited = sorted((f.exitcode <= 0, f.timestamp, rank) for rank, f in failed.failures.items())
    return exited[0][2], failed.failures[exited[0][2]], False


def _launch_command(args: argparse.Namespace) -> int:
    config = settings_from(args.config_file, vars(args))
    return launch(config, args.script, args.script_args, module=args.module)


# -- ember config -------------------------------------------------------------------------------------------
def _config_command(args: argparse.Namespace) -> int:
    path = args.config_file or default_config_path()
    if os.path.isfile(path) and is_accelerate_config(read_config_file(path)):
        raise LaunchSettingError(f"{path} was written by `accelerate config`; ember launch reads it as it is, and "
                                 "ember config writes Ember's own format: pass another --config-file.")
    values = settings_from(path if os.path.isfile(path) else None, vars(args)).to_dict()
    save_config(values, path)
    print(f"Wrote {path}:")
    for key, value in values.items():
        print(f"  {key}: {value}")
    return 0


def config_report() -> list[str]:
    """Lines for ``ember env``: where the launch defaults live and what they say."""
    path = default_config_path()
    if not os.path.isfile(path):
        return [f"Launch config: {path} (not written; `ember config` creates it)"]
    try:
        values = LaunchConfig(**resolve_aliases(load_settings_file(path))).to_dict()
    except ValueError as err:
        return [f"Launch config: {path} (invalid: {err})"]
    return [f"Launch config: {path}"] + [f"  {k}: {v}" for k, v in values.items()]


def _flag(parser: argparse.ArgumentParser, *names: str, **kwargs: Any) -> None:
    """Add a flag under each name in both spellings, ``--a-b`` (torchrun's) and ``--a_b`` (Accelerate's)."""
    spellings = [n for name in names for n in (name, "--" + name[2:].replace("-", "_"))]
    parser.add_argument(*dict.fromkeys(spellings), **kwargs)


def _add_setting_flags(parser: argparse.ArgumentParser) -> None:
    # Defaults are None so that a flag given on the command line can be told apart from one left to the config.
    _flag(parser, "--config-file", default=None,
          help=f"YAML file of defaults, Ember's or one written by `accelerate config` (default: $EMBER_CONFIG_FILE "
               f"or {default_config_path()})")
    _flag(parser, "--nproc-per-node", type=int, default=None,
          help="processes per node (default: the number of GPUs, or 1)")
    _flag(parser, "--num-processes", type=int, default=None,
          help="accelerate launch's spelling: processes in total over all machines (= --nproc-per-node x --nnodes)")
    _flag(parser, "--nnodes", "--num-machines", default=None, help="number of nodes, or MIN:MAX (elastic)")
    _flag(parser, "--node-rank", "--machine-rank", type=int, default=None,
          help="rank of this node (static rendezvous; c10d numbers the nodes itself)")
    _flag(parser, "--rdzv-endpoint", default=None,
          help="HOST:PORT of the rendezvous (node 0's address); required with --nnodes > 1")
    _flag(parser, "--main-process-ip", default=None,
          help="accelerate launch's spelling of the rendezvous host (with --main-process-port: --rdzv-endpoint)")
    _flag(parser, "--main-process-port", type=int, default=None,
          help="the rendezvous port with --main-process-ip (default 29500); on one machine a free port is "
               "picked instead")
    _flag(parser, "--rdzv-backend", default=None, choices=("c10d", "static", "etcd-v2"),
          help="torchrun rendezvous backend for multi-node runs (default: c10d)")
    _flag(parser, "--rdzv-id", default=None, help="job id shared by all nodes (default: ember)")
    _flag(parser, "--max-restarts", type=int, default=None,
          help="restart the whole worker group up to this many times after a failure")
    _flag(parser, "--mixed-precision", default=None, choices=PRECISIONS)
    _flag(parser, "--cpu", action=argparse.BooleanOptionalAction, default=None,
          help="train on the CPU even if GPUs exist")
    _flag(parser, "--multi-gpu", action="store_true",
          help="accepted from accelerate launch commands; changes nothing (ember launch always starts the "
               "processes through torchrun, one per GPU by default)")
    _flag(parser, "--use-fsdp", action=argparse.BooleanOptionalAction, default=None,
          help="shard models with FSDP2 (the engine creates a default FullyShardedDataParallelPlugin)")
    _flag(parser, "--use-deepspeed", action=argparse.BooleanOptionalAction, default=None,
          help="DeepSpeed ZeRO (ACCELERATE_USE_DEEPSPEED, as accelerate launch); needs an engine with DeepSpeed")
    _flag(parser, "--zero-stage", type=int, default=None, choices=(0, 1, 2, 3),
          help="DeepSpeed ZeRO stage (ACCELERATE_DEEPSPEED_ZERO_STAGE), with --use-deepspeed")
    _flag(parser, "--deepspeed-config-file", default=None,
          help="a DeepSpeed JSON config (ACCELERATE_DEEPSPEED_CONFIG_FILE), with --use-deepspeed")
    _flag(parser, "--fsdp-version", type=int, default=None, choices=(2,),
          help="accepted from accelerate launch commands: Ember's FSDP is FSDP2 (fully_shard)")
    _flag(parser, "--use-parallelism-config", action=argparse.BooleanOptionalAction, default=None,
          help="build ParallelismConfig() from the --parallelism-config-* sizes (ACCELERATE_USE_PARALLELISM_CONFIG)")
    for key in PARALLELISM_VARIABLES:
        kind = str if key.endswith(("_backend", "_strategy")) else int
        _flag(parser, "--" + key.replace("_", "-"), type=kind, default=None,
              help=f"with --use-parallelism-config: {PARALLELISM_VARIABLES[key]}")
    _flag(parser, "--debug", action=argparse.BooleanOptionalAction, default=None,
          help="debug mode: collectives check tensor shapes across processes and raise "
               "DistributedOperationException on every rank on a mismatch (ACCELERATE_DEBUG_MODE)")


def add_launch_commands(subparsers: Any) -> dict[str, argparse.ArgumentParser]:
    """Add ``launch`` and ``config`` to the ``ember`` command line (each sets ``func``); returns their parsers."""
    launch_parser = subparsers.add_parser("launch", help="run a training script on several processes (torchrun)")
    _add_setting_flags(launch_parser)
    launch_parser.add_argument("-m", "--module", action="store_true",
                               help="treat the script as a module name, as `python -m` does")
    launch_parser.add_argument("script", help="the training script (or module with -m)")
    launch_parser.add_argument("script_args", nargs=argparse.REMAINDER, help="arguments for the script")
    launch_parser.set_defaults(func=_launch_command)

    config_parser = subparsers.add_parser("config", help="write default settings for `ember launch` (YAML)")
    _add_setting_flags(config_parser)
    config_parser.set_defaults(func=_config_command)
    return {"launch": launch_parser, "config": config_parser}


# -- the worker side ----------------------------------------------------------------------------------------
def _is_peer_failure(error: BaseException) -> bool:
    return any(marker in str(error) for marker in _PEER_FAILURE_MARKERS)


def _report_failure(error: BaseException) -> None:
    rank = os.environ.get("RANK", "?")
    if _is_peer_failure(error):
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        print(f"[ember] rank {rank}: stopping because another process failed ({type(error).__name__}: "
              f"{first_line[:300]})", file=sys.stderr, flush=True)
        return
    frames = error.__traceback__
    # Start at the user's code: the frames of this runner and of runpy say nothing about the failure.
    while frames is not None and (frames.tb_frame.f_code.co_filename == __file__
                                  or frames.tb_frame.f_globals.get("__name__") == "runpy"):
        frames = frames.tb_next
    text = "".join(traceback.format_exception(type(error), error, frames))
    print(f"[ember] rank {rank} (local rank {os.environ.get('LOCAL_RANK', '?')}) failed:\n{text}",
          file=sys.stderr, end="", flush=True)
    # Recorded for torchrun, whose failure report then names this rank as the root cause.
    from torch.distributed.elastic.multiprocessing.errors import ErrorHandler

    ErrorHandler().record_exception(error)


def _exit_soon(code: int) -> None:
    """End the process within ``EXIT_GRACE_S`` even if a thread or atexit handler would block its shutdown."""
    sys.stdout.flush()
    sys.stderr.flush()
    timer = threading.Timer(EXIT_GRACE_S, os._exit, args=(code,))
    timer.daemon = True
    timer.start()


def run_script(argv: Sequence[str]) -> int:
    """Run ``script [args...]`` (or ``-m module [args...]``) as ``__main__``; returns the exit status.

    An exception is reported once (a traceback for the original error, one line for a rank that merely saw
    another rank die) and the status is 1.
    """
    argv = list(argv)
    module = bool(argv) and argv[0] == "-m"
    if module:
        argv = argv[1:]
    if not argv:
        print("usage: python -m engine.launch [-m] script [args...]", file=sys.stderr)
        return 2
    target, sys.argv = argv[0], list(argv)
    try:
        if module:
            sys.path.insert(0, os.getcwd())
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            sys.path[0] = os.path.dirname(os.path.abspath(target))  # as `python script.py` would have it
            runpy.run_path(target, run_name="__main__")
    except SystemExit as exit_:
        if exit_.code not in (None, 0):
            _exit_soon(exit_.code if isinstance(exit_.code, int) else 1)
        raise
    except KeyboardInterrupt:  # the launcher forwarded Ctrl-C: nothing failed here, no traceback needed
        print(f"[ember] rank {os.environ.get('RANK', '?')}: interrupted", file=sys.stderr, flush=True)
        _exit_soon(130)
        return 130
    except BaseException as error:  # noqa: BLE001 - any failure, reported once, ends this rank
        _report_failure(error)
        _exit_soon(1)
        return 1
    return 0
