"""``ember launch`` takes ``accelerate launch``'s flags and ``accelerate config``'s files: each makes the same launch
(torchrun arguments and worker variables) as its torchrun spelling, and the numbers Accelerate 1.15 derives from
them (recorded in ``accelerate_launch_values.py``). No process is started here; ``tests/distributed/test_launch.py``
runs one real launch with Accelerate's spelling."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from engine.launch.cli import main
from engine.launch.settings import settings_from
from engine.launch.torchrun import add_launch_commands, torchrun_arguments, worker_environment
from tests.engine import accelerate_launch_values as recorded


@pytest.fixture(autouse=True)
def no_default_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EMBER_CONFIG_FILE", str(tmp_path / "none.yaml"))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


def plan(*flags: str) -> tuple[list[str], dict[str, str]]:
    """What ``ember launch FLAGS train.py`` would run: torchrun's arguments and the workers' Ember variables."""
    parser = argparse.ArgumentParser()
    add_launch_commands(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["launch", *flags, "train.py"])
    config = settings_from(args.config_file, vars(args))
    return torchrun_arguments(config, "train.py", []), worker_environment(config)


def torchrun_setting(argv: list[str], flag: str) -> str | None:
    return argv[argv.index(flag) + 1] if flag in argv else None


MULTI_NODE = ["--num_processes", "8", "--num_machines", "2", "--machine_rank", "1", "--main_process_ip", "10.0.0.1",
              "--main_process_port", recorded.PORT]
PAIRS = {  # accelerate launch's spelling -> torchrun's (Ember's own) spelling
    "num_processes": (["--num_processes", "2"], ["--nproc-per-node", "2"]),
    "hyphens": (["--num-processes", "2", "--mixed-precision", "bf16"], ["--nproc-per-node", "2", "--mixed-precision",
                                                                       "bf16"]),
    "multi_gpu": (["--multi_gpu", "--num_processes", "2"], ["--nproc-per-node", "2"]),
    "multi_node": (MULTI_NODE, ["--nproc-per-node", "4", "--nnodes", "2", "--node-rank", "1", "--rdzv-endpoint",
                                f"10.0.0.1:{recorded.PORT}"]),
    "mixed_precision": (["--mixed_precision", "fp16"], ["--mixed-precision", "fp16"]),
    "cpu": (["--cpu", "--num_processes", "2"], ["--cpu", "--nproc-per-node", "2"]),
    "use_fsdp": (["--use_fsdp", "--num_processes", "2"], ["--use-fsdp", "--nproc-per-node", "2"]),
    "use_deepspeed": (["--use_deepspeed", "--zero_stage", "3", "--deepspeed_config_file", "ds_config.json"],
                      ["--use-deepspeed", "--zero-stage", "3", "--deepspeed-config-file", "ds_config.json"]),
    "machine_rank_static": (["--num_machines", "2", "--machine_rank", "1", "--main_process_ip", "h",
                             "--rdzv_backend", "static"],
                            ["--nnodes", "2", "--node-rank", "1", "--rdzv-endpoint", "h:29500", "--rdzv-backend",
                             "static"]),
    "config_file": (["--config_file", "x.yaml"], ["--config-file", "x.yaml"]),
    "parallelism": (["--use_fsdp", "--fsdp_version", "2", "--num_processes", "4", "--use_parallelism_config",
                     "--parallelism_config_dp_shard_size", "2", "--parallelism_config_tp_size", "2"],
                    ["--use-fsdp", "--nproc-per-node", "4", "--use-parallelism-config",
                     "--parallelism-config-dp-shard-size", "2", "--parallelism-config-tp-size", "2"]),
}


@pytest.mark.parametrize("case", sorted(PAIRS))
def test_each_accelerate_flag_makes_the_launch_of_its_torchrun_spelling(case: str, tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "x.yaml").write_text("nproc_per_node: 3\n")
    accelerate_spelling, torchrun_spelling = PAIRS[case]
    assert plan(*accelerate_spelling) == plan(*torchrun_spelling)


@pytest.mark.parametrize("case", ["num_processes", "hyphens", "multi_node", "mixed_precision", "use_fsdp",
                                  "use_deepspeed", "parallelism"])
def test_the_numbers_and_variables_are_accelerates(case: str) -> None:
    """Against what Accelerate 1.15 derived from the same flags (num_processes is a total over machines)."""
    argv, env = plan(*[f for f in recorded.FLAG_CASES[case] if f not in ("--multi_gpu", "--multi-gpu")])
    expected = recorded.FLAG_RESULTS[case]
    assert torchrun_setting(argv, "--nproc-per-node") == expected["torchrun"]["nproc_per_node"]
    assert torchrun_setting(argv, "--nnodes") == expected["torchrun"]["nnodes"]
    assert torchrun_setting(argv, "--rdzv-endpoint") == expected["torchrun"]["rdzv_endpoint"]
    # Every variable Accelerate sets that the engine reads, with Accelerate's value (the DeepSpeed backend reads
    # its own; ACCELERATE_CONFIG_DS_FIELDS / FSDP_VERSION are not set by ember launch: FSDP is always FSDP2).
    for key, value in expected["env"].items():
        if key not in ("ACCELERATE_CONFIG_DS_FIELDS", "FSDP_VERSION"):
            assert env[key] == value, key


@pytest.mark.parametrize(("name", "same_as"), [
    ("default", ["--cpu", "--mixed-precision", "bf16", "--nproc-per-node", "1"]),
    ("multi_node", ["--nproc-per-node", "4", "--nnodes", "2", "--node-rank", "1", "--rdzv-backend", "static",
                    "--rdzv-endpoint", f"10.0.0.1:{recorded.PORT}", "--mixed-precision", "fp16", "--no-cpu"]),
    ("deepspeed", ["--use-deepspeed", "--zero-stage", "2", "--nproc-per-node", "2", "--mixed-precision", "bf16"]),
    ("fsdp", ["--use-fsdp", "--nproc-per-node", "2", "--debug"]),
    ("parallelism", ["--use-fsdp", "--nproc-per-node", "4", "--use-parallelism-config",
                     "--parallelism-config-dp-shard-size", "2", "--parallelism-config-tp-size", "2",
                     "--parallelism-config-cp-size", "1", "--parallelism-config-dp-replicate-size", "1"]),
])
def test_accelerate_config_files_launch_as_accelerate_would(name: str, same_as: list[str], tmp_path: Path) -> None:
    path = tmp_path / f"{name}.yaml"
    path.write_text(recorded.CONFIG_TEXTS[name])  # byte for byte what accelerate config wrote
    if name == "fsdp":
        with pytest.warns(UserWarning, match=r"fsdp_config settings \['fsdp_offload_params', "):
            argv, env = plan("--config_file", str(path))
    else:
        argv, env = plan("--config_file", str(path))
    if name in recorded.FILE_RESULTS:
        expected = recorded.FILE_RESULTS[name]
        assert torchrun_setting(argv, "--nproc-per-node") == expected["torchrun"]["nproc_per_node"]
        assert torchrun_setting(argv, "--rdzv-endpoint") == expected["torchrun"]["rdzv_endpoint"]
        for key, value in expected["env"].items():
            if key not in ("ACCELERATE_CONFIG_DS_FIELDS", "FSDP_VERSION"):
                assert env[key] == value, key
    if name == "deepspeed":  # the file's other DeepSpeed settings travel as Accelerate's variables
        same_as += ["--config-file", str(_ember_file(tmp_path, "use_deepspeed: true\n"
                                                               "deepspeed_config: {gradient_accumulation_steps: 1, "
                                                               "offload_optimizer_device: none, offload_param_device:"
                                                               " none, zero3_init_flag: false}\n"))]
    assert (argv, env) == plan(*same_as)


def _ember_file(folder: Path, text: str) -> Path:
    path = folder / "ember.yaml"
    path.write_text(text)
    return path


def test_flags_win_over_the_file_in_either_spelling(tmp_path: Path) -> None:
    path = tmp_path / "multi.yaml"
    path.write_text(recorded.CONFIG_TEXTS["multi_node"])  # num_processes: 8 over 2 machines
    argv, _ = plan("--config_file", str(path), "--nproc-per-node", "2")
    assert torchrun_setting(argv, "--nproc-per-node") == "2"
    argv, _ = plan("--config_file", str(path), "--num_machines", "4")  # 8 in total over 4 machines
    assert torchrun_setting(argv, "--nproc-per-node") == "2" and torchrun_setting(argv, "--nnodes") == "4"
    argv, _ = plan("--config_file", str(path), "--main_process_port", "29999")
    assert torchrun_setting(argv, "--rdzv-endpoint") == "10.0.0.1:29999"
    argv, _ = plan("--config-file", str(_ember_file(tmp_path, "nnodes: '2'\nrdzv_endpoint: h:1\n")),
                   "--main_process_port", "7")
    assert torchrun_setting(argv, "--rdzv-endpoint") == "h:7"


@pytest.mark.parametrize(("flags", "message"), [
    (["--parallelism_config_tp_size", "2"], ("Parallelism settings ['parallelism_config_tp_size'] were given without "
                                            "use_parallelism_config: add --use_parallelism_config")),
    (["--use_parallelism_config", "--parallelism_config_tp_size", "0"], "parallelism_config_tp_size=0 is invalid"),
    (["--zero_stage", "2"], "DeepSpeed settings ['zero_stage'] were given without use_deepspeed: add --use_deepspeed"),
    (["--num_processes", "3", "--num_machines", "2", "--main_process_ip", "h"],
     "num_processes=3 (a total over all machines) does not divide into num_machines=2"),
    (["--num_processes", "4", "--nproc-per-node", "3"], "Both num_processes=4 (in total) and nproc_per_node=3"),
    (["--num_machines", "2"], "--main_process_ip HOST --main_process_port PORT"),
])
def test_bad_settings_are_one_line_before_anything_starts(flags: list[str], message: str, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "train.py").write_text("raise SystemExit('never runs')\n")
    assert main(["launch", *flags, str(tmp_path / "train.py")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ember launch: error: ") and err.count("\n") == 1 and message in err, err


@pytest.mark.parametrize(("flag", "message"), [
    ("--num_proceses", "unrecognized argument --num_proceses. Did you mean --num_processes?"),
    ("--mixed-precison", "unrecognized argument --mixed-precison. Did you mean --mixed-precision?"),
    ("--gpu_ids", "--gpu_ids (an accelerate launch flag) is not supported: set CUDA_VISIBLE_DEVICES"),
    ("--num_cpu_threads_per_process",
     "--num_cpu_threads_per_process (an accelerate launch flag) is not supported: set OMP_NUM_THREADS=N"),
])
def test_unknown_flags_name_the_close_match(flag: str, message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["launch", flag, "2", "train.py"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"ember launch: error: {message}") and err.count("\n") == 1, err


def test_script_arguments_are_never_checked() -> None:
    parser = argparse.ArgumentParser()
    add_launch_commands(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["launch", "--cpu", "train.py", "--num_proceses", "2"])
    assert args.script_args == ["--num_proceses", "2"]


@pytest.mark.parametrize(("text", "message"), [
    ("distributed_type: XLA\n", "distributed_type='XLA' is not supported"),
    ("distributed_type: FSDP\nfsdp_config: {fsdp_version: 1}\n", "fsdp_version=1 is not supported"),
    ("compute_environment: AMAZON_SAGEMAKER\n", "compute_environment='AMAZON_SAGEMAKER' is not supported"),
    ("distributed_type: DEEPSPEED\ndeepspeed_config: {zero_stage: 5}\n", "zero_stage=5 is invalid"),
    ("distributed_type: MULTI_GPU\ngpu_ids: '0,1'\n", "set CUDA_VISIBLE_DEVICES instead"),
])
def test_accelerate_files_ember_cannot_launch_are_refused(text: str, message: str, tmp_path: Path) -> None:
    path = tmp_path / "acc.yaml"
    path.write_text(text)
    with pytest.raises(ValueError, match=message):
        plan("--config_file", str(path))


def test_ember_config_does_not_overwrite_an_accelerate_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "acc.yaml"
    path.write_text(recorded.CONFIG_TEXTS["default"])
    assert main(["config", "--config_file", str(path), "--nproc-per-node", "2"]) == 2
    assert "was written by `accelerate config`" in capsys.readouterr().err
    assert path.read_text() == recorded.CONFIG_TEXTS["default"]
