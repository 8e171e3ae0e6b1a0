"""One CPU kernel path for the test suite and the recorders, so values recorded from the real Lightning,
Accelerate, DeepSpeed and torchao on one machine are reproduced bit for bit on another.

torch's CPU kernels pick their code by the processor they run on: ATen's vectorised kernels by instruction set
(AVX2 / AVX512), oneDNN's JIT kernels (bf16 matrix products, convolutions) by instruction set (AVX512-BF16 and AMX
where present), MKL's BLAS and vector math (``exp``, ``log``, ``sqrt``, ``erf`` on contiguous tensors) by
processor, and reductions by the number of threads. The same script therefore ends with other last bits on
another CPU. Measured here (tests/test_kernel_path.py records it): on this Sapphire Rapids Xeon (AVX512, AMX), a
bf16 autocast ``Linear``, ``GELU``, ``exp`` / ``log`` / ``sqrt``, an AdamW step and a 1M-element sum give other
bits than on an AVX2-only Haswell; under the settings below both give the same bits.

The settings cap every library at AVX2 (every x86-64 server CPU of the last ten years has it) and fix the thread
count at one:

- ``ATEN_CPU_CAPABILITY=avx2``: ATen's dispatch picks its AVX2 kernels (torch reads it on the first dispatch);
- ``ONEDNN_MAX_CPU_ISA=AVX2``: oneDNN generates AVX2 code (no AVX512, AVX512-BF16 or AMX kernels);
- ``MKL_CBWR=AVX2``: MKL's conditional numerical reproducibility, its AVX2 branch on any Intel CPU;
- ``OMP_NUM_THREADS=1``: a reduction splits its work by thread count; the multi-process tests already run each
  rank on one thread.

They apply to the test suite (``tests/conftest.py`` sets them before torch starts) and to the recorders in
``tests/parity_scripts/`` (each calls :func:`pin` first); never to users' runs, which keep their CPU's fastest
kernels. What stays CPU-specific even so: MKL ignores ``MKL_CBWR`` on non-Intel processors (its vector math then
runs its SSE code, whose reciprocal-square-root estimates differ between vendors), so on an AMD CPU the
recorded-anchor comparisons can differ in the last bits; :mod:`tests.test_kernel_path` says so by name when it
happens. Every Ember-against-Ember comparison (a resumed run against the uninterrupted one, rank against rank) is
bitwise on whatever CPU runs it, pinned or not.
"""

from __future__ import annotations

import os
import sys

PINNED: dict[str, str] = {
    "ATEN_CPU_CAPABILITY": "avx2",
    "ONEDNN_MAX_CPU_ISA": "AVX2",
    "MKL_CBWR": "AVX2",
    "OMP_NUM_THREADS": "1",
}


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
