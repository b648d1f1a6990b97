"""One command under three memory allocators, one after another: the system's (glibc), jemalloc with
its defaults, and jemalloc never giving pages back (what the ``eagle`` command uses,
eagle/allocator.py); wall, user and system seconds and minor page faults of each run. With
``--rounds N`` the three take turns N times (the order rotating), each run reported.

    python experiments/perf/allocator_ab.py -- python experiments/perf/ttt_step_ab.py --data-tokens 60000 --rounds 2 --steps 2
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import Arm, interleave  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "experiments/results/allocator_ab.json"))
    ap.add_argument("--rounds", type=int, default=1, help="runs per allocator, the three taking turns")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command to run")
    args = ap.parse_args(argv)
    cmd = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not cmd:
        ap.error("give the command to run after --")

    from eagle.backends.cpu.allocator import JEMALLOC_CONF, find_jemalloc

    lib = find_jemalloc()
    if lib is None:
        print("error: no libjemalloc found (apt-get install libjemalloc2, or set EAGLE_JEMALLOC)", file=sys.stderr)
        return 2
    base = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "MALLOC_CONF")}
    base["EAGLE_ALLOCATOR"] = "system"  # the command must not re-execute itself under another one
    ways = {"system (glibc)": {},
            "jemalloc, defaults": {"LD_PRELOAD": lib},
            "jemalloc, " + JEMALLOC_CONF: {"LD_PRELOAD": lib, "MALLOC_CONF": JEMALLOC_CONF}}
    if args.rounds < 1:
        ap.error("--rounds must be positive")
    results: dict[str, list[dict]] = {name: [] for name in ways}

    class Failed(Exception):
        pass

    def arm(name: str) -> Arm:
        def run():
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            proc = subprocess.run(cmd, env=dict(base, **ways[name]), capture_output=True, text=True)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            if proc.returncode:
                raise Failed(f"the command failed under {name}: {proc.stderr.strip().splitlines()[-1:]}")
            return {"user_s": after.ru_utime - before.ru_utime, "sys_s": after.ru_stime - before.ru_stime,
                    "minor_faults": after.ru_minflt - before.ru_minflt,
                    "output_tail": proc.stdout.strip().splitlines()[-3:]}
        return Arm(run, after=results[name].append)

    def report(_round, name, seconds):
        r = results[name][-1]
        r["wall_s"] = seconds
        print(f"{name}: {r['wall_s']:.1f} s wall, {r['user_s']:.1f} s user, {r['sys_s']:.1f} s sys, "
              f"{r['minor_faults']:,} minor faults", flush=True)
        for line in r["output_tail"]:
            print(f"    {line}")

    try:
        interleave({name: arm(name) for name in ways}, args.rounds, warmup=0, order="rotate", progress=report)
    except Failed as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if args.rounds == 1:  # one record per allocator, the form of experiments/results/allocator_ab*.json
        results = {name: runs[0] for name, runs in results.items()}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"command": cmd, "library": lib, "runs": results}, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
