"""Cost of one target verification forward vs tree size, after a fixed prefix, per runtime path.

On a CPU the tree is not free: this curve is what the tree budget of eagle2-cpu is chosen from.
For each runtime path (``--paths``: ``dynamic`` = transformers' DynamicCache, ``static`` = the
preallocated slot cache with trees padded to buckets, ``static-bf16``, ``static-compiled``, ...)
and each tree size T it times a greedy verification forward (``Target.tree_forward``, then the
argmax of every node's logits: ``TreeOutput.greedy``, through the bfloat16 screen of a float32
head where ``runtime.greedy_head`` is ``screened``; ``-fullhead`` paths compute every logit) over a random tree of T nodes after a
``--prefix``-token prompt (median of ``--repeats``, sizes interleaved round by round so a slow
spell of the machine hits every size alike), relative to T = 1 on the same path. It also measures
the machine's memory read bandwidth in the same run and reports each forward as a share of the
memory-bound floor (the target's weight bytes read once per step / bandwidth). Writes a table
(markdown + CSV) and a plot.

    python experiments/cost_curve.py --out-dir experiments/results
    python experiments/cost_curve.py --paths static-compiled --sizes 1,26,32,61,64 --buckets 1,26,32,61,64
        # other buckets: e.g. each size its own (default: the runtime's, 1,4,8,16,32,64)
"""
from __future__ import annotations

import argparse
import csv
import statistics
import time
from pathlib import Path

import torch

from eagle.costs import random_tree  # noqa: F401  (the probes under experiments/ take it from here)


def read_bandwidth_gbs(mbytes: int = 512, repeats: int = 7) -> float:
    """Memory read bandwidth (GB/s): median time of summing a ``mbytes`` float32 tensor, far larger
    than the caches, on all intra-op threads."""
    x = torch.ones(mbytes * (1 << 20) // 4)
    x.sum()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        x.sum()
        times.append(time.perf_counter() - t0)
    return x.numel() * 4 / statistics.median(times) / 1e9


def weight_bytes(model) -> int:
    """Bytes of weights one decoding step reads: every parameter once (a tied embedding / LM head
    counts once: the LM head reads all of it, the embedding only a few rows)."""
    seen, total = set(), 0
    for p in model.parameters():
        if p.data_ptr() not in seen:
            seen.add(p.data_ptr())
            total += p.numel() * p.element_size()
    return total


def parse_path(name: str, buckets: list[int] | None = None):
    """``static``, ``dynamic``, ``static-unpacked`` (no packed GEMM), ``static-bf16``,
    ``static-compiled``, ``static-bf16-compiled``, ``static-compiled-fullhead`` (every logit,
    ``greedy_head: full``), ...; ``buckets``: the static cache's node-count buckets (default: the
    runtime's)."""
    from eagle.runtime import DEFAULT_BUCKETS, RuntimeConfig

    parts = name.split("-")
    if parts[0] not in ("static", "dynamic") or not set(parts[1:]) <= {"bf16", "fp16", "compiled", "unpacked", "fullhead"}:
        raise SystemExit(f"unknown path '{name}' (static|dynamic, optionally -bf16/-fp16, -compiled, -unpacked, -fullhead)")
    dtype = "bfloat16" if "bf16" in parts else "float16" if "fp16" in parts else ""
    return RuntimeConfig(cache=parts[0], dtype=dtype, compile="compiled" in parts,
                         buckets=list(buckets or DEFAULT_BUCKETS), packed_linear="unpacked" not in parts,
                         greedy_head="full" if "fullhead" in parts else "screened")


def measure(target, prefix: int, sizes: list[int], repeats: int) -> tuple[list[dict], float]:
    """Median ms per size (sizes interleaved, eagle/costs.py); returns the rows and the seconds of
    the first (warm-up, compiling) round."""
    from eagle.costs import verify_costs

    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, target.lm_head.weight.shape[0], (prefix,), generator=gen)
    cache = target.new_cache(prefix + max(sizes))
    target.prefill(ids, cache)
    costs, first = verify_costs(target, cache, sizes, repeats)
    rows = [{"tree_tokens": T, "forward_ms": 1000 * costs[T]} for T in sizes]
    for r in rows:
        r["relative_to_1"] = r["forward_ms"] / rows[0]["forward_ms"]
    return rows, first


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--prefix", type=int, default=300)
    ap.add_argument("--sizes", default="1,2,4,8,12,16,24,32,48,64")
    ap.add_argument("--paths", default="dynamic,static", help="comma-separated runtime paths (see parse_path)")
    ap.add_argument("--buckets", default=None,
                    help="comma-separated node-count buckets of the static paths (default: the runtime's); "
                         "a size between buckets runs padded to the next one")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--out-dir", default="experiments/results")
    ap.add_argument("--name", default="cost_curve", help="output file stem")
    args = ap.parse_args(argv)
    import eagle

    from eagle_kernels.cliargs import positive_ints

    try:
        sizes = positive_ints(args.sizes, "--sizes")
        buckets = positive_ints(args.buckets, "--buckets") if args.buckets is not None else None
        paths = args.paths.split(",")
        runtimes = [parse_path(p, buckets) for p in paths]
        for rt in runtimes:
            rt.validate()
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
    model, _ = eagle.load_target(args.target)
    bw = read_bandwidth_gbs()
    rows = []
    for name, rt in zip(paths, runtimes):
        target = eagle.Target(model, "reference", rt)
        floor_ms = weight_bytes(target.model) / (bw * 1e9) * 1000
        res, first_s = measure(target, args.prefix, sizes, args.repeats)
        for r in res:
            rows.append({"path": name, **r, "floor_ms": floor_ms, "share_of_floor": floor_ms / r["forward_ms"]})
        print(f"{name}: warm-up round {first_s:.1f} s", flush=True)
        del target
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / f"{args.name}.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    lines = [f"Target forward time vs tree size ({args.target}, prefix {args.prefix} tokens, "
             f"{torch.get_num_threads()} threads, median of {args.repeats}, sizes interleaved); "
             f"read bandwidth {bw:.1f} GB/s measured in the same run", "",
             "| path | tree tokens | forward ms | relative to 1 token | floor ms | share of floor |",
             "|---|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['path']} | {r['tree_tokens']} | {r['forward_ms']:.1f} | {r['relative_to_1']:.2f} | "
              f"{r['floor_ms']:.1f} | {100 * r['share_of_floor']:.0f}% |" for r in rows]
    (out / f"{args.name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.5))
    for name in paths:
        pr = [r for r in rows if r["path"] == name]
        ax.plot([r["tree_tokens"] for r in pr], [r["forward_ms"] for r in pr], marker="o", label=name)
        ax.axhline(pr[0]["floor_ms"], ls=":", color=ax.lines[-1].get_color(), lw=1)
    ax.set_xlabel("tree tokens verified in one forward")
    ax.set_ylabel("forward time (ms)")
    ax.set_title(f"{args.target}: verify cost vs tree size (dotted: floor)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / f"{args.name}.png", dpi=110)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
