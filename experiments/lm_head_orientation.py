"""Time the LM-head product ``(T, H) x (V, H)^T`` in its two orientations on this CPU, per row count.

``plain`` is ``F.linear(hidden, weight)``; ``transposed`` is ``(weight @ hidden.T).T`` made
row-major again (what ``eagle.target.project`` may pick for float32 on the CPU). The two are timed
interleaved (A, B, A, B, ...) so background load hits both alike; medians in ms, and the ratio
plain / transposed (> 1: transposed is faster).

    python experiments/lm_head_orientation.py --vocab 49152 8192 --rows 1 2 4 8 10 16 32 61
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch


def _plain(x, w):
    return torch.nn.functional.linear(x, w)  # (T, V)


def _transposed(x, w):
    return (w @ x.T).T.contiguous()  # (T, V)


def ab(x: torch.Tensor, w: torch.Tensor, repeats: int) -> tuple[float, float]:
    """Median ms of the plain and the transposed product, timed interleaved."""
    a, b = [], []
    _plain(x, w), _transposed(x, w)  # warm-up
    for _ in range(repeats):
        for fn, out in ((_plain, a), (_transposed, b)):
            t0 = time.perf_counter()
            fn(x, w)
            out.append(1000 * (time.perf_counter() - t0))
    return statistics.median(a), statistics.median(b)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hidden", type=int, default=576, help="hidden size (SmolLM2-135M: 576)")
    ap.add_argument("--vocab", type=int, nargs="+", default=[49152, 8192], help="LM-head rows")
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 2, 3, 4, 6, 8, 10, 16, 32, 61])
    ap.add_argument("--repeats", type=int, default=40)
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    print(f"{torch.get_num_threads()} threads, float32, hidden {args.hidden}, median of {args.repeats}, interleaved")
    print("| vocab | rows | plain ms | transposed ms | plain / transposed |")
    print("|---:|---:|---:|---:|---:|")
    for v in args.vocab:
        w = torch.randn(v, args.hidden)  # (V, H)
        for t in args.rows:
            x = torch.randn(t, args.hidden)  # (T, H)
            p, q = ab(x, w, args.repeats)
            print(f"| {v} | {t} | {p:.2f} | {q:.2f} | {p / q:.2f} |", flush=True)


if __name__ == "__main__":
    main()
