"""What ``tree.shape: auto`` chooses step by step: the depth drafted, the nodes verified and the
tokens accepted at every step of a few greedy generations, with the costs and calibration it ended
with. Writes a JSON trace and a plot (chosen tree size against step) for docs/tree-policy.md.

    python experiments/tree_policy_trace.py [--config experiments/configs/eagle2-auto.yaml] \\
        [--prompts FILE --per-category 1 --limit 4] [--max-new-tokens 128] [--out experiments/results/tree_policy_trace]

The first prompt is generated once untimed first (warm-up: compilation and the first calibration),
then every prompt once, traced. Each step records what the policy expected it to accept (the sum of
the verified nodes' values) beside what it accepted, and the time its objective counted on (the
measured overhead, drafted levels and verification bucket) beside what the step took;
``--table-only`` holds the calibration's recent factor at 1 (the pooled band table alone).

``--children``: instead, what predicts the chance that an accepted node's drafted children hold the
next accepted token (the ``child`` of the policy's depth rule): every step drafts all ``depth``
levels and verifies the ``total_tokens`` most valuable nodes (the config's bounds as the tree, so
every depth is tried alike), and that chance is tabled by the node's depth, by its own draft
probability and by subtask. Writes OUT.children.json.

    python experiments/tree_policy_trace.py --children --subtasks mt_bench,translation,summarization,qa,math_reasoning,rag
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
    ap.add_argument("--table-only", action="store_true",
                    help="calibrate by the pooled band table alone (the recent factor held at 1)")
    ap.add_argument("--children", action="store_true",
                    help="instead: child acceptance by depth, draft probability and subtask, on full trees")
    args = ap.parse_args(argv)
    import eagle
    from eagle.bench import draft_precisions
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
    if args.children:
        return children_table(dec, tok, picked, args.max_new_tokens, Path(args.out), cfg.name)
    steps: list[dict] = []
    observe = policy.observe

    if args.table_only:  # the band table alone: the recent factor held at 1
        policy.calibration.factor = lambda: 1.0

    def traced(tree, path, draft_s, verify_s, other_s):
        made = policy.grown(tree)
        steps.append({"depth": int(tree.depth.max()), "nodes": len(tree), "accepted": len(path) - 1,
                      "expected": made.expected if made is not None else 0.0,
                      "draft_ms": 1000 * draft_s, "verify_ms": 1000 * verify_s,
                      "step_ms": 1000 * (draft_s + verify_s + other_s),
                      "predicted_ms": 1000 * made.seconds if made is not None else 0.0,
                      "shallower": shallower(made)})
        observe(tree, path, draft_s, verify_s, other_s)

    def shallower(made) -> list[dict]:
        """Per number of levels up to those drafted: the best count of the nodes drafted by then and
        the rate the objective gives it (tokens/s), with the costs and calibration the step was
        chosen with (what the depth rule could have stopped at)."""
        if made is None:
            return []
        out = []
        for levels, end in enumerate(made.level_ends, 1):
            n, rate = policy.best_count(made.values[1:end].sort(descending=True).values, levels)
            out.append({"levels": levels, "nodes": n, "rate": rate})
        return out

    policy.observe = traced
    first = next(iter(picked.values()))
    dec.generate(encode_conversation(tok, first.turns[:1]), args.max_new_tokens)  # warm-up
    steps.clear()
    runs = []
    for sub, q in picked.items():
        start = len(steps)
        out = dec.generate(encode_conversation(tok, q.turns[:1]), args.max_new_tokens)
        mine = steps[start:]
        keys = ("accepted", "expected", "step_ms", "predicted_ms")
        per_step = {key: sum(s[key] for s in mine) / max(len(mine), 1) for key in keys}
        runs.append({"subtask": sub, "question_id": q.question_id, "steps": [start, len(steps)], "tau": out.stats.tau,
                     **{f"{key}_per_step": per_step[key] for key in keys}, **depth_rule(mine)})
        print(f"{sub}: tau {out.stats.tau:.2f}, {len(mine)} steps, drafted tokens accepted per step "
              f"{per_step['accepted']:.2f} (expected {per_step['expected']:.2f}), a step's ms "
              f"{per_step['step_ms']:.1f} (expected {per_step['predicted_ms']:.1f}); steps where the objective "
              f"rated stopping earlier higher: {runs[-1]['shallower_better']:.0%} (by {runs[-1]['shallower_gain']:.1%} "
              f"on them)", file=sys.stderr)
    trace = {"config": cfg.name, "command": "python experiments/tree_policy_trace.py " + " ".join(argv or sys.argv[1:]),
             "draft_dtype": draft_precisions({cfg.name: dec}, [cfg]).get(cfg.name),
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


def depth_rule(steps: list[dict]) -> dict:
    """How often the objective itself rated a tree of fewer levels (from the nodes drafted by then)
    above the one verified, and by how much on those steps: the depth rule's own misses."""
    better, gains = 0, []
    for s in steps:
        alts = s["shallower"]
        if not alts:
            continue
        best = max(alts[:-1], key=lambda a: a["rate"], default=None)
        if best is not None and best["rate"] > alts[-1]["rate"]:
            better += 1
            gains.append(best["rate"] / alts[-1]["rate"] - 1)
    drafted = sum(1 for s in steps if s["shallower"])
    return {"shallower_better": better / max(drafted, 1), "shallower_gain": sum(gains) / max(len(gains), 1)}


def _fifth(q: float) -> str:
    """The fifth of [0, 1] that ``q`` falls in, e.g. ``"0.4-0.6"``."""
    lo = min(int(q * 5), 4) / 5
    return f"{lo:.1f}-{lo + 0.2:.1f}"


def children_table(dec, tok, picked: dict, max_new_tokens: int, out: Path, name: str) -> int:
    """``--children`` (see the module docstring): one generation per picked subtask on full trees."""
    import torch

    from eagle.prompts import encode_conversation

    policy = dec.tree_policy
    # the bounds as the tree: every level drafted, the most valuable total_tokens nodes verified
    policy.worth_another_level = lambda *args: True
    policy.best_count = lambda values, levels, step_up=False: (min(len(values), policy.max_nodes - 1), 1.0)
    rows: list[tuple] = []  # (subtask, depth, own draft probability, a child accepted)
    observe, current = policy.observe, [""]

    def recorded(tree, path, draft_s, verify_s, other_s):
        made = policy.grown(tree)
        if made is not None:
            parents, depth = tree.parents.tolist(), tree.depth.tolist()
            has_kids = set(p for p in parents if p >= 0)
            for j, node in enumerate(path):
                if node in has_kids:
                    rows.append((current[0], depth[node], float(made.q[node]) if node else 1.0, j + 1 < len(path)))
        observe(tree, path, draft_s, verify_s, other_s)

    policy.observe = recorded
    first = next(iter(picked.values()))
    dec.generate(encode_conversation(tok, first.turns[:1]), max_new_tokens)  # warm-up
    rows.clear()
    for sub, q in picked.items():
        current[0] = sub
        dec.generate(encode_conversation(tok, q.turns[:1]), max_new_tokens)

    def table(key) -> dict:
        acc: dict = {}
        for r in rows:
            hit, n = acc.get(key(r), (0, 0))
            acc[key(r)] = (hit + r[3], n + 1)
        return {str(k): {"rate": h / n, "nodes": n} for k, (h, n) in sorted(acc.items())}

    result = {"config": name,
              "by_depth": table(lambda r: r[1]),
              "by_own_q": table(lambda r: "root" if r[1] == 0 else _fifth(r[2])),
              "by_subtask": table(lambda r: r[0]), "nodes": len(rows), "threads": torch.get_num_threads()}
    for name in ("by_depth", "by_own_q", "by_subtask"):
        print(f"{name}: " + ", ".join(f"{k} {v['rate']:.2f} ({v['nodes']})" for k, v in result[name].items()))
    path = out.with_suffix(".children.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
