"""What the kernels ask of the machine: the CPU's feature flags, and where builds are cached."""
from __future__ import annotations

import os
from pathlib import Path

__all__ = ["cpu_flags", "cache_dir"]


def cpu_flags(cpuinfo: str = "/proc/cpuinfo") -> set[str]:
    """The CPU's feature flags from ``cpuinfo`` (empty where it cannot be read)."""
    try:
        with open(cpuinfo) as f:
            return set(next((line for line in f if line.startswith("flags")), "").split())
    except OSError:
        return set()


def cache_dir() -> Path:
    """The project's cache folder: ``$EAGLE_CACHE``, else ``~/.cache/eagle`` (builds go under it)."""
    return Path(os.environ.get("EAGLE_CACHE", Path.home() / ".cache" / "eagle"))
