"""Ray Train runs Ember as it runs Lightning: Ray's Lightning guide with Ember's imports, on 2 CPU workers.

One local Ray cluster for the module (2 CPUs). Every worker writes its checkpoint part into its own folder
(``{root}/node{rank}``: node-local disks, no shared file system for the parts); Ray merges them in its storage.
Final weights are compared bit for bit with one uninterrupted run, shared by the tests.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import torch

ray = pytest.importorskip("ray")
pytest.importorskip("ray.train.torch")

from ray.train import Checkpoint, CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer

EPOCHS = 3


# -- what runs in the workers ---------------------------------------------------------------------------------
def _data() -> torch.utils.data.TensorDataset:
    generator = torch.Generator().manual_seed(1)
    return torch.utils.data.TensorDataset(torch.randn(16, 4, generator=generator),
                                          torch.randn(16, 2, generator=generator))


def _lightning_loop(config: dict[str, Any]) -> None:
    """Ray's Lightning guide, with Ember's imports; ``config["faults"]`` says what goes wrong in which attempt."""
    import ray.train
    from torch.utils.data import DataLoader

    from callbacks import Callback
    from trainer import Trainer, TrainModule
    from trainer.integrations.ray import (
        CHECKPOINT_NAME,
        RayDDPStrategy,
        RayFSDPStrategy,
        RayLightningEnvironment,
        RayTrainReportCallback,
        prepare_trainer,
    )

    class Regressor(TrainModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Linear(4, 2)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            loss = torch.nn.functional.mse_loss(self.net(batch[0]), batch[1])
            self.log("train_loss", loss, on_step=False, on_epoch=True, sync_dist=True)
            return loss

        def test_step(self, batch: Any, batch_idx: int) -> None:
            self.log("test_loss", torch.nn.functional.mse_loss(self.net(batch[0]), batch[1]))

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)

    rank = ray.train.get_context().get_world_rank()
    out = config["out"]
    attempt = _attempt(out, rank)  # 0 for the first start of this rank, 1 after the first restart, ...
    faults = config.get("faults", [])
    fault, at = faults[attempt] if attempt < len(faults) else (None, None)

    class Faults(Callback):
        """This attempt's trouble (``config["faults"][attempt]``: a fault and its (epoch, batch))."""

        def on_train_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
            if fault is None or (trainer.current_epoch, batch_idx) != tuple(at):
                return
            if fault in ("kill", "damage"):
                # Ray Train v2 takes a reported checkpoint in when its controller next polls the workers: wait for
                # that, so the fault comes after the hand-over (a kill before it loses the report, as it would).
                ray.train.get_all_reported_checkpoints()
            if fault == "kill" and rank == 1:
                with open(os.path.join(out, "victim"), "w") as handle:
                    handle.write(str(os.getpid()))
                time.sleep(60)  # the test kills this process from outside
            if fault == "raise":  # what the strategy made of the module, then rank 1 raises
                sharded = [type(p).__name__ for p in module.parameters()]
                with open(os.path.join(out, f"params{rank}"), "w") as handle:
                    json.dump({"step": trainer.global_step, "types": sharded}, handle)
            if fault == "raise" and rank == 1:
                raise ValueError(f"boom in rank {rank} at step {trainer.global_step}")
            if fault == "damage" and rank == 0:
                newest = ray.train.get_all_reported_checkpoints()[-1].checkpoint.path  # epoch 1's, in storage
                damage(os.path.join(newest, CHECKPOINT_NAME, "model.safetensors"))
                raise RuntimeError("crash after damaging the newest reported checkpoint")
            if fault == "preempt" and rank == 0:
                open(os.path.join(out, "preempt"), "w").close()  # the stand-in's notice, read at this boundary

        def on_train_start(self, trainer: Any, module: Any) -> None:
            with open(os.path.join(out, f"starts{rank}"), "a") as handle:
                handle.write(f"{trainer.global_step}\n")  # where each attempt resumed

        def on_exception(self, trainer: Any, module: Any, exception: BaseException) -> None:
            with open(os.path.join(out, f"stopped{rank}"), "w") as handle:
                json.dump({"step": trainer.global_step, "error": type(exception).__name__}, handle)

    from ray.train import collective

    def preemption_info() -> Any:
        """A stand-in for ``ray.train.get_preemption_info``: rank 0's notice broadcast to every worker (a
        collective through Ray, as the real one; a real node drain cannot be made on a one-node local cluster)."""
        notice = None
        if rank == 0 and os.path.exists(os.path.join(out, "preempt")):
            os.remove(os.path.join(out, "preempt"))
            notice = ray.train.PreemptionInfo(deadline_ms=None, preempted_node_to_ranks={"node": [0, 1]})
        return collective.broadcast_from_rank_zero(notice)

    environment = RayLightningEnvironment(preemption_check_every=1, preemption_info=preemption_info) \
        if ("preempt", (1, 0)) in [tuple(f) for f in faults] else RayLightningEnvironment()
    strategy = RayFSDPStrategy() if config.get("strategy") == "fsdp" else RayDDPStrategy()
    trainer = Trainer(max_epochs=EPOCHS, devices="auto", accelerator="auto", strategy=strategy,
                      plugins=[environment], enable_progress_bar=False, seed=0, log_with=None,
                      callbacks=[RayTrainReportCallback(local_dir=os.path.join(out, f"node{rank}")), Faults()],
                      default_root_dir=os.path.join(out, "logs"), enable_model_summary=False)
    trainer = prepare_trainer(trainer)
    model = Regressor()
    loader = DataLoader(_data(), batch_size=4, shuffle=True)
    checkpoint = ray.train.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as folder:
            trainer.fit(model, loader, ckpt_path=os.path.join(folder, CHECKPOINT_NAME))
    else:
        trainer.fit(model, loader)
    if rank == 0:
        torch.save(model.state_dict(), os.path.join(out, "weights.pt"))
    if config.get("test"):  # fit then test in the same worker: Ray's process group must survive both
        results = trainer.test(model, DataLoader(_data(), batch_size=4))
        torch.distributed.barrier()
        with open(os.path.join(out, f"test{rank}.json"), "w") as handle:
            json.dump({"results": results, "group": torch.distributed.is_initialized()}, handle)


def _engine_loop(config: dict[str, Any]) -> None:
    """The engine in ``train_loop_per_worker``, Accelerate style; each worker saves its part on its own disk."""
    import shutil

    import ray.train
    from torch.utils.data import DataLoader

    from engine import Accelerator, set_seed

    class Progress:
        def __init__(self) -> None:
            self.epoch = 0

        def state_dict(self) -> dict[str, int]:
            return {"epoch": self.epoch}

        def load_state_dict(self, state: dict[str, int]) -> None:
            self.epoch = state["epoch"]

    rank = ray.train.get_context().get_world_rank()
    out = config["out"]
    first = _attempt(out, rank) == 0
    set_seed(0)
    accelerator = Accelerator()
    model, optimizer, loader = accelerator.prepare(
        torch.nn.Linear(4, 2), None, DataLoader(_data(), batch_size=4, shuffle=True))
    optimizer = accelerator.prepare(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    progress = Progress()
    accelerator.register_for_checkpointing(progress)
    checkpoint = ray.train.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as folder:
            accelerator.load_state(os.path.join(folder, "state"))
    local = os.path.join(out, f"node{rank}")
    while progress.epoch < EPOCHS:
        for index, (x, y) in enumerate(loader):
            if first and config.get("kill") and rank == 1 and (progress.epoch, index) == (1, 1):
                ray.train.get_all_reported_checkpoints()  # the epoch's report is in Ray's hands (see above)
                with open(os.path.join(out, "victim"), "w") as handle:
                    handle.write(str(os.getpid()))
                time.sleep(60)
            loss = torch.nn.functional.mse_loss(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
        progress.epoch += 1
        part = os.path.join(local, f"epoch{progress.epoch}")
        accelerator.save_state(os.path.join(part, "state"), local_parts=True)
        ray.train.report({"epoch": progress.epoch, "loss": loss.item()}, checkpoint=Checkpoint.from_directory(part))
        shutil.rmtree(part)
    if rank == 0:
        torch.save(accelerator.unwrap_model(model).state_dict(), os.path.join(out, "weights.pt"))


def _attempt(out: str, rank: int) -> int:
    """Count this rank's starts (its pid is appended to ``{out}/pids{rank}``; ``pid{rank}`` holds the newest)."""
    with open(os.path.join(out, f"pids{rank}"), "a+") as handle:
        handle.seek(0)
        attempt = len(handle.read().split())
        handle.write(f"{os.getpid()}\n")
    with open(os.path.join(out, f"pid{rank}"), "w") as handle:
        handle.write(str(os.getpid()))
    return attempt


def damage(path: str) -> None:
    """Flip one byte in the middle of ``path``."""
    with open(path, "r+b") as handle:
        handle.seek(os.path.getsize(path) // 2)
        byte = handle.read(1)
        handle.seek(-1, os.SEEK_CUR)
        handle.write(bytes([byte[0] ^ 0xFF]))


# -- the driver -----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cluster() -> Iterator[None]:
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield
    ray.shutdown()


def _fit(fn: Any, tmp: Any, name: str, max_failures: int = 0, **config: Any) -> tuple[Any, str]:
    """Run ``fn`` on 2 workers; returns Ray's result and the folder the workers wrote their outputs to."""
    out, storage = str(tmp / f"{name}-out"), str(tmp / "storage")
    os.makedirs(out)
    config = {"out": out, "run_dir": os.path.join(storage, name), **config}
    trainer = TorchTrainer(fn, train_loop_config=config, scaling_config=ScalingConfig(num_workers=2),
                           run_config=RunConfig(name=name, storage_path=storage,
                                                failure_config=FailureConfig(max_failures=max_failures),
                                                checkpoint_config=CheckpointConfig(num_to_keep=None)))
    killer = threading.Thread(target=_kill_victim, args=(out,), daemon=True)
    killer.start()
    try:
        return trainer.fit(), out
    finally:
        open(os.path.join(out, "done"), "w").close()
        killer.join()


def _kill_victim(out: str) -> None:
    """SIGKILL the worker that wrote its pid to ``{out}/victim`` (from outside, as a node failure would)."""
    victim = os.path.join(out, "victim")
    while not os.path.exists(os.path.join(out, "done")):
        if os.path.exists(victim):
            time.sleep(0.2)  # the pid is written in full
            with open(victim) as handle:
                os.kill(int(handle.read()), signal.SIGKILL)
            os.rename(victim, victim + ".killed")
        time.sleep(0.1)


def _read(path: str) -> str:
    with open(path) as handle:
        return handle.read()


def _weights(out: str) -> dict[str, torch.Tensor]:
    return torch.load(os.path.join(out, "weights.pt"))


def _assert_bitwise(out: str, reference: str) -> None:
    got, expected = _weights(out), _weights(reference)
    assert got.keys() == expected.keys()
    for name in got:
        assert torch.equal(got[name], expected[name]), name


@pytest.fixture(scope="module")
def reference(cluster: None, tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, str]:
    """The uninterrupted run (then ``test`` in the same workers)."""
    return _fit(_lightning_loop, tmp_path_factory.mktemp("ray"), "reference", test=True)


@pytest.fixture(scope="module")
def engine_reference(cluster: None, tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, str]:
    return _fit(_engine_loop, tmp_path_factory.mktemp("ray"), "engine-reference")


def test_killed_worker_then_a_damaged_checkpoint_resume_bitwise(reference: tuple[Any, str], tmp_path: Any) -> None:
    """Attempt 0: rank 1 is SIGKILLed from outside in epoch 1 (attempt 1 resumes from epoch 0's merged checkpoint,
    step 2). Attempt 1: rank 0 flips a byte in the newest reported checkpoint (epoch 1's, step 4) and crashes;
    attempt 2 finds it damaged and falls back to the previous one of the run (step 2)."""
    faults = [("kill", (1, 1)), ("damage", (2, 0))]
    result, out = _fit(_lightning_loop, tmp_path, "killed", max_failures=2, faults=faults)
    assert os.path.exists(os.path.join(out, "victim.killed"))  # the worker was killed, and the run went on
    for rank in (0, 1):
        assert _read(os.path.join(out, f"starts{rank}")).split() == ["0", "2", "2"]
    _assert_bitwise(out, reference[1])
    assert result.metrics == reference[0].metrics
    assert result.metrics["epoch"] == EPOCHS - 1 and result.metrics["step"] == EPOCHS * 2
    assert "train_loss" in result.metrics
    merged = os.path.join(result.checkpoint.path, "checkpoint.ckpt")
    assert {"manifest.json", "random_states_0.pkl", "random_states_1.pkl"} <= set(os.listdir(merged))
    assert not any(name == "manifest.json" for name in os.listdir(os.path.join(out, "node1")))  # parts removed


def test_preemption_notice_stops_at_one_agreed_step_with_a_checkpoint(reference: tuple[Any, str],
                                                                       tmp_path: Any) -> None:
    result, out = _fit(_lightning_loop, tmp_path, "preempted", max_failures=1, faults=[("preempt", (1, 0))])
    stops = [json.loads(_read(os.path.join(out, f"stopped{rank}"))) for rank in (0, 1)]
    assert stops[0] == stops[1] == {"step": 3, "error": "Preempted"}  # epoch 1, batch 0 is the 3rd step
    reported = [metrics["step"] for _, metrics in result.best_checkpoints]
    assert reported == [2, 3, 4, 6]  # epoch 0's, the preemption's, then the resumed run's epoch ends
    for rank in (0, 1):
        assert _read(os.path.join(out, f"starts{rank}")).split() == ["0", "3"]
    _assert_bitwise(out, reference[1])


def test_raising_worker_ends_the_run_quickly_with_its_traceback(cluster: None, tmp_path: Any) -> None:
    from ray.train import TrainingFailedError

    start = time.monotonic()
    with pytest.raises(TrainingFailedError) as raised:
        # Under RayFSDPStrategy: FSDP2 shards over Ray's process group and steps before the raise.
        _fit(_lightning_loop, tmp_path, "raising", faults=[("raise", (0, 1))], strategy="fsdp")
    took = time.monotonic() - start
    text = str(raised.value)
    assert "ValueError: boom in rank 1" in text and "on_train_batch_end" in text, text
    # "Quickly": the peer that did not raise is not left to torch's 30-minute collective timeout. The bound is
    # loose because the whole run (Ray workers' start included) is timed, on a machine that may be loaded.
    assert took < 300, took
    out = str(tmp_path / "raising-out")
    for rank in (0, 1):  # FSDP2 had sharded the module over Ray's group (DTensor parameters) and stepped twice
        params = json.loads(_read(os.path.join(out, f"params{rank}")))
        assert params == {"step": 2, "types": ["DTensor", "DTensor"]}, params
    pids = [int(_read(os.path.join(out, f"pid{rank}"))) for rank in (0, 1)]
    deadline = time.monotonic() + 15
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(_alive(pid) for pid in pids)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as handle:  # a zombie is gone for good
        return handle.read().split(") ")[-1][0] != "Z"


def test_fit_then_test_in_one_worker_keeps_rays_process_group(reference: tuple[Any, str]) -> None:
    out = reference[1]
    runs = [json.loads(_read(os.path.join(out, f"test{rank}.json"))) for rank in (0, 1)]
    assert runs[0] == runs[1] and runs[0]["group"] is True
    assert "test_loss" in runs[0]["results"][0]


def test_engine_in_train_loop_per_worker_resumes_bitwise(engine_reference: tuple[Any, str], tmp_path: Any) -> None:
    result, out = _fit(_engine_loop, tmp_path, "engine-killed", max_failures=1, kill=True)
    assert os.path.exists(os.path.join(out, "victim.killed"))
    _assert_bitwise(out, engine_reference[1])
    assert result.metrics == engine_reference[0].metrics


def test_importing_trainer_does_not_import_ray() -> None:
    import subprocess
    import sys

    code = ("import sys, trainer, trainer.plugins; assert 'ray' not in sys.modules\n"
            "sys.modules['ray'] = None\n"
            "try:\n    import trainer.integrations.ray\nexcept ImportError as e:\n    print(e)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert "pip install 'ember-train[ray]'" in done.stdout
