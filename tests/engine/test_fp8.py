"""fp8 training through torchao (``Accelerator(mixed_precision="fp8")``, ``AORecipeKwargs``), in one process.

Compared with what Accelerate 1.15 + torchao 0.18 did on this CPU (tests/distributed/fp8_expected.py, recorded by
tests/parity_scripts/record_fp8.py): which Linear layers are converted, the recipe's config, and the losses of the
same MLP, bitwise (one thread: the recording's). The models below are the recorder's, unchanged.

Two differences are tested as such: Ember points an optimizer built before ``prepare`` at the converted weights
(Accelerate's leaves them out, so those layers never train: recorded), and TransformerEngine / MS-AMP are refused
with a message naming torchao. The 2-process FSDP2 test is in tests/distributed/test_fp8_fsdp.py.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from engine import Accelerator, AutocastKwargs, DeepSpeedPlugin
from engine.imports import is_torchao_available
from engine.precision.fp8 import FP8RecipeKwargs, MSAMPRecipeKwargs, TERecipeKwargs
from tests.distributed.fp8_expected import EXPECTED
from tests.kernel_path import FP8_PINNED, cpu_runs_fp8_training

ROOT = Path(__file__).resolve().parents[2]
needs_torchao = pytest.mark.skipif(not is_torchao_available(), reason='needs torchao: pip install "ember-train[fp8]"')
# torch's CPU fp8 training kernels (oneDNN) need AVX512-FP16; the tests that train run in a child process with
# oneDNN capped there (tests/kernel_path.py: FP8_PINNED), as the recording was made.
needs_fp8_kernels = pytest.mark.skipif(not cpu_runs_fp8_training(),
                                       reason="torch's CPU fp8 training kernels need AVX512-FP16, which this CPU lacks")
STEPS, LR, BATCH = 12, 1e-2, 16


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    # The recording ran on one thread; matrix products split across threads sum in another order.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def probe_model() -> nn.Module:
    """Registration order head, embed, inp, blocks, odd, odd_in, tail; call order embed ... tail, head."""

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


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                         nn.Linear(64, 16))


def data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(STEPS, BATCH, 32, generator=g)
    return x, torch.sin(x[..., :16] * 2) + 0.1 * x[..., 16:]


def linear_kinds(model: nn.Module) -> dict[str, str]:
    return {name: type(m).__name__ for name, m in model.named_modules() if isinstance(m, nn.Linear)}


def train(acc: Accelerator, steps: range = range(STEPS), state: str | None = None,
          save: str | None = None) -> tuple[list[float], nn.Module]:
    """The recorder's loop (AdamW built before prepare, the usual order) under ``acc``; loads / saves a state."""
    model = mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    model, opt = acc.prepare(model, opt)
    if state is not None:
        acc.load_state(state)
    x, y = data()
    losses = []
    for i in steps:
        loss = nn.functional.mse_loss(model(x[i]), y[i])
        acc.backward(loss)
        opt.step()
        opt.zero_grad()
        losses.append(float(loss.detach()))
    if save is not None:
        acc.save_state(save)
    return losses, model


def max_rel(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) / abs(y) for x, y in zip(a, b))


@needs_torchao
@needs_fp8_kernels
def test_prepare_converts_the_layers_accelerate_converts(run_distributed: Any) -> None:
    run_distributed(prepare_converts_the_layers_accelerate_converts, 1, env=FP8_PINNED, launch_env=False)


def prepare_converts_the_layers_accelerate_converts() -> None:
    acc = Accelerator(mixed_precision="fp8")
    model, _ = acc.prepare(probe := probe_model(), torch.optim.SGD(probe.parameters(), lr=0.1))
    # First and last *registered* Linear kept (head although it is called last, tail), 24-wide ones kept.
    assert linear_kinds(model) == EXPECTED["accelerator_prepare_probe"]["default"]
    out = model(torch.randint(0, 32, (4, 8)))
    assert f"OK {tuple(out.shape)} {out.dtype}" == EXPECTED["accelerator_prepare_probe"]["default_forward"]
    assert acc.native_amp and acc.fp8.enabled and acc.fp8.backend.value == "AO"
    acc.fp8.convert(model)  # a second conversion (a model prepared again) changes nothing
    assert linear_kinds(model) == EXPECTED["accelerator_prepare_probe"]["default"]
    assert type(model.inp.weight._tensor) is nn.Parameter  # wrapped once for the float8 all-gather, not twice


@needs_torchao
@needs_fp8_kernels
def test_a_module_filter_replaces_the_whole_rule(run_distributed: Any) -> None:
    run_distributed(a_module_filter_replaces_the_whole_rule, 1, env=FP8_PINNED, launch_env=False)


def a_module_filter_replaces_the_whole_rule() -> None:
    from engine.precision.fp8 import AORecipeKwargs

    acc = Accelerator(mixed_precision="fp8", kwargs_handlers=[AORecipeKwargs(module_filter_func=lambda m, f: True)])
    model = acc.prepare(probe_model())
    assert linear_kinds(model) == EXPECTED["accelerator_prepare_probe"]["filter_all"]
    out = model(torch.randint(0, 32, (4, 8)))  # the 24-wide layers run: pad_inner_dim is on
    assert f"OK {tuple(out.shape)} {out.dtype}" == EXPECTED["accelerator_prepare_probe"]["filter_all_forward"]


@needs_torchao
def test_recipe_config_and_environment_are_accelerates(monkeypatch: pytest.MonkeyPatch) -> None:
    import dataclasses

    from engine.precision.fp8 import AORecipeKwargs

    recipe = AORecipeKwargs()
    assert {f.name: repr(getattr(recipe.config, f.name)) for f in dataclasses.fields(recipe.config)} == \
        EXPECTED["aorecipe_default_config"]
    assert {k: repr(v) for k, v in vars(recipe).items() if k != "config"} == EXPECTED["aorecipe_fields"]
    monkeypatch.setenv("ACCELERATE_FP8_PAD_INNER_DIM", "false")
    monkeypatch.setenv("ACCELERATE_FP8_ENABLE_FSDP_FLOAT8_ALL_GATHER", "0")
    assert (AORecipeKwargs().config.pad_inner_dim, AORecipeKwargs().config.enable_fsdp_float8_all_gather) == \
        (False, False)
    assert AORecipeKwargs(pad_inner_dim=True).config.pad_inner_dim is True  # the keyword wins
    monkeypatch.setenv("ACCELERATE_FP8_PAD_INNER_DIM", "maybe")
    with pytest.raises(ValueError, match="ACCELERATE_FP8_PAD_INNER_DIM='maybe' is not a truth value"):
        AORecipeKwargs()
    with pytest.raises(TypeError, match="Float8LinearConfig. Received: dict"):
        AORecipeKwargs(config={})


@needs_torchao
@needs_fp8_kernels
@pytest.mark.recorded_bits
def test_losses_equal_accelerates_and_every_layer_trains(run_distributed: Any) -> None:
    run_distributed(losses_equal_accelerates_and_every_layer_trains, 1, env=FP8_PINNED, launch_env=False)


def losses_equal_accelerates_and_every_layer_trains() -> None:
    acc = Accelerator(mixed_precision="fp8")
    losses, model = train(acc)
    # Accelerate's fp8 run with the optimizer built from the prepared model: bitwise the same.
    recorded = EXPECTED["training"]
    assert losses == recorded["accelerator_fp8_optimizer_after_prepare"]
    assert linear_kinds(model) == recorded["accelerator_fp8_info"]["linears"]
    # Built before prepare (the order used here) Accelerate's optimizer missed the converted weights; Ember's not.
    assert recorded["accelerator_fp8_info"]["max_abs_change_after_training"]["2.weight"] == 0.0
    initial = mlp().state_dict()
    assert all(not torch.equal(value, initial[name]) for name, value in acc.get_state_dict(model).items())
    seen: dict[str, str] = {}

    def record(name: str) -> Any:
        def hook(module: nn.Module, inputs: Any, output: torch.Tensor) -> None:  # None: the output is kept
            seen[name] = f"{inputs[0].dtype}->{output.dtype}"
        return hook

    for name, layer in model.named_modules():
        if isinstance(layer, nn.Linear):  # inside the bf16 autocast: fp32 in at the first layer, bf16 after
            layer.register_forward_hook(record(name))
    assert model(data()[0][0]).dtype == torch.float32
    assert seen == recorded["accelerator_fp8_info"]["linear_dtypes_in_forward"]
    # fp8 against fp32, per step count: within 1e-3 at the first step, 1e-2 over the 12 (measured 6.4e-3).
    assert max_rel(losses[:1], recorded["fp32"][:1]) < 1e-3
    assert max_rel(losses, recorded["fp32"]) < 1e-2


@needs_torchao
@needs_fp8_kernels
@pytest.mark.recorded_bits
def test_without_the_autocast_it_is_torchao_alone(run_distributed: Any) -> None:
    run_distributed(without_the_autocast_it_is_torchao_alone, 1, env=FP8_PINNED, launch_env=False)


def without_the_autocast_it_is_torchao_alone() -> None:
    acc = Accelerator(mixed_precision="fp8", kwargs_handlers=[AutocastKwargs(enabled=False)])
    losses, _ = train(acc)
    assert losses == EXPECTED["training"]["fp8_torchao_accelerate_filter"]


@needs_torchao
@needs_fp8_kernels
def test_resume_is_exact(run_distributed: Any, tmp_path: Path) -> None:
    run_distributed(resume_is_exact, 1, tmp_path, env=FP8_PINNED, launch_env=False)


def resume_is_exact(tmp_path: Path) -> None:
    from engine.state import AcceleratorState, GradientState

    def fresh() -> Accelerator:
        AcceleratorState._reset_state(True)
        GradientState._reset_state()
        return Accelerator(mixed_precision="fp8")

    whole, _ = train(fresh())
    train(fresh(), range(6), save=str(tmp_path / "ckpt"))
    second, model = train(fresh(), range(6, STEPS), state=str(tmp_path / "ckpt"))
    assert second == whole[6:]
    assert isinstance(model.state_dict()["2.weight"], torch.Tensor)  # plain tensors in files, not torchao's wrapper
    assert type(model.state_dict()["2.weight"]) is torch.Tensor


@needs_torchao
def test_an_optimizer_that_stepped_before_prepare_is_refused() -> None:
    model = mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    model(torch.randn(2, 32)).sum().backward()
    opt.step()
    acc = Accelerator(mixed_precision="fp8")
    with pytest.raises(ValueError, match="already holds state .* '2.weight'"):
        acc.prepare(model, opt)


@needs_torchao
def test_a_model_with_nothing_to_convert_warns() -> None:
    with pytest.warns(UserWarning, match="converted no Linear layer of Sequential"):
        Accelerator(mixed_precision="fp8").prepare(nn.Sequential(nn.Linear(16, 16), nn.Linear(16, 16)))


@needs_torchao
def test_fp8_recipe_needs_fp8() -> None:
    from engine.precision.fp8 import AORecipeKwargs

    with pytest.raises(ValueError, match=r"requires setting `mixed_precision='fp8'`. Received: mixed_precision='no'"):
        Accelerator(kwargs_handlers=[AORecipeKwargs()])


_TE = r"TransformerEngine fp8 \(TERecipeKwargs\) is not supported by Ember: it is a GPU-only package. Ember trains in fp8 "
_FP8_AO = r"`backend` must be 'MSAMP' or 'TE' \(TransformerEngine\) to use `FP8RecipeKwargs`. Received: 'ao'. For torchao"


@pytest.mark.parametrize(("make", "error", "message"), [
    (TERecipeKwargs, ImportError, _TE + "through torchao"),
    (MSAMPRecipeKwargs, ImportError, r"MS-AMP fp8 \(MSAMPRecipeKwargs\) is not supported .* through torchao"),
    (lambda: FP8RecipeKwargs(backend="te"), ImportError, r"TransformerEngine fp8 \(FP8RecipeKwargs\(backend='te'\)\)"),
    (lambda: FP8RecipeKwargs(backend="ao"), ValueError, _FP8_AO),
    (lambda: Accelerator(deepspeed_plugin=DeepSpeedPlugin(), mixed_precision="fp8"), ValueError,
     "fp8' is not supported with DeepSpeed"),
])
def test_other_fp8_backends_are_refused_naming_torchao(make: Any, error: type, message: str,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("engine.precision.fp8.is_torchao_available", lambda version="": True)  # refused either way
    with pytest.raises(error, match=message):
        make()


@needs_torchao
@pytest.mark.parametrize(("backend", "error", "message"), [
    ("TE", ImportError, r"ACCELERATE_FP8_BACKEND='TE' \(TransformerEngine\) is not supported by Ember"),
    ("MSAMP", ImportError, r"ACCELERATE_FP8_BACKEND='MSAMP' \(MS-AMP\) is not supported"),
    ("XX", ValueError, "ACCELERATE_FP8_BACKEND='XX' is not a known fp8 backend: use 'AO'"),
])
def test_fp8_backend_variable(backend: str, error: type, message: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACCELERATE_FP8_BACKEND", backend)
    with pytest.raises(error, match=message):
        Accelerator(mixed_precision="fp8")
    monkeypatch.setenv("ACCELERATE_FP8_BACKEND", "AO")
    assert Accelerator(mixed_precision="fp8").fp8.enabled


def test_without_torchao_fp8_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("engine.precision.fp8.is_torchao_available", lambda version="": False)
    extra = r"torchao >= 0.6.1, which is not installed: pip install \"ember-train\[fp8\]\""
    with pytest.raises(ImportError, match=extra):
        Accelerator(mixed_precision="fp8")
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "fp8")
    with pytest.raises(ImportError, match=extra):
        Accelerator()
    from engine.precision.fp8 import AORecipeKwargs

    with pytest.raises(ImportError, match=extra):
        AORecipeKwargs()


def test_import_engine_does_not_import_torchao() -> None:
    code = "import sys, engine, engine.utils; engine.Accelerator(cpu=True); print('torchao' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"
