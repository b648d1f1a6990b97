"""The LM-head product ``hidden (T, H) @ weight (V, H).T`` on the CPU, the fastest way measured here.

For float32 the same product runs at very different speeds depending on how it is asked of MKL,
and which way wins depends on the row count and the machine (docs/cpu-backend.md,
lmhead-project). The candidates:

* ``plain``: ``F.linear(hidden, weight)``;
* ``transposed``: ``(weight @ hidden.T).T`` made row-major again (a reduction along V over the
  column-major view is slower than the copy and the reduction together);
* ``packed``: MKL's packed GEMM with a copy of the weight packed for that row count (about the
  weight's size in memory; tried from ``MIN_ROWS`` rows, weights that are not being trained);
* ``stream``: the small-row AVX-512 / AVX2 kernel (``kernels/cpu_gemm.py``), where this machine
  has it (docs/cpu-backend.md, small-row-gemm);
* ``onednn`` (bfloat16 weights): oneDNN's GEMM with a copy of the weight packed once (one copy for
  every row count), where ``F.linear`` re-lays the weight out on every call (``eagle.backends.cpu.packed``).

The first product per (row count, weight) in a process times the candidates (interleaved, after a
warm-up) and keeps the fastest; a packed copy is kept only when it won, and is dropped with its
weight. float16 and other devices always take ``F.linear``; one float32 row chooses between
``plain`` and ``stream``.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from eagle_kernels import cpu_gemm
from eagle_kernels.onednn import onednn_available, onednn_linear, onednn_pack, packed_gemm_available
from eagle_kernels.timing import timed_pass
from eagle_kernels.weightmemo import WeightMemo

from .packed import MIN_ROWS

__all__ = ["project"]


def _project_plain(hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.linear(hidden, weight)  # (T, V)


def _project_transposed(hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return (weight @ hidden.T).T.contiguous()  # (T, V), made row-major again


@dataclass
class _Choice:
    way: str  # "plain" | "transposed" | "packed" | "stream" | "onednn"
    packed: torch.Tensor | None = None  # the packed copy, when "packed" (MKL) or "onednn" won


# (weight, rows) -> the way measured fastest for that product (measured again after an in-place
# update of the weight, which would leave a packed copy stale; dropped with the weight)
_CHOICE = WeightMemo()


def _candidates(rows: int, hidden: torch.Tensor, weight: torch.Tensor) -> tuple[dict, torch.Tensor | None]:
    """The ways to try for ``rows`` rows, and the packed copy of the weight if packing is one."""
    ways = {"plain": _project_plain}
    if rows > 1:
        ways["transposed"] = _project_transposed
    if cpu_gemm.supports(hidden, weight):
        ways["stream"] = cpu_gemm.small_linear
    packed = None
    if weight.dtype == torch.bfloat16:  # F.linear or oneDNN on a packed copy
        if not weight.requires_grad and onednn_available():
            packed = onednn_pack(weight)
            ways["onednn"] = lambda h, w: onednn_linear(h, packed)
        return ways, packed
    if rows >= MIN_ROWS and not weight.requires_grad and packed_gemm_available():
        packed = torch.ops.mkl._mkl_reorder_linear_weight(weight, rows)
        ways["packed"] = lambda h, w: torch.ops.mkl._mkl_linear(h, packed, w, None, rows)
    return ways, packed


def _measure(hidden: torch.Tensor, weight: torch.Tensor, ways: dict, repeats: int = 3) -> str:
    """The name of the fastest way (best of ``repeats`` interleaved calls after one warm-up each)."""
    secs = dict(zip(ways, timed_pass([lambda fn=fn: fn(hidden, weight) for fn in ways.values()], repeats)))
    return min(secs, key=secs.get)  # the first listed on a tie


def project(hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``hidden (T, H) @ weight (V, H).T -> (T, V)``, row-major, by the way measured fastest for
    this row count and weight (see the module docstring)."""
    rows = hidden.shape[0] if hidden.dim() == 2 else 1
    if weight.dtype not in (torch.float32, torch.bfloat16) or weight.device.type != "cpu" or hidden.dim() != 2:
        return _project_plain(hidden, weight)
    hidden = hidden.contiguous()
    choice = _CHOICE.get(weight, (rows,))
    if choice is None:
        ways, packed = _candidates(rows, hidden, weight)
        way = _measure(hidden, weight, ways) if len(ways) > 1 else "plain"  # one way: nothing to time
        choice = _CHOICE.put(weight, _Choice(way, packed if way in ("packed", "onednn") else None), (rows,))
    if choice.way == "onednn":
        return onednn_linear(hidden, choice.packed)
    if choice.way == "packed":
        return torch.ops.mkl._mkl_linear(hidden, choice.packed, weight, None, rows)
    if choice.way == "stream":
        return cpu_gemm.small_linear(hidden, weight)
    return _project_transposed(hidden, weight) if choice.way == "transposed" else _project_plain(hidden, weight)
