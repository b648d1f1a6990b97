"""The verification forward with MKL's packed GEMM two ways, and without it, interleaved in one process.

* ``unpacked``: ``runtime.packed_linear: false`` (MKL's plain GEMM).
* ``mode``: the packed GEMM through a ``TorchFunctionMode`` around the forward that answers every
  ``F.linear`` of a packed row count (and, being a mode, sees every other torch call of the
  forward too): the alternative to the twin.
* ``twin``: what ships (eagle/backends/cpu/packed.py): the model's twin whose linear layers are
  ``PackedLinear``s; nothing else in the forward changes.

Chains of ``--sizes`` nodes after a ``--prefix``-token prompt, median ms of ``--rounds`` rounds in
rotating order, and the largest logit difference of the packed paths from the unpacked one.

    python experiments/perf/packed_twin_ab.py --sizes 1,4,8,16 --rounds 12
"""
from __future__ import annotations

import argparse
import sys
from contextlib import nullcontext
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import Arm, interleave  # noqa: E402


class ModePacked(TorchFunctionMode):
    """``F.linear`` of a packed row count -> MKL's packed GEMM, via a torch function mode."""

    def __init__(self, row_counts):
        super().__init__()
        self.row_counts, self.packed = frozenset(row_counts), {}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.linear:
            x, w = args[0], args[1]
            bias = args[2] if len(args) > 2 else kwargs.get("bias")
            rows = x.numel() // x.shape[-1]
            if rows in self.row_counts and w.dtype == torch.float32 and not w.requires_grad:
                key = (w.data_ptr(), rows)
                if key not in self.packed:
                    self.packed[key] = torch.ops.mkl._mkl_reorder_linear_weight(w, rows)
                out = torch.ops.mkl._mkl_linear(x.reshape(rows, -1), self.packed[key], w, bias, rows)
                return out.view(*x.shape[:-1], w.shape[0])
        return func(*args, **kwargs)


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
             "mode": eagle.Target(model, "reference", RuntimeConfig(packed_linear=False)),
             "twin": eagle.Target(model, "reference", RuntimeConfig(packed_linear=True))}
    mode = ModePacked([b for b in paths["twin"].runtime.buckets if b >= 4])
    gen = torch.Generator().manual_seed(0)
    vocab = paths["twin"].config.vocab_size
    prefix = torch.randint(0, vocab, (args.prefix,), generator=gen)
    print(f"{torch.get_num_threads()} threads, prefix {args.prefix}, median of {args.rounds} rotating rounds")
    print("| nodes | unpacked ms | mode ms | twin ms | twin / mode | twin / unpacked |\n|---:|---:|---:|---:|---:|---:|")
    for n in (int(s) for s in args.sizes.split(",")):
        bucket = next(b for b in paths["twin"].runtime.buckets if b >= n)
        tree = Tree.chain(torch.randint(0, vocab, (n,), generator=gen).tolist())
        caches = {}
        for name, t in paths.items():
            caches[name] = t.new_cache(args.prefix + 64)
            t.prefill(prefix, caches[name])

        def arm(name: str) -> Arm:
            t, cache = paths[name], caches[name]

            def run():
                with mode if name == "mode" and bucket in mode.row_counts else nullcontext():
                    return t.tree_forward(tree, cache).logits  # the LM head included
            return Arm(run, after=lambda _: t.crop(cache, args.prefix))

        res = interleave({name: arm(name) for name in paths}, args.rounds, order="rotate")  # round 0 warms up (and packs)
        med = {k: res.median(k, 1e3) for k in paths}
        diff = max(float((res.results[k] - res.results["unpacked"]).abs().max()) for k in ("mode", "twin"))
        print(f"| {n} | {med['unpacked']:.1f} | {med['mode']:.1f} | {med['twin']:.1f} | {med['twin'] / med['mode']:.3f} | "
              f"{med['twin'] / med['unpacked']:.3f} |  (max |logit diff| {diff:.1e})", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
