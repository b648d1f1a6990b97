"""Command line: ``eagle generate`` (stream one answer, ``--compare`` with plain decoding),
``eagle bench`` (configs vs plain decoding on a prompt set), ``eagle sweep`` (an ablation grid),
``eagle train`` (self-distilled EAGLE head), ``eagle distill`` (a separate draft model) and
``eagle head-info`` (a head's size and cost).

Bad input ends with one ``eagle: error: ...`` line and exit status 2, never a traceback; inputs are
checked before a model is loaded. torch and transformers are imported only inside the commands,
so ``eagle --help`` and argument errors answer at once.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

__all__ = ["main"]


class UsageError(Exception):
    pass


def _checked(kind, ok, rule: str):
    """An argparse type: parse with ``kind``, then require ``ok(value)`` (``rule`` says what failed)."""
    def parse(text: str):
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {'an integer' if kind is int else 'a number'}, got '{text}'") from None
        if not ok(v):
            raise argparse.ArgumentTypeError(f"must be {rule}, got {text}")
        return v
    return parse


_positive_int = _checked(int, lambda v: v >= 1, "a positive integer")


def _name_list(text: str) -> list[str]:
    """An argparse type: a comma-separated list of names (no empty ones)."""
    names = [n.strip() for n in text.split(",")]
    if not all(names):
        raise argparse.ArgumentTypeError(f"expected names separated by commas, got '{text}'")
    return names


_temperature = _checked(float, lambda v: v >= 0, ">= 0")
_top_p = _checked(float, lambda v: 0 < v <= 1, "in (0, 1]")


def _add_sampling(p: argparse.ArgumentParser, default_new: int) -> None:
    p.add_argument("--max-new-tokens", type=_positive_int, default=default_new)
    p.add_argument("--temperature", type=_temperature, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-p", type=_top_p, default=1.0)
    p.add_argument("--target", default="smollm2-135m", help="embedded name or local HF directory")


class _Parser(argparse.ArgumentParser):
    """Argument errors as the one ``eagle: error: ...`` line every other bad input gets (exit 2)."""

    def error(self, message):
        self.exit(2, f"eagle: error: {message} (see '{self.prog} --help')\n")


def _parser() -> argparse.ArgumentParser:
    ap = _Parser(prog="eagle", description="Lossless speculative decoding with tree drafts")
    sub = ap.add_subparsers(dest="cmd", required=True, parser_class=_Parser)

    g = sub.add_parser("generate", help="stream an answer to one chat prompt")
    g.add_argument("--prompt", required=True)
    g.add_argument("--config", help="decoding config YAML (default: plain decoding)")
    g.add_argument("--seed", type=int, default=None)
    g.add_argument("--compare", action="store_true",
                   help="also time plain decoding on the same prompt, interleaved with the drafted runs, "
                        "and print the speedup")
    g.add_argument("-v", "--verbose", action="store_true",
                   help="after the answer: the trees verified (a histogram of depths and node counts), the "
                        "acceptance per depth, and with tree.shape auto the costs and calibration it chose with")
    g.add_argument("--rounds", type=_positive_int, default=2,
                   help="--compare: timed rounds; each runs plain and drafted decoding once, in alternating "
                        "order (default 2: plain-drafted, drafted-plain)")
    _add_sampling(g, 128)

    b = sub.add_parser("bench", help="plain vs configs on a prompt set, as speedup ratios")
    b.add_argument("--prompts", required=True,
                   help="JSONL with a \"prompt\" per line, or Spec-Bench / MT-bench rows (\"category\", "
                        "\"turns\": user messages asked one after another)")
    b.add_argument("--config", action="append", required=True, help="config YAML (repeatable)")
    b.add_argument("--limit", type=_positive_int, default=None, help="use the first N prompts")
    b.add_argument("--per-category", type=_positive_int, default=None,
                   help="use the first N rows of each category (a deterministic stratified subset; before --limit)")
    b.add_argument("--subtasks", type=_name_list, default=None, metavar="A,B,...",
                   help="use only these Spec-Bench subtasks (mt_bench, translation, summarization, qa, "
                        "math_reasoning, rag) or categories; before --per-category")
    b.add_argument("--json", required=True,
                   help="output JSON path; a PNG of tau and speedup per subtask is written beside it, and the "
                        "runs so far to OUT.records.json (rerunning the same command resumes from them)")
    _add_sampling(b, 128)

    t = sub.add_parser("train", help="self-distil data and train an EAGLE head (torchrun for DDP)")
    t.add_argument("--config", required=True, help="training config YAML")
    t.add_argument("--data-only", action="store_true",
                   help="only make (or finish) the self-distilled data of the config, then stop")

    d = sub.add_parser("distill", help="distil a small separate draft model from the target (KL on its distributions)")
    d.add_argument("--config", required=True, help="distillation config YAML")

    s = sub.add_parser("sweep", help="an ablation grid over config keys: one bench, results.json/csv, table.md, plots",
                       description="Expand --base over every --grid axis (KEY=V1,V2,... over any dotted config key, "
                       "'temperature', or 'config' variants; or an ablation YAML under experiments/ablations/), "
                       "validate every cell, run them as one bench and write DIR/results.json, results.csv, "
                       "table.md and plots. Rerunning the same command resumes and skips finished cells.")
    s.add_argument("--base", help="decoding config every cell starts from (default: the ablation file's base)")
    s.add_argument("--grid", action="append", required=True, metavar="KEY=V1,V2,...|FILE.yaml",
                   help="a grid axis, or an ablation YAML file (repeatable)")
    s.add_argument("--prompts", help="JSONL prompts (default: the ablation file's)")
    s.add_argument("--limit", type=_positive_int, default=None, help="use the first N prompts")
    s.add_argument("--per-category", type=_positive_int, default=None,
                   help="use the first N rows of each category (before --limit)")
    s.add_argument("--subtasks", type=_name_list, default=None, metavar="A,B,...",
                   help="use only these Spec-Bench subtasks or categories (before --per-category)")
    s.add_argument("--max-new-tokens", type=_positive_int, default=None, help="default 128")
    s.add_argument("--temperature", type=_temperature, default=None, help="0 = greedy (default)")
    s.add_argument("--top-p", type=_top_p, default=None)
    s.add_argument("--target", default="smollm2-135m", help="embedded name or local HF directory")
    s.add_argument("--x", default=None, help="plots: x axis, 'nodes' (measured tree nodes per step, default) or a grid key")
    s.add_argument("--lines", action="append", default=None,
                   help="plots: one line per value of this key (repeatable; default: the grid keys not on x)")
    s.add_argument("--out", required=True, help="output folder (results.json, results.csv, table.md, *.png)")

    h = sub.add_parser("head-info", help="size and FLOPs per draft step of a head")
    h.add_argument("--head", default="heads/smollm2-135m-subtasks")
    h.add_argument("--target", default="smollm2-135m")

    x = sub.add_parser("export", help="write a head in the official EAGLE-1/2 or EAGLE-3 layout or vLLM's "
                       "(docs/interop.md)",
                       description="Write an EAGLE-1/2 or EAGLE-3 head (ours, or one in the official or vLLM "
                       "layout) as config.json + model.safetensors in another layout. docs/interop.md: what each "
                       "layout holds, fc.bias, embed_tokens, the draft vocabulary, d2t/t2d and the fused layers.")
    x.add_argument("--head", required=True, help="head folder (native, official EAGLE-1/2 or EAGLE-3, or vLLM layout)")
    x.add_argument("--format", required=True, choices=["eagle", "eagle3", "vllm"],
                   help="eagle: official EAGLE-1/2 (SafeAILab/EAGLE); eagle3: official EAGLE-3 "
                        "(LlamaForCausalLMEagle3, also SGLang's; default fused layers only); vllm: vLLM's EAGLE-1 "
                        "(EagleLlamaForCausalLM, no fc bias) or, for an EAGLE-3 head, its Eagle3LlamaForCausalLM")
    x.add_argument("--out", required=True, help="output folder (new, empty, or a previous export to replace)")
    x.add_argument("--full-vocab", action="store_true",
                   help="EAGLE-1/2: export a head with a reduced draft vocabulary anyway: the exported head drafts "
                        "over the full vocabulary (EAGLE-3 layouts keep theirs: d2t/t2d)")
    return ap


def _check_output_file(path: str) -> None:
    """Fail before any work when results could not be written to ``path``."""
    p = Path(path)
    if p.is_dir():
        raise UsageError(f"--json {path} is a folder; name a file")
    parent = next((q for q in p.absolute().parents if q.exists()), None)
    if parent is not None and not parent.is_dir():
        raise UsageError(f"--json {path}: {parent} is not a folder")


def _check_drafters(configs) -> None:
    """Heads and distilled draft models named by the configs are read (config and weight header)
    before the target loads."""
    from .config import ConfigError

    for cfg in configs:
        try:
            cfg.drafter.cls.check_files(cfg.tree, cfg.drafter.options)  # eagle.Drafter.check_files
        except ValueError as e:  # a missing or broken checkpoint, a tree it cannot draft
            raise ConfigError(f"{cfg.name}: {e}") from None


def _quiet_transformers() -> None:
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()


def _generate(args) -> None:
    from .config import DecodeConfig, load_config
    from .decoder import TreeDecoder
    from .models import load_target
    from .prompts import encode_chat

    config = load_config(args.config) if args.config else DecodeConfig()
    if not args.prompt.strip():
        raise UsageError("--prompt is empty")
    _check_drafters([config])
    _quiet_transformers()
    model, tok = load_target(args.target)
    ids = encode_chat(tok, args.prompt)
    dec = TreeDecoder.from_config(model, config)
    kw = dict(temperature=args.temperature, top_p=args.top_p, seed=args.seed)
    shown, text = [], ""

    def stream(new):  # decode everything so far and print only the new suffix (multi-byte safe)
        nonlocal text
        shown.extend(new)
        full = tok.decode(shown, skip_special_tokens=True)
        if full.startswith(text):
            sys.stdout.write(full[len(text):])
            sys.stdout.flush()
            text = full

    def timed(decoder, on_tokens=None):
        t0 = time.perf_counter()
        out = decoder.generate(ids, args.max_new_tokens, on_tokens=on_tokens, **kw)
        return out, time.perf_counter() - t0

    if args.compare or dec.target.runtime.compile:  # first-call costs (compilation) outside the timing
        dec.generate(ids, 4)
    from .bench import compile_times, draft_precisions, format_compile

    if times := compile_times(dec):
        print(format_compile({config.name: times}), file=sys.stderr)
    for name, d in draft_precisions({config.name: dec}, [config]).items():
        print(f"drafter.dtype auto took {d} for {name} (the faster here)", file=sys.stderr)
    out, dt = timed(dec, stream)  # the answer, streamed
    st = out.stats
    line = (f"\n\n[{config.name}] tokens: {st.new_tokens} | tau: {st.tau:.2f} | tok/s: {st.new_tokens / dt:.1f} "
            f"| target forwards: {st.target_forwards + 1} | prompt tokens: {st.prompt_tokens}")
    if args.compare:
        # plain decoding through the same loop, interleaved with drafted runs in alternating order
        # (ABBA...), so a slow spell of the machine hits both alike; the streamed run is the first B
        plain = TreeDecoder(dec.target)
        plain.generate(ids, 4)  # warm-up
        times = {"plain": [], "drafted": [dt]}
        tokens = {"plain": [], "drafted": [st.new_tokens]}
        same = True
        for r in range(args.rounds):
            order = ["plain", "drafted"] if r % 2 else ["drafted", "plain"]
            if r == 0:
                order = ["plain"]  # the drafted half of round 0 was the streamed run
            for which in order:
                o, t = timed(plain if which == "plain" else dec)
                times[which].append(t)
                tokens[which].append(o.stats.new_tokens)
                if which == "plain" and args.temperature == 0:
                    same &= o.tokens == out.tokens
        tps = {k: sum(tokens[k]) / sum(times[k]) for k in times}
        per_round = " ".join(f"{(tokens['drafted'][i] / times['drafted'][i]) / (tokens['plain'][i] / times['plain'][i]):.2f}x"
                             for i in range(args.rounds))
        line += (f" | over {args.rounds} interleaved rounds: plain tok/s {tps['plain']:.1f}, drafted tok/s "
                 f"{tps['drafted']:.1f} | speedup: {tps['drafted'] / tps['plain']:.2f}x (per round: {per_round})")
        if args.temperature == 0:
            line += " (identical to plain)" if same else " (differs from plain)"
    print(line)
    if args.verbose:
        print(format_trees(st, dec.tree_policy))


def _histogram(counts: list[int]) -> str:
    return ", ".join(f"{i}: {c}" for i, c in enumerate(counts) if c) or "-"


def format_trees(stats, policy=None) -> str:
    """``eagle generate -v``: the trees one generation verified, and an auto policy's measurements."""
    lines = [f"tree depth (levels drafted): steps  {_histogram(stats.depth_hist)}",
             f"tree nodes (root included):  steps  {_histogram(stats.nodes_hist)}",
             "acceptance per depth: " + (" ".join(f"{a:.2f}" for a in stats.per_depth_acceptance) or "-")]
    if policy is not None:
        rep = policy.report()
        c = rep["costs"]
        fmt = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
        lines.append("auto tree policy: verify ms per bucket " + ", ".join(f"{b}: {fmt(v)}" for b, v in c["verify_ms"].items())
                     + " | draft ms per level " + " ".join(fmt(v) for v in c["level_ms"])
                     + f" | other ms {fmt(c['overhead_ms'])}")
        lines.append("  acceptance by draft probability: " + ", ".join(
            f"{b['q'][0]:.1f}-{b['q'][1]:.1f} {b['rate']:.2f}" for b in rep["calibration"])
            + f" | x recent factor {rep['recent_factor']:.2f} | children accepted {rep['child_acceptance']:.2f}")
    return "\n".join(lines)


def _bench(args) -> None:
    from .bench import format_categories, format_compile, format_table, plot_categories, run_bench, write_json
    from .config import ConfigError, load_config
    from .models import load_target
    from .prompts import load_questions
    from .sweep import forget_changed, load_state, sweep_settings

    configs = [load_config(c) for c in args.config]  # validate everything before loading a model
    names = [c.name for c in configs]
    if len(set(names)) != len(names):
        raise UsageError(f"two configs share a name: {names}")
    questions = load_questions(args.prompts, args.limit, args.per_category, args.subtasks)
    _check_output_file(args.json)
    _check_drafters(configs)
    # every finished run is kept beside the results, so an interrupted bench resumes where it stopped
    out = Path(args.json)
    state_path = out.with_name(out.stem + ".records.json")
    settings = sweep_settings(questions, args.max_new_tokens, args.top_p, args.target, temperature=args.temperature)
    try:
        state = load_state(state_path, settings)
    except ConfigError:  # other prompts, budget or target: those runs cannot be reused
        print(f"bench: {state_path} holds runs with other settings; starting over", file=sys.stderr)
        state = {"settings": settings, "records": {}, "configs": {}}
    forget_changed(state["records"], state["configs"], configs)  # a config changed since then runs again
    if resumed := sum(map(len, state["records"].values())):
        print(f"bench: resuming from {state_path} ({resumed} runs done earlier)", file=sys.stderr)

    def on_record(method, i, rec):
        state["records"].setdefault(method, {})[str(i)] = rec
        write_json(state, state_path, indent=None)

    _quiet_transformers()
    model, tok = load_target(args.target)
    result = run_bench(model, tok, questions, configs, args.max_new_tokens, args.temperature, args.top_p,
                       target_name=args.target, on_update=lambda r: write_json(r, args.json),
                       on_compiled=lambda c: print(format_compile(c), file=sys.stderr),
                       records=state["records"], on_record=on_record)
    result.update(command="eagle " + " ".join(args.argv), prompt_file=str(args.prompts),
                  per_category=args.per_category, subtasks=args.subtasks, limit=args.limit, resumed_runs=resumed)
    write_json(result, args.json)
    print(format_table(result))
    if blocks := format_categories(result):
        print("\nper subtask (speedup: against the faster plain decoder of the subtask)\n")
        print(blocks)
    png = plot_categories(result, out.with_suffix(".png"))
    print(f"\nwrote {args.json}" + (f", {png}" if png else ""))


def _sweep_spec(args):
    """The sweep from the --grid axes/files and the flags (a flag wins over an ablation file),
    expanded into validated cells."""
    from .sweep import SweepSpec, check_plot_keys, default_lines, expand, is_ablation_file, load_ablation, parse_axis

    spec, axes = SweepSpec(), []
    for g in args.grid:
        if is_ablation_file(g):
            spec, file_axes = spec.updated(load_ablation(g))
            axes += file_axes
        else:
            axes.append(parse_axis(g))
    keys = [a.key for a in axes]
    if args.temperature is not None and "temperature" in keys:
        raise UsageError("--temperature and a 'temperature' grid axis both given")
    for name in ("base", "prompts", "limit", "per_category", "subtasks", "max_new_tokens", "temperature", "top_p", "x", "lines"):
        if getattr(args, name) is not None:
            setattr(spec, name, getattr(args, name))
    if not spec.base:
        raise UsageError("sweep needs --base (or an ablation file with 'base')")
    if not spec.prompts:
        raise UsageError("sweep needs --prompts (or an ablation file with 'prompts')")
    cells = expand(spec.base, axes, spec.temperature, spec.set)
    spec.lines = default_lines(keys, spec.x, spec.lines)
    check_plot_keys(cells, keys, spec.x, spec.lines)
    return spec, keys, cells


def _sweep(args) -> None:
    from .models import load_target
    from .prompts import load_questions
    from .sweep import load_state, run_sweep, sweep_settings, write_outputs

    spec, keys, cells = _sweep_spec(args)  # every cell validated before a model is loaded
    _check_drafters([c.config for c in cells])
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} exists and is not a folder")
    prompts = load_questions(spec.prompts, spec.limit or None, spec.per_category or None, spec.subtasks or None)
    max_new = spec.max_new_tokens or 128
    extra = {"base": spec.base, "prompt_file": spec.prompts, "limit": spec.limit}
    if spec.per_category:  # (absent otherwise, so earlier sweep folders still resume)
        extra["per_category"] = spec.per_category
    if spec.subtasks:
        extra["subtasks"] = spec.subtasks
    load_state(out, sweep_settings(prompts, max_new, spec.top_p, args.target, **extra))  # resumable here?
    print(f"sweep: {len(cells)} cells x {len(prompts)} prompts, {max_new} new tokens -> {out}", file=sys.stderr)
    _quiet_transformers()
    model, tok = load_target(args.target)
    summary = run_sweep(model, tok, prompts, cells, out, max_new, spec.top_p, target_name=args.target,
                        log=lambda m: print(m, file=sys.stderr), **extra)
    summary.update(command="eagle " + " ".join(args.argv), description=spec.description)
    files = write_outputs(summary, out, keys, spec.x, spec.lines)
    print((out / "table.md").read_text())
    print("wrote " + ", ".join(str(f) for f in files))


def _report_training(cfg, summary: dict, final: str, what: str) -> None:
    import json

    print(json.dumps({k: v for k, v in summary.items() if k != "eval"}, indent=1))
    if summary["eval"]:
        print(final.format(**summary["eval"][-1]))
    print(f"{what} written to {cfg.export}")


def _train(args) -> None:
    from .train.trainer import load_train_config, train

    cfg = load_train_config(args.config)
    _quiet_transformers()
    if args.data_only:
        from .train.trainer import make_data

        m = make_data(cfg)
        print(f"{cfg.data_dir}: {m['prompts_done']} prompts, {m['tokens']:,} tokens in {len(m['shards'])} shards")
        return
    _report_training(cfg, train(cfg), "final heldout loss {loss:.4f}, top-1 accuracy per draft step (depth; a Medusa head each) {acc}", "head")


def _distill(args) -> None:
    from .train.distill import distill, load_distill_config

    cfg = load_distill_config(args.config)
    _quiet_transformers()
    _report_training(cfg, distill(cfg), "final heldout KL {kl:.4f}, top-1 agreement with the target "
                     "{top1_agreement:.3f} (answer tokens only: KL {answer_kl:.4f}, top-1 {answer_top1_agreement:.3f})",
                     "draft model")


def _head_info(args) -> None:
    from .heads import check_head, load_head
    from .models import load_target

    from .heads.medusa import is_medusa

    if is_medusa(args.head):
        return _medusa_info(args)
    check_head(args.head)
    _quiet_transformers()
    model, _ = load_target(args.target)
    head = load_head(args.head, model)
    n = sum(p.numel() for p in head.parameters())
    print(f"head: {args.head}  (target {head.config.target}, hidden {head.hidden_size})")
    if head.feature_layers:  # EAGLE-3: own norm and LM head over its draft vocabulary
        vd = head.lm_head.weight.shape[0]
        layer = sum(p.numel() for p in head.midlayer.parameters())
        print(f"EAGLE-3 head fusing target layers {list(head.feature_layers)}")
        print(f"trainable parameters: {n / 1e6:.2f} M  (fc {head.fc.weight.numel() / 1e6:.2f} M, "
              f"layer {layer / 1e6:.2f} M, own LM head {head.lm_head.weight.numel() / 1e6:.2f} M)")
        print(f"draft vocabulary: {vd} tokens (own LM head; d2t maps them to target ids)")
        print(f"FLOPs per drafted token (layer + norm + draft LM head, attention excluded; fc once per "
              f"committed token): {head.flops_per_token() / 1e6:.1f} MFLOP")
        return
    vd = head.draft_vocab.numel() or model.config.vocab_size
    print(f"trainable parameters: {n / 1e6:.2f} M  (fc {head.fc.weight.numel() / 1e6:.2f} M, "
          f"layer {sum(p.numel() for p in head.layer.parameters()) / 1e6:.2f} M)")
    print(f"draft vocabulary: {vd} tokens (shared, frozen target LM head rows: {vd * head.hidden_size / 1e6:.2f} M)")
    print(f"FLOPs per drafted token (fc + layer + draft LM head, attention excluded): "
          f"{head.flops_per_token() / 1e6:.1f} MFLOP")


def _medusa_info(args) -> None:
    from .heads.medusa import check_medusa, load_medusa
    from .models import load_target

    check_medusa(args.head)
    _quiet_transformers()
    model, _ = load_target(args.target)
    heads = load_medusa(args.head, model)
    n = sum(p.numel() for p in heads.parameters())
    print(f"head: {args.head}  (Medusa-1, {heads.num_heads} heads: head k drafts tree depth k; LM head: "
          f"{heads.lm_head_kind})")
    print(f"trainable parameters: {n / 1e6:.2f} M")


def _export(args) -> None:
    from .heads.formats import export_head

    _quiet_transformers()
    for note in export_head(args.head, args.format, args.out, full_vocab=args.full_vocab):
        print(f"note: {note}")
    print(f"wrote {args.out}: {args.format} layout (config.json + model.safetensors)")


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = _parser().parse_args(argv)
    args.argv = argv
    from .config import ConfigError
    from .models import TargetNotFound
    from .prompts import PromptFileError

    try:
        {"generate": _generate, "bench": _bench, "sweep": _sweep, "train": _train, "distill": _distill,
         "head-info": _head_info, "export": _export}[args.cmd](args)
    except (UsageError, ConfigError, TargetNotFound, PromptFileError, ValueError, OSError) as e:
        print(f"eagle: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        kept = {"bench": "rerun the same command to resume; finished runs are kept beside the --json file",
                "sweep": "rerun the same command to resume; finished runs are kept in the --out folder",
                "train": "rerun the same command to resume from the last checkpoint",
                "distill": "rerun the same command to resume from the last checkpoint"}.get(args.cmd)
        print("\neagle: interrupted" + (f" ({kept})" if kept else ""), file=sys.stderr)
        return 130
    return 0


def run() -> int:
    """The ``eagle`` command: :func:`main` under jemalloc where it is installed (eagle/backends/cpu/allocator.py)."""
    from .backends.cpu.allocator import use_fast_allocator

    use_fast_allocator()
    return main()


if __name__ == "__main__":
    sys.exit(run())
