"""Masked attention over the filled part of a preallocated cache on the CPU (``cpu_attention.cpp``,
built into the extension of ``cpu_gemm.cpp``): what every layer of a compiled decoding or
verification step runs, 1-64 tree nodes against the slots of a slot cache.

A compiled step has fixed shapes, so it hands attention the whole cache buffer (a multiple of 256
slots) with a mask that hides the empty ones, and PyTorch's CPU flash attention works through all
of them. The op cuts the keys off after the last slot any query sees (scanning the mask: a
data-dependent length, which a graph could only get with a host sync and a new shape per step) and
attends over the rest: float32 calls on AVX-512 builds through its own tiled loop (query rows in
the vector lanes, the keys split between the threads; :func:`set_way` switches it off for A/Bs),
the others through SDPA in its grouped-query form (each KV head read once for its query heads, no
K/V copies).

As for the other kernels:

* :func:`masked_attention`: the fast path, ``torch.ops.<extension>.masked_attention`` (one opaque
  op in compiled graphs); :func:`applies` says whether it takes a call;
* :func:`masked_attention_reference`: scores, masked softmax and weighted sum with the KV heads
  repeated, in float32, the obviously-correct version;
* :func:`available`: whether the extension built on this machine (``cpu_gemm.available``).
"""
from __future__ import annotations

import torch

from . import cpu_gemm

__all__ = ["MAX_ROWS", "WAYS", "applies", "available", "masked_attention", "masked_attention_reference", "set_way",
           "way"]

# query rows (tree nodes) up to which the op runs; longer queries (a prompt's prefill) take
# transformers' own path, which needs no cut (an eager prefill attends to the filled slots only)
MAX_ROWS = 64
_OP = None  # torch.ops.<extension name>.masked_attention, once its shape function is registered
# how the op computes float32 calls: "tiled" (its own AVX-512 loop, the default where the build has
# AVX-512; else SDPA) or "sdpa" (every call through SDPA), for A/Bs
WAYS = ("tiled", "sdpa")


def available() -> bool:
    """Whether the op runs on this machine (the CPU extension built)."""
    return _op() is not None


def _op():
    global _OP
    if _OP is None:
        def fake(q, k, v, mask, scale):
            return q.new_empty(q.shape[0], q.shape[2], q.shape[1], q.shape[3])  # (B, T, Hq, D)

        _OP = cpu_gemm.extension_op("masked_attention", fake)
    return _OP


def set_way(name: str) -> None:
    """Set how the op computes float32 calls (:data:`WAYS`; process-wide, for A/Bs): ``"tiled"``
    (default) or ``"sdpa"``. A ValueError names a bad one; nothing happens without the extension."""
    if name not in WAYS:
        raise ValueError(f"attention way must be one of {WAYS}, got '{name}'")
    ext = cpu_gemm._load()
    if ext is not None:
        getattr(torch.ops, ext.__name__).set_attention_way(WAYS.index(name))


def way() -> str | None:
    """The way :func:`set_way` set (``None`` without the extension)."""
    ext = cpu_gemm._load()
    return None if ext is None else WAYS[getattr(torch.ops, ext.__name__).attention_way()]


def applies(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None) -> bool:
    """Whether :func:`masked_attention` takes these tensors: CPU, float32 or bfloat16 alike, at most
    :data:`MAX_ROWS` query rows, a boolean ``(B or 1, 1, T, C)`` mask, query heads a multiple of KV
    heads, no autograd, the extension available."""
    return (mask is not None and mask.dtype == torch.bool and mask.dim() == 4 and mask.shape[1] == 1
            and query.dim() == 4 and query.shape[2] <= MAX_ROWS and query.is_cpu
            and query.dtype in (torch.float32, torch.bfloat16) and key.dtype == query.dtype == value.dtype
            and key.shape[1] > 0 and query.shape[1] % key.shape[1] == 0
            and not (torch.is_grad_enabled() and (query.requires_grad or key.requires_grad or value.requires_grad))
            and _op() is not None)


def masked_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor,
                     scale: float | None = None) -> torch.Tensor:
    """``softmax(scale * q k^T, masked) v`` per query head -> ``(B, T, Hq, D)`` (transformers'
    attention output layout): ``query (B, Hq, T, D)``, ``key / value (B, Hkv, C, D)`` (query head h
    reads KV head ``h // (Hq // Hkv)``), ``mask (B or 1, 1, T, C)`` bool, True = attend; over the keys
    up to the last one any row sees (the tiled loop or SDPA, see the module docstring). Falls back to
    :func:`masked_attention_reference` where :func:`applies` is false."""
    scale = query.shape[-1] ** -0.5 if scale is None else float(scale)
    if not applies(query, key, value, mask):
        return masked_attention_reference(query, key, value, mask, scale)
    return _op()(query, key, value, mask, scale)


def masked_attention_reference(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor,
                               scale: float | None = None) -> torch.Tensor:
    """:func:`masked_attention` in plain torch: the KV heads repeated to every query head, scores,
    masked softmax, weighted sum, in float32 (rows that see nothing: zeros)."""
    groups = query.shape[1] // key.shape[1]
    k = key.repeat_interleave(groups, dim=1).float()  # (B, Hq, C, D)
    v = value.repeat_interleave(groups, dim=1).float()
    scale = query.shape[-1] ** -0.5 if scale is None else float(scale)
    scores = (query.float() @ k.transpose(-1, -2)) * scale  # (B, Hq, T, C)
    scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # a row with no key: zeros
    out = weights @ v  # (B, Hq, T, D)
    return out.transpose(1, 2).contiguous().to(query.dtype)  # (B, T, Hq, D)

