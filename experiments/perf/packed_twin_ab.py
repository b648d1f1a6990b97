"""The verification forward with and without MKL's packed GEMM, interleaved in one process.

* ``unpacked``: ``runtime.packed_linear: false`` (MKL's plain GEMM).
* ``twin``: ``runtime.packed_linear: true`` (eagle/packed.py): the model's twin whose linear layers
  are ``PackedLinear``s; nothing else in the forward changes.

Chains of ``--sizes`` nodes after a ``--prefix``-token prompt, median ms of ``--rounds`` alternating
rounds, the median of the paired ratios, and the largest logit difference between the two.

    python experiments/perf/packed_twin_ab.py --sizes 1,4,8,16 --rounds 12
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
    ap.add_argument("--sizes", default="1,4,8,16")
    ap.add_argument("--prefix", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=12)
    args = ap.parse_args(argv)
    import eagle
    from eagle_kernels.onednn import packed_gemm_available
    from eagle.runtime import RuntimeConfig
    from eagle.tree import Tree

    if not packed_gemm_available():
        raise SystemExit("this torch build has no MKL packed GEMM")
    model, _ = eagle.load_target("smollm2-135m")
    paths = {"unpacked": eagle.Target(model, "reference", RuntimeConfig(packed_linear=False)),
             "twin": eagle.Target(model, "reference", RuntimeConfig(packed_linear=True))}
    gen = torch.Generator().manual_seed(0)
    vocab = paths["twin"].config.vocab_size
    prefix = torch.randint(0, vocab, (args.prefix,), generator=gen)
    print(f"{torch.get_num_threads()} threads, prefix {args.prefix}, median of {args.rounds} alternating rounds")
    print("| nodes | unpacked ms | twin ms | twin / unpacked (median of pairs) |\n|---:|---:|---:|---:|")
    for n in (int(s) for s in args.sizes.split(",")):
        tree = Tree.chain(torch.randint(0, vocab, (n,), generator=gen).tolist())
        caches = {}
        for name, t in paths.items():
            caches[name] = t.new_cache(args.prefix + 64)
            t.prefill(prefix, caches[name])

        def arm(name: str) -> Arm:
            t, cache = paths[name], caches[name]

            def run():
                return t.tree_forward(tree, cache).logits  # the LM head included
            return Arm(run, after=lambda _: t.crop(cache, args.prefix))

        res = interleave({name: arm(name) for name in paths}, args.rounds)  # round 0 warms up (and packs)
        diff = float((res.results["twin"] - res.results["unpacked"]).abs().max())
        print(f"| {n} | {res.median('unpacked', 1e3):.1f} | {res.median('twin', 1e3):.1f} | "
              f"{res.median_ratio('twin', 'unpacked'):.3f} |  (max |logit diff| {diff:.1e})", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
