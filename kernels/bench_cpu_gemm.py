"""Benchmark the small-row CPU GEMM (kernels/cpu_gemm.py) against MKL's GEMM (``F.linear``) and its
packed GEMM, on all of SmolLM2-135M's products of one step: 30 layers x (q, k, v, o, gate, up,
down) plus the 49,152 x 576 LM head, 211 weights, 538 MB of float32 (random weights of the real
shapes). For each row count the three ways run in rotating order, ``--rounds`` times; the table
gives medians, the effective weight-read bandwidth and the ratio to ``F.linear``. The memory's own
read speed (a 512 MB sum) is measured in the same run, for the floor.

    python kernels/bench_cpu_gemm.py --rows 1,2,4,8,16,32,64 --rounds 7
    python kernels/bench_cpu_gemm.py --prefetch-ab --rows 1,4,16   # the kernel with / without prefetching
    python kernels/bench_cpu_gemm.py --roofline --rows 1,8,12,16,32,64   # arithmetic vs memory bound
    python kernels/bench_cpu_gemm.py --against 98f5ce6 --rows 1,4,8,16,32   # this kernel vs a git revision's
    python kernels/bench_cpu_gemm.py --rows 8,16 \
        --variants "pf8k:CPU_GEMM_PREFETCH_BYTES=8192,chunk32:CPU_GEMM_CHUNK_K=32"   # builds with other settings
    python kernels/bench_cpu_gemm.py --rows 1,8,16,32 \
        --plans "pf16k:prefetch_many=16384,blocks:turns=0;prefetch_many=16384"   # settings of the one build (the start-up choice's candidates)
"""
from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch
import torch.nn.functional as F

from eagle_kernels.cliargs import positive_ints
from eagle_kernels import cpu_gemm

LAYER = [(576, 576), (192, 576), (192, 576), (576, 576), (1536, 576), (1536, 576), (576, 1536)]
SHAPES = LAYER * 30 + [(49152, 576)]


def read_bandwidth_gbs(mb: int = 512, repeats: int = 5) -> float:
    a = torch.ones(mb * 2 ** 20 // 4)
    a.sum()
    best = min(_time(a.sum) for _ in range(repeats))
    return a.numel() * 4 / best / 1e9


def _time(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _rotating_medians(ways: dict, rounds: int) -> dict[str, float]:
    """Median ms of each zero-argument way over ``rounds`` rounds in rotating order (one warm-up each)."""
    times = {k: [] for k in ways}
    names = list(ways)
    for fn in ways.values():
        fn()
    for i in range(rounds):
        for k in names[i % len(names):] + names[:i % len(names)]:
            times[k].append(_time(ways[k]))
    return {k: statistics.median(v) * 1e3 for k, v in times.items()}


def _builds_medians(builds: dict, weights, rows, rounds: int, gen):
    """Per row count ``r``: ``(r, {name: median ms})`` of each build's ``packed_linear`` over every
    weight, on one packed layout shared by all builds, in rotating order. Every build runs at the
    settings the shipped build measured on this machine (``cpu_gemm.plan()``; a new build starts at
    its defaults)."""
    chosen = cpu_gemm.plan()
    for ext in builds.values():
        cpu_gemm._apply_plan(ext, chosen)
    packs = [(cpu_gemm.packed_weight(w), w.shape[0]) for w in weights]  # one layout for every build
    with torch.no_grad():
        for r in rows:
            xs = {k: torch.randn(r, k, generator=gen) for k in {w.shape[1] for w in weights}}
            yield r, _rotating_medians({name: (lambda e=e: [e.packed_linear(xs[p.shape[1]], p, n, None)
                                                            for p, n in packs]) for name, e in builds.items()}, rounds)


def prefetch_ab(weights, rows, rounds: int, gen) -> int:
    """The kernel against a build of the same source without its weight prefetch (``-DCPU_GEMM_NO_PREFETCH``)."""
    builds = {"off": cpu_gemm._build("-noprefetch", ("CPU_GEMM_NO_PREFETCH",)), "on": cpu_gemm._load()}
    print("| rows | without prefetch, ms | with prefetch, ms | ratio |")
    print("|---:|---:|---:|---:|")
    for r, med in _builds_medians(builds, weights, rows, rounds, gen):
        print(f"| {r} | {med['off']:.1f} | {med['on']:.1f} | {med['on'] / med['off']:.2f} |", flush=True)
    return 0


def against(weights, rows, rounds: int, gen, rev: str) -> int:
    """This kernel against the ``cpu_gemm.cpp`` of git revision ``rev``, built beside it, on the same
    weights in rotating order (a revision's source with ``small_linear(x, w, b)`` on the plain weight,
    or with ``packed_linear`` on its packed copy)."""
    root = Path(__file__).resolve().parent.parent
    try:
        text = subprocess.run(["git", "show", f"{rev}:kernels/cpu_gemm.cpp"], cwd=root, check=True,
                              capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        print(f"error: no kernels/cpu_gemm.cpp at revision '{rev}': {getattr(e, 'stderr', '') or e}".strip(),
              file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "cpu_gemm.cpp"
        src.write_text(text)
        base = cpu_gemm._build(f"-rev-{rev[:12]}", source=src)
    fast = cpu_gemm._load()
    if hasattr(base, "set_tile_blocks"):  # the width this machine measured, for both (a new build starts at 1)
        base.set_tile_blocks(min(fast.tile_blocks(), base.MAX_TILE_BLOCKS))
    chosen = cpu_gemm.plan()  # and the other settings, where the revision has them
    if hasattr(base, "set_turns"):
        base.set_turns(bool(chosen["turns"]))
    if hasattr(base, "set_prefetch_bytes"):
        try:
            base.set_prefetch_bytes(chosen["prefetch"], chosen["prefetch_many"])
        except TypeError:  # a revision with one distance for every call
            pass
    packs = [(cpu_gemm.packed_weight(w), w.shape[0]) for w in weights]
    if hasattr(base, "packed_linear"):
        base_packs = [(base.pack(w), w.shape[0]) for w in weights]
        base_fn = lambda xs: [base.packed_linear(xs[p.shape[1]], p, n, None) for p, n in base_packs]  # noqa: E731
    else:
        base_fn = lambda xs: [base.small_linear(xs[w.shape[1]], w, None) for w in weights]  # noqa: E731
    print(f"| rows | {rev}, ms | this source, ms | this / {rev} |")
    print("|---:|---:|---:|---:|")
    with torch.no_grad():
        for r in rows:
            xs = {k: torch.randn(r, k, generator=gen) for k in {w.shape[1] for w in weights}}
            med = _rotating_medians({"base": lambda: base_fn(xs),
                                     "this": lambda: [fast.packed_linear(xs[p.shape[1]], p, n, None) for p, n in packs]},
                                    rounds)
            print(f"| {r} | {med['base']:.1f} | {med['this']:.1f} | {med['this'] / med['base']:.2f} |", flush=True)
    return 0


def parse_variants(text: str) -> list[tuple[str, tuple[str, ...]]]:
    """``"name:DEF=V;DEF2=V2,name2:DEF3"`` -> ``[(name, ("DEF=V", "DEF2=V2")), (name2, ("DEF3",))]``:
    builds of this source with the CPU_GEMM_* switches of cpu_gemm.cpp set. Raises ValueError."""
    out = []
    for item in filter(None, (t.strip() for t in text.split(","))):
        name, sep, defs = item.partition(":")
        defines = tuple(d.strip() for d in defs.split(";") if d.strip())
        if not sep or not re.fullmatch(r"[A-Za-z0-9]+", name) or not defines:
            raise ValueError(f"--variants: '{item}' is not NAME:DEFINE[=VALUE][;DEFINE...] (NAME letters and digits)")
        for d in defines:
            if not re.fullmatch(r"CPU_GEMM_[A-Z0-9_]+(=[0-9]+)?", d):
                raise ValueError(f"--variants: '{d}' is not a CPU_GEMM_* switch of cpu_gemm.cpp (NAME or NAME=integer)")
        out.append((name, defines))
    if not out or len({n for n, _ in out}) != len(out):
        raise ValueError("--variants: give at least one variant, each name once")
    return out


def variants(weights, rows, rounds: int, gen, specs) -> int:
    """The kernel as shipped against builds of the same source with CPU_GEMM_* switches set (one per
    spec, see :func:`parse_variants`), on the same packed weights in rotating order."""
    builds = {"shipped": cpu_gemm._load()}
    for name, defines in specs:
        builds[name] = cpu_gemm._build(f"-var-{name}", defines)
    names = list(builds)
    print("| rows | " + " | ".join(f"{n}, ms" for n in names) + " | " + " | ".join(f"{n} / shipped" for n in names[1:]) + " |")
    print("|---:|" + "---:|" * (2 * len(names) - 1))
    for r, med in _builds_medians(builds, weights, rows, rounds, gen):
        cells = [f"{med[n]:.1f}" for n in names] + [f"{med[n] / med['shipped']:.3f}" for n in names[1:]]
        print(f"| {r} | " + " | ".join(cells) + " |", flush=True)
    return 0


PLAN_KEYS = ("width", "prefetch", "prefetch_many", "turns")  # cpu_gemm.plan()'s settings


def parse_plans(text: str) -> list[tuple[str, dict[str, int]]]:
    """``"a:width=1;prefetch_many=16384;turns=0,b:turns=1"`` -> ``[("a", {...}), ("b", {...})]``:
    settings of the one build (``cpu_gemm.plan()``: tile width for <= 8 rows, prefetch distances in
    bytes for <= 8 / more rows, turns for > 8 rows); a key left out keeps this machine's chosen
    value. Raises ValueError."""
    out = []
    for item in filter(None, (t.strip() for t in text.split(","))):
        name, sep, body = item.partition(":")
        if not sep or not re.fullmatch(r"[A-Za-z0-9]+", name):
            raise ValueError(f"--plans: '{item}' is not NAME:KEY=VALUE[;KEY=VALUE...] (NAME letters and digits)")
        plan = {}
        for part in filter(None, (t.strip() for t in body.split(";"))):
            key, eq, value = part.partition("=")
            if key not in PLAN_KEYS or not eq or not value.isdigit():
                raise ValueError(f"--plans: '{part}' is not one of {', '.join(k + '=INT' for k in PLAN_KEYS)}")
            plan[key] = int(value)
        out.append((name, plan))
    if not out or len({n for n, _ in out}) != len(out):
        raise ValueError("--plans: give at least one plan, each name once")
    return out


def plans(weights, rows, rounds: int, gen, specs) -> int:
    """This machine's chosen settings of the kernel against other settings of the same build (see
    :func:`parse_plans`), on the same packed weights in rotating order; each timing sets its plan
    first (the settings change no bit, only the speed)."""
    ext = cpu_gemm._load()
    chosen = cpu_gemm.plan()
    settings = {"chosen": chosen, **{name: {**chosen, **plan} for name, plan in specs}}
    packs = [(cpu_gemm.packed_weight(w), w.shape[0]) for w in weights]
    names = list(settings)
    print("# chosen here: " + ", ".join(f"{k}={v}" for k, v in chosen.items()) + "; "
          + "; ".join(f"{n}: " + ", ".join(f"{k}={v}" for k, v in settings[n].items()) for n in names[1:]))
    print("| rows | " + " | ".join(f"{n}, ms" for n in names) + " | " + " | ".join(f"{n} / chosen" for n in names[1:]) + " |")
    print("|---:|" + "---:|" * (2 * len(names) - 1))

    def way(plan, xs):
        def fn():
            cpu_gemm.set_plan(**plan)
            for p, n in packs:
                ext.packed_linear(xs[p.shape[1]], p, n, None)
        return fn

    try:
        with torch.no_grad():
            for r in rows:
                xs = {k: torch.randn(r, k, generator=gen) for k in {w.shape[1] for w in weights}}
                med = _rotating_medians({n: way(settings[n], xs) for n in names}, rounds)
                cells = [f"{med[n]:.1f}" for n in names] + [f"{med[n] / med['chosen']:.3f}" for n in names[1:]]
                print(f"| {r} | " + " | ".join(cells) + " |", flush=True)
    finally:
        cpu_gemm.set_plan(**chosen)
    return 0


def gemm_rate(rounds: int, n: int = 1024) -> float:
    """G multiply-adds/s of MKL's float32 GEMM on two n x n matrices (in cache, all threads): about
    the best the machine's vector units do, the ceiling any row count can approach."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    med = _rotating_medians({"mm": lambda: [a @ b for _ in range(10)]}, rounds)["mm"]
    return 10 * n ** 3 / (med / 1e3) / 1e9


def roofline(weights, rows, rounds: int, gen, bw: float, calls: int = 4000) -> int:
    """The kernel's arithmetic ceiling next to the memory's: per row count, its multiply-add rate on
    weights that stay in cache (384 x 576, ~0.9 MB, half per thread, within each core's L2), the
    bound that rate and the read bandwidth set on all 211 products (the larger of bytes / bandwidth
    and multiply-adds / rate), and the products' measured time against it. ``calls``: in-cache
    calls of one row per timing (fewer for more rows: ``calls / rows``, at least 20)."""
    hot = torch.randn(384, 576, generator=gen) * 0.02
    macs = sum(w.numel() for w in weights)  # multiply-adds per row
    mb = macs * 4 / 1e6
    print(f"# memory read {bw:.1f} GB/s: {mb:.0f} MB of weights = {mb / bw:.1f} ms per step at any row count")
    print(f"# the machine's float32 arithmetic, MKL's GEMM of 1024 x 1024 in cache: {gemm_rate(rounds):.0f} G multiply-adds/s")
    print("| rows | kernel in cache, G multiply-adds/s | memory bound, ms | arithmetic bound, ms | bound, ms "
          "| measured, ms | measured / bound |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    with torch.no_grad():
        for r in rows:
            x = torch.randn(r, 576, generator=gen)
            reps = max(20, calls // r)
            med = _rotating_medians({"hot": lambda: [cpu_gemm.small_linear(x, hot) for _ in range(reps)]}, rounds)
            rate = r * hot.numel() * reps / (med["hot"] / 1e3) / 1e9  # G multiply-adds / s
            xs = {k: torch.randn(r, k, generator=gen) for k in {w.shape[1] for w in weights}}
            step = _rotating_medians({"all": lambda: [cpu_gemm.small_linear(xs[w.shape[1]], w) for w in weights]},
                                     rounds)["all"]
            mem, arith = mb / bw, r * macs / rate / 1e6
            bound = max(mem, arith)
            print(f"| {r} | {rate:.0f} | {mem:.1f} | {arith:.1f} | {bound:.1f} | {step:.1f} | {step / bound:.2f} |",
                  flush=True)
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="1,2,4,8,16,32,64", help="comma-separated row counts")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prefetch-ab", action="store_true",
                    help="instead: the kernel against a build of it without the weight prefetch, same weights")
    ap.add_argument("--roofline", action="store_true",
                    help="instead: the kernel's in-cache arithmetic rate per row count and the bound it and "
                         "the memory set on a step's products (and MKL's in-cache GEMM rate, for scale)")
    ap.add_argument("--against", metavar="REV",
                    help="instead: this kernel against the cpu_gemm.cpp of a git revision, same weights")
    ap.add_argument("--variants", metavar="NAME:DEFINE[;DEFINE],...",
                    help="instead: the kernel against builds of the same source with CPU_GEMM_* switches set "
                         "(e.g. pf8k:CPU_GEMM_PREFETCH_BYTES=8192), same weights")
    ap.add_argument("--plans", metavar="NAME:KEY=VALUE[;KEY=VALUE],...",
                    help="instead: the kernel at this machine's chosen settings against other settings of the same "
                         "build (keys: width, prefetch, prefetch_many (bytes), turns (0/1)), same weights")
    args = ap.parse_args(argv)
    try:
        rows = positive_ints(args.rows, "--rows")
        specs = parse_variants(args.variants) if args.variants is not None else None
        plan_specs = parse_plans(args.plans) if args.plans is not None else None
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not cpu_gemm.available():
        print(f"error: the small-row kernel is not available here: {cpu_gemm.unavailable_reason()}", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    weights = [torch.randn(n, k, generator=gen) * 0.02 for n, k in SHAPES]
    mb = sum(w.numel() for w in weights) * 4 / 1e6
    if args.prefetch_ab:
        return prefetch_ab(weights, rows, args.rounds, gen)
    if args.against:
        return against(weights, rows, args.rounds, gen, args.against)
    if specs is not None:
        return variants(weights, rows, args.rounds, gen, specs)
    if plan_specs is not None:
        return plans(weights, rows, args.rounds, gen, plan_specs)
    bw = read_bandwidth_gbs()
    if args.roofline:
        return roofline(weights, rows, args.rounds, gen, bw)
    mkl = torch.backends.mkl.is_available() and hasattr(torch.ops.mkl, "_mkl_linear")
    print(f"# {len(weights)} products, {mb:.0f} MB float32, {args.threads} threads; memory read {bw:.1f} GB/s "
          f"(floor {mb / bw:.1f} ms per step)")
    print("| rows | F.linear ms | packed ms | small_linear ms | small_linear GB/s | small_linear / F.linear |")
    print("|---:|---:|---:|---:|---:|---:|")
    with torch.no_grad():
        for r in rows:
            xs = {k: torch.randn(r, k, generator=gen) for k in {w.shape[1] for w in weights}}
            ways = {"plain": lambda: [F.linear(xs[w.shape[1]], w) for w in weights],
                    "stream": lambda: [cpu_gemm.small_linear(xs[w.shape[1]], w) for w in weights]}
            if mkl:
                packed = [torch.ops.mkl._mkl_reorder_linear_weight(w, r) for w in weights]
                ways["packed"] = lambda: [torch.ops.mkl._mkl_linear(xs[w.shape[1]], p, w, None, r)
                                          for w, p in zip(weights, packed)]
            med = _rotating_medians(ways, args.rounds)
            packed_ms = f"{med['packed']:.1f}" if "packed" in med else "-"
            print(f"| {r} | {med['plain']:.1f} | {packed_ms} | {med['stream']:.1f} | {mb / med['stream']:.1f} | "
                  f"{med['stream'] / med['plain']:.2f} |", flush=True)
            ways.clear()
    return 0


if __name__ == "__main__":
    sys.exit(main())
