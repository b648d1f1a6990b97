"""kernels/cpu_argmax.py: the exact argmax of a float32 LM head through a bfloat16 screen (every
screen: the small-row kernel's, oneDNN's and the AVX512-BF16 dot products'), against the float64 reference, on random heads and on
heads built so that the screen alone gets it wrong."""
from __future__ import annotations

import pytest
import torch

from eagle_kernels import cpu_argmax

needs_op = pytest.mark.skipif(not cpu_argmax.available(), reason="no CPU extension")
WAYS = ["kernel", pytest.param("onednn", marks=pytest.mark.skipif(
    not (cpu_argmax.available() and cpu_argmax._onednn()), reason="no oneDNN bfloat16 GEMM")),
        pytest.param("dot", marks=pytest.mark.skipif(
            not (cpu_argmax.available() and cpu_argmax._dot()), reason="no AVX512-BF16"))]


@pytest.fixture(params=WAYS)
def way(request):
    """Runs a test once per screen (the ``choice`` argument of ``screened_argmax`` / ``way``)."""
    return request.param


def _screen_only(hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """What the bfloat16 copy alone would pick (no bound, no recomputation)."""
    return (hidden.double() @ weight.bfloat16().double().T).argmax(dim=-1)


@needs_op
@pytest.mark.parametrize("T,K,V", [(1, 64, 1000), (5, 96, 517), (16, 576, 4099), (32, 33, 70)])
def test_equals_the_float64_argmax_on_random_heads(T, K, V, way):
    gen = torch.Generator().manual_seed(T * 1000 + K + V)
    hidden = torch.randn(T, K, generator=gen) * 3
    weight = torch.randn(V, K, generator=gen) * 0.1
    best = cpu_argmax.screened_argmax(hidden, weight, way)
    assert cpu_argmax.way(T, weight, way) == way
    assert best.dtype == torch.int64 and best.shape == (T,)
    assert torch.equal(best, cpu_argmax.screened_argmax_reference(hidden, weight))
    # a row's answer does not depend on the other rows
    assert torch.equal(best, torch.cat([cpu_argmax.screened_argmax(hidden[t:t + 1], weight, way) for t in range(T)]))


@needs_op
@pytest.mark.parametrize("T", [1, 32, 64])
def test_where_the_screen_picks_wrong_the_exact_logits_decide(T, way):
    """Heads of near-copies of one row (differences far below bf16's resolution): their bf16 copies
    are equal or rounded the wrong way, so the screen cannot order them; the exact logits can."""
    gen = torch.Generator().manual_seed(5 + T)
    K, V = 128, 300
    base = torch.randn(K, generator=gen)
    weight = base + 1e-4 * torch.randn(V, K, generator=gen)  # (V, K): every row nearly `base`
    hidden = base + 0.5 * torch.randn(T, K, generator=gen)  # (T, K): each row's best is a near-tie
    exact = cpu_argmax.screened_argmax_reference(hidden, weight)
    assert (exact != _screen_only(hidden, weight)).sum() >= max(1, T // 2)  # the screen alone is wrong on most rows
    assert torch.equal(cpu_argmax.screened_argmax(hidden, weight, way), exact)


@needs_op
def test_ties_go_to_the_lowest_index_and_updates_of_the_head_are_seen(way):
    gen = torch.Generator().manual_seed(7)
    weight = torch.randn(50, 32, generator=gen)
    hidden = torch.randn(3, 32, generator=gen)
    top = int(cpu_argmax.screened_argmax_reference(hidden[:1], weight))
    weight[40] = weight[top]  # an exact copy of the winner, at a higher index
    weight[top + 1:40] = weight[top + 1:40] * 0.01  # nothing else near it
    assert int(cpu_argmax.screened_argmax(hidden[:1], weight, way)) == top
    weight[top] = 0.0  # in place: the kept bf16 copy and norms are stale and must be made again
    assert int(cpu_argmax.screened_argmax(hidden[:1], weight, way)) == 40 == int(
        cpu_argmax.screened_argmax_reference(hidden[:1], weight))


@needs_op
def test_rows_that_are_not_finite_and_calls_the_op_does_not_take(way):
    gen = torch.Generator().manual_seed(9)
    weight = torch.randn(200, 48, generator=gen)
    hidden = torch.randn(4, 48, generator=gen)
    hidden[1, 3] = float("inf")
    hidden[2, 0] = float("nan")
    assert torch.equal(cpu_argmax.screened_argmax(hidden, weight, way), cpu_argmax.screened_argmax_reference(hidden, weight))
    assert not cpu_argmax.applies(hidden.bfloat16(), weight.bfloat16())
    assert not cpu_argmax.applies(hidden[0], weight)  # 1-D
    assert cpu_argmax.applies(hidden, weight)
    most = cpu_argmax.MAX_ROWS if cpu_argmax._onednn() else cpu_argmax.KERNEL_MAX_ROWS
    assert cpu_argmax.applies(hidden.repeat(most, 1)[:most], weight)
    assert not cpu_argmax.applies(hidden.repeat(most, 1)[:most + 1], weight)
    bf = cpu_argmax.screened_argmax(hidden[[0, 3]].bfloat16(), weight.bfloat16(), way)  # the reference's answer
    assert torch.equal(bf, cpu_argmax.screened_argmax_reference(hidden[[0, 3]].bfloat16(), weight.bfloat16()))


@needs_op
def test_the_measured_way_is_kept_per_row_bucket_and_gives_the_same_answer(monkeypatch):
    """``choice="measure"`` (the default): each row bucket (power of two) is timed once and one of
    the available screens kept; beyond the kernel's rows only oneDNN's; the answers do not depend on
    the way; a choice that is not a way is an error naming the ways."""
    monkeypatch.setattr(cpu_argmax, "_MEASURED", {})
    gen = torch.Generator().manual_seed(11)
    weight = torch.randn(3000, 64, generator=gen)
    hidden = torch.randn(40, 64, generator=gen)
    ways = {"kernel"} | ({"onednn"} if cpu_argmax._onednn() else set()) | ({"dot"} if cpu_argmax._dot() else set())
    for rows in (1, 3, 4, 16, 40):
        assert cpu_argmax.way(rows, weight) in ways
        assert torch.equal(cpu_argmax.screened_argmax(hidden[:rows], weight, "measure"),
                           cpu_argmax.screened_argmax_reference(hidden[:rows], weight))
    got = cpu_argmax.measurements()
    if cpu_argmax._onednn():
        assert cpu_argmax.way(40, weight) == "onednn"  # past KERNEL_MAX_ROWS: not measured
    if len(ways) > 1:
        assert sorted(key[2] for key in got) == [1, 4, 16]  # 3 and 4 share a bucket
        assert all(m["way"] in ways and all(m[f"{n}_ms"] > 0 for n in ways) for m in got.values())
    else:
        assert got == {}
    with pytest.raises(ValueError, match=r"screened argmax way must be one of .*got 'fast'"):
        cpu_argmax.screened_argmax(hidden[:1], weight, "fast")


@needs_op
def test_each_screen_stays_within_its_bound_where_rounding_errors_add_up():
    """The ops' own coefficients (``screen_coef``) against the error of each screen on a row built so
    that every rounding goes the same way: x and w just below bf16's rounding midpoint (both round
    down) and a sum that bf16's output rounding moves further. The kernel's screen (float32 x,
    float32 result) errs by ~u |x| |w|, just inside its bound; oneDNN's (bf16 x, bf16 result) by
    ~2.5u, past the kernel's bound and inside its own (u = 2^-8)."""
    from eagle_kernels.onednn import onednn_pack

    from eagle_kernels import cpu_gemm

    K, V, u = 513, 40, 2.0 ** -8
    below = 1 + u * (1 - 2.0 ** -12)  # a float32 value that bf16 rounds down to 1
    gen = torch.Generator().manual_seed(13)
    x = torch.full((1, K), below)
    w = torch.cat([torch.full((1, K), below), torch.randn(V - 1, K, generator=gen)])  # (V, K)
    z = x.double() @ w.double().T  # (1, V) exact logits
    scale = x.double().norm() * w.double().norm(dim=1)  # |x| |w_j|
    coef = {held: cpu_argmax._op("screen_coef")(K, held) for held in (False, True)}

    s = cpu_gemm._load().packed_linear(x, cpu_gemm._load().pack(w.bfloat16()), V, None)
    ratio = ((s.double() - z).abs() / scale).max().item()
    assert 0.95 * coef[False] < ratio <= coef[False]
    if cpu_argmax._onednn():
        held = cpu_gemm.HeldWeight(onednn_pack(w.bfloat16()))  # kept until the product is done
        s = cpu_gemm.held_op(x.bfloat16(), held.slot, V)
        ratio = ((s.double() - z).abs() / scale).max().item()
        assert 2 * coef[False] < ratio <= coef[True]
    if cpu_argmax._dot():  # bf16 x and w, a float32 result: past the kernel's bound, inside oneDNN's
        s = cpu_argmax._op("screen_dot")(x, cpu_argmax.pack_pairs(w), V)
        ratio = ((s.double() - z).abs() / scale).max().item()
        assert 1.5 * coef[False] < ratio <= coef[True]


def test_pair_packing_lays_out_pairs_of_k_per_output():
    """``pack_pairs``: line (b, kk) holds w[16b + j, 2kk + h] at 2j + h, zeros past V and an odd K."""
    V, K = 19, 5
    w = torch.arange(V * K, dtype=torch.float32).view(V, K)
    p = cpu_argmax.pack_pairs(w)
    assert p.shape == (2, 3, 32) and p.dtype == torch.bfloat16
    for b in range(2):
        for kk in range(3):
            for j in range(16):
                for h in range(2):
                    n, k = 16 * b + j, 2 * kk + h
                    assert p[b, kk, 2 * j + h].item() == (w[n, k].bfloat16().item() if n < V and k < K else 0.0)


@needs_op
@pytest.mark.skipif(not (cpu_argmax.available() and cpu_argmax._dot()), reason="no AVX512-BF16")
def test_the_dot_screen_is_the_float64_product_of_the_rounded_operands_within_float32_sums():
    """The dot screen on random shapes (odd K, V not a multiple of 16, 1-33 rows in groups of <= 16)
    against bf16(x) @ bf16(w).T in float64: within the float32 sum's error, and a row's screen does
    not depend on the other rows."""
    gen = torch.Generator().manual_seed(21)
    for T, K, V in ((1, 64, 100), (7, 33, 517), (16, 576, 300), (17, 31, 40), (33, 128, 70)):
        x, w = torch.randn(T, K, generator=gen), torch.randn(V, K, generator=gen)
        s = cpu_argmax._op("screen_dot")(x, cpu_argmax.pack_pairs(w), V)
        ref = x.bfloat16().double() @ w.bfloat16().double().T
        tol = K * 2.0 ** -23 * (x.bfloat16().double().abs() @ w.bfloat16().double().abs().T)
        assert s.shape == (T, V) and ((s.double() - ref).abs() <= tol).all(), (T, K, V)
        assert torch.equal(s[T - 1:], cpu_argmax._op("screen_dot")(x[T - 1:], cpu_argmax.pack_pairs(w), V))
