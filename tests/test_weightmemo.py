"""WeightMemo: values kept per weight, dropped after an in-place update or with the weight."""
from __future__ import annotations

import gc

import torch

from eagle_kernels.weightmemo import WeightMemo


def test_kept_per_weight_and_extra_key_shared_by_views():
    memo, w = WeightMemo(), torch.randn(8, 4)
    assert memo.get(w) is None
    assert memo.put(w, "a") == "a" and memo.put(w, "b", (16,)) == "b"
    assert memo.get(w) == "a" and memo.get(w, (16,)) == "b" and memo.get(w, (8,)) is None
    assert memo.get(w.view(8, 4)) == "a"  # a view of the same memory: same version counter
    assert memo.get(w.T) is None and memo.get(w.clone()) is None  # other strides / other memory
    assert sorted(memo.values()) == ["a", "b"] and len(memo) == 2


def test_an_in_place_update_hides_the_value_until_it_is_made_again():
    memo, w = WeightMemo(), torch.randn(8, 4)
    memo.put(w, "old")
    with torch.no_grad():
        w.mul_(2.0)
    assert memo.get(w) is None
    memo.put(w, "new")
    assert memo.get(w) == "new" and len(memo) == 1


def test_the_entry_goes_with_its_weight_and_not_with_a_replaced_one():
    memo = WeightMemo()
    w = torch.randn(8, 4)
    memo.put(w, "first")
    del w
    gc.collect()
    assert len(memo) == 0
    w1 = torch.randn(8, 4)
    memo.put(w1, "one")
    w2 = w1.detach()  # same memory, another tensor object: its entry replaces w1's, and w1's death must not drop it
    memo.put(w2, "two")
    del w1
    gc.collect()
    assert memo.get(w2) == "two" and len(memo) == 1
