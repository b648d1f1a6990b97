"""Cost of one target verification forward vs tree size, after a fixed prefix.

On a CPU the tree is not free: this curve is what the tree budget of eagle2-cpu is chosen from.
For each tree size T it times ``Target.tree_forward`` over a random tree of T nodes after a
``--prefix``-token prompt (median of ``--repeats``), relative to T = 1 (plain decoding), and writes
a table (markdown + CSV) and a plot.

    python experiments/cost_curve.py --out-dir experiments/results
"""
from __future__ import annotations

import argparse
import csv
import statistics
import time
from pathlib import Path

import torch


def random_tree(T: int, vocab: int, gen: torch.Generator):
    from eagle.tree import Tree

    parents = [-1] + [int(torch.randint(0, i, (1,), generator=gen)) for i in range(1, T)]
    tokens = torch.randint(0, vocab, (T,), generator=gen).tolist()
    return Tree.from_lists(tokens, parents)


def measure(target, prefix: int, sizes: list[int], repeats: int) -> list[dict]:
    from eagle.target import Target

    gen = torch.Generator().manual_seed(0)
    vocab = target.lm_head.weight.shape[0]
    ids = torch.randint(0, vocab, (prefix,), generator=gen)
    cache = target.new_cache()
    target.prefill(ids, cache)
    rows = []
    for T in sizes:
        times = []
        for r in range(repeats + 1):
            tree = random_tree(T, vocab, gen)
            t0 = time.perf_counter()
            target.tree_forward(tree, cache)
            dt = time.perf_counter() - t0
            Target.crop(cache, prefix)
            if r:  # the first call of each size is a warm-up
                times.append(dt)
        rows.append({"tree_tokens": T, "forward_ms": 1000 * statistics.median(times)})
    base = rows[0]["forward_ms"]
    for r in rows:
        r["relative_to_1"] = r["forward_ms"] / base
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--prefix", type=int, default=300)
    ap.add_argument("--sizes", default="1,2,4,8,12,16,24,32,48,64")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--out-dir", default="experiments/results")
    args = ap.parse_args(argv)
    import eagle

    model, _ = eagle.load_target(args.target)
    target = eagle.Target(model, "reference")
    sizes = [int(s) for s in args.sizes.split(",")]
    rows = measure(target, args.prefix, sizes, args.repeats)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "cost_curve.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    lines = [f"Target forward time vs tree size ({args.target}, prefix {args.prefix} tokens, "
             f"{torch.get_num_threads()} threads, median of {args.repeats})", "",
             "| tree tokens | forward ms | relative to 1 token |", "|---:|---:|---:|"]
    lines += [f"| {r['tree_tokens']} | {r['forward_ms']:.1f} | {r['relative_to_1']:.2f} |" for r in rows]
    (out / "cost_curve.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.2))
    ax.plot([r["tree_tokens"] for r in rows], [r["forward_ms"] for r in rows], marker="o")
    ax.set_xlabel("tree tokens verified in one forward")
    ax.set_ylabel("forward time (ms)")
    ax.set_title(f"{args.target}: verify cost vs tree size")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "cost_curve.png", dpi=110)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
