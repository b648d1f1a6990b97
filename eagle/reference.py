"""Plain-numpy reference of chain speculative decoding (the "lesson" implementation).

This module is deliberately small and slow: it is the yardstick the real (torch, tree-shaped)
implementation is checked against, and the code the lesson in ``docs/lesson.md`` walks through.

Models
------
A *model* here is any callable ``model(tokens) -> logits`` where ``tokens`` is a 1-D int array of
``n`` ids and ``logits`` has shape ``(n, V)``; row ``i`` holds the next-token logits after
``tokens[: i + 1]`` (exactly what one forward pass of a causal LM returns).  The toy models built
by :func:`make_toy_model` / :func:`make_draft` and :func:`make_constant_alpha_pair` follow that
contract.

The rejection rule (why speculative sampling is exact)
------------------------------------------------------
Let ``p`` be the target distribution at some position and ``q`` the draft distribution there.
The draft proposes ``x ~ q``.  We keep ``x`` with probability ``min(1, p(x) / q(x))``; otherwise
we throw it away and sample a replacement from the residual ``r = (p - q)+ / Z`` where
``Z = sum_y max(p(y) - q(y), 0)``.

Probability that token ``y`` comes out of this position::

    P(y) = q(y) * min(1, p(y)/q(y))        (proposed y and kept it)
         + P(reject) * r(y)                (proposed anything, rejected, residual gave y)
         = min(q(y), p(y)) + (1 - beta) * (p(y) - q(y))+ / Z

with ``beta = sum_y min(p(y), q(y))`` the acceptance rate.  Since ``min(p, q) + (p - q)+ = p``
pointwise, ``sum (p - q)+ = 1 - beta``, i.e. ``Z = 1 - beta``, and the two terms add up to ``p(y)``.
The residual is precisely the mass that the draft under-proposes, so adding it back repairs the
distribution.  Positions are handled left to right, and position ``j + 1`` is only looked at
after positions ``1..j`` were accepted, so every emitted token is drawn from the target
conditional on the tokens emitted before it: the output sequence has the target's law, whatever
the draft is.  The bonus token (all ``K`` drafts accepted) is a plain sample from the target's
next distribution, which the one batched target call computed for free.

Greedy decoding (``temperature == 0``) is the degenerate case: both distributions are one-hot
at their argmax, so "accept with probability ``min(1, p/q)``" becomes "accept iff the draft's
argmax equals the target's argmax", and the residual is the target's argmax.

Expected speed
--------------
If every drafted token is accepted independently with probability ``alpha`` the number of tokens
emitted per round (= per target forward) is ``1 + alpha + ... + alpha^K``, see
:func:`expected_tokens`; with a draft forward costing ``c`` target forwards a round costs
``1 + c K`` and the speedup over plain decoding is ``expected_tokens(alpha, K) / (1 + c K)``
(:func:`speedup`).
"""
from __future__ import annotations

from typing import Callable, Optional

import numpy as np

__all__ = [
    "softmax",
    "sample_token",
    "speculative_step",
    "speculative_step_variant",
    "speculative_decode",
    "plain_decode",
    "expected_tokens",
    "speedup",
    "optimal_k",
    "acceptance_rate",
    "ToyModel",
    "make_toy_model",
    "make_draft",
    "make_constant_alpha_pair",
    "exact_next_distribution",
    "exact_joint_distribution",
]

Model = Callable[[np.ndarray], np.ndarray]

RULES = ("exact", "resample_target", "accept_all")


# ---------------------------------------------------------------------------------------------
# small helpers
# ---------------------------------------------------------------------------------------------


def softmax(logits: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    """``softmax(logits / temperature)`` over the last axis, numerically stable.

    ``temperature == 0`` returns the one-hot vector of the argmax (the limit of the softmax).
    Entries equal to ``-inf`` get probability 0.
    """
    logits = np.asarray(logits, dtype=np.float64)
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if temperature == 0:
        out = np.zeros_like(logits)
        np.put_along_axis(out, np.argmax(logits, axis=-1)[..., None], 1.0, axis=-1)
        return out
    z = logits / temperature
    z = z - np.max(z, axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


def sample_token(probs: np.ndarray, rng: np.random.Generator) -> int:
    """Draw one index from the 1-D distribution ``probs`` (inverse CDF, one uniform)."""
    cdf = np.cumsum(probs)
    idx = int(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"))
    return min(idx, len(probs) - 1)


def acceptance_rate(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Probability that a token drafted from ``q`` survives the rule: ``sum min(p, q)`` (last axis).

    Equals ``1 - TV(p, q)``.
    """
    return np.minimum(np.asarray(p), np.asarray(q)).sum(axis=-1)


def _check_common(prefix: np.ndarray, K: int, temperature: float) -> np.ndarray:
    prefix = np.asarray(prefix)
    if prefix.ndim != 1:
        raise ValueError(f"prefix must be a 1-D array of token ids, got shape {prefix.shape}")
    if prefix.size == 0:
        raise ValueError("prefix must contain at least one token (row i of the logits is the "
                         "distribution after tokens[:i+1], so an empty prefix has no next-token row)")
    if prefix.dtype.kind not in "iu":
        if not np.all(np.equal(np.mod(prefix, 1), 0)):
            raise ValueError("prefix must contain integer token ids")
        prefix = prefix.astype(np.int64)
    if isinstance(K, bool) or not isinstance(K, (int, np.integer)):
        raise ValueError(f"K must be an integer, got {K!r}")
    if K < 0:
        raise ValueError(f"K (number of drafted tokens) must be >= 0, got {K}")
    if not np.isfinite(temperature) or temperature < 0:
        raise ValueError(f"temperature must be a finite number >= 0, got {temperature}")
    return prefix.astype(np.int64, copy=False)


def _logits_rows(model: Model, tokens: np.ndarray, name: str) -> np.ndarray:
    out = np.asarray(model(tokens))
    if out.ndim != 2 or out.shape[0] != len(tokens):
        raise ValueError(f"{name} must return logits of shape (n, V) = ({len(tokens)}, V), "
                         f"got {out.shape}")
    return out


# ---------------------------------------------------------------------------------------------
# one round of speculative decoding
# ---------------------------------------------------------------------------------------------


def speculative_step(target: Model, draft: Model, prefix, K: int, temperature: float,
                     rng: np.random.Generator) -> list[int]:
    """One round of chain speculative decoding; returns the emitted token ids (1 to K+1 of them).

    1. Draft ``K`` tokens autoregressively: ``x_j ~ q_j = softmax(draft(prefix + x_<j)[-1] / T)``.
    2. One batched target call on ``prefix + x_1..x_K`` gives ``p_1..p_{K+1}`` (rows
       ``n-1 .. n+K-1``).
    3. Left to right: keep ``x_j`` with probability ``min(1, p_j(x_j) / q_j(x_j))``.  At the first
       rejection emit a sample of the residual ``(p_j - q_j)+`` (normalised) and stop.  If all
       ``K`` are kept, emit a bonus token sampled from ``p_{K+1}``.

    ``temperature == 0`` is greedy: drafts are the draft's argmax, kept while they equal the
    target's argmax, then the target's argmax at the first mismatch (or the bonus) is appended;
    ``rng`` is not used.  The emitted tokens have exactly the distribution of sampling them one by
    one from the target (see the module docstring for the proof).
    """
    return speculative_step_variant(target, draft, prefix, K, temperature, rng, rule="exact")


def speculative_step_variant(target: Model, draft: Model, prefix, K: int, temperature: float,
                             rng: Optional[np.random.Generator], rule: str = "exact") -> list[int]:
    """:func:`speculative_step` with a selectable acceptance rule, to show what breaks exactness.

    ``rule``:

    * ``"exact"`` -- the correct rule (this is what :func:`speculative_step` runs);
    * ``"resample_target"`` -- WRONG: on rejection sample the replacement from ``p`` instead of the
      residual ``(p - q)+``.  Tokens the draft over-proposes are then over-represented;
    * ``"accept_all"`` -- WRONG: keep every drafted token (i.e. sample from the draft).
    """
    if rule not in RULES:
        raise ValueError(f"rule must be one of {RULES}, got {rule!r}")
    prefix = _check_common(prefix, K, temperature)
    greedy = temperature == 0
    if rng is None and not greedy:
        rng = np.random.default_rng()
    n = len(prefix)

    # 1. draft K tokens autoregressively (K draft forwards).
    seq = prefix
    drafts: list[int] = []
    q_rows: list[np.ndarray] = []
    for _ in range(K):
        row = _logits_rows(draft, seq, "draft")[-1]
        if greedy:
            x = int(np.argmax(row))
        else:
            q = softmax(row, temperature)
            x = sample_token(q, rng)
            q_rows.append(q)
        drafts.append(x)
        seq = np.append(seq, x)

    # 2. one target forward over prefix + drafts: rows n-1 .. n+K-1 are p_1 .. p_{K+1}.
    t_logits = _logits_rows(target, seq, "target")[n - 1:]

    # 3. verify left to right.
    out: list[int] = []
    for j, x in enumerate(drafts):
        if greedy:
            best = int(np.argmax(t_logits[j]))
            if x == best or rule == "accept_all":
                out.append(x)
                continue
            out.append(best)
            return out
        p = softmax(t_logits[j], temperature)
        q = q_rows[j]
        # keep with probability min(1, p/q); written as u * q < p to avoid dividing by q.
        if rule == "accept_all" or rng.random() * q[x] < p[x]:
            out.append(x)
            continue
        if rule == "resample_target":
            out.append(sample_token(p, rng))
            return out
        residual = np.maximum(p - q, 0.0)
        if residual.sum() <= 0.0:  # only reachable through rounding when p == q
            residual = p
        out.append(sample_token(residual, rng))
        return out

    # all K accepted: bonus token from the target's last row.
    last = t_logits[K]
    out.append(int(np.argmax(last)) if greedy else sample_token(softmax(last, temperature), rng))
    return out


# ---------------------------------------------------------------------------------------------
# full decoding loops
# ---------------------------------------------------------------------------------------------


def _check_decode(prompt, max_new_tokens) -> None:
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, (int, np.integer)):
        raise ValueError(f"max_new_tokens must be an integer, got {max_new_tokens!r}")
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")


def speculative_decode(target: Model, draft: Model, prompt, K: int, temperature: float,
                       max_new_tokens: int, rng: Optional[np.random.Generator] = None) -> np.ndarray:
    """Generate exactly ``max_new_tokens`` tokens after ``prompt`` by repeated speculative rounds.

    Returns a 1-D int64 array of the new tokens only; the overshoot of the last round is cut off
    (cutting a sample of the target's sequence law at a fixed length keeps it exact).
    ``rng=None`` uses ``np.random.default_rng()``.
    """
    _check_decode(prompt, max_new_tokens)
    seq = _check_common(prompt, K, temperature)
    if rng is None:
        rng = np.random.default_rng()
    new: list[int] = []
    while len(new) < max_new_tokens:
        toks = speculative_step(target, draft, seq, K, temperature, rng)
        new.extend(toks)
        seq = np.concatenate([seq, np.asarray(toks, dtype=np.int64)])
    return np.asarray(new[:max_new_tokens], dtype=np.int64)


def plain_decode(target: Model, prompt, temperature: float, max_new_tokens: int,
                 rng: Optional[np.random.Generator] = None) -> np.ndarray:
    """Baseline: one target forward per token, sampling ``softmax(logits / T)`` (argmax at T=0)."""
    _check_decode(prompt, max_new_tokens)
    seq = _check_common(prompt, 0, temperature)
    if rng is None:
        rng = np.random.default_rng()
    new: list[int] = []
    for _ in range(max_new_tokens):
        row = _logits_rows(target, seq, "target")[-1]
        x = int(np.argmax(row)) if temperature == 0 else sample_token(softmax(row, temperature), rng)
        new.append(x)
        seq = np.append(seq, x)
    return np.asarray(new, dtype=np.int64)


# ---------------------------------------------------------------------------------------------
# speed model
# ---------------------------------------------------------------------------------------------


def expected_tokens(alpha, K):
    """Expected tokens per round (= per target forward) with i.i.d. acceptance probability ``alpha``.

    The round emits ``A + 1`` tokens where ``A`` (accepted drafts) is the length of the leading run
    of successes, capped at ``K``.  ``P(A >= j) = alpha^j`` so
    ``E[A + 1] = sum_{j=0..K} alpha^j = (1 - alpha^(K+1)) / (1 - alpha)``, and ``K + 1`` at
    ``alpha = 1``.  Broadcasts over numpy arrays; returns a float for scalar inputs.
    """
    a = np.asarray(alpha, dtype=np.float64)
    k = np.asarray(K)
    if np.any((a < 0) | (a > 1)) or np.any(np.isnan(a)):
        raise ValueError("alpha must lie in [0, 1]")
    if np.any(k < 0):
        raise ValueError("K must be >= 0")
    one = a == 1.0
    safe = np.where(one, 0.5, a)
    val = np.where(one, k + 1.0, (1.0 - safe ** (k + 1)) / (1.0 - safe))
    return float(val) if np.ndim(val) == 0 else val


def speedup(alpha, K, c):
    """Wall-clock speedup over plain decoding: ``expected_tokens(alpha, K) / (1 + c K)``.

    ``c`` is the cost of one draft forward in units of one target forward (a round costs ``K``
    draft forwards plus one target forward; verifying ``K + 1`` positions is assumed to cost about
    as much as one, which holds while decoding is memory-bound).
    """
    c_arr = np.asarray(c, dtype=np.float64)
    if np.any(c_arr < 0):
        raise ValueError("c must be >= 0")
    val = np.asarray(expected_tokens(alpha, K)) / (1.0 + c_arr * np.asarray(K))
    return float(val) if np.ndim(val) == 0 else val


def optimal_k(alpha: float, c: float, k_max: int = 64) -> tuple[int, float]:
    """``(K*, speedup(alpha, K*, c))`` maximising the speedup over ``K = 1..k_max``."""
    ks = np.arange(1, k_max + 1)
    s = np.asarray(speedup(alpha, ks, c))
    i = int(np.argmax(s))
    return int(ks[i]), float(s[i])


# ---------------------------------------------------------------------------------------------
# toy models
# ---------------------------------------------------------------------------------------------


class ToyModel:
    """Logits from the last two tokens via random tables: ``scale * (A[t_i] + B[t_{i-1}])``.

    Row 0 (no previous token) uses ``A[t_0]`` only.  Callable with the model contract
    ``tokens (n,) -> logits (n, V)``; counts its forward calls in ``calls``.
    """

    def __init__(self, A: np.ndarray, B: np.ndarray, scale: float = 1.0):
        self.A = np.asarray(A, dtype=np.float64)
        self.B = np.asarray(B, dtype=np.float64)
        self.scale = float(scale)
        self.V = self.A.shape[1]
        self.calls = 0

    def __call__(self, tokens) -> np.ndarray:
        tokens = np.asarray(tokens, dtype=np.int64)
        self.calls += 1
        logits = self.A[tokens].copy()
        if len(tokens) > 1:
            logits[1:] += self.B[tokens[:-1]]
        return self.scale * logits


def make_toy_model(V: int, seed: int = 0, scale: float = 2.0, bigram_only: bool = False) -> ToyModel:
    """A random second-order toy LM over ``V`` tokens (``bigram_only`` drops the t_{i-1} table).

    ``scale`` sets how peaked the distributions are (logit std ~ ``scale``).
    """
    if V < 2:
        raise ValueError("V must be >= 2")
    r = np.random.default_rng(seed)
    A = r.standard_normal((V, V))
    B = np.zeros((V, V)) if bigram_only else r.standard_normal((V, V))
    return ToyModel(A / np.sqrt(2), B / np.sqrt(2), scale)


def make_draft(target: ToyModel, noise: float, seed: int = 1) -> ToyModel:
    """A draft that is a noisy copy of ``target``: its tables plus ``noise`` * Gaussian tables.

    ``noise = 0`` gives a draft identical to the target (acceptance 1); larger noise lowers the
    acceptance rate ``alpha`` smoothly, which makes alpha tunable.
    """
    if noise < 0:
        raise ValueError("noise must be >= 0")
    r = np.random.default_rng(seed)
    V = target.V
    A = target.A + noise * r.standard_normal((V, V)) / np.sqrt(2)
    B = target.B + noise * r.standard_normal((V, V)) / np.sqrt(2)
    return ToyModel(A, B, target.scale)


class _FixedModel:
    """Context-free model: the same next-token logits after every prefix."""

    def __init__(self, logits: np.ndarray):
        self.logits = np.asarray(logits, dtype=np.float64)
        self.calls = 0

    def __call__(self, tokens) -> np.ndarray:
        self.calls += 1
        return np.broadcast_to(self.logits, (len(tokens), len(self.logits)))


def make_constant_alpha_pair(alpha: float, V: int = 8, seed: int = 0):
    """``(target, draft)`` whose acceptance rate is exactly ``alpha`` at every position (T = 1).

    Both ignore the context.  The target ``p`` is a random distribution over tokens ``0..V-2``
    (token ``V-1`` has probability 0); the draft is ``q = alpha p + (1 - alpha) e_{V-1}``, so
    ``sum min(p, q) = alpha``.  Acceptances are then i.i.d. Bernoulli(alpha), which is the
    assumption behind :func:`expected_tokens`.  Only meaningful at temperature 1.
    """
    if not 0 <= alpha <= 1:
        raise ValueError("alpha must lie in [0, 1]")
    r = np.random.default_rng(seed)
    p = np.zeros(V)
    p[:-1] = r.dirichlet(np.ones(V - 1))
    q = alpha * p
    q[-1] += 1 - alpha
    with np.errstate(divide="ignore"):
        return _FixedModel(np.log(p)), _FixedModel(np.log(q))


# ---------------------------------------------------------------------------------------------
# exact distributions of the target (for the exactness checks)
# ---------------------------------------------------------------------------------------------


def exact_next_distribution(model: Model, prefix, temperature: float) -> np.ndarray:
    """``softmax(model(prefix)[-1] / T)``: the exact law of the next token."""
    prefix = _check_common(prefix, 0, temperature)
    return softmax(_logits_rows(model, prefix, "model")[-1], temperature)


def exact_joint_distribution(model: Model, prefix, temperature: float, length: int = 2) -> np.ndarray:
    """Exact joint law of the next ``length`` tokens as an array of shape ``(V,) * length``.

    Computed by enumerating all ``V^(length-1)`` continuations (small V only).
    """
    prefix = _check_common(prefix, 0, temperature)
    p1 = exact_next_distribution(model, prefix, temperature)
    if length == 1:
        return p1
    V = len(p1)
    out = np.empty((V,) * length)
    for x in range(V):
        out[x] = p1[x] * exact_joint_distribution(model, np.append(prefix, x), temperature,
                                                  length - 1)
    return out
