"""The settings of ``ember launch``, and the YAML file ``ember config`` saves them in.

The file lives at ``$EMBER_CONFIG_FILE`` or, by default, ``~/.cache/ember/default_config.yaml`` (under
``$XDG_CACHE_HOME`` when that is set). Flags given to ``ember launch`` win over the file; the file wins over the
built-in defaults (``engine.launch.settings`` merges them, and reads ``accelerate config`` files too).

>>> LaunchConfig(nproc_per_node=2, mixed_precision="bf16").to_dict()["mixed_precision"]
'bf16'
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

PRECISIONS = ("no", "fp16", "bf16", "fp8")
RDZV_BACKENDS = ("c10d", "static", "etcd-v2")
_NNODES = re.compile(r"^(\d+)(?::(\d+))?$")
# The variables `accelerate launch` gives the workers for each DeepSpeed setting (the keys of an accelerate
# config file's `deepspeed_config`), recorded from Accelerate 1.15; the engine's DeepSpeed backend reads them.
DEEPSPEED_VARIABLES = {
    "zero_stage": "ACCELERATE_DEEPSPEED_ZERO_STAGE",
    "deepspeed_config_file": "ACCELERATE_DEEPSPEED_CONFIG_FILE",
    "offload_optimizer_device": "ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE",
    "offload_param_device": "ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_DEVICE",
    "zero3_init_flag": "ACCELERATE_DEEPSPEED_ZERO3_INIT",
    "zero3_save_16bit_model": "ACCELERATE_DEEPSPEED_ZERO3_SAVE_16BIT_MODEL",
    "gradient_accumulation_steps": "ACCELERATE_GRADIENT_ACCUMULATION_STEPS",
    "gradient_clipping": "ACCELERATE_GRADIENT_CLIPPING",
}

# `accelerate launch --parallelism_config_*` flags (and `parallelism_config:` keys of its config file) and the
# environment variables they set for ParallelismConfig(); ACCELERATE_USE_PARALLELISM_CONFIG=true goes with them.
PARALLELISM_VARIABLES = {
    "parallelism_config_dp_replicate_size": "PARALLELISM_CONFIG_DP_REPLICATE_SIZE",
    "parallelism_config_dp_shard_size": "PARALLELISM_CONFIG_DP_SHARD_SIZE",
    "parallelism_config_tp_size": "PARALLELISM_CONFIG_TP_SIZE",
    "parallelism_config_cp_size": "PARALLELISM_CONFIG_CP_SIZE",
    "parallelism_config_cp_backend": "PARALLELISM_CONFIG_CP_BACKEND",
    "parallelism_config_cp_comm_strategy": "PARALLELISM_CONFIG_CP_COMM_STRATEGY",
    "parallelism_config_sp_size": "PARALLELISM_CONFIG_SP_SIZE",
    "parallelism_config_sp_backend": "PARALLELISM_CONFIG_SP_BACKEND",
}

# What accelerate launch sets for the sizes and backends not given.
PARALLELISM_DEFAULTS: dict[str, Any] = {
    "parallelism_config_dp_replicate_size": 1, "parallelism_config_dp_shard_size": 1, "parallelism_config_tp_size": 1,
    "parallelism_config_cp_size": 1, "parallelism_config_cp_backend": "torch", "parallelism_config_sp_size": 1,
    "parallelism_config_sp_backend": "deepspeed"}


def default_config_path() -> str:
    """``$EMBER_CONFIG_FILE``, else ``default_config.yaml`` in Ember's cache folder."""
    explicit = os.environ.get("EMBER_CONFIG_FILE")
    if explicit:
        return os.path.abspath(os.path.expanduser(explicit))
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "ember", "default_config.yaml")


class LaunchSettingError(ValueError):
    """A launch setting (flag or config file) is invalid; ``ember`` prints it as one line, without a traceback."""


def _bad(key: str, value: Any, expected: str) -> LaunchSettingError:
    return LaunchSettingError(f"Launch setting {key}={value!r} is invalid: expected {expected}.")


@dataclass
class LaunchConfig:
    """What ``ember launch`` needs to start a job; every field can come from the config file or a flag."""

    nproc_per_node: int | None = None
    nnodes: str = "1"
    node_rank: int = 0
    rdzv_endpoint: str | None = None
    rdzv_backend: str | None = None
    rdzv_id: str | None = None
    max_restarts: int = 0
    mixed_precision: str = "no"
    cpu: bool = False
    use_fsdp: bool = False
    debug: bool = False
    use_deepspeed: bool = False
    deepspeed_config: dict[str, Any] | None = None  # DEEPSPEED_VARIABLES' keys (zero_stage, ...), as Accelerate's
    use_parallelism_config: bool = False
    parallelism_config: dict[str, Any] | None = None  # PARALLELISM_VARIABLES' keys, as Accelerate's config file

    def __post_init__(self) -> None:
        def is_int(value: Any) -> bool:
            return isinstance(value, int) and not isinstance(value, bool)

        if self.nproc_per_node is not None and (not is_int(self.nproc_per_node) or self.nproc_per_node < 1):
            raise _bad("nproc_per_node", self.nproc_per_node, "a positive integer")
        self.nnodes = str(self.nnodes)
        match = _NNODES.match(self.nnodes)
        if match is None or int(match.group(1)) < 1 or int(match.group(2) or match.group(1)) < int(match.group(1)):
            raise _bad("nnodes", self.nnodes, "a positive integer N, or MIN:MAX with MIN <= MAX")
        if not is_int(self.node_rank) or not 0 <= self.node_rank < self.max_nodes:
            raise _bad("node_rank", self.node_rank, f"an integer from 0 to {self.max_nodes - 1} (nnodes={self.nnodes})")
        if self.rdzv_endpoint is not None:
            host, _, port = str(self.rdzv_endpoint).rpartition(":")
            if not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise _bad("rdzv_endpoint", self.rdzv_endpoint, "HOST:PORT, the address of node 0, e.g. 10.0.0.1:29400")
        if self.multi_node and self.rdzv_endpoint is None:
            raise LaunchSettingError(f"nnodes={self.nnodes} runs on several machines, which must find each other: pass "
                                     "--rdzv-endpoint HOST:PORT (or --main_process_ip HOST --main_process_port "
                                     "PORT: node 0's address and a free port) on every node.")
        if self.rdzv_backend is not None and self.rdzv_backend not in RDZV_BACKENDS:
            raise _bad("rdzv_backend", self.rdzv_backend, f"one of {RDZV_BACKENDS}")
        if not is_int(self.max_restarts) or self.max_restarts < 0:
            raise _bad("max_restarts", self.max_restarts, "an integer >= 0")
        if self.mixed_precision not in PRECISIONS:
            raise _bad("mixed_precision", self.mixed_precision, f"one of {PRECISIONS}")
        for flag in ("cpu", "use_fsdp", "debug", "use_deepspeed", "use_parallelism_config"):
            if not isinstance(getattr(self, flag), bool):
                raise _bad(flag, getattr(self, flag), "true or false")
        self._check_deepspeed()
        self._check_parallelism()

    def _check_parallelism(self) -> None:
        if self.parallelism_config is None:
            return
        if not isinstance(self.parallelism_config, dict):
            raise _bad("parallelism_config", self.parallelism_config, f"a mapping of {sorted(PARALLELISM_VARIABLES)}")
        unknown = sorted(set(self.parallelism_config) - set(PARALLELISM_VARIABLES))
        if unknown:
            raise _bad("parallelism_config", self.parallelism_config,
                       f"only the keys {sorted(PARALLELISM_VARIABLES)}, not {unknown}")
        for key, value in self.parallelism_config.items():
            if key.endswith("_size") and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise _bad(key, value, "a positive integer")
        if self.parallelism_config and not self.use_parallelism_config:
            # accelerate launch ignores them then; a setting that does nothing is a mistake to report.
            raise LaunchSettingError(f"Parallelism settings {sorted(self.parallelism_config)} were given without "
                                     "use_parallelism_config: add --use_parallelism_config, or remove them.")

    def _check_deepspeed(self) -> None:
        if self.use_deepspeed and self.use_fsdp:
            raise LaunchSettingError("use_deepspeed and use_fsdp were both set: each shards the model its own way, "
                                     "choose one.")
        if self.deepspeed_config is None:
            return
        if not isinstance(self.deepspeed_config, dict):
            raise _bad("deepspeed_config", self.deepspeed_config, f"a mapping of {sorted(DEEPSPEED_VARIABLES)}")
        unknown = sorted(set(self.deepspeed_config) - set(DEEPSPEED_VARIABLES))
        if unknown:
            raise _bad("deepspeed_config", self.deepspeed_config, f"only the keys {sorted(DEEPSPEED_VARIABLES)}, "
                                                                 f"not {unknown}")
        stage = self.deepspeed_config.get("zero_stage")
        if stage is not None and stage not in (0, 1, 2, 3):
            raise _bad("zero_stage", stage, "0, 1, 2 or 3")
        if self.deepspeed_config and not self.use_deepspeed:
            # accelerate launch ignores them silently then; a setting that does nothing is a mistake to report.
            raise LaunchSettingError(f"DeepSpeed settings {sorted(self.deepspeed_config)} were given without "
                                     "use_deepspeed: add --use_deepspeed, or remove them.")

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    @property
    def max_nodes(self) -> int:
        match = _NNODES.match(self.nnodes)
        assert match is not None
        return int(match.group(2) or match.group(1))

    @property
    def multi_node(self) -> bool:
        return self.max_nodes > 1

    def uses_cpu(self) -> bool:
        """Whether the workers will train on the CPU (``cpu=True``, or no GPU here)."""
        if self.cpu:
            return True
        import torch

        return not torch.cuda.is_available()

    def resolved_nproc_per_node(self) -> int:
        """``nproc_per_node``, or one process per visible GPU, or 1."""
        if self.nproc_per_node is not None:
            return self.nproc_per_node
        if self.uses_cpu():
            return 1
        import torch

        return max(1, torch.cuda.device_count())

    def to_dict(self) -> dict[str, Any]:
        """The settings that are set (None left out), in field order."""
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}


def _yaml() -> Any:
    try:
        import yaml
    except ImportError:
        raise ImportError("Ember's launch config file is YAML: install PyYAML (`pip install pyyaml`, or "
                          "`pip install ember-train[all]`).") from None
    return yaml


def read_config_file(path: str) -> dict[str, Any]:
    """The mapping a YAML (or JSON, which ``accelerate config default`` writes) launch config file holds."""
    with open(path, encoding="utf-8") as handle:
        values = _yaml().safe_load(handle) or {}
    if not isinstance(values, dict):
        raise LaunchSettingError(
            f"{path} must hold a mapping of launch settings, got {type(values).__name__}.")
    return values


def load_config(path: str) -> dict[str, Any]:
    """Read and check an Ember launch config file; raises ``ValueError`` naming an unknown key or a bad value."""
    values = read_config_file(path)
    unknown = sorted(set(values) - set(LaunchConfig.field_names()))
    if unknown:
        raise LaunchSettingError(f"{path} has unknown launch settings {unknown}; known: "
                                 f"{list(LaunchConfig.field_names())}. Rewrite it with `ember config`.")
    try:
        LaunchConfig(**values)
    except ValueError as err:
        raise LaunchSettingError(f"{path}: {err}") from None
    return dict(values)


def save_config(values: Mapping[str, Any], path: str) -> None:
    """Write ``values`` (checked first) to ``path`` as YAML, replacing the file atomically."""
    checked = LaunchConfig(**values).to_dict()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    temp = f"{path}.tmp-{os.getpid()}"
    with open(temp, "w", encoding="utf-8") as handle:
        _yaml().safe_dump(checked, handle, sort_keys=False)
    os.replace(temp, path)
