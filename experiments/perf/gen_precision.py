"""Lower-precision sampling for the self-distillation data stage: how much faster, and how much it
changes what is sampled.

Two measurements on one batch of training prompts, in one process:

1. Throughput of the data stage's own loop (``eagle.train.data._generate_batch``: slot cache, top-256
   sampling, EAGLE-3 layers kept) on the float32 target against a bfloat16 (or float16) copy,
   alternating A/B for ``--rounds`` rounds.
2. The sampling distributions the two precisions give at the same positions: the float32 run's
   sequences are run teacher-forced through both models, and at every answer position the
   distribution ``sample_next`` draws from (temperature, top-256, top-p) is compared: total variation
   distance (the probability that a coupled draw differs), top-1 agreement, and the KL divergence.

    python experiments/perf/gen_precision.py --prompts 48 --max-new-tokens 128 --rounds 2

Prints a markdown table; ``--json`` writes the figures.
"""
from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import Arm, interleave  # noqa: E402


def sampling_probs(logits: torch.Tensor, temperature: float, top_p: float, k: int) -> torch.Tensor:
    """``logits (N, V)`` -> ``(N, V)`` the distribution ``eagle.train.data.sample_next`` draws from."""
    top = logits.float().topk(k, dim=-1)  # (N, k) sorted
    probs = torch.softmax(top.values / temperature, dim=-1)
    if top_p < 1.0:
        probs = probs.masked_fill((probs.cumsum(-1) - probs) >= top_p, 0.0)
    probs = probs / probs.sum(-1, keepdim=True)
    return torch.zeros_like(logits, dtype=torch.float32).scatter_(-1, top.indices, probs)


@torch.no_grad()
def answer_logits(model, seqs: list[torch.Tensor], prompt_lens: list[int]) -> torch.Tensor:
    """Teacher-forced logits at every answer position (predicting the answer's tokens), concatenated."""
    out = []
    for s, pl in zip(seqs, prompt_lens):
        logits = model(s[None]).logits[0]  # (n, V)
        out.append(logits[pl - 1: len(s) - 1].float())
    return torch.cat(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--prompts", type=int, default=48, help="one batch of this many training prompts")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--temperature", type=float, default=0.5)
    ap.add_argument("--top-p", type=float, default=0.95)
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--compare-sequences", type=int, default=16, help="sequences compared teacher-forced")
    ap.add_argument("--json", default="")
    args = ap.parse_args(argv)

    from eagle.models import load_target
    from eagle.train.data import SAMPLE_TOP_K, _generate_batch, eos_and_pad, read_prompt_records

    model, tok = load_target(args.target)
    low = copy.deepcopy(model).to(getattr(torch, args.dtype))
    prompts = read_prompt_records("experiments/data/prompts/train.jsonl")[: args.prompts]
    prompts.sort(key=len)
    eos, pad = eos_and_pad(model, tok)
    L = model.config.num_hidden_layers
    layers = (2, L // 2, L - 3)

    seed = [0]  # each round's sampling seed, the same for both precisions
    ref: list = []  # the float32 answers of the first round: the ones compared below
    tokens: dict[str, int] = {}

    def arm(name, m) -> Arm:
        def run():
            return list(_generate_batch(m, tok, prompts, args.max_new_tokens, args.temperature, args.top_p, eos, pad,
                                        True, layers))

        def keep(outs):
            tokens[name] = sum(len(o[0]) for o in outs)
            if name == "float32" and not ref:
                ref.extend(outs)
        return Arm(run, before=lambda: torch.manual_seed(seed[0]), after=keep)

    rates = {"float32": [], args.dtype: []}

    def report(r, name, seconds):
        rates[name].append(tokens[name] / seconds)
        print(f"round {r} {name}: {rates[name][-1]:.1f} tok/s", flush=True)

    interleave({"float32": arm("float32", model), args.dtype: arm(args.dtype, low)}, args.rounds, warmup=0,
               each_round=lambda r: seed.__setitem__(0, r), progress=report)

    seqs = [o[0] for o in ref[: args.compare_sequences]]
    plens = [o[3] for o in ref[: args.compare_sequences]]
    p32 = sampling_probs(answer_logits(model, seqs, plens), args.temperature, args.top_p, SAMPLE_TOP_K)
    plo = sampling_probs(answer_logits(low, seqs, plens), args.temperature, args.top_p, SAMPLE_TOP_K)
    tv = 0.5 * (p32 - plo).abs().sum(-1)  # (N,)
    top1 = (p32.argmax(-1) == plo.argmax(-1)).float().mean()
    kl = (p32 * (p32.clamp_min(1e-12).log() - plo.clamp_min(1e-12).log())).sum(-1)  # KL(p32 || plo), (N,)
    q = torch.quantile(tv, torch.tensor([0.5, 0.9, 0.99]))
    res = {
        "prompts": len(prompts), "max_new_tokens": args.max_new_tokens, "temperature": args.temperature,
        "dtype": args.dtype, "tok_s": {k: [round(v, 1) for v in vs] for k, vs in rates.items()},
        "speedup": statistics.median(rates[args.dtype]) / statistics.median(rates["float32"]),
        "positions_compared": int(tv.numel()), "tv_mean": float(tv.mean()), "tv_p50": float(q[0]),
        "tv_p90": float(q[1]), "tv_p99": float(q[2]), "top1_agreement": float(top1), "kl_mean": float(kl.mean()),
    }
    print(f"\n| | float32 | {args.dtype} |\n|---|---:|---:|")
    print(f"| data loop, tok/s (rounds) | {' / '.join(map(str, res['tok_s']['float32']))} | "
          f"{' / '.join(map(str, res['tok_s'][args.dtype]))} |")
    print(f"\nspeedup {res['speedup']:.2f}x; over {res['positions_compared']} answer positions of "
          f"{len(seqs)} float32 answers: total variation mean {res['tv_mean']:.4f} (median {res['tv_p50']:.4f}, "
          f"p90 {res['tv_p90']:.4f}, p99 {res['tv_p99']:.4f}), top-1 agreement {res['top1_agreement']:.4f}, "
          f"KL(float32 || {args.dtype}) mean {res['kl_mean']:.5f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
