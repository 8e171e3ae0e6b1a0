"""``DeepSpeedStrategy``: Lightning's DeepSpeed keywords and defaults, run by the engine's DeepSpeed backend.

The strategy builds Lightning's DeepSpeed config from its keywords (or takes ``config=``, a dict or a JSON file)
and hands it to the engine as a ``DeepSpeedPlugin``; ``strategy.config`` is then the live config, editable until
``fit`` starts. At ``fit`` the trainer fills what Lightning fills from the Trainer: ``gradient_accumulation_steps``
(``accumulate_grad_batches``), ``train_micro_batch_size_per_gpu`` (the training loader's batch size) and
``gradient_clipping`` (``gradient_clip_val`` or 0), unless the config sets them.
"""

from __future__ import annotations

import json
import os
from datetime import timedelta
from typing import Any

from trainer.strategies.base import Strategy


class DeepSpeedStrategy(Strategy):
    """Lightning's ``DeepSpeedStrategy`` (same keywords and defaults); the engine runs it on CPU (gloo) and GPU.

    The ZeRO keywords (``stage``, the offloads, bucket sizes...) make ``config`` unless ``config`` is given;
    ``loss_scale`` & co. configure fp16 loss scaling. ``accelerator``, ``parallel_devices``,
    ``cluster_environment`` and ``precision_plugin`` must stay None (the Trainer's own keywords decide those).

    Example:
        >>> strategy = DeepSpeedStrategy(stage=3, offload_optimizer=True)
        >>> strategy.config["zero_optimization"]["stage"], strategy.config["zero_optimization"]["offload_optimizer"]
        (3, {'device': 'cpu', 'nvme_path': '/local_nvme', 'buffer_count': 4, 'pin_memory': False})
    """

    kind = "deepspeed"

    def __init__(self, accelerator: Any = None, zero_optimization: bool = True, stage: int = 2,
                 remote_device: str | None = None, offload_optimizer: bool = False, offload_parameters: bool = False,
                 offload_params_device: str = "cpu", nvme_path: str = "/local_nvme", params_buffer_count: int = 5,
                 params_buffer_size: int = 100_000_000, max_in_cpu: int = 1_000_000_000,
                 offload_optimizer_device: str = "cpu", optimizer_buffer_count: int = 4, block_size: int = 1048576,
                 queue_depth: int = 8, single_submit: bool = False, overlap_events: bool = True,
                 thread_count: int = 1, pin_memory: bool = False, sub_group_size: int = 1_000_000_000_000,
                 contiguous_gradients: bool = True, overlap_comm: bool = True, allgather_partitions: bool = True,
                 reduce_scatter: bool = True, allgather_bucket_size: int = 200_000_000,
                 reduce_bucket_size: int = 200_000_000, zero_allow_untested_optimizer: bool = True,
                 logging_batch_size_per_gpu: str | int = "auto", config: str | os.PathLike[str] | dict[str, Any] |
                 None = None, logging_level: int = 30, parallel_devices: Any = None, cluster_environment: Any = None,
                 loss_scale: float = 0, initial_scale_power: int = 16, loss_scale_window: int = 1000,
                 hysteresis: int = 2, min_loss_scale: int = 1, partition_activations: bool = False,
                 cpu_checkpointing: bool = False, contiguous_memory_optimization: bool = False,
                 synchronize_checkpoint_boundary: bool = False, load_full_weights: bool = False,
                 precision_plugin: Any = None, process_group_backend: str | None = None,
                 timeout: timedelta | None = timedelta(seconds=1800), exclude_frozen_parameters: bool = False) -> None:
        for name, value in (("accelerator", accelerator), ("parallel_devices", parallel_devices),
                            ("cluster_environment", cluster_environment), ("precision_plugin", precision_plugin)):
            if value is not None:
                raise ValueError(f"DeepSpeedStrategy({name}=...) is not supported: the Trainer's own keywords "
                                 "(accelerator=, devices=, precision=) decide it. Remove it.")
        if stage not in (0, 1, 2, 3):
            raise ValueError(f"DeepSpeedStrategy(stage={stage!r}) is not a ZeRO stage: use 0, 1, 2 or 3.")
        if load_full_weights or exclude_frozen_parameters:
            raise ValueError("DeepSpeedStrategy(load_full_weights=True / exclude_frozen_parameters=True) is not "
                             "supported: Ember resumes from its own checkpoint folders, with every parameter.")
        self.stage = stage
        self.process_group_backend = process_group_backend
        self.timeout = timeout
        self.loss_scaling = {"loss_scale": loss_scale, "initial_scale_power": initial_scale_power,
                             "loss_scale_window": loss_scale_window, "hysteresis": hysteresis,
                             "min_loss_scale": min_loss_scale}
        if config is not None:
            self.config = _load_config(config)
            return
        self.config = {
            "activation_checkpointing": {
                "partition_activations": partition_activations, "cpu_checkpointing": cpu_checkpointing,
                "contiguous_memory_optimization": contiguous_memory_optimization,
                "synchronize_checkpoint_boundary": synchronize_checkpoint_boundary},
            "aio": {"block_size": block_size, "queue_depth": queue_depth, "single_submit": single_submit,
                    "overlap_events": overlap_events, "thread_count": thread_count},
        }
        if zero_optimization:
            zero: dict[str, Any] = {
                "stage": stage, "contiguous_gradients": contiguous_gradients, "overlap_comm": overlap_comm,
                "allgather_partitions": allgather_partitions, "reduce_scatter": reduce_scatter,
                "allgather_bucket_size": allgather_bucket_size, "reduce_bucket_size": reduce_bucket_size,
                "sub_group_size": sub_group_size}
            if offload_optimizer:
                zero["offload_optimizer"] = {"device": offload_optimizer_device, "nvme_path": nvme_path,
                                             "buffer_count": optimizer_buffer_count, "pin_memory": pin_memory}
            if offload_parameters:
                zero["offload_param"] = {"device": offload_params_device, "nvme_path": nvme_path,
                                         "buffer_count": params_buffer_count, "buffer_size": params_buffer_size,
                                         "max_in_cpu": max_in_cpu, "pin_memory": pin_memory}
            self.config = {"zero_allow_untested_optimizer": zero_allow_untested_optimizer, "zero_optimization": zero,
                           **self.config}
        if logging_batch_size_per_gpu != "auto":
            self.config = {"train_micro_batch_size_per_gpu": logging_batch_size_per_gpu, **self.config}

    def accelerator_kwargs(self, world_size: int = 1, num_nodes: int = 1) -> dict[str, Any]:
        """``Accelerator(deepspeed_plugin=..., kwargs_handlers=...)`` for this strategy; ``config`` becomes the
        plugin's live config."""
        from engine import DeepSpeedPlugin, InitProcessGroupKwargs

        if "gradient_accumulation_steps" in self.config:
            raise ValueError("Do not set `gradient_accumulation_steps` in the DeepSpeed config as this will be set "
                             "with the `accumulate_grad_batches` argument passed via the Lightning Trainer.")
        config = dict(self.config)
        config.setdefault("zero_optimization", {"stage": 0})  # zero_optimization=False: DeepSpeed without ZeRO
        fp16 = config.setdefault("fp16", {"enabled": "auto"})
        if isinstance(fp16, dict) and "loss_scale" not in fp16:  # Lightning's loss scaling for 16-mixed
            fp16.update(self.loss_scaling)
        for key in ("gradient_accumulation_steps", "train_micro_batch_size_per_gpu", "gradient_clipping"):
            config.setdefault(key, "auto")  # filled when fit starts (DeepSpeed.configure_training)
        plugin = DeepSpeedPlugin(hf_ds_config=config)
        self.config = plugin.deepspeed_config  # edits until fit starts reach the engine
        kwargs: dict[str, Any] = {"deepspeed_plugin": plugin}
        if self.process_group_backend is not None or self.timeout is not None:
            kwargs["kwargs_handlers"] = [InitProcessGroupKwargs(backend=self.process_group_backend,
                                                                timeout=self.timeout)]
        return kwargs


def _load_config(config: str | os.PathLike[str] | dict[str, Any]) -> dict[str, Any]:
    if isinstance(config, dict):
        return config
    path = os.fspath(config)
    if not os.path.isfile(path):
        raise ValueError(f"You passed in a path to a DeepSpeed config but the path does not exist: {path}")
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)
