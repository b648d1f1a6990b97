"""Render docs/results.md from the committed results under experiments/results/ (no model runs).

    python experiments/results_report.py [--results experiments/results] [--out docs/results.md]

The page holds what the project measures now, each with the command that measured it: the machine,
the bench table of `make bench` (bench-smollm2.json), the cost of a verification forward against
the tree size (cost_curve.csv / .md / .png), the run beside the official EAGLE code
(peer_official_eagle*.json), the heads' learning curve (learning_curve/results.json), the draft
vocabulary's reach (draft_vocab_coverage.json) and the Medusa heads against the EAGLE head
(medusa-vs-eagle.json). Whatever a rerun writes to those files is what the page shows, so
`make results` after `make bench` (or any of the other commands) is the whole update.
"""
from __future__ import annotations

import argparse
import csv
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

MAKE_BENCH = "make bench"
PEER = "peer_official_eagle.json"
PEER_AFTER = "peer_official_eagle_cpu.json"
# files whose writer records no command line of its own: the command that wrote the committed copy
COMMANDS = {
    "medusa-vs-eagle.json": "eagle bench --prompts experiments/data/prompts/heldout.jsonl --limit 8 \\\n"
                            "    --config experiments/configs/medusa.yaml --config experiments/configs/eagle2-cpu.yaml \\\n"
                            "    --json experiments/results/medusa-vs-eagle.json",
    "draft_vocab_coverage.json": "python experiments/draft_vocab_coverage.py --head heads/smollm2-135m-eagle3 \\\n"
                                 "    --json experiments/results/draft_vocab_coverage.json",
}


class ReportError(ValueError):
    """A results file that is missing or not what its section reads; the message names the file."""


def _load(path: Path) -> dict:
    if not path.is_file():
        raise ReportError(f"{path} not found")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ReportError(f"{path} is not JSON ({e})") from None


def _script(name: str) -> str:
    """Where an experiment script lives now (speed probes sit under experiments/perf/)."""
    for folder in ("experiments/perf", "experiments"):
        if (ROOT / folder / name).is_file():
            return f"{folder}/{name}"
    return f"experiments/{name}"


def _identical(run: dict) -> str:
    """`n/N`, and for a reduced-precision config its count against plain decoding in that precision."""
    text = f"{run['identical_to_plain']}/{run['prompts']}"
    if run.get("plain_twin"):
        text += f" ({run['identical_to_plain_twin']}/{run['prompts']} vs {run['plain_twin']})"
    return text


# ---------------------------------------------------------------------------------------------- bench


def bench_section(b: dict) -> list[str]:
    plain = b["plain"]
    hf = plain["hf_tokens_per_s"]
    base = max(plain["tokens_per_s"], hf)
    out = ["## Bench: every shipped config against plain decoding and `generate`", "",
           f"Target `{b['target']}`, {b['device']}, greedy, {b['max_new_tokens']} new tokens, "
           f"{plain['prompts']} chat prompts (`experiments/prompts/chat-small.jsonl`); prompts outer and methods "
           "inner in one process, so a slow spell of the machine hits every method alike. Each config is "
           "`experiments/configs/<config>.yaml`.", "",
           "```", b.get("command", MAKE_BENCH), "```", "",
           "Columns: tau = tokens per target forward in the decode phase; alpha = the share of drafted tokens "
           "accepted; **speedup** = tok/s over the faster of our plain loop and transformers' `generate`; "
           "vs generate = over `generate` alone; identical = prompts whose output equals plain greedy decoding "
           "(bf16 configs also against plain decoding in bf16); draft / verify = ms per target forward.", "",
           "| config | tau | alpha | tok/s | speedup | vs generate | identical | tree nodes | draft ms | verify ms |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
           f"| transformers `generate` | 1.00 | - | {hf:.2f} | {hf / base:.2f}x | 1.00x | - | 1.0 | - | - |",
           f"| plain loop (eager) | 1.00 | - | {plain['tokens_per_s']:.2f} | {plain['tokens_per_s'] / base:.2f}x | "
           f"{plain['speedup_vs_hf']:.2f}x | {plain['identical_to_hf']}/{plain['prompts']} vs generate | 1.0 | - | - |"]
    for r in b["runs"]:
        alpha = f"{r['alpha']:.2f}" if r["mean_tree_nodes"] > 1 else "-"
        out.append(f"| {r['config']} | {r['mean_accepted']:.2f} | {alpha} | {r['tokens_per_s']:.2f} | "
                   f"{r['speedup']:.2f}x | {r['speedup_vs_hf']:.2f}x | {_identical(r)} | {r['mean_tree_nodes']:.1f} | "
                   f"{r['step_ms']['draft']:.1f} | {r['step_ms']['verify']:.1f} |")
    out.append("")
    depth = [f"{r['config']} " + " / ".join(f"{a:.2f}" for a in r["per_depth_acceptance"])
             for r in b["runs"] if r.get("per_depth_acceptance")]
    if depth:
        out += ["Acceptance per depth (the share of steps whose tree reached depth d that accepted a token "
                "there): " + "; ".join(depth) + ".", ""]
    margins = sorted({m["logit_margin"] for r in b["runs"] for m in r.get("mismatches_vs_twin", [])})
    if margins:
        out += ["Where a bf16 config leaves plain bf16 decoding, plain bf16's own top-1 / top-2 logit margin at "
                f"that token was {', '.join(f'{m:g}' for m in margins)} (0 is an exact tie; the one-token and the "
                "tree step's products round differently, which decides near-ties). Lossless claims hold for "
                "float32.", ""]
    if b.get("compile_s"):
        comp = "; ".join(f"{name} " + ", ".join(f"{k} {v:.1f} s" for k, v in buckets.items())
                         for name, buckets in b["compile_s"].items())
        out += [f"Compiling, once per process (warm inductor cache): {comp}.", ""]
    if b.get("draft_dtype_auto"):
        out += ["`drafter.dtype: auto` chose: " + ", ".join(f"{k} {v}" for k, v in b["draft_dtype_auto"].items())
                + ".", ""]
    return out


# ----------------------------------------------------------------------------------------- cost curve


def cost_curve_section(stem: Path) -> list[str]:
    csv_path, md_path = stem.with_suffix(".csv"), stem.with_suffix(".md")
    if not csv_path.is_file() or not md_path.is_file():
        raise ReportError(f"{csv_path} or {md_path} not found")
    rows = list(csv.DictReader(csv_path.open()))
    if not rows or "forward_ms" not in rows[0]:
        raise ReportError(f"{csv_path} is not a cost curve (no forward_ms column)")
    header = md_path.read_text().splitlines()[0]
    bw = re.search(r"read bandwidth ([\d.]+) GB/s", header)
    reps = re.search(r"median of (\d+)", header)
    paths = list(dict.fromkeys(r["path"] for r in rows))
    sizes = list(dict.fromkeys(r["tree_tokens"] for r in rows))
    cmd = (f"python {_script('cost_curve.py')} --paths {','.join(paths)} --sizes {','.join(sizes)}"
           + (f" --repeats {reps.group(1)}" if reps else "")
           + ("" if stem.name == "cost_curve" else f" --name {stem.name}"))
    out = ["## Cost of a verification forward against the tree size", "",
           "One target forward over a tree of T tokens after a 300-token prefix, relative to one token: what a "
           "larger tree costs before it pays in tau. The floor is reading every weight once at the machine's "
           "measured read bandwidth.", "", "```", cmd, "```", "", f"{header}.", "",
           "| tree tokens | " + " | ".join(sizes) + " |", "|---|" + "---:|" * len(sizes)]
    for p in paths:
        mine = {r["tree_tokens"]: r for r in rows if r["path"] == p}
        out.append(f"| {p}, ms | " + " | ".join(f"{float(mine[s]['forward_ms']):.1f}" if s in mine else "" for s in sizes) + " |")
        out.append(f"| {p}, relative to 1 token | "
                   + " | ".join(f"{float(mine[s]['relative_to_1']):.2f}" if s in mine else "" for s in sizes) + " |")
        out.append(f"| {p}, share of the floor | "
                   + " | ".join(f"{100 * float(mine[s]['share_of_floor']):.0f}%" if s in mine else "" for s in sizes) + " |")
    out.append("")
    if stem.with_suffix(".png").is_file():
        out += [f"![cost curve](../{stem.with_suffix('.png').relative_to(ROOT).as_posix()})", ""]
    return out, (float(bw.group(1)) if bw else None)


# ------------------------------------------------------------------------------------------ peer run


def _peer_table(p: dict) -> list[str]:
    ours, official = p["plain"]["ours"], p["plain"]["official"]
    out = ["```", p["command"], "```", "",
           f"{p['device']}; the first {p['limit']} prompts of `{p['prompts']}`, "
           f"greedy, {p['max_new_tokens']} new tokens. Plain greedy: ours {ours['tokens_per_s']:.2f} tok/s "
           f"(`generate` {ours['hf_tokens_per_s']:.2f}), the official `naivegenerate` {official['tokens_per_s']:.2f}; "
           f"the official plain output equals ours on {official['identical_to_our_plain']}/{official['prompts']}.", "",
           "| tree | tau ours / official | tok/s ours / official | ours / official | identical ours / official | "
           "draft ms ours / official | verify ms ours / official |",
           "|---|---:|---:|---:|---:|---:|---:|"]
    for t in p["trees"]:
        o, f = t["ours"], t["official"]
        out.append(f"| {t['tree']} | {o['tau']:.3f} / {f['tau']:.3f} | {o['tokens_per_s']:.2f} / {f['tokens_per_s']:.2f} | "
                   f"**{t['tok_s_ratio']:.2f}x** | {o['identical_to_plain']}/{o['prompts']} / "
                   f"{f['identical_to_plain']}/{f['prompts']} | {o['step_ms']['draft']:.1f} / {f['step_ms']['draft']:.1f} | "
                   f"{o['step_ms']['verify']:.1f} / {f['step_ms']['verify']:.1f} |")
    for e in p.get("extra", []):
        out.append(f"| {e['config']} (ours only) | {e['tau']:.3f} | {e['tokens_per_s']:.2f} | | "
                   f"{e['identical_to_plain']}/{e['prompts']} | {e['step_ms']['draft']:.1f} | {e['step_ms']['verify']:.1f} |")
    return out + [""]


def peer_section(results: Path) -> list[str]:
    p = _load(results / PEER)
    out = ["## Beside the official EAGLE code", "",
           "Our exported EAGLE-2 head in the official implementation (SafeAILab/EAGLE, `EaModel.eagenerate`) and "
           "in ours, the same trees, prompts interleaved A/B then B/A; setup, counting and the differences "
           "explained: [peer_official_eagle.md](peer_official_eagle.md).", ""] + _peer_table(p)
    if (results / PEER_AFTER).is_file():
        out += ["The eagle2-cpu tree again after the drafter's LM-head product took the measured orientation per "
                "row count:", ""] + _peer_table(_load(results / PEER_AFTER))
    return out


# ------------------------------------------------------------------------------------ learning curve


def learning_curve_section(folder: Path) -> list[str]:
    lc = _load(folder / "results.json")
    titles = {"eagle": "EAGLE-2 head", "eagle3": "EAGLE-3 head"}
    cells = sorted((c for c in lc["cells"].values() if c.get("done")), key=lambda c: (c["head"], c["data_tokens"]))
    out = ["## Learning curve of the heads", "",
           "Each head's recipe on the first shards of the same self-distilled data up to each budget; top-1 at "
           "draft depths 1-3 on a fixed held-out set (the target's answers to the 200 held-out prompts), tau on the "
           "60-node tree (8 held-out prompts, ± its standard error over them). The all-data cells are the shipped "
           "heads (`heads/smollm2-135m`, `heads/smollm2-135m-eagle3`). Reading and plot: "
           "[learning_curve.md](learning_curve.md).", "",
           "```", f"python {_script('learning_curve.py')} --heads eagle,eagle3 --budgets 250000,500000,1000000,all "
           "--report docs/learning_curve.md", "```", "",
           "| head | tokens | steps | top-1 depth 1 / 2 / 3 | tau | identical |", "|---|---:|---:|---|---:|---:|"]
    out += [_curve_row(c, titles.get(c["head"], c["head"])) for c in cells] + [""]
    # other curves of the same command with other settings, in folders beside it (e.g. more epochs)
    for extra in sorted(folder.parent.glob(folder.name + "_*/results.json")):
        more = json.loads(extra.read_text())
        epochs = more.get("settings", {}).get("epochs")
        label = f", {epochs:g} epochs" if epochs else ""
        out += [f"The same on other settings (`{extra.parent.relative_to(ROOT).as_posix() if extra.is_relative_to(ROOT) else extra.parent.name}`):",
                "", "```", more["command"], "```", "",
                "| head | tokens | steps | top-1 depth 1 / 2 / 3 | tau | identical |", "|---|---:|---:|---|---:|---:|"]
        out += [_curve_row(c, titles.get(c["head"], c["head"]) + label)
                for c in sorted(more["cells"].values(), key=lambda c: c["data_tokens"]) if c.get("done")] + [""]
    return out


def _curve_row(c: dict, title: str) -> str:
    acc = " / ".join(f"{a:.3f}" for a in c["eval"]["fixed"]["acc"][:3])
    bench = c["bench"]
    return (f"| {title} | {c['data_tokens']:,} | {c['train']['steps']:,} | {acc} | "
            f"{bench['tau']:.2f} ± {bench['tau_se']:.2f} | {bench['identical_to_plain']}/{bench['prompts']} |")


# ------------------------------------------------------------------------------------ the rest


def vocab_section(results: Path) -> list[str]:
    v = _load(results / "draft_vocab_coverage.json")
    sizes = list(v["coverage"])
    out = ["## How far an 8k draft vocabulary reaches", "",
           "Both shipped heads draft over the most frequent tokens of their training data, so a draft step never "
           "proposes a token outside them. The share of the target's greedy choices inside the N most frequent "
           f"ids, at the {v['heldout_positions']:,} answer positions of the fixed held-out set:", "",
           "```", COMMANDS["draft_vocab_coverage.json"], "```", "",
           "| draft vocabulary | " + " | ".join(f"{int(s):,}" for s in sizes) + " |", "|---|" + "---:|" * len(sizes),
           "| target argmax inside it | " + " | ".join(f"{v['coverage'][s]:.3f}" for s in sizes) + " |", ""]
    if v.get("head"):
        h = v["head"]
        out += [f"`{h['path']}`'s own {h['draft_vocab']:,} ids reach {h['coverage']:.3f} ({h['same_ids']:,} of them are "
                "the most frequent ones above): every draft step is capped there by the vocabulary alone.", ""]
    return out


def medusa_section(results: Path) -> list[str]:
    m = _load(results / "medusa-vs-eagle.json")
    out = ["## Medusa heads against the EAGLE head", "",
           f"{m['device']}, greedy, {m['max_new_tokens']} new tokens, {m['plain']['prompts']} held-out prompts "
           "(every shipped config, Medusa included, on Spec-Bench: [specbench.md](specbench.md)).", "",
           "```", COMMANDS["medusa-vs-eagle.json"], "```", "",
           "| config | tau | speedup | identical | tree nodes | draft ms | verify ms | acceptance per depth |",
           "|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in m["runs"]:
        out.append(f"| {r['config']} | {r['mean_accepted']:.2f} | {r['speedup']:.2f}x | {_identical(r)} | "
                   f"{r['mean_tree_nodes']:.1f} | {r['step_ms']['draft']:.1f} | {r['step_ms']['verify']:.1f} | "
                   + " / ".join(f"{a:.2f}" for a in r["per_depth_acceptance"]) + " |")
    out += ["", "A Medusa head guesses the token k steps ahead without seeing the drafted tokens before it; the "
            "EAGLE head reads each drafted token and its own predicted feature, which shows past depth 1.", ""]
    return out


def render(results: Path) -> str:
    bench = _load(results / "bench-smollm2.json")
    curve, bandwidth = cost_curve_section(results / "cost_curve")
    peer = _load(results / PEER)
    machine = ["## Machine", "",
               "Each result records the device it ran on; ratios are compared only within one run.", "",
               "| result | device, as recorded | measured read bandwidth |", "|---|---|---:|",
               f"| bench (`make bench`) | {bench['device']} | |",
               f"| cost curve | {_curve_device(results / 'cost_curve.md')} | "
               + (f"{bandwidth:.1f} GB/s |" if bandwidth else "not recorded |")]
    spec = results / "specbench.json"
    if spec.is_file():
        machine.append(f"| Spec-Bench ([specbench.md](specbench.md)) | {_load(spec)['device']} | |")
    machine += [f"| peer run | {peer['device']} | |", "",
                "(The read bandwidth: 512 MB over the median time of summing a float32 tensor of that size with "
                "every thread, measured in the cost curve's own run.)", ""]
    lines = ["# Results", "",
             "What the project measures now, rendered by `make results` (`python experiments/results_report.py`) "
             "from the committed files under `experiments/results/`; each section names the command that wrote its "
             "data. Every speed is a ratio against plain decoding measured in the same process on the same prompts. "
             "The CPU backend's design decisions and their measurements: [cpu-backend.md](cpu-backend.md); "
             "the standard ablations: [ablations.md](ablations.md); Spec-Bench: [specbench.md](specbench.md); the "
             "tree policy: [tree-policy.md](tree-policy.md); the draft head's acceptance: [acceptance.md](acceptance.md); the lesson's measurements: [lesson.md](lesson.md).", ""]
    lines += machine + bench_section(bench) + curve + peer_section(results)
    lines += learning_curve_section(results / "learning_curve") + vocab_section(results) + medusa_section(results)
    return "\n".join(lines).rstrip("\n") + "\n"


def _curve_device(md: Path) -> str:
    """The cost curve's header names the target, threads and prefix (and the device where recorded)."""
    head = md.read_text().splitlines()[0]
    inside = re.search(r"\(([^)]*)\)", head)
    return inside.group(1) if inside else head


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", default=str(ROOT / "experiments/results"), help="the committed results folder")
    ap.add_argument("--out", default=str(ROOT / "docs/results.md"))
    args = ap.parse_args(argv)
    try:
        text = render(Path(args.results))
    except (ReportError, KeyError, TypeError, ValueError) as e:
        kind = "missing field " if isinstance(e, KeyError) else ""
        print(f"error: {kind}{e}", file=sys.stderr)
        return 2
    Path(args.out).write_text(text)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
