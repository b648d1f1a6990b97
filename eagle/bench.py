"""``eagle bench``: plain decoding, transformers' own ``generate`` and every config on the same
prompts, in one process, reported as ratios against the faster plain decoder."""
from __future__ import annotations

import dataclasses
import gc
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm import tqdm

from .config import DecodeConfig
from .decoder import DecodeStats, TreeDecoder
from .io import save_figure, write_json
from .prompts import Question, encode_conversation

__all__ = ["run_bench", "format_table", "format_categories", "format_compile", "device_name", "write_json", "as_questions",
           "plot_categories"]


def device_name(device: torch.device, cpuinfo: str = "/proc/cpuinfo") -> str:
    """The GPU's name, or the CPU's model (family and model numbers, the AVX-512 / AMX flags that
    decide the CPU backend's choices) and the threads used."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    what = platform.processor() or platform.machine()
    try:
        info = {}
        for line in open(cpuinfo).read().split("\n\n")[0].splitlines():
            key, _, value = line.partition(":")
            info[key.strip()] = value.strip()
        flags = set(info.get("flags", "").split())
        isa = [f for f in ("avx512f", "avx512_bf16", "amx_bf16") if f in flags] or [f for f in ("avx2", "fma") if f in flags]
        what = (f"{info.get('model name', what)}, family {info.get('cpu family', '?')} model {info.get('model', '?')}"
                + (f", {' '.join(isa)}" if isa else ""))
    except OSError:
        pass
    return f"cpu ({what}, {torch.get_num_threads()} threads)"


@dataclass
class _Run:
    tokens: list[list[int]] = field(default_factory=list)
    seconds: float = 0.0
    stats: DecodeStats = field(default_factory=DecodeStats)

    @property
    def tokens_per_s(self) -> float:
        return sum(map(len, self.tokens)) / self.seconds if self.seconds else 0.0

    @property
    def step_s(self) -> float:
        """Mean seconds of one decode-phase step (draft + verify + bookkeeping; 0 without stats)."""
        return self.stats.decode_s / self.stats.target_forwards if self.stats.target_forwards else 0.0

    def add(self, record: dict) -> None:
        """Add one prompt's record (see :func:`run_bench`)."""
        self.tokens.append(record["tokens"])
        self.seconds += record["seconds"]
        if record.get("stats") is not None:
            # one record = one generation (records saved before the field existed lack it)
            self.stats.merge(DecodeStats(**{"generations": 1, **record["stats"]}))

    @classmethod
    def of(cls, records: list[dict]) -> "_Run":
        run = cls()
        for r in records:
            run.add(r)
        return run


def _hf_generate(model, ids, max_new_tokens, temperature, top_p, seed, eos):
    kwargs = dict(max_new_tokens=max_new_tokens, eos_token_id=sorted(eos) or None,
                  pad_token_id=sorted(eos)[0] if eos else None)
    if temperature == 0:
        kwargs.update(do_sample=False)
    else:
        torch.manual_seed(seed)
        kwargs.update(do_sample=True, temperature=temperature, top_p=top_p, top_k=0)
    out = model.generate(ids[None].to(model.device), **kwargs)
    return out[0, len(ids):].tolist()


def _margin(model, ids: torch.Tensor, prefix: list[int]) -> float:
    """Target's top-1 minus top-2 logit after ``ids + prefix``: how close the argmax was to a tie."""
    full = torch.cat([ids, torch.tensor(prefix, dtype=torch.long)])[None].to(model.device)
    with torch.no_grad():
        top = model(full).logits[0, -1].float().topk(2).values
    return float(top[0] - top[1])


def _first_diff(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def warm_ups(dec, encoded: list, max_new_tokens: int, lengths: list[int] | None = None) -> list[tuple]:
    """``(prompt ids, cache room)`` for one short warm-up generation per cache capacity that
    ``max_new_tokens``-token generations of ``encoded`` will allocate on ``dec``. ``lengths``: the
    prompt lengths the timed generations will have where they differ from ``encoded`` (a later turn of
    a conversation is longer than its first; the warm-up runs the first with the later one's room)."""
    by_capacity: dict[int, tuple] = {}
    for ids, n in zip(encoded, lengths or [len(ids) for ids in encoded]):
        room = dec.cache_room(n, max_new_tokens)
        by_capacity.setdefault(dec.target.cache_capacity(room), (ids, room))
    return [by_capacity[c] for c in sorted(by_capacity)]


def as_questions(prompts) -> list[Question]:
    """Questions from a list of :class:`~eagle.prompts.Question` or plain prompt strings (one turn each)."""
    return [p if isinstance(p, Question) else Question((p,)) for p in prompts]


class _Conversations:
    """The prompt ids of every turn of every question. Turn k is asked after the conversation so far:
    the earlier user turns and plain decoding's answers to them, so every method answers the same
    turns and each turn's output can be compared with plain decoding's."""

    def __init__(self, tokenizer, questions: list[Question], max_new_tokens: int):
        self.tokenizer, self.questions = tokenizer, questions
        self.items = [(qi, k) for qi, q in enumerate(questions) for k in range(len(q.turns))]  # one per turn
        self.index = {item: i for i, item in enumerate(self.items)}
        self.first = [encode_conversation(tokenizer, q.turns[:1]) for q in questions]
        # a bound on each turn's prompt length (earlier answers at the full token budget), for the
        # context check and the warm-ups' cache rooms
        self.bound = [len(self.first[qi]) if k == 0 else
                      len(encode_conversation(tokenizer, self.questions[qi].turns[: k + 1], ["."] * k)) + k * max_new_tokens
                      for qi, k in self.items]

    def ids(self, i: int, plain: dict) -> torch.Tensor:
        """Prompt ids of item ``i``; ``plain``: plain decoding's records by item (earlier turns' answers)."""
        qi, k = self.items[i]
        if k == 0:
            return self.first[qi]
        answers = [self.tokenizer.decode(plain[self.index[qi, j]]["tokens"], skip_special_tokens=True)
                   for j in range(k)]
        return encode_conversation(self.tokenizer, self.questions[qi].turns[: k + 1], answers)


def run_bench(model, tokenizer, prompts: list, configs: list[DecodeConfig], max_new_tokens: int = 128,
              temperature: float = 0.0, top_p: float = 1.0, target_name: str = "", on_update=None,
              on_compiled=None, records: dict | None = None, on_record=None) -> dict:
    """Run the benchmark and return the result dict (its fields: docs/architecture.md, "The bench JSON").

    ``prompts``: strings (one-turn questions) or :class:`~eagle.prompts.Question` rows (several
    turns, a category); every turn is one timed generation of up to ``max_new_tokens`` tokens (an
    *item*, numbered in question order), and turn k is asked after the earlier turns and plain
    decoding's answers to them.
    ``on_update(result)`` is called after each finished question, so a caller can save partial
    results; ``on_compiled({config: {bucket: seconds}})`` once after the warm-up when any step was
    compiled. Resuming: ``records`` maps a method ("plain", "hf generate" or a config name) to
    ``{item index: record}`` of runs done earlier; those are not run again (a method done on every
    item is not even built). ``on_record(method, index, record)`` is called after each run with a
    JSON-serializable ``{"tokens", "seconds", "stats"}``.
    """
    questions = as_questions(prompts)
    conv = _Conversations(tokenizer, questions, max_new_tokens)
    plain_dec = TreeDecoder(model, None)
    eos = plain_dec.eos
    for (qi, k), n in zip(conv.items, conv.bound):  # fail fast, before any timing, on turns that cannot fit
        if n + max_new_tokens > plain_dec.target.max_positions:
            raise ValueError(f"question {qi + 1} turn {k + 1}: a prompt of up to {n} tokens + {max_new_tokens} new "
                             f"tokens exceeds the model's context of {plain_dec.target.max_positions}")
    n = len(conv.items)
    done = {name: {int(i): r for i, r in (records or {}).get(name, {}).items() if int(i) < n}
            for name in ["plain", "hf generate"] + [c.name for c in configs]}
    todo = lambda name: len(done[name]) < n  # noqa: E731
    result = {"target": target_name, "device": device_name(plain_dec.target.device),
              "max_new_tokens": max_new_tokens, "temperature": temperature, "top_p": top_p,
              "plain": {}, "runs": []}
    gen_kw = dict(temperature=temperature, top_p=top_p)
    decoders = {cfg.name: TreeDecoder.from_config(model, cfg, eos_token_id=sorted(eos) or None) for cfg in configs}
    # warm-up so no method pays first-call costs (compilation included) inside the timing: once per
    # cache capacity the turns will need (a compiled step is one graph per capacity: a longer
    # prompt would otherwise compile inside its timed run)
    first = [conv.first[qi] for qi, _ in conv.items]
    for dec in [plain_dec] + [dec for name, dec in decoders.items() if todo(name)]:
        for ids, room in warm_ups(dec, first, max_new_tokens, conv.bound):
            dec.generate(ids, min(8, max_new_tokens), cache_room=room)
    result["compile_s"] = {name: t for name, dec in decoders.items() if (t := compile_times(dec))}
    result["draft_dtype_auto"] = draft_precisions(decoders, configs)
    if on_compiled and result["compile_s"]:
        on_compiled(result["compile_s"])
    if todo("hf generate"):
        _hf_generate(model, first[0], min(8, max_new_tokens), temperature, top_p, 0, eos)

    methods = [("plain", lambda i, ids: plain_dec.generate(ids, max_new_tokens, seed=i, **gen_kw)),
               ("hf generate", lambda i, ids: _hf_generate(model, ids, max_new_tokens, temperature, top_p, i, eos))]
    methods += [(name, (lambda dec: lambda i, ids: dec.generate(ids, max_new_tokens, seed=i, **gen_kw))(dec))
                for name, dec in decoders.items() if todo(name)]
    margins: dict = {}  # (config, item) -> target logit margin where the output left plain decoding
    models = {name: dec.target.model for name, dec in decoders.items()}
    policies = {name: dec.tree_policy for name, dec in decoders.items() if dec.tree_policy is not None}
    bar = tqdm(total=sum(n - len(r) for r in done.values()), desc="bench", unit="run", dynamic_ncols=True)
    encoded: list[torch.Tensor] = []
    # a full garbage collection walks every live object: with three configs' compiled graphs alive it
    # took 0.3-0.6 s on a 2-core Xeon, charged to whichever timed run set it off. What lives now
    # (models, graphs) is set aside for the timed runs; garbage made while they run is still collected
    gc.collect()
    gc.freeze()
    try:
        _timed_runs(n, conv, done, methods, bar, encoded, result, configs, models | {"": model}, temperature, margins,
                    policies, on_record, on_update)
    finally:
        gc.unfreeze()
    bar.close()
    return result


def _timed_runs(n, conv, done, methods, bar, encoded, result, configs, models, temperature, margins, policies,
                on_record, on_update) -> None:
    """The timed generations of :func:`run_bench`, turns outer, methods inner."""
    # turns outer, methods inner: a slow spell of the machine hits every method alike; plain
    # decoding answers first (its answer is the next turn's history)
    for i in range(n):
        ids = conv.ids(i, done["plain"])
        encoded.append(ids)
        for name, fn in methods:
            if i in done[name]:
                continue
            bar.set_postfix_str(name)
            t0 = time.perf_counter()
            out = fn(i, ids)
            seconds = time.perf_counter() - t0
            rec = ({"tokens": out, "seconds": seconds, "stats": None} if isinstance(out, list) else
                   {"tokens": out.tokens, "seconds": seconds, "stats": dataclasses.asdict(out.stats)})
            done[name][i] = rec
            if on_record:
                on_record(name, i, rec)
            bar.update(1)
        if i + 1 == n or conv.items[i + 1][0] != conv.items[i][0]:  # a question finished
            _summarize(result, {name: [recs[j] for j in range(i + 1)] for name, recs in done.items()},
                       configs, models, encoded, temperature, margins, conv)
            for entry in result["runs"]:  # tree.shape auto: the costs and calibration it decides with now
                if entry["config"] in policies:
                    entry["tree_policy"] = policies[entry["config"]].report()
            if on_update:
                on_update(result)


def _mismatches(tokens, reference, margin_model, encoded, margins: dict, key) -> list[dict]:
    """Where each output leaves ``reference``: the position and ``margin_model``'s top-1 minus
    top-2 logit there (computed once per (key, prompt))."""
    diffs = []
    for i, (a, b) in enumerate(zip(tokens, reference)):
        j = _first_diff(a, b)
        if j is not None:
            if (key, i) not in margins:
                margins[key, i] = _margin(margin_model, encoded[i], b[:j])
            diffs.append({"prompt": i, "position": j, "logit_margin": margins[key, i]})
    return diffs


def _plain_twins(configs) -> dict[str, str]:
    """dtype -> the first plain (drafter none) config of the bench running the target in it."""
    twins: dict[str, str] = {}
    for cfg in configs:
        if cfg.drafter.type == "none":
            twins.setdefault(cfg.runtime.dtype or "float32", cfg.name)
    return twins


def _category_row(run: "_Run", base: float, hf: float, identical: int, prompts: int, ref_step: float) -> dict:
    return {"prompts": prompts, "turns": len(run.tokens), "new_tokens": sum(map(len, run.tokens)),
            "tau": run.stats.tau if run.stats.target_forwards else 1.0, "tokens_per_s": run.tokens_per_s,
            "speedup": run.tokens_per_s / base if base else 0.0,
            "speedup_vs_hf": run.tokens_per_s / hf if hf else 0.0, "identical": identical,
            "step_cost": run.step_s / ref_step if ref_step and run.step_s else 0.0}


def _categories(recs: list[dict], plain_recs: list[dict], hf_recs: list[dict], ref_recs: list[dict],
                conv: "_Conversations") -> dict:
    """Per Spec-Bench subtask (:func:`eagle.prompts.subtask`): one method's records ``recs`` (one per
    item) summarized against plain decoding and transformers' ``generate`` on the same turns;
    ``step_cost``: a step's time over a step of the plain decoder ``ref_recs``."""
    by: dict[str, list[int]] = {}
    for i in range(len(recs)):
        by.setdefault(conv.questions[conv.items[i][0]].subtask, []).append(i)
    out = {}
    for cat, idx in by.items():
        pick = lambda rs: _Run.of([rs[i] for i in idx])  # noqa: E731
        run, plain, hf, ref = pick(recs), pick(plain_recs), pick(hf_recs), pick(ref_recs)
        same = sum(recs[i]["tokens"] == plain_recs[i]["tokens"] for i in idx)
        out[cat] = _category_row(run, max(plain.tokens_per_s, hf.tokens_per_s), hf.tokens_per_s, same,
                                 len({conv.items[i][0] for i in idx}), ref.step_s)
    return out


def _summarize(result: dict, records: dict, configs, models: dict, encoded, temperature, margins: dict,
               conv: "_Conversations") -> None:
    """Fill ``result`` from the records so far (``records[method]``: one per item, every method on
    the same items). ``models``: each config's target model (its precision) by config name; ``""``:
    the float32 model of plain decoding."""
    model = models[""]
    twins = _plain_twins(configs)
    runs = {name: _Run.of(recs) for name, recs in records.items()}
    plain, hf = runs["plain"], runs["hf generate"]
    n = len(plain.tokens)
    prompts = len({conv.items[i][0] for i in range(n)})
    baseline = max(plain.tokens_per_s, hf.tokens_per_s)
    vs_hf = (lambda tps: tps / hf.tokens_per_s if hf.tokens_per_s else 0.0)
    cats = lambda name, ref: _categories(records[name], records["plain"], records["hf generate"], records[ref], conv)  # noqa: E731
    result["plain"] = {"tokens_per_s": plain.tokens_per_s, "hf_tokens_per_s": hf.tokens_per_s,
                       "speedup_vs_hf": vs_hf(plain.tokens_per_s),
                       "identical_to_hf": sum(a == b for a, b in zip(plain.tokens, hf.tokens)), "prompts": prompts,
                       "turns": n, "categories": cats("plain", "plain")}
    result["generate"] = {"tokens_per_s": hf.tokens_per_s, "categories": cats("hf generate", "plain")}
    result["runs"] = []
    for cfg in configs:
        run = runs[cfg.name]
        st = run.stats
        # a step's cost against plain decoding in the same precision and runtime where the bench has it
        # (plain-compiled for a compiled float32 config), else the plain loop
        ref = twins.get(cfg.runtime.dtype or "float32", "plain")
        entry = {"config": cfg.name, "mean_accepted": st.tau, "alpha": st.alpha, "tokens_per_s": run.tokens_per_s,
                 "speedup": run.tokens_per_s / baseline if baseline else 0.0,
                 "speedup_vs_hf": vs_hf(run.tokens_per_s),
                 "identical_to_plain": sum(a == b for a, b in zip(run.tokens, plain.tokens)),
                 "prompts": prompts, "turns": n, "accepted_hist": st.accepted_hist,
                 "per_depth_acceptance": st.per_depth_acceptance,
                 "mean_tree_nodes": st.tree_nodes / max(st.target_forwards, 1),
                 "mean_side_rows": st.side_rows / max(st.target_forwards, 1),
                 "plain_steps": st.plain_steps,
                 "step_ms": {k: 1000 * v / max(st.target_forwards, 1) for k, v in
                             (("draft", st.draft_s), ("verify", st.verify_s), ("bookkeeping", st.other_s))},
                 "step_cost": run.step_s / runs[ref].step_s if runs[ref].step_s else 0.0, "step_cost_vs": ref,
                 "categories": cats(cfg.name, ref)}
        entry["tree_sizes"] = {"depth": st.depth_hist, "nodes": st.nodes_hist}  # [d] / [n]: steps
        if temperature == 0:
            entry["mismatches"] = _mismatches(run.tokens, plain.tokens, model, encoded, margins, cfg.name)
            # lower precision: also against plain decoding in the same precision, if the bench has it
            twin = twins.get(cfg.runtime.dtype or "float32")
            if cfg.runtime.dtype not in ("", "float32") and twin and twin != cfg.name:
                entry["plain_twin"] = twin
                entry["identical_to_plain_twin"] = sum(a == b for a, b in zip(run.tokens, runs[twin].tokens))
                entry["mismatches_vs_twin"] = _mismatches(run.tokens, runs[twin].tokens, models[twin], encoded,
                                                          margins, (cfg.name, twin))
        result["runs"].append(entry)


def compile_times(dec) -> dict[str, float]:
    """Seconds of each compiled graph's first call in a decoder: the target's buckets and, with an
    EAGLE drafter, its tree levels (empty when nothing was compiled)."""
    out = {f"{b} nodes": t for b, t in sorted(dec.target.compile_s.items())}
    for (rows, cap), t in sorted(getattr(dec.drafter, "compile_s", {}).items()):
        out[f"draft level {rows} rows x {cap} slots"] = t
    return out


def draft_precisions(decoders: dict, configs) -> dict[str, str]:
    """For each config with ``drafter.dtype: auto``, the precision its drafter took on this machine
    (eagle.heads.drafter.fastest_dtype), e.g. ``{"eagle2-cpu": "bfloat16"}`` (``"int8"``: weight-only int8)."""
    def took(drafter) -> str:
        return "int8" if getattr(drafter, "int8", False) else str(drafter.dtype).removeprefix("torch.")

    return {cfg.name: took(decoders[cfg.name].drafter)
            for cfg in configs if getattr(cfg.drafter.options, "dtype", "") == "auto" and cfg.name in decoders}


def format_compile(compile_s: dict) -> str:
    """One line per config: the seconds each compiled graph's first call took."""
    return "\n".join(f"compiled {name}: " + ", ".join(f"{what} {t:.1f} s" for what, t in per.items())
                     + f" (total {sum(per.values()):.1f} s; cached under $EAGLE_CACHE/inductor for the next process)"
                     for name, per in compile_s.items())


def format_table(result: dict) -> str:
    p = result["plain"]
    lines = [f"target: {result['target']}   device: {result['device']}   "
             f"max_new_tokens: {result['max_new_tokens']}   temperature: {result['temperature']}",
             f"plain loop: {p['tokens_per_s']:.2f} tok/s   transformers generate: {p['hf_tokens_per_s']:.2f} tok/s   "
             f"plain / generate: {p.get('speedup_vs_hf', 0.0):.2f}x   "
             f"plain == generate on {p['identical_to_hf']}/{p.get('turns', p['prompts'])} turns",
             "",
             f"| {'config':<22} | {'tau':>5} | {'alpha':>5} | {'tok/s':>7} | {'speedup':>7} | {'vs hf':>6} | {'identical':>9} | "
             f"{'nodes':>5} | {'draft ms':>8} | {'verify ms':>9} | {'other ms':>8} |",
             f"|{'-' * 24}|{'-' * 7}|{'-' * 7}|{'-' * 9}|{'-' * 9}|{'-' * 8}|{'-' * 11}|{'-' * 7}|{'-' * 10}|{'-' * 11}|{'-' * 10}|"]
    for r in result["runs"]:
        lines.append(f"| {r['config']:<22} | {r['mean_accepted']:5.2f} | {r.get('alpha', 0.0):5.2f} | {r['tokens_per_s']:7.2f} | "
                     f"{r['speedup']:6.2f}x | {r.get('speedup_vs_hf', 0.0):5.2f}x | {r['identical_to_plain']:>4}/{r.get('turns', r['prompts']):<4} | "
                     f"{r['mean_tree_nodes']:5.1f} | {r['step_ms']['draft']:8.1f} | {r['step_ms']['verify']:9.1f} | "
                     f"{r['step_ms']['bookkeeping']:8.1f} |")
    lines.append("")
    if result.get("draft_dtype_auto"):
        lines.append("drafter.dtype auto took: " + ", ".join(f"{name} {d}" for name, d in result["draft_dtype_auto"].items()))
    lines.append("acceptance per depth (fraction of steps whose tree reached depth d that accepted a token there):")
    for r in result["runs"]:
        lines.append(f"  {r['config']:<22} " + " ".join(f"{a:.2f}" for a in r["per_depth_acceptance"]))
    for r in result["runs"]:
        for m in r.get("mismatches", []):
            lines.append(f"  {r['config']}: turn {m['prompt']} differs from plain at token {m['position']} "
                         f"(target logit margin there: {m['logit_margin']:.2e})")
        if "plain_twin" in r:
            lines.append(f"  {r['config']}: identical to {r['plain_twin']} (plain, same precision) on "
                         f"{r['identical_to_plain_twin']}/{r.get('turns', r['prompts'])} turns")
            for m in r["mismatches_vs_twin"]:
                lines.append(f"    turn {m['prompt']} differs at token {m['position']} "
                             f"({r['plain_twin']}'s logit margin there: {m['logit_margin']:.2e})")
    return "\n".join(lines)


def _pooled_row(name: str, r: dict) -> dict:
    return {"config": name, "tau": r["mean_accepted"], "tokens_per_s": r["tokens_per_s"], "speedup": r["speedup"],
            "step_cost": r.get("step_cost", 0.0), "identical": r["identical_to_plain"], "turns": r.get("turns", r["prompts"])}


def format_categories(result: dict) -> str:
    """One block per subtask (every config's tau, tok/s, speedup against the faster plain decoder,
    step cost, identical turns), then the pooled rows; empty when the bench has one category."""
    cats = list(result["plain"].get("categories", {}))
    if len(cats) < 2:
        return ""
    head = (f"| {'config':<22} | {'tau':>5} | {'tok/s':>7} | {'speedup':>7} | {'step cost':>9} | {'identical':>9} |\n"
            f"|{'-' * 24}|{'-' * 7}|{'-' * 9}|{'-' * 9}|{'-' * 11}|{'-' * 11}|")

    def line(r):
        return (f"| {r['config']:<22} | {r['tau']:5.2f} | {r['tokens_per_s']:7.2f} | {r['speedup']:6.2f}x | "
                f"{r['step_cost']:8.2f}x | {r['identical']:>4}/{r['turns']:<4} |")

    blocks = []
    for cat in cats + ["pooled"]:
        if cat == "pooled":
            rows = [_pooled_row(r["config"], r) for r in result["runs"]]
            p = result["plain"]
            title = f"pooled ({p['prompts']} questions, {p.get('turns', p['prompts'])} turns)"
        else:
            rows = [{"config": r["config"], **r["categories"][cat]} for r in result["runs"]]
            c = result["plain"]["categories"][cat]
            title = (f"{cat} ({c['prompts']} questions, {c['turns']} turns; plain {c['tokens_per_s']:.2f} tok/s, "
                     f"generate {result['generate']['categories'][cat]['tokens_per_s']:.2f} tok/s)")
        blocks.append("\n".join([title, head] + [line(r) for r in rows]))
    return "\n\n".join(blocks)


def plot_categories(result: dict, path: str | Path) -> Path | None:
    """Bars of tau and speedup (against the faster plain decoder) per subtask per config, written to
    ``path`` (PNG); None when the bench has fewer than two categories or no runs."""
    cats = list(result["plain"].get("categories", {}))
    if len(cats) < 2 or not result["runs"]:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = cats + ["pooled"]
    runs = result["runs"]
    width = 0.8 / len(runs)
    fig, axes = plt.subplots(2, 1, figsize=(max(8, 1.6 * len(groups)) + 2.5, 8), sharex=True)
    colors = plt.get_cmap("tab20").colors  # one color per config (tab10 repeats past ten)
    for ax, key, label in ((axes[0], "tau", "tau (tokens per target forward)"),
                           (axes[1], "speedup", "speedup vs plain decoding")):
        for j, r in enumerate(runs):
            vals = [r["categories"][c][key] for c in cats] + [_pooled_row(r["config"], r)[key]]
            ax.bar([g + (j - (len(runs) - 1) / 2) * width for g in range(len(groups))], vals, width, label=r["config"],
                   color=colors[j % len(colors)])
        ax.set_ylabel(label)
        ax.grid(axis="y", alpha=0.3)
    axes[1].axhline(1.0, color="black", linewidth=0.8)
    axes[1].set_xticks(range(len(groups)), groups)
    axes[0].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    axes[0].set_title(f"{result['target']} on {result['device']}: {result['max_new_tokens']} new tokens a turn, "
                      f"temperature {result['temperature']}", fontsize=9)
    fig.tight_layout()
    return save_figure(fig, path)
