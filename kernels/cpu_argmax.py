"""The exact argmax of a float32 LM head through a bfloat16 screen on the CPU (``cpu_argmax.cpp``,
built into the extension of ``cpu_gemm.cpp``): what a greedy decoding or verification step needs
of the head, reading half its bytes.

Greedy steps use only each row's argmax. The op multiplies the rows by a bfloat16 copy of the head
(the small-row kernel, float32 arithmetic), bounds each screened logit's error (the weights'
rounding, ``2^-8 |w|`` each, and the float32 sum's; Cauchy-Schwarz over the row norms), keeps the
tokens whose bound reaches the best lower bound (1.9 of SmolLM2's 49,152 on average) and recomputes
those in double precision from the float32 head. The result is the argmax of the exact logits
(lowest index on a tie), which a float32 ``F.linear`` also gives unless two logits lie within its
own rounding of each other.

As for the other kernels:

* :func:`screened_argmax`: the fast path (falls back to the reference where it does not apply);
  :func:`applies` says whether it takes a call; the bfloat16 copy and the row norms are made on
  first use and kept while the head lives (56 MB for SmolLM2);
* :func:`screened_argmax_reference`: the logits in float64, then argmax: the obviously-correct version;
* :func:`available`: whether the extension built on this machine (``cpu_gemm.available``).
"""
from __future__ import annotations

import threading

import torch

from eagle.weightmemo import WeightMemo

from . import cpu_gemm

__all__ = ["MAX_ROWS", "applies", "available", "screened_argmax", "screened_argmax_reference"]

# rows up to which the screen pays: its products run on the small-row kernel (float32 arithmetic on
# the widened bf16 copy), which from ~64 rows is bound by arithmetic, not by the bytes it saves
# (SmolLM2, compiled steps, Intel Xeon with AMX: 0.93x the step's time at 1 row, 0.96x at 16,
# 0.98x at 32, 1.01x at 64; `experiments/compiled_step_ab.py --what head`)
MAX_ROWS = 32

_OP = None  # torch.ops.<extension name>.screened_argmax
_COPIES = WeightMemo()  # head -> (its bfloat16 packed copy, its row norms in float64)
_LOCK = threading.Lock()


def _op():
    global _OP
    if _OP is None:
        _OP = cpu_gemm.extension_op("screened_argmax")
    return _OP


def available() -> bool:
    """Whether the op runs on this machine (the CPU extension built)."""
    return _op() is not None


def applies(hidden: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether :func:`screened_argmax` takes these tensors: float32 CPU ``hidden (T, K)`` with at
    most :data:`MAX_ROWS` rows and ``weight (V, K)``, no autograd, the extension available."""
    return (hidden.dim() == 2 and weight.dim() == 2 and hidden.shape[1] == weight.shape[1]
            and hidden.shape[0] <= MAX_ROWS
            and hidden.dtype == torch.float32 and weight.dtype == torch.float32 and hidden.is_cpu and weight.is_cpu
            and not (torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad))
            and _op() is not None)


def _copies(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    copies = _COPIES.get(weight)
    if copies is None:
        with _LOCK, torch.no_grad():
            w = weight.detach()
            copies = _COPIES.put(weight, (cpu_gemm._load().pack(w.to(torch.bfloat16)),  # (blocks, K, 16)
                                          w.double().norm(dim=1)))  # (V,)
    return copies


def screened_argmax(hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``argmax_j hidden[t] . weight[j]`` for every row -> ``(T,)`` int64: the argmax of the exact
    logits ``hidden (T, K) @ weight (V, K).T`` (module docstring). Falls back to
    :func:`screened_argmax_reference` where :func:`applies` is false, and for rows that are not
    finite."""
    if not applies(hidden, weight):
        return screened_argmax_reference(hidden, weight)
    packed, norms = _copies(weight)
    best = _op()(hidden, packed, weight, norms)  # (T,); -1: a row whose screen is not finite
    bad = best < 0
    if bool(bad.any()):
        best[bad] = screened_argmax_reference(hidden[bad], weight)
    return best


def screened_argmax_reference(hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """The logits ``hidden @ weight.T`` in float64, then their argmax -> ``(T,)`` int64."""
    return (hidden.double() @ weight.double().T).argmax(dim=-1)
