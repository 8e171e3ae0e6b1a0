"""FSDP2: the ``FullyShardedDataParallelPlugin``, sharding a model with ``torch.distributed.fsdp.fully_shard``,
and gathering / scattering its full state.

``Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin(...))`` (or ``ember launch --use-fsdp``) makes
``prepare`` shard the model over all processes. Parameters become ``DTensor`` shards, replaced in place: an
optimizer built before ``prepare`` is pointed at the new parameters by ``retarget_optimizer``.

>>> plugin = FullyShardedDataParallelPlugin(transformer_cls_names_to_wrap=["Block"])
>>> plugin.state_dict_type, plugin.reshard_after_forward
('SHARDED_STATE_DICT', True)
"""

from __future__ import annotations

import contextlib
import itertools
import weakref
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.distributed as dist
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, fully_shard

from engine.keywords import suggest_keywords
from engine.memory.activation_checkpointing import checkpoint_modules, outermost_wrappers
from engine.precision.policy import autocast_dtype
from engine.state import PartialState

STATE_DICT_TYPES = ("SHARDED_STATE_DICT", "FULL_STATE_DICT")
_DTYPE_NAMES: dict[str, torch.dtype] = {
    "bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16, "float16": torch.float16,
    "half": torch.float16, "fp32": torch.float32, "float32": torch.float32, "float": torch.float32,
}
_POLICY_FIELDS = ("param_dtype", "reduce_dtype", "output_dtype", "cast_forward_inputs")
_REPLACED_ATTR = "_ember_replaced_parameters"  # set on a sharded model: a _Replaced
# The models apply_fsdp2 sharded, for release_fsdp_groups: weak, so that a model deleted early is not kept.
_SHARDED_MODELS: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()
_MESH_INFO_GROUPS = ("shard_process_group", "replicate_process_group", "reduce_scatter_process_group")


class _Replaced(dict[int, tuple["weakref.ref[torch.Tensor]", str]]):
    """``{id(old parameter): (weak reference to it, its name)}`` for the parameters ``fully_shard`` replaced.

    Weak references: the full-size tensors are not kept alive, and a later tensor that reuses an id is never
    mistaken for a replaced one. Not pickled (it only matters while optimizers are being prepared).
    """

    def __reduce__(self) -> tuple[Any, ...]:
        return (_Replaced, ())


def _dtype(value: Any, where: str) -> torch.dtype | None:
    if value is None or isinstance(value, torch.dtype):
        return value
    dtype = _DTYPE_NAMES.get(str(value).lower())
    if dtype is None:
        raise ValueError(f"FullyShardedDataParallelPlugin(mixed_precision_policy=...): {where}={value!r} is not a "
                         f"dtype; use a torch.dtype or one of {sorted(_DTYPE_NAMES)}.")
    return dtype


def _as_policy(value: Any) -> MixedPrecisionPolicy | str | None:
    """Normalise a ``mixed_precision_policy`` argument: a policy, a dict of its fields, or "no"/"fp16"/"bf16"."""
    if value is None or isinstance(value, MixedPrecisionPolicy):
        return value
    if isinstance(value, str):
        name = value.lower()
        if name not in ("no", "fp16", "bf16"):
            raise ValueError(f"FullyShardedDataParallelPlugin(mixed_precision_policy={value!r}) is not a known "
                             "precision: use 'no', 'fp16', 'bf16', a dict or a torch MixedPrecisionPolicy.")
        return name
    if isinstance(value, Mapping):
        unknown = sorted(set(value) - set(_POLICY_FIELDS))
        if unknown:
            raise ValueError(f"FullyShardedDataParallelPlugin(mixed_precision_policy=...) has unknown keys "
                             f"{unknown}; allowed: {list(_POLICY_FIELDS)}.")
        fields: dict[str, Any] = {k: _dtype(v, k) if k != "cast_forward_inputs" else bool(v)
                                  for k, v in value.items()}
        return MixedPrecisionPolicy(**fields)
    raise TypeError(f"FullyShardedDataParallelPlugin(mixed_precision_policy=...) must be None, a string, a dict or "
                    f"a torch.distributed.fsdp.MixedPrecisionPolicy, got {type(value).__name__}.")


@suggest_keywords
@dataclass
class FullyShardedDataParallelPlugin:
    """How ``prepare`` shards models with FSDP2 (``torch.distributed.fsdp.fully_shard``).

    Args:
        transformer_cls_names_to_wrap: shard every submodule whose class name is listed (e.g. the transformer
            block), each as its own unit; a comma-separated string is accepted.
        min_num_params: or shard every submodule holding at least this many parameters not already in a smaller
            sharded unit. Give at most one of the two; with neither, only the root module is sharded.
        reshard_after_forward: free the gathered parameters after forward (less memory, one more all-gather in
            backward); an int reshards to that smaller world size, as ``fully_shard`` allows.
        cpu_offload: keep parameters, gradients and optimizer state on the CPU (torch's ``CPUOffloadPolicy``).
        mixed_precision_policy: None derives it from the Accelerator's ``mixed_precision`` (bf16 / fp16
            parameters for compute, fp32 gradient reduction); or "no" / "fp16" / "bf16", a dict of
            ``MixedPrecisionPolicy`` fields, or a ``MixedPrecisionPolicy``.
        state_dict_type: how ``save_state`` writes models and optimizers: "SHARDED_STATE_DICT" (each rank
            writes its shards with torch.distributed.checkpoint; loads on any number of processes) or
            "FULL_STATE_DICT" (gathered on rank 0 into the same files a single process writes).
        sync_module_states: broadcast rank 0's parameters and buffers before sharding (as DDP does), so ranks
            that initialised the model differently still train one model.
        fsdp_version: only 2 (FSDP2) is supported.
        activation_checkpointing: wrap each sharding unit (``transformer_cls_names_to_wrap`` / ``min_num_params``)
            in torch's non-reentrant checkpoint wrapper before sharding, so it keeps only its inputs for backward
            and recomputes the rest (see ``engine.memory.activation_checkpointing``). Needs one of those two fields.
        activation_checkpointing_offload: also move what the checkpointed units save to host memory.
    """

    transformer_cls_names_to_wrap: list[str] | str | None = None
    min_num_params: int | None = None
    reshard_after_forward: bool | int = True
    cpu_offload: bool = False
    mixed_precision_policy: MixedPrecisionPolicy | dict[str, Any] | str | None = None
    state_dict_type: str = "SHARDED_STATE_DICT"
    sync_module_states: bool = True
    fsdp_version: int = 2
    activation_checkpointing: bool = False
    activation_checkpointing_offload: bool = False

    def __post_init__(self) -> None:
        if self.fsdp_version != 2:
            raise NotImplementedError(f"FullyShardedDataParallelPlugin(fsdp_version={self.fsdp_version!r}) is not supported: "
                                      "Ember implements FSDP2 (torch.distributed.fsdp.fully_shard) only; use 2.")
        names = self.transformer_cls_names_to_wrap
        if isinstance(names, str):
            names = [n.strip() for n in names.split(",") if n.strip()]
        if names is not None:
            if not isinstance(names, (list, tuple, set)) or not all(isinstance(n, str) and n for n in names):
                raise ValueError("FullyShardedDataParallelPlugin(transformer_cls_names_to_wrap=...) must be a list "
                                 f"of class names, got {self.transformer_cls_names_to_wrap!r}.")
            names = list(names) or None
        self.transformer_cls_names_to_wrap = names
        if self.min_num_params is not None and (isinstance(self.min_num_params, bool)
                                                or not isinstance(self.min_num_params, int)
                                                or self.min_num_params < 1):
            raise ValueError("FullyShardedDataParallelPlugin(min_num_params=...) must be a positive int, got "
                             f"{self.min_num_params!r}.")
        if names and self.min_num_params is not None:
            raise ValueError(f"FullyShardedDataParallelPlugin got both transformer_cls_names_to_wrap={names!r} and "
                             f"min_num_params={self.min_num_params!r}: choose one way to pick the sharded units.")
        reshard = self.reshard_after_forward
        if not isinstance(reshard, (bool, int)) or (not isinstance(reshard, bool) and reshard < 1):
            raise ValueError("FullyShardedDataParallelPlugin(reshard_after_forward=...) must be a bool or a "
                             f"positive int, got {reshard!r}.")
        for flag in ("cpu_offload", "sync_module_states", "activation_checkpointing",
                     "activation_checkpointing_offload"):
            if not isinstance(getattr(self, flag), bool):
                raise TypeError(f"FullyShardedDataParallelPlugin({flag}=...) must be a bool, got "
                                 f"{getattr(self, flag)!r}.")
        self._check_activation_checkpointing(names)
        kind = str(self.state_dict_type).upper()
        if kind not in STATE_DICT_TYPES:
            raise ValueError(f"FullyShardedDataParallelPlugin(state_dict_type={self.state_dict_type!r}) is not "
                             f"supported: choose one of {STATE_DICT_TYPES}.")
        self.state_dict_type = kind
        self.mixed_precision_policy = _as_policy(self.mixed_precision_policy)

    def _check_activation_checkpointing(self, names: list[str] | None) -> None:
        if self.activation_checkpointing_offload and not self.activation_checkpointing:
            raise ValueError("`activation_checkpointing_offload=True` requires `activation_checkpointing=True`.")
        if self.activation_checkpointing and not names and self.min_num_params is None:
            # Accelerate fails here in prepare with "TypeError: 'NoneType' object is not callable".
            raise ValueError("FullyShardedDataParallelPlugin(activation_checkpointing=True) checkpoints the sharding "
                             "units, and none are chosen: pass transformer_cls_names_to_wrap=[...] (e.g. your "
                             "transformer block class) or min_num_params=N.")

    @property
    def sharded_state_dict(self) -> bool:
        """Whether checkpoints hold per-rank shards (torch.distributed.checkpoint) rather than full files."""
        return self.state_dict_type == "SHARDED_STATE_DICT"

    def resolve_mixed_precision(self, mixed_precision: str) -> MixedPrecisionPolicy | None:
        """The ``MixedPrecisionPolicy`` to shard with, given the Accelerator's ``mixed_precision``."""
        policy = self.mixed_precision_policy
        if isinstance(policy, MixedPrecisionPolicy):
            return policy
        name = policy if isinstance(policy, str) else mixed_precision
        # fp8 (torchao's Float8Linear) computes in bf16 around its float8 matrix products: bf16 parameters, as
        # Accelerate maps it.
        dtype = autocast_dtype(name)
        if dtype is None:
            return None
        # Low-precision compute, but gradients are reduced (summed across ranks) in fp32 so nothing is lost there.
        return MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)

    def prepare_units(self, model: torch.nn.Module) -> list[torch.nn.Module]:
        """The modules to shard as units, innermost first, each first wrapped for activation checkpointing when
        the plugin asks for it (in place); a unit already inside a checkpoint wrapper is sharded with the wrapper.

        >>> import torch
        >>> class Block(torch.nn.Linear): ...
        >>> model = torch.nn.Sequential(Block(2, 2), Block(2, 2))
        >>> plugin = FullyShardedDataParallelPlugin(transformer_cls_names_to_wrap=["Block"],
        ...                                         activation_checkpointing=True)
        >>> [type(unit).__name__ for unit in plugin.prepare_units(model)]
        ['CheckpointWrapper', 'CheckpointWrapper']
        """
        units = self.units(model)
        if self.activation_checkpointing:
            if not units:
                raise ValueError(f"FullyShardedDataParallelPlugin(activation_checkpointing=True, min_num_params="
                                 f"{self.min_num_params}) found no submodule of {type(model).__name__} that large "
                                 "to checkpoint: lower min_num_params or name the classes "
                                 "(transformer_cls_names_to_wrap).")
            checkpoint_modules(model, units, offload=self.activation_checkpointing_offload)
        return outermost_wrappers(model, units)

    def units(self, model: torch.nn.Module) -> list[torch.nn.Module]:
        """The submodules to shard as their own units, innermost first (``fully_shard`` must go bottom-up)."""
        if self.transformer_cls_names_to_wrap:
            wanted = set(self.transformer_cls_names_to_wrap)
            found = [m for m in model.modules() if m is not model and type(m).__name__ in wanted]
            missing = wanted - {type(m).__name__ for m in found}
            if missing:
                present = sorted({type(m).__name__ for m in model.modules()})
                raise ValueError(f"FullyShardedDataParallelPlugin(transformer_cls_names_to_wrap=...): no submodule "
                                 f"of class {sorted(missing)} in {type(model).__name__}. Its classes are {present}.")
            return list(reversed(found))  # modules() is pre-order: reversed, children come before parents
        if self.min_num_params is None:
            return []
        units: list[torch.nn.Module] = []
        limit = self.min_num_params

        def visit(module: torch.nn.Module) -> int:
            # Parameters not yet covered by a unit below; a module is a unit once it reaches the limit.
            remaining = sum(p.numel() for p in module.parameters(recurse=False))
            remaining += sum(visit(child) for child in module.children())
            if module is not model and remaining >= limit:
                units.append(module)
                return 0
            return remaining

        visit(model)
        return units


def is_sharded(model: torch.nn.Module) -> bool:
    """Whether ``fully_shard`` was applied to ``model`` (FSDP2)."""
    return isinstance(model, FSDPModule)


def holds_dtensors(model: torch.nn.Module) -> bool:
    """Whether any parameter of ``model`` is a ``DTensor`` (FSDP2 shards, tensor parallelism, or both): its full
    state must be gathered, and loads into it keep each rank's part."""
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for p in model.parameters())


def apply_fsdp2(model: torch.nn.Module, plugin: FullyShardedDataParallelPlugin, mixed_precision: str,
                device: torch.device, mesh: Any = None) -> torch.nn.Module:
    """Shard ``model`` over every process (or over ``mesh``: a 2-D one is HSDP, replicas x shards): the plugin's
    units first, then the root; returns the same module.

    Requires an initialised process group (``Accelerator`` made one). Works on CPU (gloo) and CUDA (nccl).
    """
    if not isinstance(plugin, FullyShardedDataParallelPlugin):
        raise TypeError(f"fsdp_plugin must be a FullyShardedDataParallelPlugin, got {type(plugin).__name__}.")
    if is_sharded(model):
        return model
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError("FSDP2 needs a process group: launch with `ember launch --nproc-per-node N` (or "
                           "torchrun) and create the Accelerator before preparing the model.")
    if mesh is None:
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    kwargs: dict[str, Any] = {"mesh": mesh, "reshard_after_forward": plugin.reshard_after_forward}
    policy = plugin.resolve_mixed_precision(mixed_precision)
    if policy is not None:
        kwargs["mp_policy"] = policy
    if plugin.cpu_offload:
        # Pinned host memory only helps (and only exists) with a CUDA device to copy to.
        kwargs["offload_policy"] = CPUOffloadPolicy(pin_memory=device.type == "cuda")
    if plugin.sync_module_states:
        broadcast_from_rank0(model, device)
    earlier = getattr(model, _REPLACED_ATTR, None)  # tensor parallelism replaced some, under their names then
    names = {id(p): name for name, p in model.named_parameters(remove_duplicate=False)}
    units = plugin.prepare_units(model)
    # Named after any checkpoint wrapping, so the names match the sharded model's when optimizers are retargeted.
    before = parameter_names(model)
    if earlier:
        renamed = {names[id(p)]: name for name, p in model.named_parameters(remove_duplicate=False) if id(p) in names}
        before = _Replaced({key: (ref, renamed.get(name, name)) for key, (ref, name) in earlier.items()})
    for unit in units:
        fully_shard(unit, **kwargs)
    # The root keeps its parameters gathered from forward to backward (torch's own default, `None`, for a root):
    # backward needs them at once, so resharding them would cost an all-gather per step and lower no peak. Units
    # reshard as the plugin says; reshard_after_forward=False keeps every module gathered.
    fully_shard(model, **{**kwargs, "reshard_after_forward": kwargs["reshard_after_forward"] and None})
    if kwargs["reshard_after_forward"]:
        model.register_forward_hook(_reshard_without_backward)
    setattr(model, _REPLACED_ATTR, before)
    _SHARDED_MODELS.add(model)
    PartialState.register_teardown(release_fsdp_groups)
    return model


def _reshard_without_backward(module: torch.nn.Module, args: Any, output: Any) -> None:
    """The root's forward hook: a forward without grad (an evaluation) has no backward to reshard the root, and
    parameters left gathered at rest would go stale once a load or an optimizer step changes the shards."""
    if not torch.is_grad_enabled():
        cast(FSDPModule, module).reshard()


def at_rest(*models: torch.nn.Module) -> None:
    """Reshard every FSDP unit of ``models`` still gathered (a root between forward and backward, or every unit
    under ``reshard_after_forward=False``), so that state dicts read and write the shards: gathered parameters
    read as plain tensors beside DTensors, and a load into the shards would leave them stale. Local: no
    communication."""
    for model in models:
        for module in model.modules():
            if isinstance(module, FSDPModule):
                module.reshard()


def release_fsdp_groups() -> None:
    """Drop what FSDP2 and DTensor keep of the process groups, once the default group is destroyed.

    Otherwise a sharded model that lives until interpreter shutdown (a script's global, as usual) keeps the
    default gloo group alive past ``destroy_process_group``, and gloo's threads run on through shutdown (issue 39,
    item 3: "terminate called without an active exception"). Holders seen with torch 2.13: each FSDP unit's
    ``FSDPMeshInfo`` (``shard_process_group`` & co.), the device mesh's ``_pg_registry``, and DTensor's sharding
    caches (Python ``lru_cache`` and the C++ fast path), whose ``OutputSharding`` entries keep the mesh alive even
    after the model is deleted. Private attributes, hence each step guarded: a torch that renames one leaves that
    reference (and the threads), it does not fail the exit.
    """
    with contextlib.suppress(Exception):  # see the docstring: a renamed private attribute leaves its reference
        from torch.distributed.tensor.debug import _clear_sharding_prop_cache

        _clear_sharding_prop_cache()  # this thread's Python cache and the C++ one: where training ran
    with contextlib.suppress(Exception):
        from torch.distributed.tensor._collective_utils import MeshTopoInfo
        from torch.distributed.tensor._redistribute import _gen_transform_infos
        from torch.distributed.tensor._sharding_prop import ShardingPropagator

        _gen_transform_infos.cache_clear()
        MeshTopoInfo.build_from_mesh.cache_clear()
        ShardingPropagator._propagate_tensor_meta_cached.cache_clear()
    for model in list(_SHARDED_MODELS):
        for module in model.modules():
            if not isinstance(module, FSDPModule):
                continue
            with contextlib.suppress(Exception):
                group = module._get_fsdp_state()._fsdp_param_group
                infos = [] if group is None else [group.mesh_info, group.post_forward_mesh_info]
                for info in infos:
                    if info is None:
                        continue
                    for name in _MESH_INFO_GROUPS:
                        if name in info.__dict__:
                            info.__dict__[name] = None
                    info.mesh._get_root_mesh()._pg_registry.clear()  # sub-meshes register in their root's
    _SHARDED_MODELS.clear()


def parameter_names(model: torch.nn.Module) -> _Replaced:
    """What ``retarget_optimizer`` needs to follow ``model``'s parameters once they are replaced (by
    ``fully_shard`` or ``parallelize_module``): taken before the first replacement."""
    return _Replaced({id(p): (weakref.ref(p), name) for name, p in model.named_parameters(remove_duplicate=False)})


def remember_replaced(model: torch.nn.Module, before: _Replaced) -> None:
    """Record that ``model``'s parameters named in ``before`` were replaced (see ``retarget_optimizer``)."""
    setattr(model, _REPLACED_ATTR, before)


def broadcast_from_rank0(model: torch.nn.Module, device: torch.device) -> None:
    """Give every rank rank 0's parameters and buffers (one tensor at a time through ``device``)."""
    for tensor in itertools.chain(model.parameters(), model.buffers()):
        if tensor.is_meta:
            continue
        if tensor.device.type == device.type:
            dist.broadcast(tensor.data, src=0)
        else:  # nccl only moves device memory: stage each tensor on the device, never the whole model at once
            staged = tensor.detach().to(device)
            dist.broadcast(staged, src=0)
            tensor.data.copy_(staged)


def retarget_optimizer(optimizer: torch.optim.Optimizer, models: Iterable[torch.nn.Module]) -> int:
    """Point ``optimizer`` at the sharded parameters that replaced the ones it was built with; returns how many.

    ``fully_shard`` (and ``parallelize_module``) swaps parameters for new ``DTensor`` ones, so an optimizer made before ``prepare`` would
    otherwise update tensors the model no longer uses.
    """
    swaps: list[tuple[_Replaced, dict[str, torch.nn.Parameter]]] = []
    for model in models:
        replaced = getattr(model, _REPLACED_ATTR, None)
        if replaced:
            swaps.append((replaced, dict(model.named_parameters(remove_duplicate=False))))
    count = 0
    for group in optimizer.param_groups:
        params = group["params"]
        for i, param in enumerate(params):
            new = next((current[entry[1]] for replaced, current in swaps
                        if (entry := replaced.get(id(param))) is not None and entry[0]() is param), None)
            if new is None or new is param:
                continue
            if optimizer.state.get(param):
                raise ValueError(f"The optimizer {type(optimizer).__name__} already holds state (it has stepped) for "
                                 "parameters that prepare() sharded (FSDP2 / tensor parallelism); that state cannot be sharded. Create "
                                 "the optimizer, or at least step it, only after accelerator.prepare(model).")
            params[i] = new
            count += 1
    return count


def full_state_dict(model: torch.nn.Module, rank0_only: bool = True) -> dict[str, torch.Tensor]:
    """The full (unsharded) state dict of a sharded model, on the CPU.

    A collective: every rank must call it. With ``rank0_only`` (the default, as in Accelerate) rank 0 receives
    the tensors and the other ranks an empty dict, so only one copy of the model is ever gathered in host memory.
    """
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    if not holds_dtensors(model):
        return {k: v.detach().cpu() for k, v in model.state_dict().items()}
    at_rest(model)
    # A model's state dict holds tensors only (torch types it with the values an optimizer's may hold too).
    if rank0_only:
        return cast(dict[str, torch.Tensor],
                    get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True)))
    gathered = cast(dict[str, torch.Tensor],
                    get_model_state_dict(model, options=StateDictOptions(full_state_dict=True)))
    return {k: v.detach().cpu() for k, v in gathered.items()}


def load_full_state_dict(model: torch.nn.Module, state: Mapping[str, torch.Tensor], strict: bool = True) -> None:
    """Load a full (unsharded) state dict into ``model``; a sharded model keeps only its own shard of each tensor.

    Every rank must pass the full state (read from the same file); nothing is communicated.
    """
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    if not holds_dtensors(model):
        model.load_state_dict(dict(state), strict=strict)
        return
    at_rest(model)
    set_model_state_dict(model, dict(state), options=StateDictOptions(full_state_dict=True, strict=strict))


def gradient_layout_error(name: str | None, saved: tuple[int, ...], here: tuple[int, ...]) -> ValueError:
    """The error for gradients saved as shards of another layout than the one loading them."""
    which = f" of {name!r}" if name else ""
    return ValueError(f"A saved gradient shard{which} has shape {saved} but this rank's part of the parameter has "
                      f"shape {here}: gradients saved between backward and the optimizer step only load on the same "
                      "number of processes and layout. Save after the optimizer step and zero_grad (or with "
                      "save_state(include_gradients=False)), or resume with the layout that saved them.")


def set_local_grad(param: torch.nn.Parameter, local: torch.Tensor) -> None:
    """Set the gradient of a sharded (DTensor) parameter from this rank's saved shard of it."""
    from torch.distributed.tensor import DTensor

    shard = param.to_local() if isinstance(param, DTensor) else param
    if tuple(shard.shape) != tuple(local.shape):
        raise gradient_layout_error(None, tuple(local.shape), tuple(shard.shape))
    local = local.to(device=shard.device, dtype=shard.dtype)
    if isinstance(param, DTensor):
        param.grad = DTensor.from_local(local, param.device_mesh, param.placements, run_check=False,
                                        shape=param.shape, stride=param.stride())
    else:
        param.grad = local.clone()

