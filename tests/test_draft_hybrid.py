"""Hybrid drafting (eagle/heads/hybrid.py): the text's longest match grafted into the EAGLE head's
tree as a trie branch under one node budget; greedy decoding with it equals plain decoding on every
shape (auto included), the branch is really grafted on a repeating prompt, trees keep the budget,
sampled trees lose their q, and bad configs are one-line errors.

Every model here is a tiny random fp32 model (``make_tiny_head_target`` in conftest.py).
"""
from __future__ import annotations

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


def test_graft_drops_q_of_a_sampled_tree():
    tree = head_tree()
    tree = Tree(tree.tokens, tree.parents, torch.full((6, V), 1.0 / V), tree.scores)
    merged, _, added = graft(tree, [3], budget=10)
    assert added == 1 and merged.q is None  # every child is now verified as a point mass


# ---- decoding: lossless, grafted, within the budget -------------------------------------------


@pytest.mark.parametrize("shape", list(SHAPES))
def test_greedy_hybrid_equals_plain_and_grafts_the_match(shape):
    model = make_tiny_head_target("llama")
    target = Target(model, "reference")
    tree = TreeShape(shape, **SHAPES[shape])
    dr = recording(HybridDrafter(target, random_head(model, seed=3), tree, match_depth=4, min_match_len=2,
                                 min_gain=0.0))
    prompt = repeating_prompt()
    out = TreeDecoder(target, dr).generate(prompt, 32)
    assert out.tokens == TreeDecoder(target, None).generate(prompt, 32).tokens
    assert dr.grafts > 0  # every step has a match in a repeating text
    assert max(len(t) for t in dr.trees) <= HybridHeadDrafter.max_nodes(tree, None) == tree.max_nodes
    assert out.stats.tree_nodes == sum(len(t) for t in dr.trees)


def test_the_branch_pauses_when_it_does_not_pay_and_explores():
    """min_gain above anything measurable (and no optimistic start): grafting waits EXPLORE
    matching steps each time."""
    model = make_tiny_head_target("llama")
    target = Target(model, "reference")
    tree = TreeShape("dynamic", **SHAPES["dynamic"])
    dr = HybridDrafter(target, random_head(model, seed=3), tree, match_depth=4, min_match_len=1, min_gain=100.0)
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
