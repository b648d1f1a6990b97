"""What the kernels ask of the machine: the CPU's feature flags, and where builds are cached."""
from __future__ import annotations

import os
from pathlib import Path

__all__ = ["cpu_flags", "native_bf16_cpu", "cache_dir", "last_level_cache_bytes"]


def cpu_flags(cpuinfo: str = "/proc/cpuinfo") -> set[str]:
    """The CPU's feature flags from ``cpuinfo`` (empty where it cannot be read)."""
    try:
        with open(cpuinfo) as f:
            return set(next((line for line in f if line.startswith("flags")), "").split())
    except OSError:
        return set()


def native_bf16_cpu(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """Whether the CPU has native bfloat16 products (AVX512-BF16 or AMX-BF16)."""
    flags = cpu_flags(cpuinfo)
    return "avx512_bf16" in flags or "amx_bf16" in flags


def last_level_cache_bytes(sysfs: str = "/sys/devices/system/cpu/cpu0/cache", default: int = 64 << 20) -> int:
    """The size of CPU 0's largest (last-level) cache from ``sysfs``, e.g. "260M" -> bytes;
    ``default`` where it cannot be read."""
    sizes = []
    for index in sorted(Path(sysfs).glob("index*")):
        try:
            text = (index / "size").read_text().strip().upper()
        except OSError:
            continue
        unit = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        digits = text[:-1] if text[-1:] in "KMG" else text
        if digits.isdigit():
            sizes.append(int(digits) * unit)
    return max(sizes, default=default)


def cache_dir() -> Path:
    """The project's cache folder: ``$EAGLE_CACHE``, else ``~/.cache/eagle`` (builds go under it)."""
    return Path(os.environ.get("EAGLE_CACHE", Path.home() / ".cache" / "eagle"))
