"""Lesson experiment 1: speculative sampling reproduces the target distribution exactly.

For a toy target / noisy-draft pair (V = 8) and a fixed prefix, draw ``--samples`` times the first
two tokens with ``speculative_decode`` and compare their empirical law with the target's exact law
(computed by enumeration, not by sampling):

* first token vs ``softmax(target(prefix)[-1] / T)``;
* first two tokens jointly (64 cells) vs ``p(x1) p(x2 | x1)`` -- this covers the residual and the
  bonus token at the second position as well.

Reported per (temperature, K): total-variation distance, KL(empirical || exact) and the "noise
floor" (the TV that exact i.i.d. samples of that size would show on average), plus two WRONG rules
for contrast.  Exits non-zero if any exact-rule TV is >= the threshold (0.01).

    .venv/bin/python experiments/lesson_exactness.py [--samples 100000] [--out-dir experiments/results]
"""
from __future__ import annotations

import argparse
import csv
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from eagle.reference import (  # noqa: E402
    acceptance_rate,
    exact_joint_distribution,
    exact_next_distribution,
    make_draft,
    make_toy_model,
    speculative_decode,
    speculative_step_variant,
)

PREFIX = np.array([1, 2])


def tv(a: np.ndarray, b: np.ndarray) -> float:
    return 0.5 * float(np.abs(a - b).sum())


def kl(emp: np.ndarray, exact: np.ndarray) -> float:
    """KL(emp || exact) in nats, 0 log 0 = 0 (exact has full support: it is a softmax)."""
    m = emp > 0
    return float((emp[m] * np.log(emp[m] / exact[m])).sum())


def noise_floor(p: np.ndarray, n: int) -> float:
    """E[TV(empirical of n exact samples, p)] ~ 0.5 * sum sqrt(2/pi) * sqrt(p (1-p) / n)."""
    p = p.ravel()
    return float(0.5 * np.sqrt(2 / np.pi) * np.sqrt(p * (1 - p) / n).sum())


def first_two(target, draft, K, T, rng, rule):
    """First two tokens of decoding from PREFIX with the given acceptance rule."""
    if rule == "exact":
        return speculative_decode(target, draft, PREFIX, K, T, 2, rng)
    toks = speculative_step_variant(target, draft, PREFIX, K, T, rng, rule=rule)
    if len(toks) < 2:
        toks = toks + speculative_step_variant(target, draft, np.append(PREFIX, toks), K, T, rng,
                                               rule=rule)
    return toks[:2]


def run_config(target, draft, K, T, n, seed, rule="exact"):
    rng = np.random.default_rng(seed)
    V = target.V
    counts = np.zeros((V, V))
    for _ in range(n):
        x1, x2 = first_two(target, draft, K, T, rng, rule)[:2]
        counts[x1, x2] += 1
    joint_emp = counts / n
    joint = exact_joint_distribution(target, PREFIX, T, 2)
    p1 = joint.sum(axis=1)
    assert np.allclose(p1, exact_next_distribution(target, PREFIX, T))
    e1 = joint_emp.sum(axis=1)
    alpha = acceptance_rate(p1, exact_next_distribution(draft, PREFIX, T))
    return dict(
        rule=rule, temperature=T, K=K, samples=n, alpha_pos1=round(float(alpha), 4),
        tv_first=tv(e1, p1), kl_first=kl(e1, p1), floor_first=noise_floor(p1, n),
        tv_joint2=tv(joint_emp, joint), kl_joint2=kl(joint_emp.ravel(), joint.ravel()),
        floor_joint2=noise_floor(joint, n),
    ), (e1, p1)


def fmt(v):
    return f"{v:.3g}" if isinstance(v, float) else str(v)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--samples", type=int, default=100_000)
    ap.add_argument("--out-dir", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                      "results"))
    ap.add_argument("--temperatures", type=float, nargs="+", default=[0.5, 1.0, 1.5])
    ap.add_argument("--ks", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--V", type=int, default=8)
    ap.add_argument("--noise", type=float, default=1.0, help="draft noise (lower alpha = larger)")
    ap.add_argument("--threshold", type=float, default=0.01)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-wrong", action="store_true", help="skip the wrong-rule contrast rows")
    args = ap.parse_args(argv)

    target = make_toy_model(args.V, seed=0)
    draft = make_draft(target, noise=args.noise, seed=1)
    rows, dists = [], {}
    t0 = time.time()
    for T in args.temperatures:
        for K in args.ks:
            r, d = run_config(target, draft, K, T, args.samples, args.seed + len(rows))
            rows.append(r)
            dists[(T, K)] = d
            print(f"  T={T} K={K}: TV1={r['tv_first']:.4f} TV2={r['tv_joint2']:.4f} "
                  f"({time.time() - t0:.0f}s)", flush=True)
    if not args.no_wrong:
        T, K = 1.0, 2
        n_wrong = max(1000, args.samples // 5)  # large errors need few samples
        for rule in ("resample_target", "accept_all"):
            r, _ = run_config(target, draft, K, T, n_wrong, args.seed + 1000 + len(rows), rule)
            rows.append(r)

    os.makedirs(args.out_dir, exist_ok=True)
    cols = list(rows[0].keys())
    with open(os.path.join(args.out_dir, "lesson_exactness.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in r.items()})
    md = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    md += ["| " + " | ".join(fmt(r[c]) for c in cols) + " |" for r in rows]
    exact_rows = [r for r in rows if r["rule"] == "exact"]
    max_tv = max(max(r["tv_first"], r["tv_joint2"]) for r in exact_rows)
    max_kl = max(max(r["kl_first"], r["kl_joint2"]) for r in exact_rows)
    ok = max_tv < args.threshold
    summary = (f"V={args.V}, prefix={PREFIX.tolist()}, draft noise={args.noise}. "
               f"Exact rule: max TV = {max_tv:.4f} (threshold {args.threshold}), "
               f"max KL = {max_kl:.2e} nats -> {'PASS' if ok else 'FAIL'}.")
    text = "\n".join(md) + "\n\n" + summary + "\n"
    with open(os.path.join(args.out_dir, "lesson_exactness.md"), "w") as f:
        f.write(text)
    print(text)

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.2))
    T0, K0 = (1.0 if 1.0 in args.temperatures else args.temperatures[0]), args.ks[-1]
    e1, p1 = dists[(T0, K0)]
    x = np.arange(args.V)
    axes[0].bar(x - 0.2, p1, 0.4, label="exact target softmax")
    axes[0].bar(x + 0.2, e1, 0.4, label=f"speculative (N={args.samples:.0e})")
    axes[0].set_title(f"first token, T={T0}, K={K0}")
    axes[0].set_xlabel("token")
    axes[0].legend(fontsize=7)
    labels = [f"T={r['temperature']}\nK={r['K']}" for r in exact_rows]
    xi = np.arange(len(exact_rows))
    axes[1].bar(xi - 0.2, [r["tv_first"] for r in exact_rows], 0.4, label="TV first token")
    axes[1].bar(xi + 0.2, [r["tv_joint2"] for r in exact_rows], 0.4, label="TV first 2 tokens")
    axes[1].plot(xi, [r["floor_joint2"] for r in exact_rows], "k.", label="noise floor (2 tokens)")
    axes[1].axhline(args.threshold, color="r", ls="--", lw=1, label="threshold")
    axes[1].set_xticks(xi, labels, fontsize=6)
    axes[1].set_title("TV(speculative, target)")
    axes[1].legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(os.path.join(args.out_dir, "lesson_exactness.png"), dpi=80)
    print(f"wrote {args.out_dir}/lesson_exactness.{{csv,md,png}} in {time.time() - t0:.0f}s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
