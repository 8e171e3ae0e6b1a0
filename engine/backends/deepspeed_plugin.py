"""``DeepSpeedPlugin`` (Accelerate's fields, defaults and environment variables), ``DummyOptim`` /
``DummyScheduler``, and the DeepSpeed config with its ``"auto"`` values.

The plugin holds the DeepSpeed config as a dict (``plugin.deepspeed_config``, the ``config`` of its
``hf_ds_config``), built from its fields or read from ``hf_ds_config`` (a dict, a JSON file, a JSON string or base64
JSON). Keys left ``"auto"`` are filled when the
Accelerator prepares the model, from the Accelerator and the prepared objects, as Accelerate fills them
(``fill_auto``). Nothing here imports ``deepspeed``: that happens when a DeepSpeed backend is built
(``engine.backends.deepspeed``), so ``import engine`` stays cheap and works without the ``deepspeed`` extra.
"""

from __future__ import annotations

import contextlib
import copy
import importlib.util
import math
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from engine.backends.deepspeed_config import HfDeepSpeedConfig
from engine.environment import EngineEnvironment, announce_deepspeed
from engine.keywords import suggest_keywords
from engine.state import AcceleratorState

_STAGES = (0, 1, 2, 3)
_DEVICES = ("none", "cpu", "nvme")
_TRUE = ("1", "true", "yes", "y", "on")


def _env(name: str, default: str) -> str:
    environment = EngineEnvironment.from_env()  # read at construction, as Accelerate's plugin reads it
    if name == "ACCELERATE_GRADIENT_ACCUMULATION_STEPS":
        return environment.gradient_accumulation_steps or default
    return environment.deepspeed.get(name, default)


def _auto_or(value: Any) -> Any:
    """``"auto"`` kept, digits as an int (Accelerate parses the environment's text this way)."""
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    return value


@suggest_keywords
@dataclass
class DeepSpeedPlugin:
    """DeepSpeed ZeRO settings for ``Accelerator(deepspeed_plugin=...)``; Accelerate's names and defaults.

    A field left ``None`` is read from the variable ``accelerate launch`` / ``ember launch --use_deepspeed`` sets
    (``ACCELERATE_DEEPSPEED_ZERO_STAGE``...), else Accelerate's default. With ``hf_ds_config`` the config file wins
    for every key it sets; its ``"auto"`` keys take the fields' values, or are filled at ``prepare``.

    Args:
        hf_ds_config: a DeepSpeed config: a dict, a path to a JSON file, a JSON string or base64-encoded JSON.
        gradient_accumulation_steps: ``"auto"`` (the Accelerator's value) or an int.
        gradient_clipping: ``"auto"`` (1.0 at prepare, as in Accelerate) or a float; 0 leaves clipping off.
        zero_stage: 0, 1, 2 (default) or 3.
        is_train_batch_min: with several loaders, the smallest batch size is the micro batch (else the largest).
        offload_optimizer_device / offload_param_device: ``"none"``, ``"cpu"`` or ``"nvme"``.
        offload_optimizer_nvme_path / offload_param_nvme_path: where ``"nvme"`` offloads go.
        zero3_init_flag: build the model partitioned (``deepspeed.zero.Init``); only meaningful with stage 3.
        zero3_save_16bit_model: gather 16-bit weights on save under stage 3 (``get_state_dict`` / ``save_model``).
        transformer_moe_cls_names / enable_msamp / msamp_opt_level: accepted; MoE leaf modules and MS-AMP are
            not supported by Ember (a clear error when asked for).

    After construction ``hf_ds_config`` is an ``HfDeepSpeedConfig`` and ``deepspeed_config`` its ``config`` dict
    (one dict: edits through either are the config the engine trains with).

    Example:
        >>> plugin = DeepSpeedPlugin(zero_stage=3, gradient_clipping=0.5)
        >>> plugin.zero_stage, plugin.zero3_init_flag, plugin.deepspeed_config["zero_optimization"]["stage"]
        (3, True, 3)
        >>> DeepSpeedPlugin(zero_stage=4)
        Traceback (most recent call last):
        ValueError: DeepSpeedPlugin(zero_stage=4) is not a ZeRO stage: use 0, 1, 2 or 3.
    """

    hf_ds_config: Any = None
    gradient_accumulation_steps: int | str | None = None
    gradient_clipping: float | str | None = None
    zero_stage: int | None = None
    is_train_batch_min: bool = True
    offload_optimizer_device: str | None = None
    offload_param_device: str | None = None
    offload_optimizer_nvme_path: str | None = None
    offload_param_nvme_path: str | None = None
    zero3_init_flag: bool | None = None
    zero3_save_16bit_model: bool | None = None
    transformer_moe_cls_names: str | None = None
    enable_msamp: bool | None = None
    msamp_opt_level: str | None = None

    def __post_init__(self) -> None:
        if self.gradient_accumulation_steps is None:
            self.gradient_accumulation_steps = _auto_or(_env("ACCELERATE_GRADIENT_ACCUMULATION_STEPS", "auto"))
        if self.gradient_clipping is None:
            clip = _env("ACCELERATE_GRADIENT_CLIPPING", "auto")
            self.gradient_clipping = clip if clip == "auto" else float(clip)
        if self.zero_stage is None:
            self.zero_stage = int(_env("ACCELERATE_DEEPSPEED_ZERO_STAGE", "2"))
        for name in ("offload_optimizer_device", "offload_param_device", "offload_optimizer_nvme_path",
                     "offload_param_nvme_path"):
            if getattr(self, name) is None:
                setattr(self, name, _env(f"ACCELERATE_DEEPSPEED_{name.upper()}", "none"))
        if self.zero3_save_16bit_model is None:
            self.zero3_save_16bit_model = _env("ACCELERATE_DEEPSPEED_ZERO3_SAVE_16BIT_MODEL", "false").lower() in _TRUE
        if self.enable_msamp is None:
            self.enable_msamp = _env("ACCELERATE_FP8_BACKEND", "").upper() == "MSAMP"
        if self.msamp_opt_level is None:
            self.msamp_opt_level = _env("ACCELERATE_FP8_OPT_LEVEL", "O1")
        if self.enable_msamp or self.transformer_moe_cls_names:
            what = "MS-AMP (enable_msamp)" if self.enable_msamp else "MoE leaf modules (transformer_moe_cls_names)"
            raise ValueError(f"DeepSpeedPlugin: {what} is not supported by Ember. Remove it; fp8 training goes "
                             "through torchao (Accelerator(mixed_precision='fp8')).")
        if self.hf_ds_config is None:
            self.hf_ds_config = _env("ACCELERATE_DEEPSPEED_CONFIG_FILE", "none")
        if isinstance(self.hf_ds_config, str) and self.hf_ds_config == "none":
            self.hf_ds_config = HfDeepSpeedConfig(self._config_from_fields())
        else:
            if not isinstance(self.hf_ds_config, HfDeepSpeedConfig):
                self.hf_ds_config = HfDeepSpeedConfig(self.hf_ds_config)
            self._config_from_file(self.hf_ds_config.config)
            self.hf_ds_config.set_stage_and_offload()
        self.deepspeed_config: dict[str, Any] = self.hf_ds_config.config
        self.dschf: Any = None  # transformers' HfDeepSpeedConfig once the Accelerator selects this plugin
        stage = self.deepspeed_config["zero_optimization"].get("stage")
        if stage not in _STAGES:
            raise ValueError(f"DeepSpeedPlugin(zero_stage={stage!r}) is not a ZeRO stage: use 0, 1, 2 or 3.")
        self.zero_stage = stage
        for name in ("offload_optimizer", "offload_param"):
            device = self.deepspeed_config["zero_optimization"].get(name, {}).get("device", "none")
            if device not in _DEVICES:
                raise ValueError(f"DeepSpeedPlugin({name}_device={device!r}): use one of {_DEVICES}.")
        if self.zero3_init_flag is None:
            flag = _env("ACCELERATE_DEEPSPEED_ZERO3_INIT", "") or None
            self.zero3_init_flag = (flag.lower() in _TRUE) if flag is not None else self.zero_stage == 3
        if self.zero3_init_flag and self.zero_stage != 3:
            warnings.warn("DeepSpeed Zero3 Init flag is only applicable for ZeRO Stage 3. Setting it to False.",
                          UserWarning, stacklevel=3)
            self.zero3_init_flag = False

    def _config_from_fields(self) -> dict[str, Any]:
        optimizer_device, param_device = self.offload_optimizer_device, self.offload_param_device
        config: dict[str, Any] = {
            "train_batch_size": "auto",
            "train_micro_batch_size_per_gpu": "auto",
            "gradient_accumulation_steps": self.gradient_accumulation_steps,
            "zero_optimization": {
                "stage": self.zero_stage,
                "offload_optimizer": {"device": optimizer_device,
                                      "nvme_path": self.offload_optimizer_nvme_path if optimizer_device == "nvme"
                                      else None},
                "offload_param": {"device": param_device,
                                  "nvme_path": self.offload_param_nvme_path if param_device == "nvme" else None},
                "stage3_gather_16bit_weights_on_model_save": self.zero3_save_16bit_model,
            },
        }
        if self.gradient_clipping:
            config["gradient_clipping"] = self.gradient_clipping
        config["steps_per_print"] = float("inf")  # DeepSpeed's own step logs off, as Accelerate sets it
        return config

    def _config_from_file(self, config: dict[str, Any]) -> None:
        """Fill the given config's ``"auto"`` keys from the fields (in place); the fields follow the config."""
        if "zero_optimization" not in config:
            raise ValueError("Please specify the ZeRO optimization config in the DeepSpeed config.")
        config.setdefault("gradient_accumulation_steps", 1)  # as DeepSpeed reads a config without it
        fields = {"gradient_accumulation_steps": self.gradient_accumulation_steps,
                  "gradient_clipping": self.gradient_clipping,
                  "zero_optimization.stage": self.zero_stage,
                  "zero_optimization.offload_optimizer.device": self.offload_optimizer_device,
                  "zero_optimization.offload_param.device": self.offload_param_device,
                  "zero_optimization.stage3_gather_16bit_weights_on_model_save": self.zero3_save_16bit_model}
        _fill(config, fields)
        zero = config["zero_optimization"]
        self.gradient_accumulation_steps = config.get("gradient_accumulation_steps")
        self.gradient_clipping = config.get("gradient_clipping", self.gradient_clipping)
        self.zero_stage = zero.get("stage", self.zero_stage)
        self.offload_optimizer_device = zero.get("offload_optimizer", {}).get("device", "none")
        self.offload_param_device = zero.get("offload_param", {}).get("device", "none")
        self.zero3_save_16bit_model = bool(zero.get("stage3_gather_16bit_weights_on_model_save", False))
        config.setdefault("steps_per_print", float("inf"))

    # -- what transformers sees -----------------------------------------------------------------------------------
    def set_deepspeed_weakref(self) -> None:
        """Show this config to transformers (when it is installed), as Accelerate does when an Accelerator selects
        the plugin: ``from_pretrained`` then builds a ZeRO-3 model partitioned (``deepspeed.zero.Init``) and
        ``is_deepspeed_zero3_enabled()`` answers for it. The copy it gets has its batch ``"auto"`` keys settled
        (DeepSpeed's ``zero.Init`` reads them before ``prepare`` fills the real ones).

        Without transformers there is nothing to tell: Ember needs it neither for DeepSpeed nor for
        ``zero3_init_flag`` (Accelerate refuses to start then).
        """
        if importlib.util.find_spec("transformers") is None:
            return
        from transformers.integrations import HfDeepSpeedConfig as TransformersConfig
        from transformers.integrations import unset_hf_deepspeed_config

        config = copy.deepcopy(self.deepspeed_config)
        for key in ("gradient_accumulation_steps", "train_micro_batch_size_per_gpu"):
            if config.get(key, "auto") == "auto":
                config[key] = 1
        if config.get("train_batch_size") == "auto":
            del config["train_batch_size"]
        unset_hf_deepspeed_config()
        self.dschf = TransformersConfig(config)  # transformers holds a weak reference: this keeps it alive

    def is_zero3_init_enabled(self) -> bool:
        return bool(self.zero3_init_flag)

    @contextlib.contextmanager
    def zero3_init_context_manager(self, enable: bool = False) -> Iterator[None]:
        """Within the block, models are built with ``zero3_init_flag=enable`` (for instance a frozen teacher
        model built whole next to a partitioned student).

        With ``enable=False`` transformers is told nothing within the block, so ``from_pretrained`` builds the model
        whole: Accelerate 1.15 keeps showing it the ZeRO-3 config there, and the model is partitioned anyway.
        """
        old = self.zero3_init_flag
        if old == enable:
            yield
            return
        self.zero3_init_flag = enable
        self.dschf = None
        if enable:
            self.set_deepspeed_weakref()
        elif importlib.util.find_spec("transformers") is not None:
            from transformers.integrations import unset_hf_deepspeed_config

            unset_hf_deepspeed_config()
        try:
            yield
        finally:
            self.zero3_init_flag = old
            self.dschf = None
            self.set_deepspeed_weakref()

    # -- reading and filling the config -------------------------------------------------------------------------
    def get_value(self, key: str, default: Any = None) -> Any:
        """The value of a dotted key (``"zero_optimization.stage"``), or ``default``."""
        return self.hf_ds_config.get_value(key, default)

    def is_auto(self, key: str) -> bool:
        """Whether the dotted ``key`` is set to ``"auto"``."""
        return self.get_value(key) == "auto"

    def fill(self, values: Mapping[str, Any]) -> None:
        """Set each dotted key of ``values`` that the config leaves ``"auto"`` (explicit values are kept)."""
        _fill(self.deepspeed_config, values)

    def set_mixed_precision(self, mixed_precision: str) -> str:
        """Add the ``bf16`` / ``fp16`` sections for the Accelerator's precision; returns the precision the config
        really trains in (the config wins, as in Accelerate)."""
        if mixed_precision == "fp8":  # Accelerate's DeepSpeed fp8 goes through TransformerEngine / MS-AMP (GPU-only)
            raise ValueError("mixed_precision='fp8' is not supported with DeepSpeed by Ember: fp8 (torchao) runs in "
                             "one process, with DDP or with FSDP2 (FullyShardedDataParallelPlugin). Use 'bf16' here.")
        config = self.deepspeed_config
        for section, name in (("fp16", "fp16"), ("bf16", "bf16")):
            other = "bf16" if section == "fp16" else "fp16"
            if config.get(other, {}).get("enabled") is True and mixed_precision == section:
                raise ValueError(f"`--mixed_precision` arg cannot be set to `{section}` when `{other}` is set in "
                                 "the DeepSpeed config file.")
        for section in ("fp16", "bf16"):  # Accelerate's order (the config's repr shows it)
            entry = config.setdefault(section, {"enabled": mixed_precision == section})
            if entry.get("enabled") == "auto":
                entry["enabled"] = mixed_precision == section
        if config["bf16"].get("enabled") is True:
            return "bf16"
        return "fp16" if config["fp16"].get("enabled") is True else "no"

    def fill_auto(self, *, micro_batch_size: int | None, gradient_accumulation_steps: int, num_processes: int,
                  split_batches: bool, model: torch.nn.Module, optimizer: Any, scheduler: Any) -> None:
        """Fill every ``"auto"`` key the prepared objects decide, as Accelerate does at ``prepare``."""
        values: dict[str, Any] = {"gradient_clipping": 1.0,
                                  "zero_optimization.stage3_gather_16bit_weights_on_model_save": False}
        if micro_batch_size is not None:
            values["train_micro_batch_size_per_gpu"] = micro_batch_size
            values["train_batch_size"] = micro_batch_size * gradient_accumulation_steps * num_processes
        hidden = [key for key in ("zero_optimization.reduce_bucket_size", "zero_optimization.stage3_prefetch_bucket_size",
                                  "zero_optimization.stage3_param_persistence_threshold") if self.is_auto(key)]
        if hidden:
            size = _hidden_size(model, hidden)
            values.update({hidden_key: value for hidden_key, value in (
                ("zero_optimization.reduce_bucket_size", size * size),
                ("zero_optimization.stage3_prefetch_bucket_size", int(0.9 * size * size)),
                ("zero_optimization.stage3_param_persistence_threshold", 10 * size))})
        if isinstance(optimizer, DummyOptim):
            values.update({"optimizer.params.lr": optimizer.lr, "optimizer.params.weight_decay": optimizer.weight_decay})
        if isinstance(scheduler, DummyScheduler) and scheduler.lr_scheduler_callable is None:
            source = scheduler.optimizer
            max_lr = source.defaults["lr"] if getattr(source, "defaults", None) else getattr(source, "lr", None)
            values.update({"scheduler.params.warmup_min_lr": 0, "scheduler.params.warmup_max_lr": max_lr,
                           # DeepSpeed 0.19.6+ refuses 0 warm-up steps (DummyScheduler's default)
                           "scheduler.params.warmup_num_steps": max(1, scheduler.warmup_num_steps)})
            if scheduler.total_num_steps is not None:
                total = scheduler.total_num_steps
                values["scheduler.params.total_num_steps"] = total if split_batches else math.ceil(
                    total / num_processes)
        self.fill(values)
        if isinstance(optimizer, torch.optim.Optimizer):
            self.deepspeed_config["zero_allow_untested_optimizer"] = True


def choose_deepspeed_plugin(given: Any, environment: EngineEnvironment, fsdp_plugin: Any,
                            mixed_precision: str | None) -> tuple[DeepSpeedPlugin | None, str | None]:
    """The plugin a new Accelerator trains with (the one given, or one from ``ember launch --use_deepspeed``'s
    variables) and the precision its config decides; Accelerate's checks and words."""
    if given is not None and AcceleratorState.initialized_with_deepspeed():
        raise NotImplementedError(
            "You cannot pass in a `deepspeed_plugin` when creating a second `Accelerator`. Please make sure the "
            "first `Accelerator` is initialized with all the plugins you want to use.")
    plugin = given
    if plugin is None and environment.use_deepspeed and not AcceleratorState.initialized_with_deepspeed():
        plugin = DeepSpeedPlugin()  # configured by ACCELERATE_DEEPSPEED_* (ember launch sets them)
    if plugin is None:
        return None, mixed_precision
    if not isinstance(plugin, DeepSpeedPlugin):
        raise TypeError(f"Accelerator(deepspeed_plugin=...) takes an engine.DeepSpeedPlugin. Received: "
                        f"{type(plugin).__name__}.")
    if fsdp_plugin is not None:
        raise ValueError("Accelerator(deepspeed_plugin=..., fsdp_plugin=...) asks for two backends: pass one.")
    announce_deepspeed()
    # The DeepSpeed config decides the precision it trains in (as in Accelerate): bf16 / fp16 sections.
    return plugin, plugin.set_mixed_precision(mixed_precision or "no")


class DummyOptim:
    """Stands for the optimizer the DeepSpeed config defines: ``prepare`` hands its parameters to DeepSpeed.

    Args:
        params: the model's parameters (or parameter groups).
        lr / weight_decay: fill the config's ``"auto"`` ``optimizer.params``.
    """

    def __init__(self, params: Any, lr: float = 0.001, weight_decay: float = 0, **kwargs: Any) -> None:
        self.params = params
        self.lr = lr
        self.weight_decay = weight_decay
        self.kwargs = kwargs


class DummyScheduler:
    """Stands for the scheduler the DeepSpeed config defines (or ``lr_scheduler_callable(optimizer)``).

    Args:
        optimizer: the ``DummyOptim`` (or optimizer) it schedules.
        total_num_steps / warmup_num_steps: fill the config's ``"auto"`` ``scheduler.params``.
        lr_scheduler_callable: builds the scheduler from DeepSpeed's optimizer instead of the config.
    """

    def __init__(self, optimizer: Any, total_num_steps: int | None = None, warmup_num_steps: int = 0,
                 lr_scheduler_callable: Any = None, **kwargs: Any) -> None:
        self.optimizer = optimizer
        self.total_num_steps = total_num_steps
        self.warmup_num_steps = warmup_num_steps
        self.lr_scheduler_callable = lr_scheduler_callable
        self.kwargs = kwargs


def _fill(config: dict[str, Any], values: Mapping[str, Any]) -> None:
    """Set each dotted key of ``values`` that ``config`` leaves ``"auto"``."""
    for key, value in values.items():
        *parents, leaf = key.split(".")
        node: Any = config
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict) and node.get(leaf) == "auto":
            node[leaf] = value


def _hidden_size(model: torch.nn.Module, keys: list[str]) -> int:
    reasoning = ("therefore it's not possible to automatically fill out the following `auto` entries in the "
                 f"DeepSpeed config file: {keys}. You can fix that by replacing `auto` values for these keys with an "
                 "integer value of your choice.")
    config = getattr(model, "config", None)
    if config is None:
        raise ValueError("Can't find `model.config` entry, " + reasoning)
    if hasattr(config, "hidden_size"):
        return int(config.hidden_size)
    if hasattr(config, "hidden_sizes"):
        return int(max(config.hidden_sizes))
    raise ValueError("Can find neither `model.config.hidden_size` nor `model.config.hidden_sizes`, " + reasoning)
