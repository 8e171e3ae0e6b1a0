"""Probes of the DeepSpeed API's edges (defaults, "auto" filling, checks and their messages), for Accelerate and Ember.

    DS_SCRIPT_API=accelerate python -m torch.distributed.run --nproc-per-node 2 --master-addr 127.0.0.1 \\
        --master-port PORT tests/distributed/deepspeed_probe_script.py OUT_JSON

Imports come from ``DS_SCRIPT_API`` as in deepspeed_script.py. Each case builds a fresh Accelerator (the shared
states reset between cases), runs until it succeeds or raises, and records the outcome: the exception's type and
text, the warnings and log records it gave, and the values named by the case. Process 0 writes OUT_JSON; each
case's record also says whether process 1 saw the same outcome.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import json
import logging
import os
import sys
import types
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from deepspeed_script import MLP, make_data  # the shared model and data

API = os.environ.get("DS_SCRIPT_API", "accelerate")
_api, _utils = importlib.import_module(API), importlib.import_module(f"{API}.utils")
Accelerator, DeepSpeedPlugin, InitProcessGroupKwargs = _api.Accelerator, _api.DeepSpeedPlugin, _api.InitProcessGroupKwargs
_state = importlib.import_module(f"{API}.state")
AcceleratorState, GradientState = _state.AcceleratorState, _state.GradientState
DummyOptim, DummyScheduler = _utils.DummyOptim, _utils.DummyScheduler

GLOO = [InitProcessGroupKwargs(backend="gloo")]
ZERO2 = {"zero_optimization": {"stage": 2}, "train_micro_batch_size_per_gpu": "auto", "train_batch_size": "auto",
         "gradient_accumulation_steps": "auto", "zero_force_ds_cpu_optimizer": False}
ENV0 = dict(os.environ)


class _Logs(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.records: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno >= logging.WARNING:
            self.records.append(f"{record.levelname}: {record.getMessage()}")


def fresh() -> None:
    """Forget the previous case: Accelerate's shared states, the environment variables an Accelerator sets, and
    the random state (each case's model starts from the same weights)."""
    torch.manual_seed(0)
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    for key in set(os.environ) - set(ENV0):
        del os.environ[key]
    os.environ.update(ENV0)


def loader(batch_size: int | None = 4) -> DataLoader:
    if batch_size is None:
        return DataLoader(make_data(), batch_sampler=[[0, 1, 2, 3], [4, 5, 6, 7]])
    return DataLoader(make_data(), batch_size=batch_size)


def accel(config: dict[str, Any] | None = None, **kwargs: Any) -> Any:
    plugin = kwargs.pop("plugin", None) or DeepSpeedPlugin(hf_ds_config=config)
    kwargs.setdefault("kwargs_handlers", GLOO)
    return Accelerator(deepspeed_plugin=plugin, **kwargs)


def cfg(**extra: Any) -> dict[str, Any]:
    out = json.loads(json.dumps(ZERO2))
    for key, value in extra.items():
        node = out
        *parents, leaf = key.split("__")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return out


def train_a_little(acc: Any, model: Any, optimizer: Any, data: Any, steps: int) -> list[Any]:
    norms = []
    for i, (x, y) in enumerate(data):
        if i == steps:
            break
        with acc.accumulate(model):
            acc.backward(nn.functional.mse_loss(model(x), y))
            norms.append([acc.sync_gradients, acc.clip_grad_norm_(model.parameters(), 1.0)])
            optimizer.step()
            optimizer.zero_grad()
    return norms


# Each case returns a dict of observed values (or raises: the exception is the observation).
def c_plugin_defaults() -> dict[str, Any]:
    plugin = DeepSpeedPlugin()
    fields = {f.name: getattr(plugin, f.name) for f in dataclasses.fields(plugin)}
    fields["hf_ds_config"] = type(fields["hf_ds_config"]).__name__
    return {"fields": fields, "deepspeed_config": plugin.deepspeed_config, "zero3_init_flag": plugin.zero3_init_flag}


def c_plugin_zero3_defaults() -> dict[str, Any]:
    plugin = DeepSpeedPlugin(zero_stage=3)
    return {"zero3_init_flag": plugin.zero3_init_flag, "deepspeed_config": plugin.deepspeed_config}


def c_plugin_from_config_dict() -> dict[str, Any]:
    plugin = DeepSpeedPlugin(hf_ds_config={"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}},
                                           "gradient_clipping": 0.5, "gradient_accumulation_steps": 4})
    return {f.name: getattr(plugin, f.name) for f in dataclasses.fields(plugin) if f.name != "hf_ds_config"} | {
        "deepspeed_config": plugin.deepspeed_config}


def c_plugin_kwargs_vs_config() -> dict[str, Any]:
    plugin = DeepSpeedPlugin(hf_ds_config={"zero_optimization": {"stage": 3}, "gradient_accumulation_steps": 4},
                             zero_stage=2, gradient_accumulation_steps=8, gradient_clipping=0.3)
    return {"zero_stage": plugin.zero_stage, "gradient_accumulation_steps": plugin.gradient_accumulation_steps,
            "gradient_clipping": plugin.gradient_clipping, "deepspeed_config": plugin.deepspeed_config}


def c_plugin_auto_config() -> dict[str, Any]:
    plugin = DeepSpeedPlugin(hf_ds_config={"zero_optimization": {"stage": "auto"}, "gradient_clipping": "auto",
                                           "gradient_accumulation_steps": "auto"})
    return {"zero_stage": plugin.zero_stage, "deepspeed_config": plugin.deepspeed_config}


def c_plugin_no_zero_section() -> dict[str, Any]:
    DeepSpeedPlugin(hf_ds_config={"train_batch_size": 8})
    return {}


def c_plugin_missing_file() -> dict[str, Any]:
    DeepSpeedPlugin(hf_ds_config="/nonexistent/ds_config.json")
    return {}


def c_plugin_zero3_init_on_stage2() -> dict[str, Any]:
    return {"zero3_init_flag": DeepSpeedPlugin(zero_stage=2, zero3_init_flag=True).zero3_init_flag}


def c_accelerator_state() -> dict[str, Any]:
    acc = accel(plugin=DeepSpeedPlugin(zero_stage=2))
    return {"distributed_type": str(acc.distributed_type), "value": acc.distributed_type.value,
            "num_processes": acc.num_processes, "process_index": acc.process_index, "device": str(acc.device),
            "mixed_precision": acc.mixed_precision, "state_mixed_precision": acc.state.mixed_precision,
            "deepspeed_config_before_prepare": getattr(acc, "deepspeed_config", "<missing>"),
            "plugin_type": type(acc.state.deepspeed_plugin).__name__,
            "env": {k: os.environ[k] for k in sorted(set(os.environ) - set(ENV0))},
            "repr": repr(acc.state).splitlines()}


def c_no_backend() -> dict[str, Any]:
    acc = accel(plugin=DeepSpeedPlugin(zero_stage=2), kwargs_handlers=[])
    out = {"distributed_type": str(acc.distributed_type), "num_processes": acc.num_processes,
           "process_index": acc.process_index, "is_main_process": acc.is_main_process}
    model = MLP()
    acc.prepare(model, torch.optim.AdamW(model.parameters()), loader())
    return out


def c_cpu_true() -> dict[str, Any]:
    acc = accel(plugin=DeepSpeedPlugin(zero_stage=2), cpu=True)
    model = MLP()
    prepared = acc.prepare(model, torch.optim.AdamW(model.parameters()), loader())
    return {"distributed_type": str(acc.distributed_type), "num_processes": acc.num_processes,
            "model_type": type(prepared[0]).__name__}


def c_second_accelerator_with_plugin() -> dict[str, Any]:
    accel(plugin=DeepSpeedPlugin(zero_stage=2))
    accel(plugin=DeepSpeedPlugin(zero_stage=2))
    return {}


def c_second_accelerator_without_plugin() -> dict[str, Any]:
    first = accel(plugin=DeepSpeedPlugin(zero_stage=2))
    second = Accelerator(kwargs_handlers=GLOO)
    return {"distributed_type": str(second.distributed_type),
            "same_plugin": second.state.deepspeed_plugin is first.state.deepspeed_plugin}


def _prepare(config: dict[str, Any], model: nn.Module | None = None, **kwargs: Any) -> dict[str, Any]:
    acc = accel(config, **kwargs)
    model = model or MLP()
    acc.prepare(model, torch.optim.AdamW(model.parameters(), lr=0.01), loader())
    return {"gradient_accumulation_steps": acc.gradient_accumulation_steps, "mixed_precision": acc.mixed_precision,
            "deepspeed_config": acc.deepspeed_config}


def c_zero_stage_4() -> dict[str, Any]:
    return _prepare(cfg(zero_optimization__stage=4))


def c_zero_stage_0() -> dict[str, Any]:
    return _prepare(cfg(zero_optimization__stage=0))


def c_plugin_zero_stage_4() -> dict[str, Any]:
    return _prepare({}, plugin=DeepSpeedPlugin(zero_stage=4))


def c_gas_plugin_vs_accelerator() -> dict[str, Any]:
    return _prepare({}, plugin=DeepSpeedPlugin(zero_stage=2, gradient_accumulation_steps=4),
                    gradient_accumulation_steps=2)


def c_gas_config_vs_accelerator() -> dict[str, Any]:
    return _prepare(cfg(gradient_accumulation_steps=4), gradient_accumulation_steps=2)


def c_gas_config_missing() -> dict[str, Any]:
    config = cfg()
    del config["gradient_accumulation_steps"]
    return _prepare(config, gradient_accumulation_steps=2)


def c_clipping_kwarg_with_config() -> dict[str, Any]:
    return _prepare({}, plugin=DeepSpeedPlugin(hf_ds_config=cfg(), gradient_clipping=0.3))


def c_gas_config_auto() -> dict[str, Any]:
    return _prepare(cfg(), gradient_accumulation_steps=3)


def c_mp_config_bf16_vs_fp16() -> dict[str, Any]:
    return _prepare(cfg(bf16__enabled=True), mixed_precision="fp16")


def c_mp_config_fp16_vs_bf16() -> dict[str, Any]:
    return _prepare(cfg(fp16__enabled=True), mixed_precision="bf16")


def c_mp_config_bf16_vs_no() -> dict[str, Any]:
    return _prepare(cfg(bf16__enabled=True), mixed_precision="no")


def c_mp_config_bf16_false_vs_bf16() -> dict[str, Any]:
    return _prepare(cfg(bf16__enabled=False), mixed_precision="bf16")


def c_mp_config_auto_bf16() -> dict[str, Any]:
    return _prepare(cfg(bf16__enabled="auto", fp16__enabled="auto"), mixed_precision="bf16")


def c_batch_sizes_do_not_add_up() -> dict[str, Any]:
    return _prepare(cfg(train_batch_size=10, train_micro_batch_size_per_gpu=4, gradient_accumulation_steps=2),
                    gradient_accumulation_steps=2)


def c_batch_train_only() -> dict[str, Any]:
    return _prepare(cfg(train_batch_size=24, train_micro_batch_size_per_gpu="auto", gradient_accumulation_steps=2),
                    gradient_accumulation_steps=2)


def c_batch_micro_given() -> dict[str, Any]:
    return _prepare(cfg(train_micro_batch_size_per_gpu=3), gradient_accumulation_steps=2)


def c_batch_micro_and_total_given() -> dict[str, Any]:
    return _prepare(cfg(train_micro_batch_size_per_gpu=3, train_batch_size=12), gradient_accumulation_steps=2)


def c_batch_size_none_loader() -> dict[str, Any]:
    acc = accel(cfg())
    model = MLP()
    acc.prepare(model, torch.optim.AdamW(model.parameters()), loader(None))
    return {}


def c_no_loader() -> dict[str, Any]:
    acc = accel(cfg())
    model = MLP()
    acc.prepare(model, torch.optim.AdamW(model.parameters()))
    return {}


def c_two_loaders_min() -> dict[str, Any]:
    acc = accel(cfg())
    model = MLP()
    acc.prepare(model, torch.optim.AdamW(model.parameters()), loader(4), loader(8))
    return {"deepspeed_config": acc.deepspeed_config}


def c_split_batches() -> dict[str, Any]:
    acc = Accelerator(deepspeed_plugin=DeepSpeedPlugin(hf_ds_config=cfg()), kwargs_handlers=GLOO,
                      dataloader_config=_api.DataLoaderConfiguration(split_batches=True))
    model = MLP()
    acc.prepare(model, torch.optim.AdamW(model.parameters()), loader(8))
    return {"deepspeed_config": acc.deepspeed_config}


OPT = {"type": "AdamW", "params": {"lr": "auto", "weight_decay": "auto", "torch_adam": True}}
SCHED = {"type": "WarmupLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto", "warmup_num_steps": "auto"}}


def c_dummy_optim_without_config_optimizer() -> dict[str, Any]:
    acc = accel(cfg())
    model = MLP()
    acc.prepare(model, DummyOptim(model.parameters()), loader())
    return {}


def c_real_optimizer_with_config_optimizer() -> dict[str, Any]:
    return _prepare(cfg(optimizer=OPT))


def c_dummy_scheduler_without_config_scheduler() -> dict[str, Any]:
    acc = accel(cfg(optimizer=OPT))
    model = MLP()
    opt = DummyOptim(model.parameters())
    acc.prepare(model, opt, DummyScheduler(opt), loader())
    return {}


def c_torch_scheduler_with_config_scheduler() -> dict[str, Any]:
    acc = accel(cfg(scheduler=SCHED))
    model = MLP()
    opt = torch.optim.AdamW(model.parameters())
    acc.prepare(model, opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0), loader())
    return {}


def c_dummy_optim_with_torch_scheduler() -> dict[str, Any]:
    acc = accel(cfg(optimizer=OPT))
    model = MLP()
    sched = torch.optim.lr_scheduler.LambdaLR(torch.optim.AdamW(model.parameters()), lambda s: 1.0)
    acc.prepare(model, DummyOptim(model.parameters()), sched, loader())
    return {}


def c_dummy_defaults_filled() -> dict[str, Any]:
    acc = accel(cfg(optimizer=OPT, scheduler=SCHED))
    model = MLP()
    opt = DummyOptim(model.parameters())
    d_opt = {"lr": opt.lr, "weight_decay": opt.weight_decay, "kwargs": opt.kwargs}
    sched = DummyScheduler(opt)
    d_sched = {"total_num_steps": sched.total_num_steps, "warmup_num_steps": sched.warmup_num_steps,
               "lr_scheduler_callable": sched.lr_scheduler_callable, "kwargs": sched.kwargs}
    _, p_opt, p_sched, _ = acc.prepare(model, opt, sched, loader())
    return {"dummy_optim": d_opt, "dummy_scheduler": d_sched, "deepspeed_config": acc.deepspeed_config,
            "optimizer": type(p_opt).__name__, "inner": type(p_opt.optimizer).__name__,
            "scheduler": type(p_sched).__name__, "inner_scheduler": type(p_sched.scheduler).__name__}


def c_dummy_scheduler_callable() -> dict[str, Any]:
    acc = accel(cfg(optimizer=OPT))
    model = MLP()
    opt = DummyOptim(model.parameters(), lr=0.02, weight_decay=0.1)
    sched = DummyScheduler(opt, lr_scheduler_callable=lambda o: torch.optim.lr_scheduler.LambdaLR(o, lambda s: 0.5))
    p_sched = acc.prepare(model, opt, sched, loader())[2]
    return {"deepspeed_config": acc.deepspeed_config, "scheduler": type(p_sched).__name__,
            "inner_scheduler": type(p_sched.scheduler).__name__, "lr": p_sched.get_last_lr()}


def c_hidden_size_auto_plain_model() -> dict[str, Any]:
    return _prepare(cfg(zero_optimization__reduce_bucket_size="auto"))


def c_hidden_size_auto_with_config() -> dict[str, Any]:
    model = MLP()
    model.config = types.SimpleNamespace(hidden_size=48)
    return _prepare(cfg(zero_optimization__stage=3, zero_optimization__reduce_bucket_size="auto",
                        zero_optimization__stage3_prefetch_bucket_size="auto",
                        zero_optimization__stage3_param_persistence_threshold="auto"), model=model)


def c_two_models() -> dict[str, Any]:
    acc = accel(cfg())
    a, b = MLP(), MLP()
    acc.prepare(a, b, torch.optim.AdamW(a.parameters()), loader())
    return {}


def c_device_placement() -> dict[str, Any]:
    acc = accel(cfg())
    model = MLP()
    acc.prepare(model, torch.optim.AdamW(model.parameters()), loader(), device_placement=[True, True, True])
    return {}


def c_clip_grad_value() -> dict[str, Any]:
    acc = accel(cfg())
    model = MLP()
    model, _, _ = acc.prepare(model, torch.optim.AdamW(model.parameters()), loader())
    acc.clip_grad_value_(model.parameters(), 1.0)
    return {}


def c_clip_grad_norm_sequence() -> dict[str, Any]:
    """What clip_grad_norm_ returns on every batch (and before any step), with and without gradient_clipping."""
    out = {}
    for clipping in (None, 0.5):
        fresh()
        plugin = DeepSpeedPlugin(zero_stage=2, gradient_accumulation_steps=2, gradient_clipping=clipping)
        acc = accel(plugin=plugin, gradient_accumulation_steps=2)
        model = MLP()
        model, opt, data = acc.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1), loader())
        before = acc.clip_grad_norm_(model.parameters(), 1.0)
        out[str(clipping)] = {"before_any_step": before, "per_batch": train_a_little(acc, model, opt, data, 5),
                              "config_gradient_clipping": acc.deepspeed_config.get("gradient_clipping", "<absent>")}
    return out


def c_zero3_state_dict_without_16bit() -> dict[str, Any]:
    acc = accel(plugin=DeepSpeedPlugin(zero_stage=3, zero3_save_16bit_model=False, zero3_init_flag=False))
    model = MLP()
    model, _, _ = acc.prepare(model, torch.optim.AdamW(model.parameters()), loader())
    return {"unwrapped_param_numels": [p.numel() for p in acc.unwrap_model(model).parameters()],
            "state_dict": sorted(acc.get_state_dict(model))}


def c_zero3_save_model_without_16bit() -> dict[str, Any]:
    acc = accel(plugin=DeepSpeedPlugin(zero_stage=3, zero3_save_16bit_model=False, zero3_init_flag=False))
    model = MLP()
    model, _, _ = acc.prepare(model, torch.optim.AdamW(model.parameters()), loader())
    acc.save_model(model, os.path.join(os.path.dirname(OUT), "z3_no16bit_model"))
    return {}


def c_save_model_variants() -> dict[str, Any]:
    out = {}
    for stage in (2, 3):
        fresh()
        acc = accel(plugin=DeepSpeedPlugin(zero_stage=stage, zero3_save_16bit_model=True, zero3_init_flag=False))
        model = MLP()
        model, _, _ = acc.prepare(model, torch.optim.AdamW(model.parameters()), loader())
        for safe in (True, False):
            target = os.path.join(os.path.dirname(OUT), f"save_model_z{stage}_{safe}")
            acc.save_model(model, target, safe_serialization=safe)
            acc.wait_for_everyone()
            out[f"zero{stage}_safe_{safe}"] = sorted(os.listdir(target)) if os.path.isdir(target) else None
        sd = acc.get_state_dict(model)
        out[f"zero{stage}_state_dict"] = None if sd is None else {k: [str(v.dtype), list(v.shape)] for k, v in sd.items()}
        out[f"zero{stage}_unwrapped_numels"] = [p.numel() for p in acc.unwrap_model(model).parameters()]
    return out


def c_zero3_init_default_needs_transformers() -> dict[str, Any]:
    plugin = DeepSpeedPlugin(zero_stage=3)
    accel(plugin=plugin)
    return {"zero3_init_flag": plugin.zero3_init_flag, "dschf": type(getattr(plugin, "dschf", None)).__name__}


def c_offload_param_on_stage2() -> dict[str, Any]:
    out = _prepare({}, plugin=DeepSpeedPlugin(zero_stage=2, offload_param_device="cpu"))
    return out


CASES: dict[str, Callable[[], dict[str, Any]]] = {
    name[2:]: fn for name, fn in dict(globals()).items() if name.startswith("c_") and callable(fn)}


def run_case(fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    fresh()
    handler = _Logs()
    logging.getLogger().addHandler(handler)
    out: dict[str, Any] = {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            out["result"] = fn()
        except BaseException as exc:  # noqa: BLE001 - the exception is what the case observes
            out["error"] = [type(exc).__name__, str(exc)]
    logging.getLogger().removeHandler(handler)
    out["warnings"] = sorted({f"{w.category.__name__}: {w.message}" for w in caught
                              if "deprecated" not in str(w.message) and "all_gather" not in str(w.message)})
    out["logs"] = handler.records
    return out


if __name__ == "__main__":
    OUT = sys.argv[1]
    only = sys.argv[2].split(",") if len(sys.argv) > 2 else list(CASES)
    logging.getLogger().setLevel(logging.INFO)
    results = {}
    for name in only:
        results[name] = json.loads(json.dumps(run_case(CASES[name]), default=repr))
    with contextlib.suppress(Exception):
        torch.distributed.barrier()
    if int(os.environ.get("RANK", "0")) == 0:
        with open(OUT, "w") as f:
            json.dump(results, f, indent=1)
    else:
        with open(OUT + f".rank{os.environ['RANK']}", "w") as f:
            json.dump(results, f, indent=1)
