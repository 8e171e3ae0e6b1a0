"""bf16 autocast on a CPU without native bf16 warns once, naming the missing feature and the fp32 alternative;
the decision comes from the CPU's flags, which tests override with EMBER_CPU_BF16."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from engine import Accelerator
from engine.precision.cpu_features import bf16_slowdown_note, cpu_flags, native_bf16

AVX2_ONLY = frozenset({"fpu", "sse2", "avx", "avx2", "fma"})
SAPPHIRE_RAPIDS = frozenset({"avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16"})
GRAVITON2 = frozenset({"fp", "asimd", "atomics"})
GRAVITON3 = frozenset({"fp", "asimd", "atomics", "bf16", "sve"})


def test_the_flags_decide() -> None:
    assert [native_bf16(f) for f in (AVX2_ONLY, SAPPHIRE_RAPIDS, GRAVITON2, GRAVITON3, None)] == \
        [False, True, False, True, None]
    note = bf16_slowdown_note(AVX2_ONLY)
    assert note is not None and "lacks AVX512-BF16 and AMX-BF16" in note and "mixed_precision='no' (fp32)" in note
    assert "the BF16 extension (Armv8.6)" in (bf16_slowdown_note(GRAVITON2) or "")
    assert bf16_slowdown_note(SAPPHIRE_RAPIDS) is None and bf16_slowdown_note(None) is None  # native, or unknown
    assert bf16_slowdown_note(AVX2_ONLY, override="1") is None  # EMBER_CPU_BF16 wins over the flags
    assert bf16_slowdown_note(SAPPHIRE_RAPIDS, override="0") is not None


def test_flags_are_read_from_cpuinfo(tmp_path: Path) -> None:
    (tmp_path / "x86").write_text("processor\t: 0\nmodel name\t: X\nflags\t\t: fpu avx2 avx512_bf16\n\n"
                                  "processor\t: 1\nflags\t\t: fpu avx2 avx512_bf16\n")
    (tmp_path / "arm").write_text("processor\t: 0\nFeatures\t: fp asimd bf16\n")
    assert cpu_flags(str(tmp_path / "x86")) == {"fpu", "avx2", "avx512_bf16"}
    assert cpu_flags(str(tmp_path / "arm")) == {"fp", "asimd", "bf16"}
    assert cpu_flags(str(tmp_path / "missing")) is None


def test_cpu_bf16_autocast_warns_once_where_bf16_is_emulated(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EMBER_CPU_BF16", "0")  # as on a CPU without AVX512-BF16 / AMX
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        Accelerator(cpu=True, mixed_precision="bf16")
        Accelerator(cpu=True, mixed_precision="bf16")  # the second one says nothing more
    notes = [str(w.message) for w in caught if "slower than fp32" in str(w.message)]
    assert len(notes) == 1 and "mixed_precision='no' (fp32)" in notes[0]


@pytest.mark.parametrize(("override", "precision"), [("1", "bf16"), ("0", "no"), ("0", "fp16")])
def test_no_warning_where_it_does_not_apply(override: str, precision: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EMBER_CPU_BF16", override)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        Accelerator(cpu=True, mixed_precision=precision)
    assert not [w for w in caught if "slower than fp32" in str(w.message)]
