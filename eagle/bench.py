"""``eagle bench``: plain decoding, transformers' own ``generate`` and every config on the same
prompts, in one process, reported as ratios against the faster plain decoder."""
from __future__ import annotations

import dataclasses
import platform
import time
from dataclasses import dataclass, field

import torch
from tqdm import tqdm

from .config import DecodeConfig
from .decoder import DecodeStats, TreeDecoder
from .io import write_json
from .prompts import encode_chat

__all__ = ["run_bench", "format_table", "format_compile", "device_name", "write_json"]


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


@dataclass
class _Run:
    tokens: list[list[int]] = field(default_factory=list)
    seconds: float = 0.0
    stats: DecodeStats = field(default_factory=DecodeStats)

    @property
    def tokens_per_s(self) -> float:
        return sum(map(len, self.tokens)) / self.seconds if self.seconds else 0.0

    def add(self, record: dict) -> None:
        """Add one prompt's record (see :func:`run_bench`)."""
        self.tokens.append(record["tokens"])
        self.seconds += record["seconds"]
        if record.get("stats") is not None:
            # one record = one generation (records saved before the field existed lack it)
            self.stats.merge(DecodeStats(**{"generations": 1, **record["stats"]}))


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


def warm_ups(dec, encoded: list, max_new_tokens: int) -> list[tuple]:
    """``(prompt ids, cache room)`` for one short warm-up generation per cache capacity that
    ``max_new_tokens``-token generations of ``encoded`` will allocate on ``dec``."""
    by_capacity: dict[int, tuple] = {}
    for ids in encoded:
        room = dec.cache_room(len(ids), max_new_tokens)
        by_capacity.setdefault(dec.target.cache_capacity(room), (ids, room))
    return [by_capacity[c] for c in sorted(by_capacity)]


def run_bench(model, tokenizer, prompts: list[str], configs: list[DecodeConfig], max_new_tokens: int = 128,
              temperature: float = 0.0, top_p: float = 1.0, target_name: str = "", on_update=None,
              on_compiled=None, records: dict | None = None, on_record=None) -> dict:
    """Run the benchmark and return the result dict (see docs/results.md for the fields).

    ``on_update(result)`` is called after each finished run, so a caller can save partial results;
    ``on_compiled({config: {bucket: seconds}})`` once after the warm-up when any step was compiled.
    Resuming: ``records`` maps a method ("plain", "hf generate" or a config name) to
    ``{prompt index: record}`` of runs done earlier; those are not run again (a method done on every
    prompt is not even built). ``on_record(method, index, record)`` is called after each run with a
    JSON-serializable ``{"tokens", "seconds", "stats"}``.
    """
    encoded = [encode_chat(tokenizer, p) for p in prompts]
    plain_dec = TreeDecoder(model, None)
    eos = plain_dec.eos
    for ids in encoded:  # fail fast, before any timing, on prompts that cannot fit
        if len(ids) + max_new_tokens > plain_dec.target.max_positions:
            raise ValueError(f"a prompt of {len(ids)} tokens + {max_new_tokens} new tokens exceeds the model's "
                             f"context of {plain_dec.target.max_positions}")
    n = len(encoded)
    done = {name: {int(i): r for i, r in (records or {}).get(name, {}).items() if int(i) < n}
            for name in ["plain", "hf generate"] + [c.name for c in configs]}
    todo = lambda name: len(done[name]) < n  # noqa: E731
    result = {"target": target_name, "device": device_name(plain_dec.target.device),
              "max_new_tokens": max_new_tokens, "temperature": temperature, "top_p": top_p,
              "plain": {}, "runs": []}
    gen_kw = dict(temperature=temperature, top_p=top_p)
    decoders = {cfg.name: TreeDecoder.from_config(model, cfg, eos_token_id=sorted(eos) or None) for cfg in configs}
    # warm-up so no method pays first-call costs (compilation included) inside the timing: once per
    # cache capacity the prompts will need (a compiled step is one graph per capacity: a longer
    # prompt would otherwise compile inside its timed run)
    for dec in [plain_dec] + [dec for name, dec in decoders.items() if todo(name)]:
        for ids, room in warm_ups(dec, encoded, max_new_tokens):
            dec.generate(ids, min(8, max_new_tokens), cache_room=room)
    result["compile_s"] = {name: t for name, dec in decoders.items() if (t := compile_times(dec))}
    result["draft_dtype_auto"] = draft_precisions(decoders, configs)
    if on_compiled and result["compile_s"]:
        on_compiled(result["compile_s"])
    if todo("hf generate"):
        _hf_generate(model, encoded[0], min(8, max_new_tokens), temperature, top_p, 0, eos)

    methods = [("plain", lambda i, ids: plain_dec.generate(ids, max_new_tokens, seed=i, **gen_kw)),
               ("hf generate", lambda i, ids: _hf_generate(model, ids, max_new_tokens, temperature, top_p, i, eos))]
    methods += [(name, (lambda dec: lambda i, ids: dec.generate(ids, max_new_tokens, seed=i, **gen_kw))(dec))
                for name, dec in decoders.items() if todo(name)]
    margins: dict = {}  # (config, prompt) -> target logit margin where the output left plain decoding
    models = {name: dec.target.model for name, dec in decoders.items()}
    bar = tqdm(total=sum(n - len(r) for r in done.values()), desc="bench", unit="run", dynamic_ncols=True)
    runs = {name: _Run() for name in done}  # the prompts so far, every method (earlier records included)
    # prompts outer, methods inner: a slow spell of the machine hits every method alike
    for i, ids in enumerate(encoded):
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
        for name, recs in done.items():
            runs[name].add(recs[i])
        _summarize(result, runs, configs, models | {"": model}, encoded, temperature, margins)
        if on_update:
            on_update(result)
    bar.close()
    return result


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


def _summarize(result: dict, runs: dict, configs, models: dict, encoded, temperature, margins: dict) -> None:
    """Fill ``result`` from the runs so far (every method has run on the same prompts).
    ``models``: each config's target model (its precision) by config name; ``""``: the float32
    model of plain decoding."""
    model = models[""]
    twins = _plain_twins(configs)
    plain, hf = runs["plain"], runs["hf generate"]
    n = len(plain.tokens)
    baseline = max(plain.tokens_per_s, hf.tokens_per_s)
    vs_hf = (lambda tps: tps / hf.tokens_per_s if hf.tokens_per_s else 0.0)
    result["plain"] = {"tokens_per_s": plain.tokens_per_s, "hf_tokens_per_s": hf.tokens_per_s,
                       "speedup_vs_hf": vs_hf(plain.tokens_per_s),
                       "identical_to_hf": sum(a == b for a, b in zip(plain.tokens, hf.tokens)), "prompts": n}
    result["runs"] = []
    for cfg in configs:
        run = runs[cfg.name]
        st = run.stats
        entry = {"config": cfg.name, "mean_accepted": st.tau, "alpha": st.alpha, "tokens_per_s": run.tokens_per_s,
                 "speedup": run.tokens_per_s / baseline if baseline else 0.0,
                 "speedup_vs_hf": vs_hf(run.tokens_per_s),
                 "identical_to_plain": sum(a == b for a, b in zip(run.tokens, plain.tokens)),
                 "prompts": n, "accepted_hist": st.accepted_hist,
                 "per_depth_acceptance": st.per_depth_acceptance,
                 "mean_tree_nodes": st.tree_nodes / max(st.target_forwards, 1),
                 "plain_steps": st.plain_steps,
                 "step_ms": {k: 1000 * v / max(st.target_forwards, 1) for k, v in
                             (("draft", st.draft_s), ("verify", st.verify_s), ("bookkeeping", st.other_s))}}
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
    (eagle.heads.drafter.fastest_dtype), e.g. ``{"eagle2-cpu": "bfloat16"}``."""
    return {cfg.name: str(decoders[cfg.name].drafter.dtype).removeprefix("torch.")
            for cfg in configs if cfg.drafter.dtype == "auto" and cfg.name in decoders}


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
             f"plain == generate on {p['identical_to_hf']}/{p['prompts']} prompts",
             "",
             f"| {'config':<22} | {'tau':>5} | {'alpha':>5} | {'tok/s':>7} | {'speedup':>7} | {'vs hf':>6} | {'identical':>9} | "
             f"{'nodes':>5} | {'draft ms':>8} | {'verify ms':>9} | {'other ms':>8} |",
             f"|{'-' * 24}|{'-' * 7}|{'-' * 7}|{'-' * 9}|{'-' * 9}|{'-' * 8}|{'-' * 11}|{'-' * 7}|{'-' * 10}|{'-' * 11}|{'-' * 10}|"]
    for r in result["runs"]:
        lines.append(f"| {r['config']:<22} | {r['mean_accepted']:5.2f} | {r.get('alpha', 0.0):5.2f} | {r['tokens_per_s']:7.2f} | "
                     f"{r['speedup']:6.2f}x | {r.get('speedup_vs_hf', 0.0):5.2f}x | {r['identical_to_plain']:>4}/{r['prompts']:<4} | "
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
            lines.append(f"  {r['config']}: prompt {m['prompt']} differs from plain at token {m['position']} "
                         f"(target logit margin there: {m['logit_margin']:.2e})")
        if "plain_twin" in r:
            lines.append(f"  {r['config']}: identical to {r['plain_twin']} (plain, same precision) on "
                         f"{r['identical_to_plain_twin']}/{r['prompts']} prompts")
            for m in r["mismatches_vs_twin"]:
                lines.append(f"    prompt {m['prompt']} differs at token {m['position']} "
                             f"({r['plain_twin']}'s logit margin there: {m['logit_margin']:.2e})")
    return "\n".join(lines)
