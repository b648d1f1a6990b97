"""The slot KV cache (eagle/kv.py): commit moves the accepted slots in place, reserve keeps them,
crop cuts; decoding never reallocates the cache."""
from __future__ import annotations

import pytest
import torch

from eagle import Target, TreeDecoder
from eagle.kv import SlotCache

from conftest import TINY_VOCAB, RandomTreeDrafter

V = TINY_VOCAB


def test_slot_cache_commit_moves_slots_in_place_and_reserve_keeps_them():
    cache = SlotCache(num_layers=2, capacity=16)
    kv = torch.arange(20.0).view(1, 1, 20, 1).expand(1, 2, 20, 3).contiguous()  # slot s holds s
    for i in range(2):
        cache.update(kv[:, :, :10], kv[:, :, :10], i, kwargs={"cache_slots": torch.arange(10)})
    assert cache.keys.shape == (2, 1, 2, 16, 3) and cache.layers[1].keys.data_ptr() == cache.keys[1].data_ptr()
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

    def spy(tree, cache, layers=None):
        ptrs.append((cache.layers[0].keys.data_ptr() if cache.layers[0].is_initialized else None, cache.capacity))
        return real(tree, cache, layers)

    target.tree_forward = spy
    TreeDecoder(target, RandomTreeDrafter(V, seed=1, max_nodes=12)).generate(torch.arange(1, 30) % V, 40)
    assert len(ptrs) > 10 and len(set(ptrs)) == 1


def test_a_traced_update_writes_what_an_eager_one_does():
    """Under torch.compile the update scatters into the stacked buffers (one index_put_ with the
    layer index as a tensor) instead of index_copy_ on the layer's view: the same entries land in
    the same slots (batch of 2, scattered slots, two layers), the returned views are the layer's."""
    gen = torch.Generator().manual_seed(0)
    eager, traced = SlotCache(3, 16), SlotCache(3, 16)
    writes = [(layer, torch.randn(2, 2, 4, 8, generator=gen), torch.randn(2, 2, 4, 8, generator=gen),
               torch.tensor(slots)) for layer, slots in ((0, [0, 1, 2, 3]), (2, [9, 4, 7, 5]), (1, [15, 0, 3, 8]))]

    def step(cache, layer, k, v, slots):
        return cache.update(k, v, layer, kwargs={"cache_slots": slots})

    compiled = torch.compile(step, backend="eager", fullgraph=True)
    for layer, k, v, slots in writes:
        ke, ve = step(eager, layer, k, v, slots)
        kt, vt = compiled(traced, layer, k, v, slots)
        assert torch.equal(ke, kt) and torch.equal(ve, vt)
    assert torch.equal(eager.keys, traced.keys) and torch.equal(eager.values, traced.values)
    assert torch.equal(traced.keys[2][:, :, [9, 4, 7, 5]], writes[1][1])
