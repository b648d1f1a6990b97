"""Run the ``eagle`` command under jemalloc, keeping freed memory for reuse.

Why: PyTorch's CPU tensors come straight from the C allocator, and glibc hands every allocation
above 32 MB (``M_MMAP_THRESHOLD``'s ceiling) to a fresh ``mmap`` and gives it back on free. A
training step allocates several GB of such short-lived tensors, so the kernel faults in and
zeroes every one of their pages again, step after step; jemalloc told never to give pages back
(``dirty_decay_ms:-1,muzzy_decay_ms:-1``) reuses them instead (docs/cpu-backend.md, jemalloc).

The allocator is chosen when the process starts, so the ``eagle`` command re-executes itself once,
with ``LD_PRELOAD`` naming libjemalloc (Debian/Ubuntu: ``apt-get install libjemalloc2``), when it
is installed and not loaded yet. ``EAGLE_ALLOCATOR``: ``auto`` (default: jemalloc when found),
``jemalloc`` (the same, with a warning when it is not found) or ``system`` (never re-execute);
``EAGLE_JEMALLOC``: the library's path where it is not in a usual folder. A user's own
``MALLOC_CONF`` is kept.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

__all__ = ["JEMALLOC_CONF", "find_jemalloc", "allocator_env", "use_fast_allocator"]

# never return dirty or muzzy pages to the kernel: the next step reuses them without page faults
JEMALLOC_CONF = "dirty_decay_ms:-1,muzzy_decay_ms:-1"
CHOICES = ("auto", "jemalloc", "system")
_LIB_DIRS = ("/usr/lib/x86_64-linux-gnu", "/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu",
             "/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/local/lib")
_MARK = "_EAGLE_ALLOCATOR_SET"  # set in the re-executed process: never twice


def find_jemalloc(dirs=_LIB_DIRS, environ=None) -> str | None:
    """The path of an installed libjemalloc shared library (``EAGLE_JEMALLOC`` first), or None."""
    given = (os.environ if environ is None else environ).get("EAGLE_JEMALLOC")
    if given:
        return given if Path(given).is_file() else None
    for d in dirs:
        for name in ("libjemalloc.so.2", "libjemalloc.so"):
            p = Path(d) / name
            if p.is_file():
                return str(p)
    return None


def allocator_env(environ: dict, lib: str | None) -> dict | None:
    """The environment to re-execute with (jemalloc preloaded), or None when the process should go
    on as it is: ``EAGLE_ALLOCATOR=system``, no library, jemalloc already preloaded, or already
    re-executed. Raises ValueError for an unknown ``EAGLE_ALLOCATOR``."""
    choice = environ.get("EAGLE_ALLOCATOR", "auto") or "auto"
    if choice not in CHOICES:
        raise ValueError(f"EAGLE_ALLOCATOR must be one of {', '.join(CHOICES)}, got '{choice}'")
    preload = environ.get("LD_PRELOAD", "")
    if choice == "system" or lib is None or environ.get(_MARK) or "jemalloc" in preload:
        return None
    env = dict(environ)
    env["LD_PRELOAD"] = ":".join(p for p in (lib, preload) if p)
    env.setdefault("MALLOC_CONF", JEMALLOC_CONF)
    env[_MARK] = "1"
    return env


def use_fast_allocator() -> None:
    """Re-execute this process's own command line under jemalloc when :func:`allocator_env` says so
    (it does not return then); otherwise return at once. Call it first thing in a command's entry."""
    lib = find_jemalloc()
    try:
        env = allocator_env(dict(os.environ), lib)
    except ValueError as e:
        print(f"eagle: error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    if env is None:
        if os.environ.get("EAGLE_ALLOCATOR") == "jemalloc" and lib is None:
            print("eagle: warning: EAGLE_ALLOCATOR=jemalloc but no libjemalloc was found (apt-get install "
                  "libjemalloc2); running with the system allocator", file=sys.stderr)
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, list(sys.orig_argv), env)
