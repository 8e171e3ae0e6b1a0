"""Count C++ aborts at process exit ("terminate called without an active exception", issue 39 item 3).

Runs small 2-rank torchrun jobs that end in the ways Ember's users end them (a Trainer's fit, an Accelerator loop
with or without ``end_training``, FSDP2, DeepSpeed when installed) ``--runs`` times each, with ``--load`` busy-loop
processes on the CPUs meanwhile, and prints per scenario: runs, clean exits, aborts, other failures. With
``PYTHONFAULTHANDLER=1`` set for the jobs, an abort prints every Python thread's stack: the stderr of each abort is
kept in ``{out}/{scenario}_{n}.txt``.

    python benchmarks/exit_aborts.py --runs 20 --load 2 [--scenarios trainer,accelerator] [--out /tmp/aborts]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import socket
import subprocess
import sys
import tempfile
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Registered first, so it runs last of the exit handlers (after Ember's): the native threads still running then.
PROBE = '''
import atexit, os, sys
def _threads_at_exit():
    names = []
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as handle:
                names.append(handle.read().strip())
        except OSError:
            pass
    print(f"[threads at exit] {sorted(names)}", file=sys.stderr, flush=True)
atexit.register(_threads_at_exit)
'''

SCENARIOS = {
    "trainer": '''
        import torch
        from torch.utils.data import DataLoader, TensorDataset
        from trainer import Trainer, TrainModule

        class Net(TrainModule):
            def __init__(self):
                super().__init__()
                self.net = torch.nn.Linear(4, 1)
            def training_step(self, batch, batch_idx):
                x, y = batch
                loss = torch.nn.functional.mse_loss(self.net(x), y)
                self.log("loss", loss)
                return loss
            def configure_optimizers(self):
                return torch.optim.SGD(self.parameters(), lr=0.1)

        data = DataLoader(TensorDataset(torch.randn(32, 4), torch.randn(32, 1)), batch_size=4, num_workers=1)
        trainer = Trainer(max_epochs=2, enable_progress_bar=False, enable_model_summary=False,
                          log_with="csv", project_dir=DIR)
        trainer.fit(Net(), data)
    ''',
    "accelerator": '''
        import torch
        from engine import Accelerator

        acc = Accelerator(cpu=True)
        model, opt = acc.prepare(torch.nn.Linear(4, 4), torch.optim.SGD([torch.nn.Parameter(torch.ones(1))], lr=0.1))
        for _ in range(3):
            acc.backward(model(torch.randn(2, 4)).sum())
        acc.save_state(DIR + "/state")
        # no end_training(): the script just ends, as most Accelerate scripts do
    ''',
    "fsdp": '''
        import torch
        from engine import Accelerator, FullyShardedDataParallelPlugin

        acc = Accelerator(cpu=True, fsdp_plugin=FullyShardedDataParallelPlugin())
        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 4))
        model, opt = acc.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
        for _ in range(3):
            acc.backward(model(torch.randn(2, 4)).sum())
            opt.step()
            opt.zero_grad()
        acc.save_state(DIR + "/state")
    ''',
    "deepspeed": '''
        import torch
        from engine import Accelerator, DeepSpeedPlugin

        acc = Accelerator(cpu=True, deepspeed_plugin=DeepSpeedPlugin(zero_stage=2, gradient_accumulation_steps=1))
        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 4))
        optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
        loader = torch.utils.data.DataLoader(torch.randn(16, 4), batch_size=4)
        model, optimizer, loader = acc.prepare(model, optimizer, loader)
        for x in loader:
            acc.backward(model(x).sum())
            optimizer.step()
            optimizer.zero_grad()
    ''',
}


def _spin() -> None:
    while True:
        pass


def _run_once(script: str, directory: str) -> subprocess.CompletedProcess[str]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": ROOT, "PYTHONFAULTHANDLER": "1"}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT", "MASTER_ADDR"):
        env.pop(name, None)
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr",
                           "127.0.0.1", "--master_port", str(port), script], env=env, capture_output=True, text=True,
                          timeout=300, check=False, cwd=directory)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=10, help="launches per scenario")
    parser.add_argument("--load", type=int, default=2, help="busy-loop processes kept running meanwhile")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS), help=f"comma-separated, of {list(SCENARIOS)}")
    parser.add_argument("--out", default=None, help="where the stderr of aborted runs goes")
    args = parser.parse_args()
    out = args.out or tempfile.mkdtemp(prefix="exit_aborts_")
    os.makedirs(out, exist_ok=True)
    names = args.scenarios.split(",")
    unknown = sorted(set(names) - set(SCENARIOS))
    if unknown:
        raise SystemExit(f"--scenarios: unknown {unknown}; choose from {list(SCENARIOS)}")
    spinners = [mp.get_context("fork").Process(target=_spin, daemon=True) for _ in range(args.load)]
    for spinner in spinners:
        spinner.start()
    counts = {name: [0, 0, 0] for name in names}  # clean, aborts, other failures
    lingering = {name: 0 for name in names}  # ranks with gloo threads still running after every exit handler
    try:
        for run in range(args.runs):
            for name in names:  # interleaved, so that load changes hit every scenario alike
                directory = tempfile.mkdtemp(prefix=f"{name}_", dir=out)
                script = os.path.join(directory, "job.py")
                with open(script, "w") as handle:
                    handle.write(PROBE + f"DIR = {directory!r}\n" + textwrap.dedent(SCENARIOS[name]))
                result = _run_once(script, directory)
                aborted = "terminate called" in result.stderr
                at_exit = [line for line in result.stderr.splitlines() if line.startswith("[threads at exit]")]
                lingering[name] += sum("gloo" in line for line in at_exit)
                kind = 1 if aborted else (0 if result.returncode == 0 else 2)
                counts[name][kind] += 1
                if kind:
                    with open(os.path.join(out, f"{name}_{run}.txt"), "w") as handle:
                        handle.write(result.stderr)
                print(f"run {run} {name}: rc {result.returncode}{', ABORT' if aborted else ''}; "
                      f"{' | '.join(line[18:] for line in at_exit)}", flush=True)
    finally:
        for spinner in spinners:
            spinner.kill()
    for name, (clean, aborts, other) in counts.items():
        print(f"{name:12s} runs {args.runs}, clean {clean}, aborts {aborts}, other failures {other}, "
              f"ranks with gloo threads at exit {lingering[name]} of {2 * args.runs}")
    print(f"(load {args.load}; stderr of failures in {out})")


if __name__ == "__main__":
    main()
