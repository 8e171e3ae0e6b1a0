"""The ``ember`` command line: ``ember env``, ``ember launch`` and ``ember config``."""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import platform
import sys
from collections.abc import Sequence

from engine.environment import describe
from engine.launch.config import LaunchSettingError
from engine.launch.settings import unknown_flag_message
from engine.launch.torchrun import add_launch_commands, config_report

# What `ember env` lists: the required packages, then each optional one Ember can use (its extra, or the backend
# being added), so a bug report says at once which are there. Each entry: (name shown, distributions tried).
PACKAGES = (("tqdm", ("tqdm",)), ("safetensors", ("safetensors",)), ("numpy", ("numpy",)),
            ("tensorboard", ("tensorboard",)), ("wandb", ("wandb",)), ("comet-ml", ("comet-ml",)),
            ("mlflow", ("mlflow", "mlflow-skinny")), ("torchmetrics", ("torchmetrics",)),
            ("jsonargparse", ("jsonargparse",)), ("deepspeed", ("deepspeed",)), ("torchao", ("torchao",)))


def _version(*distributions: str) -> str:
    """The first installed distribution's version (named when it is not the first one tried)."""
    for distribution in distributions:
        try:
            version = importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            continue
        return version if distribution == distributions[0] else f"{version} ({distribution})"
    return "not installed"


def env_report() -> str:
    """Versions, devices and the distributed environment this process would see."""
    import torch

    lines = [
        f"ember-train: {_version('ember-train')}",
        f"Python: {platform.python_version()} ({sys.executable})",
        f"Platform: {platform.platform()}",
        f"torch: {torch.__version__}",
        f"CPU cores: {os.cpu_count()}, torch threads: {torch.get_num_threads()}",
        f"CUDA available: {torch.cuda.is_available()}",
    ]
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            lines.append(f"  cuda:{i}: {torch.cuda.get_device_name(i)}")
        lines.append(f"  bf16 supported: {torch.cuda.is_bf16_supported()}")
    mps = getattr(torch.backends, "mps", None)
    lines.append(f"MPS available: {bool(mps and mps.is_available())}")
    lines.append(f"torch.distributed: {torch.distributed.is_available()} (gloo: "
                 f"{torch.distributed.is_gloo_available()}, nccl: {torch.distributed.is_nccl_available()})")
    for name, distributions in PACKAGES:
        lines.append(f"{name}: {_version(*distributions)}")
    lines.extend(describe())
    lines.extend(config_report())
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ember", description="Ember: train PyTorch models.",
                                     epilog="ember fit|validate|test|predict --config cfg.yaml: the trainer's config "
                                            "command line (needs the 'cli' extra; ember fit --help).")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("env", help="print versions, devices and the detected distributed environment")
    launch_parsers = add_launch_commands(commands)
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        # argparse would only say "unrecognized arguments": name the close match (or what to do instead of an
        # accelerate launch flag Ember does not take). Arguments after the script are the script's, never here.
        sub = launch_parsers.get(args.command, parser)
        flags = [s for action in sub._actions for s in action.option_strings if s.startswith("--")]
        problems = [unknown_flag_message(u, flags) for u in unknown if u.startswith("-")]
        if not problems:
            sub.error(f"unrecognized arguments: {' '.join(unknown)}")
        sub.exit(2, f"{sub.prog}: error: {'; '.join(problems)}\n")  # one line: the usage would bury it
    if args.command == "env":
        print(env_report())
        return 0
    try:
        return int(args.func(args))
    except LaunchSettingError as err:
        # A bad flag or config value is the user's typo: one line, as argparse reports its own errors.
        print(f"ember {args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
