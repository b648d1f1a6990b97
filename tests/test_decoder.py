"""TreeDecoder behaviour: EOS, token budget, stats, seeded sampling, argument checks."""
from __future__ import annotations

import math

import pytest
import torch

from eagle import DecodeStats, Target, TreeDecoder
from eagle.draft import NgramDrafter, NoDrafter, SelfDrafter, TreeShape

from conftest import TINY_VOCAB, RandomTreeDrafter, check_stats, plain_greedy, prompt_ids

V = TINY_VOCAB
K = 3


def self_chain(target, k: int = K, sample: bool = False):
    return SelfDrafter(target, TreeShape("chain", depth=k), SelfDrafter.Options(sample=sample))


# ------------------------------------------------------------------------------------------------
# EOS
# ------------------------------------------------------------------------------------------------


def _first_occurrences(tokens: list[int]) -> dict[int, int]:
    first: dict[int, int] = {}
    for i, t in enumerate(tokens):
        first.setdefault(t, i)
    return first


@pytest.mark.parametrize("where", ["inside-branch", "bonus", "first-token"])
def test_eos_stops_output(where, llama):
    model, target = llama
    # with the oracle K-chain, step s emits positions 4s-3 .. 4s; 4s is the bonus token
    ok = {"inside-branch": lambda j: j >= 2 and j % (K + 1) != 0,
          "bonus": lambda j: j >= K + 1 and j % (K + 1) == 0,
          "first-token": lambda j: j == 0}[where]
    for seed in range(1, 30):  # the first prompt whose greedy output has such a position
        prompt = prompt_ids(seed)
        plain = plain_greedy(model, prompt)
        candidates = sorted(j for t, j in _first_occurrences(plain).items() if ok(j))
        if candidates:
            break
    assert candidates, "no usable EOS position"
    j = candidates[0] if where == "first-token" else candidates[len(candidates) // 2]
    eos = plain[j]
    streamed: list[int] = []
    out = TreeDecoder(target, self_chain(target), eos_token_id=eos).generate(prompt, 40, on_tokens=streamed.extend)
    assert out.tokens == plain[: j + 1]
    assert streamed == out.tokens
    assert out.tokens == plain_greedy(model, prompt, eos=eos)  # transformers stops at the same place
    st = out.stats
    assert st.new_tokens == j + 1
    assert st.target_forwards == math.ceil(j / (K + 1))
    assert sum(st.accepted_hist) == st.target_forwards
    if j > 0:
        assert st.accepted_hist == [0] * K + [st.target_forwards]  # the last chain was accepted in full


def test_eos_list_and_plain_drafter(llama):
    model, target = llama
    prompt = prompt_ids(2)
    plain = plain_greedy(model, prompt)
    first = _first_occurrences(plain)
    stops = sorted(first.values())[3:5]  # two tokens whose first occurrence comes later
    eos = [plain[stops[1]], plain[stops[0]]]
    out = TreeDecoder(target, NoDrafter(), eos_token_id=eos).generate(prompt, 40)
    assert out.tokens == plain[: stops[0] + 1]
    assert out.stats.target_forwards == stops[0]


def test_eos_default_from_generation_config():
    from conftest import make_tiny_model

    model = make_tiny_model("qwen2", seed=3)  # a private copy: its generation config is edited
    prompt = prompt_ids(3)
    plain = plain_greedy(model, prompt)
    j = sorted(_first_occurrences(plain).values())[4]
    model.generation_config.eos_token_id = plain[j]
    out = TreeDecoder(model, None, attention="reference").generate(prompt, 40)
    assert out.tokens == plain[: j + 1]


# ------------------------------------------------------------------------------------------------
# token budget and stats
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 6, 7, 9, 13, 22])
def test_max_new_tokens_exact(n, llama):
    model, target = llama
    prompt = prompt_ids(4)
    plain = plain_greedy(model, prompt)
    for drafter in (self_chain(target), RandomTreeDrafter(V, seed=n), NoDrafter()):
        out = TreeDecoder(target, drafter).generate(prompt, n)
        assert out.tokens == plain[:n]
        assert out.stats.new_tokens == n
        assert sum(out.stats.accepted_hist) == out.stats.target_forwards
    if n == 1:
        assert out.stats.target_forwards == 0 and out.stats.tau == 1.0 and out.stats.accepted_hist == []


class Recording:
    """Mixin for a drafter: keep every proposed tree in ``self.proposed``."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.proposed = []

    def propose(self, root, sampling):
        tree = super().propose(root, sampling)
        self.proposed.append(tree)
        return tree


class RecordingSelfDrafter(Recording, SelfDrafter):
    pass


class RecordingNgram(Recording, NgramDrafter):
    pass


@pytest.mark.parametrize("kind", ["self-chain", "self-static", "self-auto", "random", "ngram"])
def test_stats_consistent(kind, llama):
    model, target = llama
    prompt = prompt_ids(5, n=30)
    depth = {"self-chain": K, "self-static": 2}.get(kind, K)
    n = 1 + 8 * (depth + 1)
    drafter = {"self-chain": lambda: RecordingSelfDrafter(target, TreeShape("chain", depth=K)),
               "self-static": lambda: RecordingSelfDrafter(target, TreeShape("static", choices=[[0], [1], [0, 0], [1, 0], [1, 1]])),
               "self-auto": lambda: RecordingSelfDrafter(target, TreeShape("auto", depth=K, top_k=2, total_tokens=6)),
               "random": lambda: RandomTreeDrafter(V, seed=1),
               "ngram": lambda: RecordingNgram(None, TreeShape("chain", depth=4),
                                                 NgramDrafter.Options(max_ngram=3, min_ngram=1, branches=3))}[kind]()
    out = TreeDecoder(target, drafter).generate(prompt, n)
    assert out.tokens == plain_greedy(model, prompt, n=n)
    check_stats(out.stats, out.tokens, drafter.proposed)
    if kind in ("self-chain", "self-static"):
        assert out.stats.tau == depth + 1 and out.stats.target_forwards == 8
        assert out.stats.per_depth_acceptance == [1.0] * depth and out.stats.alpha == 1.0
        # no truncation here: every emitted token is accounted for by the histogram
        assert sum((a + 1) * h for a, h in enumerate(out.stats.accepted_hist)) == n - 1


def test_stats_merge():
    a = DecodeStats(new_tokens=5, target_forwards=2, tree_nodes=7)
    a.record(3, 2)
    a.record(3, 0)
    b = DecodeStats(new_tokens=4, target_forwards=1, tree_nodes=5)
    b.record(5, 4)
    a.merge(b)
    assert a.new_tokens == 9 and a.target_forwards == 3 and a.tree_nodes == 12
    assert a.accepted_hist == [1, 0, 1, 0, 1]
    assert a.depth_tried == [3, 3, 3, 1, 1]
    assert a.depth_accepted == [2, 2, 1, 1, 0]
    assert a.per_depth_acceptance == [2 / 3, 2 / 3, 1 / 3, 1.0, 0.0]
    assert a.tau == (9 - 1) / 3
    # alpha: accepted 2 + 0 + 4 of the reached positions 3 + 1 + 5 (a rejection ends the path)
    assert a.alpha == 6 / 9
    a.record(0, 0)  # a plain step drafts nothing and reaches nothing
    assert a.alpha == 6 / 9 and a.as_dict()["alpha"] == 6 / 9


# ------------------------------------------------------------------------------------------------
# sampling
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["plain", "self-topk", "self-sampled", "random"])
def test_sampling_reproducible_with_seed(kind, llama):
    model, target = llama
    prompt = prompt_ids(6)

    def run(seed):
        drafter = {"plain": NoDrafter, "self-topk": lambda: self_chain(target),
                   "self-sampled": lambda: self_chain(target, sample=True),
                   "random": lambda: RandomTreeDrafter(V, seed=0)}[kind]()
        return TreeDecoder(target, drafter).generate(prompt, 30, temperature=1.3, top_p=0.95, seed=seed)

    a, b = run(123), run(123)
    assert a.tokens == b.tokens and len(a.tokens) == 30
    assert a.stats.accepted_hist == b.stats.accepted_hist
    others = [run(s).tokens for s in (1, 2, 3)]
    assert any(o != a.tokens for o in others)  # the seed matters
    greedy = plain_greedy(model, prompt)[:30]
    assert any(o != greedy for o in others + [a.tokens])  # and it is not greedy decoding
    if kind == "self-sampled":
        # children drawn from q == p (the target drafting for itself): practically always accepted
        assert a.stats.tau >= K + 0.5


def test_sampling_draws_from_nucleus(llama):
    """top_p tiny: only the top token survives, so sampling must equal greedy decoding."""
    model, target = llama
    prompt = prompt_ids(7)
    out = TreeDecoder(target, self_chain(target, sample=True)).generate(prompt, 25, temperature=0.9,
                                                                         top_p=1e-6, seed=5)
    assert out.tokens == plain_greedy(model, prompt)[:25]


# ------------------------------------------------------------------------------------------------
# argument checks
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kwargs", [
    dict(max_new_tokens=0), dict(max_new_tokens=-1), dict(max_new_tokens=2.5),
    dict(max_new_tokens=5, temperature=-0.1),
    dict(max_new_tokens=5, temperature=1.0, top_p=0.0), dict(max_new_tokens=5, top_p=1.5),
    dict(max_new_tokens=5, top_p=-0.5),
])
def test_bad_arguments_raise(kwargs, llama):
    _, target = llama
    with pytest.raises(ValueError):
        TreeDecoder(target).generate(prompt_ids(0), **kwargs)


@pytest.mark.parametrize("ids", [
    torch.tensor([], dtype=torch.long), [], torch.zeros(2, 5, dtype=torch.long),
    torch.zeros(1, 0, dtype=torch.long), torch.zeros(2, 2, 2, dtype=torch.long),
])
def test_bad_input_ids_raise(ids, llama):
    _, target = llama
    with pytest.raises(ValueError):
        TreeDecoder(target).generate(ids, 5)


def test_prompt_longer_than_context_raises(llama):
    model, target = llama
    ctx = model.config.max_position_embeddings
    with pytest.raises(ValueError, match="context"):
        TreeDecoder(target).generate(torch.zeros(ctx + 1, dtype=torch.long), 1)
    with pytest.raises(ValueError, match="context"):
        TreeDecoder(target).generate(torch.zeros(ctx - 3, dtype=torch.long), 4)
    ids = torch.randint(0, V, (ctx - 7,), generator=torch.Generator().manual_seed(0))
    plain = TreeDecoder(target).generate(ids, 7).tokens  # fits exactly
    assert len(plain) == 7
    # drafted nodes may sit past the last position (they are cut by the budget): same tokens
    out = TreeDecoder(target, self_chain(target, k=4)).generate(ids, 7)
    assert out.tokens == plain


def test_2d_input_and_bad_attention(llama):
    model, target = llama
    prompt = prompt_ids(8)
    out = TreeDecoder(target).generate(prompt[None], 6)
    assert out.tokens == plain_greedy(model, prompt)[:6]
    with pytest.raises(ValueError):
        Target(model, "flash")


def test_one_construction_path_cuts_the_buckets_at_the_drafters_largest_tree(llama):
    """The constructor and from_config make the target the same way: a model (not a Target) gets
    its step buckets cut at the drafter's largest tree, plain decoding at one node; a Target is used
    as given."""
    model, target = llama
    chain2 = SelfDrafter(target, TreeShape("chain", depth=2))
    assert TreeDecoder(model, chain2, attention="reference").target.runtime.buckets == [1, 3]
    assert TreeDecoder(model, attention="reference").target.runtime.buckets == [1]
    ngram = NgramDrafter(None, TreeShape("chain", depth=3), NgramDrafter.Options(branches=2))
    assert TreeDecoder(model, ngram, attention="reference").target.runtime.buckets == [1, 4, 7]
    cfg = {"drafter": {"type": "self"}, "tree": {"shape": "chain", "depth": 2}, "attention": "reference"}
    dec = TreeDecoder.from_config(model, cfg)
    assert dec.target.runtime.buckets == [1, 3] and dec.drafter.target is dec.target
    assert TreeDecoder(target, chain2).target is target
