"""kernels/cpu_attention.py: the CPU masked-attention op (SDPA over the keys up to the last one any
query row sees) against its reference, on random trees after a prefix in a larger cache buffer."""
from __future__ import annotations

import pytest
import torch
from conftest import make_random_tree

from eagle_kernels import cpu_attention

needs_op = pytest.mark.skipif(not cpu_attention.available(), reason="no CPU extension")


def _case(B, Hkv, groups, T, P, C, D, gen, dtype=torch.float32, batch_mask=False):
    """Query (B, Hq, T, D) as the models make it (a transposed view), a cache buffer of C slots with
    P prefix entries and T tree entries, the rest holding NaN (what a cut must never read), and the
    mask (B|1, 1, T, C): the prefix, then each node's ancestors in a random tree."""
    q = torch.randn(B, T, Hkv * groups, D, generator=gen).transpose(1, 2).to(dtype)
    k = torch.full((B, Hkv, C, D), float("nan"))
    v = torch.full((B, Hkv, C, D), float("nan"))
    k[:, :, :P + T] = torch.randn(B, Hkv, P + T, D, generator=gen)
    v[:, :, :P + T] = torch.randn(B, Hkv, P + T, D, generator=gen)
    masks = []
    for _ in range(B if batch_mask else 1):
        m = torch.zeros(T, C, dtype=torch.bool)
        m[:, :P] = True
        m[:, P:P + T] = make_random_tree(T, 50, gen).ancestor_mask()
        masks.append(m)
    return q, k.to(dtype), v.to(dtype), torch.stack(masks)[:, None]


@needs_op
@pytest.mark.parametrize("groups", [1, 3])
@pytest.mark.parametrize("T", [1, 5, 16, 64])
@pytest.mark.parametrize("B,batch_mask", [(1, False), (2, True)])
def test_the_op_equals_the_reference_and_never_reads_past_the_last_seen_key(groups, T, B, batch_mask):
    gen = torch.Generator().manual_seed(groups * 100 + T + B)
    q, k, v, mask = _case(B, 2, groups, T, 37, 128, 16, gen, batch_mask=batch_mask)
    out = cpu_attention.masked_attention(q, k, v, mask, 0.3)
    assert out.shape == (B, T, 2 * groups, 16) and out.is_contiguous()
    assert torch.isfinite(out).all()  # the NaN slots after the tree were cut off
    ref = cpu_attention.masked_attention_reference(q, k[:, :, :37 + T], v[:, :, :37 + T], mask[..., :37 + T], 0.3)
    torch.testing.assert_close(out, ref, atol=1e-6, rtol=1e-5)


@needs_op
def test_bfloat16_and_the_default_scale():
    gen = torch.Generator().manual_seed(1)
    q, k, v, mask = _case(1, 3, 3, 8, 50, 256, 64, gen, dtype=torch.bfloat16)
    out = cpu_attention.masked_attention(q, k, v, mask)
    assert out.dtype == torch.bfloat16
    ref = cpu_attention.masked_attention_reference(q, k[:, :, :58], v[:, :, :58], mask[..., :58])
    torch.testing.assert_close(out.float(), ref.float(), atol=2e-2, rtol=2e-2)


@needs_op
def test_a_key_seen_by_one_row_only_is_kept():
    """The cut is at the last key that *any* row sees (here only the last row sees the last key)."""
    gen = torch.Generator().manual_seed(2)
    q, k, v, _ = _case(1, 2, 2, 4, 10, 64, 8, gen)
    k[:, :, 14:] = torch.randn(1, 2, 50, 8, generator=gen)
    v[:, :, 14:] = torch.randn(1, 2, 50, 8, generator=gen)
    mask = torch.zeros(1, 1, 4, 64, dtype=torch.bool)
    mask[..., :10] = True
    mask[0, 0, 3, 40] = True
    out = cpu_attention.masked_attention(q, k, v, mask, 0.5)
    torch.testing.assert_close(out, cpu_attention.masked_attention_reference(q, k, v, mask, 0.5), atol=1e-6, rtol=1e-5)


@needs_op
def test_the_op_in_a_compiled_graph_equals_eager():
    gen = torch.Generator().manual_seed(3)
    q, k, v, mask = _case(1, 3, 3, 8, 20, 64, 16, gen)

    def layer(q, k, v, mask):
        return cpu_attention.masked_attention(q * 2, k, v, mask, 0.25).sum(-1)

    torch._dynamo.reset()
    compiled = torch.compile(layer, backend="eager", fullgraph=True)
    assert torch.equal(compiled(q, k, v, mask), layer(q, k, v, mask))


def test_what_the_op_does_not_take_goes_to_the_reference(monkeypatch):
    gen = torch.Generator().manual_seed(4)
    q, k, v, mask = _case(1, 2, 2, 70, 10, 128, 8, gen)  # more than MAX_ROWS rows
    assert not cpu_attention.applies(q, k, v, mask)
    assert not cpu_attention.applies(q[:, :, :4], k, v, mask[:, :, :4].float())  # not a boolean mask
    assert not cpu_attention.applies(q[:, :, :4].double(), k.double(), v.double(), mask[:, :, :4])
    monkeypatch.setattr(cpu_attention, "_op", lambda: None)  # no extension on this machine
    q, k, v, mask = _case(1, 2, 2, 4, 10, 32, 8, gen)
    assert not cpu_attention.applies(q, k, v, mask)
    out = cpu_attention.masked_attention(q, k[:, :, :14], v[:, :, :14], mask[..., :14])
    torch.testing.assert_close(out, cpu_attention.masked_attention_reference(q, k[:, :, :14], v[:, :, :14], mask[..., :14]))
