"""Prompt-lookup (n-gram) drafting (eagle/draft/ngram.py): continuations as branches of a trie, most
recent match first, min_ngram, truncated continuations; greedy decoding with the shipped ngram config
is exact and accepts drafts."""
from __future__ import annotations

from pathlib import Path

import torch

from eagle import TreeDecoder, load_config
from eagle.draft import NgramDrafter, Sampling, TreeShape

from conftest import check_stats, plain_greedy, prompt_ids

CONFIGS = Path(__file__).resolve().parent.parent / "experiments" / "configs"


def ngram_with_history(history, depth=5, **kw) -> NgramDrafter:
    d = NgramDrafter(None, TreeShape("chain", depth=depth), NgramDrafter.Options(**kw))
    d.reset(torch.tensor(history[:1]))
    d.extend(torch.zeros(len(history) - 1, 4), torch.tensor(history[1:]))
    assert d.history == list(history)
    return d


def test_ngram_continuations_branches():
    #          0  1  2  3  4  5  6  7  8  9 10 11 12
    history = [5, 1, 2, 3, 4, 9, 1, 2, 6, 7, 9, 1, 2]
    d = ngram_with_history(history, max_ngram=3, min_ngram=1, depth=3, branches=3)
    # [9, 1, 2] occurred at 5 -> 6 7 9; [1, 2] also at 1 -> 3 4 9; [2] adds nothing new
    assert d.continuations() == [[6, 7, 9], [3, 4, 9]]
    tree = d.propose(2, Sampling())
    assert tree.tokens.tolist() == [2, 6, 7, 9, 3, 4, 9]
    assert tree.parents.tolist() == [-1, 0, 1, 2, 0, 4, 5]
    assert len(tree.children()[0]) == 2
    # branches caps the number of continuations
    d1 = ngram_with_history(history, max_ngram=3, min_ngram=1, depth=3, branches=1)
    assert d1.continuations() == [[6, 7, 9]]
    assert d1.propose(2, Sampling()).tokens.tolist() == [2, 6, 7, 9]


def test_ngram_shared_prefix_becomes_trie():
    #          0  1  2  3  4  5  6  7  8  9 10 11
    history = [1, 2, 6, 7, 0, 1, 2, 6, 8, 0, 1, 2]
    d = ngram_with_history(history, max_ngram=3, min_ngram=1, depth=3, branches=3)
    assert d.continuations() == [[6, 8, 0], [6, 7, 0]]
    tree = d.propose(2, Sampling())
    assert tree.tokens.tolist() == [2, 6, 8, 0, 7, 0]
    assert tree.parents.tolist() == [-1, 0, 1, 2, 1, 4]
    assert tree.children()[1] == [2, 4]  # two branches under the shared first token


def test_ngram_most_recent_first_and_min_ngram():
    history = [3, 4, 8, 3, 4, 9, 9, 4]
    d = ngram_with_history(history, max_ngram=2, min_ngram=1, depth=2, branches=5)
    # suffix [9, 4]: no earlier occurrence; [4]: at 4 -> 9 9, at 1 -> 8 3 (most recent first)
    assert d.continuations() == [[9, 9], [8, 3]]
    d2 = ngram_with_history(history, max_ngram=2, min_ngram=2, depth=2, branches=5)
    assert d2.continuations() == []
    assert d2.propose(4, Sampling()).tokens.tolist() == [4]  # nothing matches: a one-node tree


def test_ngram_truncated_continuation_is_not_duplicated():
    # the most recent match of [7] continues with just [5] (end of history); a longer earlier one
    # starting with the same token is still added, the truncated prefix is not a separate branch
    history = [7, 5, 1, 2, 7, 5, 7]
    d = ngram_with_history(history, max_ngram=1, min_ngram=1, depth=3, branches=4)
    assert d.continuations() == [[5, 7], [5, 1, 2]]
    tree = d.propose(7, Sampling())
    assert tree.tokens.tolist() == [7, 5, 7, 1, 2]
    assert tree.parents.tolist() == [-1, 0, 1, 1, 3]


def test_ngram_decoder_greedy_exact_and_accepts(llama):
    model, target = llama
    prompt = prompt_ids(9)
    n = 60
    plain = plain_greedy(model, prompt, n=n)
    cfg = load_config(CONFIGS / "ngram.yaml")
    dec = TreeDecoder.from_config(target, cfg)
    assert isinstance(dec.drafter, NgramDrafter) and dec.drafter.branches == 3
    out = dec.generate(prompt, n)
    assert out.tokens == plain
    # the tiny model falls into a loop, which prompt lookup then predicts
    assert out.stats.tau > 1.2
    check_stats(out.stats, out.tokens)
