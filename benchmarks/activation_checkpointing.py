"""What activation checkpointing saves: bytes kept for backward and peak live memory, with and without it.

The same model three ways: plain, every block wrapped by ``engine.utils.apply_activation_checkpointing`` (what
``FullyShardedDataParallelPlugin(activation_checkpointing=True)`` does to its units), and wrapped with
``offload=True``. The model is 8 residual MLP blocks (LayerNorm, Linear d -> 4d, GELU, Linear 4d -> d) on a
batch of ``tokens`` x ``d`` activations, one forward and backward:

* **saved for backward**: the bytes of the tensors autograd keeps during the forward
  (``torch.autograd.graph.saved_tensors_hooks``), each memory block once and the parameters left out (a Linear
  keeps its weight, which exists anyway). A checkpointed block keeps its input only. With ``offload`` the
  wrapper's own hooks take the tensors first (to host memory: on a CPU-only machine nothing moves).
* **peak live memory**: the most host memory held at once by tensors allocated during forward + backward (the
  allocator's own record, ``torch.profiler`` with ``profile_memory``: every allocation and free in time order),
  above what the parameters already held. It includes the gradients and, with checkpointing, one block's
  recomputed activations.
* the forward + backward time (the recomputation is a second forward of each block) and whether the gradients
  are bitwise those of the plain model.

Run: ``python benchmarks/activation_checkpointing.py [--blocks 8 --width 512 --tokens 2048]``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.utils import apply_activation_checkpointing


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, 4 * width)
        self.act = nn.GELU()
        self.down = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(self.act(self.up(self.norm(x))))


def build(blocks: int, width: int, mode: str) -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(*(Block(width) for _ in range(blocks)))
    if mode != "plain":
        apply_activation_checkpointing(model, [Block], offload=mode == "offload")
    return model


def saved_bytes(model: nn.Module, x: torch.Tensor) -> int:
    parameters = {p.untyped_storage().data_ptr() for p in model.parameters()}
    storages: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in parameters:
            storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        model(x).square().mean()
    return sum(storages.values())


def peak_live_bytes(model: nn.Module, x: torch.Tensor) -> tuple[int, float, dict[str, torch.Tensor]]:
    """Peak bytes allocated and not yet freed during one forward + backward, its wall time, and the gradients."""
    from torch.profiler import ProfilerActivity, profile

    model.zero_grad(set_to_none=True)
    start = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        model(x).square().mean().backward()
    seconds = time.perf_counter() - start
    allocations = sorted((event.start_ns(), event.nbytes()) for event in prof.profiler.kineto_results.events()
                         if event.name() == "[memory]")
    live = peak = 0
    for _, nbytes in allocations:
        live += nbytes
        peak = max(peak, live)
    grads = {name.replace("_checkpoint_wrapped_module.", ""): p.grad for name, p in model.named_parameters()}
    return peak, seconds, grads


def timed(model: nn.Module, x: torch.Tensor, rounds: int) -> float:
    """Median wall time of a forward + backward without the profiler."""
    times = []
    for _ in range(rounds):
        model.zero_grad(set_to_none=True)
        start = time.perf_counter()
        model(x).square().mean().backward()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=8)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--tokens", type=int, default=2048, help="rows of the activations (batch x sequence)")
    parser.add_argument("--rounds", type=int, default=3, help="timed forward + backward passes per model")
    args = parser.parse_args()
    x = torch.randn(args.tokens, args.width, generator=torch.Generator().manual_seed(1))
    params = sum(p.numel() * p.element_size() for p in build(args.blocks, args.width, "plain").parameters())
    print(f"{args.blocks} blocks of width {args.width} (4x MLP), {args.tokens} x {args.width} fp32 activations, "
          f"{params / 1e6:.0f} MB of parameters; torch {torch.__version__}, {torch.get_num_threads()} threads\n")
    print("| model | saved for backward | peak live memory | forward + backward | gradients |")
    print("| --- | --- | --- | --- | --- |")
    reference: dict[str, torch.Tensor] | None = None
    for mode, label in (("plain", "plain"), ("checkpointed", "blocks checkpointed"),
                        ("offload", "checkpointed + offload")):
        model = build(args.blocks, args.width, mode)
        nbytes = saved_bytes(model, x)
        peak, _, grads = peak_live_bytes(model, x)
        seconds = timed(model, x, args.rounds)
        if reference is None:
            reference, same = grads, "reference"
        else:
            same = "equal" if all(torch.equal(grads[k], reference[k]) for k in reference) else "DIFFERENT"
        print(f"| {label} | {nbytes / 1e6:.1f} MB | {peak / 1e6:.1f} MB | {seconds:.2f} s | {same} |", flush=True)


if __name__ == "__main__":
    main()
