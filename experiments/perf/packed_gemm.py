"""Float32 CPU time of all of SmolLM2-135M's layer products (30 layers x q, k, v, o, gate, up,
down: 210 weights, 425 MB) for M rows, MKL's plain GEMM (``F.linear``) against its packed GEMM
(``torch.ops.mkl._mkl_linear`` with a weight packed for M rows, what ``eagle.backends.cpu.packed.PackedLinear``
uses), and the memory each packed copy takes. Random weights of the real shapes; the two ways
alternate, ``--repeats`` rounds after one warm-up round, medians.

    python experiments/perf/packed_gemm.py --rows 1,4,8,16,32,64
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import interleave  # noqa: E402

SHAPES = [(576, 576), (192, 576), (192, 576), (576, 576), (1536, 576), (1536, 576), (576, 1536)]


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 1e6


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="1,4,8,16,32,64")
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args(argv)
    gen = torch.Generator().manual_seed(0)
    ws = [torch.randn(o, i, generator=gen) * 0.02 for _ in range(args.layers) for o, i in SHAPES]
    print("| rows | F.linear ms | packed ms | plain / packed | packed copy MB |\n|---:|---:|---:|---:|---:|")
    for m in (int(r) for r in args.rows.split(",")):
        x = {i: torch.randn(m, i, generator=gen) for i in (576, 1536)}
        before = rss_mb()
        packed = [torch.ops.mkl._mkl_reorder_linear_weight(w, m) for w in ws]
        mb = rss_mb() - before
        t = interleave({"plain": lambda: [F.linear(x[w.shape[1]], w) for w in ws],
                        "packed": lambda: [torch.ops.mkl._mkl_linear(x[w.shape[1]], p, w, None, m)
                                           for w, p in zip(ws, packed)]}, args.repeats)
        plain, pk = t.median("plain", 1000), t.median("packed", 1000)
        print(f"| {m} | {plain:.1f} | {pk:.1f} | {plain / pk:.2f} | {mb:.0f} |", flush=True)
        packed = t = None  # the packed copies go before the next row count's
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
