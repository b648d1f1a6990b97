"""Tree verification forward with grouped-query attention folded (``eagle_gqa_sdpa``, eagle/attention.py)
against transformers' SDPA (K/V copied to every query head), in one process on the same Target.

The Target's forward runs on its attention view (or, on the CPU backend, that view's packed twin);
this flips their attention implementation between the two, rounds alternating which goes first,
and reports per tree size the median forward time of each and the median of the paired ratios
(folded / copied). Neither side takes the CPU backend's attention op (``eagle_cpu_sdpa``, which
folds too). The folding's own threshold (``FOLD_BELOW``) is lifted for the run, so every size is
measured folded (both are put back on return).

    python experiments/perf/gqa_fold_ab.py --prefix 300 --sizes 1,16,32,64 --rounds 9
"""
from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import Arm, interleave  # noqa: E402

BACKENDS = ("sdpa", "eagle_gqa_sdpa")


def _cost_curve():
    spec = importlib.util.spec_from_file_location("cost_curve", Path(__file__).resolve().parent.parent / "cost_curve.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--prefix", type=int, default=300)
    ap.add_argument("--sizes", default="1,16,32,64")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--per-round", type=int, default=10, help="forwards per backend per round")
    args = ap.parse_args(argv)
    try:
        sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    except ValueError:
        ap.error(f"--sizes: not a list of integers: {args.sizes!r}")
    if not sizes or min(sizes) < 1 or args.rounds < 1 or args.per_round < 1 or args.prefix < 1:
        ap.error("--sizes, --rounds, --per-round and --prefix must be positive")
    import eagle
    from eagle import attention
    from eagle.target import Target

    cc = _cost_curve()
    model, _ = eagle.load_target(args.target)
    if not attention.folds_gqa(model.config.get_text_config(decoder=True)):
        print(f"{args.target}: nothing to fold (attention '{model.config._attn_implementation}', "
              "or as many KV heads as query heads)", file=sys.stderr)
        return 2
    target = eagle.Target(model, "reference", cc.parse_path("static"))
    # the models the forwards run on: the attention view, and the backend's packed twin when there is one
    configs = [m.config for m in (target.model, getattr(target.backend, "twin", None)) if m is not None]
    shipped = [cfg._attn_implementation for cfg in configs]  # eagle_gqa_sdpa, or eagle_cpu_sdpa on the CPU backend
    attention.register_gqa_sdpa()  # the CPU backend registers only its own
    fold_below, attention.FOLD_BELOW = attention.FOLD_BELOW, 1 << 30  # measure every size folded
    try:
        gen = torch.Generator().manual_seed(0)
        vocab = target.lm_head.weight.shape[0]
        cache = target.new_cache(args.prefix + max(sizes))
        target.prefill(torch.randint(0, vocab, (args.prefix,), generator=gen), cache)
        print(f"{args.target}, prefix {args.prefix}, {torch.get_num_threads()} threads, {args.rounds} rounds x "
              f"{args.per_round} forwards per backend\n")
        print("| tree tokens | K/V copied, ms | folded, ms | folded / copied (median of rounds) | range |")
        print("|---:|---:|---:|---:|---|")
        with torch.no_grad():
            for T in sizes:
                trees = [cc.random_tree(T, vocab, gen) for _ in range(args.per_round)]

                def arm(backend: str) -> Arm:
                    def use():
                        for cfg in configs:
                            cfg._attn_implementation = backend

                    def run():
                        for tree in trees:
                            target.tree_forward(tree, cache).logits  # the LM head included, as before it was lazy
                            Target.crop(cache, args.prefix)
                    return Arm(run, before=use)

                t = interleave({b: arm(b) for b in BACKENDS}, args.rounds)  # round 0 warms both up
                ms = {b: t.median(b, 1000 / len(trees)) for b in BACKENDS}
                ratios = t.ratios("eagle_gqa_sdpa", "sdpa")  # folded / copied, round by round
                print(f"| {T} | {ms['sdpa']:.1f} | {ms['eagle_gqa_sdpa']:.1f} | {t.median_ratio('eagle_gqa_sdpa', 'sdpa'):.3f} | "
                      f"{min(ratios):.3f}-{max(ratios):.3f} |", flush=True)
    finally:  # the Target as it was: its own attention, with the threshold
        attention.FOLD_BELOW = fold_below
        for cfg, impl in zip(configs, shipped):
            cfg._attn_implementation = impl
    return 0


if __name__ == "__main__":
    sys.exit(main())
