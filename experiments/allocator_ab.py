"""One command under three memory allocators, one after another: the system's (glibc), jemalloc with
its defaults, and jemalloc never giving pages back (what the ``eagle`` command uses,
eagle/allocator.py); wall, user and system seconds and minor page faults of each run.

    python experiments/allocator_ab.py -- python experiments/ttt_step_ab.py --data-tokens 60000 --rounds 2 --steps 2
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "experiments/results/allocator_ab.json"))
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command to run")
    args = ap.parse_args(argv)
    cmd = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not cmd:
        ap.error("give the command to run after --")

    from eagle.allocator import JEMALLOC_CONF, find_jemalloc

    lib = find_jemalloc()
    if lib is None:
        print("error: no libjemalloc found (apt-get install libjemalloc2, or set EAGLE_JEMALLOC)", file=sys.stderr)
        return 2
    base = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "MALLOC_CONF")}
    base["EAGLE_ALLOCATOR"] = "system"  # the command must not re-execute itself under another one
    ways = {"system (glibc)": {},
            "jemalloc, defaults": {"LD_PRELOAD": lib},
            "jemalloc, " + JEMALLOC_CONF: {"LD_PRELOAD": lib, "MALLOC_CONF": JEMALLOC_CONF}}
    results = {}
    for name, extra in ways.items():
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, env=dict(base, **extra), capture_output=True, text=True)
        wall = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if proc.returncode:
            print(f"error: the command failed under {name}: {proc.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
            return 1
        results[name] = {"wall_s": wall, "user_s": after.ru_utime - before.ru_utime,
                         "sys_s": after.ru_stime - before.ru_stime, "minor_faults": after.ru_minflt - before.ru_minflt,
                         "output_tail": proc.stdout.strip().splitlines()[-3:]}
        r = results[name]
        print(f"{name}: {r['wall_s']:.1f} s wall, {r['user_s']:.1f} s user, {r['sys_s']:.1f} s sys, "
              f"{r['minor_faults']:,} minor faults", flush=True)
        for line in r["output_tail"]:
            print(f"    {line}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"command": cmd, "library": lib, "runs": results}, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
