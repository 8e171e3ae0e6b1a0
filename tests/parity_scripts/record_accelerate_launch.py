"""Record what ``accelerate launch`` 1.15 makes of its flags and of the files ``accelerate config`` writes.

Run with the throwaway venv that has the real package (never a dependency of Ember):

    /work/venvs/acc/bin/python tests/parity_scripts/record_accelerate_launch.py > tests/engine/accelerate_launch_values.py

For each case it parses the command line with Accelerate's own parser, applies the config file as
``accelerate launch`` does (``_validate_launch_command``), and asks Accelerate's launcher helpers for the torchrun
arguments and the environment they would give the workers, without starting a process. The printed module holds
the config files' text and those results; ``tests/engine/test_launch_accelerate_flags.py`` asserts that
``ember launch`` makes the same launch of them.
"""

from __future__ import annotations

import pinned  # noqa: F401 - first: the suite's CPU kernel path before torch loads (tests/kernel_path.py)

# isort: split

import contextlib
import io
import os
import pprint
import subprocess
import sys
import tempfile

import accelerate
from accelerate.commands.config.config_args import ClusterConfig
from accelerate.commands.launch import _validate_launch_command, launch_command_parser
from accelerate.utils.launch import prepare_deepspeed_cmd_env, prepare_multi_gpu_env

folder = tempfile.mkdtemp()
PORT = "29471"  # a port nothing listens on, so Accelerate keeps it (it switches to standalone when busy)

# -- the files `accelerate config` writes ------------------------------------------------------------------
default_file = os.path.join(folder, "default_config.yaml")
subprocess.run([os.path.join(os.path.dirname(sys.executable), "accelerate"), "config", "default", "--config_file",
                default_file, "--mixed_precision", "bf16"], check=True, capture_output=True)
with open(default_file, encoding="utf-8") as handle:
    default_text = handle.read()

# The questionnaire of `accelerate config` ends in ClusterConfig(...).to_yaml_file(path): the same writer here.
COMMON = {"compute_environment": "LOCAL_MACHINE", "use_cpu": False, "machine_rank": 0, "num_machines": 1,
          "main_process_port": int(PORT), "rdzv_backend": "static", "same_network": True,
          "main_training_function": "main", "downcast_bf16": False, "debug": False}
questionnaire = {
    "multi_node": {**COMMON, "distributed_type": "MULTI_GPU", "mixed_precision": "fp16", "num_processes": 8,
                   "machine_rank": 1, "num_machines": 2, "main_process_ip": "10.0.0.1", "gpu_ids": "all"},
    "deepspeed": {**COMMON, "distributed_type": "DEEPSPEED", "mixed_precision": "bf16", "num_processes": 2,
                  "deepspeed_config": {"gradient_accumulation_steps": 1, "offload_optimizer_device": "none",
                                       "offload_param_device": "none", "zero3_init_flag": False, "zero_stage": 2}},
    "fsdp": {**COMMON, "distributed_type": "FSDP", "mixed_precision": "no", "num_processes": 2, "debug": True,
             "fsdp_config": {"fsdp_version": 2, "fsdp_offload_params": False, "fsdp_reshard_after_forward": True,
                             "fsdp_state_dict_type": "SHARDED_STATE_DICT"}},
    # What the questionnaire writes when asked for a ParallelismConfig (FSDP2 x TP on 4 processes).
    "parallelism": {**COMMON, "distributed_type": "FSDP", "mixed_precision": "no", "num_processes": 4,
                    "fsdp_config": {"fsdp_version": 2},
                    "parallelism_config": {"parallelism_config_dp_replicate_size": 1,
                                           "parallelism_config_dp_shard_size": 2, "parallelism_config_tp_size": 2,
                                           "parallelism_config_cp_size": 1}},
}
config_texts = {}
for name, values in questionnaire.items():
    path = os.path.join(folder, f"{name}.yaml")
    ClusterConfig(**values).to_yaml_file(path)
    with open(path, encoding="utf-8") as handle:
        config_texts[name] = handle.read()
config_texts["default"] = default_text

# -- what `accelerate launch` makes of flags and files -----------------------------------------------------
FLAG_CASES = {
    "num_processes": ["--multi_gpu", "--num_processes", "2"],
    "multi_node": ["--multi_gpu", "--num_processes", "8", "--num_machines", "2", "--machine_rank", "1",
                   "--main_process_ip", "10.0.0.1", "--main_process_port", PORT],
    "mixed_precision": ["--multi_gpu", "--num_processes", "2", "--mixed_precision", "fp16"],
    "use_fsdp": ["--use_fsdp", "--num_processes", "2"],
    "use_deepspeed": ["--use_deepspeed", "--num_processes", "2", "--zero_stage", "3",
                      "--deepspeed_config_file", "ds_config.json"],
    "hyphens": ["--multi-gpu", "--num-processes", "2", "--mixed-precision", "bf16"],
    "parallelism": ["--use_fsdp", "--fsdp_version", "2", "--num_processes", "4", "--use_parallelism_config",
                    "--parallelism_config_dp_shard_size", "2", "--parallelism_config_tp_size", "2"],
}
ACCELERATE_SETTINGS = ("ACCELERATE_MIXED_PRECISION", "ACCELERATE_USE_FSDP", "ACCELERATE_USE_DEEPSPEED",
                       "ACCELERATE_DEEPSPEED_ZERO_STAGE", "ACCELERATE_DEEPSPEED_CONFIG_FILE",
                       "ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE", "ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_DEVICE",
                       "ACCELERATE_DEEPSPEED_ZERO3_INIT", "ACCELERATE_GRADIENT_ACCUMULATION_STEPS",
                       "ACCELERATE_DEBUG_MODE", "ACCELERATE_CONFIG_DS_FIELDS", "FSDP_VERSION",
                       "ACCELERATE_USE_PARALLELISM_CONFIG", "PARALLELISM_CONFIG_DP_REPLICATE_SIZE",
                       "PARALLELISM_CONFIG_DP_SHARD_SIZE", "PARALLELISM_CONFIG_TP_SIZE", "PARALLELISM_CONFIG_CP_SIZE",
                       "PARALLELISM_CONFIG_CP_BACKEND", "PARALLELISM_CONFIG_SP_SIZE", "PARALLELISM_CONFIG_SP_BACKEND")


def resolve(argv: list[str]) -> dict[str, object]:
    """The torchrun settings and worker variables ``accelerate launch argv train.py`` would use."""
    args = launch_command_parser().parse_args([*argv, "train.py"])
    args, defaults, mixed_precision_from_config = _validate_launch_command(args)
    if args.use_deepspeed:
        # What `launch_command` sets before it calls the DeepSpeed launcher.
        fields = list(defaults.deepspeed_config) if defaults else []
        args.deepspeed_fields_from_accelerate_config = ",".join(
            fields + (["mixed_precision"] if mixed_precision_from_config else []))
        _, env = prepare_deepspeed_cmd_env(args)
    else:
        env = prepare_multi_gpu_env(args)
    torchrun = {key: getattr(args, key, None) for key in ("nproc_per_node", "nnodes", "node_rank", "rdzv_endpoint",
                                                          "master_addr", "master_port", "rdzv_backend")}
    return {"torchrun": torchrun, "env": {key: env[key] for key in ACCELERATE_SETTINGS if key in env}}


for key in ACCELERATE_SETTINGS:
    os.environ.pop(key, None)
with contextlib.redirect_stdout(io.StringIO()):  # Accelerate prints which defaults it filled in
    flag_results = {name: resolve(argv) for name, argv in FLAG_CASES.items()}
    file_results = {name: resolve(["--config_file", os.path.join(folder, f"{name}.yaml")])
                    for name in ("multi_node", "deepspeed", "fsdp", "parallelism")}

print(f'"""Recorded from accelerate {accelerate.__version__} by tests/parity_scripts/record_accelerate_launch.py: '
      'the files `accelerate config` writes,\nand the torchrun settings and worker variables `accelerate launch` '
      'derives from flags and files."""\n')
print(f"ACCELERATE_VERSION = {accelerate.__version__!r}")
print(f"PORT = {PORT!r}")
print(f"CONFIG_TEXTS = {pprint.pformat(config_texts, width=110)}")
print(f"FLAG_CASES = {pprint.pformat(FLAG_CASES, width=110)}")
print(f"FLAG_RESULTS = {pprint.pformat(flag_results, width=110)}")
print(f"FILE_RESULTS = {pprint.pformat(file_results, width=110)}")
