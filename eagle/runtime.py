"""How the target's forward runs: cache kind, node-count buckets, precision, compilation.

The ``runtime:`` section of a decoding config::

    runtime:
      cache: static        # static: preallocated KV written by slot | dynamic: transformers' DynamicCache
      buckets: [1, 4, 8, 16, 32, 64]   # static: trees are padded to the next bucket (fixed shapes);
                                       # a decoder cuts them at its largest tree (RuntimeConfig.fitted)
      dtype: ""            # "" = the model as loaded | float32 | bfloat16 | float16
      compile: false       # compile each bucket's step (CPU: one graph, each decoder layer one compiled region; GPU: CUDA graphs)
      packed_linear: true  # CPU: per bucket the fastest GEMM: F.linear, MKL's packed GEMM or the small-row kernel
                           # (float32); F.linear, oneDNN on packed copies or the kernel's bf16 form (bfloat16)
      greedy_head: screened  # greedy steps, float32 head on the CPU: its exact argmax through a bfloat16
                             # screen (kernels/cpu_argmax.py) | full: every logit, then argmax

Defaults were chosen by measurement on the 2-core CPUs this project is developed on
(docs/results.md, "The fast target path", "Compiled decoder layers", "One graph per step").
Compiling the whole step layer by layer cost 55-80 s per bucket there; a compiled CPU step is now
one graph whose decoder layers are one compiled region (eagle/regions.py): ~11-20 s per bucket,
and a step costs 0.84-0.89x what compiling each layer on its own did on the Intel Xeon with AMX
(which cost 0.82-0.91x the eager step on the AMD EPYC Zen 3). Still off by default (tests and short
runs would pay the compile); the shipped CPU config ``eagle2-cpu.yaml`` turns it on. The packed GEMM made the layer products of 4-32-row steps 2.1-3.1x
faster on an Intel Xeon and 6-22% slower on an AMD EPYC, where the small-row kernel
(kernels/cpu_gemm.py) ran them 2x faster than ``F.linear`` instead; so ``packed_linear: true``
takes, per bucket, the way a measurement at start-up (``eagle.packed.linear_ways``, ~1 s) finds
fastest. A greedy step needs only each row's argmax of the LM head (the largest product of a
float32 step: 113 of SmolLM2's 538 MB); ``greedy_head: screened`` reads a bfloat16 copy of it and
recomputes the few tokens that copy cannot rule out, which gives the exact argmax (docs/kernels.md).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

__all__ = ["RuntimeConfig", "CACHES", "GREEDY_HEADS", "DTYPES", "DEFAULT_BUCKETS", "cpu_flags", "native_bf16"]

CACHES = ("static", "dynamic")
GREEDY_HEADS = ("screened", "full")
DTYPES = ("float32", "bfloat16", "float16")  # weight precisions a config may name
RUNTIME_DTYPES = ("",) + DTYPES  # "" = the model as loaded
DEFAULT_BUCKETS = [1, 4, 8, 16, 32, 64]


@dataclass
class RuntimeConfig:
    """See the module docstring. ``buckets`` must be increasing positive sizes; a tree larger than
    the last bucket runs at its own size (one more shape)."""

    cache: str = "static"
    buckets: list[int] = field(default_factory=lambda: list(DEFAULT_BUCKETS))
    dtype: str = ""
    compile: bool = False
    packed_linear: bool = True
    greedy_head: str = "screened"

    def validate(self) -> None:
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
        granularity of the step's products (the decoder passes 16 for 16-bit steps: on AMX, whose
        tiles hold 16 rows, a 61-row bfloat16 step took 51.2-54.7 ms against 44.5-46.4 ms for 64
        rows, where 56 and 60 rows cost no more than 64). A copy; unchanged when every bucket is
        smaller."""
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


def native_bf16(device="cpu", cpuinfo: str = "/proc/cpuinfo") -> bool:
    """Whether bfloat16 products run natively on ``device``: CUDA, or a CPU whose flags include
    AVX512-BF16 or AMX-BF16 (measured on such an AMD EPYC: bf16 layer products 1.6-1.9x faster than
    float32 for 1-96 rows; on an Intel Xeon without them, 2-3x slower)."""
    import torch

    if torch.device(device).type == "cuda":
        return True
    flags = cpu_flags(cpuinfo)
    return "avx512_bf16" in flags or "amx_bf16" in flags


def cpu_flags(cpuinfo: str = "/proc/cpuinfo") -> set[str]:
    """The CPU's feature flags from ``cpuinfo`` (empty where it cannot be read)."""
    try:
        with open(cpuinfo) as f:
            return set(next((line for line in f if line.startswith("flags")), "").split())
    except OSError:
        return set()
