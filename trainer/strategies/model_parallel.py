"""``ModelParallelStrategy``: Lightning's tensor + data parallelism on a 2-D device mesh, run by the engine's
``ModelParallel`` backend.

The module splits itself in ``configure_model`` with ``self.device_mesh`` (dimensions ``"data_parallel"`` and
``"tensor_parallel"``, as in Lightning): ``parallelize_module`` over ``device_mesh["tensor_parallel"]``, then
``fully_shard`` over ``device_mesh["data_parallel"]``. The engine shards data over the data-parallel dimension
only (tensor-parallel processes get the same batches), clips over every mesh at once, and saves
``torch.distributed.checkpoint`` shards (``save_distributed_checkpoint=True``) or full files, which load into any
other layout.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from trainer.strategies.base import Strategy

_DEFAULT_TIMEOUT = timedelta(seconds=1800)
_NAMES = ("data_parallel", "tensor_parallel")
_PRECISIONS = ("32-true", "bf16-mixed", "bf16-true", "16-true")  # what Lightning allows with this strategy


class ModelParallelStrategy(Strategy):
    """Lightning's ``ModelParallelStrategy`` (same keywords and defaults): a ``(data_parallel_size,
    tensor_parallel_size)`` mesh over the processes.

    Args:
        data_parallel_size: ``"auto"`` is the number of nodes (1).
        tensor_parallel_size: ``"auto"`` is the number of processes per node.
        save_distributed_checkpoint: checkpoints hold each process's shards (loadable into any layout); ``False``
            gathers full tensors into the files a single process writes.
        process_group_backend / timeout: the process group's (``InitProcessGroupKwargs``).

    Example:
        >>> strategy = ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=2)
        >>> config = strategy.accelerator_kwargs(world_size=4)["parallelism_config"]
        >>> config.dp_shard_size, config.tp_size
        (2, 2)
    """

    kind = "model_parallel"
    requires_configure_model = True  # Lightning refuses a module without configure_model here

    def __init__(self, data_parallel_size: str | int = "auto", tensor_parallel_size: str | int = "auto",
                 save_distributed_checkpoint: bool = True, process_group_backend: str | None = None,
                 timeout: timedelta | None = _DEFAULT_TIMEOUT) -> None:
        for name, value in (("data_parallel_size", data_parallel_size), ("tensor_parallel_size",
                                                                         tensor_parallel_size)):
            if value != "auto" and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"ModelParallelStrategy({name}={value!r}) must be 'auto' or a positive int.")
        self._data_parallel_size = data_parallel_size
        self._tensor_parallel_size = tensor_parallel_size
        self._save_distributed_checkpoint = save_distributed_checkpoint
        self._process_group_backend = process_group_backend
        self._timeout = timeout
        self._device_mesh: Any = None

    def sizes(self, world_size: int, num_nodes: int = 1) -> tuple[int, int]:
        """``(data_parallel_size, tensor_parallel_size)`` with ``"auto"`` resolved, checked against the world."""
        data = num_nodes if self._data_parallel_size == "auto" else int(self._data_parallel_size)
        tensor = world_size // num_nodes if self._tensor_parallel_size == "auto" else int(self._tensor_parallel_size)
        if data * tensor != world_size:
            raise RuntimeError(f"The sizes `data_parallel_size={data}` and `tensor_parallel_size={tensor}` multiplied "
                               f"should equal the world size ({world_size}).")
        return data, tensor

    def accelerator_kwargs(self, world_size: int = 1, num_nodes: int = 1) -> dict[str, Any]:
        """``Accelerator(parallelism_config=..., fsdp_plugin=..., kwargs_handlers=...)`` for this strategy; the
        ``"auto"`` sizes are resolved here for good (data parallel over the machines, tensor parallel within one),
        as Lightning resolves them when its processes start."""
        from engine import InitProcessGroupKwargs, ParallelismConfig

        data, tensor = self.sizes(world_size, num_nodes)
        self._data_parallel_size, self._tensor_parallel_size = data, tensor
        config = ParallelismConfig(dp_shard_size=data, tp_size=tensor)
        # The engine's mesh is the module's: Lightning's dimension names, both present at any size.
        config.name_mesh_dims(dict(zip(("dp_shard", "tp"), _NAMES, strict=True)))
        kwargs: dict[str, Any] = {"parallelism_config": config}
        if not self._save_distributed_checkpoint:
            from engine.backends.fsdp import FullyShardedDataParallelPlugin

            kwargs["fsdp_plugin"] = FullyShardedDataParallelPlugin(state_dict_type="FULL_STATE_DICT")
        if self._process_group_backend is not None or self._timeout != _DEFAULT_TIMEOUT:
            kwargs["kwargs_handlers"] = [InitProcessGroupKwargs(backend=self._process_group_backend,
                                                                timeout=self._timeout)]
        return kwargs

    def check_precision(self, precision: Any) -> None:
        """Lightning's refusal of 16-bit mixed precision (and of TransformerEngine) with this strategy."""
        if precision is not None and str(precision) in ("16-mixed", "16", "transformer-engine",
                                                        "transformer-engine-float16"):
            raise ValueError(f"The `ModelParallelStrategy` does not support `Fabric(..., precision={precision!r})`. "
                             f"Choose a different precision among: {', '.join(_PRECISIONS)}.")

    def setup(self, accelerator: Any) -> None:
        """Take the engine's mesh for the module: one ``DeviceMesh`` per run, which the engine built from
        ``accelerator_kwargs``'s config with Lightning's dimension names."""
        mesh = accelerator.torch_device_mesh
        if mesh is None or tuple(mesh.mesh_dim_names or ()) != _NAMES:
            names = None if mesh is None else mesh.mesh_dim_names
            raise RuntimeError(f"ModelParallelStrategy needs the Accelerator built from its accelerator_kwargs (a "
                               f"mesh with the dimensions {_NAMES}); this one's mesh has {names}. Let the Trainer "
                               "create the Accelerator, in a process that has not made one before.")
        self._device_mesh = mesh

    @property
    def device_mesh(self) -> Any:
        """The ``("data_parallel", "tensor_parallel")`` mesh (what ``TrainModule.device_mesh`` returns)."""
        if self._device_mesh is None:
            raise RuntimeError("Accessing the device mesh before processes have initialized is not allowed.")
        return self._device_mesh

    @property
    def distributed_sampler_kwargs(self) -> dict[str, int]:
        """How the data is split: over the data-parallel dimension only (tensor-parallel ranks share batches)."""
        data_parallel = self.device_mesh["data_parallel"]
        return {"num_replicas": data_parallel.size(), "rank": data_parallel.get_local_rank()}

    @property
    def module_mesh(self) -> Any:
        """What the module's ``device_mesh`` is under this strategy (None until ``setup``)."""
        return self._device_mesh

    @property
    def save_distributed_checkpoint(self) -> bool:
        return self._save_distributed_checkpoint

    def check_parallelized(self, module: Any) -> None:
        """After ``configure_model``: FSDP1 wrappers are refused (Lightning's words)."""
        from torch.distributed.fsdp import FullyShardedDataParallel

        if any(isinstance(m, FullyShardedDataParallel) for m in module.modules()):
            raise TypeError("Found modules that are wrapped with `torch.distributed.fsdp.FullyShardedDataParallel`. "
                            "The `ModelParallelStrategy` only supports the new FSDP2 APIs in PyTorch >= 2.4.")
