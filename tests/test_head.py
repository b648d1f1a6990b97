"""The EAGLE draft head and its drafter: shapes, mask semantics, EAGLE-2 tree growth against slow
references, the head's KV cache invariant, lossless greedy decoding, checkpoint round trips.

Every model here is a tiny random fp32 model (``make_tiny_head_target`` in conftest.py; no downloads,
no real weights).
"""
from __future__ import annotations

import itertools
import json
import random
import shutil
import zlib

import pytest
import torch
from transformers import DynamicCache

from eagle import Target, TreeDecoder
from eagle.draft import Sampling, TreeShape
from eagle.draft.eagle_head import EagleDrafter
from eagle.draft.grow import grow_dynamic, select_dynamic
from eagle.head import (DraftHead, HeadConfig, HeadError, HeadMismatchError, HeadNotFoundError, load_head,
                        read_head_config, save_head)
from eagle.tree import Tree

from conftest import TINY_HIDDEN, TINY_VOCAB, make_tiny_head_target

V = TINY_VOCAB
H = TINY_HIDDEN
ARCHS = ("llama", "qwen2", "qwen3", "mistral")
STATIC = [[0], [1], [2], [0, 0], [0, 1], [1, 0], [0, 0, 0], [0, 0, 1], [0, 1, 0]]  # non-uniform


def random_head(model, seed: int = 1, draft_vocab=None) -> DraftHead:
    """``DraftHead.for_target`` with every weight randomized (not the identity-like init)."""
    torch.manual_seed(seed)
    head = DraftHead.for_target(model, draft_vocab)
    with torch.no_grad():
        for p in head.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return head.eval()


def bigram_head(model, seed: int = 1) -> DraftHead:
    """A head whose output is mostly the embedding of its input token (plus a little of the feature and
    of its decoder layer): its drafts are the target's "bigram" guesses, often but not always right."""
    torch.manual_seed(seed)
    head = DraftHead.for_target(model)
    h = head.hidden_size
    with torch.no_grad():
        head.fc.weight.zero_()
        head.fc.weight[:, :h] += torch.eye(h)  # token embedding half
        head.fc.weight[:, h:] += 0.01 * torch.eye(h)  # feature half: small, but it reaches the K/V
        head.fc.weight.add_(torch.randn_like(head.fc.weight) * 1e-3)
        head.layer.self_attn.o_proj.weight.mul_(0.1)
        head.layer.mlp.down_proj.weight.mul_(0.1)
    return head.eval()


def causal(B: int, T: int) -> torch.Tensor:
    return torch.ones(T, T, dtype=torch.bool).tril()[None, None].expand(B, 1, T, T)


def random_tree(T: int, rng: random.Random) -> list[int]:
    return [-1] + [rng.randrange(i) for i in range(1, T)]


# ------------------------------------------------------------------------------------------------
# 1. construction and shapes
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ARCHS)
def test_for_target_shapes_and_parameters(arch):
    model = make_tiny_head_target(arch)
    head = DraftHead.for_target(model).eval()
    assert isinstance(head.layer, type(model.model.layers[0]))
    assert isinstance(head.layer.input_layernorm, torch.nn.Identity)
    assert head.hidden_size == H
    B, T = 2, 7
    g = torch.Generator().manual_seed(0)
    feats, embeds = torch.randn(B, T, H, generator=g), torch.randn(B, T, H, generator=g)
    pos = torch.arange(T)[None].expand(B, T)
    with torch.no_grad():
        out = head(feats, embeds, pos, causal(B, T))
    assert out.shape == (B, T, H) and out.dtype == torch.float32
    assert torch.isfinite(out).all()

    # the target's embedding and LM head are shared, never stored
    sd = head.state_dict()
    assert all(k.startswith(("fc.", "layer.")) or k == "draft_vocab" for k in sd), sorted(sd)
    shared_w = (model.get_input_embeddings().weight, model.get_output_embeddings().weight)
    assert not any(v.shape == w.shape and torch.equal(v, w) for v in sd.values() for w in shared_w)
    shared = {w.data_ptr() for w in shared_w}
    assert not any(p.data_ptr() in shared for p in head.parameters())
    n_layer = sum(p.numel() for p in model.model.layers[0].parameters())
    n_norm = model.model.layers[0].input_layernorm.weight.numel()
    assert sum(p.numel() for p in head.parameters()) == (2 * H * H + H) + n_layer - n_norm
    assert torch.equal(head.lm_weight(model.get_output_embeddings()), model.get_output_embeddings().weight)

    dv = torch.tensor(sorted(random.Random(0).sample(range(V), 40)))
    head_dv = DraftHead.for_target(model, dv)
    w = head_dv.lm_weight(model.get_output_embeddings())
    assert w.shape == (40, H)
    assert torch.equal(w, model.get_output_embeddings().weight[dv])
    assert torch.equal(head_dv.draft_vocab, dv)


# ------------------------------------------------------------------------------------------------
# 2. mask semantics
# ------------------------------------------------------------------------------------------------


def _perturbed_outputs(head, feats, embeds, pos, mask):
    """Output with every position j perturbed in turn: ``(T, T, H)`` with ``[j, i]`` = output i."""
    T = feats.shape[1]
    g = torch.Generator().manual_seed(123)
    outs = []
    with torch.no_grad():
        for j in range(T):
            f, e = feats.clone(), embeds.clone()
            f[0, j] += torch.randn(H, generator=g)
            e[0, j] += torch.randn(H, generator=g)
            outs.append(head(f, e, pos, mask)[0])
    return torch.stack(outs)


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_causal_mask_semantics(arch):
    model = make_tiny_head_target(arch)
    head = random_head(model)
    T = 9
    g = torch.Generator().manual_seed(1)
    feats, embeds = torch.randn(1, T, H, generator=g), torch.randn(1, T, H, generator=g)
    pos = torch.arange(T)[None]
    with torch.no_grad():
        base = head(feats, embeds, pos, causal(1, T))[0]
    pert = _perturbed_outputs(head, feats, embeds, pos, causal(1, T))
    for j in range(T):
        diff = (pert[j] - base).abs().amax(-1)  # (T,)
        for i in range(T):
            if i < j:
                assert diff[i] < 1e-6, (i, j, float(diff[i]))
            else:
                assert diff[i] > 1e-4, (i, j, float(diff[i]))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_tree_mask_semantics(seed):
    model = make_tiny_head_target("llama")
    head = random_head(model)
    rng = random.Random(seed)
    T = 11
    tree = Tree.from_lists([0] * T, random_tree(T, rng))
    anc = tree.ancestor_mask()  # (T, T): [i, j] = j is i or an ancestor of i
    assert not anc.all()  # some non-ancestors to perturb
    g = torch.Generator().manual_seed(seed)
    feats, embeds = torch.randn(1, T, H, generator=g), torch.randn(1, T, H, generator=g)
    pos = tree.depth[None]
    mask = anc[None, None]
    with torch.no_grad():
        base = head(feats, embeds, pos, mask)[0]
    pert = _perturbed_outputs(head, feats, embeds, pos, mask)
    for j in range(T):
        diff = (pert[j] - base).abs().amax(-1)
        for i in range(T):
            if anc[i, j]:
                assert diff[i] > 1e-4, (i, j)
            else:
                assert diff[i] < 1e-6, (i, j, float(diff[i]))
    # and a node's output equals a plain causal forward over its root-to-node path
    for i in range(T):
        path = tree.path_to(i)
        with torch.no_grad():
            alone = head(feats[:, path], embeds[:, path], torch.arange(len(path))[None], causal(1, len(path)))[0, -1]
        torch.testing.assert_close(alone, base[i], atol=1e-5, rtol=1e-5)


# ------------------------------------------------------------------------------------------------
# 3. select_dynamic against an exhaustive search
# ------------------------------------------------------------------------------------------------


def _closed(nodes, parents) -> bool:
    s = set(nodes) | {0}
    return all(parents[i] in s for i in nodes)


def brute_force_best(scores: list[float], parents: list[int], k: int) -> float:
    """Best score sum over all ancestor-closed sets of ``k`` non-root nodes (exhaustive)."""
    best = None
    for comb in itertools.combinations(range(1, len(scores)), k):
        if _closed(comb, parents):
            s = sum(scores[i] for i in comb)
            best = s if best is None else max(best, s)
    return best


def monotone_scores(parents: list[int], rng: random.Random, ties: bool) -> list[float]:
    scores = [0.0]
    for i in range(1, len(parents)):
        # multiples of 1/4: exact in float32 (so ties are real ties), strictly negative log-probs
        logp = -rng.choice([0.25, 0.5, 0.75]) if ties else -rng.uniform(0.01, 3.0)
        scores.append(scores[parents[i]] + logp)
    return scores


CASES = [(T, seed, ties) for T in range(2, 13) for seed in range(4) for ties in (True, False)]


@pytest.mark.parametrize("T, seed, ties", CASES)
def test_select_dynamic_matches_brute_force(T, seed, ties):
    rng = random.Random(1000 * T + seed + (7 if ties else 0))
    parents = random_tree(T, rng)
    scores = monotone_scores(parents, rng, ties)
    sc = torch.tensor(scores, dtype=torch.float32)
    for total in sorted({1, 2, T // 2, T - 2, T - 1, T, T + 3} - {0, -1}):
        if total < 1:
            continue
        keep = select_dynamic(sc, torch.tensor(parents), total).tolist()
        k = min(total, T - 1)
        assert keep[0] == 0 and keep == sorted(set(keep)), keep
        assert len(keep) - 1 == k, (keep, total)
        assert _closed(keep[1:], parents)
        assert sum(scores[i] for i in keep[1:]) == pytest.approx(brute_force_best(scores, parents, k), abs=1e-9)
        # monotone scores: exactly the top-k by score, ties towards the lower index
        top = sorted(range(1, T), key=lambda i: (-scores[i], i))[:k]
        assert keep == [0] + sorted(top)
        # the selection gives a valid tree
        Tree.from_lists(list(range(T)), parents).select(torch.tensor(keep))


# ------------------------------------------------------------------------------------------------
# 4. grow_dynamic against a slow EAGLE-2 reference
# ------------------------------------------------------------------------------------------------

VG = 20


def path_logits(path: tuple[int, ...]) -> torch.Tensor:
    """Deterministic random logits, a function of the token path only."""
    g = torch.Generator().manual_seed(zlib.crc32(repr(path).encode()))
    return torch.randn(VG, generator=g) * 2.0


def eagle2_reference(root: int, depth: int, top_k: int, total: int) -> dict[tuple, float]:
    """EAGLE-2 written over token paths: expand the top_k best nodes of each level (by cumulative
    log-prob) with their top_k children, then rerank every drafted node and keep the best ``total``."""
    score = {(root,): 0.0}
    frontier = [(root,)]
    drafted = []
    for _ in range(depth):
        level = []
        for p in frontier:
            logp = torch.log_softmax(path_logits(p).float(), dim=-1)
            best = sorted(range(VG), key=lambda t: -float(logp[t]))[:top_k]
            for t in best:
                score[p + (t,)] = score[p] + float(logp[t])
                level.append(p + (t,))
        drafted += level
        frontier = sorted(level, key=lambda q: -score[q])[:top_k]
    keep = sorted(drafted, key=lambda q: -score[q])[:total]
    return {q: score[q] for q in keep}


def _path_tokens(tree: Tree, node: int) -> tuple[int, ...]:
    toks = tree.tokens.tolist()
    return tuple(toks[n] for n in tree.path_to(node))


GROW = [(3, 2, 1), (3, 2, 5), (3, 2, 10), (3, 2, 50), (4, 3, 8), (4, 3, 20), (4, 3, 30), (3, 4, 12),
        (3, 4, 36), (4, 4, 25), (1, 3, 2), (1, 3, 3)]


@pytest.mark.parametrize("depth, top_k, total", GROW)
@pytest.mark.parametrize("root", [0, 7])
def test_grow_dynamic_matches_reference(depth, top_k, total, root):
    calls = []

    def expand(tree: Tree, nodes: list[int]) -> torch.Tensor:
        calls.append(list(nodes))
        assert all(n < len(tree) for n in nodes)
        return torch.stack([path_logits(_path_tokens(tree, n)) for n in nodes])

    tree = grow_dynamic(root, depth, top_k, total, expand, Sampling())
    ref = eagle2_reference(root, depth, top_k, total)
    pool = top_k + (depth - 1) * top_k * top_k
    assert len(calls) == depth
    assert int(tree.tokens[0]) == root and int(tree.parents[0]) == -1
    assert len(tree) - 1 == min(total, pool) == len(ref)
    par = tree.parents.tolist()
    assert all(0 <= par[i] < i for i in range(1, len(tree)))  # parents before children
    got = {_path_tokens(tree, n): float(tree.scores[n]) for n in range(1, len(tree))}
    assert set(got) == set(ref)
    for p, s in ref.items():
        assert got[p] == pytest.approx(s, abs=1e-5)


# ------------------------------------------------------------------------------------------------
# 5. after every step the drafter's head KV cache == the head run over all committed pairs, and the
#    drafted tree's scores == the head run one pair at a time along each node's path
# ------------------------------------------------------------------------------------------------


class CheckedDrafter(EagleDrafter):
    """Records every ``extend`` and checks the head cache against a fresh recomputation after each
    ``propose``. With ``dtype`` (a reduced-precision fast path) the recomputation runs the original
    float32 head (``ref_head``) and compares within ``tol`` (atol = rtol)."""

    def __init__(self, target, head, shape, dtype=None, tol=1e-4):
        super().__init__(target, head, shape, dtype=dtype)
        self.ref_head, self.tol = head, tol

    def reset(self, prompt_ids):
        super().reset(prompt_ids)
        self.ext_f, self.ext_x, self.checked = [], [], 0

    def extend(self, features, tokens):
        super().extend(features, tokens)
        self.ext_f.append(features.clone())
        self.ext_x.append(tokens.clone())

    def propose(self, root, sampling):
        tree = super().propose(root, sampling)
        assert not self.pending_x
        check_head_cache(self)
        check_tree_scores(self, tree)
        return tree


def check_head_cache(dr: EagleDrafter) -> None:
    n = dr.cache.get_seq_length()
    assert n == sum(len(x) for x in dr.ext_x) == len(dr.history) - 1
    text = torch.tensor(dr.history[:n])  # tokens at positions 0..n-1
    nxt = torch.tensor(dr.history[1: n + 1])  # the token after each of them
    with torch.no_grad():
        feats = dr.target.base(input_ids=text[None]).last_hidden_state  # (1, n, H)
        # the decoder hands over the target's true features (from prefill / tree forwards)
        torch.testing.assert_close(torch.cat(dr.ext_f), feats[0], atol=1e-4, rtol=1e-4)
        assert torch.equal(torch.cat(dr.ext_x), nxt)
        fresh = DynamicCache()
        dr.ref_head(feats, dr.target.embed(nxt)[None], torch.arange(n)[None], causal(1, n), cache=fresh)
    # the head's slot cache: its first n slots are the committed pairs (drafted slots lie beyond)
    layer, want = dr.cache.layers[0], fresh.layers[0]
    got_k, got_v = layer.keys[..., :n, :], layer.values[..., :n, :]
    assert got_k.shape == want.keys.shape and got_k.dtype == dr.dtype
    torch.testing.assert_close(got_k.float(), want.keys, atol=dr.tol, rtol=dr.tol)
    torch.testing.assert_close(got_v.float(), want.values, atol=dr.tol, rtol=dr.tol)
    dr.checked += 1


def check_tree_scores(dr: EagleDrafter, tree: Tree) -> None:
    """Each drafted node's score is what running the head one pair at a time (no tree, no cache)
    over the committed pairs and then the node's path gives: the level-wise tree drafting with its
    cache and tree masks changes nothing."""
    n = dr.cache.get_seq_length()
    text, nxt = torch.tensor(dr.history[:n]), torch.tensor(dr.history[1: n + 1])
    toks = tree.tokens.tolist()
    assert toks[0] == dr.history[n]  # the root is the last committed token
    with torch.no_grad():
        feats = dr.target.base(input_ids=text[None]).last_hidden_state[0]  # (n, H)
        pred = {}  # node -> predicted feature after it
        for node in range(len(tree)):
            path = tree.path_to(node)
            f = torch.cat([feats, torch.stack([pred[a] for a in path[:-1]])]) if node else feats
            x = torch.cat([nxt, torch.tensor([toks[a] for a in path[1:]], dtype=torch.long)])
            m = len(x)
            out = dr.ref_head(f[None], dr.target.embed(x)[None], torch.arange(m)[None], causal(1, m))
            pred[node] = out[0, -1]
        # draft log-probs are a softmax over the draft vocabulary (all of it when there is none)
        dv = dr.head.draft_vocab.tolist()
        lm_w = dr.target.lm_head.weight[dv] if dv else dr.target.lm_head.weight
        col = {t: i for i, t in enumerate(dv)} if dv else {t: t for t in range(lm_w.shape[0])}
        par = tree.parents.tolist()
        for node in range(1, len(tree)):
            logq = torch.log_softmax((pred[par[node]] @ lm_w.T).float(), dim=-1)
            want = float(tree.scores[par[node]]) + float(logq[col[toks[node]]])
            assert float(tree.scores[node]) == pytest.approx(want, abs=10 * dr.tol, rel=dr.tol), node


@pytest.mark.parametrize("head_kind", ["bigram", "random", "random-draft-vocab"])
@pytest.mark.parametrize("arch", ["llama", "qwen3"])
@pytest.mark.parametrize("shape", [TreeShape(shape="dynamic", depth=3, top_k=3, total_tokens=8),
                                   TreeShape(shape="static", choices=STATIC)], ids=["dynamic", "static"])
def test_head_cache_and_drafts_match_recomputation(arch, shape, head_kind):
    model = make_tiny_head_target(arch)
    target = Target(model, "reference")
    if head_kind == "bigram":
        head = bigram_head(model)
    else:
        dv = torch.tensor(sorted(random.Random(9).sample(range(V), 48))) if head_kind.endswith("vocab") else None
        head = random_head(model, seed=3, draft_vocab=dv)
    dr = CheckedDrafter(target, head, shape)
    prompt = torch.randint(0, V, (10,), generator=torch.Generator().manual_seed(3))
    out = TreeDecoder(target, dr).generate(prompt, 24)
    st = out.stats
    assert dr.checked == st.target_forwards
    if head_kind == "bigram":
        # drafts are accepted (the cache is then extended by several pairs at once) and rejected
        # (tree entries must be dropped)
        assert sum(st.accepted_hist[1:]) >= 3, st.accepted_hist
        assert sum(st.accepted_hist[:2]) >= 1, st.accepted_hist
    # after generation: bring in what is pending, then the whole committed text must be in the cache
    if dr.pending_x:
        dr.catch_up()
    check_head_cache(dr)
    text = prompt.tolist() + out.tokens
    assert dr.history == text[: len(dr.history)]
    max_depth = max(len(c) for c in shape.choices) if shape.shape == "static" else shape.depth
    assert len(dr.history) >= len(text) - (max_depth + 1)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [TreeShape(shape="dynamic", depth=4, top_k=3, total_tokens=10),
                                   TreeShape(shape="static", choices=STATIC)], ids=["dynamic", "static"])
def test_reduced_precision_drafter_matches_float32_reference(shape, dtype):
    """The bf16 / fp16 fast path (head fc + layer + draft LM head cast, rotary kept in fp32) drafts
    what the float32 head computes one pair at a time, within the format's rounding; the caller's
    head is left untouched."""
    model = make_tiny_head_target("llama")
    target = Target(model, "reference")
    head = random_head(model, seed=3, draft_vocab=torch.tensor(sorted(random.Random(9).sample(range(V), 48))))
    before = {k: v.clone() for k, v in head.state_dict().items()}
    dr = CheckedDrafter(target, head, shape, dtype=dtype, tol=0.05)
    assert dr.head is not head and dr.head.fc.weight.dtype == dtype and dr.lm_w.dtype == dtype
    assert dr.head.rotary.inv_freq.dtype == torch.float32
    prompt = torch.randint(0, V, (200,), generator=torch.Generator().manual_seed(5))  # positions > 256
    out = TreeDecoder(target, dr).generate(prompt, 24)
    assert dr.checked == out.stats.target_forwards >= 3
    assert out.tokens == TreeDecoder(target, None).generate(prompt, 24).tokens  # still lossless
    assert all(torch.equal(v, head.state_dict()[k]) for k, v in before.items())


# ------------------------------------------------------------------------------------------------
# 6. lossless: greedy TreeDecoder + EagleDrafter == plain greedy generate
# ------------------------------------------------------------------------------------------------

SHAPES = {"chain": TreeShape("chain", depth=4),
          "static": TreeShape("static", choices=STATIC),
          "dynamic": TreeShape("dynamic", depth=4, top_k=3, total_tokens=10)}
N_NEW = 40
_plain: dict = {}


def plain_greedy(arch: str, prompt: torch.Tensor) -> list[int]:
    key = (arch, tuple(prompt.tolist()))
    if key not in _plain:
        with torch.no_grad():
            out = make_tiny_head_target(arch).generate(prompt[None], attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                                            do_sample=False, max_new_tokens=N_NEW, eos_token_id=None, pad_token_id=0)
        _plain[key] = out[0, len(prompt):].tolist()
    return _plain[key]


@pytest.mark.parametrize("head_kind", ["random", "bigram", "bigram-bf16"])
@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_greedy_eagle_is_lossless(arch, shape, head_kind):
    model = make_tiny_head_target(arch)
    target = Target(model, "reference")
    head = random_head(model) if head_kind == "random" else bigram_head(model)
    dtype = torch.bfloat16 if head_kind.endswith("bf16") else None
    accepted = 0
    for seed, n_prompt in ((0, 5), (1, 13)):
        prompt = torch.randint(0, V, (n_prompt,), generator=torch.Generator().manual_seed(seed))
        out = TreeDecoder(target, EagleDrafter(target, head, SHAPES[shape], dtype=dtype)).generate(prompt, N_NEW)
        assert out.tokens == plain_greedy(arch, prompt), (arch, shape, head_kind, n_prompt)
        assert out.stats.new_tokens == N_NEW
        accepted += out.stats.new_tokens - 1 - out.stats.target_forwards
    if head_kind.startswith("bigram"):  # accepted drafts really happened
        assert accepted >= 5


def test_greedy_eagle_with_draft_vocab_is_lossless():
    model = make_tiny_head_target("llama")
    target = Target(model, "reference")
    dv = torch.tensor(sorted(random.Random(5).sample(range(V), 48)))
    head = random_head(model, draft_vocab=dv)
    prompt = torch.randint(0, V, (9,), generator=torch.Generator().manual_seed(4))
    trees = []

    class Rec(EagleDrafter):
        def propose(self, root, sampling):
            trees.append(super().propose(root, sampling))
            return trees[-1]

    out = TreeDecoder(target, Rec(target, head, SHAPES["dynamic"])).generate(prompt, N_NEW)
    assert out.tokens == plain_greedy("llama", prompt)
    allowed = set(dv.tolist())
    assert all(set(t.tokens[1:].tolist()) <= allowed for t in trees)  # drafts only from the draft vocab


# ------------------------------------------------------------------------------------------------
# 7. checkpoints
# ------------------------------------------------------------------------------------------------


def _head_config(model, draft_vocab=()) -> HeadConfig:
    c = model.config
    return HeadConfig(target="tiny", model_type=c.model_type, hidden_size=c.hidden_size,
                      vocab_size=c.vocab_size, draft_vocab=list(draft_vocab))


@pytest.mark.parametrize("with_dv", [False, True])
def test_checkpoint_round_trip(tmp_path, with_dv):
    model = make_tiny_head_target("qwen3")
    dv = torch.tensor(sorted(random.Random(2).sample(range(V), 50))) if with_dv else None
    head = random_head(model, seed=7, draft_vocab=dv)
    folder = tmp_path / "head"
    save_head(DraftHead.for_target(model), folder, _head_config(model))  # then overwrite it
    save_head(head, folder, _head_config(model, [] if dv is None else dv.tolist()))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["head"]  # no temp/old folders left behind
    loaded = load_head(folder, model)
    assert not loaded.training
    assert torch.equal(loaded.draft_vocab, head.draft_vocab)
    sd1, sd2 = head.state_dict(), loaded.state_dict()
    assert sd1.keys() == sd2.keys()
    for k in sd1:
        assert torch.equal(sd1[k], sd2[k]), k
    g = torch.Generator().manual_seed(0)
    T = 6
    f, e = torch.randn(2, T, H, generator=g), torch.randn(2, T, H, generator=g)
    pos = torch.arange(T)[None].expand(2, T)
    with torch.no_grad():
        assert torch.equal(head(f, e, pos, causal(2, T)), loaded(f, e, pos, causal(2, T)))
    lm = model.get_output_embeddings()
    assert torch.equal(head.lm_weight(lm), loaded.lm_weight(lm))


def test_checkpoint_half_precision_storage(tmp_path):
    """A float16 export is half the size and loads back (as float32) to the rounded weights."""
    model = make_tiny_head_target("llama")
    head = random_head(model, seed=3)
    save_head(head, tmp_path / "fp32", _head_config(model))
    save_head(head, tmp_path / "fp16", _head_config(model), dtype=torch.float16)
    size = lambda d: (tmp_path / d / "model.safetensors").stat().st_size
    assert size("fp16") < 0.6 * size("fp32")
    loaded = load_head(tmp_path / "fp16", model)
    for k, v in head.state_dict().items():
        assert loaded.state_dict()[k].dtype == v.dtype
        assert torch.equal(loaded.state_dict()[k], v.half().to(v.dtype)), k


def test_checkpoint_mismatch_raises(tmp_path):
    model = make_tiny_head_target("llama")
    folder = tmp_path / "head"
    save_head(random_head(model), folder, _head_config(model))
    with pytest.raises(HeadMismatchError, match=r"hidden size 64.*32"):
        load_head(folder, make_tiny_head_target("llama", hidden=32))
    with pytest.raises(HeadMismatchError, match=r"vocabulary of 128.*96"):
        load_head(folder, make_tiny_head_target("llama", vocab=96))
    with pytest.raises(HeadMismatchError, match=r"'llama'.*'qwen2'"):
        load_head(folder, make_tiny_head_target("qwen2"))
    with pytest.raises(FileNotFoundError):
        load_head(tmp_path / "nope", model)
    load_head(folder, model)  # the right target still loads


def _edit_config(change):
    """A breaker that rewrites config.json with ``change(cfg dict)`` applied."""
    def edit(folder):
        cfg = json.loads((folder / "config.json").read_text())
        change(cfg)
        (folder / "config.json").write_text(json.dumps(cfg))
    return edit


def _write_config(text: str):
    return lambda folder: (folder / "config.json").write_text(text) and None


# each breaker spoils a saved head folder in one way (returning the path to load when it is not the
# folder itself); the error is one line naming the folder or file
NOT_A_HEAD = {
    "no folder": (shutil.rmtree, r"no head checkpoint at \S+/head: no such folder"),
    "a file": (lambda f: f / "model.safetensors", r"head/model\.safetensors: not a folder"),
    "no config": (lambda f: (f / "config.json").unlink(), r"head: not an EAGLE head \(no config\.json"),
    "no weights": (lambda f: (f / "model.safetensors").unlink(), r"head: no model\.safetensors"),
    "invalid json": (_write_config('{"target": "tiny",'), r"head/config\.json: not valid JSON \(Expecting"),
    "not an object": (_write_config("[1, 2]"), r"head/config\.json: expected a JSON object, got a list"),
    "missing keys": (_edit_config(lambda c: [c.pop("target"), c.pop("vocab_size")]),
                     r"head: not an EAGLE head \(config\.json has no 'target', 'vocab_size'\)$"),
    "unknown key": (_edit_config(lambda c: c.update(hidden=3)), r"head/config\.json: unknown keys \['hidden'\]"),
    "wrong type": (_edit_config(lambda c: c.update(hidden_size="64")),
                   r"head/config\.json: 'hidden_size' must be an integer, got \"64\""),
    "bad draft vocab": (_edit_config(lambda c: c.update(draft_vocab=[1, V])),
                        r"head/config\.json: 'draft_vocab' must hold token ids in \[0, 128\)"),
}


@pytest.mark.parametrize("case", list(NOT_A_HEAD))
def test_not_a_head_is_a_clear_error(tmp_path, case):
    model = make_tiny_head_target("llama")
    folder = tmp_path / "head"
    save_head(random_head(model), folder, _head_config(model))
    breaker, message = NOT_A_HEAD[case]
    path = breaker(folder) or folder
    with pytest.raises(HeadError, match=message) as err:
        load_head(path, model)
    assert "\n" not in str(err.value)
    assert isinstance(err.value, HeadNotFoundError) == (case == "no folder")
    if case == "no folder":
        assert isinstance(err.value, FileNotFoundError)  # what it raised before HeadError existed


def test_causal_lm_and_draft_model_folders_are_named_as_such(tmp_path):
    """A model folder passed as a head says what it is and which drafter type takes it."""
    from eagle.draft_model import build_draft_model, save_draft_model

    model = make_tiny_head_target("llama")
    model.save_pretrained(tmp_path / "lm")
    with pytest.raises(HeadError, match=r"lm: not an EAGLE head \(config\.json has no 'target'\); it looks like a "
                                        r"causal LM folder \(LlamaForCausalLM\): use drafter type 'model'"):
        load_head(tmp_path / "lm", model)
    save_draft_model(build_draft_model(model, [0]), tmp_path / "draft", "tiny")
    with pytest.raises(HeadError, match=r"draft: not an EAGLE head .*made by `eagle distill`: use it with drafter "
                                        r"type 'model'"):
        load_head(tmp_path / "draft", model)


def test_shipped_draft_model_is_not_a_head():
    """The shipped distilled draft model, given where a head is expected (no model is loaded)."""
    with pytest.raises(HeadError, match=r"draft-models/smollm2-135m-3l: not an EAGLE head .*drafter type 'model'"):
        read_head_config("draft-models/smollm2-135m-3l")


@pytest.mark.parametrize("cut", ["half", "header", "empty", "garbage"])
def test_truncated_or_corrupt_weights_are_a_clear_error(tmp_path, cut):
    model = make_tiny_head_target("llama")
    folder = tmp_path / "head"
    save_head(random_head(model), folder, _head_config(model))
    weights = folder / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes({"half": data[: len(data) // 2], "header": data[:6], "empty": b"",
                         "garbage": b"this is not a safetensors file"}[cut])
    with pytest.raises(HeadError, match=r"head/model\.safetensors: truncated or corrupt, not a readable safetensors "
                                        r"file \(") as err:
        load_head(folder, model)
    assert "\n" not in str(err.value)


def test_weights_of_another_shape_are_a_mismatch(tmp_path):
    """A config.json that fits the target over weights that do not (e.g. copied from another head)."""
    small, model = make_tiny_head_target("llama", hidden=32), make_tiny_head_target("llama")
    save_head(random_head(small), tmp_path / "small", _head_config(small))
    save_head(random_head(model), tmp_path / "head", _head_config(model))
    (tmp_path / "head" / "model.safetensors").write_bytes((tmp_path / "small" / "model.safetensors").read_bytes())
    with pytest.raises(HeadMismatchError, match=r"head \S+/head does not match the target's layer: .*size mismatch "
                                                r"for fc\.weight"):
        load_head(tmp_path / "head", model)


def test_public_api_names():
    import eagle

    assert eagle.DraftHead is DraftHead and eagle.load_head is load_head
