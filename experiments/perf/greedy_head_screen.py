"""The LM head's argmax through a bfloat16 screen (kernels/cpu_argmax.py) on its own: how many tokens
each screen's error bound leaves to recompute on a real model's hidden states, and the op's time
(each screen this machine has: the small-row kernel's, oneDNN's, the AVX512-BF16 dot products')
against the float32 head's product then argmax, with the head evicted from the caches before every
call (as in a step, which streams all other weights in between).

    python experiments/perf/greedy_head_screen.py --rows 1,8,16,32,64

Candidates: per position of the bench's 12 chat prompts (joined, first ``--positions`` tokens), the
tokens whose screened logit plus its bound reaches the best screened logit minus its bound (the
op's rule and coefficient, on the screen's own values, in float64). Times: the best of
``--repeats`` rounds, the ways called one after another in each (the order reversed every round).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import Arm, interleave  # noqa: E402


def screen_values(hidden: torch.Tensor, weight: torch.Tensor, way: str) -> torch.Tensor:
    """``(T, V)`` float64: the screen the op computes for ``way`` ("kernel", "onednn" or "dot")."""
    from eagle_kernels import cpu_argmax, cpu_gemm

    if way == "onednn":
        return cpu_gemm.held_op(hidden.bfloat16(), cpu_argmax._held(weight).slot, weight.shape[0]).double()
    if way == "dot":
        return cpu_argmax._op("screen_dot")(hidden, cpu_argmax._pairs(weight), weight.shape[0]).double()
    return cpu_gemm._load().packed_linear(hidden, cpu_argmax._copies(weight), weight.shape[0], None).double()


def candidate_counts(hidden: torch.Tensor, weight: torch.Tensor, way: str) -> list[int]:
    """Per row of ``hidden (T, K)``: how many of ``weight``'s V rows the bound of ``way``'s screen
    cannot rule out."""
    from eagle_kernels import cpu_argmax

    K = weight.shape[1]
    coef = cpu_argmax._op("screen_coef")(K, way in ("onednn", "dot"))  # the dot screen takes oneDNN's bound
    norms = cpu_argmax._norms(weight)  # (V,) the op's
    counts = []
    for h, s in zip(hidden.double(), screen_values(hidden, weight, way)):
        a = 2.0 ** -100 * (K + 1) * (1 + h.norm())
        b = coef * h.norm() * norms + a * (1 + norms)  # (V,) the bound
        counts.append(int(((s + b) >= (s - b).max()).sum()))
    return counts


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="1,8,16,32", help="comma-separated row counts to time")
    ap.add_argument("--positions", type=int, default=300)
    ap.add_argument("--repeats", type=int, default=11)
    ap.add_argument("--target", default="smollm2-135m")
    args = ap.parse_args(argv)
    import eagle
    from eagle_kernels.cliargs import positive_ints

    try:
        rows = positive_ints(args.rows, "--rows")
    except ValueError as e:
        raise SystemExit(str(e))
    from eagle.backends.cpu.lmhead import project
    from eagle_kernels import cpu_argmax

    if not cpu_argmax.available():
        raise SystemExit("the CPU extension is not available here")
    model, tok = eagle.load_target(args.target)
    weight = model.get_output_embeddings().weight.detach()  # (V, K)
    prompts = [json.loads(line) for line in open(ROOT / "experiments/prompts/chat-small.jsonl")]
    text = " ".join(str(p.get("prompt", p)) for p in prompts)
    ids = torch.tensor(tok(text)["input_ids"][: args.positions])[None]
    with torch.no_grad():
        hidden = model.get_decoder()(input_ids=ids).last_hidden_state[0]  # (N, K)
    ways = cpu_argmax._ways(1)
    for way in ways:
        counts = candidate_counts(hidden, weight, way)
        print(f"{way} screen: candidates over {len(counts)} positions (of {weight.shape[0]} tokens): mean "
              f"{statistics.mean(counts):.1f}, median {statistics.median(counts):.0f}, max {max(counts)}")
    if max(rows) > hidden.shape[0]:
        raise SystemExit(f"--rows up to {hidden.shape[0]} (the positions available)")
    flush = torch.ones(200_000_000)  # 800 MB read between calls: the head leaves the caches

    print("| rows | every logit then argmax, ms | " + " | ".join(f"{w} screen, ms (ratio)" for w in ways) + " |")
    print("|---:|---:|" + "---:|" * len(ways))
    for r in rows:
        h = hidden[:r].contiguous()
        fns = {"full": lambda: project(h, weight).argmax(dim=-1)}
        fns.update({w: (lambda w=w: cpu_argmax._run(w, h, weight)) for w in ways})  # the op of each screen
        expected = fns["full"]()
        assert all(torch.equal(expected, fns[w]()) for w in ways)
        t = interleave({k: Arm(fn, before=flush.sum) for k, fn in fns.items()}, args.repeats, warmup=0)
        best = {k: t.best(k, 1000) for k in fns}
        cells = " | ".join(f"{best[w]:.2f} ({best[w] / best['full']:.2f}x)" for w in ways)
        print(f"| {r} | {best['full']:.2f} | {cells} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
