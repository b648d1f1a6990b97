"""``tree.shape: auto`` (eagle/draft/auto.py): calibration, costs, the objective's choices, the grown
trees, lossless decoding with it, and exact sampling over auto-grown trees."""
import numpy as np
import pytest
import torch

from eagle.draft.auto import AutoTreePolicy, Calibration, StepCosts
from eagle.tree import Tree


def test_calibration_counts_only_nodes_whose_parent_was_accepted():
    cal = Calibration(bands=4, prior_weight=0.0 + 1e-9)
    # root 0 -> 1 (q .9) -> 3 (q .6); root -> 2 (q .2); node 2 -> 4 (q .8): node 4's parent was rejected
    parents = torch.tensor([-1, 0, 0, 1, 2])
    q = torch.tensor([1.0, 0.9, 0.2, 0.6, 0.8])
    cal.observe(q, parents, [0, 1])  # 1 accepted, 3 rejected
    rates = (cal.hits / cal.trials)[cal.band(torch.tensor([0.9, 0.2, 0.6, 0.8]))]  # the long-run table
    assert rates.tolist() == pytest.approx([1.0, 0.0, 0.0, 1.0], abs=1e-6)
    # the recent factor: 1 of the 3 tried nodes accepted where the (prior) table expected 0.875 + 0.125 + 0.625
    assert cal.factor() == pytest.approx((1 + 2) / (1.625 + 2))
    assert cal.trials[3] == pytest.approx(1.0)  # 0.9 counted once; node 4 (q 0.8, same band) never tried
    # child acceptance: the root had a child accepted, node 1 had children but none accepted
    decay = cal.child_decay
    assert cal.child_trials == pytest.approx(1 + decay) and cal.child_hits == pytest.approx(decay)


def test_calibration_prior_is_the_band_midpoint():
    cal = Calibration(bands=10)
    assert cal.rate(torch.tensor([0.05, 0.55, 0.99])).tolist() == pytest.approx([0.05, 0.55, 0.95])
    assert cal.child() == 0.5


def test_rates_follow_how_predictable_the_recent_text_is():
    cal = Calibration(recent_window=16)
    two = torch.tensor([-1, 0, 0])  # the root with two drafted children
    q = torch.tensor([1.0, 0.55, 0.35])  # table (prior): 0.55 and 0.35
    assert cal.rate(q[1:]).tolist() == pytest.approx([0.55, 0.35])
    for _ in range(100):  # predictable text: the better child always accepted
        cal.observe(q, two, [0, 1])
    easy = cal.rate(torch.tensor([0.55, 0.35, 0.95]))
    table = (cal.hits / cal.trials)[cal.band(torch.tensor([0.55, 0.35]))]
    assert (easy[:2] > table).all() and easy[2] <= 1.0
    for _ in range(100):  # then text the draft misses: below the table
        cal.observe(q, two, [0])
    hard = cal.rate(torch.tensor([0.55, 0.35]))
    assert (hard < 0.5 * (cal.hits / cal.trials)[cal.band(torch.tensor([0.55, 0.35]))]).all()


def test_child_acceptance_follows_the_recent_steps():
    cal = Calibration(child_window=8)
    chain = torch.tensor([-1, 0, 1])  # root -> 1 -> 2
    q = torch.ones(3)
    for _ in range(200):  # predictable text: the child is always accepted
        cal.observe(q, chain, [0, 1, 2])
    assert cal.child() > 0.85  # the prior (0.5, weight 2) against ~8 recent observations
    for _ in range(40):  # then text the draft misses: the estimate follows within a few windows
        cal.observe(q, chain, [0])
    assert cal.child() < 0.15


def test_step_costs_buckets_and_optimism_about_unmeasured_levels():
    c = StepCosts([1, 4, 8, 16])
    assert [c.bucket(n) for n in (1, 2, 4, 5, 16)] == [1, 4, 4, 8, 16]
    assert c.draft_s(3) == 0.0  # nothing measured: optimistic, so the levels get tried
    c.add_levels([1.0, 0.002])  # each level's first call is a warm-up: not counted
    c.add_levels([0.001, 0.003])
    assert c.levels[0].values == [0.001] and c.levels[1].values == [0.003]
    for _ in range(3):
        c.add_levels([0.001, 0.003])
    assert c.level_s(0) == 0.001 and c.level_s(1) == 0.003
    assert c.level_s(2) == 0.001  # unmeasured: as cheap as the cheapest well-measured level
    c.add_levels([100.0] * 3)  # one odd slow call barely moves a median
    assert c.level_s(1) == 0.003


def test_verify_costs_follow_the_steps_in_every_bucket():
    c = StepCosts([1, 4, 8])
    c.set_verify({1: 0.010, 4: 0.011, 8: 0.015})
    assert [c.verify_s(n) for n in (1, 3, 8)] == pytest.approx([0.010, 0.011, 0.015])
    for _ in range(40):  # the machine got 2x slower: the 4-node steps show it, the 8-node estimate follows
        c.add_verify(4, 0.022)
    assert c.verify_s(8) == pytest.approx(0.030) and c.verify_s(1) == pytest.approx(0.020)


def test_a_buckets_own_steps_count_while_they_are_recent():
    c = StepCosts([1, 4, 8])
    c.set_verify({1: 0.010, 4: 0.011, 8: 0.015})
    for _ in range(5):  # the 8-node steps run slower than measured at start (a slow spell, say)
        c.add_verify(8, 0.040)
    assert c.verify_s(8) == pytest.approx(0.040)
    for _ in range(StepCosts.STALE):  # then only 4-node steps, at the measured speed
        c.add_verify(4, 0.011)
    assert c.verify_s(4) == pytest.approx(0.011)
    assert c.verify_s(8) == pytest.approx(0.015)  # its own times are stale: the measurement x the scale
    c.set_verify({1: 0.010, 4: 0.012, 8: 0.016}, capacity=512)  # another cache capacity: its own costs
    assert c.verify_s(4) == pytest.approx(0.012) and c.use_capacity(256) is False
    assert c.use_capacity(None) and c.verify_s(4) == pytest.approx(0.011)  # back: the first capacity's own


def _policy(verify: dict, level: float = 0.002, overhead: float = 0.001, max_nodes: int = 16) -> AutoTreePolicy:
    p = AutoTreePolicy(sorted(verify), max_nodes)
    p.costs.set_verify(verify)
    for _ in range(5):
        p.costs.add_levels([level] * 6)
    p.costs.overhead.reset([overhead])
    return p


def test_best_count_fills_a_flat_bucket_and_stops_where_the_next_one_does_not_pay():
    p = _policy({1: 0.020, 4: 0.020, 8: 0.021, 16: 0.030})
    vals = torch.tensor([0.9, 0.8, 0.5, 0.3, 0.2, 0.1, 0.05, 0.05, 0.01, 0.01, 0.01], dtype=torch.float64)
    n, rate = p.best_count(vals, levels=3)
    assert n == 7  # the 8-node bucket (root + 7) costs about one token; 16 nodes add 0.03 for 9 ms more
    assert rate == pytest.approx((1 + float(vals[:7].sum())) / (0.001 + 0.006 + 0.021))
    # a cheap 16-node bucket: take everything
    assert p.best_count(vals, 3)[0] == 7 and _policy({1: 0.020, 4: 0.020, 8: 0.020, 16: 0.020}).best_count(vals, 3)[0] == 11
    # worthless drafts and a dear tree: a plain step
    p = _policy({1: 0.010, 4: 0.030, 8: 0.040, 16: 0.060})
    assert p.best_count(torch.tensor([0.01, 0.01], dtype=torch.float64), 1)[0] == 0


def test_another_level_only_when_its_expected_gain_pays_for_it():
    vals = torch.tensor([0.9, 0.05], dtype=torch.float64)
    front = torch.tensor([0.9, 0.05], dtype=torch.float64)
    prof = torch.tensor([0.5, 0.1], dtype=torch.float64)  # the children's acceptance, rank by rank
    assert _policy({1: 0.02, 4: 0.02, 8: 0.02, 16: 0.02}, level=0.001).worth_another_level(vals, front, 1, prof)
    assert not _policy({1: 0.02, 4: 0.02, 8: 0.02, 16: 0.02}, level=0.05).worth_another_level(vals, front, 1, prof)
    weak = torch.tensor([0.01, 0.01], dtype=torch.float64)
    assert not _policy({1: 0.02, 4: 0.02, 8: 0.02, 16: 0.02}, level=0.004).worth_another_level(weak, weak, 1, prof)


def test_another_level_counts_the_nodes_its_gain_is_spread_over():
    # the same expected gain (0.7 a frontier node) on the first child or spread over three: spread,
    # it takes three verified nodes for what one brings concentrated, and at this level cost only the
    # concentrated level pays (rate 67.7 against 59.6 without it; spread 59.5)
    p = _policy({1: 0.02, 4: 0.02, 8: 0.02, 16: 0.03}, level=0.013)
    vals = front = torch.tensor([0.9, 0.6, 0.3], dtype=torch.float64)
    assert p.worth_another_level(vals, front, 2, torch.tensor([0.7, 0.0, 0.0], dtype=torch.float64))
    assert not p.worth_another_level(vals, front, 2, torch.tensor([0.7 / 3] * 3, dtype=torch.float64))


def _bigram_expand(table: torch.Tensor):
    """``expand`` of a drafter whose next-token logits depend on the node's token only."""
    def expand(tree: Tree, nodes: list[int]) -> torch.Tensor:
        return table[tree.tokens[nodes]]
    return expand


@pytest.mark.parametrize("seed", range(6))
def test_grown_trees_are_well_formed_and_keep_the_most_valuable_nodes(seed):
    g = torch.Generator().manual_seed(seed)
    V = 40
    table = torch.randn(V, V, generator=g) * (1 + seed)  # sharper drafts at higher seeds
    p = _policy({1: 0.02, 4: 0.02, 8: 0.022, 16: 0.026}, level=0.001)
    for step in range(5):
        tree = p.grow(step % V, depth=5, top_k=3, expand=_bigram_expand(table))
        T = len(tree)
        assert 1 <= T <= 16
        par = tree.parents.tolist()
        assert par[0] == -1 and all(0 <= par[i] < i for i in range(1, T))  # parents before children
        # each node's value is its parent's times the calibrated rate of its edge, so never above it
        q = p.last.q
        assert len(q) == T and torch.all((q[1:] > 0) & (q[1:] <= 1))
        # the time the objective counted on: the overhead and verification of this tree, plus its levels
        fixed = p.costs.overhead.value + p.costs.verify_s(T)
        assert fixed + p.costs.draft_s(int(tree.depth.max())) - 1e-12 <= p.last.seconds <= fixed + p.costs.draft_s(5) + 1e-12
        p.observe(tree, [0], 0.005, 0.02, 0.001)
    assert p.last is None and p.costs.overhead.value is not None


def test_the_objective_picks_deeper_trees_for_confident_drafts():
    V = 30
    sure = torch.full((V, V), -20.0)
    sure[torch.arange(V), (torch.arange(V) + 1) % V] = 20.0  # the draft is certain of one child
    unsure = torch.zeros(V, V)  # uniform: every child has q = 1/30
    costs = {1: 0.02, 4: 0.02, 8: 0.02, 16: 0.021}
    deep = _policy(costs, level=0.001).grow(0, depth=6, top_k=3, expand=_bigram_expand(sure))
    flat = _policy(costs, level=0.001).grow(0, depth=6, top_k=3, expand=_bigram_expand(unsure))
    assert int(deep.depth.max()) == 6 and deep.tokens[deep.parents >= 0].tolist()[:1] == [1]
    assert int(flat.depth.max()) <= 2


def test_a_shape_auto_config_needs_a_tree_growing_drafter(tmp_path):
    from eagle.config import ConfigError, load_config

    for drafter in ("ngram", "none"):
        (tmp_path / "c.yaml").write_text(f"drafter: {{type: {drafter}}}\ntree: {{shape: auto}}\n")
        with pytest.raises(ConfigError, match=f"tree.shape 'auto' needs a drafter that grows a tree.*'{drafter}'"):
            load_config(tmp_path / "c.yaml")
    (tmp_path / "c.yaml").write_text("drafter: {type: self, sample: true}\ntree: {shape: auto}\n")
    with pytest.raises(ConfigError, match="drafter.sample: true needs a tree shape that samples its children"):
        load_config(tmp_path / "c.yaml")


@pytest.mark.parametrize("config", ["eagle2-auto", "eagle3-auto", "hybrid-auto"])
def test_shipped_auto_configs_load(config):
    from pathlib import Path

    from eagle.config import load_config

    cfg = load_config(Path(__file__).resolve().parents[1] / "experiments/configs" / f"{config}.yaml")
    assert cfg.tree.shape == "auto" and cfg.max_tree_nodes() == 16


def test_self_drafter_auto_is_lossless_and_keeps_its_policy_across_generations(llama):
    from conftest import plain_greedy, prompt_ids

    from eagle import TreeDecoder
    from eagle.draft.selfdraft import SelfDrafter
    from eagle.draft.shape import TreeShape

    model, target = llama
    dec = TreeDecoder(target, SelfDrafter(target, TreeShape("auto", depth=4, top_k=2, total_tokens=7)))
    policy = dec.tree_policy
    assert policy is not None and policy.max_nodes == 8
    for seed in range(3):
        p = prompt_ids(seed, n=12)
        out = dec.generate(p, 30)
        assert out.tokens == plain_greedy(model, p, n=30)
        assert dec.tree_policy is policy
        assert sum(out.stats.depth_hist) == out.stats.target_forwards == sum(out.stats.nodes_hist)
    # the oracle drafter is always right: the calibration learns it and the trees grow deep
    assert out.stats.tau > 2.5 and policy.calibration.child() > 0.8
    assert set(policy.costs.shape) == {1, 4, 8} and all(policy.costs.verify_s(b) > 0 for b in (1, 4, 8))
    assert policy.report()["costs"]["verify_ms"][8] > 0


# ---- exact sampling over auto-grown trees --------------------------------------------------------


@pytest.mark.statistical
def test_sampling_over_auto_trees_keeps_the_target_distribution():
    """Steps verify trees grown by auto policies in several states (so the shape changes from step
    to step, chosen from the draft and the history, never from the target's current output): the
    first two emitted tokens are distributed as the target's, TV < 0.01 over 1e5 samples."""
    from test_verify import exact_first_and_joint, expected_tv_noise, histograms, tables, tv

    from eagle.verify import sample_verify

    target, draft = tables()
    V = target.shape[0]
    policies = [_policy({1: 0.02, 4: 0.02, 8: 0.02, 16: 0.02}, level=lv) for lv in (0.0005, 0.004, 0.02)]
    trees = {(k, r): pol.grow(r, depth=3, top_k=2, expand=_bigram_expand(draft))
             for k, pol in enumerate(policies) for r in range(V)}
    assert len({tuple(t.parents.tolist()) for t in trees.values()}) >= 3  # the shapes differ
    N = 100_000
    rng = np.random.default_rng(5)
    gen = torch.Generator().manual_seed(5)
    which = rng.integers(0, len(policies), size=(N, 2))
    first, second = np.empty(N, dtype=np.int64), np.empty(N, dtype=np.int64)
    for n in range(N):
        tree = trees[int(which[n, 0]), 0]
        path, bonus = sample_verify(tree, target[tree.tokens], 1.0, 1.0, gen)
        out = tree.tokens[path[1:]].tolist() + [bonus]
        if len(out) < 2:
            tree = trees[int(which[n, 1]), out[0]]
            path, bonus = sample_verify(tree, target[tree.tokens], 1.0, 1.0, gen)
            out = out + tree.tokens[path[1:]].tolist() + [bonus]
        first[n], second[n] = out[0], out[1]
    f, j = histograms(first, second)
    p1, joint = exact_first_and_joint()
    assert expected_tv_noise(joint, N) < 0.004
    assert tv(f, p1) < 0.01 and tv(j, joint) < 0.01, (tv(f, p1), tv(j, joint))


def test_generate_verbose_shows_the_chosen_trees_and_the_policy(tiny_target, tmp_path, capsys):
    from conftest import run_cli

    (tmp_path / "self-auto.yaml").write_text("drafter: {type: self}\ntree: {shape: auto, depth: 3, top_k: 2, "
                                             "total_tokens: 6}\n")
    code, out, err = run_cli(["generate", "--prompt", "Hi there", "--max-new-tokens", "12", "--target", tiny_target,
                              "--config", str(tmp_path / "self-auto.yaml"), "-v"], capsys)
    assert code == 0, err
    assert "tree depth (levels drafted): steps" in out and "tree nodes (root included):  steps" in out
    assert "auto tree policy: verify ms per bucket 1: " in out and "acceptance by draft probability: 0.0-0.1" in out
    assert "| x recent factor " in out and "| children accepted " in out
