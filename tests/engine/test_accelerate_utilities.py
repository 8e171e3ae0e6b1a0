"""get_logger, find_executable_batch_size, ProfileKwargs / Accelerator.profile and LocalSGD on one process."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch

from engine import Accelerator, PartialState
from engine.local_sgd import LocalSGD
from engine.logging import get_logger
from engine.memory.batch_size import find_executable_batch_size, should_reduce_batch_size
from engine.utils import ProfileKwargs, is_schedulefree_available


# -- get_logger ------------------------------------------------------------------------------------------------
def test_logger_prefixes_the_rank_and_takes_the_multi_process_keywords(caplog: pytest.LogCaptureFixture) -> None:
    PartialState()
    logger = get_logger("ember.test.logger", log_level="DEBUG")
    with caplog.at_level(logging.DEBUG, logger="ember.test.logger"):
        logger.debug("one %d", 1)
        logger.info("all", main_process_only=False)
        logger.warning("ordered", in_order=True)
        logger.warning_once("once")
        logger.warning_once("once")
    assert [r.getMessage() for r in caplog.records] == ["[RANK 0] one 1", "[RANK 0] all", "[RANK 0] ordered",
                                                        "[RANK 0] once"]
    assert caplog.records[0].filename == Path(__file__).name  # the caller's line, not the adapter's
    assert logging.getLogger("ember.test.logger").level == logging.DEBUG


def test_logger_level_from_the_environment_and_bad_levels(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACCELERATE_LOG_LEVEL", "error")
    root_level = logging.getLogger().level
    assert get_logger("ember.test.env").logger.level == logging.ERROR
    assert logging.getLogger().level == root_level  # unlike Accelerate, the root logger is left alone
    with pytest.raises(ValueError, match="log_level='loud'.*DEBUG"):
        get_logger("ember.test.bad", log_level="loud")


def test_logging_before_any_state_is_an_error() -> None:
    with pytest.raises(RuntimeError, match="create the Accelerator"):
        get_logger("ember.test.early").info("too early")


# -- find_executable_batch_size --------------------------------------------------------------------------------
@pytest.mark.parametrize("error", [torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB"),
                                   MemoryError(), RuntimeError("DefaultCPUAllocator: can't allocate memory: 8 GB"),
                                   RuntimeError("MPS backend out of memory (MPS allocated: 1 GB)"),
                                   RuntimeError("cuDNN error: CUDNN_STATUS_NOT_SUPPORTED. This error may ...")])
def test_batch_size_shrinks_on_each_kind_of_out_of_memory(error: BaseException) -> None:
    tried: list[int] = []

    @find_executable_batch_size(starting_batch_size=128)
    def train(batch_size: int, scale: int) -> int:
        tried.append(batch_size)
        if batch_size > 110:
            raise error
        return batch_size * scale

    assert train(2) == 206 and tried == [128, 115, 103]  # x0.9, rounded down, as Accelerate 1.15
    assert train(1) == 103 and tried[-1] == 103  # the size that worked is kept for the next call
    assert train.batch_size == 103


def test_other_errors_propagate_and_zero_is_an_error() -> None:
    @find_executable_batch_size(starting_batch_size=4)
    def broken(batch_size: int) -> None:
        raise ValueError("a bug, not memory")

    with pytest.raises(ValueError, match="a bug"):
        broken()

    @find_executable_batch_size(starting_batch_size=3)
    def never_fits(batch_size: int) -> None:
        raise MemoryError

    with pytest.raises(RuntimeError, match="No executable batch size found.*from 3 down"):
        never_fits()
    assert not should_reduce_batch_size(RuntimeError("shape mismatch")) and not should_reduce_batch_size(KeyError())


def test_passing_the_batch_size_yourself_and_a_custom_reduction() -> None:
    @find_executable_batch_size
    def train(batch_size: int, lr: float) -> int:
        return batch_size

    with pytest.raises(TypeError, match=r"Batch size was passed into `train`.*train\(lr=0.1\)"):
        train(64, 0.1)
    sizes = iter([40, 20])

    @find_executable_batch_size(starting_batch_size=80, reduce_batch_size_fn=lambda: next(sizes))
    def halving(batch_size: int) -> int:
        if batch_size > 20:
            raise torch.OutOfMemoryError("CUDA out of memory.")
        return batch_size

    assert halving() == 20
    with pytest.raises(ValueError, match="starting_batch_size.*got 0"):
        find_executable_batch_size(lambda batch_size: None, starting_batch_size=0)


# -- profiler --------------------------------------------------------------------------------------------------
def test_profile_records_with_the_accelerators_settings_and_writes_a_trace(tmp_path: Path) -> None:
    kwargs = ProfileKwargs(activities=["cpu"], record_shapes=True, with_flops=True,
                           output_trace_dir=str(tmp_path / "traces"))
    accelerator = Accelerator(cpu=True, kwargs_handlers=[kwargs])
    assert accelerator.profile_handler is kwargs
    with accelerator.profile() as prof:
        torch.nn.functional.linear(torch.ones(4, 8), torch.ones(3, 8), torch.ones(3))
    averages = {e.key: e for e in prof.key_averages()}
    assert averages["aten::addmm"].flops == 2 * 4 * 8 * 3
    assert any(e.input_shapes for e in prof.key_averages(group_by_input_shape=True))
    trace = json.loads((tmp_path / "traces" / "profile_0.json").read_text())
    assert any(event.get("name") == "aten::addmm" for event in trace["traceEvents"])


def test_profile_forwards_every_switch_and_the_schedule() -> None:
    ready: list[int] = []
    handler = ProfileKwargs(schedule_option={"wait": 1, "warmup": 1, "active": 2, "repeat": 1},
                            on_trace_ready=lambda p: ready.append(p.step_num), profile_memory=True,
                            with_stack=True, with_modules=True)
    built = handler.build()
    assert (built.profile_memory, built.with_stack, built.with_modules, built.record_shapes) == (True, True, True,
                                                                                                  False)
    accelerator = Accelerator(cpu=True)
    with accelerator.profile(handler) as prof:  # a handler given here overrides the Accelerator's (none)
        for _ in range(6):
            torch.ones(2, 2).sum()
            prof.step()
    assert ready == [4]  # wait 1, warm up 1, record 2: ready after step 4, once


def test_profile_kwargs_are_checked_on_construction() -> None:
    with pytest.raises(ValueError, match=r"\['tpu'\] cannot be profiled here; choose among"):
        ProfileKwargs(activities=["cpu", "tpu"])
    with pytest.raises(ValueError, match="activities=\\['cpu'\\]"):
        ProfileKwargs(activities="cpu")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['warm_up'\]"):
        ProfileKwargs(schedule_option={"warm_up": 1, "active": 1})
    with pytest.raises(ValueError, match="only pass one ProfileKwargs"):
        Accelerator(cpu=True, kwargs_handlers=[ProfileKwargs(), ProfileKwargs(record_shapes=True)])


# -- LocalSGD and utils ----------------------------------------------------------------------------------------
def test_local_sgd_is_a_no_op_on_one_process() -> None:
    accelerator = Accelerator(cpu=True)
    model = accelerator.prepare(torch.nn.Linear(2, 1))
    before = [p.detach().clone() for p in model.parameters()]
    with LocalSGD(accelerator=accelerator, model=model, local_sgd_steps=1) as local_sgd:
        local_sgd.step()
    assert not local_sgd.enabled and local_sgd.num_steps == 1
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    with pytest.raises(ValueError, match="local_sgd_steps.*got 0"):
        LocalSGD(accelerator=accelerator, model=model, local_sgd_steps=0)


def test_is_schedulefree_available_tells_the_truth() -> None:
    import importlib.util

    assert is_schedulefree_available() is (importlib.util.find_spec("schedulefree") is not None)
