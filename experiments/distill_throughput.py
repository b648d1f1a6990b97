"""Throughput of the self-distillation data stage (``eagle train``'s batched sampling pass that keeps
the hidden states), with and without the packed GEMM for its decoding steps, alternating A/B/A/B in
one process; checks that both give the same tokens and hidden states.

    python experiments/distill_throughput.py --prompts 24 --max-new-tokens 96
"""
from __future__ import annotations

import argparse
import time
from contextlib import nullcontext

import torch


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=24, help="one batch of this many training prompts")
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args(argv)
    import eagle
    import eagle.train.data as data

    model, tok = eagle.load_target("smollm2-135m")
    prompts = data.read_prompt_records("experiments/data/prompts/train.jsonl")[: args.prompts]
    eos = model.generation_config.eos_token_id
    eos = eos[0] if isinstance(eos, list) else eos
    packed_decode = data._packed_decode
    ref = None
    print("| run | new tokens | seconds | new tokens/s |\n|---|---:|---:|---:|")
    try:
        for r in range(args.rounds):
            for mode in ("packed", "plain"):
                data._packed_decode = packed_decode if mode == "packed" else (lambda m, b: nullcontext())
                torch.manual_seed(0)
                t0 = time.perf_counter()
                outs = list(data._generate_batch(model, tok, prompts, args.max_new_tokens, 0.6, 0.95, eos, eos))
                dt = time.perf_counter() - t0
                n = sum(len(ids) - pl for ids, _, _, pl in outs)
                print(f"| {mode} {r + 1} | {n} | {dt:.1f} | {n / dt:.1f} |", flush=True)
                if ref is None:
                    ref = outs
                elif any(not torch.equal(a[0], b[0]) or not torch.equal(a[1], b[1]) for a, b in zip(ref, outs)):
                    raise SystemExit("packed and plain decoding gave different samples")
    finally:
        data._packed_decode = packed_decode
    print("identical tokens and hidden states in every run")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
