"""The packed twin: the target's linear layers on the CPU, each row count run the fastest way
measured here. Float32 products take ``F.linear``, MKL's packed GEMM or the small-row AVX-512 /
AVX2 kernel of ``kernels/cpu_gemm.py``; bfloat16 products take ``F.linear``, oneDNN's GEMM on a
packed copy of each weight (``F.linear`` in bf16 re-lays every weight out on every call) or that
kernel's bf16 form.

Why: MKL's ordinary float32 GEMM runs a tree step of 4-32 rows several times slower than one row,
although every weight is read once either way; its packed GEMM (the path inductor's weight freezing
takes) does not, and a packed copy serves one row count, which is what padding trees to buckets
gives (docs/cpu-backend.md, linear-ways).

How: :func:`packed_twin` returns a twin of the model: a structural copy that shares every
parameter and buffer with it (no weight is copied) and runs the same transformers code, in which
each ``nn.Linear`` of the decoder is a :class:`PackedLinear`. A ``PackedLinear`` answers products
of a packed row count with ``torch.ops.mkl._mkl_linear`` and a packed copy of its weight made on
first use (one per row count: about the weight's own size), everything else with ``F.linear``.
The caller's model is never changed; callers run the twin for the steps whose row count is packed.

Which way wins depends on the machine, so :func:`linear_ways` times every available way on the
model's own weights, once per process and row count, and keeps the fastest; a twin's layer runs
each row count its own way (docs/cpu-backend.md, linear-ways, small-row-gemm, gemm-bf16-form).
Swapping the layers costs one Python call per linear layer, where routing every torch call of the
forward through a ``TorchFunctionMode`` costs more (docs/cpu-backend.md, packed-twin).
"""
from __future__ import annotations

import weakref

import torch
import torch.nn.functional as F
from torch import nn

from eagle_kernels import cpu_gemm
from eagle_kernels.onednn import onednn_available, onednn_linear, onednn_pack, packed_gemm_available
from eagle_kernels.timing import MARGIN, timed_pass

from ...attention import sharing_copy

__all__ = ["PackedLinear", "LINEAR_WAYS", "packed_twin", "packed_row_counts", "stream_row_counts", "onednn_row_counts",
           "packing_pays", "linear_ways", "packing_measurements", "streaming_copy", "MIN_ROWS"]

MIN_ROWS = 4  # one to three rows already run at the one-row speed with the plain GEMM
_TWINS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # model -> {key: its packed twin}
# packing_pays: the products it times stream this many MB of the model's weights (well past the
# caches, as in a real step), and packing must win by this fraction to be chosen
MEASURE_MB = 64
_MEASURED: dict[tuple, dict] = {}  # (rows, weight shapes, dtype) -> {"plain_ms", "packed_ms", "stream_ms", "onednn_ms", "way"}
# how the twin's products are chosen (the CPU backend's ``linear`` option): "measure" (the fastest
# here, timed at start-up) | "always" (MKL packed for every row count >= MIN_ROWS; oneDNN for
# bfloat16) | "stream" (the small-row kernel for every row count, where it is available) | "never" (plain)
LINEAR_WAYS = ("measure", "always", "stream", "never")


class PackedLinear(nn.Linear):
    """An ``nn.Linear`` that shares the weight and bias of ``linear`` and sends products of
    ``row_counts`` rows (float32, CPU, weight not trained) to MKL's packed GEMM, products of
    ``stream_rows`` rows to the small-row kernel (``kernels/cpu_gemm.py``), and products of
    ``onednn_rows`` rows (bfloat16) to oneDNN's GEMM with a packed copy of the weight.

    Args:
        linear: the layer it stands for (its parameters are shared, not copied).
        row_counts: the row counts (tokens per forward) to pack for, e.g. the tree buckets >= 4.
        stream_rows: the row counts to run through the small-row kernel (takes precedence).
        stream_upto: also every row count from 1 to this one through the kernel (0: none), for
            modules whose row counts vary (a draft head's levels).
        onednn_rows: the row counts whose bfloat16 products take oneDNN's packed GEMM (one packed
            copy serves them all, so a row's result does not depend on the row count).
    """

    def __init__(self, linear: nn.Linear, row_counts, stream_rows=(), stream_upto: int = 0, onednn_rows=()):
        nn.Module.__init__(self)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias  # the same Parameter objects
        self.row_counts = frozenset(row_counts)
        self.stream_rows = frozenset(stream_rows)
        self.stream_upto = stream_upto
        self.onednn_rows = frozenset(onednn_rows)
        # rows -> MKL's packed copy of the weight; "onednn" -> oneDNN's (bfloat16)
        self.packed: dict[int | str, torch.Tensor] = {}
        self._version = linear.weight._version  # an in-place update of the weight drops the copies
        # for compiled graphs (see hold_copies): the small-row kernel's packed copy, and the slot of
        # oneDNN's copy in the extension's table of held weights
        self.register_buffer("kernel_packed", None, persistent=False)
        self.register_buffer("onednn_slot", None, persistent=False)
        self._held = None  # the cpu_gemm.HeldWeight behind onednn_slot
        self._held_mkl: dict[int, object] = {}  # rows -> the cpu_gemm.HeldWeight of MKL's copy for them

    def hold_copies(self) -> None:
        """Keep what a compiled graph needs as buffers, so that it takes them as inputs and calls
        the extension's dispatcher ops directly: the small-row kernel's packed copy of a float32
        weight (``cpu_gemm.packed_op``), or the table slot of oneDNN's packed copy of a bfloat16
        weight (``cpu_gemm.held_op``; the copy itself is an MKLDNN tensor, which a graph cannot
        take); MKL's copies: :meth:`hold_mkl_copy`, per row count. Made when the graphs are (a later
        in-place update of the weight is not seen by them); eager calls keep looking the copies up."""
        if not self.weight.is_cpu or not cpu_gemm.available():
            return
        if self.weight.dtype in (torch.float32, torch.bfloat16) and (self.stream_rows or self.stream_upto):
            self.kernel_packed = cpu_gemm.packed_weight(self.weight)
        if self.onednn_rows and self.weight.dtype == torch.bfloat16:
            self._held = cpu_gemm.HeldWeight(self._onednn_copy())
            self.onednn_slot = self._held.slot

    def hold_mkl_copy(self, rows: int) -> None:
        """Keep the slot of MKL's packed copy of this float32 weight for ``rows`` rows (made now if
        missing; an opaque tensor a graph cannot take) as buffer ``mkl_slot_<rows>``, for compiled
        graphs' ``cpu_gemm.held_mkl_op``. Only for a row count it packs for, once per row count:
        each copy is as large as the weight, so only the buckets that compile get one."""
        if rows not in self.row_counts or rows in self._held_mkl or self.weight.dtype != torch.float32 \
                or self.weight.requires_grad or not self.weight.is_cpu or not cpu_gemm.available():
            return
        copies = self._copies()
        if rows not in copies:
            copies[rows] = torch.ops.mkl._mkl_reorder_linear_weight(self.weight, rows)
        self._held_mkl[rows] = cpu_gemm.HeldWeight(copies[rows])
        self.register_buffer(f"mkl_slot_{rows}", self._held_mkl[rows].slot, persistent=False)

    def _copies(self) -> dict:
        """``packed``, emptied first if the weight was updated in place since its copies were made
        (e.g. weights loaded after the twin was)."""
        if self.weight._version != self._version:
            self.packed.clear()
            self._version = self.weight._version
        return self.packed

    def _onednn_copy(self) -> torch.Tensor:
        copies = self._copies()
        if "onednn" not in copies:
            copies["onednn"] = onednn_pack(self.weight)
        return copies["onednn"]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight
        rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
        if rows in self.stream_rows or 0 < rows <= self.stream_upto:
            if self.kernel_packed is not None and torch.compiler.is_compiling() and x.dtype == w.dtype:
                return cpu_gemm.packed_op(x, self.kernel_packed, self.out_features, self.bias)
            return cpu_gemm.small_linear(x, w, self.bias)  # F.linear where the kernel does not apply
        if rows in self.onednn_rows and x.dtype == torch.bfloat16 and w.dtype == torch.bfloat16 \
                and not w.requires_grad:
            if torch.compiler.is_compiling():
                if self.onednn_slot is None:  # no held copy: a graph cannot make one
                    return F.linear(x, w, self.bias)
                return cpu_gemm.held_op(x, self.onednn_slot, self.out_features, self.bias)
            out = onednn_linear(x.reshape(rows, -1), self._onednn_copy(), self.bias)  # (rows, N)
            return out.view(*x.shape[:-1], self.out_features)
        if rows not in self.row_counts or x.dtype != torch.float32 or w.dtype != torch.float32 \
                or w.device.type != "cpu" or w.requires_grad:
            return F.linear(x, w, self.bias)
        if torch.compiler.is_compiling():
            slot = getattr(self, f"mkl_slot_{rows}", None)
            if slot is None:  # no held copy: a graph cannot make one
                return F.linear(x, w, self.bias)
            return cpu_gemm.held_mkl_op(x, slot, w, self.bias)
        copies = self._copies()
        p = copies.get(rows)
        if p is None:
            p = copies[rows] = torch.ops.mkl._mkl_reorder_linear_weight(w, rows)
        out = torch.ops.mkl._mkl_linear(x.reshape(rows, -1), p, w, self.bias, rows)  # (rows, N)
        return out.view(*x.shape[:-1], w.shape[0])


def packed_twin(model: nn.Module, row_counts, stream_rows=(), onednn_rows=(), key=None) -> nn.Module | None:
    """The model's one packed twin (see the module docstring), its packed row counts extended to
    ``row_counts`` (those >= ``MIN_ROWS``), its small-row-kernel row counts to ``stream_rows`` and,
    for a bfloat16 model, its oneDNN row counts to ``onednn_rows``; shared by every caller on that
    model, so each weight is packed once per row count. ``None`` when none applies (weights not on
    the CPU; float32 without MKL or a row count >= MIN_ROWS to pack, and without the kernel or a
    stream row count; bfloat16 without oneDNN's bf16 GEMM or an onednn row count; other
    precisions). The LM head stays a plain layer: ``eagle.backends.cpu.lmhead.project`` multiplies by its weight
    the way measured fastest for it (docs/cpu-backend.md, lmhead-project).
    ``key``: callers whose ways are chosen alike (the CPU backend's ``linear`` setting) share one
    twin per model and key, so one backend's choice never changes another's twin."""
    w = model.get_output_embeddings().weight
    if w.device.type != "cpu" or w.dtype not in (torch.float32, torch.bfloat16):
        return None
    rows = onednn = frozenset()
    stream = frozenset(r for r in stream_rows if r >= 1) if cpu_gemm.available() else frozenset()
    if w.dtype == torch.float32:
        rows = frozenset(r for r in row_counts if r >= MIN_ROWS) if packed_gemm_available() else frozenset()
        rows = rows - stream
    elif onednn_available():
        onednn = frozenset(r for r in onednn_rows if r >= 1) - stream
    if not rows and not stream and not onednn:
        return None
    twin = _TWINS.setdefault(model, {}).get(key)
    if twin is None:
        lm_head = model.get_output_embeddings()
        twin = sharing_copy(model, lambda mod: PackedLinear(mod, rows, stream, onednn_rows=onednn), skip=lm_head)
        _TWINS[model][key] = twin
    else:
        for mod in twin.modules():
            if isinstance(mod, PackedLinear):
                mod.stream_rows = mod.stream_rows | stream
                mod.row_counts = (mod.row_counts | rows) - mod.stream_rows
                mod.onednn_rows = (mod.onednn_rows | onednn) - mod.stream_rows
        impl = model.config._attn_implementation  # a Target may have switched the model's since
        if twin.config._attn_implementation != impl:
            twin.set_attn_implementation(impl)
    return twin


def streaming_copy(module: nn.Module, rows: int, upto: int = 64, repeats: int = 5,
                   decide: str = "measure") -> nn.Module | None:
    """A structural copy of a small float32 or bfloat16 CPU module (a draft head) that shares its parameters and
    sends products of 1..``upto`` rows of every ``nn.Linear`` to the small-row kernel, or ``None``
    when the kernel is unavailable or does not beat ``F.linear`` by ``MARGIN`` on the module's own
    linear layers at ``rows`` rows (timed here, best of ``repeats``; ``decide`` (:data:`LINEAR_WAYS`)
    "stream" / "never" / "always" decide without timing: always = no copy, as MKL packing is not used for small modules)."""
    linears = [m for m in module.modules() if type(m) is nn.Linear]
    if not linears or not cpu_gemm.available() or decide in ("never", "always") \
            or any(m.weight.dtype not in (torch.float32, torch.bfloat16) or m.weight.device.type != "cpu"
                   or m.weight.dtype != linears[0].weight.dtype for m in linears):
        return None
    if decide != "stream":
        xs = {m.in_features: torch.randn(rows, m.in_features, dtype=m.weight.dtype) for m in linears}
        with torch.no_grad():
            t_plain, t_stream = timed_pass([lambda: [F.linear(xs[m.in_features], m.weight, m.bias) for m in linears],
                                             lambda: [cpu_gemm.small_linear(xs[m.in_features], m.weight, m.bias)
                                                      for m in linears]], repeats)
        if t_stream >= (1 - MARGIN) * t_plain:
            return None
    return sharing_copy(module, lambda mod: PackedLinear(mod, (), stream_upto=upto))


def packed_row_counts(twin: nn.Module | None) -> frozenset:
    """The row counts a twin packs for with MKL (empty for ``None``)."""
    if twin is None:
        return frozenset()
    return next((m.row_counts for m in twin.modules() if isinstance(m, PackedLinear)), frozenset())


def stream_row_counts(twin: nn.Module | None) -> frozenset:
    """The row counts a twin runs through the small-row kernel (empty for ``None``)."""
    if twin is None:
        return frozenset()
    return next((m.stream_rows for m in twin.modules() if isinstance(m, PackedLinear)), frozenset())


def onednn_row_counts(twin: nn.Module | None) -> frozenset:
    """The row counts a twin runs through oneDNN's packed bfloat16 GEMM (empty for ``None``)."""
    if twin is None:
        return frozenset()
    return next((m.onednn_rows for m in twin.modules() if isinstance(m, PackedLinear)), frozenset())


def _decoder_linears(model: nn.Module) -> list[nn.Linear]:
    lm_head = model.get_output_embeddings()
    return [m for m in model.modules() if type(m) is nn.Linear and m is not lm_head]


def linear_ways(model: nn.Module, row_counts, repeats: int = 3, decide: str = "measure") -> dict[int, str]:
    """For each of ``row_counts``, the fastest way on this machine to multiply that many rows by the
    model's decoder weights. Float32: ``"plain"`` (``F.linear``), ``"packed"`` (MKL's packed GEMM,
    from ``MIN_ROWS`` rows) or ``"stream"`` (the small-row kernel); bfloat16: ``"plain"`` or
    ``"onednn"`` (oneDNN's GEMM with a packed copy of each weight, which ``F.linear`` re-lays out
    on every call). The products of the first ``MEASURE_MB`` of the weights are timed every
    available way (interleaved, best of ``repeats``); a way other than plain must win by
    ``MARGIN``. Measured once per process per row count, weight shapes and precision
    (``packing_measurements()`` has the figures); all plain, without measuring, where none applies
    (weights not on the CPU, other precisions, no MKL / kernel / oneDNN). ``decide`` (:data:`LINEAR_WAYS`)
    other than "measure" overrides the measurement ("always" takes oneDNN for every bfloat16 row count)."""
    if decide not in LINEAR_WAYS:
        raise ValueError(f"linear way must be one of {LINEAR_WAYS}, got '{decide}'")
    w = model.get_output_embeddings().weight
    rows = sorted(set(int(r) for r in row_counts if r >= 1))
    plain = {r: "plain" for r in rows}
    fp32, bf16 = w.dtype == torch.float32, w.dtype == torch.bfloat16
    mkl, stream = fp32 and packed_gemm_available(), (fp32 or bf16) and cpu_gemm.available()
    onednn = bf16 and onednn_available()
    if not rows or w.device.type != "cpu" or not (mkl or stream or onednn) or decide == "never":
        return plain
    if decide == "always":
        return {r: "onednn" if onednn else "packed" if mkl and r >= MIN_ROWS else "plain" for r in rows}
    if decide == "stream":
        return {r: "stream" if stream else "plain" for r in rows}
    linears = [m for m in _decoder_linears(model) if not m.weight.requires_grad]
    sample, total = [], 0
    for m in linears:  # the first MEASURE_MB of weights (at least one)
        size = m.weight.numel() * m.weight.element_size()
        if sample and total + size > MEASURE_MB * 1e6:
            break
        sample.append(m)
        total += size
    shapes = tuple(tuple(m.weight.shape) for m in sample)
    onednn_copies = None  # oneDNN's packed copies of the sample (one per weight for every row count)
    ways = {}
    for r in rows:
        if not (stream or onednn) and r < MIN_ROWS:  # plain is the only way: nothing to measure
            ways[r] = "plain"
            continue
        key = (r, shapes, w.dtype)
        if key not in _MEASURED:
            xs = {m.in_features: torch.randn(r, m.in_features, dtype=w.dtype) for m in sample}
            fns = {}

            def plain_fn():
                for m in sample:
                    F.linear(xs[m.in_features], m.weight, m.bias)

            fns["plain"] = plain_fn
            packed = None
            if mkl and r >= MIN_ROWS:
                packed = [torch.ops.mkl._mkl_reorder_linear_weight(m.weight, r) for m in sample]

                def mkl_fn():
                    for m, p in zip(sample, packed):
                        torch.ops.mkl._mkl_linear(xs[m.in_features], p, m.weight, m.bias, r)

                fns["packed"] = mkl_fn
            if stream:
                def stream_fn():
                    for m in sample:
                        cpu_gemm.small_linear(xs[m.in_features], m.weight, m.bias)

                fns["stream"] = stream_fn
            if onednn:
                if onednn_copies is None:
                    onednn_copies = [onednn_pack(m.weight) for m in sample]

                def onednn_fn():
                    for m, p in zip(sample, onednn_copies):
                        onednn_linear(xs[m.in_features], p, m.bias)

                fns["onednn"] = onednn_fn
            with torch.no_grad():
                secs = dict(zip(fns, timed_pass(list(fns.values()), repeats)))
            del packed
            best = min(secs, key=secs.get)
            if best != "plain" and secs[best] >= (1 - MARGIN) * secs["plain"]:
                best = "plain"
            rec = {"rows": r, "dtype": str(w.dtype).removeprefix("torch."), "mb": round(total / 1e6, 1),
                   "way": best, "packed": best == "packed"}
            rec.update({f"{k}_ms": round(v * 1e3, 2) for k, v in secs.items()})
            _MEASURED[key] = rec
        ways[r] = _MEASURED[key]["way"]
    return ways


def packing_pays(model: nn.Module, row_counts, repeats: int = 3, decide: str = "measure") -> frozenset:
    """The row counts (of ``row_counts``) for which :func:`linear_ways` chose MKL's packed GEMM."""
    return frozenset(r for r, way in linear_ways(model, row_counts, repeats, decide).items() if way == "packed")


def packing_measurements() -> list[dict]:
    """What :func:`linear_ways` measured in this process: per row count (and ``dtype``), the ms of
    each way tried over the sampled weights (``plain_ms``, ``packed_ms``, ``stream_ms``,
    ``onednn_ms``) and the ``way`` chosen."""
    return [dict(v) for v in _MEASURED.values()]
