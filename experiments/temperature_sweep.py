"""Failure modes of speculation: acceptance, tau and wall-clock speedup vs sampling temperature.

For every temperature one `eagle bench` run (plain decoding, transformers generate, and every
config twice: as written and with the automatic fallback of eagle/fallback.py switched on) on the
same prompts; speedups are ratios against plain decoding in that same run. Writes
``<out>.json`` (all bench results, rewritten after every temperature; a rerun skips temperatures
already measured with the same settings), ``<out>.md`` (the table) and ``<out>.png`` (the plot).

    python experiments/temperature_sweep.py --prompts experiments/data/prompts/heldout.jsonl --limit 6 \\
        --max-new-tokens 96 --temperatures 0 0.7 1.0 1.5 \\
        --config experiments/configs/chain-draft-model.yaml --config experiments/configs/ngram.yaml \\
        --config experiments/configs/eagle2-cpu.yaml --out experiments/results/temperature_sweep
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

FALLBACK = "+fallback"
FLOOR = 0.95  # the fallback's promise: never slower than this fraction of plain decoding


def with_fallback(cfg):
    from eagle.fallback import FallbackConfig

    return replace(cfg, name=cfg.name + FALLBACK, fallback=FallbackConfig(enabled=True))


def rows_of(sweep: dict) -> list[dict]:
    rows = []
    for t, res in sorted(sweep["results"].items(), key=lambda kv: float(kv[0])):
        for r in res["runs"]:
            rows.append({"temperature": float(t), "config": r["config"], "alpha": r.get("alpha", 0.0),
                         "tau": r["mean_accepted"], "speedup": r["speedup"], "tokens_per_s": r["tokens_per_s"],
                         "plain_tokens_per_s": res["plain"]["tokens_per_s"], "plain_steps": r["plain_steps"],
                         "identical": r["identical_to_plain"] if float(t) == 0 else None, "prompts": r["prompts"]})
    return rows


def table(sweep: dict) -> str:
    s = sweep["settings"]
    lines = [f"prompts: {s['prompts']} (first {s['limit']}), {s['max_new_tokens']} new tokens, top_p {s['top_p']}; "
             "speedup = tokens/s over the faster of plain decoding and transformers generate in the same run",
             "", "| temperature | config | alpha | tau | tok/s | plain tok/s | speedup | plain steps |",
             "|---:|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows_of(sweep):
        lines.append(f"| {r['temperature']:.1f} | {r['config']} | {r['alpha']:.2f} | {r['tau']:.2f} | "
                     f"{r['tokens_per_s']:.2f} | {r['plain_tokens_per_s']:.2f} | {r['speedup']:.2f}x | "
                     f"{r['plain_steps']} |")
    fb = [r for r in rows_of(sweep) if r["config"].endswith(FALLBACK)]
    if fb:
        worst = min(fb, key=lambda r: r["speedup"])
        lines += ["", f"fallback runs: worst speedup {worst['speedup']:.2f}x ({worst['config']} at temperature "
                  f"{worst['temperature']:.1f}); floor {FLOOR}x: {'met' if worst['speedup'] >= FLOOR else 'NOT met'}"]
    return "\n".join(lines)


def plot(sweep: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = rows_of(sweep)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    names = [n for n in dict.fromkeys(r["config"] for r in rows)]
    for name in names:
        pts = [r for r in rows if r["config"] == name]
        style = "--" if name.endswith(FALLBACK) else "-"
        axes[0].plot([r["temperature"] for r in pts], [r["speedup"] for r in pts], style, marker="o", label=name)
        if not name.endswith(FALLBACK):
            axes[1].plot([r["temperature"] for r in pts], [r["alpha"] for r in pts], marker="o", label=name)
    axes[0].axhline(1.0, color="k", lw=0.8)
    axes[0].axhline(FLOOR, color="r", lw=0.8, ls=":", label=f"{FLOOR}x floor")
    axes[0].set(xlabel="temperature", ylabel="speedup vs plain (same run)", title="wall clock")
    axes[1].set(xlabel="temperature", ylabel="alpha (token acceptance)", title="acceptance", ylim=(0, 1))
    for ax in axes:
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", required=True)
    ap.add_argument("--limit", type=int, default=6)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 0.7, 1.0, 1.5])
    ap.add_argument("--config", action="append", required=True)
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--out", default="experiments/results/temperature_sweep")
    args = ap.parse_args(argv)

    from eagle.bench import run_bench, write_json
    from eagle.config import ConfigError, load_config
    from eagle.models import load_target
    from eagle.prompts import load_prompts

    try:
        configs = [load_config(c) for c in args.config]
        prompts = load_prompts(args.prompts, args.limit)
    except (ConfigError, ValueError, OSError) as e:
        print(f"temperature_sweep: error: {e}", file=sys.stderr)
        return 2
    configs = [c for cfg in configs for c in (cfg, with_fallback(cfg))]
    settings = {"prompts": args.prompts, "limit": args.limit, "max_new_tokens": args.max_new_tokens,
                "top_p": args.top_p, "configs": [c.name for c in configs], "target": args.target}
    out = Path(args.out)
    js = out.with_suffix(".json")
    sweep = json.loads(js.read_text()) if js.exists() else {}
    if sweep.get("settings") != settings:  # other settings: start over
        sweep = {"settings": settings, "results": {}}
    model, tok = load_target(args.target)
    for t in args.temperatures:
        if str(t) in sweep["results"]:
            print(f"temperature {t}: already measured, skipped")
            continue
        sweep["results"][str(t)] = run_bench(model, tok, prompts, configs, args.max_new_tokens, t, args.top_p,
                                             target_name=args.target)
        write_json(sweep, js)
    out.with_suffix(".md").write_text(table(sweep) + "\n")
    plot(sweep, out.with_suffix(".png"))
    print(table(sweep))
    print(f"\nwrote {js}, {out.with_suffix('.md')}, {out.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
