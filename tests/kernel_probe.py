"""Print a digest of each kind of CPU computation the parity tests depend on, as one JSON line.

    python tests/kernel_probe.py

Run by tests/test_kernel_path.py on this CPU and on an emulated one (QEMU's user mode with another processor
model), both under the suite's pinned kernel path: equal digests mean the pins leave nothing to the processor for
these kernels. The computations are those of the recorded runs: fp32 matrix products (MKL), bf16 autocast ones
(oneDNN), a big product (blocking by cache size), LayerNorm, GELU, softmax and cross-entropy, MKL's vector math
(``exp``, ``log``, ``sqrt``, ``erf``), reductions, a convolution, BatchNorm, float8 casts and AdamW steps.
"""

from __future__ import annotations

import hashlib
import json

import torch
import torch.nn.functional as F
from torch import nn


def digest(*tensors: torch.Tensor) -> str:
    """The first 16 hex digits of the sha256 of the tensors' bytes (bf16 / fp8 widened to fp32 first)."""
    h = hashlib.sha256()
    for t in tensors:
        t = t.detach().contiguous()
        if t.dtype not in (torch.float32, torch.float64, torch.int64):
            t = t.float()
        h.update(t.numpy().tobytes())
    return h.hexdigest()[:16]


def probe() -> dict[str, str]:
    torch.manual_seed(0)
    out: dict[str, str] = {}
    x = torch.randn(64, 96)
    w = torch.randn(160, 96, requires_grad=True)
    b = torch.randn(160, requires_grad=True)
    y = F.linear(x, w, b)
    y.square().sum().backward()
    out["fp32_linear_fwd_bwd"] = digest(y, w.grad, b.grad)  # type: ignore[arg-type]
    big, big_w = torch.randn(192, 384), torch.randn(384, 384)
    out["fp32_matmul_192x384x384"] = digest(big @ big_w)
    w.grad = None
    with torch.autocast("cpu", dtype=torch.bfloat16):
        yb = F.linear(x, w, b)
    yb.float().square().sum().backward()
    out["bf16_autocast_linear_fwd_bwd"] = digest(yb, w.grad)  # type: ignore[arg-type]
    out["bf16_matmul_192x384x384"] = digest(big.bfloat16() @ big_w.bfloat16())
    out["bf16_elementwise"] = digest(x.bfloat16() * 1.37 + x.bfloat16().exp())
    out["layernorm"] = digest(nn.LayerNorm(96)(x), nn.LayerNorm(96).bfloat16()(x.bfloat16()))
    out["gelu"] = digest(F.gelu(x), F.gelu(x, approximate="tanh"))
    out["softmax_cross_entropy"] = digest(F.softmax(x, -1), F.cross_entropy(x, torch.arange(64) % 96))
    a = torch.rand(20_011) + 0.01
    out["vector_math"] = digest(a.exp(), a.log(), a.sqrt(), a.erf(), a.tanh(), a.sigmoid(), a.pow(1.7), a.rsqrt())
    out["reductions"] = digest(a.sum(), a.mean(), a.norm(), a.var(), big.sum(0), big.sum(1), big.bfloat16().sum(1))
    out["conv2d"] = digest(nn.Conv2d(3, 8, 3)(torch.randn(4, 3, 16, 16)))
    out["batchnorm"] = digest(nn.BatchNorm1d(96)(x))
    out["float8_casts"] = digest(x.to(torch.float8_e4m3fn), (x * 100).to(torch.float8_e5m2))
    model = nn.Sequential(nn.Linear(96, 128), nn.GELU(), nn.Linear(128, 10))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(3):
        opt.zero_grad()
        F.cross_entropy(model(x), torch.arange(64) % 10).backward()
        opt.step()
    out["adamw_steps"] = digest(*model.parameters())
    return out


if __name__ == "__main__":
    print(json.dumps({"capability": torch.backends.cpu.get_cpu_capability(), "threads": torch.get_num_threads(),
                      "digests": probe()}))
