"""The CPU backend's attention: small masked calls through the CPU extension's op
(kernels/cpu_attention.py: the grouped query heads folded, keys cut after the last one any row
sees), every other call as eagle/attention.py's grouped-query SDPA."""
from __future__ import annotations

from eagle_kernels import cpu_attention

from ...attention import SCORE_CHANGES, gqa_sdpa, register_attention

__all__ = ["CPU_SDPA", "cpu_sdpa", "register_cpu_sdpa"]

CPU_SDPA = "eagle_cpu_sdpa"


def cpu_sdpa(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs):
    """:func:`eagle.attention.gqa_sdpa`, but calls of at most ``cpu_attention.MAX_ROWS`` query rows
    with a boolean mask (and nothing that changes the scores) take the CPU op; returns
    ``((B, T, Hq, D), None)``."""
    if (dropout == 0.0 and not any(kwargs.get(k) is not None for k in SCORE_CHANGES)
            and not kwargs.get("output_attentions") and cpu_attention.applies(query, key, value, attention_mask)):
        return cpu_attention.masked_attention(query, key, value, attention_mask, scaling), None
    return gqa_sdpa(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                    is_causal=is_causal, **kwargs)


def register_cpu_sdpa() -> str:
    """Register (once) and return the ``eagle_cpu_sdpa`` attention implementation."""
    cpu_attention.available()  # builds / loads the CPU op now, not while a step is being traced
    return register_attention(CPU_SDPA, cpu_sdpa)
