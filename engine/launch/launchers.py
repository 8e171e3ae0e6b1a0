"""Start a training function on several processes from inside Python: ``notebook_launcher`` (Jupyter, on
torch's elastic agent) and ``debug_launcher`` (CPU only, for tests), plus the environment helpers they use.

Both fork where that is safe (CUDA not yet initialised in this process) and spawn otherwise, as torch's own
launchers do; the children set up ``engine`` from the variables the launcher gives them.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from typing import Any

import torch

from engine.imports import is_cuda_available
from engine.launch.watch import LAUNCHER_PID_VARIABLE, watch_launcher
from engine.state import AcceleratorState, PartialState

_PRECISIONS = ("no", "fp16", "bf16")


@contextlib.contextmanager
def patch_environment(**kwargs: Any) -> Iterator[None]:
    """Set environment variables (names upper-cased, values ``str()``-ed) for the block, then restore them.

    >>> with patch_environment(ember_example_flag=1):
    ...     os.environ["EMBER_EXAMPLE_FLAG"]
    '1'
    >>> "EMBER_EXAMPLE_FLAG" in os.environ
    False
    """
    saved = {key.upper(): os.environ.get(key.upper()) for key in kwargs}
    os.environ.update({key.upper(): str(value) for key, value in kwargs.items()})
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@contextlib.contextmanager
def clear_environment() -> Iterator[None]:
    """Run the block with an empty ``os.environ``; the previous environment comes back afterwards."""
    saved = dict(os.environ)
    os.environ.clear()
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _check_fresh_process(launcher: str) -> None:
    """The children inherit this process: engine state or a process group made here would be wrong in them."""
    if AcceleratorState._shared is not None or PartialState._shared is not None:
        raise ValueError(f"To launch a multi-process training with `{launcher}`, the `Accelerator` (and "
                         "`PartialState`) should only be initialized inside your training function. Restart your "
                         "notebook and make sure no cell initializes an `Accelerator` or `PartialState`.")
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        raise ValueError(f"`{launcher}` starts its own process group, but this process already has one: call "
                         "torch.distributed.destroy_process_group() first, or restart the notebook.")


def _start_method(function: Callable[..., Any], launcher: str) -> str:
    """``fork`` unless CUDA is initialised here (a forked child cannot use it), then ``spawn``."""
    import multiprocessing

    if "fork" in multiprocessing.get_all_start_methods() and not torch.cuda.is_initialized():
        return "fork"
    if getattr(function, "__module__", None) == "__main__" and not hasattr(sys.modules["__main__"], "__file__"):
        # A spawned child re-imports the function by name; one defined in a notebook cannot be found again.
        raise RuntimeError(f"CUDA was initialized in this process before `{launcher}` was called, so the processes "
                           "cannot be forked, and a function defined in the notebook cannot be spawned. Restart the "
                           "notebook and keep every CUDA call (`.cuda()`, `torch.cuda.*`, libraries that touch the "
                           "GPU on import) inside the training function.")
    return "spawn"


def notebook_launcher(function: Callable[..., Any], args: tuple[Any, ...] = (), num_processes: int | None = None,
                      mixed_precision: str = "no", use_port: str | int = "29500", master_addr: str = "127.0.0.1",
                      node_rank: int = 0, num_nodes: int = 1, rdzv_backend: str = "static", rdzv_endpoint: str = "",
                      rdzv_conf: dict[str, Any] | None = None, rdzv_id: str = "none", max_restarts: int = 0,
                      monitor_interval: float = 0.1, log_line_prefix_template: str | None = None) -> Any:
    """Run ``function(*args)`` on ``num_processes`` processes (per node) and wait for them, from a notebook.

    The processes are started by torch's elastic agent (``torch.distributed.launcher.elastic_launch``), as
    ``torchrun`` would: each one sees ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ... and builds its own
    ``Accelerator`` inside ``function``. ``mixed_precision`` becomes every process's default
    (``ACCELERATE_MIXED_PRECISION``). With ``num_processes=1`` the function runs here.

    With ``max_restarts > 0`` the processes meet through torch's ``c10d`` rendezvous even when ``"static"`` is asked
    for (torch's static rendezvous hands restarted processes the failed attempt's addresses).

    Returns ``{rank: return value}`` of this node's processes (the single return value with one process);
    Accelerate returns None. A failing process raises ``ChildFailedError`` carrying its traceback.

    Example (in a notebook; the function must not be run in the notebook's own process first)::

        def train(lr):
            accelerator = Accelerator()
            ...

        notebook_launcher(train, args=(1e-3,), num_processes=2)
    """
    mixed_precision = str(mixed_precision).lower()
    if mixed_precision not in _PRECISIONS:
        raise ValueError(f"Unknown mixed_precision mode: {mixed_precision!r}. Choose between {list(_PRECISIONS)}.")
    if num_processes is None:
        raise ValueError("You have to specify the number of processes you would like to use: add "
                         "`num_processes=...` to your call.")
    if not isinstance(num_processes, int) or num_processes < 1:
        raise ValueError(f"notebook_launcher(num_processes=...) must be a positive integer, got {num_processes!r}.")
    if node_rank >= num_nodes:
        raise ValueError(f"The node_rank must be less than the number of nodes: got node_rank={node_rank}, "
                         f"num_nodes={num_nodes}.")
    if num_processes == 1 and num_nodes == 1:
        # Nothing to distribute: run here, as Accelerate does.
        with patch_environment(accelerate_mixed_precision=mixed_precision):
            print("Launching training on " + ("one GPU." if torch.cuda.is_available() else "CPU."))
            return function(*args)

    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    _check_fresh_process("notebook_launcher")
    start_method = _start_method(function, "notebook_launcher")
    rdzv_conf = dict(rdzv_conf or {})
    if rdzv_backend == "static" and max_restarts > 0:
        # The static rendezvous keeps one store for every attempt and torch (2.13) does not prefix the workers' keys
        # per attempt there, so restarted processes can read the failed attempt's gloo addresses and fail to
        # connect. The c10d rendezvous gives each attempt a store of its own.
        rdzv_backend = "c10d"
        rdzv_endpoint = rdzv_endpoint or f"{master_addr}:{use_port}"
    if rdzv_backend == "static":
        rdzv_conf["rank"] = node_rank
        rdzv_endpoint = rdzv_endpoint or f"{master_addr}:{use_port}"
    config = LaunchConfig(min_nodes=num_nodes, max_nodes=num_nodes, nproc_per_node=num_processes, run_id=rdzv_id,
                          rdzv_endpoint=rdzv_endpoint, rdzv_backend=rdzv_backend, rdzv_configs=rdzv_conf,
                          max_restarts=max_restarts, monitor_interval=monitor_interval, start_method=start_method,
                          log_line_prefix_template=log_line_prefix_template)
    # Accelerate sets MIXED_PRECISION, which nothing reads, so its children run in fp32; this sets the variable
    # the Accelerator reads. As `ember launch`: with the c10d rendezvous, workers sharing the agent's store can read the previous attempt's
    # addresses after an elastic restart and fail to connect (pytorch/pytorch#135712); a store per attempt avoids it.
    share_store = os.environ.get("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    # The workers exit within a second if this process dies (engine.launch.watch).
    with patch_environment(accelerate_mixed_precision=mixed_precision, master_addr=master_addr,
                           master_port=use_port, torch_disable_share_rdzv_tcp_store=share_store,
                           **{LAUNCHER_PID_VARIABLE: os.getpid()}):
        # NVML-based: asking torch.cuda would load the CUDA driver here, and forked children could not use CUDA.
        print(f"Launching training on {num_processes} {'GPU' if is_cuda_available() else 'CPU'} processes.")
        return elastic_launch(config=config, entrypoint=_Watched(function))(*args)


class _Watched:
    """``function``, run in a worker after starting its launcher watch: a forked worker inherits the launcher's
    modules (so ``import engine`` does not run again) but not the watch thread."""

    def __init__(self, function: Callable[..., Any]) -> None:
        self.function = function
        # torch's agent names the entrypoint in its reports and events by these.
        self.__name__ = getattr(function, "__name__", type(function).__name__)
        self.__qualname__ = getattr(function, "__qualname__", self.__name__)

    def __call__(self, *args: Any) -> Any:
        watch_launcher()
        return self.function(*args)


class _DebugRank:
    """What each ``debug_launcher`` process runs: join the gloo group through a file, then call the function."""

    def __init__(self, function: Callable[..., Any], store_path: str, world_size: int) -> None:
        self.function = function
        self.store_path = store_path
        self.world_size = world_size

    def __call__(self, index: int, *args: Any) -> None:
        # Unlike Accelerate's, each process gets its own LOCAL_RANK (Accelerate reports local index 0 everywhere).
        os.environ.update({"RANK": str(index), "LOCAL_RANK": str(index), "WORLD_SIZE": str(self.world_size),
                           "LOCAL_WORLD_SIZE": str(self.world_size), "FORK_LAUNCHED": "1"})
        watch_launcher()  # ends this process within a second if debug_launcher's process dies
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // self.world_size))
        store = torch.distributed.FileStore(self.store_path, self.world_size)
        torch.distributed.init_process_group("gloo", store=store, rank=index, world_size=self.world_size)
        try:
            self.function(*args)
        finally:
            torch.distributed.destroy_process_group()


def debug_launcher(function: Callable[..., Any], args: tuple[Any, ...] = (), num_processes: int = 2) -> None:
    """Run ``function(*args)`` on ``num_processes`` CPU processes joined in a gloo group, and wait for them.

    For tests and debugging only: every process runs on the CPU (``ACCELERATE_USE_CPU``) in fp32. The group
    meets through a temporary file, so no port is needed. A failing process raises
    ``torch.multiprocessing.ProcessRaisedException`` with its traceback.

    Example::

        def check():
            assert PartialState().num_processes == 2

        debug_launcher(check, num_processes=2)
    """
    if not isinstance(num_processes, int) or num_processes < 1:
        raise ValueError(f"debug_launcher(num_processes=...) must be a positive integer, got {num_processes!r}.")
    from torch.multiprocessing import start_processes

    _check_fresh_process("debug_launcher")
    start_method = _start_method(function, "debug_launcher")
    folder = tempfile.mkdtemp(prefix="ember_debug_launcher_")
    try:
        with patch_environment(accelerate_use_cpu="yes", accelerate_mixed_precision="no",
                               **{LAUNCHER_PID_VARIABLE: os.getpid()}):
            start_processes(_DebugRank(function, os.path.join(folder, "store"), num_processes), args=args,
                            nprocs=num_processes, start_method=start_method)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
