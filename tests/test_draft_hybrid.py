"""Hybrid drafting (eagle/heads/hybrid.py): the text's longest match grafted into the EAGLE head's
tree as a trie branch under one node budget; greedy decoding with it equals plain decoding on every
shape (auto included), the branch is really grafted on a repeating prompt, trees keep the budget,
sampled trees lose their q, and bad configs are one-line errors.

Every model here is a tiny random fp32 model (``make_tiny_head_target`` in conftest.py).
"""
from __future__ import annotations

import math

import pytest
import torch

from eagle import Target, TreeDecoder
from eagle.config import ConfigError, config_from_dict
from eagle.draft import TreeShape
from eagle.heads.hybrid import HybridDrafter, HybridHeadDrafter, graft
from eagle.tree import Tree

from conftest import TINY_VOCAB, make_tiny_head_target, random_head

V = TINY_VOCAB
SHAPES = {
    "dynamic": dict(depth=3, top_k=2, total_tokens=7),
    "auto": dict(depth=3, top_k=2, total_tokens=7),
    "chain": dict(depth=3),
    "static": dict(choices=[[0], [1], [0, 0], [0, 1], [0, 0, 0]]),
}


def repeating_prompt(seed: int = 4, n: int = 9, times: int = 3) -> torch.Tensor:
    """``times`` copies of ``n`` random tokens: every suffix has an earlier occurrence."""
    base = torch.randint(0, V, (n,), generator=torch.Generator().manual_seed(seed))
    return base.repeat(times)


def recording(drafter):
    """The drafter with every proposed tree kept in ``drafter.trees``."""
    drafter.trees = []
    propose = drafter.propose

    def keep(root, sampling):
        drafter.trees.append(propose(root, sampling))
        return drafter.trees[-1]

    drafter.propose = keep
    return drafter


# ---- graft: the trie merge and the budget -----------------------------------------------------


def head_tree() -> Tree:
    """root 5 -> {7 -> {8, 9}, 6 -> {4}}; scores fall with depth, 6's branch the weakest."""
    return Tree(torch.tensor([5, 7, 6, 8, 9, 4]), torch.tensor([-1, 0, 0, 1, 1, 2]),
                scores=torch.tensor([0.0, -0.1, -1.0, -0.3, -0.5, -2.0]))


def test_graft_shares_coinciding_nodes_and_chains_the_rest():
    merged, shared, added = graft(head_tree(), [7, 9, 3, 2], budget=10)
    assert (shared, added) == (2, 2)
    assert merged.tokens.tolist() == [5, 7, 6, 8, 9, 4, 3, 2]  # the head's nodes first, in order
    assert merged.parents.tolist() == [-1, 0, 0, 1, 1, 2, 4, 6]  # 3 under the shared 9, then 2
    assert merged.q is None


def test_graft_of_a_match_the_tree_already_holds_changes_nothing():
    tree = head_tree()
    merged, shared, added = graft(tree, [7, 8], budget=10)
    assert merged is tree and (shared, added) == (2, 0)


def test_graft_cuts_the_lowest_scored_head_nodes_to_the_budget():
    merged, shared, added = graft(head_tree(), [6, 1, 2, 3], budget=6)
    # the shared path (6) stays although its score is low; 4 (the lowest) and 9 make room
    assert (shared, added) == (1, 3) and len(merged) == 6
    assert merged.tokens.tolist() == [5, 7, 6, 1, 2, 3]
    assert merged.parents.tolist() == [-1, 0, 0, 2, 3, 4]
    # a match longer than the budget: root + path + chain fill it exactly
    merged, shared, added = graft(head_tree(), [1, 2, 3, 4, 5, 6, 7], budget=4)
    assert (shared, added) == (0, 3) and merged.tokens.tolist() == [5, 1, 2, 3]


def test_valued_graft_keeps_the_best_nodes_of_head_and_match():
    """rate 0.9: the match's tokens (scores -0.1 + k log 0.9) outrank the head's 6 and 4, which go;
    rate 0.05: they rank below every head node, so a full budget keeps the head as it is, and one
    more slot takes the match's first token only."""
    merged, shared, added = graft(head_tree(), [7, 3, 2], budget=6, rate=0.9)
    assert (shared, added) == (1, 2) and merged.q is None
    assert merged.tokens.tolist() == [5, 7, 8, 9, 3, 2] and merged.parents.tolist() == [-1, 0, 1, 1, 1, 4]
    same, shared, added = graft(head_tree(), [7, 3, 2], budget=6, rate=0.05)
    assert (shared, added) == (1, 0) and same.tokens.tolist() == head_tree().tokens.tolist()
    merged, _, added = graft(head_tree(), [7, 3, 2], budget=7, rate=0.05)
    assert added == 1 and merged.tokens.tolist() == [5, 7, 6, 8, 9, 4, 3] and int(merged.parents[-1]) == 1


@pytest.mark.parametrize("seed", range(20))
def test_valued_graft_on_random_trees_is_a_budgeted_ancestor_closed_merge(seed):
    """Random head trees and matches: within the budget, every kept node's parent kept, the kept
    match tokens a prefix of the match below its shared path, and no kept node scored below a
    dropped one (the head's by its score, the match's by score + k log rate)."""
    from eagle.costs import random_tree

    gen = torch.Generator().manual_seed(seed)
    T = int(torch.randint(3, 12, (1,), generator=gen))
    tree = random_tree(T, V, gen)
    logp = -torch.rand(T, generator=gen) * 2  # (T,) per-node draft log-probs
    scores = torch.zeros(T)
    for i in range(1, T):
        scores[i] = scores[int(tree.parents[i])] + logp[i]
    tree = Tree(tree.tokens, tree.parents, None, scores)
    cont = torch.randint(0, V, (int(torch.randint(1, 6, (1,), generator=gen)),), generator=gen).tolist()
    if seed % 2:  # half the matches start along a path of the tree
        node, walk = int(torch.randint(1, T, (1,), generator=gen)), []
        while node > 0:
            walk.append(int(tree.tokens[node]))
            node = int(tree.parents[node])
        cont = walk[::-1] + cont
    budget, rate = T + int(torch.randint(0, 4, (1,), generator=gen)), float(torch.rand(1, generator=gen)) * 0.9 + 0.05
    merged, shared, added = graft(tree, cont, budget, rate)
    # the reference: walk the match down the tree, score its remaining tokens, keep the best budget - 1
    at, toks, par = 0, tree.tokens.tolist(), tree.parents.tolist()
    for t in cont:
        kids = [i for i in range(T) if par[i] == at and toks[i] == t]
        if not kids:
            break
        at = kids[0]
    rest = cont[shared:][: budget - 1 - int(tree.depth[at])]
    chain = [float(scores[at]) + k * math.log(rate) for k in range(1, len(rest) + 1)]
    best = sorted(scores[1:].tolist() + chain, reverse=True)[: min(budget, T + len(rest)) - 1]
    assert len(merged) <= budget
    assert merged.parents[0] == -1 and all(0 <= p < i for i, p in enumerate(merged.parents.tolist()) if i)
    if added:
        assert merged.q is None and merged.tokens[-added:].tolist() == rest[:added]
        assert sorted(merged.scores[1:].tolist(), reverse=True) == pytest.approx(best)
    else:
        assert torch.equal(merged.tokens, tree.tokens)
        assert not rest or chain[0] <= best[-1] + 1e-6


def test_graft_drops_q_of_a_sampled_tree():
    tree = head_tree()
    tree = Tree(tree.tokens, tree.parents, torch.full((6, V), 1.0 / V), tree.scores)
    merged, _, added = graft(tree, [3], budget=10)
    assert added == 1 and merged.q is None  # every child is now verified as a point mass


# ---- decoding: lossless, grafted, within the budget -------------------------------------------


@pytest.mark.parametrize("value_match", [False, True])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_greedy_hybrid_equals_plain_and_grafts_the_match(shape, value_match):
    model = make_tiny_head_target("llama")
    target = Target(model, "reference")
    tree = TreeShape(shape, **SHAPES[shape])
    dr = recording(HybridDrafter(target, random_head(model, seed=3), tree, match_depth=4, min_match_len=2,
                                 min_gain=0.0, value_match=value_match))
    prompt = repeating_prompt()
    out = TreeDecoder(target, dr).generate(prompt, 32)
    assert out.tokens == TreeDecoder(target, None).generate(prompt, 32).tokens
    assert dr.grafts > 0  # every step has a match in a repeating text
    assert max(len(t) for t in dr.trees) <= HybridHeadDrafter.max_nodes(tree, None) == tree.max_nodes
    assert out.stats.tree_nodes == sum(len(t) for t in dr.trees)


def test_with_auto_the_graft_fills_the_bucket_the_policy_chose():
    model = make_tiny_head_target("llama")
    target = Target(model, "reference")
    dr = HybridDrafter(target, random_head(model, seed=3), TreeShape("auto", depth=3, top_k=2, total_tokens=15),
                       min_match_len=2, min_gain=0.0)
    TreeDecoder(target, dr)  # hands the drafter its tree policy
    buckets = dr.tree_policy.costs.buckets
    assert buckets[0] == 1 and len(buckets) >= 3 and buckets[-1] == dr.budget
    bucket = lambda n: next(b for b in buckets if b >= n)  # noqa: E731
    assert dr.step_budget(1) == bucket(3)  # a plain step: room for the shortest match
    assert [dr.step_budget(n) for n in range(3, dr.budget + 1)] == [bucket(n) for n in range(3, dr.budget + 1)]
    plain = HybridDrafter(target, random_head(model, seed=3), TreeShape("dynamic", **SHAPES["dynamic"]))
    assert plain.step_budget(2) == plain.budget == 8


def test_the_branch_pauses_when_it_does_not_pay_and_explores():
    """min_gain above anything measurable (and no optimistic start): grafting waits EXPLORE
    matching steps each time."""
    model = make_tiny_head_target("llama")
    target = Target(model, "reference")
    tree = TreeShape("dynamic", **SHAPES["dynamic"])
    dr = HybridDrafter(target, random_head(model, seed=3), tree, match_depth=4, min_match_len=1, min_gain=100.0,
                       value_match=False)
    dr.gain = 0.0
    prompt = repeating_prompt()
    out = TreeDecoder(target, dr).generate(prompt, 48)
    assert out.tokens == TreeDecoder(target, None).generate(prompt, 48).tokens
    assert out.stats.target_forwards >= dr.EXPLORE
    assert 0 < dr.grafts <= out.stats.target_forwards // dr.EXPLORE  # EXPLORE matching steps between grafts


def test_match_acceptance_is_counted_from_the_emitted_tokens():
    model = make_tiny_head_target("llama")
    target = Target(model, "reference")
    dr = HybridDrafter(target, random_head(model, seed=3), TreeShape("chain", depth=3), min_gain=0.0)
    dr.reset(torch.tensor([1, 2, 3]))
    dr.gain = 0.0
    dr._last = ([4, 5, 6], 1)  # 4 was the head's own node
    dr.extend(torch.zeros(3, model.config.hidden_size), torch.tensor([4, 5, 9]))  # 4, 5 accepted; 9 the bonus
    assert dr.match_accepted == 1 and dr.gain == pytest.approx(dr.RECENT * 1)
    # the chain (5, 6) was reached at 5 (accepted) and at 6 (rejected): 1 of 2 on top of the decayed prior
    hits, tries = dr.PRIOR
    assert dr.rate == pytest.approx((dr.MEMORY * hits + 1) / (dr.MEMORY * tries + 2))
    dr._last = ([4, 5, 6], 1)
    dr.extend(torch.zeros(1, model.config.hidden_size), torch.tensor([8]))  # the head's 4 rejected: not reached
    assert dr.rate == pytest.approx((dr.MEMORY * hits + 1) / (dr.MEMORY * tries + 2))


def test_sampling_with_a_sampled_head_tree_runs_on_point_masses():
    model = make_tiny_head_target("llama")
    target = Target(model, "reference")
    dr = recording(HybridDrafter(target, random_head(model, seed=3), TreeShape("static", **SHAPES["static"]),
                                 sample=True, match_depth=3, min_gain=0.0))
    out = TreeDecoder(target, dr).generate(repeating_prompt(), 24, temperature=0.8, seed=1)
    assert len(out.tokens) == 24 and dr.grafts > 0
    assert sum(t.q is None for t in dr.trees) == dr.grafts  # the other trees keep the head's q


# ---- the config -------------------------------------------------------------------------------


def test_config_builds_the_hybrid_from_a_head_folder(monkeypatch, tmp_path):
    model = make_tiny_head_target("llama")
    target = Target(model, "reference")
    head = random_head(model, seed=3)
    (tmp_path / "head").mkdir()
    monkeypatch.setattr("eagle.heads.load_head", lambda path, model: head)  # the random head, as if loaded
    cfg = config_from_dict({"drafter": {"type": "hybrid", "head": "head", "match_depth": 3, "min_gain": 0},
                            "tree": {"shape": "auto", "depth": 3, "top_k": 2, "total_tokens": 6}},
                           tmp_path / "hybrid.yaml")
    assert cfg.max_tree_nodes() == 7
    dr = cfg.build_drafter(target)
    assert isinstance(dr, HybridHeadDrafter) and dr.options.match_depth == 3
    prompt = repeating_prompt(seed=6)
    assert TreeDecoder(target, dr).generate(prompt, 24).tokens == TreeDecoder(target).generate(prompt, 24).tokens
    assert dr.grafts > 0


@pytest.mark.parametrize("drafter, needle", [
    ({"type": "hybrid"}, "drafter.type 'hybrid' needs drafter.head"),
    ({"type": "hybrid", "head": "head", "min_match_len": 5, "match_depth": 3}, "min_match_len <= match_depth"),
    ({"type": "hybrid", "head": "head", "min_match_len": 0}, "1 <= min_match_len"),
    ({"type": "hybrid", "head": "head", "min_gain": -1.0}, "drafter.min_gain must be >= 0"),
    ({"type": "hybrid", "head": "head", "min_ngram": 4, "max_ngram": 2}, "min_ngram <= max_ngram"),
    ({"type": "hybrid", "head": "head", "min_match_len": 6, "match_depth": 6}, "must fit the tree"),
])
def test_bad_hybrid_configs_are_one_line_errors(tmp_path, drafter, needle):
    (tmp_path / "head").mkdir()
    with pytest.raises(ConfigError, match=needle) as e:
        config_from_dict({"drafter": drafter, "tree": {"shape": "chain", "depth": 3}}, tmp_path / "bad.yaml")
    assert "\n" not in str(e.value)


@pytest.mark.statistical
def test_sampling_over_grafted_trees_keeps_the_target_distribution():
    """Each step: a head tree whose children were sampled from the draft (with q and cumulative
    scores), then a fixed match chain grafted in under a budget that cuts head nodes (q dropped,
    also from trees that already hold the match: every child a point mass). The first two emitted tokens follow the target's distribution, TV <
    0.01 over 1e5 samples, with both match tokens and sampled head children accepted."""
    import numpy as np
    from test_verify import BUSHY, V as V6, draw_trees, exact_first_and_joint, expected_tv_noise, histograms, tables, tv

    from eagle.verify import probs_from_logits, sample_verify

    target, draft = tables()
    q = probs_from_logits(draft, 1.0, 1.0)  # (V6, V6)
    q64 = q.double().numpy()
    rng = np.random.default_rng(21)
    N, budget = 100_000, len(BUSHY)
    # the match after root r: the target's two likeliest continuations in a chain (r -> a -> b)
    best = target.argmax(-1).tolist()
    second = target.topk(2, dim=-1).indices[:, 1].tolist()
    conts = {r: [second[r], best[second[r]]] for r in range(V6)}
    parents = torch.tensor(BUSHY)
    par = np.array(BUSHY)

    def trees_for(root: int, n: int) -> np.ndarray:
        return draw_trees(np.full(n, root), BUSHY, q64, rng)  # (n, T)

    def step(row: np.ndarray, gen):
        tokens = torch.from_numpy(row)
        logq = np.log(q64[row[par[1:]], row[1:]])  # (T-1,) each child's draft log-prob
        scores = np.zeros(len(row))
        for c in range(1, len(row)):  # parents precede children in BUSHY
            scores[c] = scores[par[c]] + logq[c - 1]
        head = Tree(tokens, parents, q[tokens], torch.from_numpy(scores))
        merged, shared, added = graft(head, conts[int(row[0])], budget)
        assert len(merged) <= budget and (added == 0 or merged.q is None)
        path, bonus = sample_verify(merged, target[merged.tokens], 1.0, 1.0, gen)
        grafted = any(int(i) >= len(merged) - added for i in path[1:])
        return merged.tokens[path[1:]].tolist() + [bonus], grafted

    first_trees = trees_for(0, N)
    next_trees = {r: trees_for(r, N) for r in range(V6)}
    gen = torch.Generator().manual_seed(22)
    first, sec = np.empty(N, dtype=np.int64), np.empty(N, dtype=np.int64)
    accepted = via_match = 0
    for n in range(N):
        out, grafted = step(first_trees[n], gen)
        accepted += len(out) > 1
        via_match += grafted
        if len(out) < 2:
            more, _ = step(next_trees[out[0]][n], gen)
            out = out + more
        first[n], sec[n] = out[0], out[1]
    f, j = histograms(first, sec)
    p1, joint = exact_first_and_joint()
    assert expected_tv_noise(joint, N) < 0.004
    assert 0.1 < accepted / N < 0.999 and 0.05 < via_match / N < accepted / N, (accepted / N, via_match / N)
    assert tv(f, p1) < 0.01 and tv(j, joint) < 0.01, (tv(f, p1), tv(j, joint))
