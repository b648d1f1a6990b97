"""Side rows: nodes a target forward runs beside a tree (lookahead decoding's window) with their own
positions and mask. Checked against a dense-mask reference: one plain forward of the model over
``prefix + rows`` with the 4-D mask and positions written out, on random trees and random windows."""
from __future__ import annotations

import pytest
import torch

from eagle import Target
from eagle.kv import SlotCache
from eagle.runtime import RuntimeConfig
from eagle.tree import SideRows, Tree

from conftest import TINY_VOCAB, make_random_tree

V = TINY_VOCAB
ARCHS = ["llama", "qwen2"]  # no sliding windows: the dense reference mask is the whole story


def random_side(gen: torch.Generator, S: int) -> SideRows:
    """Random side rows: offsets 1..6, each row seeing itself and a random subset of the others."""
    tokens = torch.randint(0, V, (S,), generator=gen)
    offsets = torch.randint(1, 7, (S,), generator=gen)
    sees = (torch.rand(S, S, generator=gen) < 0.4) | torch.eye(S, dtype=torch.bool)
    return SideRows(tokens, offsets, sees)


@torch.no_grad()
def dense_reference(model, prefix: torch.Tensor, tree: Tree) -> torch.Tensor:
    """Logits ``(T+S, V)`` of the tree's nodes, then its side rows, from one forward of the model
    over ``prefix + nodes + side rows`` with the mask written out from the definitions: the prefix
    causal; a node sees the prefix and its ancestors; a side row sees the prefix, the root and the
    side rows its ``sees`` row marks."""
    side, T, P = tree.side, len(tree), len(prefix)
    S = 0 if side is None else len(side)
    N = T + S
    allowed = torch.zeros(P + N, P + N, dtype=torch.bool)
    allowed[:P, :P] = torch.ones(P, P, dtype=torch.bool).tril()
    allowed[P:, :P] = True
    for i in range(T):
        allowed[P + i, [P + j for j in tree.path_to(i)]] = True
    tokens, positions = [prefix, tree.tokens], [torch.arange(P), P + tree.depth]
    if side is not None:
        allowed[P + T:, P] = True  # the root
        allowed[P + T:, P + T:] = side.sees
        tokens.append(side.tokens)
        positions.append(P + side.offsets)
    out = model(input_ids=torch.cat(tokens)[None], position_ids=torch.cat(positions)[None],
                attention_mask=allowed[None, None])
    return out.logits[0, P:].float()


def test_side_rows_are_checked():
    with pytest.raises(ValueError, match="see itself"):
        SideRows(torch.tensor([1, 2]), torch.tensor([1, 2]), torch.zeros(2, 2, dtype=torch.bool))
    with pytest.raises(ValueError, match="offsets must be >= 1"):
        SideRows(torch.tensor([1]), torch.tensor([0]), torch.ones(1, 1, dtype=torch.bool))
    with pytest.raises(ValueError, match="side rows need"):
        SideRows(torch.tensor([1, 2]), torch.tensor([1]), torch.ones(2, 2, dtype=torch.bool))


def test_forward_rows_keep_the_tree_and_the_side_apart():
    gen = torch.Generator().manual_seed(0)
    tree = make_random_tree(6, V, gen).with_side(random_side(gen, 4))
    tokens, offsets, sees = tree.forward_rows()
    assert torch.equal(tokens[:6], tree.tokens) and torch.equal(offsets[:6], tree.depth)
    assert torch.equal(sees[:6, :6], tree.ancestor_mask()) and torch.equal(sees[6:, 6:], tree.side.sees)
    assert not sees[:6, 6:].any() and sees[6:, 0].all() and not sees[6:, 1:6].any()
    assert len(tree) == 6 and tree.select(torch.tensor([0])).side is tree.side


@pytest.mark.parametrize("attention", ["reference", "triton"])
@pytest.mark.parametrize("cache_kind", ["static", "dynamic"])
@pytest.mark.parametrize("arch", ARCHS)
def test_side_rows_equal_the_dense_mask_reference(arch, cache_kind, attention, tiny_model):
    """Tree and side rows in one forward == the dense reference, row by row; the tree's own rows
    are those of the tree alone; after commit the cache holds the prefix and the accepted path only
    (the next forward equals the reference over the longer prefix)."""
    model = tiny_model(arch)
    target = Target(model, attention, RuntimeConfig(cache=cache_kind, buckets=[4, 8, 16]))
    gen = torch.Generator().manual_seed(11 + ARCHS.index(arch))
    prefix = torch.randint(0, V, (9,), generator=gen)
    cache = target.new_cache()
    target.prefill(prefix, cache)
    for T, S in [(1, 3), (5, 6), (3, 13), (7, 1)]:
        tree = make_random_tree(T, V, gen).with_side(random_side(gen, S))
        ref = dense_reference(model, prefix, tree)
        out = target.tree_forward(tree, cache)
        assert out.logits.shape == (T, V) and out.side.logits.shape == (S, V)
        torch.testing.assert_close(out.logits, ref[:T], atol=1e-4, rtol=0)
        torch.testing.assert_close(out.side.logits, ref[T:], atol=1e-4, rtol=0)
        assert torch.equal(out.side.greedy(), ref[T:].argmax(-1)) and torch.equal(out.greedy(), ref[:T].argmax(-1))
        path = tree.path_to(int(torch.randint(0, T, (), generator=gen)))
        Target.commit(cache, len(prefix), path)
        prefix = torch.cat([prefix, tree.tokens[path]])
        assert (cache.length if isinstance(cache, SlotCache) else cache.get_seq_length()) == len(prefix)
    last = make_random_tree(4, V, gen)  # nothing of the side rows is left in the cache
    torch.testing.assert_close(target.tree_forward(last, cache).logits, dense_reference(model, prefix, last),
                               atol=1e-4, rtol=0)


@pytest.mark.compile
def test_side_rows_in_compiled_steps(tiny_model, tmp_path, monkeypatch):
    """A compiled step pads tree + side rows to a bucket like any tree: same logits as eager."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    torch._dynamo.reset()
    model = tiny_model("llama")
    comp = Target(model, "reference", RuntimeConfig(buckets=[16], compile=True))
    gen = torch.Generator().manual_seed(3)
    prefix = torch.randint(0, V, (12,), generator=gen)
    cache = comp.new_cache(64)
    comp.prefill(prefix, cache)
    for _ in range(2):
        tree = make_random_tree(5, V, gen).with_side(random_side(gen, 7))
        ref = dense_reference(model, prefix, tree)
        out = comp.tree_forward(tree, cache)
        torch.testing.assert_close(out.logits, ref[:5], atol=1e-4, rtol=0)
        torch.testing.assert_close(out.side.logits, ref[5:], atol=1e-4, rtol=0)
        Target.commit(cache, len(prefix), [0])
        prefix = torch.cat([prefix, tree.tokens[:1]])
