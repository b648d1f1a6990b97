"""Masked attention over the filled part of a preallocated cache on the CPU (``cpu_attention.cpp``,
built into the extension of ``cpu_gemm.cpp``): what every layer of a compiled decoding or
verification step runs, 1-64 tree nodes against the slots of a slot cache.

A compiled step has fixed shapes, so it hands attention the whole cache buffer (a multiple of 256
slots) with a mask that hides the empty ones, and PyTorch's CPU flash attention works through all
of them. The op cuts the keys off after the last slot any query sees (scanning the mask: a
data-dependent length, which a graph could only get with a host sync and a new shape per step) and
attends over the rest: float32 calls on AVX-512 builds through its own tiled loop (query rows in
the vector lanes, the keys split between the threads; :func:`set_way` switches it off for A/Bs),
bfloat16 calls too where the loop (on their values widened to float32) measured faster than SDPA's
bf16 kernel on this machine (:func:`bf16_way`: chosen when the extension loads, kept beside the
build), the others through SDPA in its grouped-query form (each KV head read once for its query
heads, no K/V copies).

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
from .timing import MARGIN, timed_pass

__all__ = ["MAX_ROWS", "WAYS", "applies", "available", "bf16_way", "masked_attention", "masked_attention_reference",
           "set_bf16_way", "set_way", "way"]

# query rows (tree nodes) up to which the op runs; longer queries (a prompt's prefill) take
# transformers' own path, which needs no cut (an eager prefill attends to the filled slots only)
MAX_ROWS = 64
_OP = None  # torch.ops.<extension name>.masked_attention, once its shape function is registered
# how the op computes float32 calls: "tiled" (its own AVX-512 loop, the default where the build has
# AVX-512; else SDPA) or "sdpa" (every call through SDPA), for A/Bs
WAYS = ("tiled", "sdpa")


_BF16_CHOSEN = False  # whether _choose_bf16_way ran for the loaded extension


def _ext():
    """The extension this op lives in (``cpu_gemm``'s build), with how bfloat16 calls run chosen
    once for this machine (:func:`_choose_bf16_way`); ``None`` where it does not build."""
    global _BF16_CHOSEN
    ext = cpu_gemm._load()
    if ext is not None and not _BF16_CHOSEN:
        _BF16_CHOSEN = True
        _choose_bf16_way(ext)
    return ext


def available() -> bool:
    """Whether the op runs on this machine (the CPU extension built)."""
    return _op() is not None


def _op():
    global _OP
    if _OP is None:
        def fake(q, k, v, mask, scale):
            return q.new_empty(q.shape[0], q.shape[2], q.shape[1], q.shape[3])  # (B, T, Hq, D)

        if _ext() is not None:
            _OP = cpu_gemm.extension_op("masked_attention", fake)
    return _OP


def set_way(name: str) -> None:
    """Set how the op computes float32 calls (:data:`WAYS`; process-wide, for A/Bs): ``"tiled"``
    (default) or ``"sdpa"``. A ValueError names a bad one; nothing happens without the extension."""
    if name not in WAYS:
        raise ValueError(f"attention way must be one of {WAYS}, got '{name}'")
    ext = _ext()
    if ext is not None:
        getattr(torch.ops, ext.__name__).set_attention_way(WAYS.index(name))


def way() -> str | None:
    """The way :func:`set_way` set (``None`` without the extension)."""
    ext = _ext()
    return None if ext is None else WAYS[getattr(torch.ops, ext.__name__).attention_way()]


def set_bf16_way(name: str) -> None:
    """Set how the op computes bfloat16 calls (:data:`WAYS`; process-wide): ``"tiled"`` (the loop on
    the widened values, a float32 result rounded once) or ``"sdpa"``; at load the faster here is set
    (:func:`_choose_bf16_way`). A ValueError names a bad one; nothing happens without the extension."""
    if name not in WAYS:
        raise ValueError(f"attention way must be one of {WAYS}, got '{name}'")
    ext = _ext()
    if ext is not None:
        getattr(torch.ops, ext.__name__).set_attention_bf16_tiled(name == "tiled")


def bf16_way() -> str | None:
    """How the op computes bfloat16 calls here, ``"tiled"`` or ``"sdpa"`` (``None`` without the
    extension); float32 calls follow :func:`way`, and ``way() == "sdpa"`` sends every call to SDPA."""
    ext = _ext()
    return None if ext is None else ("tiled" if getattr(torch.ops, ext.__name__).attention_bf16_tiled() else "sdpa")


def _choose_bf16_way(ext, repeats: int = 5) -> str:
    """Set how bfloat16 calls run on this machine, called once as the extension loads (with the
    extension module ``ext``): ``EAGLE_CPU_ATTENTION_BF16=tiled|sdpa`` if set, else the faster of the
    two over SmolLM2-shaped calls (9 query heads on 3 KV heads of 64 dims, 300 keys seen in a 512-slot
    buffer, 1, 16 and 64 rows; interleaved, best of ``repeats``, ~0.1 s), SDPA unless the loop is
    faster by ``timing.MARGIN``; kept beside the build (``attention-<threads>t.json``). What wins
    differs by machine: SDPA's bf16 kernel is fast where it runs on AMX (docs/cpu-backend.md,
    attention-tiled-bf16)."""
    import os


    ops = getattr(torch.ops, ext.__name__)
    forced = os.environ.get("EAGLE_CPU_ATTENTION_BF16")
    if forced:
        if forced not in WAYS:
            raise ValueError(f"EAGLE_CPU_ATTENTION_BF16 must be one of {WAYS}, got '{forced}'")
        ops.set_attention_bf16_tiled(forced == "tiled")
        return forced
    saved, save = cpu_gemm._choice_record(ext, "attention")
    if saved is not None and saved.get("bf16") in WAYS:
        ops.set_attention_bf16_tiled(saved["bf16"] == "tiled")
        return saved["bf16"]
    gen = torch.Generator().manual_seed(0)
    calls = []
    for T in (1, 16, 64):
        q = torch.randn(1, 9, T, 64, generator=gen).bfloat16()
        k, v = (torch.randn(1, 3, 512, 64, generator=gen).bfloat16() for _ in range(2))
        mask = torch.zeros(1, 1, T, 512, dtype=torch.bool)
        mask[..., :300] = True
        calls.append((q, k, v, mask))

    def run(tiled: bool):
        def fn():
            ops.set_attention_bf16_tiled(tiled)
            for q, k, v, mask in calls:
                ops.masked_attention(q, k, v, mask, 0.125)
        return fn

    with torch.no_grad():
        sdpa_s, tiled_s = timed_pass([run(False), run(True)], repeats)
    chosen = "tiled" if tiled_s < (1 - MARGIN) * sdpa_s else "sdpa"
    ops.set_attention_bf16_tiled(chosen == "tiled")
    save(bf16=chosen, ms={"sdpa": 1e3 * sdpa_s, "tiled": 1e3 * tiled_s})
    return chosen


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

