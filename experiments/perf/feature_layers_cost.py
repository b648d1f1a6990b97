"""What returning EAGLE-3's three extra target layers costs in the verification forward: the same
tree forward (and prefill) with and without ``layers=``, alternating A/B/A/B in one process; checks
that logits and the final feature are identical either way.

    python experiments/perf/feature_layers_cost.py --nodes 1,8,16 --rounds 20
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import Arm, interleave  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", default="1,8,16", help="tree sizes (chains of this many nodes)")
    ap.add_argument("--prefix", type=int, default=300, help="cached prompt length")
    ap.add_argument("--rounds", type=int, default=20)
    args = ap.parse_args(argv)
    import eagle
    from eagle.heads.eagle3 import default_feature_layers
    from eagle.tree import Tree

    model, _ = eagle.load_target("smollm2-135m")
    target = eagle.Target(model, "reference")
    layers = default_feature_layers(target.config.num_hidden_layers)
    gen = torch.Generator().manual_seed(0)
    prefix = torch.randint(0, target.config.vocab_size, (args.prefix,), generator=gen)
    print(f"| tree nodes | without layers ms | with layers {list(layers)} ms | with / without |\n|---:|---:|---:|---:|")
    for n in (int(x) for x in args.nodes.split(",")):
        tree = Tree.chain(torch.randint(0, target.config.vocab_size, (n,), generator=gen).tolist())
        cache = target.new_cache(args.prefix + 64)
        target.prefill(prefix, cache)

        def arm(want: bool) -> Arm:
            def run():
                out = target.tree_forward(tree, cache, layers if want else None)
                out.logits  # the LM head included
                return out
            return Arm(run, after=lambda _: target.crop(cache, args.prefix))

        t = interleave({False: arm(False), True: arm(True)}, args.rounds, warmup=2)
        outs = t.results
        if not (torch.equal(outs[False].logits, outs[True].logits) and torch.equal(outs[False].hidden, outs[True].hidden)):
            raise SystemExit("asking for the layers changed the logits or the final feature")
        a, b = t.median(False, 1e3), t.median(True, 1e3)
        print(f"| {n} | {a:.1f} | {b:.1f} | {b / a:.3f} |", flush=True)
    print("identical logits and final features with and without the layers")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
