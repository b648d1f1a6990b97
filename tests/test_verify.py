"""Verification: greedy tree walk (and its tensor version against the walk), top-p, and the exactness
of stochastic tree verification.

The distribution tests emulate decoding on a tiny vocabulary where the target's next-token
distribution depends only on the current token (``logits[i] = L[tokens[i]]``), so the exact law of
the first two emitted tokens is known in closed form: ``P(x, y) = p_root(x) * p_x(y)``.
"""
from __future__ import annotations

import math
import time

import numpy as np
import pytest
import torch

from eagle.tree import Tree
from eagle.verify import greedy_verify, greedy_verify_reference, probs_from_logits, sample_verify, verify

from conftest import TINY_VOCAB, make_random_tree


def tv(a, b) -> float:
    return 0.5 * float(np.abs(np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)).sum())


def onehot_logits(best: list[int], V: int, margin: float = 5.0) -> torch.Tensor:
    logits = torch.zeros(len(best), V)
    logits[torch.arange(len(best)), torch.tensor(best)] = margin
    return logits


# ------------------------------------------------------------------------------------------------
# greedy
# ------------------------------------------------------------------------------------------------
#          0 (tok 1)
#        /    |     \
#    1 (5)  2 (7)   3 (9)
#             /  \      \
#          4 (3) 5 (4)  6 (2)
#                  |
#                7 (6)
G_TOKENS = [1, 5, 7, 9, 3, 4, 2, 6]
G_PARENTS = [-1, 0, 0, 0, 2, 2, 3, 5]


@pytest.mark.parametrize("best, path, bonus", [
    ([7, 0, 4, 0, 0, 6, 0, 8], [0, 2, 5, 7], 8),  # the whole deepest branch, bonus from the leaf
    ([7, 0, 4, 0, 0, 1, 0, 0], [0, 2, 5], 1),  # stops inside the branch
    ([7, 0, 3, 0, 0, 0, 0, 0], [0, 2, 4], 0),  # the first grandchild, which is a leaf
    ([9, 0, 0, 2, 0, 0, 0, 0], [0, 3, 6], 0),  # the last child of the root
    ([9, 0, 0, 3, 0, 0, 0, 0], [0, 3], 3),  # child accepted, grandchild rejected
    ([8, 7, 4, 0, 0, 6, 0, 8], [0], 8),  # no child matches
])
def test_greedy_verify_hand_made(best, path, bonus):
    tree = Tree.from_lists(G_TOKENS, G_PARENTS)
    logits = onehot_logits(best, 10)
    assert greedy_verify(tree, logits) == (path, bonus)
    assert verify(tree, logits, temperature=0.0) == (path, bonus)


def test_greedy_verify_single_node():
    tree = Tree.chain([4])
    logits = torch.tensor([[0.1, 0.3, 2.0, -1.0]])
    assert greedy_verify(tree, logits) == ([0], 2)


@pytest.mark.parametrize("seed", range(10))
def test_greedy_verify_random_vs_brute_force(seed):
    gen = torch.Generator().manual_seed(seed)
    V = 6
    tree = make_random_tree(25, V, gen, max_children=V)
    logits = torch.randn(25, V, generator=gen)
    # make acceptance likely: at a random half of the nodes the argmax is the token of a child
    children = tree.children()
    toks = tree.tokens.tolist()
    for i in range(25):
        if children[i] and torch.rand((), generator=gen) < 0.7:
            c = children[i][int(torch.randint(0, len(children[i]), (), generator=gen))]
            logits[i, toks[c]] = logits[i].max() + 1.0
    best = logits.argmax(-1).tolist()
    # brute force: the longest root path whose every edge matches the argmax of its parent
    good = [p for p in ([0] + tree.path_to(i)[1:] for i in range(25))
            if all(toks[b] == best[a] for a, b in zip(p, p[1:]))]
    expected = max(good, key=len)
    path, bonus = greedy_verify(tree, logits)
    assert path == expected
    assert bonus == best[path[-1]]


def _logits_following(tree: Tree, node: int, gen: torch.Generator) -> torch.Tensor:
    """Random logits (T, TINY_VOCAB) whose argmax walks the tree down to ``node`` (then leaves it)."""
    logits = torch.randn(len(tree), TINY_VOCAB, generator=gen)
    path = tree.path_to(node)
    for a, b in zip(path, path[1:]):
        logits[a, tree.tokens[b]] = 100.0
    return logits


@pytest.mark.parametrize("seed", range(40))
def test_greedy_verify_matches_the_walk(seed):
    gen = torch.Generator().manual_seed(seed)
    T = int(torch.randint(1, 40, (), generator=gen))
    # duplicate siblings allowed: the walk takes the first one, so must the tensor version
    tree = make_random_tree(T, 6 if seed % 2 else TINY_VOCAB, gen, distinct_siblings=bool(seed % 3))
    target_node = int(torch.randint(0, T, (), generator=gen))
    for logits in (_logits_following(tree, target_node, gen), torch.randn(T, TINY_VOCAB, generator=gen)):
        assert greedy_verify(tree, logits) == greedy_verify_reference(tree, logits)


def test_greedy_verify_takes_the_first_of_duplicate_siblings():
    # root 0 -> two children with token 5 (nodes 1, 2); only node 2 has a child
    tree = Tree.from_lists([9, 5, 5, 7], [-1, 0, 0, 2])
    logits = torch.zeros(4, TINY_VOCAB)
    logits[0, 5] = logits[1, 3] = logits[2, 7] = logits[3, 1] = 10.0
    assert greedy_verify(tree, logits) == greedy_verify_reference(tree, logits) == ([0, 1], 3)


def test_verify_rejects_negative_temperature():
    tree = Tree.chain([0, 1])
    with pytest.raises(ValueError):
        verify(tree, torch.zeros(2, 3), temperature=-0.5)


# ------------------------------------------------------------------------------------------------
# probs_from_logits
# ------------------------------------------------------------------------------------------------


def test_probs_from_logits_temperature():
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0])
    for t in (0.5, 1.0, 3.0):
        expected = torch.softmax(logits / t, -1)
        torch.testing.assert_close(probs_from_logits(logits, t), expected)
    assert probs_from_logits(logits, 0.5)[0] > probs_from_logits(logits, 2.0)[0]


@pytest.mark.parametrize("top_p, kept", [
    (1.0, [0, 1, 2, 3]),
    (0.97, [0, 1, 2, 3]),  # mass before token 3 is 0.95 < 0.97
    (0.93, [0, 1, 2]),
    (0.81, [0, 1, 2]),  # mass before token 2 is 0.8 < 0.81
    (0.79, [0, 1]),
    (0.51, [0, 1]),
    (0.49, [0]),
    (1e-6, [0]),  # the top token is always kept
])
def test_probs_from_logits_top_p(top_p, kept):
    base = torch.tensor([0.15, 0.5, 0.05, 0.3])  # order by prob: 1, 3, 0, 2
    order = [1, 3, 0, 2]
    logits = base.log()
    probs = probs_from_logits(logits, 1.0, top_p)
    kept_ids = [order[k] for k in kept]
    expected = torch.zeros(4)
    expected[kept_ids] = base[kept_ids] / base[kept_ids].sum()
    torch.testing.assert_close(probs, expected)


def test_probs_from_logits_batched_top_p():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, 11, generator=gen) * 2
    probs = probs_from_logits(logits, 0.8, 0.7)
    assert probs.shape == logits.shape
    torch.testing.assert_close(probs.sum(-1), torch.ones(3, 5))
    flat_l, flat_p = logits.view(-1, 11), probs.view(-1, 11)
    for row_l, row_p in zip(flat_l, flat_p):
        full = torch.softmax(row_l / 0.8, -1)
        order = full.argsort(descending=True)
        before = full[order].cumsum(0) - full[order]
        keep = order[before < 0.7]
        assert set(torch.nonzero(row_p).flatten().tolist()) == set(keep.tolist())
        torch.testing.assert_close(row_p[keep], full[keep] / full[keep].sum())


@pytest.mark.parametrize("temperature, top_p", [(0.0, 1.0), (-1.0, 1.0), (1.0, 0.0), (1.0, 1.5), (1.0, -0.1)])
def test_probs_from_logits_bad_args(temperature, top_p):
    with pytest.raises(ValueError):
        probs_from_logits(torch.zeros(4), temperature, top_p)


# ------------------------------------------------------------------------------------------------
# stochastic verification: small deterministic properties
# ------------------------------------------------------------------------------------------------


def test_sample_verify_reproducible_with_generator():
    gen = torch.Generator().manual_seed(0)
    tree = make_random_tree(12, 6, gen, max_children=6)
    logits = torch.randn(12, 6, generator=gen)
    runs = []
    for _ in range(2):
        g = torch.Generator().manual_seed(42)
        runs.append([sample_verify(tree, logits, 1.0, 1.0, g) for _ in range(50)])
    assert runs[0] == runs[1]
    assert len({(tuple(p), b) for p, b in runs[0]}) > 1  # it is random


def test_sample_verify_draft_equal_target_accepts_everything():
    """q == p at every node: min(1, p/q) = 1, so a sampled chain is always accepted in full."""
    V, K = 7, 5
    gen = torch.Generator().manual_seed(1)
    table = torch.randn(V, V, generator=gen)
    probs = probs_from_logits(table, 0.9)
    g = torch.Generator().manual_seed(2)
    for _ in range(200):
        toks = [int(torch.randint(0, V, (), generator=gen))]
        for _ in range(K):
            toks.append(int(torch.multinomial(probs[toks[-1]], 1, generator=gen)))
        t = torch.tensor(toks)
        tree = Tree(t, torch.arange(-1, K), q=probs[t])
        path, bonus = sample_verify(tree, table[t], 0.9, 1.0, g)
        assert path == list(range(K + 1))


def test_sample_verify_respects_top_p():
    V = 8
    logits = torch.tensor([[3.0, 2.5, 0.0, -1.0, 1.0, 0.5, -2.0, 0.2]] * 3)
    nucleus = set(torch.nonzero(probs_from_logits(logits[0], 1.0, 0.6)).flatten().tolist())
    assert 1 < len(nucleus) < V
    tree = Tree.from_lists([0, 6, 3], [-1, 0, 0])  # both drafted tokens are outside the nucleus
    g = torch.Generator().manual_seed(0)
    for _ in range(300):
        path, bonus = sample_verify(tree, logits, 1.0, 0.6, g)
        assert path == [0] and bonus in nucleus


# ------------------------------------------------------------------------------------------------
# stochastic verification: distribution of the emitted tokens
# ------------------------------------------------------------------------------------------------

V = 6
CHAIN = [-1, 0, 1, 2, 3]
# non-uniform: 3 children at the root, 2 at node 1, 1 at node 2, 2 at node 4, a depth-4 leaf
BUSHY = [-1, 0, 0, 0, 1, 1, 2, 4, 4, 7]
SHAPES = {"chain": CHAIN, "tree": BUSHY}


def tables(seed: int = 0):
    """Target and draft logit tables ``(V, V)``: row t = next-token logits after token t."""
    g = torch.Generator().manual_seed(seed)
    target = torch.randn(V, V, generator=g) * 2.5
    draft = target + torch.randn(V, V, generator=g) * 2.0  # a draft that disagrees noticeably
    return target, draft


def draw_trees(roots: np.ndarray, parents: list[int], q: np.ndarray, rng: np.random.Generator | None):
    """Token arrays ``(N, T)`` of trees with the given shape. Node f's children are drawn from
    ``q[token_f]`` without replacement in child order (Gumbel top-k) or, when ``rng`` is None, are its
    top-ranked tokens under ``q`` (deterministic children)."""
    N, T = len(roots), len(parents)
    kids = [[c for c in range(T) if parents[c] == f] for f in range(T)]
    toks = np.zeros((N, T), dtype=np.int64)
    toks[:, 0] = roots
    for f in range(T):
        if not kids[f]:
            continue
        qf = q[toks[:, f]]  # (N, V)
        if rng is None:
            keys = qf
        else:
            with np.errstate(divide="ignore"):
                keys = np.log(qf) + rng.gumbel(size=qf.shape)
        order = np.argsort(-keys, axis=1, kind="stable")
        for r, c in enumerate(kids[f]):
            toks[:, c] = order[:, r]
    return toks


def emit_two(verify_fn, parents: list[int], sampled: bool, N: int, seed: int, temperature: float = 1.0,
             top_p: float = 1.0, root: int = 0):
    """Run verification steps like the decoder until two tokens are emitted, N times.

    Returns ``(first, second, stats)``: arrays of the first two emitted tokens and a dict with
    the fraction of steps that accepted a drafted token and that accepted a non-first sibling."""
    target, draft = tables()
    q = probs_from_logits(draft, temperature, top_p)  # the drafter applies the same transform
    q64 = q.double().numpy()
    rng = np.random.default_rng(seed)
    par_t = torch.tensor(parents)
    first_trees = draw_trees(np.full(N, root), parents, q64, rng if sampled else None)
    if sampled:  # a fresh next-step tree per sample for each possible root
        next_trees = [draw_trees(np.full(N, r), parents, q64, rng) for r in range(V)]
    else:
        next_trees = [draw_trees(np.full(1, r), parents, q64, None) for r in range(V)]
    gen = torch.Generator().manual_seed(seed)
    first = np.empty(N, dtype=np.int64)
    second = np.empty(N, dtype=np.int64)
    accepted = sibling = 0
    cache: dict = {}

    def step(row: np.ndarray):
        key = None if sampled else row.tobytes()
        if key is not None and key in cache:
            tree, logits = cache[key]
        else:
            tokens = torch.from_numpy(row)
            tree = Tree(tokens, par_t, q[tokens] if sampled else None)
            logits = target[tokens]
            if key is not None:
                cache[key] = tree, logits
        path, bonus = verify_fn(tree, logits, temperature, top_p, gen)
        return path, [int(row[i]) for i in path[1:]] + [bonus]

    root_kids = [c for c in range(len(parents)) if parents[c] == 0]
    for n in range(N):
        path, out = step(first_trees[n])
        accepted += len(path) > 1
        sibling += len(path) > 1 and path[1] != root_kids[0]
        if len(out) < 2:  # nothing accepted: the second token comes from the next step
            _, more = step(next_trees[out[0]][n if sampled else 0])
            out = out + more
        first[n], second[n] = out[0], out[1]
    return first, second, {"accept": accepted / N, "sibling": sibling / N}


def exact_first_and_joint(temperature: float = 1.0, top_p: float = 1.0, root: int = 0):
    target, _ = tables()
    p = probs_from_logits(target, temperature, top_p).double().numpy()  # (V, V)
    return p[root], p[root][:, None] * p  # joint[x, y] = p_root(x) p_x(y)


def expected_tv_noise(p: np.ndarray, N: int) -> float:
    """Expected TV between an N-sample empirical distribution and p (normal approximation)."""
    p = np.asarray(p).ravel()
    return 0.5 * float(np.sum(np.sqrt(2 * p * (1 - p) / (math.pi * N))))


def histograms(first, second):
    f = np.bincount(first, minlength=V) / len(first)
    j = np.bincount(first * V + second, minlength=V * V).reshape(V, V) / len(first)
    return f, j


N_EXACT = 100_000


@pytest.mark.parametrize("sampled", [False, True], ids=["deterministic-children", "sampled-children"])
@pytest.mark.parametrize("shape", ["chain", "tree"])
@pytest.mark.statistical
def test_sample_verify_preserves_target_distribution(shape, sampled):
    parents = SHAPES[shape]
    t0 = time.perf_counter()
    seed = {"chain": 11, "tree": 13}[shape] + int(sampled)
    first, second, stats = emit_two(sample_verify, parents, sampled, N_EXACT, seed=seed)
    elapsed = time.perf_counter() - t0
    f, j = histograms(first, second)
    p1, joint = exact_first_and_joint()
    # the test has power: the sampling noise is well below the threshold
    assert expected_tv_noise(joint, N_EXACT) < 0.004
    assert tv(f, p1) < 0.01, (tv(f, p1), f, p1)
    assert tv(j, joint) < 0.01, tv(j, joint)
    # both outcomes of the acceptance test happen, and in a tree later siblings get accepted too
    assert 0.1 < stats["accept"] < 0.999, stats
    if shape == "tree":
        assert stats["sibling"] > 0.05, stats
    print(f"{shape}/{'sampled' if sampled else 'deterministic'}: {N_EXACT} samples in {elapsed:.1f}s, "
          f"TV first {tv(f, p1):.4f}, joint {tv(j, joint):.4f}, {stats}")


@pytest.mark.statistical
def test_sample_verify_top_p_distribution():
    """Temperature and nucleus filtering: the emitted token follows the filtered target. The drafted
    (deterministic) children come from an unfiltered draft, so some lie outside the nucleus."""
    N = 30_000
    first, second, stats = emit_two(sample_verify, BUSHY, False, N, seed=7, temperature=0.7, top_p=0.8, root=3)
    f, j = histograms(first, second)
    p1, joint = exact_first_and_joint(0.7, 0.8, root=3)
    assert (p1 == 0).any()  # the filter really removes tokens
    assert (f[p1 == 0] == 0).all() and (j[joint == 0] == 0).all()
    assert expected_tv_noise(p1, N) < 0.004
    assert tv(f, p1) < 0.01, (tv(f, p1), f, p1)


# ---- the same harness detects wrong verifiers ------------------------------------------------------


def accept_all_verify(tree, logits, temperature, top_p=1.0, generator=None):
    """WRONG: accept the first drafted child at every level, then sample the bonus from the target."""
    children = tree.children()
    node, path = 0, [0]
    while children[node]:
        node = children[node][0]
        path.append(node)
    p = probs_from_logits(logits[node], temperature, top_p)
    return path, int(torch.multinomial(p, 1, generator=generator))


def no_residual_verify(tree, logits, temperature, top_p=1.0, generator=None):
    """WRONG: the right acceptance test, but a rejected proposal does not update p / q (the bonus is
    drawn from the unmodified target distribution)."""
    probs = probs_from_logits(logits, temperature, top_p).double()
    q_all = None if tree.q is None else tree.q.double()
    tokens, children = tree.tokens.tolist(), tree.children()
    node, path = 0, [0]
    while True:
        p = probs[node]
        nxt = None
        for c in children[node]:
            x = tokens[c]
            qx = 1.0 if q_all is None else float(q_all[node, x])
            if qx > 0 and float(torch.rand((), generator=generator)) * qx < float(p[x]):
                nxt = c
                break
        if nxt is None:
            return path, int(torch.multinomial(p, 1, generator=generator))
        node = nxt
        path.append(node)


@pytest.mark.parametrize("wrong", [accept_all_verify, no_residual_verify], ids=["accept-all", "no-residual"])
@pytest.mark.parametrize("sampled", [False, True], ids=["deterministic-children", "sampled-children"])
@pytest.mark.statistical
def test_wrong_verifiers_are_detected(wrong, sampled):
    N = 10_000  # the real verifier stays < 0.01 at 10x this size (test above)
    first, second, _ = emit_two(wrong, BUSHY, sampled, N, seed=3)
    f, j = histograms(first, second)
    p1, joint = exact_first_and_joint()
    assert max(tv(f, p1), tv(j, joint)) > 0.05, (tv(f, p1), tv(j, joint))


# ---- children grown by the drafter's own sampler (grow_static) ------------------------------------


def _first_token_tv_through_grow_static(choices, n: int, seed: int) -> float:
    from eagle.draft.base import Sampling
    from eagle.draft.grow import grow_static

    p = torch.tensor([0.1, 0.2, 0.3, 0.4])  # target, the same after every token
    q = torch.tensor([0.5, 0.3, 0.15, 0.05])  # draft, the same after every token
    g = torch.Generator().manual_seed(seed)
    sampling = Sampling(1.0, 1.0, g)
    counts = np.zeros(4)
    for _ in range(n):
        tree = grow_static(0, choices, lambda t, nodes: q.log().expand(len(nodes), 4), sampling, sample=True)
        assert tree.q is not None
        path, bonus = sample_verify(tree, p.log().expand(len(tree), 4), 1.0, 1.0, g)
        counts[int(tree.tokens[path[1]]) if len(path) > 1 else bonus] += 1
    return tv(counts / n, p.numpy())


@pytest.mark.statistical
def test_grow_static_sampled_children_exact():
    # consecutive ranks: the children are the first draws without replacement, as the verifier assumes
    assert _first_token_tv_through_grow_static([[0], [1], [2], [0, 0]], 6000, seed=1) < 0.03


# a rank gap in the choice list: sampled children are still the first draws without replacement
@pytest.mark.parametrize("choices", [[[0], [2]], [[1]]], ids=["ranks-0-2", "rank-1-only"])
@pytest.mark.statistical
def test_grow_static_sampled_children_with_rank_gaps_exact(choices):
    assert _first_token_tv_through_grow_static(choices, 6000, seed=2) < 0.03
