"""The packed GEMM (eagle/packed.py): PackedLinear == F.linear, and a target with packed linears == the
plain target."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from eagle import Target
from eagle.packed import PackedLinear, packed_gemm_available
from eagle.runtime import RuntimeConfig

from conftest import TINY_VOCAB, make_random_tree

V = TINY_VOCAB


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
