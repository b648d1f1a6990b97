"""How much of the target's greedy choice a reduced draft vocabulary can reach: for each draft
vocabulary size N (the N most frequent token ids of the self-distilled training data, the rule
``eagle train`` uses for an EAGLE-3 or Medusa head, ``draft_vocab_size``), the fraction of answer
positions of the fixed held-out set whose target argmax lies inside those N ids.

A draft token outside the draft vocabulary can never be proposed, so this fraction bounds the
acceptance of every draft step of a greedy tree (depth 1 included) from above. The target argmax
is recomputed from the stored final-norm feature of each held-out position (``hidden``, fp16) and
the target's own LM head.

    python experiments/draft_vocab_coverage.py --head heads/smollm2-135m-eagle3 \\
        --json experiments/results/draft_vocab_coverage.json

``--data``: the training shards (default ~/.cache/eagle/data/smollm2-selfdistill); ``--heldout``:
the fixed held-out set of experiments/learning_curve.py (default
~/.cache/eagle/learning_curve/heldout-data). Counts run over every sequence of the data (the
trainer counts its 97% training split, so the chosen ids can differ in a few rare tokens;
``--head`` prints how many of a shipped head's ids the rule here picks as well).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch


def coverage(counts: torch.Tensor, targets: torch.Tensor, sizes: list[int]) -> dict[int, float]:
    """``counts (V,)``: token frequencies; ``targets (P,)``: the target's argmax at P positions.
    Returns ``{N: fraction of targets among the N most frequent ids}`` (ties broken as ``topk``)."""
    order = counts.topk(counts.numel()).indices  # (V,) ids, most frequent first
    rank = torch.empty_like(order)
    rank[order] = torch.arange(order.numel())  # (V,) the rank of each id
    r = rank[targets]  # (P,)
    return {n: int((r < n).sum()) / targets.numel() if targets.numel() else 0.0 for n in sizes}


def answer_argmax(dataset, weight: torch.Tensor, chunk: int = 4096) -> torch.Tensor:
    """The target's argmax at every answer position (prompt_len - 1 .. n - 2, the positions the
    trainer scores) of ``dataset``'s sequences, from their stored final feature; ``weight (V, H)``."""
    out = []
    for s in dataset:
        h = s.hidden[max(s.prompt_len - 1, 0): s.input_ids.numel() - 1]  # (n_ans, H) fp16
        for a in range(0, h.shape[0], chunk):
            out.append((h[a:a + chunk].to(weight.dtype) @ weight.T).argmax(-1))  # (c,)
    return torch.cat(out) if out else torch.zeros(0, dtype=torch.long)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--data", default="~/.cache/eagle/data/smollm2-selfdistill")
    ap.add_argument("--heldout", default="~/.cache/eagle/learning_curve/heldout-data")
    ap.add_argument("--sizes", default="1024,2048,4096,8192,16384,32768")
    ap.add_argument("--head", default=None, help="a head folder with d2t/t2d (EAGLE-3): compare its draft ids")
    ap.add_argument("--json", default=None, help="write the figures here")
    args = ap.parse_args(argv)
    try:
        sizes = sorted({int(x) for x in args.sizes.split(",") if x.strip()})
    except ValueError:
        ap.error(f"--sizes: not a list of integers: {args.sizes!r}")
    if not sizes or sizes[0] < 1:
        ap.error("--sizes must be positive integers")

    import eagle
    from eagle.io import write_json
    from eagle.train.data import ShardDataset, token_counts

    try:
        train = ShardDataset(Path(args.data).expanduser(), load_hidden=False)
        held = ShardDataset(Path(args.heldout).expanduser(), load_hidden=True)
    except (FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    model, _ = eagle.load_target(args.target)
    weight = model.get_output_embeddings().weight.detach().float()  # (V, H)
    vocab = weight.shape[0]
    counts = token_counts(train, vocab)  # (V,)
    with torch.no_grad():
        targets = answer_argmax(held, weight)
    cov = coverage(counts, targets, [n for n in sizes if n <= vocab])
    result = {"target": args.target, "vocab": vocab, "train_tokens": int(counts.sum()),
              "heldout_positions": int(targets.numel()), "coverage": {str(n): c for n, c in cov.items()}}
    print(f"{result['train_tokens']:,} training tokens counted; {result['heldout_positions']:,} held-out answer "
          f"positions; target vocabulary {vocab:,}\n")
    print("| draft vocabulary | target argmax inside it |\n|---:|---:|")
    for n, c in cov.items():
        print(f"| {n:,} | {c:.4f} |")
    if args.head:
        from safetensors import safe_open

        with safe_open(str(Path(args.head) / "model.safetensors"), framework="pt") as f:
            t2d = f.get_tensor("t2d").bool()  # (V,) which target ids the head can draft
        n = int(t2d.sum())
        mine = torch.zeros(vocab, dtype=torch.bool)
        mine[counts.topk(n).indices] = True
        result["head"] = {"path": args.head, "draft_vocab": n, "same_ids": int((mine & t2d).sum()),
                          "coverage": float(t2d[targets].float().mean())}
        print(f"\n{args.head}: {n:,} draft ids, {result['head']['same_ids']:,} of them picked here too; its own "
              f"coverage {result['head']['coverage']:.4f}")
    if args.json:
        write_json(result, args.json, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
