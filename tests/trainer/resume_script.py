"""A small training run for the resume tests, run as a subprocess (one process, or several under torchrun).

Shuffled data with random augmentation read by 2 worker processes, dropout, gradient accumulation 2, gradient
clipping, a step-wise scheduler, validation every epoch, a csv tracker (``--tensorboard``: and TensorBoard;
``--lr-monitor``: a LearningRateMonitor; ``--combined``: a second, shorter shuffled loader combined with the
first in ``"max_size_cycle"`` mode) and a checkpoint after every optimizer step (or, with
``--no-step-checkpoints``, none: then only a preemption saves). ``--kill-at N`` / ``--kill-at-epoch-end
E`` make rank 0 write ``{dir}/ready`` and freeze at that point, for the test to SIGKILL every process;
``--sigterm-at N`` makes rank ``--signal-rank`` send itself SIGTERM. Rank 0 writes the final weights to
``{dir}/final.pt`` and appends the position each start began at to ``{dir}/starts.txt``.

    python tests/trainer/resume_script.py --dir /tmp/run [--kill-at 7] [--ckpt-path last]
"""

from __future__ import annotations

import argparse
import faulthandler
import glob
import os
import signal
import socket
import subprocess
import sys
import time
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from callbacks import Callback, LearningRateMonitor, ModelCheckpoint
from tests.native_stacks import print_native_stacks
from trainer import Trainer, TrainModule


class Noisy(Dataset):
    """Fixed samples plus fresh random noise on every read (drawn in the worker processes)."""

    def __init__(self, n: int, seed: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, 6, generator=generator)
        self.y = self.x[:, :3].sum(dim=1, keepdim=True)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[index] + 0.05 * torch.randn(6), self.y[index]


class Net(TrainModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Dropout(0.3),
                                       torch.nn.Linear(16, 1))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        if isinstance(batch, dict):  # --combined: {"a": (x, y), "b": (x, y)}, "b" cycled
            (x, y), (xb, yb) = batch["a"], batch["b"]
            loss = torch.nn.functional.mse_loss(self.net(x), y) + 0.5 * torch.nn.functional.mse_loss(self.net(xb), yb)
        else:
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.log("train/loss", loss)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val/loss", torch.nn.functional.mse_loss(self.net(x), y), sync_dist=True)

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.8)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


class Freeze(Callback):
    """Stops rank 0 dead at a chosen point (after writing ``ready``), or sends SIGTERM there."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args

    def _freeze(self, trainer: Trainer) -> None:
        if trainer.global_rank == 0:
            with open(os.path.join(self.args.dir, "ready"), "w") as handle:
                handle.write(f"{trainer.state.micro_step}\n")
            while True:  # the test SIGKILLs every process now
                time.sleep(1)

    def on_train_batch_start(self, trainer: Trainer, module: TrainModule, batch: Any, batch_idx: int) -> None:
        if trainer.state.micro_step == self.args.kill_at:
            self._freeze(trainer)
        if trainer.state.micro_step == self.args.sigterm_at and trainer.global_rank == self.args.signal_rank:
            os.kill(os.getpid(), signal.SIGTERM)

    def on_train_epoch_end(self, trainer: Trainer, module: TrainModule) -> None:
        if trainer.current_epoch == self.args.kill_at_epoch_end:
            self._freeze(trainer)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dir", required=True)
    parser.add_argument("--ckpt-path", default=None)
    parser.add_argument("--kill-at", type=int, default=-1)
    parser.add_argument("--kill-at-epoch-end", type=int, default=-1)
    parser.add_argument("--sigterm-at", type=int, default=-1)
    parser.add_argument("--signal-rank", type=int, default=0)
    parser.add_argument("--exit-code", type=int, default=143)
    parser.add_argument("--no-step-checkpoints", action="store_true")
    parser.add_argument("--max-epochs", type=int, default=3,
                        help="epochs to train (benchmarks/resume_hang.py trains more: a loader-worker start each)")
    parser.add_argument("--fsdp", action="store_true", help="shard the model with FSDP2 (sharded checkpoints)")
    parser.add_argument("--lr-monitor", action="store_true",
                        help="log the learning rate before each step's batch (at the checkpoint's step)")
    parser.add_argument("--tensorboard", action="store_true", help="log to TensorBoard too")
    parser.add_argument("--combined", action="store_true",
                        help="train on {'a': the loader, 'b': a shorter shuffled one} (max_size_cycle)")
    args = parser.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    # SIGUSR1 prints every thread's stack to stderr, here and in the loader workers forked from here (the handler
    # is inherited): what `launch` asks for before it gives up on a run that stopped making progress.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    # Under torchrun every rank runs in its own session: the test kills each one's group by this pid.
    with open(os.path.join(args.dir, f"pid_{os.environ.get('RANK', '0')}"), "w") as handle:
        handle.write(str(os.getpid()))

    callbacks: list[Callback] = [Freeze(args)]
    if not args.no_step_checkpoints:
        callbacks.append(ModelCheckpoint(every_n_train_steps=1, save_last=True))
    if args.lr_monitor:
        callbacks.append(LearningRateMonitor(logging_interval="step"))
    where: dict[str, Any] = {"log_with": ["csv", "tensorboard"] if args.tensorboard else "csv",
                             "project_dir": args.dir}
    if args.fsdp:
        from engine import Accelerator, FullyShardedDataParallelPlugin

        where = {"accelerator": Accelerator(log_with="csv", project_dir=args.dir,
                                            fsdp_plugin=FullyShardedDataParallelPlugin())}
    trainer = Trainer(max_epochs=args.max_epochs, accumulate_grad_batches=2, gradient_clip_val=1.0, seed=0,
                      deterministic=True,
                      log_every_n_steps=2, callbacks=callbacks, enable_progress_bar=False,
                      enable_model_summary=False, preemption_exit_code=args.exit_code,
                      enable_checkpointing=not args.no_step_checkpoints, **where)
    model = Net()
    loader = DataLoader(Noisy(44, seed=1), batch_size=4, shuffle=True, num_workers=2,
                        multiprocessing_context="fork")
    val = DataLoader(Noisy(12, seed=2), batch_size=4)
    train: Any = loader
    if args.combined:  # 11 batches per epoch, as alone; "b" (5 batches) starts over twice an epoch
        train = {"a": loader, "b": DataLoader(Noisy(20, seed=3), batch_size=4, shuffle=True)}

    class Where(Callback):
        """Appends where each start began (epoch, batch in epoch, step) to ``{dir}/starts.txt``."""

        def on_train_start(self, trainer: Trainer, module: TrainModule) -> None:
            if trainer.is_global_zero:
                with open(os.path.join(args.dir, "starts.txt"), "a") as handle:
                    handle.write(f"{trainer.current_epoch} {trainer.state.batch_in_epoch} {trainer.global_step}\n")

    trainer.callbacks.append(Where())
    trainer.fit(model, train, val, ckpt_path=args.ckpt_path)
    # The full weights (gathered to rank 0 from the shards under FSDP2; every rank takes part).
    final = trainer.accelerator.get_state_dict(trainer.plan.model) if args.fsdp else model.state_dict()
    if trainer.is_global_zero:
        torch.save(final, os.path.join(args.dir, "final.pt"))


def launch(directory: str, *args: str, nproc: int = 1, timeout: float = 120.0) -> int | str:
    """Run this script (under torchrun for ``nproc > 1``) until it ends, or until rank 0 is ``ready``: then
    SIGKILL every process (the launcher, each rank and its loader workers) and return ``"killed"``."""
    for stale in glob.glob(os.path.join(directory, "pid_*")) + glob.glob(os.path.join(directory, "ready")):
        os.remove(stale)
    command = [sys.executable, os.path.abspath(__file__), "--dir", directory, *args]
    if nproc > 1:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        command[1:1] = ["-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--master_addr", "127.0.0.1",
                        "--master_port", str(port)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen(command, start_new_session=True, env=env)

    def kill_all() -> None:
        pids = []
        for name in glob.glob(os.path.join(directory, "pid_*")):
            with open(name) as handle:
                pids.append(int(handle.read()))
        for group in [process.pid, *pids]:  # torchrun starts each rank in a session of its own
            try:
                os.killpg(group, signal.SIGKILL)
            except ProcessLookupError:
                pass
        process.wait()

    def dump_stacks() -> None:
        groups = []
        for name in glob.glob(os.path.join(directory, "pid_*")):
            with open(name) as handle:
                groups.append(int(handle.read()))
            try:  # the rank and its loader workers (same process group), each prints its threads' stacks
                os.killpg(groups[-1], signal.SIGUSR1)
            except ProcessLookupError:
                pass
        time.sleep(2.0)
        print_native_stacks(groups)

    deadline = time.monotonic() + timeout
    try:
        while process.poll() is None:
            if os.path.exists(os.path.join(directory, "ready")):
                kill_all()
                return "killed"
            if time.monotonic() > deadline:
                dump_stacks()
                raise TimeoutError(f"{command} did not finish within {timeout} s (the stacks of every rank and "
                                   "loader worker are in the captured stderr)")
            time.sleep(0.02)
        return process.returncode
    finally:
        if process.poll() is None:
            kill_all()


if __name__ == "__main__":
    main()
