"""How the target's forward runs: backend, cache kind, node-count buckets, precision, compilation.

The ``runtime:`` section of a decoding config::

    runtime:
      backend: auto        # auto | eager | cpu | cuda: how forwards run fast here (eagle/backends;
                           # auto: cuda on CUDA, cpu on an x86 CPU where its extension builds, else eager)
      cache: static        # static: preallocated KV written by slot | dynamic: transformers' DynamicCache
      buckets: [1, 4, 8, 16, 32, 64]   # static: trees are padded to the next bucket (fixed shapes);
                                       # a decoder cuts them at its largest tree (RuntimeConfig.fitted)
      dtype: ""            # "" = the model as loaded | float32 | bfloat16 | float16
      compile: false       # compile each bucket's step (the backend's way: one graph per step)
      packed_linear: true  # cpu backend: per bucket the fastest GEMM for the decoder's linear layers,
                           # measured at start-up (F.linear, MKL's packed GEMM, the small-row kernel, oneDNN)
      greedy_head: screened  # greedy steps: the exact argmax without every logit where the backend has a
                             # way (cpu: a bfloat16 screen of the head) | full: every logit, then argmax

``compile`` is off by default (tests and short runs would pay the compile); the shipped CPU
configs turn it on. Why each CPU default is what it is: docs/cpu-backend.md.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

__all__ = ["RuntimeConfig", "BACKENDS", "CACHES", "GREEDY_HEADS", "DTYPES", "DEFAULT_BUCKETS"]

BACKENDS = ("auto", "eager", "cpu", "cuda")  # eagle.backends.BACKENDS (kept here: no torch import for configs)
CACHES = ("static", "dynamic")
GREEDY_HEADS = ("screened", "full")
DTYPES = ("float32", "bfloat16", "float16")  # weight precisions a config may name
RUNTIME_DTYPES = ("",) + DTYPES  # "" = the model as loaded
DEFAULT_BUCKETS = [1, 4, 8, 16, 32, 64]


@dataclass
class RuntimeConfig:
    """See the module docstring. ``buckets`` must be increasing positive sizes; a tree larger than
    the last bucket runs at its own size (one more shape)."""

    backend: str = "auto"
    cache: str = "static"
    buckets: list[int] = field(default_factory=lambda: list(DEFAULT_BUCKETS))
    dtype: str = ""
    compile: bool = False
    packed_linear: bool = True
    greedy_head: str = "screened"

    def validate(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"runtime.backend must be one of {BACKENDS}, got '{self.backend}'")
        if self.cache not in CACHES:
            raise ValueError(f"runtime.cache must be one of {CACHES}, got '{self.cache}'")
        if self.dtype not in RUNTIME_DTYPES:
            raise ValueError(f"runtime.dtype must be one of {RUNTIME_DTYPES[1:]} (or empty for the model's), "
                             f"got '{self.dtype}'")
        if not self.buckets or any(b < 1 for b in self.buckets) or self.buckets != sorted(set(self.buckets)):
            raise ValueError(f"runtime.buckets must be increasing positive node counts, got {self.buckets}")
        if self.greedy_head not in GREEDY_HEADS:
            raise ValueError(f"runtime.greedy_head must be one of {GREEDY_HEADS}, got '{self.greedy_head}'")
        if self.compile and self.cache != "static":
            raise ValueError("runtime.compile needs runtime.cache: static (fixed shapes)")

    def fitted(self, max_nodes: int, multiple: int = 1) -> "RuntimeConfig":
        """This runtime for trees of at most ``max_nodes`` nodes: the first bucket that holds them
        is cut down to ``max_nodes`` rounded up to a ``multiple`` (never past that bucket) and the
        larger buckets go, so no step is padded past the largest tree a drafter can propose
        (EAGLE-2's 60-token dynamic tree: 61-row float32 steps, not 64). ``multiple``: the row
        granularity of the step's products (the decoder passes 16 for 16-bit steps: AMX tiles hold
        16 rows, so a 61-row bfloat16 step costs more than a 64-row one; docs/cpu-backend.md,
        buckets-fitted). A copy; unchanged when every bucket is smaller."""
        if max_nodes < 1 or multiple < 1:
            raise ValueError(f"max_nodes and multiple must be >= 1, got {max_nodes} and {multiple}")
        holder = next((b for b in self.buckets if b >= max_nodes), None)
        if holder is None:
            return self
        cut = min(holder, -(-max_nodes // multiple) * multiple)
        return replace(self, buckets=[b for b in self.buckets if b < cut] + [cut])

    def bucket(self, n: int) -> int:
        """The padded node count of a tree of ``n`` nodes (``n`` itself beyond the last bucket)."""
        for b in self.buckets:
            if b >= n:
                return b
        return n
