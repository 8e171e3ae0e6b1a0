"""fp8 training through torchao: Accelerate's ``mixed_precision="fp8"`` and ``AORecipeKwargs``.

``Accelerator(mixed_precision="fp8")`` makes ``prepare`` swap a model's ``nn.Linear`` layers for torchao's
``Float8Linear`` (matrix products in float8, dynamic tensorwise scales) and run the forward under a bf16 autocast
with fp32 outputs, as Accelerate 1.15 does. Every ``nn.Linear`` is converted except the first and the last one
*registered* in the model (``named_modules()`` order, not the order they are called in) and those whose
``in_features`` or ``out_features`` is not a multiple of 16; ``AORecipeKwargs(module_filter_func=...)`` replaces
that rule. Under FSDP2 the converted weights are all-gathered in float8 and their scales computed once per optimizer
step (``enable_fsdp_float8_all_gather``, on by default).

Optimizers built before ``prepare`` are pointed at the converted weights (Accelerate leaves them on the replaced
tensors, so those layers never train). TransformerEngine and MS-AMP (``TERecipeKwargs``, ``MSAMPRecipeKwargs``,
``FP8RecipeKwargs``) are GPU-only packages and refused. torchao is the optional ``fp8`` extra
(``pip install "ember-train[fp8]"``), imported only when fp8 is used.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import logging
import warnings
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from engine.config import KwargsHandler
from engine.environment import EngineEnvironment
from engine.imports import is_torchao_available
from engine.keywords import suggest_keywords
from engine.memory.activation_checkpointing import clean_name

MIN_TORCHAO = "0.6.1"
_EXTRA = 'pip install "ember-train[fp8]"'
_TRUE = ("1", "true", "yes", "y", "on", "t")
_FALSE = ("0", "false", "no", "n", "off", "f")
ModuleFilter = Callable[[torch.nn.Module, str], bool]


class FP8BackendType(str, enum.Enum):
    """Accelerate's fp8 backends (``ACCELERATE_FP8_BACKEND``); Ember runs ``AO`` (torchao) only."""

    NO = "NO"
    TE = "TE"
    MSAMP = "MSAMP"
    AO = "AO"


def _refusal(what: str) -> str:
    return (f"{what} is not supported by Ember: it is a GPU-only package. Ember trains in fp8 through torchao: "
            f"Accelerator(mixed_precision='fp8'), optionally with kwargs_handlers=[AORecipeKwargs(...)] ({_EXTRA}).")


def require_torchao() -> None:
    """Raise, naming the extra to install, unless torchao >= 0.6.1 is installed (nothing is imported)."""
    if not is_torchao_available(MIN_TORCHAO):
        raise ImportError(f"mixed_precision='fp8' trains through torchao >= {MIN_TORCHAO}, which is not installed: "
                          f"{_EXTRA} (or pip install torchao), or train with mixed_precision='bf16'.")


@contextlib.contextmanager
def _quiet_cuda_kernel_warnings() -> Iterator[None]:
    # Without CUDA, `import torchao` warns that its CUDA kernels failed to load and torch warns about one of its
    # pytree registrations: nothing a CPU run uses, so those loggers are quietened for the import only.
    if torch.cuda.is_available():
        yield
        return
    loggers = [logging.getLogger("torchao"), logging.getLogger("torch.utils._pytree")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def import_float8() -> Any:
    """``torchao.float8``, imported on first use (1-3 s)."""
    require_torchao()
    with _quiet_cuda_kernel_warnings():
        import torchao.float8
        import torchao.float8.float8_linear
    return torchao.float8


def _env_flag(name: str, default: bool) -> bool:
    value = EngineEnvironment.from_env().fp8.get(name)  # read at construction, as Accelerate's handler reads it
    if value is None:
        return default
    if value.strip().lower() in _TRUE:
        return True
    if value.strip().lower() in _FALSE:
        return False
    raise ValueError(f"{name}={value!r} is not a truth value: use one of {_TRUE + _FALSE}.")


@suggest_keywords
@dataclass
class AORecipeKwargs(KwargsHandler):
    """How ``mixed_precision="fp8"`` converts the model (torchao); pass it in ``Accelerator(kwargs_handlers=[...])``.

    Args:
        config: a ``torchao.float8.Float8LinearConfig``; None builds torchao's default with ``pad_inner_dim`` and
            ``enable_fsdp_float8_all_gather`` below (torchao's own default has both off).
        module_filter_func: ``f(module, fqn) -> bool``, which layers to convert; replaces the default rule (all
            ``nn.Linear`` but the first and last registered ones and those with sizes not multiples of 16).
        pad_inner_dim: pad matrix sizes to multiples of 16 (None: ``ACCELERATE_FP8_PAD_INNER_DIM``, default True).
        enable_fsdp_float8_all_gather: under FSDP2, all-gather the converted weights in float8 (None:
            ``ACCELERATE_FP8_ENABLE_FSDP_FLOAT8_ALL_GATHER``, default True).

    Example (needs torchao):
        >>> recipe = AORecipeKwargs(pad_inner_dim=False)  # doctest: +SKIP
        >>> recipe.config.pad_inner_dim, recipe.config.enable_fsdp_float8_all_gather  # doctest: +SKIP
        (False, True)
    """

    config: Any = None
    module_filter_func: ModuleFilter | None = None
    pad_inner_dim: bool | None = None
    enable_fsdp_float8_all_gather: bool | None = None

    def __post_init__(self) -> None:
        float8 = import_float8()
        if self.module_filter_func is not None and not callable(self.module_filter_func):
            raise TypeError(f"AORecipeKwargs(module_filter_func=...) must be a function (module, fqn) -> bool. "
                            f"Received: {self.module_filter_func!r}.")
        if self.config is None:
            if self.pad_inner_dim is None:
                self.pad_inner_dim = _env_flag("ACCELERATE_FP8_PAD_INNER_DIM", True)
            if self.enable_fsdp_float8_all_gather is None:
                self.enable_fsdp_float8_all_gather = _env_flag("ACCELERATE_FP8_ENABLE_FSDP_FLOAT8_ALL_GATHER", True)
            self.config = float8.Float8LinearConfig(pad_inner_dim=self.pad_inner_dim,
                                                    enable_fsdp_float8_all_gather=self.enable_fsdp_float8_all_gather)
        elif not isinstance(self.config, float8.Float8LinearConfig):
            raise TypeError(f"AORecipeKwargs(config=...) must be a torchao.float8.Float8LinearConfig. Received: "
                            f"{type(self.config).__name__}.")


class TERecipeKwargs(KwargsHandler):
    """Accelerate's TransformerEngine recipe: refused (TransformerEngine is GPU-only; Ember's fp8 is torchao's)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise ImportError(_refusal("TransformerEngine fp8 (TERecipeKwargs)"))


class MSAMPRecipeKwargs(KwargsHandler):
    """Accelerate's MS-AMP recipe: refused (MS-AMP is GPU-only; Ember's fp8 is torchao's)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise ImportError(_refusal("MS-AMP fp8 (MSAMPRecipeKwargs)"))


class FP8RecipeKwargs(KwargsHandler):
    """Accelerate's deprecated recipe for TransformerEngine or MS-AMP (``backend``): refused, as both are."""

    def __init__(self, backend: str | None = None, **kwargs: Any) -> None:
        name = str(backend or EngineEnvironment.from_env().fp8.get("ACCELERATE_FP8_BACKEND") or "TE").upper()
        if name not in ("MSAMP", "TE"):
            raise ValueError("`backend` must be 'MSAMP' or 'TE' (TransformerEngine) to use `FP8RecipeKwargs`. "
                             f"Received: {backend!r}. For torchao use AORecipeKwargs(...).")
        raise ImportError(_refusal(f"{'MS-AMP' if name == 'MSAMP' else 'TransformerEngine'} fp8 "
                                   f"(FP8RecipeKwargs(backend={backend!r}))"))


def first_last_filter(model: torch.nn.Module) -> ModuleFilter:
    """Accelerate's default choice of layers for ``model``: ``f(module, fqn)`` is False for the first and the last
    ``nn.Linear`` in registration order and for one whose sizes are not multiples of 16, True otherwise.

    >>> net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Linear(32, 32), torch.nn.Linear(32, 24),
    ...                           torch.nn.Linear(24, 32), torch.nn.Linear(32, 16))
    >>> accepts = first_last_filter(net)
    >>> [accepts(layer, name) for name, layer in net.named_children()]
    [False, True, False, False, False]
    """
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    ends = {id(linears[0]), id(linears[-1])} if linears else set()

    def accepts(module: torch.nn.Module, fqn: str) -> bool:
        if not isinstance(module, torch.nn.Linear):
            return True
        if module.in_features % 16 or module.out_features % 16:
            return False
        return id(module) not in ends

    return accepts


def _precompute_scales(model_ref: weakref.ref[torch.nn.Module], optimizer: Any, args: Any, kwargs: Any) -> None:
    """After an optimizer step: every float8 weight's scale from one all-reduce, for the next float8 all-gather."""
    model = model_ref()
    if model is not None:
        from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp

        precompute_float8_dynamic_scale_for_fsdp(model)


def _plain_weight(module: torch.nn.Module, state_dict: dict[str, Any], prefix: str, local_metadata: Any) -> None:
    """State-dict hook of a Float8Linear: its weight as the plain tensor inside torchao's float8 all-gather wrapper
    (``WeightWithDynamicFloat8CastTensor`` has no storage of its own, so files could not be written from it). The
    tensor shares the weight's memory, so loading into it in place loads the weight."""
    key = prefix + "weight"
    value: Any = state_dict.get(key)
    local = getattr(value, "_local_tensor", value)  # an FSDP2 (DTensor) weight holds the wrapper as its shard
    inner = getattr(local, "_tensor", None)
    if inner is None:
        return
    if local is value:
        state_dict[key] = inner.detach()
    else:
        from torch.distributed.tensor import DTensor

        state_dict[key] = DTensor.from_local(inner.detach(), value.device_mesh, value.placements, run_check=False,
                                             shape=value.shape, stride=value.stride())


class NoFp8:
    """An Accelerator's fp8 setup without fp8: models and optimizers are left as they are."""

    enabled = False
    backend = FP8BackendType.NO

    def convert(self, model: torch.nn.Module, optimizers: Sequence[Any] = ()) -> torch.nn.Module:
        return model

    def link(self, optimizer: Any) -> None:
        return None


class Fp8Training(NoFp8):
    """What ``mixed_precision="fp8"`` does to the models and optimizers an Accelerator prepares.

    Args:
        recipe: the ``AORecipeKwargs`` (the given one, or a default).
        fsdp: whether models are sharded with FSDP2 (then the float8 scales are precomputed after each step).
    """

    enabled = True
    backend = FP8BackendType.AO

    def __init__(self, recipe: AORecipeKwargs, fsdp: bool) -> None:
        self.recipe = recipe
        self.fsdp = fsdp
        # id(replaced parameter) -> (the parameter, the model, its name there): optimizers built before prepare
        # are pointed at what replaced it. Weak: the replaced tensors are not kept alive.
        self._replaced: dict[int, tuple[weakref.ref[Any], weakref.ref[torch.nn.Module], str]] = {}
        self._models: list[weakref.ref[torch.nn.Module]] = []
        self._hooked: set[int] = set()

    @classmethod
    def create(cls, mixed_precision: str, recipe: AORecipeKwargs | None, environment: EngineEnvironment,
               fsdp: bool) -> NoFp8:
        """The fp8 setup of an Accelerator: ``NoFp8`` unless ``mixed_precision == "fp8"``; the backend is
        ``ACCELERATE_FP8_BACKEND`` (unset or "AO": torchao)."""
        if mixed_precision != "fp8":
            if recipe is not None:
                raise ValueError("Passing in an FP8 configuration requires setting `mixed_precision='fp8'`. "
                                 f"Received: mixed_precision={mixed_precision!r} with an AORecipeKwargs.")
            return NoFp8()
        backend = environment.fp8.get("ACCELERATE_FP8_BACKEND")
        name = (backend or "NO").strip().upper()
        if name not in FP8BackendType.__members__:
            raise ValueError(f"ACCELERATE_FP8_BACKEND={backend!r} is not a known fp8 backend: use 'AO' (torchao), or "
                             "leave it unset.")
        if recipe is None and name in ("TE", "MSAMP"):
            raise ImportError(_refusal(f"ACCELERATE_FP8_BACKEND={backend!r} "
                                       f"({'MS-AMP' if name == 'MSAMP' else 'TransformerEngine'})"))
        return cls(recipe if recipe is not None else AORecipeKwargs(), fsdp)

    def convert(self, model: torch.nn.Module, optimizers: Sequence[Any] = ()) -> torch.nn.Module:
        """Swap ``model``'s chosen ``nn.Linear`` layers for ``Float8Linear`` in place (a root ``nn.Linear`` is
        returned converted instead); ``optimizers`` prepared earlier are pointed at the new weights. Layers already
        converted are left alone, so preparing a model twice converts it once."""
        float8 = import_float8()
        self._check_not_sharded(model)
        chosen = self.recipe.module_filter_func or first_last_filter(model)

        def accepts(module: torch.nn.Module, fqn: str) -> bool:
            return not isinstance(module, float8.float8_linear.Float8Linear) and bool(chosen(module, fqn))

        before = {name: p for name, p in model.named_parameters(remove_duplicate=False)}
        existing = {id(m) for m in model.modules()}
        model = float8.convert_to_float8_training(model, module_filter_fn=accepts, config=self.recipe.config)
        after = dict(model.named_parameters(remove_duplicate=False))
        for module in model.modules():
            if id(module) not in existing:  # converted now
                module.register_state_dict_post_hook(_plain_weight)
        for name, old in before.items():
            if after.get(name) is not old:  # Float8Linear wraps its weight for the float8 all-gather
                self._replaced[id(old)] = (weakref.ref(old), weakref.ref(model), clean_name(name))
        if not any(isinstance(m, float8.float8_linear.Float8Linear) for m in model.modules()):
            warnings.warn(f"mixed_precision='fp8' converted no Linear layer of {type(model).__name__}: the first and "
                          "the last registered ones are kept, and sizes must be multiples of 16. It trains in bf16.",
                          UserWarning, stacklevel=3)
        self._models.append(weakref.ref(model))
        for optimizer in optimizers:
            self.link(optimizer)
        return model

    def link(self, optimizer: Any) -> None:
        """Point ``optimizer`` (built before ``prepare``) at the converted weights; under FSDP2 with the float8
        all-gather, have its steps precompute the scales of the models it trains (once per model)."""
        inner = getattr(optimizer, "optimizer", optimizer)
        names: dict[int, dict[str, Any]] = {}  # per model: its parameters now, by name without checkpoint wrappers
        for group in inner.param_groups:
            params = group["params"]
            for i, param in enumerate(params):
                entry = self._replaced.get(id(param))
                if entry is None or entry[0]() is not param or (model := entry[1]()) is None:
                    continue
                if inner.state.get(param):
                    raise ValueError(f"The optimizer {type(inner).__name__} already holds state (it has stepped) for "
                                     f"{entry[2]!r}, which mixed_precision='fp8' replaced in prepare(): build or "
                                     "step the optimizer only after accelerator.prepare(model).")
                if id(model) not in names:
                    names[id(model)] = {clean_name(n): p for n, p in model.named_parameters(remove_duplicate=False)}
                params[i] = names[id(model)][entry[2]]
        if self.fsdp and self.recipe.config.enable_fsdp_float8_all_gather:
            self._hook_scales(inner)

    def _hook_scales(self, optimizer: torch.optim.Optimizer) -> None:
        owned = {id(p) for group in optimizer.param_groups for p in group["params"]}
        for ref in self._models:
            model = ref()
            if model is None or id(model) in self._hooked or not any(id(p) in owned for p in model.parameters()):
                continue
            optimizer.register_step_post_hook(functools.partial(_precompute_scales, ref))
            self._hooked.add(id(model))

    @staticmethod
    def _check_not_sharded(model: torch.nn.Module) -> None:
        from torch.distributed.tensor import DTensor

        sharded = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)
                   and isinstance(m.weight, DTensor)]
        if sharded:
            raise ValueError(f"mixed_precision='fp8' converts Linear layers in prepare(), and {sharded[:3]} are "
                             "already sharded (DTensor weights, from tensor parallelism or fully_shard applied "
                             "before prepare). Ember does not convert sharded layers: let the Accelerator's "
                             "FullyShardedDataParallelPlugin shard the model, or train it in bf16.")


__all__ = ["AORecipeKwargs", "FP8BackendType", "FP8RecipeKwargs", "Fp8Training", "MSAMPRecipeKwargs", "NoFp8",
           "TERecipeKwargs", "first_last_filter", "import_float8", "require_torchao"]
