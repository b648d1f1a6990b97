"""Render docs/specbench.md from the committed bench JSON of `make specbench` (no model runs).

    python experiments/specbench_report.py [--json experiments/results/specbench.json] [--out docs/specbench.md]

Per Spec-Bench subtask and pooled: every config's tau, tok/s, speedup against our compiled plain loop
(``--baseline``, default plain-compiled) and against transformers' ``generate``, the step cost (a
drafted step's time over a plain step's, so speedup ~= tau / step cost apart from the prefill) and
the turns identical to plain decoding.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _pooled(run: dict) -> dict:
    return {"tau": run["mean_accepted"], "tokens_per_s": run["tokens_per_s"], "step_cost": run.get("step_cost", 0.0),
            "identical": run["identical_to_plain"], "turns": run.get("turns", run["prompts"]),
            "speedup_vs_hf": run.get("speedup_vs_hf", 0.0)}


def render(result: dict, json_path: str, baseline: str) -> str:
    runs = {r["config"]: r for r in result["runs"]}
    if baseline not in runs:
        raise SystemExit(f"error: {json_path} has no run named '{baseline}' (runs: {', '.join(runs)})")
    cats = list(result["plain"]["categories"])
    base = runs[baseline]
    lines = ["# Spec-Bench", "",
             "Spec-Bench (hemingkx/Spec-Bench, `data/spec_bench/question.jsonl`) is the field's yardstick for "
             "speculative decoding: 480 questions in six subtasks (MT-bench's 80 two-turn questions pooled as "
             "`mt_bench`, and 80 each of translation, summarization, qa, math_reasoning, rag). The project does not "
             "ship it; pass its path (`make specbench SPEC_BENCH=PATH`).", "",
             f"Measured on {result['device']}, target `{result['target']}`, greedy, up to "
             f"{result['max_new_tokens']} new tokens a turn; the subset: {result.get('per_category') or 'all'} "
             f"row(s) per category of `{Path(result.get('prompt_file', '')).name}` "
             f"({result['plain']['prompts']} questions, {result['plain']['turns']} turns; turn 2 of an MT-bench "
             "question is asked after turn 1 and plain decoding's answer to it). Every method runs on the same "
             "turns in one process, turns outer and methods inner.", "",
             "Command:", "", "```", result.get("command", "make specbench"), "python experiments/specbench_report.py",
             "```", "",
             f"Columns: tau = tokens per target forward in the decode phase (bonus token included); "
             f"**vs {baseline}** = tok/s over our compiled plain loop's on the same turns; vs generate = over "
             "transformers' `generate`; step cost = a drafted step's time over a plain step's (plain decoding in "
             "the same precision), so the speedup is about tau / step cost (the prefill is the rest); "
             "identical = turns whose output equals plain decoding's.", ""]
    if result.get("resumed_runs"):
        lines += [f"({result['resumed_runs']} runs were resumed from an interrupted process: their times come "
                  "from it.)", ""]
    lines += ["![tau and speedup per subtask](../experiments/results/specbench.png)", ""]
    # the fastest config per subtask among those identical to plain decoding on every turn of the subset
    best = []
    lossless = {n: r for n, r in runs.items() if r["identical_to_plain"] == r.get("turns", r["prompts"])}
    for cat in cats:
        ok = {n: r["categories"][cat] for n, r in lossless.items()}
        name = max(ok, key=lambda n: ok[n]["tokens_per_s"])
        best.append(f"{cat} {name} ({ok[name]['tokens_per_s'] / runs[baseline]['categories'][cat]['tokens_per_s']:.2f}x)")
    lines += ["Fastest config per subtask among those identical to plain decoding on every turn (against "
              f"{baseline}): " + "; ".join(best) + ".", ""]
    if result.get("draft_dtype_auto"):  # what drafter.dtype: auto took on this machine
        lines += ["`drafter.dtype: auto` took: " + ", ".join(f"{k} {v}" for k, v in result["draft_dtype_auto"].items())
                  + ".", ""]
    for cat in cats + ["pooled"]:
        if cat == "pooled":
            rows = {name: _pooled(r) for name, r in runs.items()}
            plain = result["plain"]
            lines += [f"## pooled ({plain['prompts']} questions, {plain['turns']} turns)", ""]
            gen = result["generate"]["tokens_per_s"]
        else:
            rows = {name: r["categories"][cat] for name, r in runs.items()}
            c = result["plain"]["categories"][cat]
            lines += [f"## {cat} ({c['prompts']} questions, {c['turns']} turns)", ""]
            gen = result["generate"]["categories"][cat]["tokens_per_s"]
        ref = rows[baseline]["tokens_per_s"]
        lines += [f"| config | tau | tok/s | vs {baseline} | vs generate | step cost | identical |",
                  "|---|---:|---:|---:|---:|---:|---:|"]
        for name, r in rows.items():
            lines.append(f"| {name} | {r['tau']:.2f} | {r['tokens_per_s']:.1f} | "
                         f"{r['tokens_per_s'] / ref if ref else 0:.2f}x | {r['tokens_per_s'] / gen if gen else 0:.2f}x | "
                         f"{r['step_cost']:.2f}x | {r['identical']}/{r['turns']} |")
        lines.append("")
    del base
    lines += ["## Where a step's time goes (pooled)", "",
              "Per target forward, ms: drafting, the verification forward (with the greedy argmax), the rest; "
              "the trees verified (mean nodes, root included) and the rows run beside them without being verified "
              "(side rows: lookahead decoding's Jacobi window).", "",
              "| config | draft ms | verify ms | other ms | step ms | nodes | side rows |",
              "|---|---:|---:|---:|---:|---:|---:|"]
    for name, r in runs.items():
        ms = r["step_ms"]
        lines.append(f"| {name} | {ms['draft']:.1f} | {ms['verify']:.1f} | {ms['bookkeeping']:.1f} | "
                     f"{sum(ms.values()):.1f} | {r['mean_tree_nodes']:.1f} | {r.get('mean_side_rows', 0.0):.1f} |")
    lines.append("")
    acc = Path(json_path).with_name("specbench_acceptance.json")
    if acc.is_file():
        lines += acceptance_table(json.loads(acc.read_text()))
    pv = Path(json_path).with_name("specbench_prompt_vocab") / "results.json"
    if pv.is_file():
        lines += prompt_vocab_table(json.loads(pv.read_text()))
    sh = Path(json_path).parent / "ablations" / "subtask-head" / "results.json"
    if sh.is_file():
        lines += subtask_head_table(json.loads(sh.read_text()))
    return "\n".join(lines)


def sweep_table(sweep: dict, title: str, intro: str, label) -> list[str]:
    """One `eagle sweep` on the Spec-Bench subset: per cell (``label(cell)``), tau per subtask and
    pooled, tok/s pooled against the faster plain decoder of the run, turns identical to plain."""
    cells = sweep["cells"]
    cats = list(cells[0]["categories"])
    where = sweep.get("device", "a machine its results do not record")
    out = [f"## {title}", "", f"{intro} Its own run, on {where}:", "", "```", sweep.get("command", ""), "```", "",
           "| cell | " + " | ".join(f"{c} tau" for c in cats) + " | pooled tau | speedup | identical |",
           "|---|" + "---:|" * (len(cats) + 3)]
    for c in cells:
        out.append(f"| {label(c)} | " + " | ".join(f"{c['categories'][k]['tau']:.2f}" for k in cats)
                   + f" | {c['tau']:.2f} | {c['speedup']:.2f}x | {c['identical_to_plain']}/{c.get('turns', c['prompts'])} |")
    return out + [""]


def prompt_vocab_table(sweep: dict) -> list[str]:
    """eagle2-cpu with and without ``drafter.prompt_vocab`` on the same subset (one `eagle sweep`)."""
    return sweep_table(sweep, "The prompt's tokens in the draft vocabulary",
                       "eagle2-cpu with `drafter.prompt_vocab` off and on (the prompt's tokens outside the head's "
                       "draft vocabulary drafted through the target's LM-head rows), one sweep on the same subset; "
                       "tau per subtask and pooled, tok/s pooled against the faster plain decoder of the run.",
                       lambda c: f"prompt_vocab {c['grid']['drafter.prompt_vocab']}")


def subtask_head_table(sweep: dict) -> list[str]:
    """The head fine-tuned on the subtask prompts against the head it started from (the ablation
    experiments/ablations/subtask-head.yaml)."""
    return sweep_table(sweep, "A head trained on the subtasks' kinds of work",
                       "`heads/smollm2-135m-subtasks` is `heads/smollm2-135m` fine-tuned on prompts that do what "
                       "the subtasks do (articles to summarize, passages to answer from, follow-ups, German to "
                       "translate; written from the target's own answers by `experiments/subtask_prompts.py`), answered "
                       "greedily by the target, with part of its original data replayed (`eagle train --config "
                       "experiments/configs/train-smollm2-subtasks.yaml`; what each choice of that recipe does: "
                       "[acceptance.md](acceptance.md)). Both heads under eagle2-cpu and "
                       "eagle2-auto, one sweep (the ablation `experiments/ablations/subtask-head.yaml`; on chat "
                       "prompts: `subtask-head-chat.yaml`, [ablations.md](ablations.md)).",
                       lambda c: c["cell"])


def acceptance_table(a: dict) -> list[str]:
    """The table of experiments/specbench_acceptance.py, when its JSON is beside the bench's."""
    heads = [h.rstrip("/").split("/")[-1] for h in a["heads"]]
    configs = [k for k in next(iter(a["subtasks"].values())) if k not in heads and k != "turns"]
    out = ["## Why acceptance falls per subtask", "",
           "On the target's own greedy answers of this run (`python experiments/specbench_acceptance.py`): each "
           "head's top-1 at depth 1 with teacher forcing (the target's features of the true prefix), the share of "
           "answer tokens outside its draft vocabulary (never draftable) and outside it and the prompt's tokens "
           "(what `drafter.prompt_vocab: true` leaves undraftable), and each config's tau and acceptance per "
           "depth (the share of steps whose tree reached depth d that accepted a token there).", "",
           "| subtask | " + " | ".join(f"{h} top-1 | {h} outside vocab | + prompt" for h in heads) + " | "
           + " | ".join(f"{c} tau | {c} per depth" for c in configs) + " |",
           "|---|" + "---:|" * (3 * len(heads) + 2 * len(configs))]
    for cat, row in a["subtasks"].items():
        cells = [f"{row[h]['top1_depth1']:.2f} | {100 * row[h]['oov']:.1f}% | {100 * row[h]['oov_prompt']:.1f}%"
                 for h in heads]
        cells += [f"{row[c]['tau']:.2f} | " + " ".join(f"{x:.2f}" for x in row[c]["per_depth_acceptance"][:4])
                  for c in configs]
        out.append(f"| {cat} | " + " | ".join(cells) + " |")
    return out + [""]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=str(ROOT / "experiments/results/specbench.json"))
    ap.add_argument("--out", default=str(ROOT / "docs/specbench.md"))
    ap.add_argument("--baseline", default="plain-compiled", help="the run speedups are computed against")
    args = ap.parse_args(argv)
    path = Path(args.json)
    if not path.is_file():
        print(f"error: {path} not found (run `make specbench` first)", file=sys.stderr)
        return 2
    try:
        result = json.loads(path.read_text())
        text = render(result, args.json, args.baseline)
    except (json.JSONDecodeError, KeyError) as e:
        print(f"error: {path} is not a bench JSON with per-subtask results ({e})", file=sys.stderr)
        return 2
    Path(args.out).write_text(text)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
