"""Where ``ember launch``'s settings come from: flags (torchrun's or ``accelerate launch``'s spellings) over a
config file (Ember's, or the one ``accelerate config`` writes) over the defaults.

Accelerate describes a job by the total process count and machines (``num_processes=8, num_machines=2``), the
main machine's address (``main_process_ip`` / ``main_process_port``) and a ``distributed_type``; torchrun, and
so ``ember launch``, by processes per node (``nproc_per_node=4, nnodes=2``) and a rendezvous endpoint. This
module turns the first into the second, so that an ``accelerate launch`` command line or config file starts the
same job under ``ember launch``. The values it relies on were observed from Accelerate 1.15
(``tests/parity_scripts/record_accelerate_launch.py``).

>>> resolve_aliases({"num_processes": 8, "nnodes": "2", "main_process_ip": "10.0.0.1", "main_process_port": 29400})
{'nnodes': '2', 'nproc_per_node': 4, 'rdzv_endpoint': '10.0.0.1:29400'}
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping
from typing import Any

from engine.launch.config import (
    DEEPSPEED_VARIABLES,
    PARALLELISM_VARIABLES,
    LaunchConfig,
    LaunchSettingError,
    default_config_path,
    load_config,
    read_config_file,
)

# Accelerate's port when none is given (its launcher's default).
DEFAULT_MAIN_PROCESS_PORT = 29500
# The settings only Accelerate's spelling has; `resolve_aliases` turns them into Ember's.
ALIASES = ("num_processes", "main_process_ip", "main_process_port", "zero_stage", "deepspeed_config_file",
           *PARALLELISM_VARIABLES)
SETTING_NAMES = (*LaunchConfig.field_names(), *ALIASES)
# A flag for the first setting replaces a file's value for any of the others (the same setting, spelled
# differently).
_SAME_SETTING = (("nproc_per_node", ("num_processes",)), ("num_processes", ("nproc_per_node",)),
                 ("rdzv_endpoint", ("main_process_ip", "main_process_port")),
                 ("main_process_ip", ("rdzv_endpoint",)), ("main_process_port", ("rdzv_endpoint",)))

# `distributed_type` values of an Accelerate config and what they ask of `ember launch`.
_DISTRIBUTED_TYPES = {"NO": {}, "MULTI_CPU": {}, "MULTI_GPU": {}, "FSDP": {"use_fsdp": True},
                      "DEEPSPEED": {"use_deepspeed": True}}
# Keys of an Accelerate config that need nothing here (the launch is the same whatever they say), or that only
# matter to launchers Ember does not have (TPU pods, SageMaker, mpirun are refused through distributed_type /
# compute_environment below).
_NOTHING_TO_DO = {"compute_environment", "distributed_type", "downcast_bf16", "main_training_function",
                  "enable_cpu_affinity", "same_network", "tpu_use_cluster", "tpu_use_sudo", "tpu_name", "tpu_zone",
                  "commands", "command_file", "tpu_vm", "tpu_env", "dynamo_config", "mpirun_config", "fp8_config",
                  "megatron_lm_config", "ipex_config"}

# `accelerate launch` flags that `ember launch` does not take, and what to do instead.
UNSUPPORTED_FLAGS = {
    "num_cpu_threads_per_process": "set OMP_NUM_THREADS=N (by default ember launch shares the cores out between "
                                   "the processes)",
    "gpu_ids": "set CUDA_VISIBLE_DEVICES=0,1,... before ember launch",
    "gradient_accumulation_steps": "pass gradient_accumulation_steps to Accelerator(...) (or set "
                                   "ACCELERATE_GRADIENT_ACCUMULATION_STEPS)",
    "dynamo_backend": "compile in the script (torch.compile, or Trainer(compile=True))",
    "tpu": "Ember has no TPU/XLA backend",
    "use_megatron_lm": "Ember has no Megatron-LM backend (FSDP2 shards large models: --use_fsdp)",
    "same_network": "not needed: with --num_machines > 1 every node reaches --main_process_ip:--main_process_port",
}


def settings_from(config_file: str | None, flags: Mapping[str, Any]) -> LaunchConfig:
    """The launch settings: ``flags`` that are not None over the file's (``config_file``, else the default file if
    it exists), in either spelling.

    A flag replaces the file's value of the same setting in the other spelling too: ``--nproc-per-node 2`` wins
    over a file's ``num_processes: 8``, ``--rdzv-endpoint`` over its ``main_process_ip``.
    """
    path = config_file or default_config_path()
    if config_file is not None and not os.path.isfile(path):
        raise LaunchSettingError(f"--config-file {config_file!r} does not exist: write it with "
                                 f"`ember config --config-file {config_file}` (or `accelerate config --config_file "
                                 f"{config_file}`), or leave the flag out.")
    values = load_settings_file(path) if os.path.isfile(path) else {}
    given = {k: v for k, v in flags.items() if k in SETTING_NAMES and v is not None}
    if "main_process_port" in given and "main_process_ip" not in {**values, **given} and values.get("rdzv_endpoint"):
        values["main_process_ip"] = str(values["rdzv_endpoint"]).rpartition(":")[0]  # a new port, the file's host
    for flag, spellings in _SAME_SETTING:
        if flag in given:
            for other in spellings:
                values.pop(other, None)
    if "deepspeed_config" in values and any(k in given for k in ("zero_stage", "deepspeed_config_file")):
        values["deepspeed_config"] = dict(values["deepspeed_config"])  # the flags' keys are merged into it
    if "parallelism_config" in values and any(k in given for k in PARALLELISM_VARIABLES):
        values["parallelism_config"] = dict(values["parallelism_config"])
    return LaunchConfig(**resolve_aliases({**values, **given}))


def load_settings_file(path: str) -> dict[str, Any]:
    """A launch config file's settings, Ember's file or ``accelerate config``'s (its aliases unresolved)."""
    values = read_config_file(path)
    if is_accelerate_config(values):
        settings = from_accelerate_config(values, path)
        try:  # checked now, so that a bad value names the file
            LaunchConfig(**resolve_aliases(settings))
        except ValueError as err:
            raise LaunchSettingError(f"{path}: {err}") from None
        return settings
    return load_config(path)


def is_accelerate_config(values: Mapping[str, Any]) -> bool:
    """Whether a launch config file's mapping was written by ``accelerate config`` (it always names these)."""
    return "distributed_type" in values or "compute_environment" in values


def from_accelerate_config(values: Mapping[str, Any], path: str) -> dict[str, Any]:
    """The ``ember launch`` settings of an ``accelerate config`` file (Accelerate's aliases left for
    ``resolve_aliases``); raises ``LaunchSettingError`` naming what Ember cannot launch."""
    def bad(key: str, why: str) -> LaunchSettingError:
        return LaunchSettingError(f"{path} (an accelerate config file): {key}={values[key]!r} {why}")

    if values.get("compute_environment", "LOCAL_MACHINE") != "LOCAL_MACHINE":
        raise bad("compute_environment", "is not supported: ember launch starts processes on this machine "
                                         "(LOCAL_MACHINE).")
    kind = str(values.get("distributed_type", "NO"))
    if kind not in _DISTRIBUTED_TYPES:
        raise bad("distributed_type", f"is not supported: Ember launches {sorted(_DISTRIBUTED_TYPES)} (DDP on CPUs "
                                      "or GPUs, FSDP2, DeepSpeed).")
    settings: dict[str, Any] = dict(_DISTRIBUTED_TYPES[kind])
    direct = {"mixed_precision": "mixed_precision", "use_cpu": "cpu", "debug": "debug", "num_machines": "nnodes",
              "machine_rank": "node_rank", "rdzv_backend": "rdzv_backend", "max_restarts": "max_restarts",
              "num_processes": "num_processes", "main_process_ip": "main_process_ip",
              "main_process_port": "main_process_port"}
    for key, value in values.items():
        if key in direct:
            if value is not None and not (key == "num_processes" and value == -1):  # -1: "pass it as a flag"
                settings[direct[key]] = str(value) if key == "num_machines" else value
        elif key == "deepspeed_config":
            unknown = sorted(set(value or {}) - set(DEEPSPEED_VARIABLES))
            if unknown:
                raise bad(key, f"has settings ember launch cannot pass on: {unknown}; known: "
                               f"{sorted(DEEPSPEED_VARIABLES)}.")
            if value:
                settings["deepspeed_config"] = dict(value)
        elif key == "parallelism_config":
            unknown = sorted(set(value or {}) - set(PARALLELISM_VARIABLES))
            if unknown:
                raise bad(key, f"has settings ember launch cannot pass on: {unknown}; known: "
                               f"{sorted(PARALLELISM_VARIABLES)}.")
            if value:  # accelerate launch: use_parallelism_config is "the file has a parallelism_config"
                settings["parallelism_config"] = dict(value)
                settings["use_parallelism_config"] = True
        elif key == "fsdp_config":
            settings.update(_fsdp_settings(value or {}, path))
        elif key == "gpu_ids":
            if value not in (None, "all"):
                raise bad(key, "is not read by ember launch: set CUDA_VISIBLE_DEVICES instead and remove gpu_ids.")
        elif key not in _NOTHING_TO_DO:
            raise bad(key, "is not a setting ember launch knows (accelerate 1.15 does not write it).")
    if settings.get("rdzv_backend") not in (None, "c10d", "static", "etcd-v2"):
        settings.pop("rdzv_backend")  # Accelerate's other choices are torchrun's too; ours default to c10d
    return settings


def _fsdp_settings(fsdp: Mapping[str, Any], path: str) -> dict[str, Any]:
    version = fsdp.get("fsdp_version", 1)
    if str(version) != "2":
        raise LaunchSettingError(f"{path}: fsdp_config.fsdp_version={version!r} is not supported: Ember implements "
                                 "FSDP2 (torch.distributed.fsdp.fully_shard); set fsdp_version: 2.")
    rest = sorted(set(fsdp) - {"fsdp_version"})
    if rest:
        # The engine builds a default FullyShardedDataParallelPlugin under `ember launch --use-fsdp`; these
        # belong in the script, where they are checked when the plugin is built.
        warnings.warn(f"{path}: the fsdp_config settings {rest} are not applied by ember launch: pass them to "
                      "FullyShardedDataParallelPlugin(...) in the script (e.g. reshard_after_forward, cpu_offload, "
                      "state_dict_type). Launching with the default plugin.", stacklevel=2)
    return {}


def resolve_aliases(values: Mapping[str, Any]) -> dict[str, Any]:
    """Accelerate's settings (total ``num_processes``, ``main_process_ip`` / ``port``, DeepSpeed keys) turned
    into Ember's (``nproc_per_node``, ``rdzv_endpoint``, ``deepspeed_config``); the rest unchanged."""
    settings = {k: v for k, v in values.items() if k not in ALIASES}
    total = values.get("num_processes")
    if total is not None:
        settings["nproc_per_node"] = _per_node(total, str(settings.get("nnodes", "1")),
                                               settings.get("nproc_per_node"))
    ip, port = values.get("main_process_ip"), values.get("main_process_port")
    if ip is not None:
        endpoint = f"{ip}:{port if port is not None else DEFAULT_MAIN_PROCESS_PORT}"
        if settings.get("rdzv_endpoint") not in (None, endpoint):
            raise LaunchSettingError(f"Both main_process_ip={ip!r} and rdzv_endpoint={settings['rdzv_endpoint']!r} "
                                     "were given: they are the same setting, give one.")
        settings["rdzv_endpoint"] = endpoint
    # main_process_port alone: on one machine torchrun's standalone rendezvous picks a free port itself, and
    # several machines need the address too (LaunchConfig says so).
    deepspeed = {k: values[k] for k in ("zero_stage", "deepspeed_config_file") if values.get(k) is not None}
    if deepspeed:
        settings["deepspeed_config"] = {**(settings.get("deepspeed_config") or {}), **deepspeed}
    parallelism = {k: values[k] for k in PARALLELISM_VARIABLES if values.get(k) is not None}
    if parallelism:
        settings["parallelism_config"] = {**(settings.get("parallelism_config") or {}), **parallelism}
    return settings


def _per_node(total: Any, nnodes: str, per_node: Any) -> int:
    if isinstance(total, bool) or not isinstance(total, int) or total < 1:
        raise LaunchSettingError(f"Launch setting num_processes={total!r} is invalid: expected the total number of "
                                 "processes over all machines, a positive integer.")
    if not nnodes.isdigit():
        raise LaunchSettingError(f"num_processes={total} (a total over all machines) cannot be split over an elastic "
                                 f"nnodes={nnodes!r}: give --nproc-per-node instead.")
    nodes = int(nnodes)
    if total % nodes:
        raise LaunchSettingError(f"num_processes={total} (a total over all machines) does not divide into "
                                 f"num_machines={nodes}: give a multiple of {nodes}, or --nproc-per-node.")
    if per_node is not None and per_node != total // nodes:
        raise LaunchSettingError(f"Both num_processes={total} (in total) and nproc_per_node={per_node} (per machine, "
                                 f"over {nodes} machine(s)) were given and disagree: give one.")
    return total // nodes


def unknown_flag_message(flag: str, known: list[str]) -> str:
    """What to say about an ``ember launch`` / ``ember config`` flag nobody defined: the close match, or what to
    do instead of an ``accelerate launch`` flag Ember does not take."""
    from engine.keywords import close_matches

    name = flag.split("=", 1)[0]
    bare = name.lstrip("-").replace("-", "_")
    if bare in UNSUPPORTED_FLAGS:
        return f"{name} (an accelerate launch flag) is not supported: {UNSUPPORTED_FLAGS[bare]}."
    # Offer the spelling the user writes: underscores (Accelerate's habit) or hyphens (torchrun's).
    def separator(flag: str) -> str | None:
        return "_" if "_" in flag else "-" if "-" in flag[2:] else None

    style = [k for k in known if separator(k) in (None, separator(name))] if separator(name) else list(known)
    matches = close_matches(name, style or known)
    if matches:
        return f"unrecognized argument {name}. Did you mean {' or '.join(matches)}?"
    return f"unrecognized argument {name} (see --help for the flags)."


__all__ = ["UNSUPPORTED_FLAGS", "from_accelerate_config", "is_accelerate_config", "load_settings_file",
           "resolve_aliases", "settings_from", "unknown_flag_message"]
