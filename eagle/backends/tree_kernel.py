"""The ``eagle_tree`` attention implementation: the Triton tree-attention kernel behind transformers'
``AttentionInterface`` (eager and CUDA backends, wherever a Target asks for the kernel)."""
from __future__ import annotations

import torch

from ..attention import register_attention

__all__ = ["TREE_IMPL", "register_tree_attention"]

TREE_IMPL = "eagle_tree"


def register_tree_attention() -> str:
    """Register (once) and return the ``eagle_tree`` attention backend: the tree-attention kernel
    for calls that carry a ``tree_mask`` (Triton on CUDA or under ``TRITON_INTERPRET=1``, its torch
    reference elsewhere), transformers' SDPA with its ordinary masks for everything else."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if TREE_IMPL in AttentionInterface._global_mapping:
        return TREE_IMPL

    from eagle_kernels.tree_attention import tree_attention  # also registers torch.ops.eagle.tree_attention

    def eagle_tree_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                             tree_mask=None, tree_prefix=None, **kwargs):
        # query (B, Hq, T, D); key/value (B, Hkv, P+T, D), or the whole slot buffer (B, Hkv, C, D)
        # of a compiled step, whose prefix length is then tree_prefix (1,) int32 on the device
        # tree_mask: (T, W) int32 bit-packed ancestors (target verify), or (n, S+n) bool for a draft
        # head level whose n new queries follow S earlier tree entries
        if tree_mask is None or getattr(module, "sliding_window", None) is not None:
            return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling,
                                          dropout=dropout, **kwargs)
        if tree_prefix is not None:  # one opaque op in the compiled graph (no host sync, fixed shapes)
            scale = float(scaling) if scaling is not None else query.shape[-1] ** -0.5
            out = torch.ops.eagle.tree_attention(query, key, value, tree_mask, tree_prefix, scale)
            return out.transpose(1, 2).contiguous(), None

        n, m = tree_mask.shape[-2], tree_mask.shape[-1]
        if tree_mask.dtype == torch.bool and m > n:
            # pad the queries with the S earlier tree entries (outputs discarded) so the mask is the
            # square ancestor table the kernel takes
            B, H, _, D = query.shape
            q_full = torch.cat([query.new_zeros(B, H, m - n, D), query], dim=2)  # (B, H, S+n, D)
            anc = torch.eye(m, dtype=torch.bool, device=query.device)
            anc[m - n:] = tree_mask
            out = tree_attention(q_full, key, value, anc, scale=scaling)[:, :, m - n:]
        else:
            out = tree_attention(query, key, value, tree_mask, scale=scaling)  # (B, Hq, T, D)
        return out.transpose(1, 2).contiguous(), None

    return register_attention(TREE_IMPL, eagle_tree_attention)
