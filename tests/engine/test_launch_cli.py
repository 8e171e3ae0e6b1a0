"""``ember launch`` / ``ember config`` / ``ember env`` without starting processes: arguments, files, precedence."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from engine.launch.cli import env_report, main
from engine.launch.config import LaunchConfig, default_config_path, load_config
from engine.launch.settings import settings_from
from engine.launch.torchrun import run_script, torchrun_arguments, worker_environment


@pytest.fixture
def config_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "cfg" / "ember.yaml"
    monkeypatch.setenv("EMBER_CONFIG_FILE", str(path))
    return path


def test_single_node_arguments_use_a_standalone_rendezvous() -> None:
    argv = torchrun_arguments(LaunchConfig(nproc_per_node=4, max_restarts=2), "train.py", ["--lr", "0.1"])
    assert argv == ["--nproc-per-node", "4", "--max-restarts", "2", "--standalone",
                    "-m", "engine.launch", "train.py", "--lr", "0.1"]
    assert torchrun_arguments(LaunchConfig(nproc_per_node=1), "pkg.train", [], module=True)[-3:] == \
        ["engine.launch", "-m", "pkg.train"]


def test_multi_node_arguments_rendezvous_at_the_endpoint() -> None:
    config = LaunchConfig(nproc_per_node=8, nnodes="2", node_rank=1, rdzv_endpoint="10.0.0.1:29400")
    argv = torchrun_arguments(config, "train.py", [])
    assert "--standalone" not in argv
    assert argv[argv.index("--rdzv-backend") + 1] == "c10d"
    assert argv[argv.index("--rdzv-endpoint") + 1] == "10.0.0.1:29400"
    assert argv[argv.index("--nnodes") + 1] == "2" and "--node-rank" not in argv  # c10d numbers nodes itself
    static = torchrun_arguments(LaunchConfig(nproc_per_node=1, nnodes="2", node_rank=1, rdzv_backend="static",
                                             rdzv_endpoint="h:1"), "train.py", [])
    assert static[static.index("--node-rank") + 1] == "1"
    # torchrun itself accepts what we build.
    from torch.distributed.run import parse_args

    parsed = parse_args(argv)
    assert (parsed.nnodes, parsed.rdzv_endpoint, parsed.module, parsed.training_script) == \
        ("2", "10.0.0.1:29400", True, "engine.launch")


def test_settings_reach_the_workers_as_environment_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    env = worker_environment(LaunchConfig(nproc_per_node=2, mixed_precision="bf16", cpu=True, use_fsdp=True))
    assert env["ACCELERATE_MIXED_PRECISION"] == "bf16"
    assert env["ACCELERATE_USE_CPU"] == "true" and env["ACCELERATE_USE_FSDP"] == "true"
    assert int(env["OMP_NUM_THREADS"]) >= 1
    assert "ACCELERATE_DEBUG_MODE" not in env
    assert worker_environment(LaunchConfig(debug=True))["ACCELERATE_DEBUG_MODE"] == "true"  # `--debug`


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"nproc_per_node": 0}, "nproc_per_node=0"),
    ({"nnodes": "3:2"}, "nnodes='3:2'"),
    ({"nnodes": "2"}, "--rdzv-endpoint HOST:PORT"),
    ({"nnodes": "2", "node_rank": 2, "rdzv_endpoint": "h:1"}, "node_rank=2"),
    ({"rdzv_endpoint": "nohost"}, "rdzv_endpoint='nohost'"),
    ({"mixed_precision": "fp4"}, "mixed_precision='fp4'"),
    ({"max_restarts": -1}, "max_restarts=-1"),
    ({"cpu": "yes"}, "cpu='yes'"),
])
def test_bad_settings_fail_early_naming_the_value(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("[", r"\[")):
        LaunchConfig(**kwargs)


def test_ember_config_writes_merges_and_launch_reads_it(config_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert default_config_path() == str(config_file)
    assert main(["config", "--nproc-per-node", "3", "--mixed-precision", "bf16"]) == 0
    assert f"Wrote {config_file}" in capsys.readouterr().out
    assert yaml.safe_load(config_file.read_text())["nproc_per_node"] == 3
    assert main(["config", "--cpu"]) == 0  # a second call changes one setting and keeps the others
    saved = load_config(str(config_file))
    assert (saved["nproc_per_node"], saved["mixed_precision"], saved["cpu"]) == (3, "bf16", True)
    # ember launch: flags win over the file, the file over the defaults.
    merged = settings_from(None, {"mixed_precision": "fp16", "cpu": None, "nnodes": None})
    assert (merged.nproc_per_node, merged.mixed_precision, merged.cpu) == (3, "fp16", True)
    no_cpu = settings_from(None, {"cpu": False})  # --no-cpu overrides the file's true
    assert no_cpu.cpu is False


def test_config_files_are_checked(config_file: Path, tmp_path: Path) -> None:
    config_file.parent.mkdir(parents=True)
    config_file.write_text("nproc_per_node: 2\nnum_gpus: 4\n")
    with pytest.raises(ValueError, match=r"unknown launch settings \['num_gpus'\]"):
        settings_from(None, {})
    config_file.write_text("mixed_precision: fp32\n")
    with pytest.raises(ValueError, match="mixed_precision='fp32'"):
        load_config(str(config_file))
    with pytest.raises(ValueError, match="does not exist"):
        settings_from(str(tmp_path / "missing.yaml"), {})


def test_ember_env_lists_every_optional_package(config_file: Path) -> None:
    import importlib.metadata

    report = env_report()
    for name in ("torchmetrics", "mlflow", "jsonargparse", "deepspeed", "torchao", "tensorboard", "wandb",
                 "comet-ml", "tqdm", "safetensors", "numpy"):
        line = next(line for line in report.splitlines() if line.startswith(f"{name}: "))
        assert line != f"{name}: " and (line.endswith("not installed") or line[len(name) + 2].isdigit()), line
    # The `mlflow` extra installs the mlflow-skinny distribution: ember env finds it and names it.
    installed = {}
    for distribution in ("mlflow", "mlflow-skinny"):
        try:
            installed[distribution] = importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            pass
    expected = ("not installed" if not installed else installed["mlflow"] if "mlflow" in installed
                else f"{installed['mlflow-skinny']} (mlflow-skinny)")
    assert f"mlflow: {expected}\n" in report


def test_ember_env_reports_the_launch_config(config_file: Path) -> None:
    assert f"Launch config: {config_file} (not written" in env_report()
    main(["config", "--nproc-per-node", "2"])
    report = env_report()
    assert f"Launch config: {config_file}\n" in report and "  nproc_per_node: 2" in report


def test_ember_launch_rejects_a_missing_script(config_file: Path, tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="does not exist"):
        main(["launch", "--nproc-per-node", "1", str(tmp_path / "nope.py")])


def test_worker_runner_passes_arguments_and_exit_codes(tmp_path: Path) -> None:
    script = tmp_path / "job.py"
    script.write_text("import sys\nprint('args', sys.argv[1:], __name__)\nsys.exit(int(sys.argv[1]))\n")
    ok = subprocess.run([sys.executable, "-m", "engine.launch", str(script), "0", "x"], capture_output=True, check=False,
                        text=True, timeout=60)
    assert ok.returncode == 0 and "args ['0', 'x'] __main__" in ok.stdout
    assert subprocess.run([sys.executable, "-m", "engine.launch", str(script), "3"], capture_output=True, check=False,
                          timeout=60).returncode == 3
    script.write_text("def f():\n    raise KeyError('lost')\nf()\n")
    failed = subprocess.run([sys.executable, "-m", "engine.launch", str(script)], capture_output=True, text=True,
                            check=False, timeout=60, env={"RANK": "5", "PATH": "/usr/bin:/bin"})
    assert failed.returncode == 1
    assert failed.stderr.startswith("[ember] rank 5") and "KeyError: 'lost'" in failed.stderr
    assert "runpy" not in failed.stderr and failed.stderr.count("Traceback") == 1
    assert run_script([]) == 2


@pytest.mark.parametrize("flags", [["--nproc-per-node", "0"], ["--nnodes", "2"], ["--max-restarts", "-1"]])
def test_ember_launch_reports_a_bad_setting_in_one_line(config_file: Path, tmp_path: Path, flags: list[str],
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    script = tmp_path / "train.py"
    script.write_text("print('never runs')\n")
    assert main(["launch", *flags, str(script)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("ember launch: error: ") and "Traceback" not in err, err
