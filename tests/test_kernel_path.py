"""The suite's pinned CPU kernel path (tests/kernel_path.py) holds, and gives the same bits on another processor.

The parity tests compare Ember's runs with values recorded from the real Lightning, Accelerate, DeepSpeed and
torchao, bit for bit. Those values hold on any machine only if the kernels that computed them are the same there;
these tests check the three links of that chain:

1. this test session (and so every process it starts) runs under the pins;
2. under the pins, this CPU gives the digests recorded on the machine where the anchors were recorded
   (tests/kernel_probe.py: each kind of computation the recorded runs use). If this fails, every recorded-anchor
   comparison is expected to fail on this CPU too, and the message says which kernels moved;
3. under the pins, an emulated AVX2-only Haswell (QEMU's user mode, ``-cpu Haswell-v4``: another instruction set,
   other cache sizes) gives the same digests as this CPU, while without the pins the two differ wherever this CPU
   has AVX512: a different forced instruction set, equal results.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.kernel_path import PINNED, cpu_description, describe, moved_kernels

ROOT = Path(__file__).resolve().parents[1]
PROBE = ROOT / "tests" / "kernel_probe.py"
QEMU = shutil.which("qemu-x86_64")


def run_probe(env: dict[str, str], emulate: str | None = None, timeout: float = 600) -> dict[str, Any]:
    command = [sys.executable, str(PROBE)]
    if emulate is not None:
        assert QEMU is not None
        command = [QEMU, "-cpu", emulate, *command]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    assert done.returncode == 0, f"{' '.join(command)} failed:\n{done.stderr[-3000:]}"
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def unpinned_environment() -> dict[str, str]:
    return {name: value for name, value in os.environ.items() if name not in PINNED}


@pytest.mark.recorded_bits
def test_the_session_runs_on_the_pinned_kernel_path() -> None:
    assert {name: os.environ.get(name) for name in PINNED} == PINNED
    assert torch.get_num_threads() == 1
    capability = torch.backends.cpu.get_cpu_capability()
    assert capability == "AVX2", (
        f"ATen runs its {capability} kernels under ATEN_CPU_CAPABILITY=avx2: this CPU ({cpu_description()}) lacks "
        "AVX2, so the values recorded from the anchors cannot be reproduced here (tests/kernel_path.py)")


@pytest.mark.recorded_bits
def test_this_cpu_gives_the_recorded_digests_under_the_pins() -> None:
    moved = moved_kernels()
    assert not moved, (
        f"under {describe()} this CPU, {cpu_description()}, computes these kernels with other bits than the machine "
        f"the anchors were recorded on (recorded, here): {moved}. The recorded-anchor comparisons (DeepSpeed, "
        "activation checkpointing, fp8, model parallel, the Lightning corpus, Accelerate's scripts) will differ "
        "in the last bits on this CPU for the same reason; Ember-against-Ember comparisons are unaffected. "
        "If torch or a kernel library changed, re-record the anchors (tests/parity_scripts/) and RECORDED_DIGESTS.")


@pytest.mark.recorded_bits
@pytest.mark.skipif(QEMU is None or platform.machine() != "x86_64",
                    reason="needs QEMU's x86-64 user mode (Debian's qemu-user; .ci/run installs it)")
def test_an_emulated_avx2_only_cpu_gives_the_same_bits_under_the_pins() -> None:
    here = run_probe(dict(os.environ))
    haswell = run_probe(dict(os.environ), emulate="Haswell-v4")
    assert haswell["capability"] == "AVX2"
    assert haswell["digests"] == here["digests"]
    if "avx512f" in cpu_description():
        # Without the pins this CPU runs its AVX512 kernels (Haswell's own kernels are the pinned ones): they
        # disagree, so the pins are what makes the two processors agree.
        native = run_probe(unpinned_environment())
        assert native["capability"] == "AVX512"
        assert native["digests"] != here["digests"], "this AVX512 CPU gave the pinned bits even without the pins"
