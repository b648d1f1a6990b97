"""The CUDA backend: the eager forward, with compiled steps and draft levels as CUDA graphs."""
from __future__ import annotations

import torch

from .base import Backend, use_inductor_cache

__all__ = ["CudaBackend", "BACKEND"]


class CudaBackend(Backend):
    """Compiled steps run as CUDA graphs (``mode="reduce-overhead"``), a draft head's tree levels
    too; a compilation that fails is an error (no silent eager fallback on a GPU)."""

    name = "cuda"
    tree_kernel_default = True
    compiles_draft_levels = True
    compile_fallback = False

    @classmethod
    def usable(cls, device) -> str | None:
        if torch.device(device).type != "cuda":
            return f"the model is on '{torch.device(device).type}', not a CUDA device"
        if not torch.cuda.is_available():
            return "this torch build sees no CUDA device"
        return None

    def compile_step(self, step, size, decoder):
        use_inductor_cache()
        return torch.compile(lambda *args, **kw: step(*args, decoder=decoder, **kw), dynamic=False,
                             mode="reduce-overhead")

    def compile(self, fn):
        use_inductor_cache()
        return torch.compile(fn, dynamic=False, mode="reduce-overhead")

    def draft_dtype(self, lm_weight, linears, rows):
        return torch.bfloat16  # native on every GPU this targets; a draft only proposes


BACKEND = CudaBackend
