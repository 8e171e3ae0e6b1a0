"""One CPU kernel path for the test suite and the recorders, so values recorded from the real Lightning,
Accelerate, DeepSpeed and torchao on one machine are reproduced bit for bit on another.

torch's CPU kernels pick their code by the processor they run on: ATen's vectorised kernels by instruction set
(AVX2 / AVX512), oneDNN's JIT kernels (bf16 matrix products, convolutions) by instruction set (AVX512-BF16 and AMX
where present), MKL's BLAS and vector math (``exp``, ``log``, ``sqrt``, ``erf`` on contiguous tensors) by
processor, and reductions by the number of threads. The same script therefore ends with other last bits on
another CPU. Measured with tests/kernel_probe.py on this Sapphire Rapids Xeon (AVX512, AMX): fp32 and bf16 matrix
products, a bf16 autocast ``Linear``, ``GELU``, softmax, ``exp`` / ``log`` / ``sqrt`` / ``erf``, a convolution,
BatchNorm and an AdamW step give other bits than on an AVX2-only Haswell (QEMU's user mode); under the settings
below both give the same bits, as do QEMU's Skylake-Server, Cascadelake-Server and Icelake-Server models.

The settings cap every library at AVX2 (every x86-64 server CPU of the last ten years has it) and fix the thread
count at one:

- ``ATEN_CPU_CAPABILITY=avx2``: ATen's dispatch picks its AVX2 kernels (torch reads it on the first dispatch);
- ``ONEDNN_MAX_CPU_ISA=AVX2``: oneDNN generates AVX2 code (no AVX512, AVX512-BF16 or AMX kernels);
- ``MKL_CBWR=AVX2``: MKL's conditional numerical reproducibility, its AVX2 branch on any Intel CPU;
- ``OMP_NUM_THREADS=1``: a reduction splits its work by thread count; the multi-process tests already run each
  rank on one thread.

They apply to the test suite (``tests/conftest.py`` sets them before torch starts) and to the recorders in
``tests/parity_scripts/`` (each imports ``pinned`` first, which calls :func:`pin`); never to users' runs, which
keep their CPU's fastest kernels. fp8 training is the one exception (``FP8_PINNED`` below). What stays
CPU-specific even so: MKL ignores ``MKL_CBWR`` on non-Intel processors (QEMU's EPYC-Rome model: its vector math
takes MKL's generic code and ``exp`` / ``log`` / ``sqrt`` / ``erf``, and so AdamW, move), so on an AMD CPU the
recorded-anchor comparisons can differ in the last bits; there the tests marked ``recorded_bits`` skip, naming
the kernels that moved (tests/conftest.py), while on an Intel CPU with AVX2 they always run. Every
Ember-against-Ember comparison (a resumed run against the uninterrupted one, rank against rank) is bitwise on
whatever CPU runs it, pinned or not.
"""

from __future__ import annotations

import os
import platform
import sys
from pathlib import Path

# Recorded under the pins on the machine where the anchors' values were recorded (2026-11-28: "Intel(R) Xeon(R)
# Processor", Sapphire Rapids flags: avx512f avx512_bf16 amx_bf16 amx_tile), with `python tests/kernel_probe.py`;
# the same digests came from QEMU's Haswell-v4, Skylake-Server-v4, Icelake-Server-v6 and Cascadelake-Server-v5
# models (Intel; TCG emulates up to AVX2 on each).
RECORDED_DIGESTS: dict[str, str] = {
    "fp32_linear_fwd_bwd": "4d7e340f73269777",
    "fp32_matmul_192x384x384": "a5c23ba9e3feaa61",
    "bf16_autocast_linear_fwd_bwd": "1e5cc89343e9ecc5",
    "bf16_matmul_192x384x384": "68c6cc966c7970d7",
    "bf16_elementwise": "b1a4639ef15ab19d",
    "layernorm": "121c0f490a33c796",
    "gelu": "bebe09df891c74d6",
    "softmax_cross_entropy": "17d133287f6976cc",
    "vector_math": "d824864db28271d5",
    "reductions": "da30758aadb181b0",
    "conv2d": "ea2d054951c86559",
    "batchnorm": "140c5e821d6a6360",
    "float8_casts": "6dddf9c4be9d4f70",
    "adamw_steps": "d8b833690610b04c",
}

PINNED: dict[str, str] = {
    "ATEN_CPU_CAPABILITY": "avx2",
    "ONEDNN_MAX_CPU_ISA": "AVX2",
    "MKL_CBWR": "AVX2",
    "OMP_NUM_THREADS": "1",
}

# torch's CPU fp8 matrix product (``torch._scaled_mm``, through oneDNN) has backward kernels only from AVX512-FP16
# up (Sapphire Rapids and later): under the AVX2 cap an fp8 training step fails ("could not create a primitive
# descriptor for the matmul primitive"), and on a CPU without AVX512-FP16 it fails whatever the cap. The fp8
# tests therefore train in child processes with oneDNN capped here instead, the fp8 recorder records under the
# same cap, and both skip on a CPU without the feature.
FP8_ONEDNN_ISA = "AVX512_CORE_FP16"
FP8_PINNED: dict[str, str] = {**PINNED, "ONEDNN_MAX_CPU_ISA": FP8_ONEDNN_ISA}


def cpu_runs_fp8_training() -> bool:
    """Whether torch's CPU fp8 training kernels exist on this CPU (AVX512-FP16, see ``FP8_ONEDNN_ISA``)."""
    return "avx512_fp16" in cpu_flags()


def native_requested() -> bool:
    """``EMBER_TEST_KERNELS=native``: run the suite on this CPU's own kernels (to time them, or to exercise its
    AVX512 / AMX paths); the recorded-anchor comparisons then skip."""
    return os.environ.get("EMBER_TEST_KERNELS", "") == "native"


def pin(environ: os._Environ[str] | dict[str, str] | None = None) -> None:
    """Put the pinned kernel path into ``environ`` (``os.environ`` by default) before torch starts.

    Refuses when torch is already imported into this process: the thread count and MKL's branch are read when
    its libraries load, so setting them afterwards would leave this process on its CPU's own kernels.
    """
    target = os.environ if environ is None else environ
    if environ is None and "torch" in sys.modules:
        stale = {name: value for name, value in PINNED.items() if os.environ.get(name) != value}
        if stale:
            raise RuntimeError(f"tests.kernel_path.pin() was called after torch was imported, with {stale} not yet "
                               "set: call it before the first `import torch` (the recorders do it on their first "
                               "lines), or export the settings in the shell that starts Python.")
    target.update(PINNED)


def describe() -> str:
    """The pinned settings as one line for messages and recordings."""
    return " ".join(f"{name}={value}" for name, value in PINNED.items())


def cpu_flags() -> set[str]:
    """The CPU's feature flags from /proc/cpuinfo (empty where there is none)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def cpu_description() -> str:
    """The model name, vendor and the flags that decide kernel paths, from /proc/cpuinfo."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or "unknown CPU"
    fields = dict(line.split(":", 1) for line in text.split("\n\n")[0].splitlines() if ":" in line)
    flags = set(fields.get("flags\t\t", fields.get("flags", "")).split())
    wanted = [f for f in ("avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile") if f in flags]
    model = fields.get("model name\t", "?").strip()
    vendor = fields.get("vendor_id\t", "?").strip()
    return f"{model} ({vendor}; {' '.join(wanted) or 'no AVX2'})"


def pins_cover_this_cpu() -> bool:
    """Whether the pins are claimed to reproduce the recording machine's bits here: an Intel x86-64 CPU with AVX2.

    Elsewhere (an AMD CPU, where MKL ignores ``MKL_CBWR``; a CPU without AVX2) the recorded-anchor comparisons
    may differ in the last bits for reasons that are the CPU's, not Ember's.
    """
    return platform.machine() in ("x86_64", "AMD64") and "GenuineIntel" in cpu_description() and \
        "avx2" in cpu_description()


def moved_kernels() -> dict[str, tuple[str, str]]:
    """The kernels this process computes with other bits than the recording machine: {name: (recorded, here)}.

    Runs tests/kernel_probe.py in this process (under its own random state): call it only where the pins are in
    force, as in the test session.
    """
    import torch

    from tests.kernel_probe import probe

    with torch.random.fork_rng(devices=[]):
        got = probe()
    return {name: (RECORDED_DIGESTS.get(name, "-"), value) for name, value in got.items()
            if RECORDED_DIGESTS.get(name) != value}
