"""Time the LM-head product ``(T, H) x (V, H)^T`` in its two orientations on this CPU, per row count.

``plain`` is ``F.linear(hidden, weight)``; ``transposed`` is ``(weight @ hidden.T).T`` made
row-major again (what ``eagle.backends.cpu.lmhead.project`` may pick for float32 on the CPU). The two are timed
interleaved (the order reversed every round) so background load hits both alike; medians in ms, and the ratio
plain / transposed (> 1: transposed is faster). With ``--packed`` also MKL's packed GEMM with a
weight packed for that row count (what a packed twin's LM head does for a tree bucket,
eagle/backends/cpu/packed.py), timed in the same rounds.

    python experiments/perf/lm_head_orientation.py --vocab 49152 8192 --rows 1 2 4 8 10 16 32 61
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import interleave  # noqa: E402


def _plain(x, w):
    return torch.nn.functional.linear(x, w)  # (T, V)


def _transposed(x, w):
    return (w @ x.T).T.contiguous()  # (T, V)


def ab(x: torch.Tensor, w: torch.Tensor, repeats: int, packed: bool = False) -> list[float]:
    """Median ms of the plain, the transposed (and the packed) product, timed interleaved."""
    fns = {"plain": _plain, "transposed": _transposed}
    if packed:
        p = torch.ops.mkl._mkl_reorder_linear_weight(w, x.shape[0])
        fns["packed"] = lambda x, w: torch.ops.mkl._mkl_linear(x, p, w, None, x.shape[0])
    t = interleave({k: (lambda fn=fn: fn(x, w)) for k, fn in fns.items()}, repeats)  # round 0 warms up
    return [t.median(k, 1000) for k in fns]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hidden", type=int, default=576, help="hidden size (SmolLM2-135M: 576)")
    ap.add_argument("--vocab", type=int, nargs="+", default=[49152, 8192], help="LM-head rows")
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 2, 3, 4, 6, 8, 10, 16, 32, 61])
    ap.add_argument("--repeats", type=int, default=40)
    ap.add_argument("--packed", action="store_true", help="also time MKL's packed GEMM (x86 builds with MKL)")
    args = ap.parse_args(argv)
    from eagle_kernels.onednn import packed_gemm_available

    if args.packed and not packed_gemm_available():
        raise SystemExit("--packed: this torch build has no MKL packed GEMM")
    torch.manual_seed(0)
    print(f"{torch.get_num_threads()} threads, float32, hidden {args.hidden}, median of {args.repeats}, interleaved")
    extra = " packed ms |" if args.packed else ""
    print(f"| vocab | rows | plain ms | transposed ms | plain / transposed |{extra}")
    print("|---:|---:|---:|---:|---:|" + ("---:|" if args.packed else ""))
    for v in args.vocab:
        w = torch.randn(v, args.hidden)  # (V, H)
        for t in args.rows:
            x = torch.randn(t, args.hidden)  # (T, H)
            ms = ab(x, w, args.repeats, args.packed)
            cells = f" {ms[2]:.2f} |" if args.packed else ""
            print(f"| {v} | {t} | {ms[0]:.2f} | {ms[1]:.2f} | {ms[0] / ms[1]:.2f} |{cells}", flush=True)


if __name__ == "__main__":
    main()
