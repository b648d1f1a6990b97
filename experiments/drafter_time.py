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
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

import torch


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


def propose_times(model, tok, config, prompt: str, step: int, repeats: int,
                  compiled: bool = False) -> tuple[list[float], list, float]:
    """ms per ``propose`` from the drafter state at decoding step ``step``, and the trees drafted
    (warm-up included): all the same, since the state is restored before each call; and the seconds
    spent compiling the head's levels (``compiled``: the drafter compiles them, the target does not)."""
    from eagle.decoder import TreeDecoder
    from eagle.draft import Sampling
    from eagle.prompts import encode_chat
    from eagle.target import Target

    dec = TreeDecoder.from_config(model, config)
    d = dec.drafter
    d.compiled = compiled
    real, calls, snap = d.propose, [0], {}

    def stop_at_step(root, sampling):
        calls[0] += 1
        if calls[0] == step:
            snap.update(c=d.cache.get_seq_length(), f=list(d.pending_f), x=list(d.pending_x), root=root)
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
        Target.crop(d.cache, snap["c"])
        d.pending_f, d.pending_x = list(snap["f"]), list(snap["x"])
        trees.append(d.propose(snap["root"], Sampling()))

    return _timed(once, repeats), trees, sum(getattr(d, "compile_s", {}).values())


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", required=True, help="an eagle decoding config")
    ap.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    ap.add_argument("--prompt", default="Explain how a hash table handles collisions, with an example in Python.")
    ap.add_argument("--step", type=int, default=12, help="decoding step whose drafter state is timed")
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--compiled-levels", action="store_true", help="also time each dtype with compiled tree levels")
    args = ap.parse_args(argv)

    from eagle.config import load_config
    from eagle.models import load_target

    config = load_config(args.config)
    if config.drafter.type != "eagle":
        raise SystemExit(f"{args.config}: drafter.type must be 'eagle'")
    model, tok = load_target()
    print(f"{config.name}, {torch.get_num_threads()} threads, step {args.step}, median / min of {args.repeats}")
    print("| dtype | levels | propose ms (median) | min | tree nodes | 10 rows x draft LM head, ms | compile s | same trees |")
    print("|---|---|---:|---:|---:|---:|---:|---|")
    for name, compiled in [(n, c) for n in args.dtypes for c in ((False, True) if args.compiled_levels else (False,))]:
        cfg = dataclasses.replace(config, drafter=dataclasses.replace(config.drafter, dtype=name))
        times, trees, compile_s = propose_times(model, tok, cfg, args.prompt, args.step, args.repeats, compiled)
        if not compiled:
            eager_tokens = trees[-1].tokens
        from eagle.draft import build_drafter
        from eagle.lmhead import project
        from eagle.target import Target

        lm_w = build_drafter(cfg, Target(model, cfg.attention)).lm_w  # (Vd, H) in this dtype
        x = torch.randn(10, lm_w.shape[1]).to(lm_w.dtype)
        mm = _timed(lambda: project(x, lm_w), 200)
        same = "yes" if torch.equal(trees[-1].tokens, eager_tokens) else "NO"
        print(f"| {name} | {'compiled' if compiled else 'eager'} | {statistics.median(times):.1f} | {min(times):.1f} | "
              f"{len(trees[-1])} | {statistics.median(mm):.2f} | {compile_s:.1f} | {same} |")


if __name__ == "__main__":
    main()
