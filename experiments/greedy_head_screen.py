"""The LM head's argmax through a bfloat16 screen (kernels/cpu_argmax.py) on its own: how many tokens
the error bound leaves to recompute on a real model's hidden states, and the op's time against the
float32 head's product then argmax, with the head evicted from the caches before every call (as in a
step, which streams all other weights in between).

    python experiments/greedy_head_screen.py --rows 1,8,16,32

Candidates: per position of the bench's 12 chat prompts (joined, first ``--positions`` tokens), the
tokens whose screened logit plus its bound reaches the best screened logit minus its bound (the
op's rule, computed here in float64). Times: the best of ``--repeats`` alternating calls.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent


def candidate_counts(hidden: torch.Tensor, weight: torch.Tensor) -> list[int]:
    """Per row of ``hidden (T, K)``: how many of ``weight``'s V rows the screen's bound cannot rule out."""
    K = weight.shape[1]
    u, g = 2.0 ** -8, K * 2.0 ** -24 / (1 - K * 2.0 ** -24)
    coef = u + g * (1 + u)
    w_bf, norms = weight.bfloat16().double(), weight.double().norm(dim=1)  # (V, K), (V,)
    counts = []
    for h in hidden.double():
        s, b = w_bf @ h, coef * h.norm() * norms  # (V,) screen and bound
        counts.append(int(((s + b) >= (s - b).max()).sum()))
    return counts


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="1,8,16,32", help="comma-separated row counts to time")
    ap.add_argument("--positions", type=int, default=300)
    ap.add_argument("--repeats", type=int, default=11)
    ap.add_argument("--target", default="smollm2-135m")
    args = ap.parse_args(argv)
    import eagle
    from eagle.cliargs import positive_ints

    try:
        rows = positive_ints(args.rows, "--rows")
    except ValueError as e:
        raise SystemExit(str(e))
    from eagle.lmhead import project
    from eagle_kernels import cpu_argmax

    if not cpu_argmax.available():
        raise SystemExit("the CPU extension is not available here")
    model, tok = eagle.load_target(args.target)
    weight = model.get_output_embeddings().weight.detach()  # (V, K)
    prompts = [json.loads(line) for line in open(ROOT / "experiments/prompts/chat-small.jsonl")]
    text = " ".join(str(p.get("prompt", p)) for p in prompts)
    ids = torch.tensor(tok(text)["input_ids"][: args.positions])[None]
    with torch.no_grad():
        hidden = model.get_decoder()(input_ids=ids).last_hidden_state[0]  # (N, K)
    counts = candidate_counts(hidden, weight)
    print(f"candidates over {len(counts)} positions (of {weight.shape[0]} tokens): mean {statistics.mean(counts):.1f}, "
          f"median {statistics.median(counts):.0f}, max {max(counts)}")
    if max(rows) > hidden.shape[0]:
        raise SystemExit(f"--rows up to {hidden.shape[0]} (the positions available)")
    flush = torch.ones(200_000_000)  # 800 MB read between calls: the head leaves the caches
    print("| rows | every logit then argmax, ms | screen, ms | ratio |")
    print("|---:|---:|---:|---:|")
    for r in rows:
        h = hidden[:r].contiguous()
        ways = {"full": lambda: project(h, weight).argmax(dim=-1), "screen": lambda: cpu_argmax.screened_argmax(h, weight)}
        assert torch.equal(ways["full"](), ways["screen"]())
        best = dict.fromkeys(ways, float("inf"))
        for _ in range(args.repeats):
            for name, fn in ways.items():
                flush.sum()
                t0 = time.perf_counter()
                fn()
                best[name] = min(best[name], 1000 * (time.perf_counter() - t0))
        print(f"| {r} | {best['full']:.2f} | {best['screen']:.2f} | {best['screen'] / best['full']:.2f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
