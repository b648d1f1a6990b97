"""Thin wrappers over the MKL and oneDNN GEMM ops a CPU torch build carries (no build of ours)."""
from __future__ import annotations

import torch

__all__ = ["packed_gemm_available", "onednn_available", "onednn_pack", "onednn_linear"]


def packed_gemm_available() -> bool:
    """Whether this torch build has MKL's packed GEMM ops (x86 builds with MKL)."""
    return torch.backends.mkl.is_available() and hasattr(torch.ops.mkl, "_mkl_linear")


def onednn_available(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """Whether oneDNN's bfloat16 GEMM with a packed weight runs here with each row's result
    independent of the call's row count: a torch build with oneDNN on a CPU with native bfloat16
    products (AVX512-BF16 or AMX-BF16). Where oneDNN emulates bfloat16 (AVX-512 without BF16) a
    row's sum changes with the row count (the model's shapes at 8-64 rows, measured on a Xeon
    without AVX512-BF16), which a tree step checked against one-token steps cannot have."""
    from .cpuinfo import native_bf16_cpu

    return native_bf16_cpu(cpuinfo) and torch.backends.mkldnn.is_available() \
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight") and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def onednn_pack(weight: torch.Tensor) -> torch.Tensor:
    """oneDNN's packed copy of a bfloat16 weight ``(N, K)`` (an MKLDNN-layout tensor), made once and
    used for every row count, so a row's result does not depend on the row count of the call."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), 1)


def onednn_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x (M, K) @ w.T + bias -> (M, N)`` through oneDNN, ``packed = onednn_pack(w)``."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")
