"""Start loader-like worker processes while gloo's threads are busy, and count the workers that never answer.

Issue 39 (item 2) suspects a DataLoader worker forked from a rank while gloo's threads run: a lock one of them held
at the instant of the fork stays held forever in the child. This makes that instant as common as possible: on 2
gloo ranks, each rank keeps async all-reduces in flight (gloo's threads working) while its main thread starts
worker processes, each of which does what a loader worker does (torch ops, random draws, a tensor sent back
through a multiprocessing queue in shared memory) and must answer within ``--timeout`` seconds.

    python benchmarks/fork_gloo_stress.py --workers 400 --context fork --load 2
    python benchmarks/fork_gloo_stress.py --workers 400 --context forkserver --load 2

Prints: ``context C: workers N, stuck S, failed F (seconds)`` per rank.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import queue as queue_module
import socket
import sys
import time
from typing import Any

import torch
import torch.distributed as dist


def _worker(results: Any, done: Any, index: int) -> None:
    torch.set_num_threads(1)
    torch.manual_seed(index)
    sample = torch.stack([torch.randn(64) + i for i in range(8)])
    results.put((index, sample))
    done.wait()  # the rank fetches the tensor's shared memory from this process (as from a loader worker)


def _spin() -> None:
    while True:
        pass


def _rank(rank: int, port: int, workers: int, context: str, timeout: float, report: Any) -> None:
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank), "WORLD_SIZE": "2"})
    dist.init_process_group("gloo")
    ctx = mp.get_context(context)
    if context == "forkserver":
        ctx.set_forkserver_preload(["torch"])
    results = ctx.Queue()
    buffers = [torch.randn(4096) for _ in range(4)]
    stuck = failed = 0
    start = time.monotonic()
    for index in range(workers):
        works = [dist.all_reduce(b, async_op=True) for b in buffers]  # gloo's threads busy during the start
        done = ctx.Event()
        process = ctx.Process(target=_worker, args=(results, done, index))
        process.start()
        try:
            got, _ = results.get(timeout=timeout)
            if got != index:
                failed += 1
        except queue_module.Empty:
            stuck += 1
            print(f"rank {rank}: worker {index} (pid {process.pid}) sent nothing in {timeout} s", file=sys.stderr,
                  flush=True)
        done.set()
        process.join(timeout=timeout)
        if process.is_alive():
            process.kill()
            process.join()
        elif process.exitcode != 0:
            failed += 1
        for work in works:
            work.wait()
    report.put((rank, stuck, failed, time.monotonic() - start))
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=200, help="worker starts per rank")
    parser.add_argument("--context", default="fork", choices=["fork", "forkserver", "spawn"])
    parser.add_argument("--timeout", type=float, default=20.0, help="seconds a worker may take to answer")
    parser.add_argument("--load", type=int, default=2, help="busy-loop processes kept running meanwhile")
    args = parser.parse_args()
    spinners = [mp.get_context("fork").Process(target=_spin, daemon=True) for _ in range(args.load)]
    for spinner in spinners:
        spinner.start()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    spawn = mp.get_context("spawn")
    report = spawn.Queue()
    ranks = [spawn.Process(target=_rank, args=(r, port, args.workers, args.context, args.timeout, report))
             for r in range(2)]
    try:
        for rank in ranks:
            rank.start()
        for _ in ranks:
            rank, stuck, failed, seconds = report.get(timeout=args.workers * args.timeout + 300)
            print(f"context {args.context}, rank {rank}: workers {args.workers}, stuck {stuck}, failed {failed} "
                  f"({seconds:.0f} s, load {args.load})", flush=True)
        for rank in ranks:
            rank.join()
    finally:
        for process in [*spinners, *ranks]:
            if process.is_alive():
                process.kill()


if __name__ == "__main__":
    main()
