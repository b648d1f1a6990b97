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

Whether packing pays depends on the machine: on an Intel Xeon (2 threads) it made all 210 products
of 4-64 rows 1.2-3.1x faster, on an AMD EPYC (Zen 4, 2 threads) 6-22% slower
(``python experiments/packed_gemm.py``). So :func:`packing_pays` measures it, once per process and
row count, on the model's own weights, and callers pack only the row counts that won.
This is how quantization libraries swap linear layers; it costs one Python call per linear layer.
The first version intercepted every torch call of the forward (~2,300 per step) with a
``TorchFunctionMode`` instead, whose Python cost per call made a 4-16-node step 10-13% slower
(``experiments/packed_twin_ab.py``).
"""
from __future__ import annotations

import copy
import itertools
import time
import weakref

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["PackedLinear", "packed_gemm_available", "packed_twin", "packed_row_counts", "packing_pays",
           "packing_measurements", "MIN_ROWS"]

MIN_ROWS = 4  # one to three rows already run at the one-row speed with the plain GEMM
_TWINS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # model -> its packed twin
# packing_pays: the products it times stream this many MB of the model's weights (well past the
# caches, as in a real step), and packing must win by this fraction to be chosen
MEASURE_MB = 64
MARGIN = 0.03
_MEASURED: dict[tuple, dict] = {}  # (rows, weight shapes) -> {"plain_ms", "packed_ms", "packed"}
# "measure" (default) | "always" | "never": what packing_pays decides; the test suite sets "always"
# so that which GEMM runs does not depend on timings
DECIDE = "measure"


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


def _decoder_linears(model: nn.Module) -> list[nn.Linear]:
    lm_head = model.get_output_embeddings()
    return [m for m in model.modules() if type(m) is nn.Linear and m is not lm_head]


def _timed_pass(fns, repeats: int) -> list[float]:
    """Best-of-``repeats`` seconds of each zero-argument ``fn`` (interleaved, after one warm-up each)."""
    best = [float("inf")] * len(fns)
    for fn in fns:
        fn()
    for _ in range(repeats):
        for i, fn in enumerate(fns):
            t0 = time.perf_counter()
            fn()
            best[i] = min(best[i], time.perf_counter() - t0)
    return best


def packing_pays(model: nn.Module, row_counts, repeats: int = 3) -> frozenset:
    """The row counts (of ``row_counts``, >= ``MIN_ROWS``) for which MKL's packed GEMM beats the plain
    GEMM on this machine by at least ``MARGIN``: for each, the products of the first ``MEASURE_MB``
    of the model's decoder weights are timed both ways (interleaved, best of ``repeats``; packed
    copies made for the measurement are freed). Measured once per process per row count and
    weight shapes (``packing_measurements()`` has the figures); empty without measuring when
    packing cannot apply (weights not float32 on the CPU, no MKL)."""
    w = model.get_output_embeddings().weight
    rows = sorted(r for r in set(row_counts) if r >= MIN_ROWS)
    if not rows or w.dtype != torch.float32 or w.device.type != "cpu" or not packed_gemm_available() \
            or DECIDE == "never":
        return frozenset()
    if DECIDE == "always":
        return frozenset(rows)
    linears = [m for m in _decoder_linears(model) if not m.weight.requires_grad]
    sample, total = [], 0
    for m in linears:  # the first MEASURE_MB of weights (at least one)
        if sample and total + m.weight.numel() * 4 > MEASURE_MB * 1e6:
            break
        sample.append(m)
        total += m.weight.numel() * 4
    shapes = tuple(tuple(m.weight.shape) for m in sample)
    won = set()
    for r in rows:
        key = (r, shapes)
        if key not in _MEASURED:
            xs = {m.in_features: torch.randn(r, m.in_features) for m in sample}
            packed = [torch.ops.mkl._mkl_reorder_linear_weight(m.weight, r) for m in sample]

            def plain():
                for m in sample:
                    F.linear(xs[m.in_features], m.weight, m.bias)

            def mkl():
                for m, p in zip(sample, packed):
                    torch.ops.mkl._mkl_linear(xs[m.in_features], p, m.weight, m.bias, r)

            t_plain, t_packed = _timed_pass([plain, mkl], repeats)
            del packed
            _MEASURED[key] = {"rows": r, "mb": round(total / 1e6, 1), "plain_ms": round(t_plain * 1e3, 2),
                              "packed_ms": round(t_packed * 1e3, 2), "packed": t_packed < (1 - MARGIN) * t_plain}
        if _MEASURED[key]["packed"]:
            won.add(r)
    return frozenset(won)


def packing_measurements() -> list[dict]:
    """What :func:`packing_pays` measured in this process: per row count, the ms of both ways over
    the sampled weights and whether packing was chosen."""
    return [dict(v) for v in _MEASURED.values()]
