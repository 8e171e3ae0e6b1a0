"""The environment is read in one place (``engine/environment.py``), once per construction, and passed down."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch.distributed as dist

from engine import Accelerator, AcceleratorState, PartialState
from engine.environment import EngineEnvironment, LaunchInfo, describe
from tests.conftest import free_port

ENGINE = Path(__file__).resolve().parents[2] / "engine"


def _may_touch_environ(path: Path) -> bool:
    # environment.py is where every read happens; the launchers (launch*.py) write their children's environment.
    return path.name == "environment.py" or path.name.startswith("launch")


def test_from_env_reads_every_variable_the_engine_uses() -> None:
    env = EngineEnvironment.from_env({
        "SLURM_PROCID": "3", "SLURM_NTASKS": "4", "SLURM_LOCALID": "1", "SLURM_TASKS_PER_NODE": "2(x2)",
        "SLURM_JOB_NODELIST": "gpu[07-08]", "SLURM_JOB_ID": "42", "MASTER_PORT": "1234", "OMP_NUM_THREADS": "2",
        "ACCELERATE_USE_CPU": "yes", "ACCELERATE_DEBUG_MODE": "1", "ACCELERATE_TORCH_DEVICE": "cpu",
        "ACCELERATE_MIXED_PRECISION": "BF16", "ACCELERATE_USE_FSDP": "true",
        "ACCELERATE_GRADIENT_ACCUMULATION_STEPS": "4", "FORK_LAUNCHED": "1"})
    assert env == EngineEnvironment(
        launch=LaunchInfo(rank=3, world_size=4, local_rank=1, local_world_size=2, launched=True),
        master_addr=None, master_port="1234", slurm_master_addr="gpu07", slurm_job_id="42", omp_num_threads="2",
        use_cpu=True, debug_mode=True, torch_device="cpu", mixed_precision="BF16", use_fsdp=True,
        gradient_accumulation_steps="4", fork_launched=True)
    empty = EngineEnvironment.from_env({})
    assert empty.launch == LaunchInfo(0, 1, 0, 1, False) and not (empty.use_cpu or empty.use_fsdp)
    assert empty.mixed_precision is None and empty.gradient_accumulation_steps is None
    deepspeed = EngineEnvironment.from_env({"ACCELERATE_USE_DEEPSPEED": "true", "ACCELERATE_DEEPSPEED_ZERO_STAGE": "3",
                                            "ACCELERATE_GRADIENT_CLIPPING": "0.5", "OTHER": "x"})
    assert deepspeed.use_deepspeed and deepspeed.deepspeed == {"ACCELERATE_DEEPSPEED_ZERO_STAGE": "3",
                                                               "ACCELERATE_GRADIENT_CLIPPING": "0.5"}
    # Accelerate's own test for ACCELERATE_USE_FSDP: "yes" is not true there, and so not here.
    assert not EngineEnvironment.from_env({"ACCELERATE_USE_FSDP": "yes"}).use_fsdp


def test_no_engine_module_reads_the_environment_itself() -> None:
    readers = []
    for path in sorted(ENGINE.glob("*.py")):
        if _may_touch_environ(path):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else ""
            imported = [a.name for a in node.names] if isinstance(node, ast.ImportFrom) and node.module == "os" else []
            if name in ("environ", "getenv", "environb") or {"environ", "getenv", "environb"} & set(imported):
                readers.append(f"{path.name}:{node.lineno}")
    assert not readers, f"read the variable in engine/environment.py and pass it down instead: {readers}"


def test_accelerator_reads_the_environment_once_at_construction(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    original = EngineEnvironment.from_env.__func__  # type: ignore[attr-defined]

    def counting(cls: type[EngineEnvironment], environ: object = None) -> EngineEnvironment:
        calls.append(environ)
        return original(cls, environ)

    monkeypatch.setattr(EngineEnvironment, "from_env", classmethod(counting))
    monkeypatch.setenv("ACCELERATE_DEBUG_MODE", "1")  # set after `import engine`: read when the state is built
    acc = Accelerator()
    assert len(calls) == 1 and acc.state.debug
    PartialState()  # views of the built state (built per step by collectives): no new read of the whole set
    AcceleratorState()
    assert len(calls) == 1


def test_env_values_reach_the_state(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "bf16")
    monkeypatch.setenv("ACCELERATE_TORCH_DEVICE", "cpu")
    acc = Accelerator()
    assert acc.mixed_precision == "bf16" and AcceleratorState().mixed_precision == "bf16"
    assert str(acc.device) == "cpu" and not acc.state.debug


def test_fork_launched_is_read_on_every_construction(monkeypatch: pytest.MonkeyPatch) -> None:
    assert not PartialState().fork_launched
    monkeypatch.setenv("FORK_LAUNCHED", "1")  # as Accelerate: later views see it
    assert PartialState().fork_launched


def test_bad_accumulation_steps_still_fail_as_accelerate(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACCELERATE_GRADIENT_ACCUMULATION_STEPS", "2.0")
    with pytest.raises(ValueError, match="2.0"):
        Accelerator()


def test_describe_lists_launch_variables_and_settings() -> None:
    lines = describe({"RANK": "1", "WORLD_SIZE": "2", "ACCELERATE_USE_CPU": "1", "EMBER_X": "y", "HOME": "/"})
    assert lines == ["Launch environment: RANK=1, WORLD_SIZE=2", "Ember settings: ACCELERATE_USE_CPU=1, EMBER_X=y"]
    assert describe({}) == ["Launch environment: none (1 process)", "Ember settings: none"]


def test_destroy_process_group_runs_registered_teardown_once() -> None:
    calls: list[str] = []

    def release() -> None:
        calls.append("released")

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    state = PartialState()
    state.register_teardown(release)
    state.register_teardown(release)  # registering twice is one call
    state.destroy_process_group()
    assert calls == ["released"] and not dist.is_initialized()
    assert PartialState._teardown == []  # forgotten once run: a later group starts with none
