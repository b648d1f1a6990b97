"""Lesson experiment 2: tokens per target forward and speedup as a function of K.

* ``E(alpha, K) = (1 - alpha^(K+1)) / (1 - alpha)`` (expected tokens per round = per target
  forward) for alpha in {0.5, 0.7, 0.9}, K = 1..10, checked against two simulations:
  - "iid": Bernoulli(alpha) acceptances, tokens per round = leading run of successes (<= K) + 1;
  - "rule": the actual ``speculative_step`` on a target/draft pair built so that the acceptance
    rate is exactly alpha at every position (``make_constant_alpha_pair``).
* speedup ``S = E / (1 + c K)`` for a draft costing ``c`` target forwards, c in
  {0.02, 0.05, 0.1, 0.2}, and the optimal K per (alpha, c), both within K <= 10 and unrestricted.

    .venv/bin/python experiments/lesson_speedup.py [--rounds 200000] [--rule-rounds 3000] [--out-dir experiments/results]
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
    expected_tokens,
    make_constant_alpha_pair,
    optimal_k,
    speculative_step,
    speedup,
)

ALPHAS = (0.5, 0.7, 0.9)
CS = (0.02, 0.05, 0.1, 0.2)
KS = tuple(range(1, 11))


def simulate_iid(alpha: float, K: int, rounds: int, rng: np.random.Generator) -> tuple[float, float]:
    """Mean and standard error of tokens per round under i.i.d. Bernoulli(alpha) acceptance."""
    acc = rng.random((rounds, K)) < alpha
    tokens = np.cumprod(acc, axis=1).sum(axis=1) + 1  # leading run of acceptances, plus one
    return float(tokens.mean()), float(tokens.std(ddof=1) / np.sqrt(rounds))


def simulate_rule(alpha: float, K: int, rounds: int, rng: np.random.Generator) -> tuple[float, float]:
    """Mean and standard error of tokens per round of the real rule on a constant-alpha pair."""
    target, draft = make_constant_alpha_pair(alpha, V=8, seed=0)
    prefix = np.array([0])
    tokens = np.array([len(speculative_step(target, draft, prefix, K, 1.0, rng))
                       for _ in range(rounds)])
    return float(tokens.mean()), float(tokens.std(ddof=1) / np.sqrt(rounds))


def write_table(rows, cols, path_base, title):
    with open(path_base + ".csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        for r in rows:
            w.writerow({c: (f"{r[c]:.6g}" if isinstance(r[c], float) else r[c]) for c in cols})
    md = [f"**{title}**", "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        md.append("| " + " | ".join(f"{r[c]:.4g}" if isinstance(r[c], float) else str(r[c])
                                    for c in cols) + " |")
    return "\n".join(md)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=200_000, help="rounds per (alpha, K), iid sim")
    ap.add_argument("--rule-rounds", type=int, default=3000,
                    help="rounds per (alpha, K) of the real speculative_step (0 to skip)")
    ap.add_argument("--out-dir", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                      "results"))
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    os.makedirs(args.out_dir, exist_ok=True)
    t0 = time.time()

    # --- table 1: E(alpha, K), formula vs simulations ---------------------------------------
    rows = []
    for a in ALPHAS:
        for K in KS:
            e = expected_tokens(a, K)
            m_iid, se_iid = simulate_iid(a, K, args.rounds, rng)
            r = dict(alpha=a, K=K, E_formula=e, E_sim_iid=m_iid, relerr_iid=abs(m_iid - e) / e,
                     z_iid=(m_iid - e) / se_iid)
            if args.rule_rounds > 0:
                m_rule, se_rule = simulate_rule(a, K, args.rule_rounds, rng)
                r.update(E_sim_rule=m_rule, relerr_rule=abs(m_rule - e) / e,
                         z_rule=(m_rule - e) / se_rule)
            rows.append(r)
    cols = list(rows[0].keys())
    t1 = write_table(rows, cols, os.path.join(args.out_dir, "lesson_speedup_tokens"),
                     "Expected tokens per target forward: formula vs simulation")
    max_iid = max(r["relerr_iid"] for r in rows)
    summ1 = (f"max relative error, iid simulation ({args.rounds} rounds each): {max_iid:.2%}; "
             f"max |z| = {max(abs(r['z_iid']) for r in rows):.2f}")
    if args.rule_rounds > 0:
        max_rule = max(r["relerr_rule"] for r in rows)
        summ1 += (f"\nmax relative error, real speculative_step ({args.rule_rounds} rounds each): "
                  f"{max_rule:.2%}; max |z| = {max(abs(r['z_rule']) for r in rows):.2f}")

    # --- table 2: speedup and optimal K -------------------------------------------------------
    srows = []
    for a in ALPHAS:
        for c in CS:
            s = np.asarray(speedup(a, np.array(KS), c))
            i = int(np.argmax(s))
            k_free, s_free = optimal_k(a, c, k_max=64)
            srows.append(dict(alpha=a, c=c, **{f"S_K{K}": float(s[j]) for j, K in enumerate(KS)},
                              best_K_le10=KS[i], best_S_le10=float(s[i]),
                              best_K=k_free, best_S=s_free))
    scols = list(srows[0].keys())
    t2 = write_table(srows, scols, os.path.join(args.out_dir, "lesson_speedup"),
                     "Speedup E / (1 + cK) for K = 1..10, optimal K (within K <= 10 and up to 64)")
    # compact optimal-K pivot (alpha rows, c columns): "K* (speedup)"
    pivot = ["**Optimal K (speedup) per alpha and draft cost c, K <= 64**", "",
             "| alpha \\ c | " + " | ".join(str(c) for c in CS) + " |", "|---" * (len(CS) + 1) + "|"]
    for a in ALPHAS:
        cells = [f"{r['best_K']} ({r['best_S']:.2f}x)" for r in srows if r["alpha"] == a]
        pivot.append(f"| {a} | " + " | ".join(cells) + " |")
    t3 = "\n".join(pivot)

    text = t1 + "\n\n" + summ1 + "\n\n" + t3 + "\n\n" + t2 + "\n"
    with open(os.path.join(args.out_dir, "lesson_speedup.md"), "w") as f:
        f.write(text)
    print(text)

    # --- plot -----------------------------------------------------------------------------------
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(11, 3.3))
    kk = np.arange(1, 11)
    colors = dict(zip(ALPHAS, ("C0", "C1", "C2")))
    for a in ALPHAS:
        axes[0].plot(kk, expected_tokens(a, kk), color=colors[a], label=f"alpha={a}")
        sub = [r for r in rows if r["alpha"] == a]
        axes[0].plot([r["K"] for r in sub], [r["E_sim_iid"] for r in sub], "o", ms=3,
                     color=colors[a])
        if args.rule_rounds > 0:
            axes[0].plot([r["K"] for r in sub], [r["E_sim_rule"] for r in sub], "x", ms=4,
                         color=colors[a])
    axes[0].set_title("tokens / target forward\n(line: formula, o: iid sim, x: real rule)",
                      fontsize=9)
    axes[0].set_xlabel("K")
    axes[0].legend(fontsize=7)
    for ax, c in zip(axes[1:], (0.05, 0.2)):
        for a in ALPHAS:
            s = speedup(a, kk, c)
            ax.plot(kk, s, color=colors[a], label=f"alpha={a}")
            i = int(np.argmax(s))
            ax.plot(kk[i], s[i], "*", ms=9, color=colors[a])
        ax.set_title(f"speedup E/(1+cK), c={c} (*: best K<=10)", fontsize=9)
        ax.set_xlabel("K")
        ax.axhline(1, color="gray", lw=0.5)
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(args.out_dir, "lesson_speedup.png"), dpi=80)
    print(f"wrote {args.out_dir}/lesson_speedup{{,_tokens}}.{{csv,md}} and lesson_speedup.png "
          f"in {time.time() - t0:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
