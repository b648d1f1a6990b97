"""The EAGLE drafter (eagle/heads/drafter.py): after every step its head KV cache == the head run over
all committed pairs, and its drafted scores == the head run along each node's path; the reduced-precision
fast path; greedy decoding with it is lossless (with and without a draft vocabulary).

Every model here is a tiny random fp32 model (``make_tiny_head_target`` in conftest.py).
"""
from __future__ import annotations

import random

import pytest
import torch
from transformers import DynamicCache

from eagle import Target, TreeDecoder
from eagle.attention import GQA_SDPA
from eagle.backends.cpu import CpuBackend
from eagle.backends.cpu.attention import CPU_SDPA
from eagle.backends.eager import EagerBackend
from eagle.draft import TreeShape
from eagle.heads.drafter import EagleDrafter
from eagle.runtime import RuntimeConfig
from eagle.tree import Tree

from conftest import TINY_VOCAB, bigram_head, causal_mask, make_tiny_head_target, random_head

V = TINY_VOCAB
STATIC = [[0], [1], [2], [0, 0], [0, 1], [1, 0], [0, 0, 0], [0, 0, 1], [0, 1, 0]]  # non-uniform


# ------------------------------------------------------------------------------------------------
# after every step the drafter's head KV cache == the head run over all committed pairs, and the
# drafted tree's scores == the head run one pair at a time along each node's path
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
        dr.ref_head(feats, dr.target.embed(nxt)[None], torch.arange(n)[None], causal_mask(1, n), cache=fresh)
    # the head's slot cache: its first n slots are the committed pairs (drafted slots lie beyond)
    layer, want = dr.cache.layers[0], fresh.layers[0]
    got_k, got_v = layer.keys[..., :n, :], layer.values[..., :n, :]
    assert got_k.shape == want.keys.shape and got_k.dtype == dr.dtype
    torch.testing.assert_close(got_k.float(), want.keys, atol=dr.tol, rtol=dr.tol)
    torch.testing.assert_close(got_v.float(), want.values, atol=dr.tol, rtol=dr.tol)
    dr.checked += 1


def path_features(dr: EagleDrafter, tree: Tree) -> dict[int, torch.Tensor]:
    """node -> the feature ``dr.ref_head`` predicts after it, run one pair at a time (no tree, no
    cache) over the committed pairs and then the node's path."""
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
            out = dr.ref_head(f[None], dr.target.embed(x)[None], torch.arange(m)[None], causal_mask(1, m))
            pred[node] = out[0, -1]
    return pred


def check_tree_scores(dr: EagleDrafter, tree: Tree) -> None:
    """Each drafted node's score is what running the head one pair at a time (no tree, no cache)
    over the committed pairs and then the node's path gives: the level-wise tree drafting with its
    cache and tree masks changes nothing."""
    pred = path_features(dr, tree)
    toks = tree.tokens.tolist()
    with torch.no_grad():
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
                                   TreeShape(shape="static", choices=STATIC),
                                   TreeShape(shape="auto", depth=3, top_k=3, total_tokens=8)],
                         ids=["dynamic", "static", "auto"])
def test_head_cache_and_drafts_match_recomputation(arch, shape, head_kind):
    model = make_tiny_head_target(arch)
    target = Target(model, "reference")
    if head_kind == "bigram":
        head = bigram_head(model)
    else:
        dv = torch.tensor(sorted(random.Random(9).sample(range(V), 48))) if head_kind.endswith("vocab") else None
        head = random_head(model, seed=3, draft_vocab=dv)
    dr = CheckedDrafter(target, head, shape)
    # the tiny heads group their query heads (4 query / 2 KV heads): the drafter's tree levels take
    # the folded attention of the target's backend (eager: eagle/attention.py; cpu: its form with the
    # CPU op, eagle/backends/cpu/attention.py), the reference head keeps transformers' SDPA
    assert dr.head.layer_config._attn_implementation == {"eager": GQA_SDPA, "cpu": CPU_SDPA}[target.backend.name]
    eager = EagleDrafter(Target(model, "reference", backend=EagerBackend()), head, shape)
    assert eager.head.layer_config._attn_implementation == GQA_SDPA
    assert head.layer_config._attn_implementation == "sdpa" and dr.ref_head is head
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
    max_depth = shape.depth  # a static shape: its longest choice
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
# lossless: greedy TreeDecoder + EagleDrafter == plain greedy generate
# ------------------------------------------------------------------------------------------------


SHAPES = {"chain": TreeShape("chain", depth=4),
          "static": TreeShape("static", choices=STATIC),
          "dynamic": TreeShape("dynamic", depth=4, top_k=3, total_tokens=10),
          "auto": TreeShape("auto", depth=4, top_k=3, total_tokens=10)}
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
    # accepted drafts really happened; except an auto tree of a bf16 head: auto sizes trees from
    # measured times, and where bf16 is emulated (no AVX512-BF16) a bf16 level costs more than this
    # tiny target's verification, so auto rightly drafts nothing
    if head_kind.startswith("bigram") and not (shape == "auto" and dtype is not None):
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


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_drafting_through_the_small_row_kernel(dtype):
    """A float32 or bfloat16 drafter runs its head on a copy whose linear layers use the small-row
    kernel (kernels/cpu_gemm.py; bf16: its bfloat16 form) when that is chosen: the weights are
    shared, not copied (float32: the head's own; bf16: the drafter's cast copy), the draft trees
    have the tokens and (to rounding: 1e-4, bf16 0.05) the scores of F.linear drafting (bf16: the
    first tree; later ones may part at a bf16 tie), and greedy decoding stays lossless."""
    from eagle.backends.cpu.packed import PackedLinear
    from eagle_kernels import cpu_gemm

    if not cpu_gemm.available():
        pytest.skip(f"small-row kernel: {cpu_gemm.unavailable_reason()}")
    model = make_tiny_head_target("llama")
    head = random_head(model, seed=5)
    shape = TreeShape(shape="dynamic", depth=3, top_k=3, total_tokens=8)

    def target_with(linear: str) -> Target:
        """A drafter's linear way is its target's CPU backend's; the target's own products stay plain
        (no twin), so both targets give the same features."""
        return Target(model, "reference", RuntimeConfig(packed_linear=False), backend=CpuBackend(linear=linear))

    fast = EagleDrafter(target_with("stream"), head, shape, dtype=dtype)
    slow = EagleDrafter(target_with("never"), head, shape, dtype=dtype)
    target = fast.target
    linears = [m for m in fast.head.modules() if isinstance(m, PackedLinear)]
    assert linears and all(m.weight.dtype == dtype for m in linears) and fast.head is not head
    assert not any(isinstance(m, PackedLinear) for m in slow.head.modules())
    if dtype == torch.float32:  # both share the head's own weights (slow: a copy with its own attention config)
        theirs = dict(head.named_parameters())
        for d in (fast, slow):
            assert all(p is theirs[n] for n, p in d.head.named_parameters())
    prompt = torch.randint(0, V, (12,), generator=torch.Generator().manual_seed(8))
    trees = {}

    class Recording(EagleDrafter):
        def propose(self, root, sampling):
            tree = super().propose(root, sampling)
            trees.setdefault(id(self), []).append(tree)
            return tree

    plain = TreeDecoder(target).generate(prompt, 20).tokens
    for d in (fast, slow):
        d.__class__ = Recording
        assert TreeDecoder(d.target, d).generate(prompt, 20).tokens == plain
    ours, theirs = trees[id(fast)], trees[id(slow)]
    if dtype == torch.bfloat16:
        ours, theirs = ours[:1], theirs[:1]
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs):
        assert a.tokens.tolist() == b.tokens.tolist() and a.parents.tolist() == b.parents.tolist()
        tol = 1e-4 if dtype == torch.float32 else 0.05
        torch.testing.assert_close(a.scores, b.scores, atol=tol, rtol=tol)


@pytest.mark.compile
@pytest.mark.parametrize("shape", [TreeShape(shape="dynamic", depth=3, top_k=3, total_tokens=8),
                                   TreeShape(shape="static", choices=STATIC)], ids=["dynamic", "static"])
def test_compiled_tree_levels_equal_eager(shape, tmp_path, monkeypatch):
    """With compiled steps on GPU the head's tree levels are compiled too (forced here on the CPU,
    where a compiled target leaves them eager: they measured no faster): padded to ``level_rows`` and
    attending over the whole cache buffer, they give the same head cache and draft scores as the
    head run pair by pair (CheckedDrafter), the same tokens as the eager drafter, one graph per
    (rows, capacity) reused across levels and steps, and no graph break."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    model = make_tiny_head_target("llama")
    target = Target(model, "reference")
    head = random_head(model, seed=4)
    dr = CheckedDrafter(target, head, shape)
    dr.compiled = True  # as with runtime.compile (the target's own compiled steps are tested in test_target.py)
    prompt = torch.randint(0, V, (10,), generator=torch.Generator().manual_seed(5))
    dec = TreeDecoder(target, dr)
    out = dec.generate(prompt, 20)
    assert dr.checked == out.stats.target_forwards > 3
    eager = TreeDecoder(target, EagleDrafter(target, head, shape)).generate(prompt, 20)
    assert out.tokens == eager.tokens == TreeDecoder(target).generate(prompt, 20).tokens
    rows = {r for r, _ in dr.compile_s}
    assert rows == {3} if shape.shape == "dynamic" else rows <= {2, 4}  # top_k, or the next power of two
    assert len(dr._levels) == len(dr.compile_s)  # compiled once per (rows, capacity), then reused
    assert not torch._dynamo.utils.counters["graph_break"]
    from eagle.bench import compile_times, format_compile

    times = compile_times(dec)  # what eagle bench / eagle generate print
    assert list(times) == [f"draft level {r} rows x {c} slots" for r, c in sorted(dr.compile_s)]
    assert format_compile({"x": times}).startswith("compiled x: draft level ")


def test_auto_draft_precision_is_the_faster_one(monkeypatch, tmp_path):
    """``drafter.dtype: auto``: float32, bfloat16 (only where bf16 is native) and weight-only int8
    (``torch.int8``, where torch's kernel takes the head's shapes) are timed (each really runs) and
    another precision than float32 must win by MARGIN; nothing is timed where float32 is the only
    way; a config with ``dtype: auto`` builds a drafter in the chosen precision, decoding lossless."""
    import eagle.backends.cpu as cpu
    from eagle.config import config_from_dict
    from eagle.heads.drafter import fastest_dtype

    model = make_tiny_head_target("llama")  # hidden 64, intermediate 128: int8's shapes
    target = Target(model, "reference", backend=CpuBackend())  # CpuBackend.draft_dtype times the ways
    head = random_head(model, seed=3)

    def no_timing(fns, repeats, before=None):
        raise AssertionError("nothing to time with float32 the only way")

    monkeypatch.setattr(cpu, "_INT8_MM", None)
    monkeypatch.setattr("eagle.backends.native_bf16", lambda device="cpu": False)
    monkeypatch.setattr(cpu, "timed_pass", no_timing)
    assert fastest_dtype(target, head, rows=3) == torch.float32
    assert fastest_dtype(Target(model, "reference", backend=EagerBackend()), head, rows=3) == torch.float32  # no timing
    monkeypatch.undo()
    int8_mm = cpu._INT8_MM
    for native, secs, want in ((True, (1.0, 0.5, 0.6), torch.bfloat16), (True, (1.0, 0.99, 0.985), torch.float32),
                               (True, (1.0, 1.5, 0.4), torch.int8), (False, (1.0, 0.5), torch.int8),
                               (False, (1.0, 1.2), torch.float32)):
        def fake(fns, repeats, before=None, secs=secs):
            assert len(fns) == len(secs) and before is not None  # the caches evicted before each pass
            for fn in fns:  # every precision's products really run
                fn()
            return list(secs)

        monkeypatch.setattr("eagle.backends.native_bf16", lambda device="cpu", native=native: native)
        monkeypatch.setattr(cpu, "timed_pass", fake)
        assert fastest_dtype(target, head, rows=3) == want
    assert int8_mm is not None  # torch has its weight-only int8 kernel: the int8 way was timed above
    (tmp_path / "head").mkdir()
    monkeypatch.setattr("eagle.heads.load_head", lambda path, model: head)  # the random head, as if loaded
    cfg = config_from_dict({"drafter": {"type": "eagle", "head": "head", "dtype": "auto"},
                            "tree": {"shape": "dynamic", "depth": 3, "top_k": 2, "total_tokens": 6}},
                           tmp_path / "auto.yaml")
    drafter = cfg.build_drafter(target)  # the last fake timing: int8 lost
    assert isinstance(drafter, EagleDrafter) and drafter.dtype == torch.float32 and not drafter.int8
    prompt = torch.randint(0, V, (10,), generator=torch.Generator().manual_seed(2))
    assert TreeDecoder(target, drafter).generate(prompt, 16).tokens == TreeDecoder(target).generate(prompt, 16).tokens
    monkeypatch.setattr(cpu, "timed_pass", lambda fns, repeats, before=None: [1.0, 0.5][: len(fns)])  # int8 wins
    drafter = cfg.build_drafter(target)
    assert drafter.int8 and drafter.dtype == torch.float32
    assert TreeDecoder(target, drafter).generate(prompt, 16).tokens == TreeDecoder(target).generate(prompt, 16).tokens


# ------------------------------------------------------------------------------------------------
# drafter.prompt_vocab: the prompt's tokens join an EAGLE-1/2 head's draft vocabulary
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", ["dynamic", "auto", "chain"])
def test_prompt_vocab_drafts_the_prompts_tokens_and_stays_lossless(shape):
    model = make_tiny_head_target("llama")
    target = Target(model, "reference")
    dv = torch.tensor(sorted(random.Random(9).sample(range(V), 48)))
    head = random_head(model, seed=3, draft_vocab=dv)
    dr = EagleDrafter(target, head, SHAPES[shape], prompt_vocab=True)
    prompt = torch.randint(0, V, (30,), generator=torch.Generator().manual_seed(7))
    outside = sorted(set(prompt.tolist()) - set(dv.tolist()))
    assert outside  # the test needs prompt tokens outside the draft vocabulary
    out = TreeDecoder(target, dr).generate(prompt, N_NEW)
    assert out.tokens == plain_greedy("llama", prompt)
    # after reset: the draft ids map to the head's vocabulary, then to the prompt's other tokens
    assert dr.d2t[:48].tolist() == dv.tolist() and sorted(dr.d2t[48:].tolist()) == outside
    x = torch.randn(3, model.config.hidden_size)
    logits = dr._logits(x)  # (3, 48 + E): the extra columns are the target's own LM head rows
    assert logits.shape == (3, 48 + len(outside))
    ref = head.pre_logits(x) @ model.lm_head.weight[dr.d2t].T
    torch.testing.assert_close(logits, ref, rtol=1e-4, atol=1e-4)
    # a new prompt: the extra tokens are that prompt's
    dr.reset(torch.tensor([int(dv[0])]))
    assert dr.d2t.tolist() == dv.tolist() and dr.extra_w is None


def test_prompt_vocab_needs_an_eagle12_head_with_a_draft_vocabulary(tmp_path):
    from eagle.config import ConfigError, load_config

    model = make_tiny_head_target("llama")
    target = Target(model, "reference")
    with pytest.raises(ValueError, match="prompt_vocab needs an EAGLE-1/2 head with a reduced draft vocabulary"):
        EagleDrafter(target, random_head(model), SHAPES["chain"], prompt_vocab=True)  # full vocabulary already
    (tmp_path / "c.yaml").write_text("drafter: {type: eagle3, head: h, prompt_vocab: true}\n")
    with pytest.raises(ConfigError, match=r"drafter 'eagle3': unknown key 'drafter.prompt_vocab' \(allowed: dtype, head, sample\)"):
        load_config(tmp_path / "c.yaml")
