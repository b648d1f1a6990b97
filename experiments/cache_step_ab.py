"""One-token target forward on the slot cache against the DynamicCache, interleaved step by step
(A, B, A, B, ...) after the same prefix, so a slow spell of the machine hits both alike.

    python experiments/cache_step_ab.py --rounds 12
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prefix", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=12)
    args = ap.parse_args(argv)
    import eagle
    from eagle.tree import Tree

    model, _ = eagle.load_target("smollm2-135m")
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (args.prefix,), generator=gen)
    targets = {k: eagle.Target(model, "reference", eagle.RuntimeConfig(cache=k)) for k in ("static", "dynamic")}
    caches = {k: t.new_cache(args.prefix + 64) for k, t in targets.items()}
    for k, t in targets.items():
        t.prefill(ids, caches[k])
    times: dict[str, list[float]] = {k: [] for k in targets}
    for r in range(args.rounds):
        for k, t in targets.items():
            tree = Tree.chain([int(torch.randint(0, model.config.vocab_size, (), generator=gen))])
            t0 = time.perf_counter()
            t.tree_forward(tree, caches[k]).logits  # the LM head included
            dt = time.perf_counter() - t0
            eagle.Target.crop(caches[k], args.prefix)
            if r > 1:  # two warm-up rounds
                times[k].append(1000 * dt)
    for k, v in times.items():
        print(f"{k}: median {statistics.median(v):.1f} ms over {len(v)} steps")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
