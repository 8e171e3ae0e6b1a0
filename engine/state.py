"""Process-wide state: which processes exist, which device this one uses, and gradient-sync bookkeeping.

All ``PartialState()`` instances see one shared record (as in Accelerate): the first construction reads the
environment (``EngineEnvironment``: torchrun, SLURM, MPI variables), starts the process group and picks the
device; later constructions return views of the same record. ``_reset_state()`` drops the record (tests use it between cases).
"""

from __future__ import annotations

import atexit
import enum
import gc
import inspect
import socket
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import wraps
from typing import Any, ClassVar, ParamSpec, TypeVar

import torch
import torch.distributed as dist

from engine.data.splitting import split_for_process
from engine.environment import EngineEnvironment, read_fork_launched, read_use_cpu, write_rendezvous_variables
from engine.gradient_state import GradientState
from engine.launch.elastic_store import restart_scoped_store
from engine.precision.policy import Precision

F = TypeVar("F", bound=Callable[..., Any])
P = ParamSpec("P")
R = TypeVar("R")


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
    # The default process group was made by other code (Ray Train's workers, a test, the user) and adopted: its
    # owner destroys it, so Ember's teardown leaves it alone (Ray's next collective or its own shutdown needs it).
    adopted_group: bool = False
    init_kwargs: dict[str, Any] = field(default_factory=dict)


def _new_settings(kwargs: dict[str, Any], record: _ProcessRecord) -> bool:
    """Whether process-group settings differ from those the process state was made with (the backend it already
    runs on is no difference)."""
    given = dict(kwargs)
    if given.get("backend") == record.backend:
        del given["backend"]
    return bool(given) and given != record.init_kwargs


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
    # Run (then forgotten) when the default process group is destroyed. The layers above register what holds the
    # group (parallel.py: its DDP wrappers), so that this module, the bottom of the engine, imports none of them.
    # Kept on the class, not the record: the process group outlives `_reset_state()`.
    _teardown: ClassVar[list[Callable[[], None]]] = []
    # id() of the default group Ember made (None: none alive). On the class for the same reason: a record rebuilt
    # after `_reset_state()` must still know the group is Ember's to destroy, not one it adopted.
    _made_group: ClassVar[int | None] = None

    def __init__(self, cpu: bool = False, *, _environment: EngineEnvironment | None = None, **kwargs: Any) -> None:
        if PartialState._shared is None:
            env = _environment if _environment is not None else EngineEnvironment.from_env()
            PartialState._shared = self._initialise(cpu or env.use_cpu, env, kwargs)
        elif kwargs and _new_settings(kwargs, PartialState._shared):
            warnings.warn(f"Process-group settings {kwargs} (InitProcessGroupKwargs) have no effect: the process "
                          "state was already initialised without them. Pass them to the first Accelerator / "
                          "PartialState of the process.", stacklevel=2)
        # Re-read on every construction, as Accelerate does (a notebook launcher sets it in its children); when no
        # environment was passed down, this is one variable, not the whole set: PartialState() is built per step.
        PartialState._shared.fork_launched = (_environment.fork_launched if _environment is not None
                                              else read_fork_launched())

    @staticmethod
    def _initialise(cpu: bool, env: EngineEnvironment, kwargs: dict[str, Any]) -> _ProcessRecord:
        launch = env.launch
        adopted = False
        backend: str | None  # the process group's (torch's Backend is a str)
        requested_backend = kwargs.pop("backend", None)
        debug = env.debug_mode
        preset_device = env.torch_device
        use_cuda = not cpu and torch.cuda.is_available()
        if dist.is_available() and dist.is_initialized():
            # A process group made by the user (or a test) is adopted as it is.
            # Asking for the backend the group already has is not "no effect" (a second Accelerator of a test).
            if kwargs or requested_backend not in (None, dist.get_backend()):
                given = {**kwargs, **({"backend": requested_backend} if requested_backend else {})}
                warnings.warn(f"InitProcessGroupKwargs {given} have no effect: "
                              "torch.distributed was already initialised by other code. Pass them to its "
                              "init_process_group call instead.", stacklevel=3)
            backend, adopted = dist.get_backend(), PartialState._made_group != id(dist.group.WORLD)
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
            write_rendezvous_variables(env, use_cuda)
            if use_cuda:
                torch.cuda.set_device(launch.local_rank % torch.cuda.device_count())
            _import_dynamo_first()
            rendezvous: dict[str, Any] = {}
            if kwargs.get("init_method") is None and kwargs.get("store") is None:  # the user's own rendezvous wins
                # A torchrun restart must not read the previous attempt's addresses (engine/launch/elastic_store.py).
                store = restart_scoped_store(env, kwargs.get("timeout"))
                if store is not None:
                    rendezvous["store"] = store
            dist.init_process_group(backend, rank=launch.rank, world_size=launch.world_size, **kwargs, **rendezvous)
            PartialState._made_group = id(dist.group.WORLD)
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
                              debug=debug, adopted_group=adopted, init_kwargs=kwargs)

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
        """Debug mode: every collective first checks that tensor shapes agree across processes.

        Starts from ``ACCELERATE_DEBUG_MODE`` (what ``accelerate launch --debug`` sets); settable at run time
        (``PartialState().debug = True``), for every view of the shared state at once. Set it on every rank: the
        check is itself a collective.
        """
        return self._record.debug

    @debug.setter
    def debug(self, value: bool) -> None:
        if not isinstance(value, bool):
            raise TypeError(f"PartialState().debug must be True or False, got {value!r}.")
        self._record.debug = value

    @property
    def fork_launched(self) -> bool:
        return self._record.fork_launched

    @property
    def adopted_process_group(self) -> bool:
        """Whether the default process group was made by other code (Ray Train, the user) and adopted as it was:
        then ``destroy_process_group()`` (``end_training``, the trainer's failure path, the exit handler) leaves it
        to its owner."""
        return self._record.adopted_group

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
        yield split_for_process(inputs, self.num_processes, self.process_index, apply_padding)

    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print`` on the local main process only."""
        if self.is_local_main_process:
            print(*args, **kwargs)

    def set_device(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)

    def destroy_process_group(self, group: Any = None) -> None:
        """Destroy the process group (a no-op for fork-launched runs when no group is named). Called directly, it
        destroys an adopted group too, as Accelerate's does; ``end_training``, the trainer's failure path and the
        exit handler leave an adopted group to its owner (``adopted_process_group``)."""
        if self.fork_launched and group is None:
            return
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group(group)
            if group is None:
                PartialState._made_group = None
                callbacks = list(PartialState._teardown)
                PartialState._teardown.clear()
                for callback in callbacks:
                    callback()

    @classmethod
    def register_teardown(cls, callback: Callable[[], None]) -> None:
        """Call ``callback`` once when the default process group is destroyed (registering twice is one call).

        For objects that hold the process group and must let go of it before interpreter shutdown, e.g. the DDP
        wrappers made by ``Accelerator.prepare``.
        """
        if callback not in cls._teardown:
            cls._teardown.append(callback)

    # -- decorators decided at decoration time ----------------------------------------------------------------
    def _run_if(self, condition: bool, function: Callable[P, R]) -> Callable[P, R | None]:
        if condition or not self.use_distributed:
            return function

        @wraps(function)
        def skipped(*args: P.args, **kwargs: P.kwargs) -> R | None:
            return None

        return skipped

    def on_main_process(self, function: Callable[P, R]) -> Callable[P, R | None]:
        return self._run_if(self.is_main_process, function)

    def on_local_main_process(self, function: Callable[P, R]) -> Callable[P, R | None]:
        return self._run_if(self.is_local_main_process, function)

    def on_last_process(self, function: Callable[P, R]) -> Callable[P, R | None]:
        return self._run_if(self.is_last_process, function)

    def on_process(self, function: F | None = None, process_index: int | None = None) -> Any:
        if function is None:
            return lambda f: self.on_process(f, process_index=process_index)
        return self._run_if(self.process_index == process_index, function)

    def on_local_process(self, function: F | None = None, local_process_index: int | None = None) -> Any:
        if function is None:
            return lambda f: self.on_local_process(f, local_process_index=local_process_index)
        return self._run_if(self.local_process_index == local_process_index, function)


def process_group_of_one(device: torch.device) -> None:
    """Make a process group of size 1 when the launch made none (DeepSpeed, and a device mesh, need one even for
    one process)."""
    if dist.is_available() and dist.is_initialized():
        return
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    backend = "nccl" if device.type == "cuda" else "gloo"
    _import_dynamo_first()
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    PartialState._made_group = id(dist.group.WORLD)


def _import_dynamo_first() -> None:
    """Import ``torch._dynamo`` before the process group exists, so that destroying the group ends its threads.

    Imported after a group exists (as the first optimizer or DDP wrapper of a run does), torch 2.13's dynamo keeps
    ten references to the default group for the life of the process: ``destroy_process_group`` then leaves gloo's
    threads (``gloo_tcp_loop``, two ``pt_gloo_runloop``) running through interpreter shutdown, and the group is
    freed, if ever, while the interpreter is torn down: the exit that aborted multi-process runs with "terminate
    called without an active exception" (issue 39). Free here: every training process imports it anyway.
    """
    import torch._dynamo  # noqa: F401


def _collect_before_exit() -> None:
    """Free unreachable objects (a finished Trainer, a DDP wrapper in a reference cycle) and destroy the process
    groups while the interpreter is still whole: left to interpreter shutdown, freeing a gloo process group that
    something still holds (a DDP wrapper, DeepSpeed's engine, a device mesh's sub-groups) aborts the process
    ("terminate called without an active exception") in a fraction of runs with torch 2.13 (1 in 8 DeepSpeed runs
    here). Runs after every exit handler registered later (atexit calls them in reverse order)."""
    gc.collect()
    record = PartialState._shared
    if (record is not None and not record.fork_launched and not record.adopted_group and dist.is_available()
            and dist.is_initialized()):
        PartialState().destroy_process_group()
        gc.collect()


@dataclass
class _AcceleratorRecord:
    mixed_precision: str
    fsdp_plugin: Any = None
    dynamo_plugin: Any = None
    deepspeed_plugin: Any = None
    parallelism_config: Any = None
    device_mesh: Any = None  # the ParallelismConfig's DeviceMesh (None without one, or when every size is 1)


class AcceleratorState:
    """``PartialState`` plus what the ``Accelerator`` decided: mixed precision and the parallelism plugin.

    Only an ``Accelerator`` may create it; afterwards ``AcceleratorState()`` anywhere returns a view of it.
    """

    _shared: _AcceleratorRecord | None = None
    # Process information comes from the shared PartialState through this view, which holds nothing itself: kept
    # on the class, so an instance's __dict__ is empty and equal to an unpickled one's (Accelerate's own test
    # compares `state.__dict__` across pickling; its states share one dict).
    _partial: ClassVar[PartialState] = PartialState.__new__(PartialState)

    def __init__(self, mixed_precision: str | None = None, cpu: bool = False, dynamo_plugin: Any = None,
                 deepspeed_plugin: Any = None, fsdp_plugin: Any = None, megatron_lm_plugin: Any = None,
                 parallelism_config: Any = None, _from_accelerator: bool = False,
                 _environment: EngineEnvironment | None = None, **kwargs: Any) -> None:
        if _environment is None and AcceleratorState._shared is not None:
            # A view of the built state only checks `cpu` against it: one variable, not the whole set.
            cpu = cpu or read_use_cpu()
            PartialState(cpu, **kwargs)
            self._check_initialized(mixed_precision, cpu)
            return
        env = _environment if _environment is not None else EngineEnvironment.from_env()
        cpu = cpu or env.use_cpu
        PartialState(cpu, _environment=env, **kwargs)
        if AcceleratorState._shared is not None:
            self._check_initialized(mixed_precision, cpu)
            return
        if not _from_accelerator:
            raise ValueError("Please make sure to properly initialize your accelerator via "
                             "`accelerator = Accelerator()` before using any functionality from the "
                             "`AcceleratorState`.")
        precision = (mixed_precision or env.mixed_precision or "no").lower()
        mesh = None
        if parallelism_config is not None:  # before the record: a config that does not fit leaves no state behind
            if parallelism_config.total_size == 1 and self._partial.num_processes > 1:
                parallelism_config.dp_replicate_size = self._partial.num_processes  # plain DDP, as in Accelerate
            parallelism_config.check_world(self._partial.num_processes)
            if parallelism_config.mesh_dims and self._partial.num_processes == 1:
                process_group_of_one(self._partial.device)  # named dimensions make a mesh of one process too
            mesh = parallelism_config.build_device_mesh(self._partial.device.type)
        AcceleratorState._shared = _AcceleratorRecord(precision, fsdp_plugin, dynamo_plugin, deepspeed_plugin,
                                                      parallelism_config, mesh)
        if fsdp_plugin is not None and self._partial.use_distributed:
            self._partial.distributed_type = DistributedType.FSDP
        if deepspeed_plugin is not None:  # also in one process: DeepSpeed runs its engine there too
            self._partial.distributed_type = DistributedType.DEEPSPEED
            if self._partial.device.type == "cpu":
                self._partial._record.device = torch.device("cpu")  # as Accelerate's DeepSpeed state: no index
            deepspeed_plugin.set_deepspeed_weakref()  # transformers' from_pretrained sees the config (ZeRO-3 init)

    @staticmethod
    def initialized_with_deepspeed() -> bool:
        """Whether the process's state exists and trains with DeepSpeed (a second Accelerator may not bring its
        own plugin, and does not build one from the environment)."""
        shared = AcceleratorState._shared
        return shared is not None and shared.deepspeed_plugin is not None

    def _check_initialized(self, mixed_precision: str | None = None, cpu: bool | None = None) -> None:
        if mixed_precision is not None and mixed_precision.lower() != self.mixed_precision:
            raise ValueError("AcceleratorState has already been initialized and cannot be changed: it uses "
                             f"mixed_precision={self.mixed_precision!r}, not {mixed_precision!r}. Restart the "
                             "process, or call `AcceleratorState._reset_state(True)` first in tests.")
        if cpu and self.device.type != "cpu":
            raise ValueError("AcceleratorState has already been initialized and cannot be changed: it runs on "
                             f"{self.device}, so `cpu=True` cannot take effect. Restart the process.")

    @staticmethod
    def _record(name: str) -> _AcceleratorRecord:
        if AcceleratorState._shared is None:
            # Accelerate's wording (its own test scripts match it), then what to do.
            raise AttributeError(f"`AcceleratorState` object has no attribute `{name}`. This happens if "
                                 "`AcceleratorState._reset_state()` was called and an `Accelerator` or `PartialState` "
                                 "was not reinitialized: create an `Accelerator()` again before reading it.")
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
        return self._record("mixed_precision").mixed_precision

    @property
    def precision(self) -> Precision:
        """The run's precision as one value (``engine.precision.policy``): full, mixed or fp8 here (a true one is
        the Trainer's, through the same type)."""
        return Precision.from_mixed_precision(self.mixed_precision)

    @property
    def fsdp_plugin(self) -> Any:
        return self._record("fsdp_plugin").fsdp_plugin

    @property
    def dynamo_plugin(self) -> Any:
        return self._record("dynamo_plugin").dynamo_plugin

    @property
    def deepspeed_plugin(self) -> Any:
        return self._record("deepspeed_plugin").deepspeed_plugin

    @property
    def parallelism_config(self) -> Any:
        return self._record("parallelism_config").parallelism_config

    @property
    def device_mesh(self) -> Any:
        return self._record("device_mesh").device_mesh

    @property
    def debug(self) -> bool:
        return self._partial.debug

    @debug.setter
    def debug(self, value: bool) -> None:
        # Written through to the shared record: the collectives read PartialState().debug. (In Accelerate,
        # setting it on AcceleratorState leaves PartialState().debug, and so every check, unchanged.)
        self._partial.debug = value

    def __getattr__(self, name: str) -> Any:
        # Process information and process control come from the shared PartialState.
        if name.startswith("__") or name == "_partial":
            raise AttributeError(name)
        own = inspect.getattr_static(type(self), name, None)
        if isinstance(own, property):
            # Python lands here when one of our own properties raised AttributeError (e.g. reading after
            # `_reset_state()`): run it again so its own message surfaces, not "'PartialState' has no attribute".
            return own.__get__(self, type(self))
        return getattr(self._partial, name)

    def __repr__(self) -> str:
        text = repr(self._partial) + f"\nMixed precision type: {self.mixed_precision}\n"
        if self.deepspeed_plugin is not None:
            text += f"ds_config: {self.deepspeed_plugin.deepspeed_config}\n"
        return text


__all__ = ["AcceleratorState", "DistributedType", "GradientState", "PartialState"]
