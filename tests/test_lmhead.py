"""The LM-head product (eagle/backends/cpu/lmhead.py): every way equals F.linear; the measured choice is made once
per (rows, weight), reused, and never serves a stale packed copy."""
from __future__ import annotations

import gc

import pytest
import torch

import eagle.backends.cpu.lmhead as lmhead
from eagle_kernels.onednn import onednn_available, packed_gemm_available
from eagle_kernels.weightmemo import WeightMemo
from eagle_kernels import cpu_gemm

STREAM = ["stream"] if cpu_gemm.available() else []
WAYS = ["plain", "transposed"] + (["packed"] if packed_gemm_available() else []) + STREAM


def _expected_ways(rows: int) -> set:
    if rows == 1:
        return {"plain", *STREAM}
    return set(WAYS if rows >= 4 else ["plain", "transposed", *STREAM])


@pytest.mark.parametrize("rows", [1, 2, 5, 16])
def test_every_way_equals_linear(rows):
    torch.manual_seed(rows)
    w, x = torch.randn(300, 24), torch.randn(rows, 24)  # (V, H), (T, H)
    ref = torch.nn.functional.linear(x, w)  # (T, V)
    with torch.no_grad():
        ways, packed = lmhead._candidates(rows, x, w)
    assert set(ways) == _expected_ways(rows)
    assert (packed is not None) == ("packed" in ways)
    for fn in ways.values():
        out = fn(x, w)
        assert out.shape == (rows, 300) and out.is_contiguous() and torch.allclose(out, ref, atol=1e-5)
    assert lmhead._measure(x, w, ways) in ways


@pytest.mark.parametrize("rows", [1, 2, 6])
@pytest.mark.parametrize("winner", WAYS)
def test_the_choice_is_measured_once_and_kept(rows, winner, monkeypatch):
    """The timer is replaced so the winner is known; a product with one candidate way (one row,
    without the small-row kernel) is not measured (F.linear)."""
    torch.manual_seed(0)
    w, x = torch.randn(300, 24), torch.randn(rows, 24)
    ref = torch.nn.functional.linear(x, w)
    measured = []
    monkeypatch.setattr(lmhead, "_CHOICE", WeightMemo())
    monkeypatch.setattr(lmhead, "_measure", lambda h, wt, ways: measured.append(tuple(h.shape)) or
                        (winner if winner in ways else "plain"))
    for _ in range(3):
        with torch.no_grad():
            out = lmhead.project(x, w)
        assert out.is_contiguous() and torch.allclose(out, ref, atol=1e-5)
    candidates = _expected_ways(rows)
    assert measured == ([] if len(candidates) == 1 else [(rows, 24)])
    if len(candidates) > 1:
        (choice,) = lmhead._CHOICE.values()
        assert choice.way == (winner if winner in candidates else "plain")
        assert (choice.packed is not None) == (choice.way == "packed")  # a packed copy only when it won


@pytest.mark.parametrize("winner", WAYS)
def test_an_updated_or_freed_weight_is_measured_again(winner, monkeypatch):
    """An in-place update of the weight (a packed copy would be stale) and a new weight at a reused
    address are measured afresh; a freed weight's entry (and packed copy) goes with it."""
    monkeypatch.setattr(lmhead, "_CHOICE", WeightMemo())
    calls = []
    monkeypatch.setattr(lmhead, "_measure", lambda h, wt, ways: calls.append(1) or winner)
    w, x = torch.randn(300, 24), torch.randn(8, 24)
    lmhead.project(x, w)
    with torch.no_grad():
        w.mul_(-2.0)  # in place: same address, new version
    assert torch.allclose(lmhead.project(x, w), torch.nn.functional.linear(x, w), atol=1e-5)
    assert len(calls) == 2 and len(lmhead._CHOICE) == 1
    del w
    gc.collect()
    assert len(lmhead._CHOICE) == 0


def test_other_dtypes_and_trained_weights():
    w, x = torch.randn(64, 16, dtype=torch.float16), torch.randn(4, 16, dtype=torch.float16)
    assert torch.equal(lmhead.project(x, w), torch.nn.functional.linear(x, w))
    assert lmhead._CHOICE.get(w, (4,)) is None  # float16: F.linear, nothing measured
    ways, packed = lmhead._candidates(8, torch.randn(8, 16), torch.randn(64, 16, requires_grad=True))
    assert "packed" not in ways and "stream" not in ways and packed is None  # a weight being trained: autograd's way
    ways, packed = lmhead._candidates(8, torch.randn(8, 16, dtype=torch.bfloat16),
                                      torch.randn(64, 16, dtype=torch.bfloat16, requires_grad=True))
    assert set(ways) == {"plain", "transposed"} and packed is None


@pytest.mark.skipif(not onednn_available(), reason="no oneDNN bfloat16 GEMM in this torch build / on this CPU")
@pytest.mark.parametrize("rows", [1, 3, 8])
def test_bfloat16_ways_include_onednn_on_a_packed_copy(rows, monkeypatch):
    """A bfloat16 head's candidates: F.linear, transposed (from 2 rows), the small-row kernel (where it
    runs) and oneDNN on a packed copy, which is kept when it wins; every way is close to the float32 product of the same values, and
    the oneDNN way gives each row the bits it gets alone."""
    torch.manual_seed(rows)
    w, x = torch.randn(300, 24, dtype=torch.bfloat16), torch.randn(rows, 24, dtype=torch.bfloat16)
    ref = torch.nn.functional.linear(x.float(), w.float())
    with torch.no_grad():
        ways, packed = lmhead._candidates(rows, x, w)
    assert set(ways) == {"plain", "onednn", *STREAM} | ({"transposed"} if rows > 1 else set())
    assert packed is not None and packed.layout == torch._mkldnn
    for fn in ways.values():
        out = fn(x, w)
        assert out.shape == (rows, 300) and out.dtype == torch.bfloat16 and out.is_contiguous()
        torch.testing.assert_close(out.float(), ref, atol=0.1, rtol=0.02)
    rows_alone = torch.cat([ways["onednn"](x[i:i + 1], w) for i in range(rows)])
    assert torch.equal(ways["onednn"](x, w), rows_alone)
    monkeypatch.setattr(lmhead, "_CHOICE", WeightMemo())
    monkeypatch.setattr(lmhead, "_measure", lambda h, wt, ways: "onednn")
    with torch.no_grad():
        out = lmhead.project(x, w)
    (choice,) = lmhead._CHOICE.values()
    assert choice.way == "onednn" and choice.packed is not None and torch.equal(out, ways["onednn"](x, w))
