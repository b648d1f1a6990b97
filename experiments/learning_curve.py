"""Learning curve of the draft heads: held-out draft top-1 per depth and tau vs training tokens.

For each head (``--heads``: ``eagle`` = the EAGLE-2 head of experiments/configs/train-smollm2.yaml,
``eagle3`` = the EAGLE-3 head of experiments/configs/train-smollm2-eagle3.yaml; both read the same
self-distilled shards) and each data budget (``--budgets``, default 250000,500000,1000000,2000000;
``all`` = every token the data holds now) it trains a head on the first shards of the data up to
that many tokens (``data_tokens``; the same recipe otherwise, so a bigger budget trains for
proportionally more steps), then measures:

* **top-1 per depth on a fixed held-out set**: the target's own answers to the held-out chat
  prompts (experiments/data/prompts/heldout.jsonl, all 200 of them by default; none of them is a
  training prompt, and any that were would be dropped), self-distilled once with the data stage's
  own settings (temperature, length, seed, the same stored layers) into ``<work>/heldout-data``.
  Every head of every budget is scored on these same sequences, with the trainer's own metric (the
  head's argmax against the target's argmax over the draft vocabulary at every answer position, one
  number per unrolled step = draft depth: 3 for the EAGLE-2 recipe's unroll 3, 7 for EAGLE-3's
  training-time test). The held-out split of the training data is no fixed yardstick: it is a
  seeded 3% of each budget's own sequences, so it changes with the budget, and the split of a small
  budget lies inside the training data of the bigger ones.
* **top-1 per depth on the training data's held-out split** too (what ``eagle train`` prints).
* **tau on the 60-node dynamic tree, greedy** (experiments/configs/eagle2-dynamic.yaml or
  eagle3-dynamic.yaml with the trained head: depth 6, top_k 10, 60 tokens), with ``eagle.bench``
  on the first ``--prompts-limit`` (8) held-out prompts, 128 new tokens; tau's standard error over
  the prompts and the outputs' identity to plain decoding come with it.

A cell that reads every shard (``all``, or a budget the whole data just reaches) trains with the
recipe's own length is the training config's own run: its ``out_dir`` and ``export`` (the shipped
head, e.g. heads/smollm2-135m-eagle3), so the curve's biggest point and the shipped head are one
training, which ``eagle train --config <that config>`` also resumes.

Writes ``results.json`` (after every stage of every cell), ``table.md`` and ``learning_curve.png``
under ``--out`` (default experiments/results/learning_curve/), and with ``--report FILE`` a
markdown page (table, plot, command, a reading of the curve written from the numbers). Heads,
checkpoints and the held-out data live under ``--work`` (default ~/.cache/eagle/learning_curve/,
one ``<head>-<budget>`` folder per cell). Resumable: a rerun skips finished cells, reuses the
finished stages (train, eval, bench) of a cell, and training resumes from its checkpoint. A budget
above what the data holds is skipped with a note (rerun once the data stage has made more).

The full curve (needs >= 2M tokens in ~/.cache/eagle/data/smollm2-selfdistill):

    .venv/bin/python experiments/learning_curve.py --report docs/learning_curve.md

Expected cost on the 2-core CPU (run from the repository root; nothing else running): training
dominates and grows with tokens x epochs. Measured on the AMD EPYC machine with `train_dtype: auto`
(bf16 there) under jemalloc (eagle/allocator.py): an EAGLE-2 step (unroll 3, 16 sequences) takes
~1.1-1.4 s, an EAGLE-3 step (7 training-time-test steps) ~2.5-4 s. The EAGLE-2 recipe runs 6 epochs:
~1,750 steps per 1M tokens, ~40 min; its all-data cell (2.77M tokens) is 4,836 steps, ~1.7 h, and
its four cells ~3 h. The EAGLE-3 recipe runs 2 epochs: ~583 steps per 1M tokens, ~32 min; its
all-data cell 1,612 steps (~1.5 h), its four cells ~2.5 h. Without jemalloc and bf16 (glibc, float32)
steps are ~4-5x slower. Add ~4 min once for the fixed held-out set (200 prompts self-distilled),
~1-3 min per cell to reload its data and evaluate, and ~2-3 min per cell of bench (plain decoding
runs once for all cells). Everything resumes: ``timeout``/Ctrl-C/SIGTERM stop cleanly (the training
loses at most the steps since its last checkpoint), and the same command continues.

A quick look end to end (one cell of 2 steps: ~10 min on an idle 2-core CPU, ~30 min measured on
one shared with other jobs):

    .venv/bin/python experiments/learning_curve.py --heads eagle --budgets 40000 --max-steps 2 \\
        --prompts-limit 1 --heldout-prompts 8 --work /tmp/lc-work --out /tmp/lc-out

``--plan`` prints the cells (and the skipped budgets) and exits; ``--report-only`` rewrites the
table, the plot and the report from results.json without running anything.
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import os
import shlex
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# head name -> (training config, decoding config of the 60-node dynamic tree)
HEADS = {
    "eagle": ("experiments/configs/train-smollm2.yaml", "experiments/configs/eagle2-dynamic.yaml"),
    "eagle3": ("experiments/configs/train-smollm2-eagle3.yaml", "experiments/configs/eagle3-dynamic.yaml"),
}
HEAD_TITLES = {"eagle": "EAGLE-2 head", "eagle3": "EAGLE-3 head"}
DEFAULT_BUDGETS = "250000,500000,1000000,2000000"
HELDOUT_PROMPTS = "experiments/data/prompts/heldout.jsonl"
# the data stage's settings the fixed held-out set is made with (all selected heads must agree on them)
GEN_FIELDS = ("target", "gen_batch_size", "gen_max_new_tokens", "gen_temperature", "shard_prompts", "seed",
              "feature_layers")


class CurveError(ValueError):
    """A learning-curve run that cannot go on; the message is one line."""


# ------------------------------------------------------------------------------------------ planning


def parse_budget(text: str) -> int | str:
    """``250000``, ``250k``, ``0.5M``, ``2M`` -> tokens; ``all`` -> ``"all"``."""
    t = text.strip().lower().replace("_", "")
    if t == "all":
        return "all"
    scale = {"k": 1_000, "m": 1_000_000}.get(t[-1:], 1)
    try:
        value = float(t[:-1] if scale > 1 else t)
    except ValueError:
        raise CurveError(f"bad budget '{text}' (a token count such as 250000, 250k or 2M, or 'all')") from None
    n = int(round(value * scale))
    if n < 1 or not math.isfinite(value):
        raise CurveError(f"bad budget '{text}': must be >= 1 token")
    return n


def parse_budgets(text: str) -> list[int | str]:
    items = [s for s in text.split(",") if s.strip()]
    if not items:
        raise CurveError("--budgets is empty")
    return [parse_budget(s) for s in items]


def prefix_tokens(manifest: dict, budget: int) -> tuple[int, int]:
    """``(tokens, shards)`` a run with ``data_tokens=budget`` reads: the first shards, up to the
    first one that reaches ``budget`` in all (as ``ShardDataset(max_tokens=...)``)."""
    seen = n = 0
    for s in manifest.get("shards", []):
        if budget and seen >= budget:
            break
        seen += s["tokens"]
        n += 1
    return seen, n


@dataclass
class Cell:
    """One (head, budget) point of the curve."""

    head: str
    budget: int  # data_tokens of the run
    label: str  # as asked: "250000" or "all"
    data_tokens: int  # tokens of the shards it reads (>= budget: whole shards)
    shards: int
    work: str  # its folder: checkpoints under train/, the exported head under head/
    # it reads every shard of the data: with the recipe's own training length it IS the training
    # config's own run (its out_dir and export, e.g. the shipped head), not a copy under ``work``
    whole: bool = False

    @property
    def key(self) -> str:
        return f"{self.head}-{self.budget}"


def work_suffix(epochs: float | None, max_steps: int | None) -> str:
    """Runs with other training lengths get their own folders (a checkpoint refuses other settings)."""
    s = ""
    if epochs is not None:
        s += f"-epochs{epochs:g}"
    if max_steps:
        s += f"-steps{max_steps}"
    return s


def plan_cells(heads: list[str], budgets: list[int | str], available: dict[str, dict], work: str | Path,
               suffix: str = "") -> tuple[list[Cell], list[str]]:
    """The cells to run and a note per skipped budget. ``available[head]``: the manifest of that
    head's data folder (``tokens`` and ``shards``). ``all`` is every token there now; a budget
    above that is skipped; a budget met twice (``all`` equal to a number) is one cell."""
    cells, notes, seen = [], [], set()
    for head in heads:
        manifest = available[head]
        have = int(manifest.get("tokens", 0))
        for b in budgets:
            if b == "all":
                if have == 0:
                    notes.append(f"skip {head} all: the data holds no tokens yet")
                    continue
                n, label = have, "all"
            else:
                n, label = int(b), str(b)
                if n > have:
                    notes.append(f"skip {head}-{n}: the data holds {have:,} tokens (< {n:,}); rerun when the "
                                 "data stage has made more")
                    continue
            if (head, n) in seen:
                continue
            seen.add((head, n))
            tokens, shards = prefix_tokens(manifest, n)
            cells.append(Cell(head, n, label, tokens, shards, str(Path(work) / f"{head}-{n}{suffix}"),
                              whole=shards == len(manifest.get("shards", []))))
    return cells, notes


def fingerprint(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


# ------------------------------------------------------------------------------------- the curve loop


def load_results(out: str | Path) -> dict:
    path = Path(out) / "results.json"
    if not path.exists():
        return {"cells": {}}
    try:
        state = json.loads(path.read_text())
    except json.JSONDecodeError:
        raise CurveError(f"{path}: not valid JSON (delete it to start over)") from None
    if not isinstance(state, dict) or not isinstance(state.get("cells"), dict):
        raise CurveError(f"{path}: not a learning-curve results file (delete it or use another --out)")
    return state


def check_settings(state: dict, settings: dict, out: str | Path) -> None:
    """One curve per ``--out``: a results file made with other settings (training length, bench
    prompts and tokens, held-out set) is an error rather than a table mixing the two."""
    old = state.get("settings")
    if old is not None and old != settings:
        diff = "; ".join(f"{k}: {old.get(k)!r} -> {v!r}" for k, v in settings.items() if old.get(k) != v)
        raise CurveError(f"{Path(out) / 'results.json'} holds a curve with other settings ({diff}); use another "
                         "--out, or delete it to start over")


def save_results(state: dict, out: str | Path) -> None:
    from eagle.io import write_json

    write_json(state, Path(out) / "results.json", indent=1)


STAGES = ("train", "eval", "bench")


def run_curve(cells: list[Cell], state: dict, out: str | Path, stage_fps: dict, train_fn, eval_fn, bench_fn,
              head_ready=None, log=None) -> dict:
    """Run every cell's stages (``train_fn(cell)``, ``eval_fn(cell)``, ``bench_fn(cell)``), saving
    ``out/results.json`` after each. ``stage_fps[cell.key][stage]``: the fingerprint of what that
    stage depends on; a stage recorded with the same fingerprint is not run again (a finished cell
    is skipped whole), one recorded with another is run again with every stage after it.
    ``head_ready(cell)``: whether the trained head is still on disk (else training runs again);
    ``log(line)``: progress (default: printed)."""
    log = log or (lambda line: print(line, flush=True))
    for i, cell in enumerate(cells, start=1):
        tag = f"[{i}/{len(cells)}] {cell.key}"
        rec = state["cells"].get(cell.key) or {}
        fps = stage_fps[cell.key]
        valid = True
        for stage in STAGES:  # a stage counts only if it and every stage before it are current
            valid = valid and stage in rec and rec.get("fp", {}).get(stage) == fps[stage]
            if not valid and stage in rec:
                rec.pop(stage)
        if all(s in rec for s in STAGES) and (head_ready is None or head_ready(cell)):
            log(f"{tag}: done earlier, skipped ({summary_line(rec)})")
            continue
        if rec:
            log(f"{tag}: resuming (done: {', '.join(s for s in STAGES if s in rec) or 'nothing'})")
        rec.update({"head": cell.head, "budget": cell.budget, "label": cell.label, "data_tokens": cell.data_tokens,
                    "shards": cell.shards, "work": cell.work})
        rec.setdefault("fp", {})
        rec["done"] = False
        state["cells"][cell.key] = rec
        if "train" in rec and head_ready is not None and not head_ready(cell):
            log(f"{tag}: the trained head is gone from {cell.work}, training again")
            for s in STAGES:
                rec.pop(s, None)
        for stage, fn, what in (("train", train_fn, f"training on the first {cell.shards} shards "
                                 f"({cell.data_tokens:,} tokens, budget {cell.budget:,})"),
                                ("eval", eval_fn, "top-1 per depth on the fixed held-out set and the split"),
                                ("bench", bench_fn, "tau on the 60-node dynamic tree")):
            if stage in rec:
                continue
            log(f"{tag}: {what}")
            rec[stage] = fn(cell)
            rec["fp"][stage] = fps[stage]
            save_results(state, out)
        rec["done"] = True
        save_results(state, out)
        log(f"{tag}: {summary_line(rec)}")
    return state


def summary_line(rec: dict) -> str:
    parts = []
    if "train" in rec:
        parts.append(f"{rec['train'].get('steps', 0)} steps")
    if "eval" in rec:
        parts.append("top-1 fixed " + "/".join(f"{a:.3f}" for a in rec["eval"]["fixed"]["acc"][:3]))
    if "bench" in rec:
        b = rec["bench"]
        parts.append(f"tau {b['tau']:.2f} ± {b.get('tau_se', 0.0):.2f}")
    return ", ".join(parts) or "nothing yet"


# ------------------------------------------------------------------------------------------ outputs


def done_cells(state: dict, heads: list[str] | None = None) -> list[dict]:
    """Finished cells, by head (``heads`` order, then the rest) and tokens."""
    rows = [dict(r, key=k) for k, r in state["cells"].items() if r.get("done")]
    order = {h: i for i, h in enumerate(heads or HEADS)}
    return sorted(rows, key=lambda r: (order.get(r["head"], len(order)), r["head"], r["data_tokens"]))


def short_tokens(n: int) -> str:
    """``262144`` -> ``262k``, ``2040000`` -> ``2.04M``."""
    return f"{n / 1e6:.3g}M" if n >= 1_000_000 else f"{n / 1e3:.3g}k" if n >= 1000 else str(n)


def _accs(xs) -> str:
    return " ".join(f"{a:.3f}" for a in xs)


def format_table(state: dict) -> str:
    rows = done_cells(state)
    lines = ["| head | budget | tokens (shards) | steps | top-1 per depth, fixed held-out set | "
             "top-1 per depth, split of its data | tau (± s.e.) | identical to plain |",
             "|---|---:|---:|---:|---|---|---:|---:|"]
    for r in rows:
        b, ev = r["bench"], r["eval"]
        budget = f"all ({r['budget']:,})" if r["label"] == "all" else f"{r['budget']:,}"
        lines.append(f"| {HEAD_TITLES.get(r['head'], r['head'])} | {budget} | {r['data_tokens']:,} ({r['shards']}) | "
                     f"{r['train']['steps']:,} | {_accs(ev['fixed']['acc'])} | {_accs(ev['split']['acc'])} | "
                     f"{b['tau']:.2f} ± {b.get('tau_se', 0.0):.2f} | {b['identical_to_plain']}/{b['prompts']} |")
    return "\n".join(lines) + "\n"


def plot(state: dict, path: str | Path, depths: int = 3) -> Path | None:
    """tau vs training tokens (one line per head) and fixed-set top-1 at depths 1..``depths`` vs
    tokens (colour: head, line style: depth)."""
    rows = done_cells(state)
    if not rows:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from eagle.io import save_figure

    heads = list(dict.fromkeys(r["head"] for r in rows))
    colors = {h: f"C{i}" for i, h in enumerate(heads)}
    styles = ["-", "--", ":", "-."]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    for h in heads:
        hr = [r for r in rows if r["head"] == h]
        x = [r["data_tokens"] for r in hr]
        ax1.errorbar(x, [r["bench"]["tau"] for r in hr], yerr=[r["bench"].get("tau_se", 0.0) for r in hr],
                     marker="o", capsize=3, color=colors[h], label=HEAD_TITLES.get(h, h))
        for d in range(depths):
            pts = [(r["data_tokens"], r["eval"]["fixed"]["acc"][d]) for r in hr if len(r["eval"]["fixed"]["acc"]) > d]
            if pts:
                ax2.plot(*zip(*pts), marker="o", ls=styles[d % len(styles)], color=colors[h],
                         label=f"{HEAD_TITLES.get(h, h)}, depth {d + 1}")
    ticks = sorted({r["data_tokens"] for r in rows})
    for ax in (ax1, ax2):
        ax.set_xscale("log")
        ax.set_xticks(ticks, [short_tokens(t) for t in ticks])
        ax.minorticks_off()
        ax.set_xlabel("training data (self-distilled tokens, log scale)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    ax1.set_ylabel("tau (tokens per target forward)")
    ax1.set_title("tau, 60-node dynamic tree, greedy")
    ax2.set_ylabel("draft top-1 (fixed held-out set)")
    ax2.set_title("top-1 per draft depth")
    fig.tight_layout()
    return save_figure(fig, path)


def reading(state: dict) -> list[str]:
    """A few sentences on what the numbers say: per head the gain per doubling of the data (last
    step and overall) against tau's standard error, the gap between the heads at the largest
    budget both have, and which lever that points to (where tau's gain is inside its noise, the
    depth-1 top-1 of the fixed held-out set decides)."""
    rows = done_cells(state)
    if not rows:
        return ["No finished cells yet."]
    out = []
    last_gain = {}
    by_head = {}
    for r in rows:  # one point per amount of data (two budgets may read the same shards)
        hr = by_head.setdefault(r["head"], [])
        if hr and hr[-1]["data_tokens"] == r["data_tokens"]:
            hr.pop()
        hr.append(r)
    for h, hr in by_head.items():
        name = HEAD_TITLES.get(h, h)
        if len(hr) < 2:
            r = hr[0]
            out.append(f"{name}: one point so far (tau {r['bench']['tau']:.2f} at {r['data_tokens']:,} tokens); "
                       "no slope yet.")
            continue
        a, b, c = hr[0], hr[-2], hr[-1]
        taus = [r["bench"]["tau"] for r in (a, b, c)]
        d1 = [r["eval"]["fixed"]["acc"][0] for r in (a, b, c)]
        doublings_all = math.log2(c["data_tokens"] / a["data_tokens"])
        doublings_last = math.log2(c["data_tokens"] / b["data_tokens"])
        g_all = (taus[2] - taus[0]) / doublings_all
        g_last = (taus[2] - taus[1]) / doublings_last
        se = math.hypot(b["bench"].get("tau_se", 0.0), c["bench"].get("tau_se", 0.0)) / doublings_last
        top1_last = (d1[2] - d1[1]) / doublings_last  # depth-1 top-1 gain per doubling, last step
        last_gain[h] = (g_last, se, c, top1_last)
        out.append(f"{name}: tau {taus[0]:.2f} -> {taus[2]:.2f} from {a['data_tokens']:,} to {c['data_tokens']:,} "
                   f"tokens ({g_all:+.2f} per doubling overall, {g_last:+.2f} ± {se:.2f} over the last step); "
                   f"top-1 at depth 1 on the fixed held-out set {d1[0]:.3f} -> {d1[2]:.3f} "
                   f"({(d1[2] - d1[1]) / doublings_last * 100:+.1f} points per doubling over the last step).")
    # the heads side by side at the largest budget both ran
    common = None
    if len(by_head) >= 2:
        tok_sets = [{r["budget"]: r for r in hr} for hr in by_head.values()]
        shared = set.intersection(*(set(t) for t in tok_sets))
        if shared:
            n = max(shared)
            at_n = sorted(((h, t[n]) for h, t in zip(by_head, tok_sets)), key=lambda x: -x[1]["bench"]["tau"])
            (h1, r1), (h2, r2) = at_n[0], at_n[1]
            gap = r1["bench"]["tau"] - r2["bench"]["tau"]
            out.append(f"At {r1['data_tokens']:,} tokens the {HEAD_TITLES.get(h1, h1)} leads the "
                       f"{HEAD_TITLES.get(h2, h2)} by {gap:.2f} tau "
                       f"({r1['bench']['tau']:.2f} vs {r2['bench']['tau']:.2f}).")
            common = (h1, h2, gap)
    # the lever
    if last_gain:
        best_h, (g, se, c, _) = max(last_gain.items(), key=lambda kv: kv[1][0])
        name = HEAD_TITLES.get(best_h, best_h)
        top1_h, (_, _, _, top1_best) = max(last_gain.items(), key=lambda kv: kv[1][3])
        if g > max(2 * se, 0.05):
            verdict = (f"More data is still a lever: the last doubling raised the {name}'s tau by {g:.2f} "
                       f"(more than twice its standard error), so the curve has not flattened at "
                       f"{c['data_tokens']:,} tokens.")
            if common and common[2] > g:
                verdict += (f" Switching to the {HEAD_TITLES.get(common[0], common[0])} is worth more than one more "
                            f"doubling ({common[2]:.2f} vs {g:.2f} tau).")
        elif top1_best >= 0.01:  # tau's few prompts do not resolve it, the held-out set's top-1 does
            verdict = (f"More data is still a lever, by the steadier signal: the last doubling raised the "
                       f"{HEAD_TITLES.get(top1_h, top1_h)}'s depth-1 top-1 on the fixed held-out set by "
                       f"{top1_best * 100:.1f} points, while the best tau gain ({g:+.2f} ± {se:.2f}, {name}) is "
                       f"not resolved by the bench's few prompts (a bench on more prompts would settle it).")
        else:
            verdict = (f"More data of this kind is not the lever: the last doubling moved the best head's tau by "
                       f"{g:+.2f}, within noise (±{se:.2f}) or under 0.05, and held-out top-1 by under a point; the "
                       "head (architecture, recipe, tree) is.")
            if common and common[2] > max(2 * se, 0.05):
                verdict += (f" The {HEAD_TITLES.get(common[0], common[0])} already gives {common[2]:.2f} tau more "
                            "on the same data.")
        out.append(verdict)
    n_ans = state.get("heldout", {}).get("answer_tokens", 0)
    out.append("tau comes from a few prompts (its standard error over them is in the table); the top-1 of the "
               f"fixed held-out set is measured on {n_ans:,} answer tokens and is the steadier signal of the two. "
               "The two heads' top-1 differ slightly in definition (EAGLE-3 counts only positions whose next token "
               "is in its draft vocabulary): compare top-1 along one head's curve, and tau across heads.")
    return out


def reproduce_command(state: dict) -> str:
    """The command that makes every finished cell in ``state``: the last run's command with ``--heads``
    and ``--budgets`` widened to all those cells' heads and budgets (runs of one head or budget at a time
    add cells to the same results.json)."""
    argv = shlex.split(state.get("command", "python experiments/learning_curve.py"))[2:]
    cells = [c for c in state.get("cells", {}).values() if c.get("done")]
    heads = [h for h in HEADS if any(c["head"] == h for c in cells)]
    labels = {c["label"] for c in cells}
    budgets = sorted((lb for lb in labels if lb != "all"), key=int) + (["all"] if "all" in labels else [])
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a in ("--heads", "--budgets"):
            skip = True
        elif not a.startswith(("--heads=", "--budgets=")):
            out.append(a)
    if heads:
        out = ["--heads", ",".join(heads), "--budgets", ",".join(budgets)] + out
    return shlex.join(["python", "experiments/learning_curve.py", *out])


def render_report(state: dict, out: str | Path, report: str | Path) -> str:
    """The markdown page: what was measured, the command, the table, the plot, the reading."""
    out, report = Path(out), Path(report)
    png = out / "learning_curve.png"
    rel = os.path.relpath(png.resolve(), report.resolve().parent)
    s = state.get("settings", {})
    held = state.get("heldout", {})
    lines = ["# Learning curve: data or head?", "",
             "Held-out draft top-1 per depth and tau (60-node dynamic tree: depth 6, top_k 10, 60 tokens; greedy) of "
             "the EAGLE-2 head (experiments/configs/train-smollm2.yaml) and the EAGLE-3 head "
             "(experiments/configs/train-smollm2-eagle3.yaml), each trained with its own recipe on the first shards "
             "of the same self-distilled data up to each budget (`data_tokens`; same epochs, so a bigger budget "
             "trains more steps).", "",
             "- **top-1 per depth, fixed held-out set**: the target's own sampled answers (the data stage's "
             f"settings) to {held.get('prompts', '?')} held-out chat prompts of "
             f"`{s.get('heldout_prompts_file', HELDOUT_PROMPTS)}` "
             f"({held.get('answer_tokens', 0):,} answer tokens; no training prompt among them), the same sequences "
             "for every cell; one number per unrolled draft step (EAGLE-2 recipe: 3, EAGLE-3 training-time test: 7).",
             "- **top-1 per depth, split of its data**: the seeded 3% held out of each budget's own sequences (what "
             "`eagle train` prints); it changes with the budget.",
             f"- **tau**: `eagle.bench` on the first {s.get('prompts_limit', '?')} held-out prompts, "
             f"{s.get('max_new_tokens', '?')} new tokens, greedy; ± its standard error over the prompts; outputs are "
             "checked identical to plain decoding.", "",
             "Command for every cell of the table (resumable: finished cells are skipped; see the docstring of "
             "experiments/learning_curve.py for its cost):", "",
             "```", reproduce_command(state), "```", "",
             format_table(state).rstrip("\n"), "",
             f"![learning curve]({rel})", "",
             "## Reading", ""]
    lines += [f"- {line}" for line in reading(state)]
    return "\n".join(lines) + "\n"


def write_outputs(state: dict, out: str | Path, report: str | Path | None = None) -> list[Path]:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    written = [out / "table.md"]
    (out / "table.md").write_text(format_table(state))
    png = plot(state, out / "learning_curve.png")
    if png:
        written.append(png)
    if report:
        report = Path(report)
        report.parent.mkdir(parents=True, exist_ok=True)
        report.write_text(render_report(state, out, report))
        written.append(report)
    return written


# ------------------------------------------------------------------------------- the real measurements


def load_decode_config(path: str | Path, head_dir: str | Path, name: str):
    """The shipped decoding config at ``path`` with ``drafter.head`` replaced by ``head_dir``."""
    from eagle.config import config_from_dict, read_yaml

    path = ROOT / path if not Path(path).is_absolute() else Path(path)
    data = read_yaml(path) or {}
    data = dict(data, name=name, drafter=dict(data.get("drafter", {}), head=str(Path(head_dir).resolve())))
    return config_from_dict(data, path)


def cell_train_config(base, cell: Cell, epochs: float | None, max_steps: int | None):
    """The training config of ``cell``: ``base`` on the cell's first shards, in the cell's folder; a
    cell of all the data with the recipe's own length is ``base``'s own run (the shipped head): the
    curve's biggest point and the shipped head are then one training, not two."""
    if cell.whole and epochs is None and max_steps is None:
        export = base.export if Path(base.export).is_absolute() else str(ROOT / base.export)
        cfg = dataclasses.replace(base, data_tokens=0, export=export)
        cfg.validate()
        return cfg
    cfg = dataclasses.replace(base, data_tokens=cell.budget, out_dir=str(Path(cell.work) / "train"),
                              export=str(Path(cell.work) / "head"))
    if epochs is not None:
        cfg.epochs = epochs
    if max_steps is not None:
        cfg.max_steps = max_steps
    cfg.validate()
    return cfg


class Measure:
    """The real train / eval / bench of a cell, sharing one loaded target, the fixed held-out
    sequences and the plain-decoding bench records (run once, reused by every cell)."""

    def __init__(self, configs: dict, decode_paths: dict, args, out: Path, heldout_prompts: list[str]):
        self.configs, self.decode_paths, self.args, self.out = configs, decode_paths, args, out
        self.heldout_prompts = heldout_prompts
        self._model = self._tok = self._heldout = self._bench_prompts = None

    def target(self):
        if self._model is None:
            from eagle.models import load_target
            from eagle.train.common import Run

            cfg = next(iter(self.configs.values()))
            print(f"loading the target {cfg.target}", flush=True)
            self._model, self._tok = load_target(cfg.target, device=Run().device)
        return self._model, self._tok

    def train_config(self, cell: Cell):
        return cell_train_config(self.configs[cell.head], cell, self.args.epochs, self.args.max_steps)

    def head_dir(self, cell: Cell) -> Path:
        """Where the cell's trained head is exported."""
        return Path(self.train_config(cell).export)

    def train(self, cell: Cell) -> dict:
        from eagle.train.trainer import train

        model, tok = self.target()
        summary = train(self.train_config(cell), model, tok)
        model.zero_grad(set_to_none=True)  # the shared embedding collected gradients it never uses
        last = summary["eval"][-1] if summary["eval"] else None
        return {"steps": summary["steps"], "train_sequences": summary["train_sequences"],
                "eval_sequences": summary["eval_sequences"], "train_tokens": summary["tokens"], "final_eval": last}

    # -- the fixed held-out set
    def heldout_spec(self) -> dict:
        cfgs = list(self.configs.values())
        gen = {f: getattr(cfgs[0], f) for f in GEN_FIELDS}
        for c in cfgs[1:]:
            other = {f: getattr(c, f) for f in GEN_FIELDS}
            if other != gen:
                diff = ", ".join(f"{f} {gen[f]!r} vs {other[f]!r}" for f in GEN_FIELDS if gen[f] != other[f])
                raise CurveError(f"the heads' training configs make their data differently ({diff}): one fixed "
                                 "held-out set cannot serve both")
        return dict(gen, prompts_sha=fingerprint(self.heldout_prompts), prompts=len(self.heldout_prompts))

    def heldout(self) -> list:
        if self._heldout is None:
            from eagle.train.data import ShardDataset, generate_shards, load_manifest
            from eagle.train.trainer import data_layers

            spec = self.heldout_spec()
            folder = Path(self.args.work).expanduser() / "heldout-data"
            spec_file = folder / "spec.json"
            if spec_file.exists() and json.loads(spec_file.read_text()) != spec:
                raise CurveError(f"{folder} holds a held-out set made with other settings or prompts; delete it "
                                 "or use another --work")
            if load_manifest(folder)["prompts_done"] < len(self.heldout_prompts):
                model, tok = self.target()
                cfg = next(iter(self.configs.values()))
                folder.mkdir(parents=True, exist_ok=True)
                spec_file.write_text(json.dumps(spec, indent=1))
                print(f"self-distilling the fixed held-out set: {len(self.heldout_prompts)} held-out prompts "
                      f"-> {folder}", flush=True)
                generate_shards(model, tok, self.heldout_prompts, folder, batch_size=cfg.gen_batch_size,
                                max_new_tokens=cfg.gen_max_new_tokens, temperature=cfg.gen_temperature,
                                shard_prompts=cfg.shard_prompts, seed=cfg.seed, store_hidden=True,
                                feature_layers=data_layers(cfg, model))
            m = load_manifest(folder)
            self._heldout = ShardDataset(folder, load_hidden=True, load_layers=bool(m.get("has_layers"))).sequences
        return self._heldout

    def heldout_summary(self) -> dict:
        seqs = self.heldout()
        return {"dir": str(Path(self.args.work).expanduser() / "heldout-data"), "prompts": len(seqs),
                "tokens": sum(len(s.input_ids) for s in seqs),
                "answer_tokens": sum(len(s.input_ids) - s.prompt_len for s in seqs)}

    def evaluate(self, cell: Cell) -> dict:
        """Top-1 per depth of the trained head (its last checkpoint = its final weights) on the fixed
        held-out set and on its own data's split, with the trainer's own recipe and metric."""
        import torch

        from eagle.train.common import Run, heldout_split, load_resume_state
        from eagle.train.data import ShardDataset
        from eagle.train.trainer import _evaluate, recipe_for

        cfg = self.train_config(cell)
        model, _ = self.target()
        fixed_set = self.heldout()
        run = Run()
        recipe_cls = recipe_for(cfg)
        data = ShardDataset(cfg.data_dir, load_hidden=recipe_cls.load_hidden and cfg.extraction == "offline",
                            load_layers=recipe_cls.load_layers, max_tokens=cfg.data_tokens).sequences
        train_set, split = heldout_split(data, cfg.heldout_fraction, cfg.seed)
        recipe = recipe_cls(cfg, model, train_set, run.device)  # the same draft vocabulary as in training
        del data, train_set
        resumed = load_resume_state(Path(cfg.out_dir) / "checkpoint", cfg)
        if resumed is None:
            raise CurveError(f"no checkpoint in {cfg.out_dir}/checkpoint to evaluate")
        recipe.module.load_state_dict(resumed[0])
        with torch.no_grad():
            fixed = _evaluate(recipe, fixed_set, cfg, run)
            own = _evaluate(recipe, split, cfg, run) if split else {"loss": float("nan"), "acc": []}
        return {"fixed": fixed, "split": own, "split_sequences": len(split), "checkpoint_step": resumed[1]["step"]}

    # -- tau
    def bench_prompts(self) -> list[str]:
        if self._bench_prompts is None:
            from eagle.prompts import load_prompts

            self._bench_prompts = load_prompts(self.args.prompts, self.args.prompts_limit)
        return self._bench_prompts

    def bench_settings(self) -> dict:
        cfg = next(iter(self.configs.values()))
        return {"target": cfg.target, "prompts_sha": fingerprint(self.bench_prompts()),
                "max_new_tokens": self.args.max_new_tokens}

    def bench(self, cell: Cell) -> dict:
        from eagle.bench import run_bench
        from eagle.decoder import DecodeStats
        from eagle.io import write_json

        model, tok = self.target()
        prompts = self.bench_prompts()
        dcfg = load_decode_config(self.decode_paths[cell.head], self.head_dir(cell), cell.key)
        # plain decoding and transformers' generate run once for all cells: their records are kept
        base_file = self.out / "bench_baseline.json"
        settings = self.bench_settings()
        base = json.loads(base_file.read_text()) if base_file.exists() else {}
        if base.get("settings") != settings:
            base = {"settings": settings, "records": {"plain": {}, "hf generate": {}}}
        mine: dict[int, dict] = {}

        def on_record(method, i, rec):
            if method in base["records"]:
                base["records"][method][str(i)] = rec
                write_json(base, base_file, indent=1)
            else:
                mine[i] = rec

        res = run_bench(model, tok, prompts, [dcfg], self.args.max_new_tokens, 0.0, target_name=settings["target"],
                        records={k: dict(v) for k, v in base["records"].items()}, on_record=on_record)
        run = res["runs"][0]
        taus = [DecodeStats(**mine[i]["stats"]).tau for i in sorted(mine)]
        se = statistics.stdev(taus) / math.sqrt(len(taus)) if len(taus) > 1 else 0.0
        keep = ("alpha", "tokens_per_s", "speedup", "identical_to_plain", "prompts", "accepted_hist",
                "per_depth_acceptance", "mean_tree_nodes", "mismatches")
        return {"tau": run["mean_accepted"], "tau_se": se, "tau_per_prompt": taus,
                "plain_tokens_per_s": res["plain"]["tokens_per_s"], **{k: run[k] for k in keep if k in run}}


def stage_fingerprints(cells: list[Cell], train_fp, eval_fp, bench_fp) -> dict:
    """``{cell key: {stage: fingerprint}}``; each stage's includes the stages before it."""
    fps = {}
    for c in cells:
        t = fingerprint(train_fp(c))
        e = fingerprint([t, eval_fp(c)])
        b = fingerprint([t, bench_fp(c)])
        fps[c.key] = {"train": t, "eval": e, "bench": b}
    return fps


# ---------------------------------------------------------------------------------------------- main


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit status 2
        print(f"learning_curve: error: {message}", file=sys.stderr)
        raise SystemExit(2)


def build_parser() -> argparse.ArgumentParser:
    ap = _Parser(description=__doc__.splitlines()[0])
    ap.add_argument("--heads", default="eagle,eagle3", help=f"comma-separated, of: {', '.join(HEADS)}")
    ap.add_argument("--budgets", default=DEFAULT_BUDGETS,
                    help="comma-separated token budgets (250000, 250k, 2M) or 'all' (every token the data holds)")
    ap.add_argument("--epochs", type=float, default=None, help="override the recipes' epochs (a quick curve)")
    ap.add_argument("--max-steps", type=int, default=None, help="override: train this many steps per cell")
    ap.add_argument("--prompts", default=HELDOUT_PROMPTS, help="held-out chat prompts (bench and fixed set)")
    ap.add_argument("--prompts-limit", type=int, default=8, help="prompts of the tau bench")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--heldout-prompts", type=int, default=0,
                    help="prompts self-distilled into the fixed held-out set (0 = all of --prompts)")
    ap.add_argument("--work", default="~/.cache/eagle/learning_curve", help="heads, checkpoints, held-out data")
    ap.add_argument("--out", default="experiments/results/learning_curve", help="results.json, table.md, plot")
    ap.add_argument("--report", default=None, help="also write this markdown page (e.g. docs/learning_curve.md)")
    ap.add_argument("--plan", action="store_true", help="print the cells and the skipped budgets, run nothing")
    ap.add_argument("--report-only", action="store_true",
                    help="rewrite table, plot and --report from results.json, run nothing")
    return ap


def _main(argv: list[str] | None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    heads = [h.strip() for h in args.heads.split(",") if h.strip()]
    bad = [h for h in heads if h not in HEADS]
    if bad or not heads:
        ap.error(f"--heads: unknown head(s) {', '.join(bad) or '(none)'} (known: {', '.join(HEADS)})")
    heads = list(dict.fromkeys(heads))
    try:
        budgets = parse_budgets(args.budgets)
    except CurveError as e:
        ap.error(f"--budgets: {e}")
    for name in ("prompts_limit", "max_new_tokens"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.heldout_prompts < 0:
        ap.error("--heldout-prompts must be >= 0")
    if args.max_steps is not None and args.max_steps < 1:
        ap.error("--max-steps must be >= 1")
    if args.epochs is not None and not args.epochs > 0:
        ap.error("--epochs must be > 0")
    out = Path(args.out)
    state = load_results(out)
    if args.report_only:
        for p in write_outputs(state, out, args.report):
            print(f"wrote {p}")
        return 0

    from eagle.prompts import load_prompts
    from eagle.train.data import load_manifest
    from eagle.train.trainer import load_train_config, training_prompts

    configs = {h: load_train_config(ROOT / HEADS[h][0] if not Path(HEADS[h][0]).is_absolute() else HEADS[h][0])
               for h in heads}
    for h, c in configs.items():
        if c.head != h:
            raise CurveError(f"{HEADS[h][0]} trains head '{c.head}', not '{h}'")
    manifests = {h: load_manifest(c.data_dir) for h, c in configs.items()}
    suffix = work_suffix(args.epochs, args.max_steps)
    cells, notes = plan_cells(heads, budgets, manifests, Path(args.work).expanduser(), suffix)
    for n in notes:
        print(f"note: {n}", flush=True)
    own = args.epochs is None and args.max_steps is None  # whole-data cells are then the configs' own runs

    def describe(c):
        mine = ", the config's own run" if c.whole and own else ""
        return f"{c.key} ({c.data_tokens:,} tokens, {c.shards} shards{mine})"

    print(f"{len(cells)} cells: " + (", ".join(describe(c) for c in cells) or "none"), flush=True)
    if args.plan or not cells:
        if not cells and not args.plan:
            print("nothing to run (no budget fits the data); the outputs are rewritten from results.json")
            write_outputs(state, out, args.report)
        return 0

    # the fixed held-out set: held-out prompts, none of them a training prompt of any selected head
    held = load_prompts(args.prompts)
    trained = set()
    for c in configs.values():
        trained.update(training_prompts(c))
    kept = [p for p in held if p not in trained]
    if len(kept) < len(held):
        print(f"note: {len(held) - len(kept)} of the held-out prompts are training prompts: left out of the fixed "
              "held-out set", flush=True)
    if args.heldout_prompts:
        kept = kept[: args.heldout_prompts]
    if not kept:
        raise CurveError(f"{args.prompts}: no held-out prompt left for the fixed held-out set")
    m = Measure(configs, {h: HEADS[h][1] for h in heads}, args, out, kept)
    settings = {"heldout_prompts_file": args.prompts, "prompts_limit": args.prompts_limit,
                "max_new_tokens": args.max_new_tokens, "epochs": args.epochs, "max_steps": args.max_steps,
                "heldout": m.heldout_spec()}
    check_settings(state, settings, out)
    state["settings"] = settings
    state["command"] = "python experiments/learning_curve.py" + (" " + shlex.join(argv) if argv else "")
    fps = stage_fingerprints(
        cells,
        train_fp=lambda c: dataclasses.asdict(m.train_config(c)),
        eval_fp=lambda c: m.heldout_spec(),
        bench_fp=lambda c: [load_decode_config(HEADS[c.head][1], m.head_dir(c), c.key).as_dict(),
                            m.bench_settings()])
    out.mkdir(parents=True, exist_ok=True)

    def evaluate(cell):
        state["heldout"] = m.heldout_summary()
        return m.evaluate(cell)

    try:
        run_curve(cells, state, out, fps, m.train, evaluate, m.bench,
                  head_ready=lambda c: m.head_dir(c).is_dir())
    finally:
        written = write_outputs(state, out, args.report)
    print("wrote " + ", ".join(str(p) for p in [out / "results.json", *written]))
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run; any failure is one ``learning_curve: error: ...`` line and a non-zero exit status."""
    if argv is None:
        argv = sys.argv[1:]
    try:
        return _main(argv)
    except KeyboardInterrupt:
        print("learning_curve: interrupted (rerun the same command to resume)", file=sys.stderr)
        return 130
    except SystemExit:
        raise
    except Exception as e:  # noqa: BLE001 - one line, no traceback
        from eagle.config import ConfigError
        from eagle.prompts import PromptFileError

        known = isinstance(e, (CurveError, ConfigError, PromptFileError, OSError, ValueError))
        msg = str(e).splitlines()[0] if str(e) else ""
        print(f"learning_curve: error: {msg if known else f'{type(e).__name__}: {msg}'}", file=sys.stderr)
        return 1


def _stop_on_sigterm() -> None:
    """``timeout`` / a job scheduler's SIGTERM stops like Ctrl-C: the outputs are rewritten on the way out."""
    import signal

    def stop(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)


if __name__ == "__main__":
    from eagle.backends.cpu.allocator import use_fast_allocator

    use_fast_allocator()  # jemalloc where installed: training steps ~2x faster (eagle/allocator.py)
    _stop_on_sigterm()
    raise SystemExit(main())
