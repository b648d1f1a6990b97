"""The CPU backend: everything CPU-specific a target forward, a draft head or featurization uses.

* a packed *twin* of the model (``packed.py``): per bucket the fastest GEMM for the decoder's
  linear layers (``F.linear``, MKL's packed GEMM or the small-row kernel for float32; oneDNN on
  packed copies or the kernel for bfloat16), measured once per process at start-up;
* compiled steps as one graph whose decoder layers are one compiled region each (``regions.py``),
  with inductor's size/alignment asserts and most of dynamo's guard checks off after a step's
  first call;
* the LM head product the fastest way measured (``lmhead.py``), and the greedy argmax through a
  bfloat16 screen (kernels/cpu_argmax.py);
* small masked attention calls through the CPU extension (``attention.py``).

Every choice above is this object's state: ``linear`` and ``argmax`` name a way instead of
measuring (tests; A/Bs), ``step_backend`` the ``torch.compile`` backend of compiled steps. The
defaults of ``linear`` / ``argmax`` may also be set with ``EAGLE_CPU_LINEAR`` / ``EAGLE_CPU_ARGMAX``.
Why each default is what it is: docs/cpu-backend.md.
"""
from __future__ import annotations

import contextlib
import os
import platform

import torch
from torch import nn

from eagle_kernels import cpu_argmax, cpu_gemm
from eagle_kernels.cpuinfo import last_level_cache_bytes
from eagle_kernels.timing import MARGIN, timed_pass

from ..base import Backend, use_inductor_cache
from .attention import register_cpu_sdpa
from .lmhead import project
from .packed import (LINEAR_WAYS, PackedLinear, linear_ways, onednn_row_counts, packed_row_counts, packed_twin,
                     stream_row_counts, streaming_copy)
from .regions import regional_copy

__all__ = ["CpuBackend", "BACKEND"]

_INT8_MM = getattr(torch.ops.aten, "_weight_int8pack_mm", None)  # (T, K) bf16 x (N, K) int8, (N,) scales


def _int8_kernel_takes(inner: int) -> bool:
    """Whether torch's int8 kernel computes products of inner size ``inner`` right: a multiple of 16
    (others crash or return wrong sums in torch 2.13)."""
    return _INT8_MM is not None and inner > 0 and inner % 16 == 0


_LEVELS_TIMED = 4  # draft_dtype: the products of a catch-up and three tree levels per timed pass
_RECOMPILE_LIMIT = 256  # graphs of the compiled step's code (one per bucket, layer set and cache capacity)
# inductor's options for compiled steps: no size, alignment or scalar checks in the graph's Python
# wrapper (~10 calls per layer region, 30 regions a step; the extension's ops return what their
# registered shapes say, which the tests compare with eager steps)
_STEP_OPTIONS = {"size_asserts": False, "alignment_asserts": False, "scalar_asserts": False}
# the decoder layers' index attribute, traced as a symbolic integer (a graph input) rather than a
# constant, so that every layer of a compiled step runs one traced and compiled region (regions.py)
_LAYER_INDEX_SOURCES = r".*\.layer_idx$"


def _warm_key(cache, tokens: torch.Tensor, kernel: dict) -> tuple:
    """What one compiled step's (one bucket's and layer set's) graph depends on beyond tensor
    values: the cache's capacity and precision, the token device, grad mode and the kernel
    arguments given. A step whose key was run once with every guard evaluated has the graph it
    needs compiled and in dynamo's cache (see _guards_of)."""
    kv = getattr(cache, "keys", None)
    return (cache.capacity, None if kv is None else (kv.dtype, kv.device), tokens.device,
            torch.is_grad_enabled(), tuple(sorted(kernel)))


def _guards_of(warm: bool):
    """Dynamo's guards for one compiled step: all of them the first time a step of its
    :func:`_warm_key` runs, which compiles what is missing; after that only the guards that tell
    dynamo's cached step graphs apart (``skip_guard_eval_unsafe``: every parameter of 30 layers
    is a guard otherwise). Unsafe only where an input changes in a way no cached graph was
    compiled for; the warm key covers each such change, so that first call evaluates every guard."""
    return torch.compiler.set_stance("default", skip_guard_eval_unsafe=True) if warm else contextlib.nullcontext()


class CpuBackend(Backend):
    """See the module docstring. ``linear``: one of ``LINEAR_WAYS`` (``measure`` times the ways at
    start-up); ``argmax``: one of ``cpu_argmax.WAYS``; ``step_backend``: the ``torch.compile``
    backend of compiled steps (``inductor``; ``eager`` or a callable: dynamo's side only, no C++
    builds, for tests)."""

    name = "cpu"

    def __init__(self, device="cpu", linear: str | None = None, argmax: str | None = None,
                 step_backend="inductor"):
        super().__init__(device)
        self.linear = linear or os.environ.get("EAGLE_CPU_LINEAR", "measure")
        self.argmax = argmax or os.environ.get("EAGLE_CPU_ARGMAX", "measure")
        if self.linear not in LINEAR_WAYS:
            raise ValueError(f"CPU backend linear way must be one of {LINEAR_WAYS}, got '{self.linear}'")
        if self.argmax not in cpu_argmax.WAYS:
            raise ValueError(f"CPU backend argmax way must be one of {cpu_argmax.WAYS}, got '{self.argmax}'")
        self.step_backend = step_backend
        self.twin = None  # the model's packed twin, where a bucket runs faster on it
        self.packed_rows = self.stream_rows = self.onednn_rows = self.twin_rows = frozenset()
        self._regional: dict = {}  # id(decoder) -> its copy whose layers are compile regions

    @classmethod
    def usable(cls, device) -> str | None:
        if torch.device(device).type != "cpu":
            return f"the model is on '{torch.device(device).type}', not the CPU"
        return None

    @classmethod
    def preferred(cls, device) -> bool:
        """Whether ``auto`` takes this backend: an x86 CPU where the CPU extension builds."""
        return (cls.usable(device) is None and platform.machine().lower() in ("x86_64", "amd64")
                and cpu_gemm.available())

    # ---- the target -----------------------------------------------------------------------------
    def prepare(self, model, runtime, tree_kernel):
        model = super().prepare(model, runtime, tree_kernel)
        if runtime.cache == "static" and runtime.packed_linear:
            # per bucket the fastest of F.linear, MKL's packed GEMM and the small-row kernel (float32),
            # of F.linear and oneDNN's GEMM on packed weights (bfloat16); compiled steps take the
            # kernel and oneDNN as the extension's dispatcher ops on copies the twin holds, and MKL's
            # packed copies through the extension's table (without the extension, F.linear)
            ways = linear_ways(model, runtime.buckets, decide=self.linear)
            packed = {r for r, w in ways.items() if w == "packed" and (not runtime.compile or cpu_gemm.available())}
            stream = {r for r, w in ways.items() if w == "stream"}
            onednn = {r for r, w in ways.items() if w == "onednn"}
            self.twin = packed_twin(model, packed, stream, onednn, key=self.linear) if packed or stream or onednn else None
            self.packed_rows = packed_row_counts(self.twin)  # buckets whose steps take MKL's packed GEMM
            self.stream_rows = stream_row_counts(self.twin)  # buckets whose products take the small-row kernel
            self.onednn_rows = onednn_row_counts(self.twin)  # buckets whose bf16 products take oneDNN, packed
            self.twin_rows = self.packed_rows | self.stream_rows | self.onednn_rows
        return model

    def gqa_attention(self):
        return register_cpu_sdpa()  # small masked calls through the CPU extension's op

    def decoder(self, size):
        return self.twin.get_decoder() if self.twin is not None and size in self.twin_rows else None

    def head_rows(self, size, nodes):
        # with MKL's packed GEMM the LM head runs over the whole bucket: a row count it packs for
        return size if size in self.packed_rows else nodes

    def compile_step(self, step, size, decoder):
        """One graph for the whole step; each decoder layer one compiled region (regions.py), on a
        parameter-sharing copy of ``decoder``. Why: as one plain graph inductor builds every layer
        of the step anew (slow to compile), and layers compiled on their own leave Python between
        them in every step (docs/cpu-backend.md, compile-one-graph)."""
        use_inductor_cache()
        regional = self._regions(decoder, size)
        graph = torch.compile(lambda *args, **kw: step(*args, decoder=regional, **kw), dynamic=False,
                              backend=self.step_backend,
                              options=_STEP_OPTIONS if self.step_backend == "inductor" else None)
        warmed: set = set()  # _warm_key of this step's calls already run once with all guards

        def compiled(tokens, positions, masks, slots, cache, **kernel):
            # every bucket, layer set and cache capacity adds a graph of the one step code: more
            # than dynamo's default limit of 8, past which it would run the step eagerly
            warm = _warm_key(cache, tokens, kernel)
            with torch._dynamo.config.patch(recompile_limit=_RECOMPILE_LIMIT), \
                    torch.compiler.config.patch(dynamic_sources=_LAYER_INDEX_SOURCES), _guards_of(warm in warmed):
                out = graph(tokens, positions, masks, slots, cache, **kernel)
            warmed.add(warm)
            return out

        return compiled

    def _regions(self, base, size: int):
        """A parameter-sharing copy of the decoder ``base`` whose layers run as nested compile
        regions, kept per ``base``; the twin's kernel and oneDNN copies held for graphs, and MKL's
        copies for a ``size``-row bucket that takes MKL's packed GEMM (each as large as the weights)."""
        if id(base) not in self._regional:
            # shares parameters and buffers and the twin's MKL packed copies (opaque tensors, which
            # cannot be deep-copied)
            copy_ = regional_copy(base, share=[m.packed for m in base.modules() if isinstance(m, PackedLinear)])
            for mod in copy_.modules():
                if isinstance(mod, PackedLinear):
                    mod.hold_copies()
            self._regional[id(base)] = copy_
        if size in self.packed_rows:
            for mod in self._regional[id(base)].modules():
                if isinstance(mod, PackedLinear):
                    mod.hold_mkl_copy(size)
        return self._regional[id(base)]

    def project(self, hidden, weight):
        return project(hidden, weight)

    def greedy_argmax(self, hidden, weight):
        # the exact argmax through a bfloat16 screen of the head (half the bytes read)
        if cpu_argmax.applies(hidden, weight):
            return cpu_argmax.screened_argmax(hidden, weight, self.argmax)
        return None

    # ---- drafters and training ------------------------------------------------------------------
    def fast_linears(self, module, rows, upto=64):
        return streaming_copy(module, rows=rows, upto=upto, decide=self.linear)

    def draft_dtype(self, lm_weight, linears, rows, repeats: int = 3):
        """The fastest here of float32, bfloat16 (where bf16 products are native) and weight-only int8
        (``torch.int8``: :meth:`int8_linear`, where torch's kernel takes the head's shapes), timed on the
        head's own weights (float32 and bfloat16 linears through the small-row kernel where it runs,
        their LM head through :func:`project`); another precision than float32 must win by ``MARGIN``.

        Timed as decoding runs them: a propose's worth of levels (``_LEVELS_TIMED``) after the last
        level cache was evicted, since the target's verification forward evicts the head's weights
        before every propose: the first level reads them from memory, where the bytes per weight
        count most (interleaved, best of ``repeats``)."""
        from .. import native_bf16
        from ...heads.int8 import quantize_rows

        lm = lm_weight.detach()
        weights = [(m.weight.detach(), None if m.bias is None else m.bias.detach()) for m in linears]

        def level(dtype):
            w_lm = lm.to(dtype)
            ws = [(w.to(dtype), None if b is None else b.to(dtype)) for w, b in weights]
            xs = {k: torch.randn(rows, k, dtype=dtype) for k in {w.shape[1] for w, _ in ws} | {w_lm.shape[1]}}

            def run():
                for _ in range(_LEVELS_TIMED):
                    project(xs[w_lm.shape[1]], w_lm)  # (rows, Vd)
                    for w, b in ws:
                        cpu_gemm.small_linear(xs[w.shape[1]], w, b)

            return run

        mats = [lm] + [w for w, _ in weights]  # every product's weight

        def int8_level():
            qs = [quantize_rows(w) for w in mats]  # (q, scale) per product
            xs = {k: torch.randn(rows, k) for k in {q.shape[1] for q, _ in qs}}

            def run():
                for _ in range(_LEVELS_TIMED):
                    for q, scale in qs:
                        self.int8_linear(xs[q.shape[1]], q, scale)

            return run

        ways = {torch.float32: level(torch.float32)}
        if native_bf16(self.device):
            ways[torch.bfloat16] = level(torch.bfloat16)
        if all(_int8_kernel_takes(w.shape[1]) for w in mats):
            ways[torch.int8] = int8_level()
        if len(ways) == 1:
            return torch.float32
        # (n,) float32 in real pages: twice the last level cache, at most 1 GiB
        evict = torch.ones(min(2 * last_level_cache_bytes(), 1 << 30) // 4)
        with torch.no_grad():
            times = dict(zip(ways, timed_pass(list(ways.values()), repeats, before=lambda: evict.sum())))
        best = min(times, key=times.get)
        return best if times[best] < (1 - MARGIN) * times[torch.float32] else torch.float32

    def int8_linear(self, x, q, scale):
        # torch's weight-only int8 kernel (the int8 rows converted in registers); it takes bfloat16
        # activations (its float32 form is a slow fallback here), so the rounding is bf16's
        if x.device.type != "cpu" or x.dim() != 2 or not len(x) or not _int8_kernel_takes(x.shape[1]):
            return super().int8_linear(x, q, scale)
        return _INT8_MM(x.to(torch.bfloat16).contiguous(), q, scale.to(torch.bfloat16)).to(x.dtype)

    def fast_model(self, model: nn.Module, batch_sizes) -> nn.Module:
        """The model's packed twin for ``batch_sizes``-row forwards where MKL's packed GEMM or the
        small-row kernel measures faster (same results up to rounding), else the model."""
        ways = linear_ways(model, batch_sizes, decide=self.linear)
        return packed_twin(model, [r for r, w in ways.items() if w == "packed"],
                           [r for r, w in ways.items() if w == "stream"], key=self.linear) or model


BACKEND = CpuBackend
