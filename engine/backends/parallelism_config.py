"""``ParallelismConfig``: how the processes split into a device mesh (Accelerate 1.15's names, defaults, checks).

A run of N processes is a mesh with the dimensions, in this order, of those sizes that are above 1:
``dp_replicate`` (whole replicas, gradients all-reduced), ``dp_shard`` (FSDP2 shards), ``cp``, ``sp``, ``tp``
(tensor parallelism). The sizes multiply to N. Besides them the mesh has the flattened dimensions Accelerate
names: ``dp`` (all data-parallel dimensions: who gets different batches), ``dp_shard_cp`` and ``dp_cp``.

Nothing here needs a process group: the mesh is built by ``build_device_mesh`` when the Accelerator starts.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

from engine.environment import EngineEnvironment

_DIMENSIONS = ("dp_replicate", "dp_shard", "cp", "sp", "tp")  # the mesh's order (tp last: consecutive ranks)
_FLATTENED = ("dp", "dp_shard_cp", "dp_cp")  # the flattened dimensions build_device_mesh adds
_CP_STRATEGIES = ("allgather", "alltoall")


@dataclass
class TorchTensorParallelConfig:
    """Settings of tensor parallelism (``ParallelismConfig.tp_handler``).

    Args:
        enable_async_tp: accepted for Accelerate's scripts; asynchronous TP is not supported (a warning, as in
            Accelerate).
    """

    enable_async_tp: bool = False

    def __post_init__(self) -> None:
        if self.enable_async_tp:
            warnings.warn("Async tensor parallelism is currently not supported, ignoring this option.", UserWarning,
                          stacklevel=3)


@dataclass
class TorchContextParallelConfig:
    """Settings of context parallelism (``ParallelismConfig.cp_handler``).

    Args:
        cp_comm_strategy: ``"allgather"`` (default, or ``PARALLELISM_CONFIG_CP_COMM_STRATEGY``) or ``"alltoall"``.
    """

    cp_comm_strategy: str | None = None

    def __post_init__(self) -> None:
        if self.cp_comm_strategy is None:
            self.cp_comm_strategy = _env().get("PARALLELISM_CONFIG_CP_COMM_STRATEGY", "allgather")
        if self.cp_comm_strategy not in _CP_STRATEGIES:
            raise ValueError(f"Invalid cp_comm_strategy: {self.cp_comm_strategy}. Must be one of 'allgather' or "
                             "'alltoall'.")


@dataclass
class DeepSpeedSequenceParallelConfig:
    """Settings of DeepSpeed's sequence parallelism (``ParallelismConfig.sp_handler``); accepted for Accelerate's
    scripts, refused by the Accelerator (Ember does not run DeepSpeed-Ulysses)."""

    sp_seq_length_is_variable: bool = True
    sp_attn_implementation: str | None = None


def _env() -> dict[str, str]:
    return EngineEnvironment.from_env().parallelism  # read at construction, as Accelerate's config reads them


@dataclass
class ParallelismConfig:
    """The process mesh: data-parallel replicas and shards, context, sequence and tensor parallelism.

    A size left ``None`` is read from ``PARALLELISM_CONFIG_<NAME>`` (``PARALLELISM_CONFIG_TP_SIZE``...), else 1.
    Tensor parallelism combines with FSDP2 (``dp_shard_size > 1``, 2-D) and HSDP (both data-parallel sizes > 1,
    3-D), not with replicas alone.

    Args:
        dp_replicate_size: whole replicas (DDP, or HSDP's replicate dimension with ``dp_shard_size > 1``).
        dp_shard_size: FSDP2 shards of every parameter.
        tp_size: tensor parallelism: each Linear's weight split over this many processes (``model.tp_plan``).
        cp_size / cp_backend / cp_handler: context parallelism (refused by the Accelerator: see docs/guides/big-models.md).
        sp_size / sp_backend / sp_handler: DeepSpeed-Ulysses sequence parallelism (refused by the Accelerator).
        tp_handler: ``TorchTensorParallelConfig``.

    Example:
        >>> config = ParallelismConfig(dp_shard_size=2, tp_size=2)
        >>> config.total_size, config.active_mesh_dims, config.fsdp_dim_names
        (4, ['dp_shard', 'tp'], ['dp_shard_cp'])
        >>> ParallelismConfig(dp_replicate_size=2, tp_size=2)
        Traceback (most recent call last):
        ValueError: Tensor/Context parallelism (tp/cp_size > 1) cannot be used with pure data parallelism ...
    """

    dp_replicate_size: int | None = None
    dp_shard_size: int | None = None
    tp_size: int | None = None
    cp_size: int | None = None
    cp_backend: str | None = None  # "torch", the one accepted (checked with the others in _check, as Accelerate)
    sp_size: int | None = None
    sp_backend: str | None = None  # "deepspeed", likewise
    tp_handler: TorchTensorParallelConfig | None = None
    cp_handler: TorchContextParallelConfig | None = None
    sp_handler: DeepSpeedSequenceParallelConfig | None = None

    def __post_init__(self) -> None:
        env = _env()
        def size(given: int | None, name: str) -> int:  # not given: the launcher's environment, else 1
            return int(env.get(f"PARALLELISM_CONFIG_{name.upper()}", "1")) if given is None else given

        self.dp_replicate_size = size(self.dp_replicate_size, "dp_replicate_size")
        self.dp_shard_size = size(self.dp_shard_size, "dp_shard_size")
        self.tp_size = size(self.tp_size, "tp_size")
        self.cp_size = size(self.cp_size, "cp_size")
        self.sp_size = size(self.sp_size, "sp_size")
        if self.cp_backend is None:
            self.cp_backend = env.get("PARALLELISM_CONFIG_CP_BACKEND", "torch")
        if self.sp_backend is None:
            self.sp_backend = env.get("PARALLELISM_CONFIG_SP_BACKEND", "deepspeed")
        if self.tp_size > 1 and self.tp_handler is None:
            self.tp_handler = TorchTensorParallelConfig()
        if self.cp_size > 1 and self.cp_handler is None:
            self.cp_handler = TorchContextParallelConfig()
        if self.sp_size > 1 and self.sp_handler is None:
            self.sp_handler = DeepSpeedSequenceParallelConfig()
        # Not a dataclass field: Accelerate's fields stay as they are (see name_mesh_dims).
        self._mesh_names: dict[str, str] = {}
        self._check()

    def _check(self) -> None:
        """Accelerate's constructor checks, in its order and words."""
        if self.cp_handler is not None and not isinstance(self.cp_handler, TorchContextParallelConfig):
            raise ValueError(f"ParallelismConfig's cp_backend={self.cp_backend} requires "
                             f"{TorchContextParallelConfig}, but cp_handler was set to {type(self.cp_handler)}")
        for name in ("dp_replicate_size", "dp_shard_size", "tp_size", "cp_size", "sp_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, but got {getattr(self, name)}")
        if self.cp_backend not in ("torch",):
            raise ValueError(f"cp_backend must be one of ['torch'], but got {self.cp_backend}")
        if self.sp_backend not in ("deepspeed",):
            raise ValueError(f"sp_backend must be one of ['deepspeed'], but got {self.sp_backend}")
        if self.cp_enabled and self.sp_enabled:
            raise ValueError("Context Parallelism (CP) and Sequence Parallelism (SP) are mutually exclusive. Got "
                             f"cp_size={self.cp_size} and sp_size={self.sp_size}. Please set either cp_size=1 or "
                             "sp_size=1.")
        if (self.tp_enabled or self.cp_enabled) and self.dp_replicate_enabled and not self.dp_shard_enabled:
            raise ValueError(
                "Tensor/Context parallelism (tp/cp_size > 1) cannot be used with pure data parallelism "
                "(dp_replicate_size > 1 and dp_shard_size == 1). Please set dp_shard_size > 1 and "
                "dp_replicate_size == 1 to compose FSDP + TP/CP for 2D parallel, or set dp_replicate_size == 1 and "
                "dp_shard_size > 1 to compose HSDP + TP/CP for 3D parallel.")

    def __repr__(self) -> str:
        return ("ParallelismConfig(\n "
                f"\tdp_replicate_size={self.dp_replicate_size},\n\tdp_shard_size={self.dp_shard_size},\n"
                f"\ttp_size={self.tp_size},\n\tcp_size={self.cp_size},\n\tcp_backend={self.cp_backend},\n"
                f"\tsp_size={self.sp_size},\n\tsp_backend={self.sp_backend},\n\ttotal_size={self.total_size}\n"
                f"\ttp_handler={self.tp_handler},\n\tcp_handler={self.cp_handler})\n")

    # -- sizes ------------------------------------------------------------------------------------------------
    def _size(self, dimension: str) -> int:
        return int(getattr(self, f"{dimension}_size"))

    @property
    def total_size(self) -> int:
        """The number of processes the mesh spans."""
        return self.data_parallel_size * self.non_data_parallel_size

    @property
    def data_parallel_size(self) -> int:
        """How many different batches a step sees (``dp_replicate_size * dp_shard_size``)."""
        return self._size("dp_replicate") * self._size("dp_shard")

    @property
    def non_data_parallel_size(self) -> int:
        """How many processes share each batch (``tp_size * cp_size * sp_size``)."""
        return self._size("tp") * self._size("cp") * self._size("sp")

    @property
    def dp_replicate_enabled(self) -> bool:
        return self._size("dp_replicate") > 1

    @property
    def dp_shard_enabled(self) -> bool:
        return self._size("dp_shard") > 1

    @property
    def tp_enabled(self) -> bool:
        return self._size("tp") > 1

    @property
    def cp_enabled(self) -> bool:
        return self._size("cp") > 1

    @property
    def sp_enabled(self) -> bool:
        return self._size("sp") > 1

    # -- dimension names ----------------------------------------------------------------------------------------
    def name_mesh_dims(self, names: dict[str, str]) -> None:
        """Give some of the mesh's own dimensions the names of a caller's vocabulary (Ember's addition).

        The Trainer's ``ModelParallelStrategy`` hands the module Lightning's mesh, whose dimensions are
        ``"data_parallel"`` and ``"tensor_parallel"`` and exist even at size 1: naming ``dp_shard`` and ``tp`` so
        makes the engine's mesh that mesh, so a run has one ``DeviceMesh`` and the engine shards over the same
        process groups the module split itself on. A named dimension is in the mesh at any size; the engine
        itself goes on asking for dimensions by Accelerate's names (``mesh_name`` translates).

        >>> config = ParallelismConfig(tp_size=2)
        >>> config.name_mesh_dims({"dp_shard": "data_parallel", "tp": "tensor_parallel"})
        >>> config.mesh_dims, config.mesh_name("tp"), config.mesh_name("dp")
        (['dp_shard', 'tp'], 'tensor_parallel', 'dp')
        """
        taken = {*_DIMENSIONS, *_FLATTENED}
        for dimension, name in names.items():
            if dimension not in _DIMENSIONS:
                raise ValueError(f"name_mesh_dims got the dimension {dimension!r}; the mesh's dimensions are "
                                 f"{list(_DIMENSIONS)}.")
            if not isinstance(name, str) or not name or name in taken:
                raise ValueError(f"name_mesh_dims({dimension!r}: {name!r}): a new name must be a non-empty string "
                                 f"other than the engine's own names {sorted(taken)}.")
        if len(set(names.values())) != len(names):
            raise ValueError(f"name_mesh_dims({names}): two dimensions cannot take the same name.")
        self._mesh_names = dict(names)

    def mesh_name(self, dimension: str) -> str:
        """The name ``dimension`` (one of Accelerate's, or a flattened one: ``dp``...) has in the built mesh."""
        return self._mesh_names.get(dimension, dimension)

    @property
    def mesh_dims(self) -> list[str]:
        """The dimensions the built mesh has, in mesh order: those of size above 1, and the named ones."""
        return [name for name in _DIMENSIONS if self._size(name) > 1 or name in self._mesh_names]

    @property
    def active_mesh_dims(self) -> list[str]:
        """The mesh's own dimensions, in mesh order (those of size above 1)."""
        return [name for name in _DIMENSIONS if self._size(name) > 1]

    @property
    def dp_dim_names(self) -> list[str]:
        return [name for name in ("dp_replicate", "dp_shard") if self._size(name) > 1]

    @property
    def non_dp_dim_names(self) -> list[str]:
        return [name for name in ("tp", "cp", "sp") if self._size(name) > 1]

    @property
    def dp_shard_cp_dim_names(self) -> list[str]:
        return [name for name in ("dp_shard", "cp") if self._size(name) > 1]

    @property
    def dp_cp_dim_names(self) -> list[str]:
        return [name for name in ("dp_replicate", "dp_shard", "cp") if self._size(name) > 1]

    @property
    def fsdp_dim_names(self) -> list[str]:
        """The mesh FSDP2 shards over: ``dp_shard_cp``, with ``dp_replicate`` in front for HSDP."""
        return (["dp_replicate"] if self.dp_replicate_enabled else []) + ["dp_shard_cp"]

    # -- the mesh -------------------------------------------------------------------------------------------------
    def build_device_mesh(self, device_type: str) -> Any:
        """The device mesh over the processes (``None`` when every size is 1 and no dimension is named), with the
        flattened ``dp``, ``dp_shard_cp`` and ``dp_cp`` dimensions. Needs the process group."""
        dims = self.mesh_dims
        if not dims:
            return None
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh(device_type, tuple(self._size(name) for name in dims),
                                mesh_dim_names=tuple(self.mesh_name(name) for name in dims))
        for flat, names in (("dp", self.dp_dim_names), ("dp_shard_cp", self.dp_shard_cp_dim_names),
                            ("dp_cp", self.dp_cp_dim_names)):
            if names:
                mesh[tuple(self.mesh_name(name) for name in names)]._flatten(flat)
        return mesh

    def check_world(self, num_processes: int) -> None:
        """The sizes must multiply to the number of processes (Accelerate's message, then which sizes to try)."""
        if self.total_size != num_processes:
            raise ValueError(f"ParallelismConfig total_size ({self.total_size}) does not match num_processes "
                             f"({num_processes}). Please adjust dp_replicate_size/ dp_shard_size/tp_size/cp_size/"
                             "sp_size.")
