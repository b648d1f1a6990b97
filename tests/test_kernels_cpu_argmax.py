"""kernels/cpu_argmax.py: the exact argmax of a float32 LM head through a bfloat16 screen, against
the float64 reference, on random heads and on heads built so that the screen alone gets it wrong."""
from __future__ import annotations

import pytest
import torch

from eagle_kernels import cpu_argmax

needs_op = pytest.mark.skipif(not cpu_argmax.available(), reason="no CPU extension")


def _screen_only(hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """What the bfloat16 copy alone would pick (no bound, no recomputation)."""
    return (hidden.double() @ weight.bfloat16().double().T).argmax(dim=-1)


@needs_op
@pytest.mark.parametrize("T,K,V", [(1, 64, 1000), (5, 96, 517), (16, 576, 4099), (32, 33, 70)])
def test_equals_the_float64_argmax_on_random_heads(T, K, V):
    gen = torch.Generator().manual_seed(T * 1000 + K + V)
    hidden = torch.randn(T, K, generator=gen) * 3
    weight = torch.randn(V, K, generator=gen) * 0.1
    best = cpu_argmax.screened_argmax(hidden, weight)
    assert best.dtype == torch.int64 and best.shape == (T,)
    assert torch.equal(best, cpu_argmax.screened_argmax_reference(hidden, weight))
    # a row's answer does not depend on the other rows
    assert torch.equal(best, torch.cat([cpu_argmax.screened_argmax(hidden[t:t + 1], weight) for t in range(T)]))


@needs_op
def test_where_the_screen_picks_wrong_the_exact_logits_decide():
    """Heads of near-copies of one row (differences far below bf16's resolution): their bf16 copies
    are equal or rounded the wrong way, so the screen cannot order them; the exact logits can."""
    gen = torch.Generator().manual_seed(5)
    K, V, T = 128, 300, cpu_argmax.MAX_ROWS
    base = torch.randn(K, generator=gen)
    weight = base + 1e-4 * torch.randn(V, K, generator=gen)  # (V, K): every row nearly `base`
    hidden = base + 0.5 * torch.randn(T, K, generator=gen)  # (T, K): each row's best is a near-tie
    exact = cpu_argmax.screened_argmax_reference(hidden, weight)
    assert (exact != _screen_only(hidden, weight)).sum() >= T // 2  # the screen alone is wrong on most rows
    assert torch.equal(cpu_argmax.screened_argmax(hidden, weight), exact)


@needs_op
def test_ties_go_to_the_lowest_index_and_updates_of_the_head_are_seen():
    gen = torch.Generator().manual_seed(7)
    weight = torch.randn(50, 32, generator=gen)
    hidden = torch.randn(3, 32, generator=gen)
    top = int(cpu_argmax.screened_argmax_reference(hidden[:1], weight))
    weight[40] = weight[top]  # an exact copy of the winner, at a higher index
    weight[top + 1:40] = weight[top + 1:40] * 0.01  # nothing else near it
    assert int(cpu_argmax.screened_argmax(hidden[:1], weight)) == top
    weight[top] = 0.0  # in place: the kept bf16 copy and norms are stale and must be made again
    assert int(cpu_argmax.screened_argmax(hidden[:1], weight)) == 40 == int(
        cpu_argmax.screened_argmax_reference(hidden[:1], weight))


@needs_op
def test_rows_that_are_not_finite_and_calls_the_op_does_not_take():
    gen = torch.Generator().manual_seed(9)
    weight = torch.randn(200, 48, generator=gen)
    hidden = torch.randn(4, 48, generator=gen)
    hidden[1, 3] = float("inf")
    hidden[2, 0] = float("nan")
    assert torch.equal(cpu_argmax.screened_argmax(hidden, weight), cpu_argmax.screened_argmax_reference(hidden, weight))
    assert not cpu_argmax.applies(hidden.bfloat16(), weight.bfloat16())
    assert not cpu_argmax.applies(hidden[0], weight)  # 1-D
    assert cpu_argmax.applies(hidden, weight)
    assert not cpu_argmax.applies(hidden.repeat(cpu_argmax.MAX_ROWS, 1)[:cpu_argmax.MAX_ROWS + 1], weight)
    bf = cpu_argmax.screened_argmax(hidden[[0, 3]].bfloat16(), weight.bfloat16())  # the reference's answer
    assert torch.equal(bf, cpu_argmax.screened_argmax_reference(hidden[[0, 3]].bfloat16(), weight.bfloat16()))
