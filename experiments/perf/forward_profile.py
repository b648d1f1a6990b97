"""Where the verification forward's time goes, per operator, at two tree sizes: what grows from one
token to a 16-token tree (issue #10's goal: <= 1.25x).

``torch.profiler`` over ``--repeats`` ``Target.tree_forward`` calls per size (the same runtime path
as experiments/cost_curve.py's ``static``; random trees after a ``--prefix``-token prompt; each
size's forwards run back to back under one profiler, not interleaved as in cost_curve.py), self CPU
time per operator divided by the repeats. The profiler adds a small cost per
operator call, so the times sit above cost_curve.py's; compare the columns with each other, not
with that table. Calls that bypass the dispatcher (the small-row CPU GEMM's products, Python) show
in no operator's row: the last row, the wall time minus every operator, is their share.

    python experiments/perf/forward_profile.py --sizes 1,16 --repeats 10 --top 15
    python experiments/perf/forward_profile.py --kernel-split --sizes 1,16 --repeats 30

``--kernel-split`` (no profiler): per size, the forward's wall time, the time spent inside the
small-row kernel's calls during those forwards (the layer products; the LM head goes through
eagle.backends.cpu.lmhead and is timed as ``Target.logits``), and the same layer products with the same row
count run back to back outside the model (random inputs): what the products cost in place
against what they cost alone.
"""
from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch


def _cost_curve():
    spec = importlib.util.spec_from_file_location("cost_curve", Path(__file__).resolve().parent.parent / "cost_curve.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def self_ms_per_call(events, repeats: int) -> dict[str, float]:
    """``{operator name: self CPU ms per forward}`` from a profiler's ``key_averages()``."""
    out: dict[str, float] = defaultdict(float)
    for e in events:
        out[e.key] += e.self_cpu_time_total / 1000 / repeats  # us -> ms, per forward
    return dict(out)


def growth_table(per_size: dict[int, dict[str, float]], top: int) -> list[str]:
    """Markdown rows: the ``top`` operators by growth from the smallest to the largest size, then the rest."""
    sizes = sorted(per_size)
    lo, hi = per_size[sizes[0]], per_size[sizes[-1]]
    names = sorted(set(lo) | set(hi), key=lambda n: -(hi.get(n, 0.0) - lo.get(n, 0.0)))
    head = "| operator | " + " | ".join(f"{s} token{'s' if s > 1 else ''}, ms" for s in sizes) + " | growth, ms |"
    rows = [head, "|---|" + "---:|" * (len(sizes) + 1)]
    for n in names[:top]:
        rows.append(f"| `{n}` | " + " | ".join(f"{per_size[s].get(n, 0.0):.2f}" for s in sizes)
                    + f" | {hi.get(n, 0.0) - lo.get(n, 0.0):+.2f} |")
    rest = names[top:]
    rows.append("| (all others) | " + " | ".join(f"{sum(per_size[s].get(n, 0.0) for n in rest):.2f}" for s in sizes)
                + f" | {sum(hi.get(n, 0.0) - lo.get(n, 0.0) for n in rest):+.2f} |")
    rows.append("| **total** | " + " | ".join(f"{sum(per_size[s].values()):.2f}" for s in sizes)
                + f" | {sum(hi.values()) - sum(lo.values()):+.2f} |")
    return rows


def kernel_split(target, cache, prefix: int, sizes, repeats: int, random_tree) -> list[str]:
    """Markdown rows of ``--kernel-split`` (see the module docstring)."""
    from eagle.backends.cpu.packed import PackedLinear
    from eagle.target import Target
    from eagle_kernels import cpu_gemm

    ext = cpu_gemm._load()
    twin = getattr(target.backend, "twin", None)  # the CPU backend's packed twin of the model
    if ext is None or twin is None:
        raise SystemExit(f"--kernel-split needs the small-row kernel's twin: {cpu_gemm.unavailable_reason() or 'no twin'}")
    spent = {"kernel": 0.0, "logits": 0.0}

    class Timed:  # the extension, with its packed_linear calls timed
        def __getattr__(self, name):
            return getattr(ext, name)

        @staticmethod
        def packed_linear(*args):
            t0 = time.perf_counter()
            out = ext.packed_linear(*args)
            spent["kernel"] += time.perf_counter() - t0
            return out

    logits = target.logits

    def timed_logits(hidden):
        t0 = time.perf_counter()
        out = logits(hidden)
        spent["logits"] += time.perf_counter() - t0
        return out

    weights = [m.weight for m in twin.modules() if isinstance(m, PackedLinear)]
    packs = [(cpu_gemm.packed_weight(w), w.shape[0]) for w in weights]
    vocab = target.lm_head.weight.shape[0]
    gen = torch.Generator().manual_seed(1)
    rows = ["| tree tokens | forward, ms | layer products in the forward, ms | the same products alone, ms "
            "| LM head (`Target.logits`), ms | rest of the forward, ms |", "|---:|---:|---:|---:|---:|---:|"]
    cpu_gemm._EXT, target.logits = Timed(), timed_logits
    try:
        with torch.no_grad():
            for T in sizes:
                trees = [random_tree(T, vocab, gen) for _ in range(repeats)]
                for tree in trees[:2]:  # warm-up
                    target.tree_forward(tree, cache).logits
                    Target.crop(cache, prefix)
                spent.update(kernel=0.0, logits=0.0)
                t0 = time.perf_counter()
                for tree in trees:
                    target.tree_forward(tree, cache).logits
                    Target.crop(cache, prefix)
                wall = (time.perf_counter() - t0) * 1000 / repeats
                inside, head = spent["kernel"] * 1000 / repeats, spent["logits"] * 1000 / repeats
                xs = {k: torch.randn(target.runtime.bucket(T), k, generator=gen) for k in {w.shape[1] for w in weights}}
                for _ in range(2):
                    [ext.packed_linear(xs[p.shape[1]], p, n, None) for p, n in packs]
                t0 = time.perf_counter()
                for _ in range(repeats):
                    [ext.packed_linear(xs[p.shape[1]], p, n, None) for p, n in packs]
                alone = (time.perf_counter() - t0) * 1000 / repeats
                rows.append(f"| {T} | {wall:.1f} | {inside:.1f} | {alone:.1f} | {head:.1f} | {wall - inside - head:.1f} |")
    finally:
        cpu_gemm._EXT, target.logits = ext, logits
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--path", default="static", help="runtime path, as experiments/cost_curve.py --paths")
    ap.add_argument("--prefix", type=int, default=300)
    ap.add_argument("--sizes", default="1,16")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--kernel-split", action="store_true",
                    help="instead: the small-row kernel's time inside the forward against the same products alone")
    args = ap.parse_args(argv)
    try:
        sizes = sorted({int(s) for s in args.sizes.split(",") if s.strip()})
    except ValueError:
        ap.error(f"--sizes: not a list of integers: {args.sizes!r}")
    if len(sizes) < (1 if args.kernel_split else 2) or sizes[0] < 1 or args.repeats < 1:
        ap.error("--sizes needs two or more positive sizes (one with --kernel-split), --repeats >= 1")
    import eagle
    from eagle.target import Target
    from torch.profiler import ProfilerActivity, profile

    cc = _cost_curve()
    model, _ = eagle.load_target(args.target)
    target = eagle.Target(model, "reference", cc.parse_path(args.path))
    gen = torch.Generator().manual_seed(0)
    vocab = target.lm_head.weight.shape[0]
    cache = target.new_cache(args.prefix + max(sizes))
    target.prefill(torch.randint(0, vocab, (args.prefix,), generator=gen), cache)
    for T in sizes:  # warm-up: first calls of each bucket
        target.tree_forward(cc.random_tree(T, vocab, gen), cache).logits
        Target.crop(cache, args.prefix)
    if args.kernel_split:
        print(f"{args.target}, path {args.path}, prefix {args.prefix}, {torch.get_num_threads()} threads, "
              f"{args.repeats} forwards per size\n")
        print("\n".join(kernel_split(target, cache, args.prefix, sizes, args.repeats, cc.random_tree)))
        return 0
    per_size, wall = {}, {}
    with torch.no_grad():
        for T in sizes:
            trees = [cc.random_tree(T, vocab, gen) for _ in range(args.repeats)]
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                t0 = time.perf_counter()
                for tree in trees:
                    target.tree_forward(tree, cache).logits
                    Target.crop(cache, args.prefix)
                wall[T] = (time.perf_counter() - t0) * 1000 / args.repeats
            per_size[T] = self_ms_per_call(prof.key_averages(), args.repeats)
    print(f"{args.target}, path {args.path}, prefix {args.prefix}, {torch.get_num_threads()} threads, "
          f"self CPU ms per forward over {args.repeats} forwards (profiled)\n")
    print("\n".join(growth_table(per_size, args.top)))
    # what no operator owns: calls outside the dispatcher (the small-row kernel's products) and Python
    print("| wall time per forward, ms | " + " | ".join(f"{wall[T]:.2f}" for T in sizes)
          + f" | {wall[sizes[-1]] - wall[sizes[0]]:+.2f} |")
    un = {T: wall[T] - sum(per_size[T].values()) for T in sizes}
    print("| wall minus all operators, ms | " + " | ".join(f"{un[T]:.2f}" for T in sizes)
          + f" | {un[sizes[-1]] - un[sizes[0]]:+.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
