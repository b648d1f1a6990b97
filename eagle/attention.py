"""Attention backends a Target registers in transformers' ``AttentionInterface``.

``gqa_sdpa``: transformers' SDPA attention for grouped-query models, with each KV head's query heads
folded into the query axis at every query length. transformers folds them only for one-token
queries; a tree of T > 1 nodes under a mask gets its keys and values copied to every query head
(``repeat_kv``: on SmolLM2-135M, 30 layers x 2 copies of ``(9, prefix, 64)`` per verification
forward, the largest cost that grows with the tree outside the weight products; see
docs/cpu-backend.md, gqa-fold). Folded, SDPA reads each KV head once for all its query heads; the mask row of
query t is the same for every head, so it is repeated along the folded axis.

The CPU backend registers its own form of it (eagle/backends/cpu/attention.py: small masked calls
through the CPU extension's op first). A Target runs these on an *attention view* of the model it is given: a structural copy that
shares every parameter and buffer (no weight is copied) and has its own config, so the caller's
model (and transformers' ``generate`` on it, the benchmarks' baseline) keeps its own attention.
"""
from __future__ import annotations

import copy
import itertools
import weakref

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["FOLD_BELOW", "GQA_SDPA", "SCORE_CHANGES", "attention_view", "folds_gqa", "gqa_sdpa", "register_attention",
           "register_gqa_sdpa", "sharing_copy"]

GQA_SDPA = "eagle_gqa_sdpa"
# Fold only while the folded query axis stays below this: from 192 query rows on, PyTorch's CPU
# flash kernel splits queries in blocks of 64 instead of 32, and a folded 64-node tree (3 KV heads x
# 3 blocks, against 9 heads x 2 unfolded) gains nothing over the unfolded one (docs/cpu-backend.md,
# gqa-fold).
FOLD_BELOW = 192
# attention keywords that change the scores or the softmax (soft-capping, position biases, sinks):
# calls with any of them keep transformers' SDPA
SCORE_CHANGES = ("softcap", "position_bias", "s_aux", "sinks", "head_mask")
_VIEWS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # model -> {implementation: view}


def register_attention(name: str, fn) -> str:
    """Register (once) the attention backend ``fn`` under ``name`` in transformers'
    ``AttentionInterface``, with SDPA's masks; returns ``name`` (for ``_attn_implementation``)."""
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import sdpa_mask

    if name not in AttentionInterface._global_mapping:
        AttentionInterface.register(name, fn)
        AttentionMaskInterface.register(name, sdpa_mask)
    return name


def gqa_sdpa(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs):
    """SDPA over ``query (B, Hq, T, D)``, ``key/value (B, Hkv, S, D)`` with the ``Hq / Hkv`` query
    heads of each KV head folded into the query axis; returns ``((B, T, Hq, D), None)`` as
    transformers' ``sdpa_attention_forward``, which takes every call the folding does not apply to
    (no grouping, ``FOLD_BELOW`` folded query rows or more, no mask, a per-head mask, soft-capping,
    position biases, attention weights asked for)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    groups = getattr(module, "num_key_value_groups", 1)
    plain = (groups == 1 or groups * query.shape[2] >= FOLD_BELOW
             or attention_mask is None or attention_mask.dim() != 4 or attention_mask.shape[1] != 1
             or kwargs.get("softcap") is not None or kwargs.get("position_bias") is not None
             or kwargs.get("output_attentions", False) or query.shape[1] != key.shape[1] * groups)
    if plain:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    B, Hq, T, D = query.shape
    Hkv = key.shape[1]
    # query head h = kv * groups + j  ->  row j * T + t of KV head kv (repeat_kv's head order)
    q = query.reshape(B, Hkv, groups * T, D)  # (B, Hkv, groups*T, D)
    mask = attention_mask.repeat(1, 1, groups, 1) if T > 1 else attention_mask  # (B|1, 1, groups*T, S)
    out = F.scaled_dot_product_attention(q, key, value, attn_mask=mask, dropout_p=dropout, scale=scaling)
    out = out.reshape(out.shape[0], Hq, T, value.shape[-1])  # (B, Hq, T, Dv)
    return out.transpose(1, 2).contiguous(), None  # (B, T, Hq, Dv)


def register_gqa_sdpa() -> str:
    """Register (once) and return the ``eagle_gqa_sdpa`` backend (:func:`gqa_sdpa`)."""
    return register_attention(GQA_SDPA, gqa_sdpa)


def sharing_copy(module: nn.Module, make=None, skip: nn.Module | None = None, share=()) -> nn.Module:
    """A structural copy of ``module`` that shares every parameter and buffer with it (no weight is
    copied; configs and other attributes are copied), each of its ``nn.Linear``s but ``skip``
    replaced by ``make(linear)`` when ``make`` is given; ``share``: more objects held by the
    modules to share rather than copy (e.g. caches of weight copies that cannot be deep-copied)."""
    shared = {id(t): t for t in itertools.chain(module.parameters(), module.buffers(), share)}
    twin = copy.deepcopy(module, memo=shared)  # new modules, the same parameters and buffers
    if make is None:
        return twin
    skipped = {name for name, mod in module.named_modules() if mod is skip}
    for name, mod in list(twin.named_modules()):
        if type(mod) is nn.Linear and name not in skipped:
            parent, _, attr = name.rpartition(".")
            setattr(twin.get_submodule(parent), attr, make(mod))
    return twin


def attention_view(model: nn.Module, implementation: str) -> nn.Module:
    """``model`` running the registered attention ``implementation``: a parameter-sharing copy with
    its own config (one per model and implementation, kept while the model lives); the model itself
    is returned when it already runs that implementation."""
    if model.config._attn_implementation == implementation:
        return model
    views = _VIEWS.setdefault(model, {})
    if implementation not in views:
        view = sharing_copy(model)
        view.set_attn_implementation(implementation)
        views[implementation] = view
    return views[implementation]


def folds_gqa(config) -> bool:
    """Whether :func:`gqa_sdpa` changes anything for a model of this (text) ``config``: SDPA
    attention with fewer KV heads than query heads."""
    heads = getattr(config, "num_attention_heads", None)
    kv = getattr(config, "num_key_value_heads", None) or heads
    return config._attn_implementation == "sdpa" and bool(heads) and kv < heads
