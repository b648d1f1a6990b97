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


@pytest.fixture
def attention_way():
    """Set the op's way for a test; the default ("tiled") is put back after it."""
    yield cpu_attention.set_way
    if cpu_attention.available():
        cpu_attention.set_way("tiled")


@needs_op
@pytest.mark.parametrize("way", cpu_attention.WAYS)
@pytest.mark.parametrize("T", [1, 2, 3, 7, 12, 17, 33, 61])
def test_each_way_equals_the_reference_on_random_trees(attention_way, way, T):
    """Both ways, at node counts whose rows fill the tiled loop's 16-lane blocks unevenly (T padded to
    a power of two below 16 and to a multiple of 16 above, 3 query heads a KV head), batch masks,
    and a head dim the loop does not take (12: SDPA)."""
    attention_way(way)
    assert cpu_attention.way() == way
    gen = torch.Generator().manual_seed(T)
    for B, Hkv, groups, D, batch_mask in [(1, 3, 3, 64, False), (2, 2, 1, 16, True), (1, 1, 4, 12, False)]:
        q, k, v, mask = _case(B, Hkv, groups, T, 45, 256, D, gen, batch_mask=batch_mask)
        out = cpu_attention.masked_attention(q, k, v, mask, 0.2)
        assert torch.isfinite(out).all()
        ref = cpu_attention.masked_attention_reference(q, k[:, :, :45 + T], v[:, :, :45 + T], mask[..., :45 + T], 0.2)
        # (outputs are sums of signed values of ~1: an absolute bound a few float32 ulps of 1)
        torch.testing.assert_close(out, ref, atol=4e-6, rtol=1e-5)


@needs_op
def test_rows_that_see_nothing_get_zeros_and_do_not_disturb_the_others(attention_way):
    gen = torch.Generator().manual_seed(5)
    q, k, v, mask = _case(1, 3, 3, 9, 30, 128, 64, gen)
    mask[0, 0, 4] = False  # row 4 sees no key at all
    mask[0, 0, 6, :30] = False  # row 6 sees its own branch only (keys of the second thread's share)
    for way in cpu_attention.WAYS:
        attention_way(way)
        out = cpu_attention.masked_attention(q, k, v, mask, 0.125)
        ref = cpu_attention.masked_attention_reference(q, k[:, :, :39], v[:, :, :39], mask[..., :39], 0.125)
        keep = [t for t in range(9) if t != 4]
        torch.testing.assert_close(out[:, keep], ref[:, keep], atol=4e-6, rtol=1e-5)
        if way == "tiled":
            assert torch.equal(out[:, 4], torch.zeros_like(out[:, 4]))


@needs_op
def test_a_rows_result_does_not_depend_on_the_other_rows(attention_way):
    """Tiled loop: each row's output is bitwise the same computed with the whole tree or alone (the
    same keys: the row sees the last key any row sees)."""
    attention_way("tiled")
    gen = torch.Generator().manual_seed(6)
    q, k, v, mask = _case(1, 3, 3, 16, 200, 512, 64, gen)
    mask[0, 0, :, 215] = True  # every row sees the last key, so a row alone cuts at the same place
    out = cpu_attention.masked_attention(q, k, v, mask, 0.125)
    for t in (0, 5, 15):
        alone = cpu_attention.masked_attention(q[:, :, t:t + 1], k, v, mask[:, :, t:t + 1], 0.125)
        assert torch.equal(alone[:, 0], out[:, t])


def test_set_way_rejects_an_unknown_way():
    with pytest.raises(ValueError, match="attention way must be one of"):
        cpu_attention.set_way("flash")


@pytest.fixture
def bf16_way():
    """Set how bfloat16 calls run for a test; the machine's choice is put back after it."""
    before = cpu_attention.bf16_way()
    yield cpu_attention.set_bf16_way
    if before is not None:
        cpu_attention.set_bf16_way(before)


@needs_op
@pytest.mark.parametrize("way", cpu_attention.WAYS)
@pytest.mark.parametrize("T", [1, 3, 12, 17, 61])
def test_each_bfloat16_way_equals_the_reference_on_random_trees(bf16_way, way, T):
    """bfloat16 calls through the tiled loop (values widened to float32, the output rounded once)
    or SDPA, against the float32 attention of the same bf16 inputs: the loop within one bf16
    rounding of it (its float32 sums differ from the reference's only in order), SDPA (bf16
    intermediates) within a few."""
    bf16_way(way)
    assert cpu_attention.bf16_way() == way
    gen = torch.Generator().manual_seed(100 + T)
    for B, Hkv, groups, D, batch_mask in [(1, 3, 3, 64, False), (2, 2, 1, 16, True)]:
        q, k, v, mask = _case(B, Hkv, groups, T, 45, 256, D, gen, dtype=torch.bfloat16, batch_mask=batch_mask)
        out = cpu_attention.masked_attention(q, k, v, mask, 0.2)
        assert out.dtype == torch.bfloat16 and torch.isfinite(out.float()).all()
        exact = cpu_attention.masked_attention_reference(q.float(), k[:, :, :45 + T].float(), v[:, :, :45 + T].float(),
                                                         mask[..., :45 + T], 0.2)  # float32 of the bf16 inputs
        # batched calls with fewer rows per KV head than 16 lanes stay on SDPA (tiled_attention)
        if way == "tiled" and (B == 1 or groups * T >= 16):
            assert ((out.float() - exact).abs() <= 2.0 ** -8 * exact.abs() + 1e-6).all(), (B, T)
        else:  # SDPA rounds its probabilities to bf16: errors of a few 2^-8 of the values' size
            vmax = v[:, :, :45 + T].float().abs().max().item()
            torch.testing.assert_close(out.float(), exact, atol=2.0 ** -6 * vmax, rtol=2.0 ** -7)


@needs_op
def test_a_bfloat16_rows_result_does_not_depend_on_the_other_rows(bf16_way):
    bf16_way("tiled")
    gen = torch.Generator().manual_seed(7)
    q, k, v, mask = _case(1, 3, 3, 16, 200, 512, 64, gen, dtype=torch.bfloat16)
    mask[0, 0, :, 215] = True  # every row sees the last key, so a row alone cuts at the same place
    out = cpu_attention.masked_attention(q, k, v, mask, 0.125)
    for t in (0, 5, 15):
        alone = cpu_attention.masked_attention(q[:, :, t:t + 1], k, v, mask[:, :, t:t + 1], 0.125)
        assert torch.equal(alone[:, 0], out[:, t])


@needs_op
def test_the_bfloat16_way_is_chosen_once_and_can_be_forced(monkeypatch):
    """When the op is first got (``_ext``) the faster way here is chosen and kept in a record beside
    the build; the environment forces one; bad names are errors."""
    from eagle_kernels import cpu_gemm

    ext = cpu_gemm._load()
    before = cpu_attention.bf16_way()
    assert cpu_attention._BF16_CHOSEN  # bf16_way() got the op: the choice is made

    def no_timing(fns, repeats):
        raise AssertionError("the record beside the build answers: nothing to time")

    if cpu_gemm._choice_record(ext, "attention")[0] is not None:  # written unless the build folder is read-only
        monkeypatch.setattr(cpu_attention, "timed_pass", no_timing)
    try:
        chosen = cpu_attention._choose_bf16_way(ext)  # the record: no new measurement
        assert chosen in cpu_attention.WAYS and cpu_attention.bf16_way() == chosen
        for forced in cpu_attention.WAYS:
            monkeypatch.setenv("EAGLE_CPU_ATTENTION_BF16", forced)
            assert cpu_attention._choose_bf16_way(ext) == forced == cpu_attention.bf16_way()
        monkeypatch.setenv("EAGLE_CPU_ATTENTION_BF16", "flash")
        with pytest.raises(ValueError, match="EAGLE_CPU_ATTENTION_BF16 must be one of"):
            cpu_attention._choose_bf16_way(ext)
        with pytest.raises(ValueError, match="attention way must be one of"):
            cpu_attention.set_bf16_way("flash")
    finally:
        cpu_attention.set_bf16_way(before)
