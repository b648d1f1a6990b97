"""MKL packed GEMM for the target's float32 linear layers on the CPU, without touching the model.

Why: MKL's ordinary float32 GEMM runs a step of 4-32 rows (a tree) 2-3x slower than one row
against the same weights (measured: SmolLM2's 210 layer weights, 2 threads: 1 row 35 ms, 8 rows
93 ms, 16 rows 172 ms), although every weight is read once either way. Its packed GEMM, the path
inductor's weight freezing takes, runs 8 rows in 44 ms and 16 in 56 ms. The packed copy of a
weight is made for one row count, which is exactly what padding trees to buckets gives.

How: :class:`PackedLinear` is a ``TorchFunctionMode``: inside ``with packed:`` every
``F.linear(x, w, b)`` on a float32 CPU weight with a packed row count is answered by
``torch.ops.mkl._mkl_linear`` with a packed copy of ``w`` made on first use (one per weight and row
count: about the weight's own size). Every other call, and every call outside the block, runs as
usual. The model's modules, parameters and code are never changed.
"""
from __future__ import annotations

import weakref

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

__all__ = ["PackedLinear", "packed_gemm_available", "packer_for", "MIN_ROWS"]

MIN_ROWS = 4  # one to three rows already run at the one-row speed with the plain GEMM
_PACKERS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # model -> its PackedLinear


def packed_gemm_available() -> bool:
    """Whether this torch build has MKL's packed GEMM ops (x86 builds with MKL)."""
    return torch.backends.mkl.is_available() and hasattr(torch.ops.mkl, "_mkl_linear")


class PackedLinear(TorchFunctionMode):
    """Routes ``F.linear`` of float32 CPU weights with ``rows`` in ``row_counts`` to MKL's packed GEMM.

    Args:
        row_counts: the row counts (tokens per forward) to pack for, e.g. the tree buckets >= 4
            (one to three rows already run at the one-row speed with the plain GEMM).
    """

    def __init__(self, row_counts):
        super().__init__()
        self.row_counts = frozenset(row_counts)
        self.packed: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}  # (ptr, rows) -> (w, packed)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.linear:
            x, w = args[0], args[1]
            bias = args[2] if len(args) > 2 else kwargs.get("bias")
            rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
            if rows in self.row_counts and w.dtype == torch.float32 and w.device.type == "cpu" \
                    and x.dtype == torch.float32 and not w.requires_grad:
                key = (w.data_ptr(), rows)
                hit = self.packed.get(key)
                if hit is None or hit[0] is not w:
                    hit = self.packed[key] = (w, torch.ops.mkl._mkl_reorder_linear_weight(w, rows))
                out = torch.ops.mkl._mkl_linear(x.reshape(rows, -1), hit[1], w, bias, rows)  # (rows, N)
                return out.view(*x.shape[:-1], w.shape[0])
        return func(*args, **kwargs)


def packer_for(model, row_counts) -> PackedLinear | None:
    """The model's one :class:`PackedLinear`, extended to ``row_counts`` (those >= ``MIN_ROWS``),
    shared by every caller on that model so each weight is packed once per row count; ``None``
    when packing does not apply (weights not float32 on the CPU, no MKL, no row count >= MIN_ROWS)."""
    w = model.get_output_embeddings().weight
    rows = frozenset(r for r in row_counts if r >= MIN_ROWS)
    if not rows or w.dtype != torch.float32 or w.device.type != "cpu" or not packed_gemm_available():
        return None
    mode = _PACKERS.get(model)
    if mode is None:
        mode = _PACKERS[model] = PackedLinear(rows)
    else:
        mode.row_counts = mode.row_counts | rows
    return mode
