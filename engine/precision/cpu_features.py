"""Whether this CPU computes in bf16 natively, so that ``mixed_precision="bf16"`` on the CPU is not a slowdown.

torch's CPU autocast runs bf16 matrix products through oneDNN. With AVX512-BF16 or AMX-BF16 (x86) or the BF16
extension (Arm) they are native and faster than fp32; without them oneDNN converts to fp32 and back, and a step
is slower than in fp32: measured here with oneDNN limited to AVX512 without BF16, 1.2x; limited to AVX2, 3.5-4x
(``ONEDNN_MAX_CPU_ISA``). The check reads the flags the kernel reports in ``/proc/cpuinfo``; where there is no
such file (macOS, Windows) nothing is known and nothing is said. ``EMBER_CPU_BF16=1`` / ``0`` overrides it (read
by ``engine.environment``).

>>> native_bf16(frozenset({"avx2", "avx512f", "avx512_bf16"})), native_bf16(frozenset({"avx2", "fma"}))
(True, False)
>>> print(bf16_slowdown_note(frozenset({"avx2", "fma"})))  # doctest: +ELLIPSIS
mixed_precision='bf16' on this CPU is slower than fp32: it lacks AVX512-BF16 and AMX-BF16...
"""

from __future__ import annotations

_X86_NATIVE = ("avx512_bf16", "amx_bf16")


def cpu_flags(cpuinfo: str = "/proc/cpuinfo") -> frozenset[str] | None:
    """The feature flags of the first CPU in ``cpuinfo`` (x86 ``flags``, Arm ``Features``), or None if unknown."""
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as handle:
            for line in handle:  # the first processor's line is enough: every core has the same features
                key, _, value = line.partition(":")
                if key.strip() in ("flags", "Features"):
                    return frozenset(value.split())
    except OSError:
        return None
    return None


def native_bf16(flags: frozenset[str] | None) -> bool | None:
    """Whether ``flags`` include native bf16 arithmetic (None: the flags are unknown)."""
    if flags is None:
        return None
    if "asimd" in flags:  # Arm: the BF16 extension (Armv8.6, e.g. Graviton3, Apple M2 under Linux)
        return "bf16" in flags
    return any(flag in flags for flag in _X86_NATIVE)


def bf16_slowdown_note(flags: frozenset[str] | None, override: str | None = None) -> str | None:
    """The warning to give for CPU bf16 autocast with these ``flags``, or None when bf16 is native (or unknown).

    ``override``: ``EMBER_CPU_BF16``'s value: ``"1"`` says bf16 is native, ``"0"`` that it is not, whatever the
    flags say (a CPU the flags misdescribe, or a test).
    """
    if override is not None and override.strip() != "":
        native: bool | None = override.strip().lower() in ("1", "true", "yes", "on")
    else:
        native = native_bf16(flags)
    if native is not False:
        return None
    missing = "the BF16 extension (Armv8.6)" if flags and "asimd" in flags else "AVX512-BF16 and AMX-BF16"
    return (f"mixed_precision='bf16' on this CPU is slower than fp32: it lacks {missing}, so torch converts every "
            "bf16 matrix product to fp32 and back (1.2x slower with AVX512, 3.5-4x with AVX2 only, measured). Use "
            "mixed_precision='no' (fp32) on this machine; set EMBER_CPU_BF16=1 if this CPU computes in bf16 after all.")


__all__ = ["bf16_slowdown_note", "cpu_flags", "native_bf16"]
