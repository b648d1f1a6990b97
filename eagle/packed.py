"""MKL packed GEMM for the target's float32 linear layers on the CPU, on a twin of the model.

Why: MKL's ordinary float32 GEMM runs a step of 4-32 rows (a tree) 2-3x slower than one row
against the same weights (measured: SmolLM2's 210 layer weights, 2 threads: 1 row 35 ms, 8 rows
93 ms, 16 rows 172 ms), although every weight is read once either way. Its packed GEMM, the path
inductor's weight freezing takes, runs 8 rows in 44 ms and 16 in 56 ms. The packed copy of a
weight is made for one row count, which is exactly what padding trees to buckets gives.

How: :func:`packed_twin` returns a twin of the model: a structural copy that shares every
parameter and buffer with it (no weight is copied) and runs the same transformers code, in which
each ``nn.Linear`` of the decoder is a :class:`PackedLinear`. A ``PackedLinear`` answers products
of a packed row count with ``torch.ops.mkl._mkl_linear`` and a packed copy of its weight made on
first use (one per row count: about the weight's own size), everything else with ``F.linear``.
The caller's model is never changed; callers run the twin for the steps whose row count is packed.
This is how quantization libraries swap linear layers; it costs one Python call per linear layer.
The first version intercepted every torch call of the forward (~2,300 per step) with a
``TorchFunctionMode`` instead, whose Python cost per call made a 4-16-node step 10-13% slower
(``experiments/packed_twin_ab.py``).
"""
from __future__ import annotations

import copy
import itertools
import weakref

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["PackedLinear", "packed_gemm_available", "packed_twin", "packed_row_counts", "MIN_ROWS"]

MIN_ROWS = 4  # one to three rows already run at the one-row speed with the plain GEMM
_TWINS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # model -> its packed twin


def packed_gemm_available() -> bool:
    """Whether this torch build has MKL's packed GEMM ops (x86 builds with MKL)."""
    return torch.backends.mkl.is_available() and hasattr(torch.ops.mkl, "_mkl_linear")


class PackedLinear(nn.Linear):
    """An ``nn.Linear`` that shares the weight and bias of ``linear`` and sends products of
    ``row_counts`` rows (float32, CPU, weight not trained) to MKL's packed GEMM.

    Args:
        linear: the layer it stands for (its parameters are shared, not copied).
        row_counts: the row counts (tokens per forward) to pack for, e.g. the tree buckets >= 4.
    """

    def __init__(self, linear: nn.Linear, row_counts):
        nn.Module.__init__(self)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias  # the same Parameter objects
        self.row_counts = frozenset(row_counts)
        self.packed: dict[int, torch.Tensor] = {}  # rows -> packed copy of the weight
        self._version = linear.weight._version  # an in-place update of the weight drops the copies

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight
        rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
        if rows not in self.row_counts or x.dtype != torch.float32 or w.dtype != torch.float32 \
                or w.device.type != "cpu" or w.requires_grad:
            return F.linear(x, w, self.bias)
        if w._version != self._version:  # e.g. weights loaded in place after the twin was made
            self.packed.clear()
            self._version = w._version
        p = self.packed.get(rows)
        if p is None:
            p = self.packed[rows] = torch.ops.mkl._mkl_reorder_linear_weight(w, rows)
        out = torch.ops.mkl._mkl_linear(x.reshape(rows, -1), p, w, self.bias, rows)  # (rows, N)
        return out.view(*x.shape[:-1], w.shape[0])


def packed_twin(model: nn.Module, row_counts) -> nn.Module | None:
    """The model's one packed twin (see the module docstring), its packed row counts extended to
    ``row_counts`` (those >= ``MIN_ROWS``); shared by every caller on that model, so each weight
    is packed once per row count. ``None`` when packing does not apply (weights not float32 on the
    CPU, no MKL, no row count >= MIN_ROWS). The LM head stays a plain layer: ``eagle.lmhead.project``
    multiplies by its weight (and packs it where that measures faster)."""
    w = model.get_output_embeddings().weight
    rows = frozenset(r for r in row_counts if r >= MIN_ROWS)
    if not rows or w.dtype != torch.float32 or w.device.type != "cpu" or not packed_gemm_available():
        return None
    twin = _TWINS.get(model)
    if twin is None:
        shared = {id(t): t for t in itertools.chain(model.parameters(), model.buffers())}
        twin = copy.deepcopy(model, memo=shared)  # new modules, the same parameters and buffers
        lm_head = twin.get_output_embeddings()
        for name, mod in list(twin.named_modules()):
            if type(mod) is nn.Linear and mod is not lm_head:
                parent, _, attr = name.rpartition(".")
                setattr(twin.get_submodule(parent), attr, PackedLinear(mod, rows))
        _TWINS[model] = twin
    else:
        for mod in twin.modules():
            if isinstance(mod, PackedLinear):
                mod.row_counts = mod.row_counts | rows
        impl = model.config._attn_implementation  # a Target may have switched the model's since
        if twin.config._attn_implementation != impl:
            twin.set_attn_implementation(impl)
    return twin


def packed_row_counts(twin: nn.Module | None) -> frozenset:
    """The row counts a twin packs for (empty for ``None``)."""
    if twin is None:
        return frozenset()
    return next((m.row_counts for m in twin.modules() if isinstance(m, PackedLinear)), frozenset())
