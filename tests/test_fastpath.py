"""The fast target path: tensor-built tree structure, tensor greedy verification, the slot cache,
padded buckets, the packed GEMM, the runtime config, precision and compiled steps, each against its
slow reference on random inputs (random trees, not only chains)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from eagle import Target, TreeDecoder
from eagle.config import ConfigError, DecodeConfig, from_dict
from eagle.kv import SlotCache
from eagle.packed import PackedLinear, packed_gemm_available
from eagle.runtime import RuntimeConfig
from eagle.target import pad_tree
from eagle.tree import Tree, ancestors_from_parents
from eagle.verify import greedy_verify, greedy_verify_reference

from conftest import ARCHS, TINY_VOCAB, RandomTreeDrafter, make_random_tree

V = TINY_VOCAB


def loop_ancestors(parents: list[int]) -> torch.Tensor:
    """The obvious reference: each node's row is its parent's row plus itself."""
    T = len(parents)
    anc = torch.eye(T, dtype=torch.bool)
    for i in range(1, T):
        anc[i] |= anc[parents[i]]
    return anc


def loop_depth(parents: list[int]) -> list[int]:
    d = [0] * len(parents)
    for i in range(1, len(parents)):
        d[i] = d[parents[i]] + 1
    return d


# ---- tree structure as tensor ops -------------------------------------------------------------

@pytest.mark.parametrize("T", [1, 2, 3, 7, 16, 33, 64, 100])
def test_ancestors_and_depth_match_loops(T):
    gen = torch.Generator().manual_seed(T)
    for trial in range(5):
        tree = make_random_tree(T, V, gen, distinct_siblings=False)
        par = tree.parents.tolist()
        assert torch.equal(ancestors_from_parents(tree.parents), loop_ancestors(par))
        assert torch.equal(tree.ancestor_mask(), loop_ancestors(par))
        assert tree.depth.tolist() == loop_depth(par)
        assert tree.positions(7).tolist() == [7 + d for d in loop_depth(par)]
    chain = Tree.chain(list(range(T)))  # the deepest case: T - 1 doublings' worth of distance
    assert chain.depth.tolist() == list(range(T))
    assert torch.equal(chain.ancestor_mask(), torch.ones(T, T, dtype=torch.bool).tril())


def test_tree_structure_is_computed_once():
    tree = make_random_tree(20, V, torch.Generator().manual_seed(0))
    assert tree.ancestor_mask() is tree.ancestor_mask() and tree.depth is tree.depth


# ---- greedy verification as tensor ops --------------------------------------------------------

def _logits_following(tree: Tree, node: int, gen: torch.Generator) -> torch.Tensor:
    """Random logits (T, V) whose argmax walks the tree down to ``node`` (then leaves it)."""
    logits = torch.randn(len(tree), V, generator=gen)
    path = tree.path_to(node)
    for a, b in zip(path, path[1:]):
        logits[a, tree.tokens[b]] = 100.0
    return logits


@pytest.mark.parametrize("seed", range(40))
def test_greedy_verify_matches_the_walk(seed):
    gen = torch.Generator().manual_seed(seed)
    T = int(torch.randint(1, 40, (), generator=gen))
    # duplicate siblings allowed: the walk takes the first one, so must the tensor version
    tree = make_random_tree(T, 6 if seed % 2 else V, gen, distinct_siblings=bool(seed % 3))
    target_node = int(torch.randint(0, T, (), generator=gen))
    for logits in (_logits_following(tree, target_node, gen), torch.randn(T, V, generator=gen)):
        assert greedy_verify(tree, logits) == greedy_verify_reference(tree, logits)


def test_greedy_verify_takes_the_first_of_duplicate_siblings():
    # root 0 -> two children with token 5 (nodes 1, 2); only node 2 has a child
    tree = Tree.from_lists([9, 5, 5, 7], [-1, 0, 0, 2])
    logits = torch.zeros(4, V)
    logits[0, 5] = logits[1, 3] = logits[2, 7] = logits[3, 1] = 10.0
    assert greedy_verify(tree, logits) == greedy_verify_reference(tree, logits) == ([0, 1], 3)


# ---- the slot cache ---------------------------------------------------------------------------

def test_slot_cache_commit_moves_slots_in_place_and_reserve_keeps_them():
    cache = SlotCache(num_layers=2, capacity=16)
    kv = torch.arange(20.0).view(1, 1, 20, 1).expand(1, 2, 20, 3).contiguous()  # slot s holds s
    for layer in cache.layers:
        layer.update(kv[:, :, :10], kv[:, :, :10], kwargs={"cache_slots": torch.arange(10)})
    ptr = cache.layers[0].keys.data_ptr()
    cache.commit(4, [0, 2, 5])  # nodes 0, 2, 5 of a tree written at slots 4.. -> slots 4, 5, 6
    assert cache.length == 7 and cache.layers[0].keys.data_ptr() == ptr
    assert cache.layers[1].values[0, 0, :7, 0].tolist() == [0, 1, 2, 3, 4, 6, 9]
    cache.commit(7, [0, 1])  # a chain prefix stays where it is
    assert cache.length == 9
    cache.reserve(40)
    assert cache.capacity == 40 and cache.layers[0].keys.shape[2] == 40
    assert cache.layers[0].keys[0, 1, :7, 2].tolist() == [0, 1, 2, 3, 4, 6, 9]
    cache.crop(3)
    assert cache.length == 3


def test_slot_cache_needs_slots():
    cache = SlotCache(1, 8)
    with pytest.raises(ValueError, match="cache_slots"):
        cache.update(torch.zeros(1, 1, 2, 4), torch.zeros(1, 1, 2, 4), 0, kwargs={})


def test_generate_never_reallocates_the_cache(tiny_model):
    """No per-step allocation: every verification step writes into the same buffers."""
    target = Target(tiny_model("llama"), "reference")
    ptrs = []
    real = target.tree_forward

    def spy(tree, cache):
        ptrs.append((cache.layers[0].keys.data_ptr() if cache.layers[0].is_initialized else None, cache.capacity))
        return real(tree, cache)

    target.tree_forward = spy
    TreeDecoder(target, RandomTreeDrafter(V, seed=1, max_nodes=12)).generate(torch.arange(1, 30) % V, 40)
    assert len(ptrs) > 10 and len(set(ptrs)) == 1


# ---- padded buckets -----------------------------------------------------------------------------

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


# ---- the packed GEMM -----------------------------------------------------------------------------

@pytest.mark.skipif(not packed_gemm_available(), reason="this torch build has no MKL packed GEMM")
def test_packed_linear_equals_linear():
    gen = torch.Generator().manual_seed(0)
    w, b = torch.randn(96, 40, generator=gen), torch.randn(96, generator=gen)
    mode = PackedLinear([8])
    x8, x3 = torch.randn(1, 8, 40, generator=gen), torch.randn(3, 40, generator=gen)
    with mode:
        y8, y8b, y3 = F.linear(x8, w), F.linear(x8, w, b), F.linear(x3, w, b)
        y16 = F.linear(x8.to(torch.float16), w.to(torch.float16))  # not float32: untouched
    torch.testing.assert_close(y8, F.linear(x8, w), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(y8b, F.linear(x8, w, b), atol=1e-5, rtol=1e-5)
    assert y8.shape == (1, 8, 96) and torch.equal(y3, F.linear(x3, w, b)) and y16.dtype == torch.float16
    assert list(mode.packed) == [(w.data_ptr(), 8)]  # one packed copy, reused by both 8-row calls
    wg = torch.randn(96, 40, requires_grad=True)
    with mode:
        F.linear(x8, wg).sum().backward()  # trainable weights keep autograd's path
    assert wg.grad is not None and len(mode.packed) == 1


@pytest.mark.skipif(not packed_gemm_available(), reason="this torch build has no MKL packed GEMM")
def test_packed_target_equals_plain_target(tiny_model):
    model = tiny_model("qwen2")  # q/k/v carry biases
    gen = torch.Generator().manual_seed(5)
    prefix = torch.randint(0, V, (17,), generator=gen)
    on, off = (Target(model, "reference", RuntimeConfig(packed_linear=p)) for p in (True, False))
    assert on.packed is not None and off.packed is None
    for t in (on, off):
        t.cache = t.new_cache(64)
        t.prefill(prefix, t.cache)
    tree = make_random_tree(13, V, gen)
    torch.testing.assert_close(on.tree_forward(tree, on.cache).logits, off.tree_forward(tree, off.cache).logits,
                               atol=1e-4, rtol=0)
    assert any(rows == 16 for _, rows in on.packed.packed)


# ---- runtime config ------------------------------------------------------------------------------

@pytest.mark.parametrize("bad, msg", [({"cache": "paged"}, "runtime.cache"), ({"dtype": "int8"}, "runtime.dtype"),
                                      ({"buckets": [8, 4]}, "runtime.buckets"), ({"buckets": []}, "runtime.buckets"),
                                      ({"buckets": [0, 4]}, "runtime.buckets"),
                                      ({"cache": "dynamic", "compile": True}, "runtime.compile")])
def test_runtime_config_errors(bad, msg):
    cfg = from_dict(DecodeConfig, {"runtime": bad})
    with pytest.raises(ConfigError, match=msg):
        cfg.validate()


def test_runtime_unknown_key_and_buckets():
    with pytest.raises(ConfigError, match="runtime.graphs"):
        from_dict(DecodeConfig, {"runtime": {"graphs": 3}})
    rt = RuntimeConfig(buckets=[1, 4, 8])
    assert [rt.bucket(n) for n in (1, 2, 4, 5, 8, 9, 70)] == [1, 4, 4, 8, 8, 9, 70]


# ---- precision -----------------------------------------------------------------------------------

def test_runtime_dtype_works_on_a_copy(tiny_model):
    model = tiny_model("llama")
    bf = Target(model, "reference", RuntimeConfig(dtype="bfloat16"))
    assert bf.model is not model and bf.lm_head.weight.dtype == torch.bfloat16
    assert model.lm_head.weight.dtype == torch.float32
    prompt = torch.arange(3, 20) % V
    out = TreeDecoder(bf, RandomTreeDrafter(V, seed=2)).generate(prompt, 24)
    plain = TreeDecoder(bf).generate(prompt, 24)
    assert out.tokens == plain.tokens  # the tiny model's peaked logits leave bf16 no close calls


# ---- compiled steps ------------------------------------------------------------------------------

@pytest.mark.compile
def test_compiled_steps_equal_eager(tiny_model, tmp_path, monkeypatch):
    """torch.compile of a bucket's step (inductor on the CPU) == the eager step; its graph is
    compiled once per bucket and reused; greedy decoding through it == plain eager decoding."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    model = tiny_model("llama")
    eager = Target(model, "reference", RuntimeConfig(buckets=[8]))
    comp = Target(model, "reference", RuntimeConfig(buckets=[8], compile=True))
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
