"""What ``tree.shape: auto`` chooses step by step: the depth drafted, the nodes verified and the
tokens accepted at every step of a few greedy generations, with the costs and calibration it ended
with. Writes a JSON trace and a plot (chosen tree size against step) for docs/tree-policy.md.

    python experiments/tree_policy_trace.py [--config experiments/configs/eagle2-auto.yaml] \\
        [--prompts FILE --per-category 1 --limit 4] [--max-new-tokens 128] [--out experiments/results/tree_policy_trace]

The first prompt is generated once untimed first (warm-up: compilation and the first calibration),
then every prompt once, traced.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(ROOT / "experiments/configs/eagle2-auto.yaml"))
    ap.add_argument("--prompts", default=str(ROOT.parent / "shared/data/spec-bench/question.jsonl"))
    ap.add_argument("--per-category", type=int, default=1)
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--subtasks", default="mt_bench,summarization,math_reasoning",
                    help="comma-separated subtasks to trace (first turns only)")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--out", default=str(ROOT / "experiments/results/tree_policy_trace"))
    args = ap.parse_args(argv)
    import eagle
    from eagle.prompts import PromptFileError, encode_conversation, load_questions

    try:
        cfg = eagle.load_config(args.config)
        qs = load_questions(args.prompts, args.limit, args.per_category)
    except (ValueError, PromptFileError) as e:  # ConfigError is a ValueError
        print(f"error: {e}", file=sys.stderr)
        return 2
    if cfg.tree.shape != "auto":
        print(f"error: {args.config} has tree.shape '{cfg.tree.shape}', not auto", file=sys.stderr)
        return 2
    wanted = args.subtasks.split(",")
    picked = {}
    for q in qs:
        if q.subtask in wanted and q.subtask not in picked:
            picked[q.subtask] = q
    model, tok = eagle.load_target(args.target)
    dec = eagle.TreeDecoder.from_config(model, cfg)
    policy = dec.tree_policy
    steps: list[dict] = []
    observe = policy.observe

    def traced(tree, path, draft_s, verify_s, other_s):
        steps.append({"depth": int(tree.depth.max()), "nodes": len(tree), "accepted": len(path) - 1,
                      "draft_ms": 1000 * draft_s, "verify_ms": 1000 * verify_s})
        observe(tree, path, draft_s, verify_s, other_s)

    policy.observe = traced
    first = next(iter(picked.values()))
    dec.generate(encode_conversation(tok, first.turns[:1]), args.max_new_tokens)  # warm-up
    steps.clear()
    runs = []
    for sub, q in picked.items():
        start = len(steps)
        out = dec.generate(encode_conversation(tok, q.turns[:1]), args.max_new_tokens)
        runs.append({"subtask": sub, "question_id": q.question_id, "steps": [start, len(steps)], "tau": out.stats.tau})
        print(f"{sub}: tau {out.stats.tau:.2f}, {len(steps) - start} steps", file=sys.stderr)
    trace = {"config": cfg.name, "command": "python experiments/tree_policy_trace.py " + " ".join(argv or sys.argv[1:]),
             "runs": runs, "steps": steps, "policy": policy.report()}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(trace, indent=1))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4))
    x = range(len(steps))
    ax.step(x, [s["nodes"] for s in steps], where="mid", label="nodes verified", lw=1)
    ax.step(x, [s["depth"] for s in steps], where="mid", label="levels drafted", lw=1)
    ax.plot(x, [s["accepted"] for s in steps], ".", ms=3, label="drafted tokens accepted")
    for r in runs:
        ax.axvline(r["steps"][0], color="gray", lw=0.6)
        ax.text(r["steps"][0] + 0.5, max(s["nodes"] for s in steps) + 0.3, f"{r['subtask']} (tau {r['tau']:.2f})",
                fontsize=7)
    ax.set_xlabel("step")
    ax.set_title(f"{cfg.name}: tree chosen each step ({args.max_new_tokens} new tokens a prompt, greedy)", fontsize=9)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=3)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out.with_suffix(".png"), dpi=110)
    print(f"wrote {out.with_suffix('.json')}, {out.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
