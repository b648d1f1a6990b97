"""The tree forward, KV compaction and greedy decoding on tiny random models of every supported
architecture (Llama, Qwen2, Qwen3, Mistral with a sliding window, Gemma-3 mixing sliding and full
attention layers), compared with plain causal forwards and ``model.generate``; padded buckets, the
runtime dtype (on a copy of the model) and compiled steps against the plain eager forward."""
from __future__ import annotations

import pytest
import torch
import torch._dynamo

from eagle import Target, TreeDecoder
from eagle.draft import NoDrafter, SelfDrafter, TreeShape
from eagle.backends.cpu import CpuBackend
from eagle.kv import SlotCache
from eagle.runtime import RuntimeConfig
from eagle.target import pad_tree
from eagle.tree import Tree
from eagle_kernels import cpu_argmax

from conftest import (ARCHS, GEMMA_WINDOW, MISTRAL_WINDOW, TINY_VOCAB, RandomTreeDrafter, make_random_tree,
                      random_parents)

V = TINY_VOCAB
PREFIX = 24  # longer than both sliding windows
assert PREFIX > max(GEMMA_WINDOW, MISTRAL_WINDOW)


def deep_random_tree(gen: torch.Generator, chain: int = 11, extra: int = 9, root: int | None = None) -> Tree:
    """A non-uniform tree: a chain of ``chain`` nodes (deeper than the sliding windows) plus
    ``extra`` nodes hung under random earlier nodes; random tokens (siblings may repeat)."""
    parents = list(range(-1, chain - 1))
    for i in range(chain, chain + extra):
        parents.append(int(torch.randint(0, i, (), generator=gen)))
    tokens = torch.randint(0, V, (chain + extra,), generator=gen)
    if root is not None:
        tokens[0] = root
    return Tree(tokens, torch.tensor(parents))


@torch.no_grad()
def causal_last_logits(model, ids: torch.Tensor) -> torch.Tensor:
    return model(ids[None]).logits[0, -1].float()


@torch.no_grad()
def reference_tree_logits(model, context: torch.Tensor, tree: Tree) -> torch.Tensor:
    """Row i: last-position logits of a plain causal forward over ``context + path_to(i)``."""
    return torch.stack([causal_last_logits(model, torch.cat([context, tree.tokens[tree.path_to(i)]]))
                        for i in range(len(tree))])


def arch_seed(arch: str) -> int:
    return ARCHS.index(arch) + 1


CACHES = ("static", "dynamic")


def committed_kv(cache, layer) -> tuple[torch.Tensor, torch.Tensor]:
    """The committed keys/values of one layer: a SlotCache's first ``length`` slots, or all of a
    DynamicCache's entries."""
    if isinstance(cache, SlotCache):
        return layer.keys[..., : cache.length, :], layer.values[..., : cache.length, :]
    return layer.keys, layer.values


# ------------------------------------------------------------------------------------------------
# (a) one tree forward == a causal forward per node
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("cache_kind", CACHES)
@pytest.mark.parametrize("arch", ARCHS)
def test_tree_forward_matches_causal_forward(arch, cache_kind, tiny_model):
    model = tiny_model(arch)
    target = Target(model, "reference", RuntimeConfig(cache=cache_kind))
    gen = torch.Generator().manual_seed(arch_seed(arch))
    prefix = torch.randint(0, V, (PREFIX,), generator=gen)
    for tree in (deep_random_tree(gen), Tree.from_lists(*_wide_tree(gen))):
        cache = target.new_cache()
        target.prefill(prefix, cache)
        out = target.tree_forward(tree, cache)
        assert cache.get_seq_length() == PREFIX + len(tree)
        assert out.logits.shape == (len(tree), V) and out.logits.dtype == torch.float32
        assert out.hidden.shape == (len(tree), model.config.hidden_size)
        ref = reference_tree_logits(model, prefix, tree)
        torch.testing.assert_close(out.logits, ref, atol=1e-4, rtol=0)


@pytest.mark.parametrize("cache_kind", CACHES)
@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_feature_layers_match_output_hidden_states(arch, cache_kind, tiny_model):
    """``layers=``: prefill and the tree forward also return the hidden states entering the asked
    layers (EAGLE-3's low/mid/high), equal to transformers' ``hidden_states[i]`` of a plain causal
    forward over ``prefix + path_to(node)``; logits and the final feature are unchanged."""
    model = tiny_model(arch)
    L = model.config.get_text_config(decoder=True).num_hidden_layers
    layers = (0, L // 2, L - 1)
    target = Target(model, "reference", RuntimeConfig(cache=cache_kind))
    gen = torch.Generator().manual_seed(arch_seed(arch) + 7)
    prefix = torch.randint(0, V, (PREFIX,), generator=gen)
    cache = target.new_cache()
    pre = target.prefill(prefix, cache, layers)
    with torch.no_grad():
        hs = model.model(prefix[None], output_hidden_states=True).hidden_states
    torch.testing.assert_close(pre.layers, torch.cat([hs[i][0] for i in layers], -1), atol=1e-4, rtol=0)
    assert pre.features is pre.layers
    tree = deep_random_tree(gen, chain=6, extra=8)
    out = target.tree_forward(tree, cache, layers)
    H = model.config.get_text_config(decoder=True).hidden_size
    assert out.layers.shape == (len(tree), 3 * H)
    for i in range(len(tree)):
        with torch.no_grad():
            hs = model.model(torch.cat([prefix, tree.tokens[tree.path_to(i)]])[None], output_hidden_states=True).hidden_states
        torch.testing.assert_close(out.layers[i], torch.cat([h[0, -1] for h in (hs[j] for j in layers)]), atol=1e-4, rtol=0)
    plain = Target(model, "reference", RuntimeConfig(cache=cache_kind))
    c2 = plain.new_cache()
    plain.prefill(prefix, c2)
    ref = plain.tree_forward(tree, c2)
    assert ref.layers is None and ref.features is ref.hidden
    torch.testing.assert_close(out.logits, ref.logits, atol=0, rtol=0)
    with pytest.raises(ValueError, match="out of range"):
        target.tree_forward(tree, cache, (L + 1,))


def _wide_tree(gen: torch.Generator):
    parents = random_parents(16, gen)
    return torch.randint(0, V, (16,), generator=gen).tolist(), parents


@pytest.mark.parametrize("arch", ["mistral", "gemma3"])
def test_sliding_window_is_exercised(arch, tiny_model, monkeypatch):
    """Negative control: the same check fails when the tree mask ignores the sliding window."""
    model = tiny_model(arch)
    target = Target(model, "reference")
    gen = torch.Generator().manual_seed(arch_seed(arch))
    prefix = torch.randint(0, V, (PREFIX,), generator=gen)
    tree = deep_random_tree(gen)
    ref = reference_tree_logits(model, prefix, tree)

    monkeypatch.setattr(target.config, "sliding_window", None)  # the masks forget the window
    cache = target.new_cache()
    target.prefill(prefix, cache)
    wrong = target.tree_forward(tree, cache).logits
    assert (wrong - ref).abs().max() > 1e-2


def test_tree_forward_first_token_no_prefix_window(tiny_model):
    """A prefix shorter than the window (no key falls out of it) on the Gemma-3 model."""
    model = tiny_model("gemma3")
    target = Target(model, "reference")
    gen = torch.Generator().manual_seed(99)
    prefix = torch.randint(0, V, (3,), generator=gen)
    tree = Tree.from_lists(*_wide_tree(gen))
    cache = target.new_cache()
    target.prefill(prefix, cache)
    out = target.tree_forward(tree, cache)
    torch.testing.assert_close(out.logits, reference_tree_logits(model, prefix, tree), atol=1e-4, rtol=0)


# ------------------------------------------------------------------------------------------------
# (b) commit of an accepted path, then the next tree forward
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("cache_kind", CACHES)
@pytest.mark.parametrize("arch", ARCHS)
def test_commit_then_next_tree_forward(arch, cache_kind, tiny_model):
    """Three decoding-like rounds: tree forward, commit a (non-contiguous) root-to-node path, and
    the next tree forward equals a fresh causal forward over everything committed so far. For the
    static cache this is the in-place accept (slots copied down) against recomputation."""
    model = tiny_model(arch)
    target = Target(model, "reference", RuntimeConfig(cache=cache_kind))
    gen = torch.Generator().manual_seed(10 + arch_seed(arch))
    context = torch.randint(0, V, (PREFIX,), generator=gen)
    cache = target.new_cache()
    target.prefill(context, cache)
    tree = deep_random_tree(gen, chain=4, extra=10)
    for rnd in range(3):
        P = cache.get_seq_length()
        assert P == len(context)
        out = target.tree_forward(tree, cache)
        torch.testing.assert_close(out.logits, reference_tree_logits(model, context, tree), atol=1e-4, rtol=0)
        # the deepest non-contiguous root-to-node path (round 2: a contiguous chain prefix, the slice branch)
        if rnd == 1:
            path = [0, 1, 2]
        else:
            cands = [tree.path_to(i) for i in range(len(tree))]
            path = max((p for p in cands if p != list(range(len(p)))), key=len)
            assert path != list(range(len(path)))
        Target.commit(cache, P, path)
        assert cache.get_seq_length() == P + len(path)
        for layer in cache.layers:
            k, v = committed_kv(cache, layer)
            assert k.shape[-2] == P + len(path) and v.shape[-2] == P + len(path)
        context = torch.cat([context, tree.tokens[path]])
        tree = deep_random_tree(gen, chain=4, extra=10, root=int(torch.randint(0, V, (), generator=gen)))
    # and the compacted cache equals a freshly prefilled one, entry for entry
    fresh = target.new_cache()
    target.prefill(context, fresh)
    for a, b in zip(cache.layers, fresh.layers):
        for x, y in zip(committed_kv(cache, a), committed_kv(fresh, b)):
            torch.testing.assert_close(x, y, atol=1e-4, rtol=0)


# ------------------------------------------------------------------------------------------------
# (c) greedy TreeDecoder == model.generate
# ------------------------------------------------------------------------------------------------

K = 3  # chain length of the self drafter
M = 6
N_NEW = 1 + M * (K + 1)  # 25: a whole number of fully accepted K-chains after the prefill token
STATIC = [[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]]
DRAFTERS = ("plain", "self-chain", "self-static", "random")
PROMPT_LENGTHS = (3, PREFIX)

_generated: dict = {}


def reference_generate(model, arch: str, prompt: torch.Tensor) -> list[int]:
    key = (arch, tuple(prompt.tolist()))
    if key not in _generated:
        with torch.no_grad():
            out = model.generate(prompt[None], attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                                 do_sample=False, max_new_tokens=N_NEW, eos_token_id=None, pad_token_id=0)
        _generated[key] = out[0, len(prompt):].tolist()
        assert len(_generated[key]) == N_NEW
    return _generated[key]


def make_drafter(kind: str, target: Target, seed: int):
    if kind == "plain":
        return NoDrafter()
    if kind == "self-chain":
        return SelfDrafter(target, TreeShape("chain", depth=K))
    if kind == "self-static":
        return SelfDrafter(target, TreeShape("static", choices=STATIC))
    return RandomTreeDrafter(V, seed=seed)


@pytest.mark.parametrize("cache_kind", CACHES)
@pytest.mark.parametrize("kind", DRAFTERS)
@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_decoder_matches_generate(arch, kind, cache_kind, tiny_model):
    model = tiny_model(arch)
    target = Target(model, "reference", RuntimeConfig(cache=cache_kind))
    for n_prompt in PROMPT_LENGTHS:
        gen = torch.Generator().manual_seed(1000 * arch_seed(arch) + n_prompt)
        prompt = torch.randint(0, V, (n_prompt,), generator=gen)
        expected = reference_generate(model, arch, prompt)
        drafter = make_drafter(kind, target, seed=n_prompt)
        out = TreeDecoder(target, drafter).generate(prompt, max_new_tokens=N_NEW)
        assert out.tokens == expected, (arch, kind, n_prompt)
        st = out.stats
        assert st.new_tokens == N_NEW and st.prompt_tokens == n_prompt
        assert sum(st.accepted_hist) == st.target_forwards
        if kind == "plain":
            assert st.target_forwards == N_NEW - 1 and st.tau == 1.0 and st.tree_nodes == N_NEW - 1
        elif kind == "self-chain":  # the oracle's chain is always accepted in full
            assert st.tau == K + 1 and st.target_forwards == M
            assert st.accepted_hist == [0] * K + [M]
            assert st.tree_nodes == M * (K + 1)
        elif kind == "self-static":  # its best branch [0, 0, 0] is the greedy continuation
            assert st.tau == 4 and st.target_forwards == M
            assert st.tree_nodes == M * (len(STATIC) + 1)
        else:  # random drafts: nearly all rejected, yet the output is unchanged
            assert st.tau < 1.2
            assert st.target_forwards >= (N_NEW - 1) / 1.2
            assert any(len(t) > 1 and max(len(c) for c in t.children()) > 1 and int(t.depth.max()) > 1
                       for t in drafter.proposed)  # really non-uniform trees


@pytest.mark.parametrize("way", ["kernel", "onednn"])
@pytest.mark.parametrize("cache_kind", CACHES)
@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_argmax_without_the_logits_equals_theirs(arch, cache_kind, way, tiny_model, monkeypatch):
    """``TreeOutput.greedy()``: through the bfloat16 screen of the head (kernels/cpu_argmax.py; each
    of its two screens) where it applies, without computing the logits, and equal to their argmax;
    ``greedy_head: full`` computes them."""
    if way == "onednn" and not (cpu_argmax.available() and cpu_argmax._onednn()):
        pytest.skip("no oneDNN bfloat16 GEMM")
    model = tiny_model(arch)
    gen = torch.Generator().manual_seed(arch_seed(arch) + 40)
    prefix = torch.randint(0, V, (PREFIX,), generator=gen)
    tree = deep_random_tree(gen)
    for head in ("screened", "full"):
        target = Target(model, "reference", RuntimeConfig(cache=cache_kind, greedy_head=head),
                        backend=CpuBackend(argmax=way))
        screened = head == "screened" and cpu_argmax.available() and not target.softcap
        cache = target.new_cache()
        first = target.prefill(prefix, cache)
        out = target.tree_forward(tree, cache)
        best, root = out.greedy(), first.greedy()
        assert (out._logits is None) == screened and (first._logits is None) == screened, head
        assert best.shape == (len(tree),) and root.shape == (1,)
        assert torch.equal(best, out.logits.argmax(dim=-1)) and int(root) == int(first.logits[-1].argmax())


@pytest.mark.skipif(not cpu_argmax.available(), reason="no CPU extension")
@pytest.mark.parametrize("cache_kind", CACHES)
def test_greedy_decoding_computes_no_logits_where_the_screen_applies(cache_kind, tiny_model, monkeypatch):
    model = tiny_model("llama")
    prompt = torch.randint(0, V, (PREFIX,), generator=torch.Generator().manual_seed(3))
    expected = reference_generate(model, "llama", prompt)
    target = Target(model, "reference", RuntimeConfig(cache=cache_kind))
    monkeypatch.setattr(Target, "logits", lambda self, hidden: pytest.fail("a greedy step computed the logits"))
    assert TreeDecoder(target, make_drafter("random", target, seed=3)).generate(prompt, N_NEW).tokens == expected


# ------------------------------------------------------------------------------------------------
# variants: logit soft-capping, Qwen2's own sliding-window switch, eager attention (additive masks)
# ------------------------------------------------------------------------------------------------

VARIANTS = [("gemma3-softcap", "sdpa"), ("qwen2-sliding", "sdpa"), ("llama", "eager"), ("gemma3", "eager")]


@pytest.mark.parametrize("cache_kind", CACHES)
@pytest.mark.parametrize("arch, attn", VARIANTS, ids=[f"{a}-{b}" for a, b in VARIANTS])
def test_variants_tree_forward_and_greedy(arch, attn, cache_kind, tiny_model):
    model = tiny_model(arch, attn=attn)
    target = Target(model, "reference", RuntimeConfig(cache=cache_kind))
    assert target.eager == (attn == "eager")
    gen = torch.Generator().manual_seed(77)
    prefix = torch.randint(0, V, (PREFIX,), generator=gen)
    tree = deep_random_tree(gen)
    cache = target.new_cache()
    target.prefill(prefix, cache)
    out = target.tree_forward(tree, cache)
    torch.testing.assert_close(out.logits, reference_tree_logits(model, prefix, tree), atol=1e-4, rtol=0)
    expected = reference_generate(model, f"{arch}-{attn}", prefix)
    for kind in ("self-static", "random"):
        dec = TreeDecoder(target, make_drafter(kind, target, seed=5))
        assert dec.generate(prefix, max_new_tokens=N_NEW).tokens == expected, kind


# ------------------------------------------------------------------------------------------------
# padded buckets
# ------------------------------------------------------------------------------------------------


def test_pad_tree_hides_the_padding():
    tree = make_random_tree(5, V, torch.Generator().manual_seed(3))
    tok, dep, anc = pad_tree(tree.tokens, tree.depth, tree.ancestor_mask(), 8)
    assert tok.shape == (8,) and torch.equal(tok[:5], tree.tokens) and dep[5:].eq(0).all()
    assert torch.equal(anc[:5, :5], tree.ancestor_mask()) and not anc[:5, 5:].any() and not anc[5:, :5].any()
    assert anc[5:, 5:].equal(torch.eye(3, dtype=torch.bool))


@pytest.mark.parametrize("arch", ARCHS)
def test_padded_buckets_equal_unpadded_and_dynamic(arch, tiny_model):
    """static cache padded to a 64-node bucket == static cache at the tree's own size == dynamic
    cache, over three rounds of tree forward + commit (random trees, non-contiguous paths)."""
    model = tiny_model(arch)
    gen = torch.Generator().manual_seed(ARCHS.index(arch))
    targets = {"padded": Target(model, "reference", RuntimeConfig(buckets=[64])),
               "exact": Target(model, "reference", RuntimeConfig(buckets=list(range(1, 65)))),
               "dynamic": Target(model, "reference", RuntimeConfig(cache="dynamic"))}
    prefix = torch.randint(0, V, (21,), generator=gen)
    caches = {k: t.new_cache(128) for k, t in targets.items()}
    for k, t in targets.items():
        t.prefill(prefix, caches[k])
    for rnd in range(3):
        tree = make_random_tree(int(torch.randint(5, 30, (), generator=gen)), V, gen)
        outs = {k: t.tree_forward(tree, caches[k]) for k, t in targets.items()}
        for k in ("padded", "exact"):
            torch.testing.assert_close(outs[k].logits, outs["dynamic"].logits, atol=1e-4, rtol=0)
            torch.testing.assert_close(outs[k].hidden, outs["dynamic"].hidden, atol=1e-4, rtol=0)
        path = tree.path_to(int(torch.randint(0, len(tree), (), generator=gen)))
        for k in targets:
            Target.commit(caches[k], len(prefix), path)
        prefix = torch.cat([prefix, tree.tokens[path]])


# ------------------------------------------------------------------------------------------------
# precision
# ------------------------------------------------------------------------------------------------


def test_runtime_dtype_works_on_a_copy(tiny_model):
    model = tiny_model("llama")
    bf = Target(model, "reference", RuntimeConfig(dtype="bfloat16"))
    assert bf.model is not model and bf.lm_head.weight.dtype == torch.bfloat16
    assert model.lm_head.weight.dtype == torch.float32
    prompt = torch.arange(3, 20) % V
    out = TreeDecoder(bf, RandomTreeDrafter(V, seed=2)).generate(prompt, 24)
    plain = TreeDecoder(bf).generate(prompt, 24)
    assert out.tokens == plain.tokens  # the tiny model's peaked logits leave bf16 no close calls


# ------------------------------------------------------------------------------------------------
# compiled steps
# ------------------------------------------------------------------------------------------------


@pytest.mark.compile
@pytest.mark.parametrize("attention", ["reference", "triton"])
def test_compiled_steps_equal_eager(tiny_model, tmp_path, monkeypatch, attention):
    """torch.compile of a bucket's step (inductor on the CPU) == the eager step; its graph is
    compiled once per bucket and reused; greedy decoding through it == plain eager decoding.
    ``triton``: the tree kernel (interpreted) runs inside the compiled graph as the op
    ``torch.ops.eagle.tree_attention``, reading the prefix length from a tensor."""
    from eagle_kernels import tree_attention as ta

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    slot_calls = []
    real = ta.tree_attention

    def counting(*args, prefix_len=None, **kw):
        slot_calls.append(prefix_len is not None)
        return real(*args, prefix_len=prefix_len, **kw)

    monkeypatch.setattr(ta, "tree_attention", counting)  # what the op calls
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    model = tiny_model("llama")
    eager = Target(model, "reference", RuntimeConfig(buckets=[8]))
    comp = Target(model, attention, RuntimeConfig(buckets=[8], compile=True))
    gen = torch.Generator().manual_seed(0)
    prefix = torch.randint(0, V, (20,), generator=gen)
    ce, cc = eager.new_cache(64), comp.new_cache(64)
    eager.prefill(prefix, ce)
    comp.prefill(prefix, cc)
    for _ in range(3):
        tree = make_random_tree(int(torch.randint(2, 9, (), generator=gen)), V, gen)
        a, b = eager.tree_forward(tree, ce), comp.tree_forward(tree, cc)
        torch.testing.assert_close(b.logits, a.logits, atol=1e-4, rtol=0)
        path = tree.path_to(len(tree) - 1)
        Target.commit(ce, len(prefix), path)
        Target.commit(cc, len(prefix), path)
        prefix = torch.cat([prefix, tree.tokens[path]])
    assert list(comp.compile_s) == [8]
    drafter = RandomTreeDrafter(V, seed=3, max_nodes=8)
    out = TreeDecoder(comp, drafter).generate(prefix[:10], 20)
    assert out.tokens == TreeDecoder(eager).generate(prefix[:10], 20).tokens
    assert list(comp.compile_s) == [8]  # plain steps pad to the same bucket: nothing new compiled
    assert not torch._dynamo.utils.counters["graph_break"]  # one graph per step, the kernel op inside
    if attention == "triton":  # every layer of every compiled step went through the op
        assert slot_calls and all(slot_calls)
    else:
        assert not slot_calls


def _eager_and_compiled(model, buckets, prefix, **cpu):
    """An eager and a compiled Target of ``model`` (``buckets``), each with a cache holding ``prefix``:
    ``(eager, compiled, eager cache, compiled cache)``; ``cpu``: the compiled one's CPU backend options."""
    eager = Target(model, "reference", RuntimeConfig(buckets=buckets))
    comp = Target(model, "reference", RuntimeConfig(buckets=buckets, compile=True), backend=CpuBackend(**cpu))
    ce, cc = eager.new_cache(64), comp.new_cache(64)
    eager.prefill(prefix, ce)
    comp.prefill(prefix, cc)
    return eager, comp, ce, cc


def _same_step(eager, comp, ce, cc, tree, prefix_len: int, layers=None) -> None:
    """One tree forward on both: equal logits (and requested layers); both caches cropped back."""
    a, b = eager.tree_forward(tree, ce, layers=layers), comp.tree_forward(tree, cc, layers=layers)
    torch.testing.assert_close(b.logits, a.logits, atol=1e-4, rtol=0)
    if layers:
        torch.testing.assert_close(b.layers, a.layers, atol=1e-4, rtol=0)
    Target.crop(ce, prefix_len)
    Target.crop(cc, prefix_len)


def test_a_step_that_fails_to_compile_runs_eagerly(tiny_model, monkeypatch):
    """On the CPU a compilation error (e.g. no C++ compiler for inductor) is a warning: the step
    runs eagerly over the same whole-buffer inputs, with the same result, and stays eager."""
    gen = torch.Generator().manual_seed(2)
    prefix = torch.randint(0, V, (12,), generator=gen)
    eager, comp, ce, cc = _eager_and_compiled(tiny_model("llama"), [8], prefix)

    def broken(base, size):
        def fail(*args, **kwargs):
            raise RuntimeError("no C++ compiler")
        return fail

    monkeypatch.setattr(comp.backend, "_regions", broken)
    with pytest.warns(RuntimeWarning, match="compiling the 8-node step failed .*no C.. compiler.*eagerly"):
        _same_step(eager, comp, ce, cc, make_random_tree(6, V, gen), len(prefix))
    _same_step(eager, comp, ce, cc, make_random_tree(6, V, gen), len(prefix))  # stays eager, no warning
    assert comp.compile_s == {}


def test_a_compiled_cpu_target_leaves_the_heads_levels_eager():
    """The head's tree levels are compiled with the target's steps on GPU only (on the CPU they
    measured no faster than eager ones, docs/cpu-backend.md)."""
    from eagle.heads.drafter import EagleDrafter

    from conftest import make_tiny_head_target, random_head

    model = make_tiny_head_target("llama")
    target = Target(model, "reference", RuntimeConfig(buckets=[8], compile=True))
    assert target.compiled and not EagleDrafter(target, random_head(model), TreeShape(shape="chain", depth=2)).compiled


@pytest.mark.compile
def test_compiled_steps_return_the_requested_layers(tiny_model, tmp_path, monkeypatch):
    """The hidden states entering the requested layers (EAGLE-3's features) come out of compiled
    steps too: the layers' output-capturing hooks run outside their compiled forwards, and no hook
    is left inside (no graph break)."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    gen = torch.Generator().manual_seed(6)
    prefix = torch.randint(0, V, (14,), generator=gen)
    eager, comp, ce, cc = _eager_and_compiled(tiny_model("llama"), [8], prefix)
    for _ in range(2):
        _same_step(eager, comp, ce, cc, make_random_tree(5, V, gen), len(prefix), layers=(0, 1, 2))
    assert not torch._dynamo.utils.counters["graph_break"]


@pytest.mark.compile
def test_compiled_steps_keep_compiling_past_dynamos_default_limit(tiny_model, tmp_path, monkeypatch):
    """Every bucket adds a graph of the one compiled step code: with more buckets than dynamo's
    default recompile limit (8) no step hits a limit (past which dynamo runs it eagerly). The model's shared twin
    already holds MKL packed copies of another bucket, which the compiled copy must share."""
    import torch._dynamo.convert_frame as cf

    from eagle_kernels import cpu_gemm

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    model = tiny_model("llama")
    # first, MKL's packed copies of another bucket in the model's shared twin: the compiled layers'
    # copy of the twin shares them (they are opaque tensors, which cannot be deep-copied)
    other = Target(model, "reference", RuntimeConfig(buckets=[16]), backend=CpuBackend(linear="always"))
    other_cache = other.new_cache(64)
    other.prefill(torch.arange(1, 10) % V, other_cache)
    other.tree_forward(make_random_tree(16, V, torch.Generator().manual_seed(1)), other_cache)
    # the twin's products through the kernel specialize every bucket: the most graphs
    way = "stream" if cpu_gemm.available() else "always"
    hit = []
    real = cf.exceeds_recompile_limit

    def recording(*args, **kwargs):
        out = real(*args, **kwargs)
        hit.append(out[0])
        return out

    monkeypatch.setattr(cf, "exceeds_recompile_limit", recording)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    buckets = list(range(1, 11))
    gen = torch.Generator().manual_seed(8)
    prefix = torch.randint(0, V, (9,), generator=gen)
    # dynamo's side only: no C++ builds
    eager, comp, ce, cc = _eager_and_compiled(model, buckets, prefix, linear=way, step_backend="eager")
    for T in buckets:
        _same_step(eager, comp, ce, cc, make_random_tree(T, V, gen), len(prefix))
    assert sorted(comp.compile_s) == buckets
    assert hit and not any(hit)
    if cpu_gemm.available():
        assert torch._dynamo.utils.counters["stats"]["unique_graphs"] > 8


@pytest.mark.compile
@pytest.mark.parametrize("arch", [a for a in ARCHS if a != "llama"])
def test_compiled_steps_equal_eager_on_every_architecture(tiny_model, tmp_path, monkeypatch, arch):
    """Compiled steps (one graph per step, each decoder layer a compiled region) on the other
    architectures: Qwen2/3, Mistral and Gemma-3 (sliding-window layers; a prefix past the windows)
    == eager, no graph break, one graph."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    gen = torch.Generator().manual_seed(0)
    prefix = torch.randint(0, V, (max(GEMMA_WINDOW, MISTRAL_WINDOW) + 8,), generator=gen)
    eager, comp, ce, cc = _eager_and_compiled(tiny_model(arch), [8], prefix)
    for _ in range(2):
        _same_step(eager, comp, ce, cc, make_random_tree(7, V, gen), len(prefix))
    assert list(comp.compile_s) == [8] and not torch._dynamo.utils.counters["graph_break"]
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1


@pytest.mark.compile
@pytest.mark.parametrize("arch", ARCHS)
def test_compiled_steps_trace_each_layer_structure_once(tmp_path, monkeypatch, arch):
    """A compiled CPU step is one graph in which every decoder layer is a call of a nested compile
    region (eagle/regions.py): with 4 layers, one subgraph per layer structure (Gemma-3: sliding and
    full), each call writing its keys and values at its own layer index; == eager, caches included."""
    from transformers import AutoModelForCausalLM

    from conftest import _tiny_config
    from eagle.backends.cpu.regions import region_key

    cfg = _tiny_config(arch, layers=4)
    torch.manual_seed(1)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval().requires_grad_(False)
    graphs = []

    def recording(gm, example_inputs):  # dynamo's graph, run as it is
        graphs.append(gm)
        return gm.forward

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    torch._dynamo.reset()
    gen = torch.Generator().manual_seed(2)
    prefix = torch.randint(0, V, (max(GEMMA_WINDOW, MISTRAL_WINDOW) + 5,), generator=gen)
    eager, comp, ce, cc = _eager_and_compiled(model, [8], prefix, step_backend=recording)
    for _ in range(2):
        tree = make_random_tree(7, V, gen)
        a, b = eager.tree_forward(tree, ce), comp.tree_forward(tree, cc)
        torch.testing.assert_close(b.logits, a.logits, atol=1e-4, rtol=0)
        n = len(prefix) + len(tree)
        torch.testing.assert_close(cc.keys[..., :n, :], ce.keys[..., :n, :], atol=1e-5, rtol=0)
        torch.testing.assert_close(cc.values[..., :n, :], ce.values[..., :n, :], atol=1e-5, rtol=0)
        Target.crop(ce, len(prefix))
        Target.crop(cc, len(prefix))
    (gm,) = graphs  # one graph for the step
    calls = [node for node in gm.graph.nodes if node.target is torch.ops.higher_order.invoke_subgraph]
    bodies = {node.args[0].target for node in calls}
    structures = {region_key(layer) for layer in model.get_decoder().layers}
    assert len(calls) == 4 and len(bodies) == len(structures) == (2 if arch == "gemma3" else 1)


def test_region_keys_tell_layer_structures_apart(tiny_model):
    """Layers that trace alike share a region key; a sliding and a full Gemma-3 layer, or a
    parameter of another shape, do not; the layer index does not count."""
    import copy as copy_

    from eagle.backends.cpu.regions import region_key

    llama = tiny_model("llama").get_decoder().layers
    assert region_key(llama[0]) == region_key(llama[1])
    other = copy_.deepcopy(llama[1])
    other.self_attn.layer_idx = 7
    assert region_key(other) == region_key(llama[0])
    other.mlp.up_proj = torch.nn.Linear(other.mlp.up_proj.in_features, 96, bias=False)
    assert region_key(other) != region_key(llama[0])
    gemma = tiny_model("gemma3").get_decoder().layers  # sliding, then full
    assert region_key(gemma[0]) != region_key(gemma[1])


@pytest.mark.compile
@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_warm_compiled_steps_skip_guards_and_stay_equal_to_eager(tiny_model, tmp_path, monkeypatch, arch):
    """After a compiled CPU step of a warm key (bucket, layer set, cache capacity, ...) has run once
    with all of dynamo's guards, its later calls evaluate only the guards that tell the cached layer
    graphs apart. Buckets interleaved, requested layers, a cache grown mid-way (a new key: all guards
    again) and Gemma-3's sliding-window layers (graphs that differ by a layer attribute) all stay ==
    eager."""
    import eagle.backends.cpu as et

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    stances = []
    real = et._guards_of

    def recording(warm):
        stances.append(warm)
        return real(warm)

    monkeypatch.setattr(et, "_guards_of", recording)
    torch._dynamo.reset()
    gen = torch.Generator().manual_seed(5)
    prefix = torch.randint(0, V, (max(GEMMA_WINDOW, MISTRAL_WINDOW) + 4,), generator=gen)
    # dynamo's guards are the subject: no C++ builds
    eager, comp, ce, cc = _eager_and_compiled(tiny_model(arch), [1, 4, 8], prefix, step_backend="eager")
    for i, T in enumerate([1, 4, 8, 3, 1, 7, 2, 8, 1, 4]):
        layers = (1,) if i % 3 == 2 else None
        if i == 6:  # more room than the cache had: new shapes, a new key
            ce.reserve(ce.capacity + 40)
            cc.reserve(cc.capacity + 40)
        _same_step(eager, comp, ce, cc, make_random_tree(T, V, gen), len(prefix), layers=layers)
    # cold: the first call of each (bucket, layers, capacity); warm: every other one
    assert stances == [False, False, False, True, True, True, False, False, False, True]
