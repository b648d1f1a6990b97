"""Padding of the training batches of one epoch, random against grouped by length.

A padded batch costs (longest sequence) x (batch size) positions in the head's layer and attention,
so the padding fraction is the compute a batch order wastes. Reads the sequence lengths of a
self-distilled data folder (no features loaded) and builds the epoch's batches as ``eagle train``
does (``eagle.train.common.batch_order``, with and without ``lengths``).

    python experiments/perf/batch_padding.py --data ~/.cache/eagle/data/smollm2-selfdistill
"""
from __future__ import annotations

import argparse
import glob
import os


def shard_lengths(folder: str, max_len: int) -> list[int]:
    from safetensors import safe_open

    out = []
    for path in sorted(glob.glob(os.path.join(os.path.expanduser(folder), "shard-*.safetensors"))):
        with safe_open(path, "pt") as f:
            off = f.get_tensor("offsets")  # (n + 1,) sequence boundaries
        out += [min(int(n), max_len) for n in off[1:] - off[:-1]]
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default="~/.cache/eagle/data/smollm2-selfdistill")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--max-seq-len", type=int, default=320)
    ap.add_argument("--epochs", type=int, default=2)
    args = ap.parse_args(argv)
    from eagle.train.common import batch_order

    lengths = shard_lengths(args.data, args.max_seq_len)
    if len(lengths) < args.batch_size:
        raise SystemExit(f"{args.data}: {len(lengths)} sequences, fewer than one batch")
    print(f"{len(lengths)} sequences, {sum(lengths)} tokens, batch {args.batch_size}")
    print("| order | epoch | positions computed | padding |")
    print("|---|---:|---:|---:|")
    for name, lens in (("random", None), ("grouped by length", lengths)):
        for epoch in range(args.epochs):
            batches = batch_order(len(lengths), args.batch_size, 0, epoch, lens)
            computed = sum(args.batch_size * max(lengths[i] for i in b) for b in batches)
            real = sum(lengths[i] for b in batches for i in b)
            print(f"| {name} | {epoch} | {computed} | {1 - real / computed:.1%} |")


if __name__ == "__main__":
    main()
