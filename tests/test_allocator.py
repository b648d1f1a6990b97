"""eagle/backends/cpu/allocator.py: when the ``eagle`` command re-executes itself under jemalloc, and that it
does so exactly once, keeping its command line (a subprocess, with a stand-in library path)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from eagle.backends.cpu.allocator import JEMALLOC_CONF, allocator_env, find_jemalloc


def test_allocator_env_decisions():
    lib = "/x/libjemalloc.so.2"
    env = allocator_env({"PATH": "/bin"}, lib)
    assert env["LD_PRELOAD"] == lib and env["MALLOC_CONF"] == JEMALLOC_CONF and env["PATH"] == "/bin"
    # another preloaded library stays, after ours; a user's MALLOC_CONF is kept
    env = allocator_env({"LD_PRELOAD": "/y/libfoo.so", "MALLOC_CONF": "narenas:1"}, lib)
    assert env["LD_PRELOAD"] == f"{lib}:/y/libfoo.so" and env["MALLOC_CONF"] == "narenas:1"
    assert allocator_env({}, None) is None  # not installed
    assert allocator_env({"EAGLE_ALLOCATOR": "system"}, lib) is None
    assert allocator_env({"LD_PRELOAD": "/usr/lib/libjemalloc.so.2"}, lib) is None  # already there
    assert allocator_env(allocator_env({}, lib), lib) is None  # the re-executed process goes on
    assert allocator_env({"EAGLE_ALLOCATOR": "jemalloc"}, lib) is not None
    with pytest.raises(ValueError, match="EAGLE_ALLOCATOR must be one of auto, jemalloc, system, got 'tcmalloc'"):
        allocator_env({"EAGLE_ALLOCATOR": "tcmalloc"}, lib)


def test_find_jemalloc(tmp_path):
    assert find_jemalloc([str(tmp_path)], environ={}) is None
    (tmp_path / "libjemalloc.so.2").write_bytes(b"")
    assert find_jemalloc([str(tmp_path / "none"), str(tmp_path)], environ={}) == str(tmp_path / "libjemalloc.so.2")
    assert find_jemalloc([], environ={"EAGLE_JEMALLOC": str(tmp_path / "libjemalloc.so.2")}) == str(
        tmp_path / "libjemalloc.so.2")
    assert find_jemalloc([str(tmp_path)], environ={"EAGLE_JEMALLOC": str(tmp_path / "missing.so")}) is None


def _libc() -> str:
    """A real shared library to stand in for jemalloc: preloading libc changes nothing."""
    import ctypes.util

    for d in ("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib/aarch64-linux-gnu", "/lib64", "/usr/lib64"):
        p = os.path.join(d, "libc.so.6")
        if os.path.isfile(p):
            return p
    name = ctypes.util.find_library("c")
    if not name or not os.path.isabs(name):
        pytest.skip("no libc.so.6 path to stand in for libjemalloc")
    return name


CHILD = ("import os, sys\n"
         "print('start', flush=True)\n"
         "from eagle.backends.cpu.allocator import use_fast_allocator\n"
         "use_fast_allocator()\n"
         "print('args', sys.argv[1:], os.environ.get('LD_PRELOAD'), os.environ.get('MALLOC_CONF'))\n")


@pytest.mark.skipif(sys.platform != "linux", reason="LD_PRELOAD re-execution is for Linux")
def test_the_command_reexecutes_once_with_its_arguments():
    lib = _libc()
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "MALLOC_CONF", "EAGLE_ALLOCATOR")}
    env["EAGLE_JEMALLOC"] = lib
    out = subprocess.run([sys.executable, "-c", CHILD, "bench", "--x"], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines.count("start") == 2  # the first process, then the re-executed one; no third
    assert lines[-1] == f"args ['bench', '--x'] {lib} {JEMALLOC_CONF}"
    env["EAGLE_ALLOCATOR"] = "system"
    out = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=120)
    assert out.stdout.splitlines() == ["start", "args [] None None"]
    env["EAGLE_ALLOCATOR"] = "bogus"
    out = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "EAGLE_ALLOCATOR must be one of" in out.stderr and "Traceback" not in out.stderr
