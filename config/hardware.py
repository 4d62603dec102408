"""Which float type is fastest on this machine, for settings that say "auto".

bfloat16 halves memory, but a CPU without native bf16 arithmetic emulates it. On an AVX2-only
AMD EPYC (no AVX512-BF16, no AMX), side by side in one run (tests/benchmarks/bench_dtype.py, one
torch thread): float32 generated 2.2x faster than bf16 for 8 chats at once, 2.25x for a `code` group
and 4.9x for a BFCL group (~850-token prompt); the learner's forward + backward under bf16 autocast
took 12.6x longer (158 s vs 12.5 s for 4 x 256 tokens); an embedding query 2x longer. On a CPU with
AVX512-BF16, bf16 was the faster one. "auto" therefore means bf16 on CUDA and on CPUs whose flags
list native bf16, float32 everywhere else.
"""

from __future__ import annotations

import functools
from pathlib import Path

NATIVE_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})  # x86 (AVX512/AMX), aarch64 ("Features: bf16")


def cpu_flags(cpuinfo: str) -> set[str]:
    """The feature flags of the first CPU in a /proc/cpuinfo text ('flags' on x86, 'Features' on arm)."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return set(value.split())
    return set()


@functools.cache
def native_bf16(cpuinfo_path: str = "/proc/cpuinfo") -> bool:
    try:
        text = Path(cpuinfo_path).read_text()
    except OSError:  # not Linux: no evidence of native bf16
        return False
    return bool(cpu_flags(text) & NATIVE_BF16_FLAGS)


def fast_bf16(device: str, native: bool | None = None) -> bool:
    """Whether bf16 arithmetic is native (and so the fast choice) on `device`."""
    if device.startswith("cuda"):
        return True
    return native_bf16() if native is None else native


def resolve_dtype(requested: str, device: str, native: bool | None = None) -> str:
    """'auto' -> 'bfloat16' where bf16 is native on `device`, else 'float32'; other values pass through."""
    if requested != "auto":
        return requested
    return "bfloat16" if fast_bf16(device, native) else "float32"
