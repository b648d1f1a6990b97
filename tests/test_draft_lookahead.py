"""Lookahead decoding (eagle/draft/lookahead.py): the window's side rows against a dense reference
written from the method's definition, the Jacobi step and the pool, greedy decoding identical to
plain on several architectures and caches, exact sampling, config errors."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from eagle import Target, TreeDecoder, load_config
from eagle.config import ConfigError, as_config
from eagle.draft import Sampling
from eagle.draft.lookahead import LookaheadDrafter, NgramPool, window_rows
from eagle.target import TreeOutput
from eagle.tree import Tree

from conftest import TINY_VOCAB, check_stats, plain_greedy, prompt_ids

V = TINY_VOCAB
CONFIGS = Path(__file__).resolve().parent.parent / "experiments" / "configs"


def drafter(history, level=3, window=4, guesses=2, from_text=True) -> LookaheadDrafter:
    d = LookaheadDrafter(None, None, LookaheadDrafter.Options(level, window, guesses, from_text))
    d.reset(torch.tensor(history[:1]))
    d.extend(torch.zeros(len(history) - 1, 4), torch.tensor(history[1:]))
    return d


def dense_window(l: int, W: int):
    """Offsets and mask of an l x W window written cell by cell from the method: cell (j, i) sits at
    offset i + j + 1 and its context is level 0 up to column i, then column i down to level j."""
    cells = [(j, i) for j in range(l) for i in range(W)]
    offsets = torch.tensor([i + j + 1 for j, i in cells])
    sees = torch.zeros(len(cells), len(cells), dtype=torch.bool)
    for r, (j, i) in enumerate(cells):
        context = {(0, c) for c in range(i + 1)} | {(k, i) for k in range(1, j + 1)}
        for c, cell in enumerate(cells):
            sees[r, c] = cell in context
    return offsets, sees


@pytest.mark.parametrize("l,W", [(1, 1), (1, 5), (2, 3), (3, 4), (6, 2)])
def test_window_rows_equal_the_dense_definition(l, W):
    gen = torch.Generator().manual_seed(l * 10 + W)
    levels = torch.randint(0, V, (l, W), generator=gen).tolist()
    side = window_rows(levels)
    offsets, sees = dense_window(l, W)
    assert side.tokens.tolist() == [t for lv in levels for t in lv]
    assert torch.equal(side.offsets, offsets) and torch.equal(side.sees, sees)
    # every cell sees one token per offset 1 .. its own: a contiguous text after the root
    for r in range(l * W):
        assert sorted(side.offsets[side.sees[r]].tolist()) == list(range(1, int(side.offsets[r]) + 1))


def test_window_rows_through_the_target_equal_a_dense_forward(llama):
    """The window's rows in one target forward beside a tree == a plain forward over the text each
    cell continues (prefix + root + its trajectory), cell by cell; the tree's rows are unchanged."""
    model, _ = llama
    target = Target(model, "reference")
    gen = torch.Generator().manual_seed(5)
    prefix = torch.randint(0, V, (10,), generator=gen)
    levels = torch.randint(0, V, (3, 4), generator=gen).tolist()
    root, a, b = int(prefix[-1]), 11, 12
    tree = Tree.from_lists([root, a, b], [-1, 0, 1]).with_side(window_rows(levels))
    cache = target.new_cache()
    target.prefill(prefix[:-1], cache)
    out = target.tree_forward(tree, cache)

    def last_logits(text):
        with torch.no_grad():
            return model(input_ids=torch.cat([prefix[:-1], torch.tensor(text)])[None]).logits[0, -1].float()

    torch.testing.assert_close(out.logits[2], last_logits([root, a, b]), atol=1e-4, rtol=0)
    for j in range(3):
        for i in range(4):
            text = [root] + levels[0][: i + 1] + [levels[k][i] for k in range(1, j + 1)]
            torch.testing.assert_close(out.side.logits[j * 4 + i], last_logits(text), atol=1e-4, rtol=0)


def test_pool_most_recent_first_and_bounded():
    pool = NgramPool(3, cap=2)
    for g in ([1, 2, 3], [1, 4, 5], [1, 2, 3], [1, 6, 7], [2, 1, 1]):
        pool.add(g)
    assert pool.get(1, 5) == [(6, 7), (2, 3)] and pool.get(2, 5) == [(1, 1)] and pool.get(9, 5) == []
    empty = NgramPool(3, cap=0)
    empty.add([1, 2, 3])
    assert len(empty) == 0


def test_text_ngrams_become_a_trie_under_the_root():
    #          0  1  2  3  4  5  6  7  8  9
    history = [5, 1, 2, 3, 4, 1, 2, 6, 9, 1]
    d = drafter(history, level=3, window=4, guesses=3)
    assert d.pool.get(1, 3) == [(2, 6), (2, 3)]  # the most recent n-gram starting with 1 first
    tree = d.propose(1, Sampling())
    assert tree.tokens.tolist() == [1, 2, 6, 3] and tree.parents.tolist() == [-1, 0, 1, 1]
    assert tree.q is None  # point-mass children: the stochastic verifier stays exact
    assert len(tree) + len(tree.side) <= LookaheadDrafter.max_nodes(None, d.options)
    no_text = drafter(history, level=3, window=4, guesses=3, from_text=False)
    assert no_text.propose(1, Sampling()).tokens.tolist() == [1]


def test_lookahead_pool_seeds_the_ngram_drafter():
    from eagle.draft import NgramDrafter, TreeShape

    history = [4, 1, 2, 3, 9, 9, 1]
    ng = NgramDrafter(None, TreeShape("chain", depth=2), NgramDrafter.Options(max_ngram=1, branches=3))
    ng.reset(torch.tensor(history[:1]))
    ng.extend(torch.zeros(len(history) - 1, 4), torch.tensor(history[1:]))
    assert ng.continuations() == [[2, 3]]  # unchanged without a pool
    la = drafter([1, 2, 3, 1, 7, 7, 8, 1, 2, 5], level=4, window=2, guesses=3)
    assert la.pool.get(1, 3) == [(7, 7, 8), (2, 3, 1)]
    ng.pool = la.pool  # after the text's match, truncated to the depth; [2, 3] is not repeated
    assert ng.continuations() == [[2, 3], [7, 7]]


def fake_side(outputs: list[int]) -> TreeOutput:
    """A side output whose greedy tokens are ``outputs`` (one-hot logits)."""
    logits = torch.full((len(outputs), V), -10.0)
    logits[torch.arange(len(outputs)), torch.tensor(outputs)] = 10.0
    return TreeOutput(torch.zeros(len(outputs), 4), None, lambda: logits)


def test_jacobi_steps_fill_the_window_then_pool_trajectories():
    W, n = 3, 3
    history = [5, 6, 7, 8]
    d = drafter(history, level=n, window=W, guesses=4, from_text=False)
    tree = d.propose(8, Sampling())
    assert len(tree) == 1 and len(tree.side) == W  # warm-up: one level of text tokens
    assert set(tree.side.tokens.tolist()) <= set(history) and tree.side.offsets.tolist() == [1, 2, 3]
    level0 = tree.side.tokens.tolist()
    d.observe_side(fake_side([20, 21, 22]))  # level 1: cell (0, i)'s prediction of offset i + 2
    d.extend(torch.zeros(1, 4), torch.tensor([30]))  # one token accepted (the bonus): no shift
    tree = d.propose(30, Sampling())
    # the window kept its absolute positions: after the 1-token step its columns move one column left
    assert tree.side.tokens.view(2, W)[:, :2].tolist() == [level0[1:], [21, 22]]
    assert tree.side.offsets.tolist() == [1, 2, 3, 2, 3, 4]
    levels = tree.side.tokens.view(2, W).tolist()
    d.observe_side(fake_side([0] * W + [40, 41, 42]))  # full window: the last level's outputs count
    for i in range(W):  # each column's trajectory plus its output, keyed by its first token
        assert (levels[1][i], 40 + i) in d.pool.get(levels[0][i], 9)
    assert d.levels == [levels[1], [40, 41, 42]] and d.start == len(d.history) + 1  # root + 2
    d.extend(torch.zeros(1, 4), torch.tensor([50]))
    tree = d.propose(50, Sampling())  # steady state, one token: the window is the Jacobi trajectory as is
    assert tree.side.tokens.view(2, W).tolist() == [levels[1], [40, 41, 42]]
    d.observe_side(fake_side([0] * W + [60, 61, 62]))
    d.extend(torch.zeros(3, 4), torch.tensor([1, 2, 3]))  # three tokens: the first two columns are past
    tree = d.propose(3, Sampling())
    assert tree.side.tokens.view(2, W)[:, 0].tolist() == [42, 62] and tree.side.offsets.tolist()[:W] == [1, 2, 3]
    d.extend(torch.zeros(5, 4), torch.tensor([1, 2, 3, 4, 5]))  # no observe (a plain step), past W: restart
    assert len(d.propose(5, Sampling()).side) == W


@pytest.mark.parametrize("cache", ["static", "dynamic"])
@pytest.mark.parametrize("arch", ["llama", "qwen3", "mistral", "gemma3"])
def test_lookahead_greedy_equals_plain(arch, cache, tiny_model):
    model = tiny_model(arch)
    cfg = {"drafter": {"type": "lookahead", "level": 3, "window": 4, "guesses": 3}, "attention": "reference",
           "runtime": {"cache": cache}}
    dec = TreeDecoder.from_config(model, cfg)
    assert isinstance(dec.drafter, LookaheadDrafter)
    for seed in (1, 2):
        prompt = prompt_ids(seed)
        out = dec.generate(prompt, 40)
        assert out.tokens == plain_greedy(model, prompt, n=40)
        check_stats(out.stats, out.tokens)
        # the window's rows ran beside every drafted tree: at most (level - 1) x window a step
        assert 0 < out.stats.side_rows <= 2 * 4 * out.stats.target_forwards
        assert out.stats.as_dict()["mean_side_rows"] == out.stats.side_rows / out.stats.target_forwards


@pytest.mark.compile
def test_lookahead_on_a_compiled_target_equals_plain(tiny_model, tmp_path, monkeypatch):
    """runtime.compile: the window's side rows and the guesses share the compiled buckets (the
    shipped config's bucket sizes): still plain greedy's output."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    torch._dynamo.reset()
    model = tiny_model("llama")
    cfg = yaml.safe_load((CONFIGS / "lookahead.yaml").read_text())
    cfg["runtime"] = {**cfg.get("runtime", {}), "compile": True}
    dec = TreeDecoder.from_config(model, cfg)
    prompt = torch.tensor([3, 17, 42, 9, 3, 17, 42, 9, 3, 17])
    out = dec.generate(prompt, 30)
    assert out.tokens == plain_greedy(model, prompt, n=30)
    assert out.stats.side_rows > 0
    check_stats(out.stats, out.tokens)


def test_lookahead_pool_hits_on_a_repetitive_prompt(llama):
    """The tiny model falls into a loop, which the pool (text n-grams and Jacobi trajectories)
    then predicts: several tokens per forward, still plain greedy's output."""
    model, target = llama
    prompt = torch.tensor([3, 17, 42, 9, 3, 17, 42, 9, 3, 17, 42, 9, 3, 17])
    n = 60
    for from_text in (True, False):
        cfg = {"drafter": {"type": "lookahead", "level": 4, "window": 4, "guesses": 4, "from_text": from_text}}
        dec = TreeDecoder(target, as_config(cfg).build_drafter(target))
        out = dec.generate(prompt, n)
        assert out.tokens == plain_greedy(model, prompt, n=n)
        assert out.stats.tau > 1.5, (from_text, out.stats.tau)
        check_stats(out.stats, out.tokens)


def test_lookahead_sampling_runs_and_is_seeded(llama):
    model, target = llama
    dec = TreeDecoder(target, as_config({"drafter": {"type": "lookahead"}}).build_drafter(target))
    a = dec.generate(prompt_ids(3), 30, temperature=0.8, seed=4)
    b = dec.generate(prompt_ids(3), 30, temperature=0.8, seed=4)
    assert a.tokens == b.tokens and len(a.tokens) == 30
    check_stats(a.stats, a.tokens)


@pytest.mark.statistical
def test_sampling_over_lookahead_trees_keeps_the_target_distribution():
    """Steps verify the pool tries a lookahead drafter proposes (point-mass children, several
    branches): the first two emitted tokens follow the target's distribution, TV < 0.01 over 1e5
    samples."""
    from test_verify import V as V6, exact_first_and_joint, expected_tv_noise, histograms, tables, tv

    from eagle.verify import sample_verify

    target, _ = tables()
    # a pool holding several continuations per token, of which the target likes some more than others
    d = drafter([0, 2, 1, 3, 3, 0, 5, 2, 1, 4, 5, 5, 2, 2, 1, 0, 4, 5, 3, 1, 4, 5, 0], level=3, window=2, guesses=3)
    trees = {r: d.propose(r, Sampling()) for r in range(V6)}
    assert all(len(t) > 2 for t in trees.values()) and any(len(t.children()[0]) > 1 for t in trees.values())
    N = 100_000
    gen = torch.Generator().manual_seed(9)
    first, second = np.empty(N, dtype=np.int64), np.empty(N, dtype=np.int64)
    accepted = 0
    for n in range(N):
        tree = trees[0]
        path, bonus = sample_verify(tree, target[tree.tokens], 1.0, 1.0, gen)
        out = tree.tokens[path[1:]].tolist() + [bonus]
        accepted += len(path) > 1
        if len(out) < 2:
            tree = trees[out[0]]
            path, bonus = sample_verify(tree, target[tree.tokens], 1.0, 1.0, gen)
            out = out + tree.tokens[path[1:]].tolist() + [bonus]
        first[n], second[n] = out[0], out[1]
    f, j = histograms(first, second)
    p1, joint = exact_first_and_joint()
    assert expected_tv_noise(joint, N) < 0.004 and 0.3 < accepted / N < 0.999
    assert tv(f, p1) < 0.01 and tv(j, joint) < 0.01, (tv(f, p1), tv(j, joint))


@pytest.mark.parametrize("key,value,msg", [("level", 1, "drafter.level must be >= 2"),
                                           ("window", 0, "drafter.window must be >= 1"),
                                           ("guesses", -1, "drafter.guesses must be >= 0")])
def test_bad_lookahead_configs_are_one_line_errors(key, value, msg, tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(f"drafter:\n  type: lookahead\n  {key}: {value}\n")
    with pytest.raises(ConfigError, match=msg) as e:
        load_config(path)
    assert "\n" not in str(e.value)


def test_shipped_lookahead_config_and_buckets():
    cfg = load_config(CONFIGS / "lookahead.yaml")
    o = cfg.drafter.options
    assert cfg.drafter.type == "lookahead" and isinstance(o, LookaheadDrafter.Options)
    assert cfg.max_tree_nodes() == 1 + o.guesses * (o.level - 1) + (o.level - 1) * o.window
