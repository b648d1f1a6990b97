"""Time one EAGLE ``propose`` (drafting a whole tree) per head precision, on a real decoding state.

The decoder generates until step ``--step`` of a chat prompt; from the drafter's state there (head
KV cache, pending accepted pairs) ``propose`` is run ``--repeats`` times, restoring the state before
each, and the median / min are printed per ``drafter.dtype``. Also the core product of a tree level,
``(10 rows) x (draft LM head)``, per dtype, to show where the time goes.

    python experiments/drafter_time.py --config experiments/configs/eagle2-dynamic.yaml
    python experiments/drafter_time.py --config experiments/configs/eagle2-dynamic.yaml --dtypes float32 --compiled-levels

``--compiled-levels`` also times each dtype with the head's tree levels compiled (what
``runtime.compile`` does to the drafter; the target itself stays eager here), with the compile time
of its graphs and whether its trees equal the eager drafter's.

``--in-loop N``: instead, ``propose`` inside real decoding (the config as it is, its runtime
included) of the first N chat prompts of experiments/prompts/chat-small.jsonl: each step's
``propose`` right after the target's verification, the same ``propose`` again right after it (state
restored), and again after reading 800 MB (the caches flushed), medians over all steps. What the
drafter pays for its working set coming back from memory after each verification.

    python experiments/drafter_time.py --config experiments/configs/eagle2-cpu.yaml --in-loop 8

``--split N``: where a ``propose`` inside real decoding of N chat prompts spends its time (medians
per step): the catch-up (the head over the newly accepted pairs), the head's forwards of the tree
levels, the draft LM head (with its top-k), and the rest (building the tree and its masks in Python).

    python experiments/drafter_time.py --config experiments/configs/eagle2-cpu.yaml --split 8

``--dtype D`` (with ``--in-loop`` / ``--split``): the config's ``drafter.dtype`` replaced by D
(e.g. ``float32`` against ``int8``).
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

import torch

from eagle.heads.drafter import HEAD_DTYPES


class _Stop(Exception):
    pass


def _timed(fn, repeats: int) -> list[float]:
    fn()  # warm-up
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append(1000 * (time.perf_counter() - t0))
    return out


def _restorer(d):
    """A function that puts drafter ``d`` back in its present state (the head cache's committed
    length, the pending accepted pairs), so that ``propose`` can run again from it."""
    from eagle.target import Target

    c, f, x = d.cache.get_seq_length(), list(d.pending_f), list(d.pending_x)

    def restore():
        Target.crop(d.cache, c)
        d.pending_f, d.pending_x = list(f), list(x)

    return restore


def propose_times(model, tok, config, prompt: str, step: int, repeats: int,
                  compiled: bool = False) -> tuple[list[float], list, float]:
    """ms per ``propose`` from the drafter state at decoding step ``step``, and the trees drafted
    (warm-up included): all the same, since the state is restored before each call; and the seconds
    spent compiling the head's levels (``compiled``: the drafter compiles them, the target does not)."""
    from eagle.decoder import TreeDecoder
    from eagle.draft import Sampling
    from eagle.prompts import encode_chat

    dec = TreeDecoder.from_config(model, config)
    d = dec.drafter
    d.compiled = compiled
    real, calls, snap = d.propose, [0], {}

    def stop_at_step(root, sampling):
        calls[0] += 1
        if calls[0] == step:
            snap.update(restore=_restorer(d), root=root)
            raise _Stop
        return real(root, sampling)

    d.propose = stop_at_step
    try:
        dec.generate(encode_chat(tok, prompt), 4 * step + 16)
    except _Stop:
        pass
    d.propose = real
    if not snap:
        raise SystemExit(f"generation ended before step {step}; use a smaller --step")
    trees = []

    def once():
        snap["restore"]()
        trees.append(d.propose(snap["root"], Sampling()))

    return _timed(once, repeats), trees, sum(getattr(d, "compile_s", {}).values())


def _decode_measured(dec, tok, prompts: list[str], max_new_tokens: int, out: dict) -> dict:
    """Decode ``prompts`` with ``dec`` after a short warm-up whose measurements in ``out`` are dropped."""
    from eagle.prompts import encode_chat

    dec.generate(encode_chat(tok, prompts[0]), 16)  # warm-up (measurements, copies, compiling)
    for v in out.values():
        v.clear()
    for p in prompts:
        dec.generate(encode_chat(tok, p), max_new_tokens)
    return out


def in_loop_times(model, tok, config, prompts: list[str], max_new_tokens: int = 128) -> dict[str, list[float]]:
    """ms per ``propose`` during real decoding of ``prompts``: ``after_verify`` (as decoding runs it),
    ``repeated`` (the same call again at once, the drafter state restored) and ``after_flush`` (again,
    after an 800 MB read). Every call drafts the same tree; the last one's is used."""
    from eagle.decoder import TreeDecoder

    dec = TreeDecoder.from_config(model, config)
    d = dec.drafter
    real, flush = d.propose, torch.ones(200_000_000)  # 800 MB
    out: dict[str, list[float]] = {"after_verify": [], "repeated": [], "after_flush": []}

    def measured(root, sampling):
        restore, trees = _restorer(d), []
        for key in out:
            if trees:
                restore()
            if key == "after_flush":
                flush.sum()
            t0 = time.perf_counter()
            trees.append(real(root, sampling))
            out[key].append(1000 * (time.perf_counter() - t0))
        assert all(torch.equal(t.tokens, trees[0].tokens) for t in trees), "a repeated propose drafted another tree"
        return trees[-1]

    d.propose = measured
    return _decode_measured(dec, tok, prompts, max_new_tokens, out)


def split_times(model, tok, config, prompts: list[str], max_new_tokens: int = 128) -> dict[str, list[float]]:
    """ms per step of each part of ``propose`` during real decoding of ``prompts`` (see the module
    docstring): ``catch_up``, ``levels`` (head forwards), ``lm_head`` (draft logits), ``rest``."""
    from eagle.decoder import TreeDecoder

    dec = TreeDecoder.from_config(model, config)
    d = dec.drafter
    acc = {"catch_up": 0.0, "levels": 0.0, "lm_head": 0.0}
    out: dict[str, list[float]] = {k: [] for k in ("propose", "catch_up", "levels", "lm_head", "rest")}

    def timed(name, fn):
        def wrapper(*a, **k):
            t0 = time.perf_counter()
            r = fn(*a, **k)
            acc[name] += time.perf_counter() - t0
            return r
        return wrapper

    real_catch, real_fwd, real_logits, real_propose = d.catch_up, d._forward, d._logits, d.propose
    inside_catch = [False]

    def catch_up():
        inside_catch[0] = True
        try:
            return timed("catch_up", real_catch)()
        finally:
            inside_catch[0] = False

    def forward(*a, **k):
        return real_fwd(*a, **k) if inside_catch[0] else timed("levels", real_fwd)(*a, **k)

    def propose(root, sampling):
        for k in acc:
            acc[k] = 0.0
        t0 = time.perf_counter()
        tree = real_propose(root, sampling)
        total = time.perf_counter() - t0
        out["propose"].append(1000 * total)
        for k, v in acc.items():
            out[k].append(1000 * v)
        out["rest"].append(1000 * (total - sum(acc.values())))
        return tree

    d.catch_up, d._forward, d._logits, d.propose = catch_up, forward, timed("lm_head", real_logits), propose
    return _decode_measured(dec, tok, prompts, max_new_tokens, out)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", required=True, help="an eagle decoding config")
    ap.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    ap.add_argument("--prompt", default="Explain how a hash table handles collisions, with an example in Python.")
    ap.add_argument("--step", type=int, default=12, help="decoding step whose drafter state is timed")
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--compiled-levels", action="store_true", help="also time each dtype with compiled tree levels")
    ap.add_argument("--in-loop", type=int, metavar="N", help="instead: propose inside decoding of N chat prompts")
    ap.add_argument("--split", type=int, metavar="N", help="instead: where propose spends its time, over N chat prompts")
    ap.add_argument("--dtype", choices=HEAD_DTYPES[1:], help="with --in-loop / --split: this drafter.dtype instead of the config's")
    args = ap.parse_args(argv)

    from eagle.config import load_config
    from eagle.models import load_target

    config = load_config(args.config)
    if config.drafter.type != "eagle":
        raise SystemExit(f"{args.config}: drafter.type must be 'eagle'")
    if args.dtype:
        if not (args.in_loop or args.split):
            raise SystemExit("--dtype goes with --in-loop or --split (the default mode times --dtypes)")
        options = dataclasses.replace(config.drafter.options, dtype=args.dtype)
        config = dataclasses.replace(config, drafter=dataclasses.replace(config.drafter, options=options))
    for flag in ("in_loop", "split"):
        if getattr(args, flag) is not None and getattr(args, flag) < 1:
            raise SystemExit(f"--{flag.replace('_', '-')} takes a positive number of prompts")
    model, tok = load_target()
    if args.in_loop or args.split:
        import json
        from pathlib import Path

        path = Path(__file__).with_name("prompts") / "chat-small.jsonl"
        prompts = [json.loads(line)["prompt"] for line in path.read_text().splitlines() if line.strip()][: args.in_loop or args.split]
    if args.split:
        times = split_times(model, tok, config, prompts)
        dtype = config.drafter.options.dtype or "the target's"
        print(f"{config.name} (drafter.dtype {dtype}), {torch.get_num_threads()} threads, "
              f"{len(prompts)} prompts, {len(times['propose'])} steps "
              f"(medians per step; the parts' medians need not add up to the whole's)")
        print("| part of propose | ms |")
        print("|---|---:|")
        for key, label in (("propose", "the whole propose"), ("catch_up", "catch-up: the head over the accepted pairs"),
                           ("levels", "the head's forwards of the tree levels"),
                           ("lm_head", "the draft LM head of every level (+ log-softmax input)"),
                           ("rest", "the rest: top-k, the tree and its masks (Python)")):
            print(f"| {label} | {statistics.median(times[key]):.2f} |")
        return
    if args.in_loop:
        times = in_loop_times(model, tok, config, prompts)
        print(f"{config.name}, {torch.get_num_threads()} threads, {len(prompts)} prompts, {len(times['repeated'])} steps")
        print("| propose | ms (median) |")
        print("|---|---:|")
        for key, label in (("after_verify", "right after the verification (as decoding runs it)"),
                           ("repeated", "the same again at once"), ("after_flush", "again after an 800 MB read")):
            print(f"| {label} | {statistics.median(times[key]):.2f} |")
        return
    print(f"{config.name}, {torch.get_num_threads()} threads, step {args.step}, median / min of {args.repeats}")
    print("| dtype | levels | propose ms (median) | min | tree nodes | 10 rows x draft LM head, ms | compile s | same trees |")
    print("|---|---|---:|---:|---:|---:|---:|---|")
    for name, compiled in [(n, c) for n in args.dtypes for c in ((False, True) if args.compiled_levels else (False,))]:
        options = dataclasses.replace(config.drafter.options, dtype=name)
        cfg = dataclasses.replace(config, drafter=dataclasses.replace(config.drafter, options=options))
        times, trees, compile_s = propose_times(model, tok, cfg, args.prompt, args.step, args.repeats, compiled)
        if not compiled:
            eager_tokens = trees[-1].tokens
        from eagle.backends.cpu.lmhead import project
        from eagle.target import Target

        lm_w = cfg.build_drafter(Target(model, cfg.attention)).lm_w  # (Vd, H) in this dtype
        x = torch.randn(10, lm_w.shape[1]).to(lm_w.dtype)
        mm = _timed(lambda: project(x, lm_w), 200)
        same = "yes" if torch.equal(trees[-1].tokens, eager_tokens) else "NO"
        print(f"| {name} | {'compiled' if compiled else 'eager'} | {statistics.median(times):.1f} | {min(times):.1f} | "
              f"{len(trees[-1])} | {statistics.median(mm):.2f} | {compile_s:.1f} | {same} |")


if __name__ == "__main__":
    main()
