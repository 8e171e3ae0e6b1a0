"""Record fp8 training through torchao as Accelerate 1.15 does it, on CPU; write tests/distributed/fp8_expected.py.

    /work/venvs/bigmodel/bin/python tests/parity_scripts/record_fp8.py \
        --no-torchao-python /work/venvs/bigmodel-noao/bin/python

What is recorded:
- torchao's version and import time (a fresh process, torch already imported);
- the config Accelerate builds (``AORecipeKwargs().config``) against torchao's own default ``Float8LinearConfig()``;
- which ``nn.Linear`` layers Accelerate converts, on a probe model whose registration order differs from its call
  order and which has layers whose sizes are not multiples of 16: through ``convert_model_to_fp8_ao`` (Accelerate's
  helper) and through the real ``Accelerator(mixed_precision="fp8").prepare`` on CPU (it runs here);
- the losses of a small MLP (sizes multiples of 16) in fp32, under torchao directly with Accelerate's filter and
  config, under ``Accelerator(mixed_precision="fp8")`` (fp8 linears inside a bf16 autocast), and under
  ``Accelerator(mixed_precision="bf16")`` for comparison; the fp8 Accelerator run twice: with the optimizer built
  before ``prepare`` (the usual order: the converted layers' new weights are not in the optimizer and never change)
  and built from the prepared model (every layer trains);
- FSDP2 (``fully_shard`` on 2 gloo processes) with fp8 all-gather, against the single-process fp8 run;
- the error texts: fp8 backends that are missing, torchao missing (run in a second interpreter without torchao),
  Lightning's TransformerEngine precision without TransformerEngine.
"""

from __future__ import annotations

import pinned  # first: the suite's CPU kernel path before torch loads (tests/kernel_path.py)

# isort: split

import json
import os
import pprint
import socket
import subprocess
import sys
import tempfile
import time
import warnings
from typing import Any

# fp8 training on CPU needs oneDNN's AVX512-FP16 kernels: recorded under the fp8 tests' cap (FP8_PINNED), for
# this process and the ones it starts.
os.environ.update(pinned.kernel_path.FP8_PINNED)
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "tests", "distributed", "fp8_expected.py")
STEPS, LR, SEED, BATCH = 12, 1e-2, 0, 16


def probe_model() -> Any:
    """Registration order: head, embed, inp, blocks, odd, odd_in, tail; call order: embed, inp, blocks, odd, odd_in,
    tail, head (so the last *registered* Linear is ``tail``, the last *called* is ``head``)."""
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.up = nn.Linear(64, 128)
            self.down = nn.Linear(128, 64)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + self.down(torch.relu(self.up(x)))

    class Probe(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.head = nn.Linear(64, 32)
            self.embed = nn.Embedding(32, 64)
            self.inp = nn.Linear(64, 64)
            self.blocks = nn.ModuleList(Block() for _ in range(2))
            self.odd = nn.Linear(64, 24)
            self.odd_in = nn.Linear(24, 64)
            self.tail = nn.Linear(64, 64, bias=False)

        def forward(self, tokens: torch.Tensor) -> torch.Tensor:
            h = self.inp(self.embed(tokens))
            for block in self.blocks:
                h = block(h)
            return self.head(self.tail(self.odd_in(self.odd(h))))

    return Probe()


def linear_kinds(model: Any) -> dict[str, str]:
    from torch import nn

    return {name: type(m).__name__ for name, m in model.named_modules() if isinstance(m, nn.Linear)}


def mlp() -> Any:
    import torch
    from torch import nn

    torch.manual_seed(SEED)
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                         nn.Linear(64, 16))


def data() -> tuple[Any, Any]:
    import torch

    g = torch.Generator().manual_seed(1)
    x = torch.randn(STEPS, BATCH, 32, generator=g)
    return x, torch.sin(x[..., :16] * 2) + 0.1 * x[..., 16:]


def train(model: Any, step_fn: Any = None, rank_slice: slice = slice(None)) -> list[float]:
    import torch

    x, y = data()
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    losses = []
    for i in range(STEPS):
        loss = torch.nn.functional.mse_loss(model(x[i, rank_slice]).float(), y[i, rank_slice])
        loss.backward()
        opt.step()
        opt.zero_grad()
        if step_fn is not None:
            step_fn()
        losses.append(float(loss.detach()))
    return losses


def accelerate_train(mixed_precision: str, optimizer_after_prepare: bool = False) -> tuple[list[float], dict[str, Any]]:
    """``optimizer_after_prepare``: build the optimizer from the prepared model (the usual order, optimizer built
    first and prepared with the model, leaves the layers fp8 replaced out of the optimizer: recorded below)."""
    import torch
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(True)
    acc = Accelerator(mixed_precision=mixed_precision)
    model = mlp()
    initial = {k: v.detach().clone() for k, v in model.state_dict().items()}
    if optimizer_after_prepare:
        model = acc.prepare(model)
        opt = acc.prepare(torch.optim.AdamW(model.parameters(), lr=LR))
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=LR)
        model, opt = acc.prepare(model, opt)
    in_optimizer = {id(p) for group in opt.optimizer.param_groups for p in group["params"]}
    seen: dict[str, str] = {}

    def record(name: str) -> Any:
        def hook(module: Any, inputs: Any, output: Any) -> None:  # returns None: the output is left alone
            seen[name] = f"{inputs[0].dtype}->{output.dtype}"
        return hook

    hooks = [m.register_forward_hook(record(n)) for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
    x, y = data()
    losses = []
    for i in range(STEPS):
        loss = torch.nn.functional.mse_loss(model(x[i]), y[i])
        acc.backward(loss)
        opt.step()
        opt.zero_grad()
        losses.append(float(loss.detach()))
        for h in hooks:
            h.remove()
        hooks = []
    info = {"device": str(acc.device), "distributed_type": str(acc.distributed_type),
            "fp8_backend": str(acc.fp8_backend), "native_amp": acc.native_amp,
            "linears": linear_kinds(model), "linear_dtypes_in_forward": seen,
            "parameters_in_optimizer": {n: id(p) in in_optimizer for n, p in model.named_parameters()},
            "max_abs_change_after_training": {k: float((v.float() - initial[k]).abs().max())
                                              for k, v in model.state_dict().items()}}
    return losses, info


def max_rel(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) / abs(y) for x, y in zip(a, b))


def config_fields(config: Any) -> dict[str, str]:
    import dataclasses

    return {f.name: repr(getattr(config, f.name)) for f in dataclasses.fields(config)}


def import_times() -> dict[str, float]:
    code = ("import time, warnings; warnings.filterwarnings('ignore'); import torch; t = time.perf_counter(); "
            "import torchao; a = time.perf_counter(); import torchao.float8; b = time.perf_counter(); "
            "print(round(a - t, 2), round(b - t, 2))")
    runs = []
    for _ in range(3):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
        runs.append([float(v) for v in out.split()[-2:]])
    return {"import_torchao_s": min(r[0] for r in runs), "import_torchao_float8_s": min(r[1] for r in runs)}


def conversions() -> dict[str, Any]:
    from accelerate.utils import AORecipeKwargs
    from accelerate.utils.ao import (
        convert_model_to_fp8_ao,
        filter_first_and_last_linear_layers,
        filter_linear_layers,
        find_first_last_linear_layers,
    )
    from torchao.float8 import Float8LinearConfig

    found: dict[str, Any] = {}
    model = probe_model()
    found["probe_linears_before"] = linear_kinds(model)
    found["find_first_last_linear_layers"] = list(find_first_last_linear_layers(model))
    found["filter_linear_layers_on_probe"] = {
        name: filter_linear_layers(m, name, list(find_first_last_linear_layers(model)))
        for name, m in model.named_modules() if name}
    found["filter_first_and_last_linear_layers_on_probe"] = {
        name: filter_first_and_last_linear_layers(m, name) for name, m in model.named_modules() if name}
    convert_model_to_fp8_ao(model, config=AORecipeKwargs().config)
    found["convert_model_to_fp8_ao"] = linear_kinds(model)
    model = probe_model()
    convert_model_to_fp8_ao(model, config=AORecipeKwargs().config, module_filter_func=lambda m, fqn: True)
    found["convert_model_to_fp8_ao_filter_all"] = linear_kinds(model)
    found["aorecipe_default_config"] = config_fields(AORecipeKwargs().config)
    found["torchao_default_config"] = config_fields(Float8LinearConfig())
    found["aorecipe_fields"] = {k: repr(v) for k, v in vars(AORecipeKwargs()).items() if k != "config"}
    return found


def accelerator_prepare_probe() -> dict[str, Any]:
    import torch
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState
    from accelerate.utils import AORecipeKwargs

    found = {}
    for label, handlers in (("default", None), ("filter_all", [AORecipeKwargs(module_filter_func=lambda m, f: True)])):
        AcceleratorState._reset_state(True)
        acc = Accelerator(mixed_precision="fp8", kwargs_handlers=handlers)
        model = probe_model()
        model, _ = acc.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
        found[label] = linear_kinds(model)
        try:
            out = model(torch.randint(0, 32, (4, 8)))
            found[label + "_forward"] = f"OK {tuple(out.shape)} {out.dtype}"
        except Exception as e:  # noqa: BLE001 - recorded
            found[label + "_forward"] = f"{type(e).__name__}: {str(e)[:300]}"
    return found


def errors(no_torchao_python: str | None) -> dict[str, str]:
    probes = {
        "TERecipeKwargs()": "from accelerate.utils import TERecipeKwargs; TERecipeKwargs()",
        "MSAMPRecipeKwargs()": "from accelerate.utils import MSAMPRecipeKwargs; MSAMPRecipeKwargs()",
        "FP8RecipeKwargs(backend='te')": "from accelerate.utils import FP8RecipeKwargs; FP8RecipeKwargs(backend='te')",
        "FP8RecipeKwargs(backend='ao')": "from accelerate.utils import FP8RecipeKwargs; FP8RecipeKwargs(backend='ao')",
        "Accelerator(mixed_precision='fp8', kwargs_handlers=[TERecipeKwargs()])":
            "from accelerate import Accelerator; from accelerate.utils import TERecipeKwargs; "
            "a = Accelerator(mixed_precision='fp8', kwargs_handlers=[TERecipeKwargs()]); print('OK', a.fp8_backend)",
        "ACCELERATE_FP8_BACKEND=TE Accelerator(mixed_precision='fp8')":
            "import os; os.environ['ACCELERATE_FP8_BACKEND'] = 'TE'; from accelerate import Accelerator; "
            "a = Accelerator(mixed_precision='fp8'); print('OK', a.fp8_backend); import torch; "
            "a.prepare(torch.nn.Linear(16, 16), torch.optim.SGD(torch.nn.Linear(16, 16).parameters(), lr=0.1))",
        "Accelerator(kwargs_handlers=[AORecipeKwargs()]) without fp8":
            "from accelerate import Accelerator; from accelerate.utils import AORecipeKwargs; "
            "a = Accelerator(kwargs_handlers=[AORecipeKwargs()]); print('OK', a.fp8_backend)",
        "Accelerator(mixed_precision='fp8', cpu=True)":
            "from accelerate import Accelerator; a = Accelerator(mixed_precision='fp8', cpu=True); "
            "print('OK', a.fp8_backend, a.device, a.native_amp)",
        "lightning Trainer(precision='transformer-engine')":
            "from lightning.pytorch import Trainer; Trainer(precision='transformer-engine', logger=False)",
        "lightning TransformerEnginePrecision(weights_dtype=bf16)":
            "import torch; from lightning.pytorch.plugins import TransformerEnginePrecision; "
            "TransformerEnginePrecision(weights_dtype=torch.bfloat16)",
        "torch._scaled_mm on CPU": "import torch; print('OK', hasattr(torch, '_scaled_mm'))",
    }
    no_ao = {
        "no torchao: Accelerator(mixed_precision='fp8')":
            "from accelerate import Accelerator; a = Accelerator(mixed_precision='fp8'); print('OK', a.fp8_backend)",
        "no torchao: AORecipeKwargs()": "from accelerate.utils import AORecipeKwargs; AORecipeKwargs()",
        "no torchao: convert_model_to_fp8_ao":
            "import torch; from accelerate.utils.ao import convert_model_to_fp8_ao; "
            "convert_model_to_fp8_ao(torch.nn.Linear(16, 16))",
    }
    found = {}
    for python, table in ((sys.executable, probes), (no_torchao_python, no_ao)):
        if python is None:
            continue
        for name, code in table.items():
            wrapped = ("import warnings; warnings.filterwarnings('ignore')\ntry:\n    exec(" + repr(code) + ")\n"
                       "    print('OK (no error)')\n"
                       "except BaseException as e:\n    print('ERROR', type(e).__name__ + ': ' + str(e))\n")
            with tempfile.TemporaryDirectory() as workdir:
                proc = subprocess.run([python, "-c", wrapped], check=False, capture_output=True, text=True, cwd=workdir)
            lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(("ERROR", "OK"))]
            found[name] = lines[0] if lines else f"rc={proc.returncode} {proc.stderr[-300:]}"
    return found


def fsdp_worker(out: str) -> None:
    """2 ranks: the MLP converted with Accelerate's filter and config (fp8 all-gather on), fully_shard on the root,
    each rank half of every batch; the scales are precomputed after each step, as Accelerate registers it."""
    import torch
    import torch.distributed as dist
    from accelerate.utils import AORecipeKwargs
    from accelerate.utils.ao import convert_model_to_fp8_ao
    from torch.distributed.fsdp import fully_shard
    from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    config = AORecipeKwargs().config
    model = mlp()
    convert_model_to_fp8_ao(model, config=config)
    fully_shard(model)  # the root only, as Accelerate's default (NO_WRAP) does
    inner = {n: type(p._local_tensor).__name__ for n, p in model.named_parameters()}
    per = BATCH // world
    losses = train(model, lambda: precompute_float8_dynamic_scale_for_fsdp(model),
                   slice(rank * per, (rank + 1) * per))
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, losses)
    if rank == 0:
        with open(out, "w") as f:
            json.dump({"losses_per_rank": gathered, "local_tensor_types": inner,
                       "enable_fsdp_float8_all_gather": config.enable_fsdp_float8_all_gather}, f)
    dist.destroy_process_group()


def fsdp_run() -> dict[str, Any]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as workdir:
        out = os.path.join(workdir, "out.json")
        start = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2",
                               "--master-addr=127.0.0.1", f"--master-port={port}", __file__, "--fsdp-worker", out],
                              check=False, capture_output=True, text=True, timeout=600,
                              env={**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"})
        if proc.returncode != 0:
            return {"error": proc.stderr[-3000:]}
        with open(out) as f:
            result = json.load(f)
        result["wall_s"] = round(time.perf_counter() - start, 1)
    return result


def main(no_torchao_python: str | None) -> None:
    import accelerate
    import torch
    import torchao
    from accelerate.utils import AORecipeKwargs
    from accelerate.utils.ao import convert_model_to_fp8_ao
    from torchao.float8 import convert_to_float8_training

    torch.set_num_threads(1)
    # The training runs first: after the probes below ran their forwards, the same fp8 run gave a loss 1 ulp
    # apart at one step in this process (seen under the pinned kernel path), while a fresh process and Ember agree.
    fp32 = train(mlp())
    model = mlp()
    convert_model_to_fp8_ao(model, config=AORecipeKwargs().config)
    fp8_direct = train(model)
    model = mlp()
    convert_to_float8_training(model)  # torchao's own defaults: every Linear (all are multiples of 16 here)
    fp8_torchao_defaults = train(model)
    acc_fp8, acc_fp8_info = accelerate_train("fp8")
    acc_bf16, _ = accelerate_train("bf16")
    acc_fp8_after, acc_fp8_after_info = accelerate_train("fp8", optimizer_after_prepare=True)
    found: dict[str, Any] = {"versions": {"torchao": torchao.__version__, "accelerate": accelerate.__version__,
                                          "torch": torch.__version__},
                             "import_times": import_times(), **conversions(),
                             "accelerator_prepare_probe": accelerator_prepare_probe()}
    found["training"] = {
        "steps": STEPS, "lr": LR, "batch": BATCH, "model": "Linear(32,64) ReLU Linear(64,64) ReLU Linear(64,64) ReLU "
                                                            "Linear(64,16), AdamW, mse on sin(2x[:16]) + 0.1x[16:]",
        "fp32": fp32, "fp8_torchao_accelerate_filter": fp8_direct, "fp8_torchao_defaults_all_linears":
            fp8_torchao_defaults, "accelerator_fp8": acc_fp8, "accelerator_bf16": acc_bf16,
        "accelerator_fp8_info": acc_fp8_info,
        "accelerator_fp8_optimizer_after_prepare": acc_fp8_after,
        "accelerator_fp8_optimizer_after_prepare_info": acc_fp8_after_info,
        "max_rel_diff_vs_fp32": {"fp8_torchao_accelerate_filter": max_rel(fp8_direct, fp32),
                                 "fp8_torchao_defaults_all_linears": max_rel(fp8_torchao_defaults, fp32),
                                 "accelerator_fp8": max_rel(acc_fp8, fp32),
                                 "accelerator_fp8_optimizer_after_prepare": max_rel(acc_fp8_after, fp32),
                                 "accelerator_bf16": max_rel(acc_bf16, fp32)},
        "accelerator_fp8_vs_bf16_max_rel": max_rel(acc_fp8, acc_bf16),
    }
    fsdp = fsdp_run()
    if "losses_per_rank" in fsdp:
        mean = [sum(v) / len(v) for v in zip(*fsdp["losses_per_rank"])]
        fsdp["mean_losses"] = mean
        fsdp["max_abs_diff_vs_single_process_fp8"] = max(abs(a - b) for a, b in zip(mean, fp8_direct))
        fsdp["max_rel_diff_vs_fp32"] = max_rel(mean, fp32)
    found["fsdp2_fp8_all_gather_2_processes"] = fsdp
    found["errors"] = errors(no_torchao_python)
    with open(OUT, "w") as f:
        f.write(f'"""Observed from torchao {torchao.__version__} and accelerate {accelerate.__version__} '
                f'(torch {torch.__version__}, CPU) by tests/parity_scripts/record_fp8.py under the pinned CPU kernel path of tests/kernel_path.py; do not edit."""\n\n')
        f.write(f"EXPECTED = {pprint.pformat(found, width=116, sort_dicts=False)}\n")
    print("wrote", OUT)


if __name__ == "__main__":
    warnings.filterwarnings("ignore")
    if len(sys.argv) > 2 and sys.argv[1] == "--fsdp-worker":
        fsdp_worker(sys.argv[2])
    else:
        args = sys.argv[1:]
        main(args[args.index("--no-torchao-python") + 1] if "--no-torchao-python" in args else None)
