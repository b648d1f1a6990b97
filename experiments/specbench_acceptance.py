"""Why acceptance falls on Spec-Bench: per subtask, on the target's own greedy answers of the
`make specbench` run (read from its records, no decoding here):

* ``oov``: the share of answer tokens outside each head's draft vocabulary (such a token can never
  be drafted, at any depth), and ``oov_prompt``: outside it and the prompt's tokens too (what
  ``drafter.prompt_vocab`` leaves undraftable);
* ``top1``: the head's top-1 at depth 1 with teacher forcing: the target's features of the true
  prefix, one head forward over the whole answer (the pairs the drafter's catch-up runs), top-1 of
  the draft LM head against the token that follows;
* ``tau`` and ``per_depth_acceptance`` of each config of the bench on that subtask (from the
  records' decoding statistics).

    python experiments/specbench_acceptance.py [--records experiments/results/specbench.records.json] \\
        [--head heads/smollm2-135m --head heads/smollm2-135m-eagle3] [--json experiments/results/specbench_acceptance.json]

Prints a markdown table (the one in docs/specbench.md) and writes the figures as JSON.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


@torch.no_grad()
def head_top1(target, head_dir: str, sequences: list[tuple[torch.Tensor, int]]) -> tuple[float, float, int]:
    """``(top-1 at depth 1, share of answer tokens outside the draft vocabulary, share outside it and
    the prompt's tokens, answer tokens)`` over ``sequences`` of ``(ids, prompt length)``."""
    from eagle.heads import load_head
    from eagle.heads.drafter import EagleDrafter
    from eagle.draft.shape import TreeShape

    head = load_head(head_dir, target.model)
    dr = EagleDrafter(target, head, TreeShape("chain", depth=1), dtype=torch.float32)
    vmap = head.vocab_map
    inside = None
    if vmap is not None:
        inside = torch.zeros(target.lm_head.weight.shape[0], dtype=torch.bool)
        inside[vmap] = True
    hits = total = oov = oov_prompt = 0
    for ids, plen in sequences:
        cache = target.new_cache(len(ids) + 8)
        out = target.prefill(ids, cache, dr.feature_layers)
        feats = dr.head.enter(out.features[:-1])  # (N - 1, H): pairs (f_i, x_{i+1})
        toks = ids[1:]
        dr.reset(ids)
        pos = torch.arange(len(toks))
        mask = torch.ones(len(toks), len(toks), dtype=torch.bool).tril()
        pred = dr._forward(feats, toks, pos, mask)  # (N - 1, H): the feature predicted at i + 1
        draft = dr._logits(pred).argmax(-1)  # (N - 1,) over the draft vocabulary
        if dr.d2t is not None:
            draft = dr.d2t[draft]
        # row i predicts x_{i+2}; answer tokens are ids[plen:], predicted by rows plen - 2 ..
        rows = torch.arange(max(plen - 2, 0), len(ids) - 2)
        hits += int((draft[rows] == ids[rows + 2]).sum())
        total += len(rows)
        if inside is not None:
            outside = ~inside[ids[plen:]]  # (answer,)
            oov += int(outside.sum())
            oov_prompt += int((outside & ~torch.isin(ids[plen:], ids[:plen])).sum())
    return hits / max(total, 1), oov / max(total, 1), oov_prompt / max(total, 1), total


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", default=str(ROOT / "experiments/results/specbench.records.json"))
    ap.add_argument("--result", default=str(ROOT / "experiments/results/specbench.json"))
    ap.add_argument("--head", action="append", default=None, help="head folder (repeatable)")
    ap.add_argument("--configs", default="eagle2-cpu,eagle2-auto,eagle3-cpu",
                    help="configs of the bench whose per-depth acceptance is shown")
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--json", default=str(ROOT / "experiments/results/specbench_acceptance.json"))
    args = ap.parse_args(argv)
    heads = args.head or [str(ROOT / "heads/smollm2-135m"), str(ROOT / "heads/smollm2-135m-subtasks"), str(ROOT / "heads/smollm2-135m-eagle3")]
    for p in (args.records, args.result):
        if not Path(p).is_file():
            print(f"error: {p} not found (run `make specbench` first)", file=sys.stderr)
            return 2
    import eagle
    from eagle.bench import _Conversations
    from eagle.decoder import DecodeStats
    from eagle.prompts import load_questions, subtask

    result = json.loads(Path(args.result).read_text())
    state = json.loads(Path(args.records).read_text())
    records = state["records"]
    questions = load_questions(result["prompt_file"], result.get("limit"), result.get("per_category"))
    model, tok = eagle.load_target(args.target)
    conv = _Conversations(tok, questions, result["max_new_tokens"])
    plain = {int(i): r for i, r in records["plain"].items()}
    by_cat: dict[str, list[int]] = {}
    for i, (qi, _) in enumerate(conv.items):
        by_cat.setdefault(subtask(questions[qi].category), []).append(i)
    target = eagle.Target(model, "reference")
    out: dict = {"heads": heads, "subtasks": {}}
    configs = [c for c in args.configs.split(",") if c in records]
    for cat, items in by_cat.items():
        seqs = []
        for i in items:
            ids = conv.ids(i, plain)
            seqs.append((torch.cat([ids, torch.tensor(plain[i]["tokens"], dtype=torch.long)]), len(ids)))
        row = {"turns": len(items)}
        for h in heads:
            top1, oov, oov_prompt, n = head_top1(target, h, seqs)
            row[Path(h).name] = {"top1_depth1": top1, "oov": oov, "oov_prompt": oov_prompt, "answer_tokens": n}
        for c in configs:
            st = DecodeStats()
            for i in items:
                st.merge(DecodeStats(**{"generations": 1, **records[c][str(i)]["stats"]}))
            row[c] = {"tau": st.tau, "per_depth_acceptance": st.per_depth_acceptance}
        out["subtasks"][cat] = row
        print(f"{cat}: done", file=sys.stderr)
    Path(args.json).write_text(json.dumps(out, indent=1))
    from specbench_report import acceptance_table  # the same table docs/specbench.md shows

    print("\n".join(acceptance_table(out)))
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
