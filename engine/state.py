"""Process-wide state: which processes exist, which device this one uses, and gradient-sync bookkeeping.

All ``PartialState()`` instances see one shared record (as in Accelerate): the first construction reads the
environment (torchrun, SLURM, MPI variables), starts the process group and picks the device; later constructions
return views of the same record. ``_reset_state()`` drops the record (tests use it between cases).
"""

from __future__ import annotations

import atexit
import enum
import gc
import os
import re
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import wraps
from typing import Any, TypeVar

import torch
import torch.distributed as dist

F = TypeVar("F", bound=Callable[..., Any])


class DistributedType(str, enum.Enum):
    """How the processes of this run talk to each other. ``str(DistributedType.NO) == "DistributedType.NO"``."""

    NO = "NO"
    MULTI_CPU = "MULTI_CPU"
    MULTI_GPU = "MULTI_GPU"
    MULTI_NPU = "MULTI_NPU"
    MULTI_MLU = "MULTI_MLU"
    MULTI_SDAA = "MULTI_SDAA"
    MULTI_MUSA = "MULTI_MUSA"
    MULTI_XPU = "MULTI_XPU"
    DEEPSPEED = "DEEPSPEED"
    FSDP = "FSDP"
    XLA = "XLA"
    MEGATRON_LM = "MEGATRON_LM"
    MULTI_HPU = "MULTI_HPU"
    MULTI_NEURON = "MULTI_NEURON"

    def __str__(self) -> str:
        return f"DistributedType.{self.value}"


def _env_int(*names: str, default: int) -> int:
    for name in names:
        value = os.environ.get(name)
        if value not in (None, ""):
            return int(value)
    return default


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in {"1", "true", "yes", "y", "on"}


@dataclass
class _LaunchInfo:
    """Rank and world size as the launcher (torchrun, SLURM, MPI) described them in the environment."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    launched: bool


def _read_launch_environment() -> _LaunchInfo:
    if "RANK" in os.environ or "WORLD_SIZE" in os.environ or "LOCAL_RANK" in os.environ:
        world = _env_int("WORLD_SIZE", default=1)
        return _LaunchInfo(_env_int("RANK", default=0), world, _env_int("LOCAL_RANK", default=0),
                           _env_int("LOCAL_WORLD_SIZE", default=world), True)
    for rank_var, size_var, local_var, local_size_var in (
        ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
        ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"),
        ("MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE", "MV2_COMM_WORLD_LOCAL_RANK", "MV2_COMM_WORLD_LOCAL_SIZE"),
    ):
        if _env_int(size_var, default=1) > 1:
            world = _env_int(size_var, default=1)
            return _LaunchInfo(_env_int(rank_var, default=0), world, _env_int(local_var, default=0),
                               _env_int(local_size_var, default=world), True)
    # SLURM started the processes itself (srun) and no launcher ran: its variables describe the job.
    if _env_int("SLURM_NTASKS", default=1) > 1 and "SLURM_PROCID" in os.environ:
        world = _env_int("SLURM_NTASKS", default=1)
        return _LaunchInfo(_env_int("SLURM_PROCID", default=0), world, _env_int("SLURM_LOCALID", default=0),
                           _slurm_tasks_on_this_node(world), True)
    return _LaunchInfo(0, 1, 0, 1, False)


def _slurm_tasks_on_this_node(world: int) -> int:
    """This node's task count from ``SLURM_TASKS_PER_NODE`` (e.g. ``"2(x3),1"``: 2 on nodes 0-2, 1 on node 3)."""
    counts: list[int] = []
    for part in os.environ.get("SLURM_STEP_TASKS_PER_NODE", os.environ.get("SLURM_TASKS_PER_NODE", "")).split(","):
        match = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if match:
            counts += [int(match.group(1))] * int(match.group(2) or 1)
    node = _env_int("SLURM_NODEID", default=0)
    if node < len(counts):
        return counts[node]
    return _env_int("SLURM_NTASKS_PER_NODE", default=world)


def _slurm_master_addr() -> str | None:
    nodes = os.environ.get("SLURM_JOB_NODELIST") or os.environ.get("SLURM_NODELIST")
    if not nodes:
        return None
    first = nodes.split(",")[0]
    if "[" in first:  # "node[03-07,9]" -> "node03"
        prefix, ranges = first.split("[", 1)
        first = prefix + ranges.rstrip("]").split(",")[0].split("-")[0]
    return first


def _default_device(cpu: bool) -> torch.device:
    if cpu:
        return torch.device("cpu")
    if torch.cuda.is_available():
        return torch.device("cuda")
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


@dataclass
class _ProcessRecord:
    """The one shared record behind every ``PartialState``."""

    cpu: bool
    backend: str | None
    device: torch.device
    distributed_type: DistributedType
    num_processes: int
    process_index: int
    local_process_index: int
    local_num_processes: int
    debug: bool
    fork_launched: bool = False
    init_kwargs: dict[str, Any] = field(default_factory=dict)


class PartialState:
    """Process information and process control, without anything about models or precision.

    Args:
        cpu: force the CPU even when an accelerator is present.
        **kwargs: forwarded to ``torch.distributed.init_process_group`` (``backend``, ``timeout``, ...).

    >>> state = PartialState()
    >>> state.num_processes, state.process_index, state.is_main_process
    (1, 0, True)
    """

    _shared: _ProcessRecord | None = None

    def __init__(self, cpu: bool = False, **kwargs: Any) -> None:
        if PartialState._shared is None:
            PartialState._shared = self._initialise(cpu or _env_flag("ACCELERATE_USE_CPU"), kwargs)
        elif kwargs and kwargs != PartialState._shared.init_kwargs:
            warnings.warn(f"Process-group settings {kwargs} (InitProcessGroupKwargs) have no effect: the process "
                          "state was already initialised without them. Pass them to the first Accelerator / "
                          "PartialState of the process.", stacklevel=2)
        PartialState._shared.fork_launched = _env_flag("FORK_LAUNCHED")

    @staticmethod
    def _initialise(cpu: bool, kwargs: dict[str, Any]) -> _ProcessRecord:
        launch = _read_launch_environment()
        requested_backend = kwargs.pop("backend", None)
        debug = _env_flag("ACCELERATE_DEBUG_MODE")
        preset_device = os.environ.get("ACCELERATE_TORCH_DEVICE")
        use_cuda = not cpu and torch.cuda.is_available()
        if dist.is_available() and dist.is_initialized():
            # A process group made by the user (or a test) is adopted as it is.
            if kwargs or requested_backend is not None:
                given = {**kwargs, **({"backend": requested_backend} if requested_backend else {})}
                warnings.warn(f"InitProcessGroupKwargs {given} have no effect: "
                              "torch.distributed was already initialised by other code. Pass them to its "
                              "init_process_group call instead.", stacklevel=3)
            backend = dist.get_backend()
            world, rank = dist.get_world_size(), dist.get_rank()
            dtype = DistributedType.MULTI_GPU if backend == "nccl" else DistributedType.MULTI_CPU
            if world == 1:
                dtype = DistributedType.NO
        elif launch.world_size > 1:
            # Unlike Accelerate, a multi-process launch on a CPU-only host runs MULTI_CPU without `cpu=True`:
            # silently training every rank alone wastes whole jobs.
            backend = "nccl" if use_cuda else "gloo"
            dtype = DistributedType.MULTI_GPU if use_cuda else DistributedType.MULTI_CPU
            if requested_backend is not None and requested_backend != backend:
                raise ValueError(f"InitProcessGroupKwargs(backend={requested_backend!r}) does not match the backend "
                                 f"this run needs ({backend!r} for {dtype}); remove the backend argument.")
            _prepare_environment(launch, use_cuda)
            if use_cuda:
                torch.cuda.set_device(launch.local_rank % torch.cuda.device_count())
            dist.init_process_group(backend, rank=launch.rank, world_size=launch.world_size, **kwargs)
            world, rank = dist.get_world_size(), dist.get_rank()
        else:
            if requested_backend is not None:
                raise ValueError(f"InitProcessGroupKwargs(backend={requested_backend!r}) was given, but this is a "
                                 "single-process run; launch with `ember launch --nproc-per-node N` or torchrun.")
            backend, dtype, world, rank = None, DistributedType.NO, 1, 0

        if preset_device:
            device = torch.device(preset_device)
        elif dtype == DistributedType.MULTI_GPU:
            device = torch.device("cuda", launch.local_rank % torch.cuda.device_count())
        elif dtype == DistributedType.MULTI_CPU:
            device = torch.device("cpu", 0)  # as Accelerate: `cpu:0` on every rank
        else:
            device = _default_device(cpu)
            if device.type == "cuda":
                device = torch.device("cuda", torch.cuda.current_device())
        if dtype != DistributedType.NO:
            atexit.register(_collect_before_exit)
        local_index = launch.local_rank if dtype != DistributedType.NO else 0
        return _ProcessRecord(cpu=cpu, backend=backend, device=device, distributed_type=dtype,
                              num_processes=world, process_index=rank, local_process_index=local_index,
                              local_num_processes=launch.local_world_size if dtype != DistributedType.NO else 1,
                              debug=debug, init_kwargs=kwargs)

    # -- the shared record ------------------------------------------------------------------------------------
    @property
    def _record(self) -> _ProcessRecord:
        if PartialState._shared is None:
            raise AttributeError("`PartialState` is not initialised (was `PartialState._reset_state()` called?): "
                                 "create `PartialState()` or `Accelerator()` again before reading it.")
        return PartialState._shared

    @property
    def initialized(self) -> bool:
        return PartialState._shared is not None

    @classmethod
    def _reset_state(cls) -> None:
        """Forget the shared state (for tests). Reading a field afterwards raises until a new construction."""
        PartialState._shared = None

    @property
    def device(self) -> torch.device:
        return self._record.device

    @property
    def backend(self) -> str | None:
        return self._record.backend

    @property
    def distributed_type(self) -> DistributedType:
        return self._record.distributed_type

    @distributed_type.setter
    def distributed_type(self, value: DistributedType) -> None:
        self._record.distributed_type = value

    @property
    def num_processes(self) -> int:
        return self._record.num_processes

    @property
    def process_index(self) -> int:
        return self._record.process_index

    @property
    def local_process_index(self) -> int:
        return self._record.local_process_index

    @property
    def debug(self) -> bool:
        return self._record.debug

    @property
    def fork_launched(self) -> bool:
        return self._record.fork_launched

    @property
    def use_distributed(self) -> bool:
        return self.distributed_type != DistributedType.NO and self.num_processes > 1

    @property
    def is_main_process(self) -> bool:
        return self.process_index == 0

    @property
    def is_local_main_process(self) -> bool:
        return self.local_process_index == 0

    @property
    def is_last_process(self) -> bool:
        return self.process_index == self.num_processes - 1

    def __repr__(self) -> str:
        backend = f"  Backend: {self.backend}" if self.backend else ""
        return (f"Distributed environment: {self.distributed_type}{backend}\nNum processes: {self.num_processes}\n"
                f"Process index: {self.process_index}\nLocal process index: {self.local_process_index}\n"
                f"Device: {self.device}\n")

    # -- process control -------------------------------------------------------------------------------------
    def wait_for_everyone(self) -> None:
        """Barrier across all processes; a no-op in a single process."""
        if self.use_distributed:
            if self.backend == "nccl":
                dist.barrier(device_ids=[self.device.index or 0])
            else:
                dist.barrier()

    @contextmanager
    def _goes_first(self, is_first: bool) -> Iterator[None]:
        if not is_first:
            self.wait_for_everyone()
        yield
        if is_first:
            self.wait_for_everyone()

    @contextmanager
    def main_process_first(self) -> Iterator[None]:
        """The main process runs the block first; the others enter it once the main process has left it."""
        with self._goes_first(self.is_main_process):
            yield

    @contextmanager
    def local_main_process_first(self) -> Iterator[None]:
        """The local main process of each node runs the block first, then the others."""
        with self._goes_first(self.is_local_main_process):
            yield

    @contextmanager
    def split_between_processes(self, inputs: Any, apply_padding: bool = False) -> Iterator[Any]:
        """Give each process its contiguous share of ``inputs`` (list, tuple, tensor, or dict of those)."""
        from engine.operations import split_for_process

        yield split_for_process(inputs, self.num_processes, self.process_index, apply_padding)

    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print`` on the local main process only."""
        if self.is_local_main_process:
            print(*args, **kwargs)

    def set_device(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)

    def destroy_process_group(self, group: Any = None) -> None:
        """Destroy the process group (a no-op for fork-launched runs when no group is named)."""
        if self.fork_launched and group is None:
            return
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group(group)
            if group is None:
                from engine.parallel import release_ddp_wrappers

                release_ddp_wrappers()

    # -- decorators decided at decoration time ----------------------------------------------------------------
    def _run_if(self, condition: bool, function: F) -> F:
        if condition or not self.use_distributed:
            return function

        @wraps(function)
        def skipped(*args: Any, **kwargs: Any) -> None:
            return None

        return skipped  # type: ignore[return-value]

    def on_main_process(self, function: F) -> F:
        return self._run_if(self.is_main_process, function)

    def on_local_main_process(self, function: F) -> F:
        return self._run_if(self.is_local_main_process, function)

    def on_last_process(self, function: F) -> F:
        return self._run_if(self.is_last_process, function)

    def on_process(self, function: F | None = None, process_index: int | None = None) -> Any:
        if function is None:
            return lambda f: self.on_process(f, process_index=process_index)
        return self._run_if(self.process_index == process_index, function)

    def on_local_process(self, function: F | None = None, local_process_index: int | None = None) -> Any:
        if function is None:
            return lambda f: self.on_local_process(f, local_process_index=local_process_index)
        return self._run_if(self.local_process_index == local_process_index, function)


def _collect_before_exit() -> None:
    """Free unreachable objects (a finished Trainer, a DDP wrapper in a reference cycle) while the interpreter
    is still whole: left to interpreter shutdown, freeing the gloo process group they hold aborts the process
    ("terminate called without an active exception") in a fraction of runs with torch 2.13."""
    gc.collect()


def _prepare_environment(launch: _LaunchInfo, use_cuda: bool) -> None:
    """Write the rank variables back (as torchrun would) and fill in what a gloo/nccl rendezvous needs."""
    os.environ["RANK"] = str(launch.rank)
    os.environ["WORLD_SIZE"] = str(launch.world_size)
    os.environ["LOCAL_RANK"] = str(launch.local_rank)
    os.environ["LOCAL_WORLD_SIZE"] = str(launch.local_world_size)
    if "MASTER_ADDR" not in os.environ:
        addr = _slurm_master_addr()
        if addr is None and launch.local_world_size < launch.world_size:
            raise ValueError(f"This run spans several nodes (WORLD_SIZE={launch.world_size}, "
                             f"LOCAL_WORLD_SIZE={launch.local_world_size}) but MASTER_ADDR is not set: set it to the "
                             "address of the rank-0 node, or start the job with `ember launch --rdzv-endpoint`.")
        os.environ["MASTER_ADDR"] = addr or "127.0.0.1"
    # Under SLURM several jobs may share a node: derive the port from the job id rather than all using 29500.
    job_id = os.environ.get("SLURM_JOB_ID", "")
    os.environ.setdefault("MASTER_PORT", str(15000 + int(job_id) % 20000) if job_id.isdigit() else "29500")
    if not use_cuda and "OMP_NUM_THREADS" not in os.environ:
        threads = max(1, (os.cpu_count() or 1) // max(1, launch.local_world_size))
        torch.set_num_threads(threads)
        warnings.warn(f"OMP_NUM_THREADS is not set: using {threads} threads per process "
                      f"({os.cpu_count()} cores / {launch.local_world_size} local processes). "
                      "Set OMP_NUM_THREADS to choose.", stacklevel=3)


@dataclass
class _AcceleratorRecord:
    mixed_precision: str
    fsdp_plugin: Any = None
    dynamo_plugin: Any = None


class AcceleratorState:
    """``PartialState`` plus what the ``Accelerator`` decided: mixed precision and the parallelism plugin.

    Only an ``Accelerator`` may create it; afterwards ``AcceleratorState()`` anywhere returns a view of it.
    """

    _shared: _AcceleratorRecord | None = None

    def __init__(self, mixed_precision: str | None = None, cpu: bool = False, dynamo_plugin: Any = None,
                 deepspeed_plugin: Any = None, fsdp_plugin: Any = None, megatron_lm_plugin: Any = None,
                 _from_accelerator: bool = False, **kwargs: Any) -> None:
        cpu = cpu or _env_flag("ACCELERATE_USE_CPU")
        self._partial = PartialState(cpu, **kwargs)
        if AcceleratorState._shared is not None:
            self._check_initialized(mixed_precision, cpu)
            return
        if not _from_accelerator:
            raise ValueError("Please make sure to properly initialize your accelerator via "
                             "`accelerator = Accelerator()` before using any functionality from the "
                             "`AcceleratorState`.")
        precision = (mixed_precision or os.environ.get("ACCELERATE_MIXED_PRECISION") or "no").lower()
        AcceleratorState._shared = _AcceleratorRecord(precision, fsdp_plugin, dynamo_plugin)
        if fsdp_plugin is not None and self._partial.use_distributed:
            self._partial.distributed_type = DistributedType.FSDP

    def _check_initialized(self, mixed_precision: str | None = None, cpu: bool | None = None) -> None:
        if mixed_precision is not None and mixed_precision.lower() != self.mixed_precision:
            raise ValueError("AcceleratorState has already been initialized and cannot be changed: it uses "
                             f"mixed_precision={self.mixed_precision!r}, not {mixed_precision!r}. Restart the "
                             "process, or call `AcceleratorState._reset_state(True)` first in tests.")
        if cpu and self.device.type != "cpu":
            raise ValueError("AcceleratorState has already been initialized and cannot be changed: it runs on "
                             f"{self.device}, so `cpu=True` cannot take effect. Restart the process.")

    @property
    def _record(self) -> _AcceleratorRecord:
        if AcceleratorState._shared is None:
            raise AttributeError("`AcceleratorState` is not initialised (was `AcceleratorState._reset_state()` "
                                 "called?): create an `Accelerator()` again before reading it.")
        return AcceleratorState._shared

    @property
    def initialized(self) -> bool:
        return AcceleratorState._shared is not None

    @classmethod
    def _reset_state(cls, reset_partial_state: bool = False) -> None:
        AcceleratorState._shared = None
        if reset_partial_state:
            PartialState._reset_state()

    @property
    def mixed_precision(self) -> str:
        return self._record.mixed_precision

    @property
    def fsdp_plugin(self) -> Any:
        return self._record.fsdp_plugin

    @property
    def dynamo_plugin(self) -> Any:
        return self._record.dynamo_plugin

    def __getattr__(self, name: str) -> Any:
        # Process information and process control come from the shared PartialState.
        if name.startswith("__") or name == "_partial":
            raise AttributeError(name)
        return getattr(self._partial, name)

    def __repr__(self) -> str:
        return repr(self._partial) + f"\nMixed precision type: {self.mixed_precision}\n"


# GradientState lives in its own module; it is re-exported here because it is part of the state API.
from engine.gradient_state import GradientState

__all__ = ["AcceleratorState", "DistributedType", "GradientState", "PartialState"]
