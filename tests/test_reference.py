"""Tests of the plain-numpy speculative decoding reference (eagle/reference.py)."""
from __future__ import annotations

import numpy as np
import pytest

from eagle.reference import (
    acceptance_rate,
    exact_joint_distribution,
    exact_next_distribution,
    expected_tokens,
    make_constant_alpha_pair,
    make_draft,
    make_toy_model,
    optimal_k,
    plain_decode,
    softmax,
    speculative_decode,
    speculative_step,
    speculative_step_variant,
    speedup,
)


def tv(a, b):
    return 0.5 * float(np.abs(np.asarray(a) - np.asarray(b)).sum())


# ------------------------------------------------------------------------------------------------
# greedy decoding
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("K", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("noise", [0.3, 1.0, 3.0])
def test_greedy_equals_plain_argmax(K, noise):
    target = make_toy_model(16, seed=7)
    draft = make_draft(target, noise=noise, seed=11)
    for prompt in ([0], [3, 9], [5, 1, 14, 2]):
        ref = plain_decode(target, prompt, 0.0, 40)
        got = speculative_decode(target, draft, prompt, K, 0.0, 40)
        np.testing.assert_array_equal(got, ref)


def test_greedy_with_unrelated_draft_still_exact():
    target = make_toy_model(12, seed=1)
    draft = make_toy_model(12, seed=2)  # independent tables: mostly rejected
    for K in (1, 4):
        np.testing.assert_array_equal(speculative_decode(target, draft, [4], K, 0.0, 50),
                                      plain_decode(target, [4], 0.0, 50))


# ------------------------------------------------------------------------------------------------
# draft == target: everything is accepted
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("K", [1, 3, 6])
def test_identical_draft_accepts_all(temperature, K):
    target = make_toy_model(10, seed=5)
    draft = make_draft(target, noise=0.0)  # same tables, separate object
    rng = np.random.default_rng(0)
    seq = np.array([2, 7])
    for _ in range(50):
        target.calls = draft.calls = 0
        out = speculative_step(target, draft, seq, K, temperature, rng)
        assert len(out) == K + 1
        assert target.calls == 1 and draft.calls == K  # one batched target forward per round
        seq = np.concatenate([seq, out])


# ------------------------------------------------------------------------------------------------
# exactness in distribution
# ------------------------------------------------------------------------------------------------

# First-token test: V = 8, N = 1e5 samples.  For exact samples E[TV] ~ 0.5 * sqrt(2/pi) *
# sum_i sqrt(p_i (1 - p_i) / N) ~ 0.0023 here with a standard deviation ~ 0.001, so the threshold
# 0.01 sits far above the noise yet far below the TV of the wrong rules (> 0.1).
FIRST_N, FIRST_THRESHOLD = 100_000, 0.01
# Joint-of-two test: V = 4 (16 cells), N = 4e4: noise floor ~ 0.0033 (sd ~ 0.0015) -> 0.015.
JOINT_N, JOINT_THRESHOLD = 40_000, 0.015
# The wrong rules are far off; 2e4 samples put their TV well above WRONG_MIN.
WRONG_N, WRONG_MIN = 20_000, 0.05


def _first_token_tv(rule, n, K=2, temperature=1.0, seed=0):
    target = make_toy_model(8, seed=0)
    draft = make_draft(target, noise=1.0, seed=1)
    prefix = np.array([1, 2])
    p = exact_next_distribution(target, prefix, temperature)
    q = exact_next_distribution(draft, prefix, temperature)
    assert 0.3 < acceptance_rate(p, q) < 0.8  # the draft really differs from the target
    rng = np.random.default_rng(seed)
    counts = np.zeros(8)
    for _ in range(n):
        counts[speculative_step_variant(target, draft, prefix, K, temperature, rng, rule)[0]] += 1
    return tv(counts / n, p)


@pytest.mark.statistical
def test_first_token_distribution_matches_target():
    assert _first_token_tv("exact", FIRST_N) < FIRST_THRESHOLD


@pytest.mark.parametrize("rule", ["resample_target", "accept_all"])
@pytest.mark.statistical
def test_wrong_rules_are_detected(rule):
    """The same check fails for wrong rules, so the exactness test can fail."""
    assert _first_token_tv(rule, WRONG_N) > WRONG_MIN


@pytest.mark.statistical
def test_first_two_tokens_joint_matches_target():
    V, T = 4, 1.0
    target = make_toy_model(V, seed=3)
    draft = make_draft(target, noise=1.0, seed=4)
    prefix = np.array([0])
    joint = exact_joint_distribution(target, prefix, T, 2)
    assert abs(joint.sum() - 1) < 1e-12
    rng = np.random.default_rng(1)
    counts = np.zeros((V, V))
    for _ in range(JOINT_N):
        x1, x2 = speculative_decode(target, draft, prefix, 3, T, 2, rng)
        counts[x1, x2] += 1
    assert tv(counts / JOINT_N, joint) < JOINT_THRESHOLD


def test_k0_is_plain_sampling():
    target = make_toy_model(6, seed=2)
    rng = np.random.default_rng(3)
    out = speculative_step(target, make_draft(target, 1.0), [1], 0, 1.0, rng)
    assert len(out) == 1


# ------------------------------------------------------------------------------------------------
# expected tokens / speedup
# ------------------------------------------------------------------------------------------------


def test_expected_tokens_limits():
    for K in range(0, 12):
        assert expected_tokens(1.0, K) == K + 1
        assert expected_tokens(0.0, K) == 1.0
    np.testing.assert_allclose(expected_tokens(np.array([0.0, 0.5, 1.0]), 3), [1.0, 1.875, 4.0])
    np.testing.assert_allclose(expected_tokens(0.5, np.arange(4)), [1.0, 1.5, 1.75, 1.875])
    assert speedup(1.0, 4, 0.0) == 5.0
    k, s = optimal_k(0.5, 0.02)
    assert k == 4 and s == pytest.approx(speedup(0.5, 4, 0.02))
    assert speedup(0.5, 3, 0.02) < s and speedup(0.5, 5, 0.02) < s


@pytest.mark.statistical
def test_expected_tokens_matches_iid_simulation():
    rng = np.random.default_rng(0)
    n = 200_000
    for alpha in (0.3, 0.6, 0.9):
        for K in (1, 4, 8):
            tokens = np.cumprod(rng.random((n, K)) < alpha, axis=1).sum(axis=1) + 1
            se = tokens.std() / np.sqrt(n)
            assert abs(tokens.mean() - expected_tokens(alpha, K)) < 5 * se


def test_expected_tokens_matches_real_rule():
    """With acceptance rate exactly alpha at every position the real rule gives E(alpha, K)."""
    alpha, K, n = 0.7, 4, 4000
    target, draft = make_constant_alpha_pair(alpha, V=8)
    p = softmax(target.logits)
    q = softmax(draft.logits)
    assert abs(acceptance_rate(p, q) - alpha) < 1e-12
    rng = np.random.default_rng(0)
    tokens = np.array([len(speculative_step(target, draft, [0], K, 1.0, rng)) for _ in range(n)])
    se = tokens.std() / np.sqrt(n)
    assert abs(tokens.mean() - expected_tokens(alpha, K)) < 5 * se


# ------------------------------------------------------------------------------------------------
# API contract
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("temperature", [0.0, 0.8])
@pytest.mark.parametrize("K", [0, 1, 3, 8])
def test_decode_returns_exactly_max_new_tokens(K, temperature):
    target = make_toy_model(9, seed=4)
    draft = make_draft(target, noise=0.5)
    for m in (0, 1, 5, 17):
        out = speculative_decode(target, draft, [1, 2], K, temperature, m,
                                 rng=np.random.default_rng(m))
        assert out.shape == (m,) and out.dtype.kind == "i"
        assert np.all((out >= 0) & (out < 9))
    assert speculative_decode(target, draft, [1], 2, 1.0, 7).shape == (7,)  # rng=None


def test_softmax_stable_and_tempered():
    p = softmax(np.array([1000.0, 1000.0, -np.inf]), 1.0)
    np.testing.assert_allclose(p, [0.5, 0.5, 0.0])
    np.testing.assert_allclose(softmax(np.array([0.0, np.log(3.0)]), 1.0), [0.25, 0.75])
    np.testing.assert_allclose(softmax(np.array([0.0, np.log(3.0)]), 0.5), [0.1, 0.9])
    np.testing.assert_array_equal(softmax(np.array([0.1, 2.0, 1.0]), 0.0), [0, 1, 0])


def test_bad_inputs_raise():
    t = make_toy_model(5, seed=0)
    d = make_draft(t, 0.5)
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError):
        speculative_step(t, d, [1], -1, 1.0, rng)
    with pytest.raises(ValueError):
        speculative_step(t, d, [1], 1.5, 1.0, rng)
    with pytest.raises(ValueError):
        speculative_step(t, d, [1], 2, -0.1, rng)
    with pytest.raises(ValueError):
        speculative_step(t, d, [1], 2, float("nan"), rng)
    with pytest.raises(ValueError):
        speculative_step(t, d, [], 2, 1.0, rng)
    with pytest.raises(ValueError):
        speculative_step(t, d, [[1, 2]], 2, 1.0, rng)
    with pytest.raises(ValueError):
        speculative_decode(t, d, [1], 2, 1.0, -1)
    with pytest.raises(ValueError):
        speculative_decode(t, d, [1], 2, 1.0, 2.5)
    with pytest.raises(ValueError):
        plain_decode(t, [1], -1.0, 3)
    with pytest.raises(ValueError):
        speculative_step_variant(t, d, [1], 2, 1.0, rng, rule="nope")
    with pytest.raises(ValueError):
        speculative_step(t, lambda toks: np.zeros((len(toks) + 1, 5)), [1], 2, 1.0, rng)
    with pytest.raises(ValueError):
        expected_tokens(1.5, 3)
    with pytest.raises(ValueError):
        expected_tokens(0.5, -1)
    with pytest.raises(ValueError):
        speedup(0.5, 3, -0.1)
