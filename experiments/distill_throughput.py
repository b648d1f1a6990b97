"""Throughput of the self-distillation data stage: its own batched loop (eagle/train/data.py: slot KV
cache, top-256 sampling, finished sequences leave the batch, the EAGLE-3 layers kept) against the
transformers ``generate`` pass it replaced (output_hidden_states, full-vocabulary top-p), alternating
A/B in one process on the same batch of training prompts (sorted by length, as the data stage does).

    python experiments/distill_throughput.py --prompts 48 --max-new-tokens 128 --rounds 2

Tokens count prompt + answer (what a shard stores); "new" counts the sampled answer tokens only.
Greedy runs (``--temperature 0``) must give identical tokens in both paths (checked).
"""
from __future__ import annotations

import argparse
import time

import torch


@torch.no_grad()
def generate_pass(model, tok, prompts, max_new_tokens, temperature, top_p, eos, layers):
    """The previous data stage: one ``model.generate`` with ``output_hidden_states``; yields what
    ``_generate_batch`` yields, ``(ids, hidden, fused, prompt_len)``."""
    from eagle.prompts import encode_chat
    from eagle.train.data import _packed_model

    enc = [encode_chat(tok, p) for p in prompts]
    L = max(len(e) for e in enc)
    ids = torch.full((len(enc), L), eos, dtype=torch.long)
    att = torch.zeros((len(enc), L), dtype=torch.long)
    for i, e in enumerate(enc):
        ids[i, L - len(e):] = e
        att[i, L - len(e):] = 1
    kw = dict(do_sample=True, temperature=temperature, top_p=top_p, top_k=0) if temperature > 0 else dict(do_sample=False)
    out = _packed_model(model, [len(enc)]).generate(ids, attention_mask=att, max_new_tokens=max_new_tokens,
                                                    eos_token_id=eos, pad_token_id=eos, output_hidden_states=True,
                                                    return_dict_in_generate=True, **kw)
    hid = torch.cat([h[-1] for h in out.hidden_states], dim=1)
    fused = torch.cat([torch.cat([h[i] for i in layers], -1).half() for h in out.hidden_states], dim=1)
    for i, e in enumerate(enc):
        gen = out.sequences[i, L:].tolist()
        n_gen = gen.index(eos) + 1 if eos in gen else len(gen)
        s, t = L - len(e), L + n_gen - 1
        yield out.sequences[i, s:t], hid[i, s:t], fused[i, s:t], len(e)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=48, help="one batch of this many training prompts")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--temperature", type=float, default=0.5)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args(argv)
    import eagle
    import eagle.train.data as data
    from eagle.heads.eagle3 import default_feature_layers

    model, tok = eagle.load_target("smollm2-135m")
    layers = default_feature_layers(model.config.num_hidden_layers)
    prompts = data.read_prompt_records("experiments/data/prompts/train.jsonl")[: args.prompts]
    prompts.sort(key=len)
    eos = model.generation_config.eos_token_id
    eos = eos[0] if isinstance(eos, list) else eos
    paths = {"loop": lambda: data._generate_batch(model, tok, prompts, args.max_new_tokens, args.temperature, 0.95,
                                                  eos, eos, True, layers),
             "generate": lambda: generate_pass(model, tok, prompts, args.max_new_tokens, args.temperature, 0.95, eos,
                                               layers)}
    seqs = {}
    print("| path | round | tokens | new tokens | seconds | tokens/s | new tokens/s |\n|---|---:|---:|---:|---:|---:|---:|")
    for r in range(args.rounds):
        for name in (("loop", "generate") if r % 2 == 0 else ("generate", "loop")):
            torch.manual_seed(r)
            t0 = time.perf_counter()
            outs = list(paths[name]())
            dt = time.perf_counter() - t0
            n = sum(len(ids) for ids, _, _, _ in outs)
            new = sum(len(ids) - pl for ids, _, _, pl in outs)
            print(f"| {name} | {r + 1} | {n} | {new} | {dt:.1f} | {n / dt:.1f} | {new / dt:.1f} |", flush=True)
            seqs[name] = [ids for ids, _, _, _ in outs]
        if args.temperature == 0 and any(not torch.equal(a, b) for a, b in zip(seqs["loop"], seqs["generate"])):
            raise SystemExit("greedy: the two paths gave different tokens")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
