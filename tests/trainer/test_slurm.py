"""SLURM in one process: the requeue signal saves, requeues through ``scontrol`` and exits; the requeued job resumes
by itself from its own checkpoint (never another job's); Lightning's cluster environments at their path."""

from __future__ import annotations

import os
import signal
import stat
from pathlib import Path
from typing import Any

import pytest
import torch

from callbacks import ModelCheckpoint
from tests.trainer.helpers import Regressor, data, quiet
from tests.trainer.test_preemption import Signal  # sends a signal at one micro-step, as SLURM would
from trainer import Trainer
from trainer.loop.signals import Preempted
from trainer.plugins.environments import (
    ClusterEnvironment,
    LightningEnvironment,
    SLURMEnvironment,
    TorchElasticEnvironment,
    resolve_environment,
)


@pytest.fixture
def slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A SLURM batch job of one task (job 4242) with a stand-in ``scontrol`` that records its arguments."""
    for name in [n for n in os.environ if n.startswith(("SLURM_", "TORCHELASTIC_"))]:
        monkeypatch.delenv(name)
    for name, value in {"SLURM_NTASKS": "1", "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0",
                        "SLURM_JOB_ID": "4242", "SLURM_JOB_NAME": "train.sh"}.items():
        monkeypatch.setenv(name, value)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    scontrol = bin_dir / "scontrol"
    scontrol.write_text(f'#!/bin/sh\necho "$@" >> {tmp_path / "scontrol.log"}\n')
    scontrol.chmod(scontrol.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return tmp_path


def _trainer(root: Path, **kwargs: Any) -> Trainer:
    return Trainer(**{**quiet(kwargs.get("callbacks")), "max_epochs": 2, "seed": 0, "project_dir": str(root / "run"), **kwargs})


def _calls(root: Path) -> list[str]:
    log = root / "scontrol.log"
    return log.read_text().splitlines() if log.exists() else []


def test_sigusr1_saves_requeues_and_the_requeued_job_resumes_by_itself(slurm: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    trainer = _trainer(slurm, callbacks=[Signal(at=5, signum=signal.SIGUSR1)])
    assert isinstance(trainer.cluster_environment, SLURMEnvironment)  # detected, as Lightning does
    with pytest.raises(Preempted, match=r"Preempted by SIGUSR1 at epoch 1, batch 2, step 6: checkpoint saved; the "
                                        r"checkpoint is .*SLURM job 4242 requeued") as info:
        trainer.fit(Regressor(), data())
    assert info.value.code == 143 and _calls(slurm) == ["requeue 4242"]
    assert signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL

    uninterrupted = _trainer(slurm / "full")
    full = Regressor()  # after the Trainer: its seed gives the same initial weights as the first start's
    uninterrupted.fit(full, data())
    module = Regressor()
    requeued = _trainer(slurm)
    requeued.fit(module, data())  # the same line as the first start: no ckpt_path
    assert "slurm:4242 wrote checkpoints before" in capsys.readouterr().out
    assert requeued.global_step == 8 and torch.equal(module.net.weight, full.net.weight)
    assert torch.equal(module.net.bias, full.net.bias)


def test_a_first_start_and_another_job_start_fresh(slurm: Path, monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    first = _trainer(slurm, max_epochs=1, callbacks=[ModelCheckpoint(every_n_train_steps=1)])
    first.fit(Regressor(), data())  # no checkpoint of job 4242 yet: fresh, no error
    assert first.checkpointer.ckpt_path is None and first.global_step == 4
    monkeypatch.setenv("SLURM_JOB_ID", "5151")  # a new submission of the same script
    second = _trainer(slurm, max_epochs=1)
    second.fit(Regressor(), data())
    assert second.checkpointer.ckpt_path is None and second.global_step == 4  # job 4242's checkpoints left alone
    assert "wrote checkpoints before" not in capsys.readouterr().out
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    again = _trainer(slurm, max_epochs=2)
    again.fit(Regressor(), data())  # job 4242 requeued after a node failure: continues from its epoch-end save
    assert again.checkpointer.ckpt_path is not None and "4242" not in again.checkpointer.ckpt_path
    assert again.global_step == 8
    hpc = _trainer(slurm, max_epochs=3)
    hpc.fit(Regressor(), data(), ckpt_path="hpc")  # Lightning's spelling of the same resume
    assert hpc.checkpointer.ckpt_path is not None and hpc.global_step == 12
    monkeypatch.setenv("SLURM_JOB_ID", "6161")
    fresh = _trainer(slurm / "hpc-first", max_epochs=1)
    fresh.fit(Regressor(), data(), ckpt_path="hpc")  # a first start with "hpc": fresh, saying so (no error)
    assert "slurm:6161 has written no checkpoint yet; starting a new run" in capsys.readouterr().out
    monkeypatch.setenv("SLURM_JOB_NAME", "bash")
    with pytest.raises(ValueError, match=r"ckpt_path='hpc'\) resumes a requeued SLURM job .* ckpt_path='last'"):
        _trainer(slurm).fit(Regressor(), data(), ckpt_path="hpc")


def test_array_task_is_requeued_alone_and_no_scontrol_still_saves(slurm: Path, monkeypatch: pytest.MonkeyPatch,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "900")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "3")
    with pytest.raises(Preempted, match="SLURM job 900_3 requeued"):
        _trainer(slurm, callbacks=[Signal(at=2, signum=signal.SIGUSR1)]).fit(Regressor(), data())
    assert _calls(slurm) == ["requeue 900_3"]

    monkeypatch.setenv("PATH", "/nonexistent")  # a container without SLURM's tools
    with pytest.raises(Preempted, match=r"scontrol is not on PATH \(a container\?\), so SLURM job 900_3 was not "
                                        r"requeued: resubmit the job"):
        _trainer(slurm / "container", callbacks=[Signal(at=2, signum=signal.SIGUSR1)]).fit(Regressor(), data())
    assert os.listdir(slurm / "container" / "run" / "checkpoints") == ["preempted"]


def test_a_failing_scontrol_is_reported(slurm: Path) -> None:
    scontrol = slurm / "bin" / "scontrol"
    scontrol.write_text("#!/bin/sh\necho 'Invalid job id specified' >&2\nexit 1\n")
    with pytest.raises(Preempted, match=r"`scontrol requeue 4242` failed with exit code 1 \(Invalid job id "
                                        r"specified\), so the job was not requeued"):
        _trainer(slurm, callbacks=[Signal(at=2, signum=signal.SIGUSR1)]).fit(Regressor(), data())


def test_plugin_with_another_signal_and_auto_requeue_off(slurm: Path) -> None:
    env = SLURMEnvironment(requeue_signal=signal.SIGUSR2)
    with pytest.raises(Preempted, match="Preempted by SIGUSR2.*SLURM job 4242 requeued"):
        _trainer(slurm, plugins=[env], callbacks=[Signal(at=2, signum=signal.SIGUSR2)]).fit(Regressor(), data())
    assert _calls(slurm) == ["requeue 4242"]
    # auto_requeue=False: the requeue signal is not handled; SIGTERM (a preemption signal) still saves, no requeue.
    trainer = _trainer(slurm / "off", plugins=[SLURMEnvironment(auto_requeue=False)],
                       callbacks=[Signal(at=2, signum=signal.SIGTERM)])
    assert trainer.stop.preemption.signals == (signal.SIGTERM,)
    with pytest.raises(Preempted, match="Preempted by SIGTERM") as info:
        trainer.fit(Regressor(), data())
    assert "requeue" not in str(info.value) and _calls(slurm) == ["requeue 4242"]


def test_interactive_allocations_and_torchrun_inside_a_job_are_not_slurm_tasks(slurm: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_JOB_NAME", "bash")
    assert not SLURMEnvironment.detect() and _trainer(slurm).cluster_environment is None
    assert SLURMEnvironment.job_id() is None
    monkeypatch.setenv("SLURM_JOB_NAME", "train.sh")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "abc")  # torchrun inside the job: its workers are torchrun's
    assert not SLURMEnvironment.detect() and TorchElasticEnvironment.detect()
    monkeypatch.delenv("TORCHELASTIC_RUN_ID")
    assert SLURMEnvironment.detect() and SLURMEnvironment.job_id() == 4242


def test_environments_at_lightnings_path_and_their_checks(slurm: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from trainer.plugins import environments as at_lightnings_path  # lightning.pytorch.plugins.environments

    assert at_lightnings_path.SLURMEnvironment is SLURMEnvironment
    env = SLURMEnvironment()
    assert (env.world_size(), env.global_rank(), env.local_rank(), env.node_rank()) == (1, 0, 0, 0)
    assert env.creates_processes_externally and env.requeue_signals() == (signal.SIGUSR1,)
    monkeypatch.setenv("SLURM_JOB_NODELIST", "node[03-07,9]")
    assert env.main_address == "node03"
    monkeypatch.setenv("SLURM_NTASKS_PER_NODE", "4")
    with pytest.raises(ValueError, match=r"Trainer\(devices=2\) does not match the job's --ntasks-per-node \(4\)"):
        _trainer(slurm, devices=2)
    monkeypatch.delenv("SLURM_NTASKS_PER_NODE")
    lightning = LightningEnvironment()
    assert (lightning.world_size(), lightning.global_rank()) == (1, 0)
    with pytest.raises(ValueError, match=r"set_world_size\(3\): the launcher started 1 processes"):
        lightning.set_world_size(3)
    assert isinstance(_trainer(slurm, plugins=[LightningEnvironment()]).cluster_environment, LightningEnvironment)


def test_refusals_name_the_value_and_the_fix(slurm: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match=r"plugins=\[.*MixedPrecision.*\]\) is not supported.*precision="):
        resolve_environment([type("MixedPrecision", (), {})()])
    with pytest.raises(ValueError, match="got 2 cluster environments"):
        resolve_environment([SLURMEnvironment(), LightningEnvironment()])
    with pytest.raises(ValueError, match=r"requeue_signal=SIGKILL\) cannot be handled"):
        SLURMEnvironment(requeue_signal=signal.SIGKILL)
    with pytest.raises(TypeError, match=r"auto_requeue=...\) must be True or False. Received: 'yes'"):
        SLURMEnvironment(auto_requeue="yes")  # type: ignore[arg-type]

    class Elsewhere(LightningEnvironment):
        def global_rank(self) -> int:
            return 3

        def world_size(self) -> int:
            return 4

    with pytest.raises(ValueError, match=r"describes this process as rank 3 of 4, but it was launched as rank 0 "
                                         r"of 1"):
        _trainer(slurm, plugins=[Elsewhere()])
    assert issubclass(Elsewhere, ClusterEnvironment)
