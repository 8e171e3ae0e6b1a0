"""A DeepSpeed training script written like Accelerate's DeepSpeed examples, shared by Accelerate and Ember.

    DS_SCRIPT_API=accelerate python -m torch.distributed.run --nproc-per-node 2 --master-addr 127.0.0.1 \\
        --master-port PORT tests/distributed/deepspeed_script.py RUN_JSON OUT_JSON

``DS_SCRIPT_API`` names the package the script imports ``Accelerator``, ``DeepSpeedPlugin``,
``InitProcessGroupKwargs`` (from ``API``) and ``DummyOptim``, ``DummyScheduler``, ``set_seed`` (from ``API.utils``)
from: ``accelerate`` to record the expected values (tests/parity_scripts/record_deepspeed.py), ``engine`` for
Ember's own test. Nothing else differs.

RUN_JSON is a JSON object (keys below, in ``DEFAULTS``); OUT_JSON is written by process 0 with the per-step
losses of both processes, the gradient norms ``clip_grad_norm_`` returned, the learning rates, the final full
weights (``accelerator.get_state_dict``, gathered under ZeRO-3) as summaries and a sha256, the DeepSpeed config
the accelerator ended with, the files ``save_state`` / ``save_model`` wrote and a few probes of the API.

Data: 64 fixed samples, 4 per process and batch, so 8 batches per process and epoch; with gradient accumulation 2
that is 4 optimizer steps per epoch. ``save_at`` (a list) saves the state after that many batches (in
``state_<k>`` next to OUT_JSON, or under ``state_dir``); ``stop_at`` ends the run
there (as a killed run would); ``resume_from`` + ``resume_at`` loads a state in new processes and goes on from that
batch (skipping the batches already seen, as Accelerate's examples do with ``skip_first_batches``).
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import sys
import time
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

API = os.environ.get("DS_SCRIPT_API", "accelerate")
_api, _utils = importlib.import_module(API), importlib.import_module(f"{API}.utils")
Accelerator, DeepSpeedPlugin, InitProcessGroupKwargs = _api.Accelerator, _api.DeepSpeedPlugin, _api.InitProcessGroupKwargs
DummyOptim, DummyScheduler, set_seed = _utils.DummyOptim, _utils.DummyScheduler, _utils.set_seed

DEFAULTS: dict[str, Any] = {
    "zero_stage": 2,
    "offload_optimizer": "none",  # "none" | "cpu"
    "offload_param": "none",  # "none" | "cpu" (ZeRO-3 only)
    "mixed_precision": "no",  # "no" | "bf16"
    "mode": "plugin",  # "plugin": DeepSpeedPlugin(...) + torch optimizer; "config": "auto" dict + DummyOptim
    "optimizer": "adamw",  # "adamw" | "sgd" (plugin mode)
    "lr": 0.01,
    "epochs": 2,
    "gradient_accumulation_steps": 2,
    "gradient_clipping": 1.0,
    "zero3_save_16bit_model": True,
    "zero3_init_flag": False,
    # ZeRO-3 keeps parameters under this many elements whole on every process (DeepSpeed's default: 100000, more
    # than this model has); 0 partitions every parameter. None: DeepSpeed's default.
    "persistence_threshold": 0,
    "save_at": [],  # batch counts after which to save_state
    "stop_at": None,  # batches after which the run ends
    "resume_from": None,  # a save_state folder to load before training
    "resume_at": 0,  # batches already done by the run that saved resume_from
    "probes": False,  # also record unwrap_model, save_model, gather_for_metrics
    "backend": "gloo",  # InitProcessGroupKwargs(backend=...); None: no kwargs handler
    "state_dir": None,  # the folder the state_<k> folders go in (default: OUT_JSON's)
    "cast_inputs": True,  # bf16: cast the inputs to bf16 (the engine's weights are bf16)
}


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(20, 48)
        self.fc2 = nn.Linear(48, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.tanh(self.fc1(x)))


def make_data() -> TensorDataset:
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(64, 20, generator=g)
    y = torch.tanh(x @ torch.randn(20, 4, generator=g)) + 0.1 * torch.randn(64, 4, generator=g)
    return TensorDataset(x, y)


def auto_config(run: dict[str, Any]) -> dict[str, Any]:
    """An "auto" config as Accelerate's examples write it, with the optimizer and scheduler defined in it."""
    zero: dict[str, Any] = {"stage": run["zero_stage"], "offload_optimizer": {"device": run["offload_optimizer"]},
                            "offload_param": {"device": run["offload_param"]},
                            "stage3_gather_16bit_weights_on_model_save": run["zero3_save_16bit_model"]}
    if run["zero_stage"] == 3 and run["persistence_threshold"] is not None:
        zero["stage3_param_persistence_threshold"] = run["persistence_threshold"]
    return {
        "bf16": {"enabled": "auto"},
        # torch_adam: torch.optim.AdamW, which needs no compiled op on CPU.
        "optimizer": {"type": "AdamW", "params": {"lr": "auto", "weight_decay": "auto", "torch_adam": True}},
        "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                                                          "warmup_num_steps": "auto", "total_num_steps": "auto"}},
        "zero_optimization": zero,
        "zero_force_ds_cpu_optimizer": False,
        "gradient_accumulation_steps": "auto",
        "gradient_clipping": "auto",
        "train_batch_size": "auto",
        "train_micro_batch_size_per_gpu": "auto",
    }


def make_plugin(run: dict[str, Any]) -> Any:
    if run["mode"] == "config":
        return DeepSpeedPlugin(hf_ds_config=auto_config(run), zero3_init_flag=run["zero3_init_flag"])
    plugin = DeepSpeedPlugin(zero_stage=run["zero_stage"], gradient_accumulation_steps=run["gradient_accumulation_steps"],
                             gradient_clipping=run["gradient_clipping"],
                             offload_optimizer_device=run["offload_optimizer"],
                             offload_param_device=run["offload_param"], zero3_init_flag=run["zero3_init_flag"],
                             zero3_save_16bit_model=run["zero3_save_16bit_model"])
    # Torch's optimizer on the CPU-offloaded states instead of DeepSpeedCPUAdam (a compiled op, minutes to build).
    plugin.deepspeed_config["zero_force_ds_cpu_optimizer"] = False
    if run["zero_stage"] == 3 and run["persistence_threshold"] is not None:
        plugin.deepspeed_config["zero_optimization"]["stage3_param_persistence_threshold"] = run["persistence_threshold"]
    return plugin


def summary(state_dict: dict[str, torch.Tensor]) -> tuple[dict[str, list[Any]], str]:
    """Per tensor: dtype, shape, sum, abs-sum, first 3 values; and a sha256 of all float32 bytes in key order."""
    out, digest = {}, hashlib.sha256()
    for name, t in state_dict.items():
        f = t.detach().cpu().to(torch.float32).contiguous()
        d = f.double()
        out[name] = [str(t.dtype), list(t.shape), float(d.sum()), float(d.abs().sum()),
                     [float(v) for v in d.flatten()[:3]]]
        digest.update(name.encode())
        digest.update(f.numpy().tobytes())
    return out, digest.hexdigest()


def listing(root: str) -> list[list[Any]]:
    files = []
    for folder, _, names in os.walk(root):
        for n in names:
            path = os.path.join(folder, n)
            files.append([os.path.relpath(path, root), os.path.getsize(path)])
    return sorted(files)


def probes(accelerator: Any, model: Any, optimizer: Any, scheduler: Any, loader: Any, workdir: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    unwrapped = accelerator.unwrap_model(model)
    out["types"] = {"model": type(model).__name__, "optimizer": type(optimizer).__name__,
                    "inner_optimizer": type(getattr(optimizer, "optimizer", None)).__name__,
                    "scheduler": type(scheduler).__name__, "loader": type(loader).__name__,
                    "unwrapped": type(unwrapped).__name__, "unwrapped_is_module": unwrapped is getattr(model, "module", None)}
    # gather_for_metrics on an evaluation loader of 10 samples: 2 processes x 4 per batch do not divide it.
    data = make_data()
    eval_loader = accelerator.prepare_data_loader(DataLoader(TensorDataset(data.tensors[0][:10], data.tensors[1][:10]),
                                                             batch_size=4))
    model.eval()
    gathered = []
    with torch.no_grad():
        for x, y in eval_loader:
            x = x.to(next(unwrapped.parameters()).dtype) if accelerator.mixed_precision == "bf16" else x
            pred = model(x)
            gathered.append(accelerator.gather_for_metrics((pred.float(), y)))
    model.train()
    out["gather_for_metrics"] = {"batches": [[list(p.shape), list(t.shape)] for p, t in gathered],
                                 "targets_first_col": [float(v) for p, t in gathered for v in t[:, 0]]}
    # save_model: file names and sizes (state dict gathered by the accelerator).
    target = os.path.join(workdir, "saved_model")
    try:
        accelerator.save_model(model, target)
        accelerator.wait_for_everyone()
        out["save_model"] = listing(target)
    except Exception as exc:  # noqa: BLE001 - recorded as observed behaviour
        out["save_model"] = f"{type(exc).__name__}: {exc}"
    return out


def training_function(run: dict[str, Any], out_path: str) -> None:
    workdir = os.path.dirname(os.path.abspath(out_path))
    state_dir = run["state_dir"] or workdir
    # backend="gloo": without it Accelerate 1.15 on a machine without GPUs leaves its backend unset under DeepSpeed
    # and counts one process on each rank (num_processes 1, every rank the main one).
    accelerator = Accelerator(mixed_precision=run["mixed_precision"], deepspeed_plugin=make_plugin(run),
                              gradient_accumulation_steps=run["gradient_accumulation_steps"],
                              kwargs_handlers=[InitProcessGroupKwargs(backend=run["backend"])] if run["backend"] else [])
    set_seed(42)
    model = MLP()
    loader = DataLoader(make_data(), batch_size=4, shuffle=False)
    if run["mode"] == "config":
        optimizer = DummyOptim(model.parameters(), lr=run["lr"])
        total = run["epochs"] * len(loader) // accelerator.gradient_accumulation_steps
        scheduler = DummyScheduler(optimizer, total_num_steps=total, warmup_num_steps=2)
    else:
        cls = torch.optim.AdamW if run["optimizer"] == "adamw" else torch.optim.SGD
        optimizer = cls(model.parameters(), lr=run["lr"])
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (1 + step))
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    record: dict[str, Any] = {"api": API, "run": run, "distributed_type": str(accelerator.distributed_type),
                              "num_processes": accelerator.num_processes, "device": str(accelerator.device),
                              "gradient_accumulation_steps": accelerator.gradient_accumulation_steps,
                              "mixed_precision": accelerator.mixed_precision,
                              "param_dtypes": sorted({str(p.dtype) for p in accelerator.unwrap_model(model).parameters()}),
                              "deepspeed_config": accelerator.deepspeed_config,
                              "plugin_config_is_same": accelerator.deepspeed_config
                              is accelerator.state.deepspeed_plugin.deepspeed_config,
                              "losses": [], "grad_norms": [], "lrs": [], "sync_gradients": [],
                              # elements of each parameter held on this process after prepare (ZeRO-3 partitions)
                              "local_numels": [p.numel() for p in accelerator.unwrap_model(model).parameters()]}
    done = run["resume_at"]
    if run["resume_from"]:
        accelerator.load_state(run["resume_from"])
    start_epoch, skip = divmod(done, len(loader))
    started = time.perf_counter()
    for epoch in range(start_epoch, run["epochs"]):
        active = accelerator.skip_first_batches(loader, skip) if epoch == start_epoch and skip else loader
        for x, y in active:
            with accelerator.accumulate(model):
                if accelerator.mixed_precision == "bf16" and run["cast_inputs"]:
                    x = x.to(torch.bfloat16)  # the engine holds bf16 weights; a plain MLP gets no autocast
                loss = nn.functional.mse_loss(model(x).float(), y)
                accelerator.backward(loss)
                if accelerator.sync_gradients:
                    norm = accelerator.clip_grad_norm_(model.parameters(), 1.0)
                    record["grad_norms"].append(None if norm is None else float(norm))
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
                if accelerator.sync_gradients:
                    record["lrs"].append([float(v) for v in scheduler.get_last_lr()])
            done += 1
            record["sync_gradients"].append(bool(accelerator.sync_gradients))
            record["losses"].append([float(v) for v in accelerator.gather(loss.detach().reshape(1))])
            if done in run["save_at"]:
                target = os.path.join(state_dir, f"state_{done}")
                accelerator.save_state(target)
                accelerator.wait_for_everyone()
                record.setdefault("save_state_files", {})[str(done)] = listing(target)
            if done == run["stop_at"]:
                break
        skip = 0
        if done == run["stop_at"]:
            break
    record["train_seconds"] = time.perf_counter() - started
    state_dict = accelerator.get_state_dict(model)
    # Per process: the number of tensors get_state_dict returned there, -1 where it returned None.
    size = torch.tensor([-1 if state_dict is None else len(state_dict)])
    record["state_dict_sizes"] = [int(v) for v in accelerator.gather(size)]
    record["weights"], record["sha256"] = summary(state_dict or {})
    if run["probes"]:
        record["probes"] = probes(accelerator, model, optimizer, scheduler, loader, workdir)
    if accelerator.is_main_process:
        with open(out_path, "w") as f:
            json.dump(record, f, indent=1)
    accelerator.wait_for_everyone()
    accelerator.end_training()


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        training_function({**DEFAULTS, **json.load(f)}, sys.argv[2])
