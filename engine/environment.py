"""Every environment variable the engine acts on, read in one place at one moment.

``EngineEnvironment.from_env()`` is called when an ``Accelerator`` (or the first ``PartialState``) is built, never
at import, so a variable set before that construction takes effect. The result is passed down to the parts that
need it; no other engine module reads ``os.environ`` (the launcher, which writes the children's environment, and
``write_rendezvous_variables`` below, which writes back what ``torch.distributed`` reads, are the exceptions).

>>> env = EngineEnvironment.from_env({"RANK": "1", "WORLD_SIZE": "2", "ACCELERATE_MIXED_PRECISION": "bf16"})
>>> env.launch.rank, env.launch.world_size, env.mixed_precision, env.use_cpu
(1, 2, 'bf16', False)
"""

from __future__ import annotations

import os
import re
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

_TRUE = frozenset({"1", "true", "yes", "y", "on"})

# What `ember env` lists as "Launch environment": the variables that decide who this process is.
_LAUNCH_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                "TORCHELASTIC_RUN_ID", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_JOB_NODELIST",
                "OMP_NUM_THREADS")

# Launchers other than torchrun that describe the processes in variables of their own, in the order tried:
# (rank, world size, local rank, local world size).
_MPI_VARS = (
    ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"),
    ("MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE", "MV2_COMM_WORLD_LOCAL_RANK", "MV2_COMM_WORLD_LOCAL_SIZE"),
)


def _int(environ: Mapping[str, str], *names: str, default: int) -> int:
    for name in names:
        value = environ.get(name)
        if value not in (None, ""):
            return int(value)
    return default


def _flag(environ: Mapping[str, str], name: str) -> bool:
    return environ.get(name, "").strip().lower() in _TRUE


@dataclass(frozen=True)
class LaunchInfo:
    """Rank and world size as the launcher (torchrun, SLURM, MPI) described them in the environment."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    launched: bool


def read_launch(environ: Mapping[str, str]) -> LaunchInfo:
    """Who this process is: torchrun's variables win, then MPI's, then SLURM's; none means one process."""
    if "RANK" in environ or "WORLD_SIZE" in environ or "LOCAL_RANK" in environ:
        world = _int(environ, "WORLD_SIZE", default=1)
        return LaunchInfo(_int(environ, "RANK", default=0), world, _int(environ, "LOCAL_RANK", default=0),
                          _int(environ, "LOCAL_WORLD_SIZE", default=world), True)
    for rank_var, size_var, local_var, local_size_var in _MPI_VARS:
        if _int(environ, size_var, default=1) > 1:
            world = _int(environ, size_var, default=1)
            return LaunchInfo(_int(environ, rank_var, default=0), world, _int(environ, local_var, default=0),
                              _int(environ, local_size_var, default=world), True)
    # SLURM started the processes itself (srun) and no launcher ran: its variables describe the job.
    if _int(environ, "SLURM_NTASKS", default=1) > 1 and "SLURM_PROCID" in environ:
        world = _int(environ, "SLURM_NTASKS", default=1)
        return LaunchInfo(_int(environ, "SLURM_PROCID", default=0), world, _int(environ, "SLURM_LOCALID", default=0),
                          slurm_tasks_on_this_node(environ, world), True)
    return LaunchInfo(0, 1, 0, 1, False)


def slurm_tasks_on_this_node(environ: Mapping[str, str], world: int) -> int:
    """This node's task count from ``SLURM_TASKS_PER_NODE`` (e.g. ``"2(x3),1"``: 2 on nodes 0-2, 1 on node 3)."""
    counts: list[int] = []
    for part in environ.get("SLURM_STEP_TASKS_PER_NODE", environ.get("SLURM_TASKS_PER_NODE", "")).split(","):
        match = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if match:
            counts += [int(match.group(1))] * int(match.group(2) or 1)
    node = _int(environ, "SLURM_NODEID", default=0)
    if node < len(counts):
        return counts[node]
    return _int(environ, "SLURM_NTASKS_PER_NODE", default=world)


def slurm_master_addr(environ: Mapping[str, str]) -> str | None:
    """The first host of the SLURM node list (``"node[03-07,9]"`` -> ``"node03"``), or None outside SLURM."""
    nodes = environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST")
    if not nodes:
        return None
    first = nodes.split(",")[0]
    if "[" in first:
        prefix, ranges = first.split("[", 1)
        first = prefix + ranges.rstrip("]").split(",")[0].split("-")[0]
    return first


# Single variables for the views of an already built state (``PartialState()`` runs per step in collectives and
# schedulers): Accelerate re-reads these on every construction, and reading the whole set there would cost tens
# of microseconds a call.
def read_fork_launched(environ: Mapping[str, str] | None = None) -> bool:
    """``FORK_LAUNCHED`` alone (what ``EngineEnvironment.fork_launched`` holds)."""
    return _flag(os.environ if environ is None else environ, "FORK_LAUNCHED")


def read_use_cpu(environ: Mapping[str, str] | None = None) -> bool:
    """``ACCELERATE_USE_CPU`` alone (what ``EngineEnvironment.use_cpu`` holds)."""
    return _flag(os.environ if environ is None else environ, "ACCELERATE_USE_CPU")


def read_log_level(environ: Mapping[str, str] | None = None) -> str | None:
    """``ACCELERATE_LOG_LEVEL``: the level ``engine.logging.get_logger`` uses when given none (None: unset)."""
    return (os.environ if environ is None else environ).get("ACCELERATE_LOG_LEVEL")


@dataclass(frozen=True)
class ElasticInfo:
    """What torchrun's elastic agent tells a worker about the attempt it belongs to (all unset elsewhere)."""

    restart_count: int | None = None  # TORCHELASTIC_RESTART_COUNT: 0 for the first attempt, 1 after a restart...
    agent_store: bool = False  # TORCHELASTIC_USE_AGENT_STORE=True: MASTER_ADDR:MASTER_PORT is the agent's store


def read_elastic(environ: Mapping[str, str]) -> ElasticInfo:
    """The ``TORCHELASTIC_*`` variables of a torchrun worker (torch writes the bool as ``"True"`` / ``"False"``)."""
    count = environ.get("TORCHELASTIC_RESTART_COUNT", "").strip()
    return ElasticInfo(int(count) if count.isdigit() else None,
                       environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True")


@dataclass(frozen=True)
class EngineEnvironment:
    """The engine's view of the environment variables, taken once.

    Values that Accelerate parses where it uses them (``mixed_precision``, ``gradient_accumulation_steps``) are
    kept as the raw text (``None`` when unset), so a bad value fails where and as it did before.
    """

    launch: LaunchInfo
    master_addr: str | None  # MASTER_ADDR (None: unset, so the rendezvous must be given one)
    master_port: str | None  # MASTER_PORT
    slurm_master_addr: str | None  # first host of SLURM_JOB_NODELIST / SLURM_NODELIST
    slurm_job_id: str  # SLURM_JOB_ID ("" outside SLURM)
    omp_num_threads: str | None  # OMP_NUM_THREADS
    use_cpu: bool  # ACCELERATE_USE_CPU
    debug_mode: bool  # ACCELERATE_DEBUG_MODE
    torch_device: str | None  # ACCELERATE_TORCH_DEVICE
    mixed_precision: str | None  # ACCELERATE_MIXED_PRECISION
    use_fsdp: bool  # ACCELERATE_USE_FSDP (what `ember launch --use-fsdp` sets)
    gradient_accumulation_steps: str | None  # ACCELERATE_GRADIENT_ACCUMULATION_STEPS
    fork_launched: bool  # FORK_LAUNCHED
    use_deepspeed: bool = False  # ACCELERATE_USE_DEEPSPEED (what `ember launch --use_deepspeed` sets)
    # DeepSpeedPlugin's settings as `accelerate launch` passes them: every ACCELERATE_DEEPSPEED_* variable, and
    # ACCELERATE_GRADIENT_CLIPPING / ACCELERATE_FP8_BACKEND / ACCELERATE_FP8_OPT_LEVEL (raw text; its steps are
    # gradient_accumulation_steps).
    deepspeed: dict[str, str] = field(default_factory=dict)
    # ParallelismConfig's sizes and backends as `accelerate launch` passes them: every PARALLELISM_CONFIG_* variable;
    # ACCELERATE_USE_PARALLELISM_CONFIG=true makes an Accelerator build one from them.
    parallelism: dict[str, str] = field(default_factory=dict)
    use_parallelism_config: bool = False
    cpu_bf16: str | None = None  # EMBER_CPU_BF16: "1" / "0" overrides whether the CPU computes bf16 natively
    # ACCELERATE_FP8_BACKEND, ACCELERATE_FP8_PAD_INNER_DIM, ... (raw text; read by engine.precision.fp8 where Accelerate does).
    fp8: dict[str, str] = field(default_factory=dict)
    elastic: ElasticInfo = field(default_factory=ElasticInfo)  # TORCHELASTIC_* (torchrun's attempt)
    # EMBER_ALLOW_WORLD_SIZE_CHANGE: a Trainer may resume a checkpoint saved by another number of processes
    # (no longer bitwise; refused by default).
    allow_world_size_change: bool = False

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> EngineEnvironment:
        """Read the variables from ``environ`` (default: ``os.environ``, now)."""
        env = os.environ if environ is None else environ
        return cls(
            launch=read_launch(env),
            master_addr=env.get("MASTER_ADDR"),
            master_port=env.get("MASTER_PORT"),
            slurm_master_addr=slurm_master_addr(env),
            slurm_job_id=env.get("SLURM_JOB_ID", ""),
            omp_num_threads=env.get("OMP_NUM_THREADS"),
            use_cpu=read_use_cpu(env),
            debug_mode=_flag(env, "ACCELERATE_DEBUG_MODE"),
            torch_device=env.get("ACCELERATE_TORCH_DEVICE"),
            mixed_precision=env.get("ACCELERATE_MIXED_PRECISION"),
            # Accelerate's own test here (no strip, no "yes"/"on"), kept so a value means what it meant there.
            use_fsdp=env.get("ACCELERATE_USE_FSDP", "").lower() in ("1", "true"),
            gradient_accumulation_steps=env.get("ACCELERATE_GRADIENT_ACCUMULATION_STEPS"),
            fork_launched=read_fork_launched(env),
            use_deepspeed=env.get("ACCELERATE_USE_DEEPSPEED", "").lower() in ("1", "true"),
            deepspeed={k: v for k, v in env.items() if k.startswith("ACCELERATE_DEEPSPEED_") or k in (
                "ACCELERATE_GRADIENT_CLIPPING", "ACCELERATE_FP8_BACKEND", "ACCELERATE_FP8_OPT_LEVEL")},
            parallelism={k: v for k, v in env.items() if k.startswith("PARALLELISM_CONFIG_")},
            use_parallelism_config=env.get("ACCELERATE_USE_PARALLELISM_CONFIG", "false").lower() == "true",
            cpu_bf16=env.get("EMBER_CPU_BF16"),
            fp8={k: v for k, v in env.items() if k.startswith("ACCELERATE_FP8_")},
            elastic=read_elastic(env),
            allow_world_size_change=_flag(env, "EMBER_ALLOW_WORLD_SIZE_CHANGE"),
        )


def announce_deepspeed() -> None:
    """Set ``ACCELERATE_USE_DEEPSPEED=true``, as Accelerate's Accelerator does when given a DeepSpeed plugin: code
    that asks the environment (transformers, a later Accelerator of the process) sees DeepSpeed in use."""
    os.environ["ACCELERATE_USE_DEEPSPEED"] = "true"


def write_rendezvous_variables(env: EngineEnvironment, use_cuda: bool) -> None:
    """Write the rank variables back (as torchrun would) and fill in what a gloo/nccl rendezvous needs.

    ``torch.distributed.init_process_group`` reads ``MASTER_ADDR`` / ``MASTER_PORT`` from ``os.environ``, and
    child processes (DataLoader workers, user scripts) expect torchrun's names whatever launcher started the job.
    """
    launch = env.launch
    os.environ["RANK"] = str(launch.rank)
    os.environ["WORLD_SIZE"] = str(launch.world_size)
    os.environ["LOCAL_RANK"] = str(launch.local_rank)
    os.environ["LOCAL_WORLD_SIZE"] = str(launch.local_world_size)
    if env.master_addr is None:
        addr = env.slurm_master_addr
        if addr is None and launch.local_world_size < launch.world_size:
            raise ValueError(f"This run spans several nodes (WORLD_SIZE={launch.world_size}, "
                             f"LOCAL_WORLD_SIZE={launch.local_world_size}) but MASTER_ADDR is not set: set it to the "
                             "address of the rank-0 node, or start the job with `ember launch --rdzv-endpoint`.")
        os.environ["MASTER_ADDR"] = addr or "127.0.0.1"
    if env.master_port is None:
        # Under SLURM several jobs may share a node: derive the port from the job id rather than all using 29500.
        job_id = env.slurm_job_id
        os.environ["MASTER_PORT"] = str(15000 + int(job_id) % 20000) if job_id.isdigit() else "29500"
    if not use_cuda and env.omp_num_threads is None:
        threads = max(1, (os.cpu_count() or 1) // max(1, launch.local_world_size))
        torch.set_num_threads(threads)
        warnings.warn(f"OMP_NUM_THREADS is not set: using {threads} threads per process "
                      f"({os.cpu_count()} cores / {launch.local_world_size} local processes). "
                      "Set OMP_NUM_THREADS to choose.", stacklevel=3)


def describe(environ: Mapping[str, str] | None = None) -> list[str]:
    """The two lines ``ember env`` prints about the environment: the launch variables and Ember's settings."""
    env = os.environ if environ is None else environ
    launch = {k: env[k] for k in _LAUNCH_VARS if k in env}
    settings = {k: v for k, v in env.items() if k.startswith(("EMBER_", "ACCELERATE_"))}
    return ["Launch environment: " + (", ".join(f"{k}={v}" for k, v in launch.items()) or "none (1 process)"),
            "Ember settings: " + (", ".join(f"{k}={v}" for k, v in sorted(settings.items())) or "none")]


__all__ = ["ElasticInfo", "EngineEnvironment", "LaunchInfo", "describe", "read_elastic", "read_fork_launched",
           "read_launch", "read_log_level", "read_use_cpu", "write_rendezvous_variables"]
