"""Single-process engine core: state fields, precision, optimizer/scheduler wrappers, bad input (ENGINE.md 1, 2, 4, 7)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from engine import (
    AcceleratedOptimizer,
    Accelerator,
    AcceleratorState,
    DataLoaderConfiguration,
    DistributedType,
    GradientAccumulationPlugin,
    GradientState,
    GradScalerKwargs,
    PartialState,
    ProjectConfiguration,
)


def test_partial_state_single_process_fields_and_repr() -> None:
    state = PartialState()
    assert (state.num_processes, state.process_index, state.local_process_index) == (1, 0, 0)
    assert state.distributed_type == DistributedType.NO and state.backend is None
    assert state.is_main_process and state.is_local_main_process and state.is_last_process
    assert not state.use_distributed
    assert repr(state) == ("Distributed environment: DistributedType.NO\nNum processes: 1\nProcess index: 0\n"
                           "Local process index: 0\nDevice: cpu\n")
    assert str(DistributedType.MULTI_CPU) == "DistributedType.MULTI_CPU"
    assert PartialState() .device == state.device  # all instances share one record


def test_reset_state_makes_reads_fail_with_the_fix() -> None:
    state = PartialState()
    PartialState._reset_state()
    with pytest.raises(AttributeError, match=r"PartialState._reset_state\(\)"):
        _ = state.device


def test_accelerator_state_rules() -> None:
    with pytest.raises(ValueError, match="accelerator = Accelerator()"):
        AcceleratorState()
    accelerator = Accelerator(mixed_precision="bf16")
    assert AcceleratorState().mixed_precision == "bf16"
    assert Accelerator().state.mixed_precision == "bf16"  # a second Accelerator shares the state
    with pytest.raises(ValueError, match="already been initialized"):
        Accelerator(mixed_precision="fp16")
    assert accelerator.mixed_precision == "bf16"


def test_accelerator_attributes() -> None:
    acc = Accelerator(project_dir="/tmp/ember-x")
    assert acc.device == torch.device("cpu") and acc.distributed_type == DistributedType.NO
    assert (acc.num_processes, acc.process_index, acc.local_process_index) == (1, 0, 0)
    assert acc.is_main_process and acc.is_local_main_process and acc.is_last_process
    assert acc.mixed_precision == "no" and not acc.use_distributed and acc.sync_gradients
    assert not acc.optimizer_step_was_skipped and acc.gradient_accumulation_steps == 1 and acc.step == 0
    assert acc.project_dir == "/tmp/ember-x" and acc.logging_dir == "/tmp/ember-x"


def test_env_overrides(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACCELERATE_GRADIENT_ACCUMULATION_STEPS", "4")
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "bf16")
    acc = Accelerator(gradient_accumulation_steps=2)
    assert acc.gradient_accumulation_steps == 4 and acc.mixed_precision == "bf16"


def test_bad_arguments_name_the_value() -> None:
    with pytest.raises(ValueError, match="'fp32'"):
        Accelerator(mixed_precision="fp32")
    with pytest.raises(NotImplementedError, match=r"DDP, FSDP2 \(FullyShardedDataParallelPlugin\) and DeepSpeed"):
        Accelerator(megatron_lm_plugin=object())
    with pytest.raises(TypeError, match="takes an engine.DeepSpeedPlugin. Received: object"):
        Accelerator(deepspeed_plugin=object())
    with pytest.raises(ValueError, match="gradient_accumulation_steps=2"):
        Accelerator(gradient_accumulation_steps=2, gradient_accumulation_plugin=GradientAccumulationPlugin(3))
    with pytest.raises(ValueError, match="num_steps"):
        GradientAccumulationPlugin(num_steps=0)
    with pytest.raises(ValueError, match="split_batches"):
        Accelerator(split_batches=False, dataloader_config=DataLoaderConfiguration(split_batches=True))
    with pytest.raises(ValueError, match="only pass one GradScalerKwargs"):
        Accelerator(kwargs_handlers=[GradScalerKwargs(), GradScalerKwargs(init_scale=2.0)])
    with pytest.raises(ValueError, match="total_limit"):
        ProjectConfiguration(total_limit=0)
    acc = Accelerator()
    other = {"not": "preparable"}
    assert acc.prepare(other) is other and acc.prepare(torch.nn.Linear(1, 1), None)[1] is None  # as Accelerate
    with pytest.raises(TypeError, match="TensorDataset.*wrap it in a torch.utils.data.DataLoader"):
        acc.prepare(torch.utils.data.TensorDataset(torch.zeros(2)))
    with pytest.raises(TypeError, match="list holding models.*separate arguments"):
        acc.prepare([torch.nn.Linear(1, 1), torch.nn.Linear(1, 1)])
    with pytest.raises(ValueError, match="device_placement"):
        acc.prepare(torch.nn.Linear(1, 1), device_placement=[True, False])
    with pytest.raises(NotImplementedError, match="not supported"):
        acc.lomo_backward(torch.tensor(1.0), 0.1)


def test_conflicting_split_batches_settings_raise_naming_both() -> None:
    with pytest.raises(ValueError, match=r"split_batches=True.*DataLoaderConfiguration\(split_batches=False\)"):
        Accelerator(split_batches=True, dataloader_config=DataLoaderConfiguration(split_batches=False))
    with pytest.raises(ValueError, match=r"dispatch_batches=False.*dispatch_batches=True"):
        Accelerator(dispatch_batches=False, dataloader_config=DataLoaderConfiguration(dispatch_batches=True))
    agreed = Accelerator(split_batches=True, dataloader_config=DataLoaderConfiguration(split_batches=True))
    assert agreed.split_batches is True


def test_split_batches_keyword_is_honoured() -> None:
    assert Accelerator(split_batches=True).split_batches is True
    GradientState._reset_state()
    AcceleratorState._reset_state(True)
    assert Accelerator(dataloader_config=DataLoaderConfiguration(split_batches=True)).split_batches is True


def test_gradient_accumulation_plugin_adjust_scheduler_default_takes_effect() -> None:
    acc = Accelerator(gradient_accumulation_plugin=GradientAccumulationPlugin(num_steps=2))
    assert acc.gradient_state.adjust_scheduler is True
    assert acc.gradient_state.num_steps == 2
    acc.gradient_accumulation_steps = 5
    assert acc.gradient_state.num_steps == 5


def test_prepare_order_and_types_and_idempotence() -> None:
    acc = Accelerator()
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, 1)
    p_sched, p_model, p_opt = acc.prepare(sched, model, opt)  # scheduler first still finds the wrapped optimizer
    assert isinstance(p_opt, AcceleratedOptimizer) and isinstance(p_opt, torch.optim.Optimizer)
    assert p_sched.optimizers == [p_opt]
    assert acc.prepare(p_model) is p_model and acc.prepare(p_opt) is p_opt
    assert len(acc._models) == 1 and len(acc._optimizers) == 1 and len(acc._schedulers) == 1
    assert p_opt.param_groups is opt.param_groups and p_opt.state_dict()["param_groups"][0]["lr"] == 0.1


@pytest.mark.parametrize("precision, dtype", [("bf16", torch.bfloat16), ("fp16", torch.float16)])
def test_mixed_precision_dtypes_on_cpu(precision: str, dtype: torch.dtype) -> None:
    acc = Accelerator(mixed_precision=precision)
    seen: list[torch.dtype] = []
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    model[0].register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    model = acc.prepare(model)
    out = model(torch.randn(3, 4))
    assert seen == [dtype] and out.dtype == torch.float32
    assert all(p.dtype == torch.float32 for p in model.parameters())
    with acc.autocast():
        assert torch.nn.functional.linear(torch.randn(2, 2), torch.randn(2, 2)).dtype == dtype
    assert (acc.scaler is not None) == (precision == "fp16")
    bare = acc.unwrap_model(model, keep_fp32_wrapper=False)
    assert bare(torch.randn(3, 4)).dtype == torch.float32 and "_original_forward" not in bare.__dict__
    seen.clear()
    bare(torch.randn(3, 4))
    assert seen == [torch.float32]


def test_fp16_scaler_skip_on_cpu() -> None:
    """ENGINE.md 2.2: CPU GradScaler, init_scale=4, inf grads: skipped, weights unchanged, scale 4 -> 2, no scheduler step."""
    acc = Accelerator(mixed_precision="fp16", kwargs_handlers=[GradScalerKwargs(init_scale=4.0)])
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda e: 1 / (1 + e))
    model, opt, sched = acc.prepare(model, opt, sched)
    before = [p.detach().clone() for p in model.parameters()]
    loss = model(torch.randn(4, 2)).sum()
    acc.backward(loss)
    for p in model.parameters():
        p.grad.fill_(float("inf"))
    opt.step()
    sched.step()
    assert opt.step_was_skipped and acc.optimizer_step_was_skipped
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert acc.scaler.get_scale() == 2.0
    assert sched.scheduler.last_epoch == 0
    # a finite step goes through and is not reported as skipped
    opt.zero_grad()
    acc.backward(model(torch.randn(4, 2)).sum())
    opt.step()
    sched.step()
    assert not opt.step_was_skipped and sched.scheduler.last_epoch == 1
    assert not all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_backward_divides_by_accumulation_steps() -> None:
    acc = Accelerator(gradient_accumulation_steps=4)
    w = torch.nn.Parameter(torch.tensor(1.0))
    acc.backward(w * 8.0)
    assert w.grad.item() == 2.0


def test_optimizer_skips_while_accumulating() -> None:
    acc = Accelerator(gradient_accumulation_steps=2)
    model = torch.nn.Linear(1, 1)
    opt = acc.prepare(torch.optim.SGD(model.parameters(), lr=1.0))
    with acc.accumulate(model):
        acc.backward(model(torch.ones(1, 1)).sum())
        opt.step()
        opt.zero_grad()
    assert not acc.sync_gradients and model.weight.grad is not None  # nothing stepped or zeroed
    w = model.weight.detach().clone()
    with acc.accumulate(model):
        acc.backward(model(torch.ones(1, 1)).sum())
        opt.step()
        opt.zero_grad()
    assert acc.sync_gradients and model.weight.grad is None and not torch.equal(w, model.weight)


def test_zero_grad_set_to_none_on_optimizer_without_it() -> None:
    class Plain(torch.optim.Optimizer):
        def __init__(self, params):
            super().__init__(params, {})

        def zero_grad(self) -> None:  # type: ignore[override]
            for g in self.param_groups:
                for p in g["params"]:
                    p.grad = None

        def step(self, closure=None):
            return None

    acc = Accelerator()
    opt = acc.prepare(Plain(torch.nn.Linear(1, 1).parameters()))
    opt.zero_grad()
    with pytest.raises(ValueError, match="set_to_none=False"):
        opt.zero_grad(set_to_none=False)


def test_clip_grad_norm_and_value() -> None:
    acc = Accelerator()
    model = torch.nn.Linear(2, 1, bias=False)
    model.weight.grad = torch.tensor([[3.0, 4.0]])
    norm = acc.clip_grad_norm_(model.parameters(), max_norm=1.0)
    assert norm.item() == pytest.approx(5.0) and model.weight.grad.norm().item() == pytest.approx(1.0, rel=1e-5)
    model.weight.grad = torch.tensor([[3.0, -4.0]])
    acc.clip_grad_value_(model.parameters(), 0.5)
    assert model.weight.grad.tolist() == [[0.5, -0.5]]


def test_single_process_collectives_and_control() -> None:
    acc = Accelerator()
    t0 = torch.tensor(3.0)
    assert acc.gather(t0) is t0 and acc.gather("not a tensor") == "not a tensor"
    assert torch.equal(acc.reduce(torch.tensor([1, 10])), torch.tensor([1, 10]))
    assert torch.equal(acc.reduce(torch.tensor([1, 10]), "mean"), torch.tensor([1, 10]))  # int mean ok in 1 process
    assert acc.check_trigger() is False
    acc.set_trigger()
    assert acc.check_trigger() is True and acc.check_trigger() is False
    with acc.split_between_processes(["A", "B", "C"]) as part:
        assert part == ["A", "B", "C"]
    calls = [acc.on_main_process(lambda: "main")(), acc.on_last_process(lambda: "last")(),
             acc.on_process(lambda: "p1", process_index=1)()]
    assert calls == ["main", "last", "p1"]  # not distributed: every process runs everything
    assert acc.free_memory(1, 2) == [None, None] and acc.step == 0


def test_free_memory_keeps_custom_objects() -> None:
    acc = Accelerator()
    acc.prepare(torch.nn.Linear(1, 1))
    sched_like = torch.optim.lr_scheduler.StepLR(torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1), 1)
    acc.register_for_checkpointing(sched_like)
    acc.step = 3
    acc.free_memory()
    assert acc._models == [] and acc._custom_objects == [sched_like] and acc.step == 0
    with pytest.raises(ValueError, match="item at index 0, `int`"):
        acc.register_for_checkpointing(5)


def test_import_engine_is_lean() -> None:
    """`import engine` adds none of the optional packages (torch itself imports tqdm through torch.hub)."""
    code = ("import sys, torch; before = set(sys.modules); import engine; added = set(sys.modules) - before; "
            "bad = [m for m in ('tensorboard', 'wandb', 'comet_ml', 'tqdm', 'trainer', 'callbacks') if m in added]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)
