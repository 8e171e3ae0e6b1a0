"""Cluster environments at Lightning's names: who this process is, and what the cluster does with a stopped job.

Ember's engine reads the launcher's variables itself (``engine.environment``), so an environment here does not
decide the ranks: the Trainer checks that its view matches the engine's and refuses a mismatch, naming both. What
an environment adds is the cluster's side of a stop:

- ``requeue_signals()``: signals that mean "save and come back later" (SLURM's ``--signal=SIGUSR1@90``). The
  Trainer handles them like its preemption signals (a flag in the handler, a save at the next step boundary every
  rank agrees on), then calls ``requeue()`` on process 0 and exits with ``preemption_exit_code``.
- ``job_key()``: a name of this job that outlives a requeue (SLURM: the job id, ``JOBID_TASKID`` for an array
  task). Every checkpoint records it, and ``fit(ckpt_path=None)`` in a job that has one resumes from the newest
  committed checkpoint *of that job*: a requeued job continues by itself, and a new submission (another id) never
  picks up another job's checkpoint (pass ``ckpt_path="last"`` for that).

``Trainer(plugins=None)`` under a SLURM batch job (``srun`` started the tasks, not torchrun) uses
``SLURMEnvironment()`` as Lightning does.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any

from engine.environment import slurm_master_addr

# Job names SLURM gives an interactive allocation (`salloc` / `srun --pty bash`): not a batch job to requeue.
_INTERACTIVE_JOB_NAMES = ("bash", "interactive")


class ClusterEnvironment(ABC):
    """Lightning's cluster-environment interface, plus Ember's two questions about stops (module docstring).

    Subclasses describe one launcher or scheduler; the values are read from the environment when asked.
    """

    @property
    @abstractmethod
    def creates_processes_externally(self) -> bool:
        """Whether the processes were started by the cluster or a launcher (not by the Trainer)."""

    @property
    @abstractmethod
    def main_address(self) -> str:
        """The host of process 0 (the rendezvous address)."""

    @property
    @abstractmethod
    def main_port(self) -> int:
        """The rendezvous port on ``main_address``."""

    @staticmethod
    @abstractmethod
    def detect() -> bool:
        """Whether this process runs under this environment."""

    @abstractmethod
    def world_size(self) -> int:
        """The number of processes of the job."""

    @abstractmethod
    def global_rank(self) -> int:
        """This process's rank in the job."""

    @abstractmethod
    def local_rank(self) -> int:
        """This process's rank on its machine."""

    @abstractmethod
    def node_rank(self) -> int:
        """This machine's rank in the job."""

    def set_world_size(self, size: int) -> None:
        """Lightning's setter; the launcher's value is the one that holds here, so a different one is an error."""
        if size != self.world_size():
            raise ValueError(f"{type(self).__name__}.set_world_size({size}): the launcher started "
                             f"{self.world_size()} processes; change the launch (not the environment) to change it.")

    def set_global_rank(self, rank: int) -> None:
        """Lightning's setter; the launcher's value is the one that holds here, so a different one is an error."""
        if rank != self.global_rank():
            raise ValueError(f"{type(self).__name__}.set_global_rank({rank}): this process is rank "
                             f"{self.global_rank()} as launched; ranks cannot be reassigned.")

    def validate_settings(self, num_devices: int, num_nodes: int) -> None:
        """Raise when the Trainer's ``devices`` / ``num_nodes`` contradict the environment (default: nothing)."""

    def teardown(self) -> None:
        """Called when the Trainer is done with the environment (default: nothing to release)."""

    # Whether the cluster ends every process of a run when one fails, and reports the failure itself (Ray Train).
    # False: the Trainer destroys the process group and ends a failed process within seconds, so no peer waits.
    ends_failed_processes: bool = False

    def requeue_signals(self) -> tuple[int, ...]:
        """Signals after which the job should be saved and requeued (default: none)."""
        return ()

    def requeue(self) -> str:
        """Put the job back in the queue; returns one line for the log. Called on process 0 only, after the
        checkpoint is committed and the trackers are finished."""
        raise RuntimeError(f"{type(self).__name__} cannot requeue a job; it asked for no requeue signal.")

    def job_key(self) -> str | None:
        """A name of this job that survives a requeue (``None``: no automatic resume)."""
        return None

    def preemption_notice(self) -> str | None:
        """Whether the cluster announced a preemption (not by a signal): a few words naming it, else None.

        Called by the Trainer at every step boundary, on every process the same number of times (so an
        implementation may run a collective, and should make most calls cheap); the answer must be the same on
        every process. Default: never (the cluster signals instead).
        """
        return None

    def fallbacks(self, ckpt_path: str) -> list[str]:
        """Older checkpoints the cluster keeps of the run that wrote ``ckpt_path`` (local folders, newest first),
        which ``fit(ckpt_path=...)`` may load instead when ``ckpt_path`` fails its checks (only those of the same
        run: ``trainer.checkpoint.identity.same_run``). Called on every process; default: none.
        """
        return []


def _env_int(environ: Mapping[str, str], name: str, default: int) -> int:
    value = environ.get(name, "")
    return int(value) if value.strip() else default


class LightningEnvironment(ClusterEnvironment):
    """Processes described by torchrun-style variables (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``NODE_RANK``,
    ``MASTER_ADDR``, ``MASTER_PORT``), or a single process without them."""

    @property
    def creates_processes_externally(self) -> bool:
        return "LOCAL_RANK" in os.environ

    @property
    def main_address(self) -> str:
        return os.environ.get("MASTER_ADDR", "127.0.0.1")

    @property
    def main_port(self) -> int:
        return _env_int(os.environ, "MASTER_PORT", 29500)

    @staticmethod
    def detect() -> bool:
        return True

    def world_size(self) -> int:
        return _env_int(os.environ, "WORLD_SIZE", 1)

    def global_rank(self) -> int:
        return _env_int(os.environ, "RANK", 0)

    def local_rank(self) -> int:
        return _env_int(os.environ, "LOCAL_RANK", 0)

    def node_rank(self) -> int:
        return _env_int(os.environ, "NODE_RANK", _env_int(os.environ, "GROUP_RANK", 0))


class TorchElasticEnvironment(LightningEnvironment):
    """Processes started by torchrun's elastic agent (``TORCHELASTIC_RUN_ID``); its restarts resume through
    ``fit(ckpt_path="last")`` (the Clusters guide)."""

    @property
    def creates_processes_externally(self) -> bool:
        return True

    @staticmethod
    def detect() -> bool:
        return "TORCHELASTIC_RUN_ID" in os.environ or all(
            name in os.environ for name in ("RANK", "GROUP_RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE"))

    def node_rank(self) -> int:
        return _env_int(os.environ, "GROUP_RANK", 0)

    def validate_settings(self, num_devices: int, num_nodes: int) -> None:
        per_node = _env_int(os.environ, "LOCAL_WORLD_SIZE", num_devices)
        if num_devices != per_node:
            raise ValueError(f"Trainer(devices={num_devices}) does not match torchrun's --nproc-per-node "
                             f"({per_node}): pass devices={per_node} (or 'auto').")


class SLURMEnvironment(ClusterEnvironment):
    """Tasks started by SLURM (``srun``) in a batch job; requeues the job on ``requeue_signal``.

    Args:
        auto_requeue: on ``requeue_signal``, save a checkpoint at the next agreed step boundary, run
            ``scontrol requeue <job id>`` on process 0 and exit; the requeued job resumes from that checkpoint
            by itself. ``False``: the signal is not handled (the Trainer's ``preemption_signals`` still are).
        requeue_signal: the signal the batch script asks for (``#SBATCH --signal=SIGUSR1@90``); default SIGUSR1.

    Example:
        >>> env = SLURMEnvironment(requeue_signal=signal.SIGUSR2)
        >>> [signal.Signals(s).name for s in env.requeue_signals()]
        ['SIGUSR2']
    """

    def __init__(self, auto_requeue: bool = True, requeue_signal: signal.Signals | int | None = None) -> None:
        if not isinstance(auto_requeue, bool):
            raise TypeError(f"SLURMEnvironment(auto_requeue=...) must be True or False. Received: {auto_requeue!r}.")
        number = signal.SIGUSR1 if requeue_signal is None else requeue_signal
        try:
            number = signal.Signals(number)
        except ValueError:
            raise ValueError(f"SLURMEnvironment(requeue_signal=...) must be a signal such as signal.SIGUSR1. "
                             f"Received: {requeue_signal!r}.") from None
        if number in (signal.SIGKILL, signal.SIGSTOP):
            raise ValueError(f"SLURMEnvironment(requeue_signal={number.name}) cannot be handled: no process can "
                             "catch it. Use signal.SIGUSR1 (and #SBATCH --signal=SIGUSR1@90).")
        self.auto_requeue = auto_requeue
        self.requeue_signal = number

    @property
    def creates_processes_externally(self) -> bool:
        return True

    @property
    def main_address(self) -> str:
        return os.environ.get("MASTER_ADDR") or slurm_master_addr(os.environ) or "127.0.0.1"

    @property
    def main_port(self) -> int:
        return _env_int(os.environ, "MASTER_PORT", 29500)

    @staticmethod
    def detect() -> bool:
        """A SLURM batch job whose tasks SLURM started (``srun``): not an interactive allocation, and not a
        torchrun inside the job (its workers are torchrun's, which restarts them itself)."""
        return ("SLURM_NTASKS" in os.environ and not _interactive(os.environ)
                and "TORCHELASTIC_RUN_ID" not in os.environ)

    @staticmethod
    def job_name() -> str | None:
        return os.environ.get("SLURM_JOB_NAME")

    @staticmethod
    def job_id() -> int | None:
        """``SLURM_JOB_ID`` as an int (``None`` in an interactive allocation or outside SLURM)."""
        value = os.environ.get("SLURM_JOB_ID")
        if value is None or _interactive(os.environ):
            return None
        try:
            return int(value)
        except ValueError:
            return None

    def world_size(self) -> int:
        return _env_int(os.environ, "SLURM_NTASKS", 1)

    def global_rank(self) -> int:
        return _env_int(os.environ, "SLURM_PROCID", 0)

    def local_rank(self) -> int:
        return _env_int(os.environ, "SLURM_LOCALID", 0)

    def node_rank(self) -> int:
        return _env_int(os.environ, "SLURM_NODEID", 0)

    def validate_settings(self, num_devices: int, num_nodes: int) -> None:
        per_node = os.environ.get("SLURM_NTASKS_PER_NODE")
        if per_node is not None and per_node.isdigit() and int(per_node) != num_devices:
            raise ValueError(f"Trainer(devices={num_devices}) does not match the job's --ntasks-per-node "
                             f"({per_node}): SLURM starts one task per device, so they must be equal.")
        nodes = os.environ.get("SLURM_NNODES")
        if nodes is not None and nodes.isdigit() and int(nodes) != num_nodes:
            raise ValueError(f"Trainer(num_nodes={num_nodes}) does not match the job's --nodes ({nodes}): pass "
                             f"num_nodes={nodes}.")

    def requeue_signals(self) -> tuple[int, ...]:
        return (int(self.requeue_signal),) if self.auto_requeue else ()

    def requeue_id(self) -> str | None:
        """What ``scontrol requeue`` takes: ``SLURM_ARRAY_JOB_ID_SLURM_ARRAY_TASK_ID`` for an array task (its own
        task, not the whole array), else ``SLURM_JOB_ID``."""
        array_job, task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
        if array_job and task:
            return f"{array_job}_{task}"
        return os.environ.get("SLURM_JOB_ID") or None

    def job_key(self) -> str | None:
        job = self.requeue_id()
        return None if job is None or _interactive(os.environ) else f"slurm:{job}"

    def requeue(self) -> str:
        job = self.requeue_id()
        if job is None:
            return "SLURM_JOB_ID is not set, so the job was not requeued; submit it again to resume."
        command = shutil.which("scontrol")
        hint = (f"resubmit the job (its checkpoint is resumed with fit(ckpt_path='last')) or run `scontrol "
                f"requeue {job}` where scontrol exists")
        if command is None:
            return f"scontrol is not on PATH (a container?), so SLURM job {job} was not requeued: {hint}."
        try:
            done = subprocess.run([command, "requeue", job], check=False, capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired) as error:
            return f"`scontrol requeue {job}` failed ({error}), so the job was not requeued: {hint}."
        if done.returncode != 0:
            said = (done.stderr or done.stdout).strip()
            return (f"`scontrol requeue {job}` failed with exit code {done.returncode} ({said or 'no output'}), so "
                    f"the job was not requeued: {hint}.")
        return f"SLURM job {job} requeued; it resumes from this checkpoint when it starts again."


def _interactive(environ: Mapping[str, str]) -> bool:
    return environ.get("SLURM_JOB_NAME") in _INTERACTIVE_JOB_NAMES


def resolve_environment(plugins: Any) -> ClusterEnvironment | None:
    """``Trainer(plugins=...)`` as the run's cluster environment: the one given, else ``SLURMEnvironment()``
    under a SLURM batch job, else None. Anything else in ``plugins`` is refused, saying where it goes instead."""
    items = [] if plugins is None else list(plugins) if isinstance(plugins, (list, tuple)) else [plugins]
    found: list[ClusterEnvironment] = []
    for item in items:
        if isinstance(item, ClusterEnvironment):
            found.append(item)
            continue
        raise ValueError(
            f"Trainer(plugins=[{item!r}]) is not supported: Ember takes cluster environments there "
            "(trainer.plugins.environments: SLURMEnvironment, LightningEnvironment, TorchElasticEnvironment). "
            "Precision is set with precision= (e.g. 'bf16-mixed'), and checkpoint I/O is Ember's own.")
    if len(found) > 1:
        raise ValueError(f"Trainer(plugins=...) got {len(found)} cluster environments "
                         f"({', '.join(type(e).__name__ for e in found)}): pass one.")
    if found:
        return found[0]
    return SLURMEnvironment() if SLURMEnvironment.detect() else None


def check_environment(environment: ClusterEnvironment, rank: int, world_size: int) -> None:
    """Refuse an environment whose ranks are not the ones the engine was launched with."""
    seen = (environment.global_rank(), environment.world_size())
    if seen != (rank, world_size):
        raise ValueError(
            f"Trainer(plugins=[{type(environment).__name__}(...)]) describes this process as rank {seen[0]} of "
            f"{seen[1]}, but it was launched as rank {rank} of {world_size} (the launcher's variables). Ember takes "
            "the ranks from the launcher: use the environment that matches it (SLURMEnvironment under srun, "
            "TorchElasticEnvironment under torchrun), or none.")
