"""The EAGLE-1/2 draft head: ``fc([embed(next token); target feature]) -> one decoder layer``.

The decoder layer is the target's own transformers class (built from a one-layer copy of the
target config), with its first input norm removed as in EAGLE. The target's embedding and LM head
are shared and frozen: they are arguments of the calls, never stored in the head or its checkpoint.
Its checkpoint (save, read, check, load, other layouts) is :mod:`eagle.heads.formats`.

Pairs and positions: the head's input at position i is the pair ``(f_i, x_{i+1})`` (the target
feature at position i and the token that follows it); its output predicts ``f_{i+1}``.
"""
from __future__ import annotations

import torch
from torch import nn

from .common import layer_config

__all__ = ["DraftHead"]


class DraftHead(nn.Module):
    """EAGLE-1/2 draft head.

    Args:
        target_config: the target's transformers config (its decoder-layer class is reused).
        layer_cls: the target's decoder-layer class, e.g. ``type(model.model.layers[0])``.
        rotary_cls: the target's rotary-embedding class.
        draft_vocab: optional ``(Vd,)`` target ids of a reduced draft vocabulary.
    """

    def __init__(self, target_config, layer_cls, rotary_cls, draft_vocab: torch.Tensor | None = None):
        super().__init__()
        cfg = layer_config(target_config)
        H = cfg.hidden_size
        self.layer_config = cfg
        self.fc = nn.Linear(2 * H, H, bias=True)
        self.layer = layer_cls(cfg, layer_idx=0)
        self.layer.input_layernorm = nn.Identity()  # EAGLE: the fc output goes in un-normalized
        self.rotary = rotary_cls(config=cfg)
        dv = torch.arange(0) if draft_vocab is None else torch.as_tensor(draft_vocab, dtype=torch.long)
        self.register_buffer("draft_vocab", dv, persistent=True)

    @classmethod
    def for_target(cls, model, draft_vocab: torch.Tensor | None = None) -> "DraftHead":
        """A freshly initialized head matching ``model`` (an unmodified transformers causal LM)."""
        base = model.get_decoder()
        head = cls(model.config, type(base.layers[0]), type(base.rotary_emb), draft_vocab)
        # start as "the next feature equals the current one": fc passes the feature half through,
        # and the layer's residual branch learns the difference
        H = head.hidden_size
        with torch.no_grad():
            head.fc.weight.zero_()
            head.fc.weight[:, H:].copy_(torch.eye(H))
            head.fc.bias.zero_()
        return head.to(next(model.parameters()).device)

    @property
    def hidden_size(self) -> int:
        return self.fc.out_features

    def forward(self, features: torch.Tensor, token_embeds: torch.Tensor, position_ids: torch.Tensor,
                attention_mask: torch.Tensor | None, cache=None, **kwargs) -> torch.Tensor:
        """``features, token_embeds (B, T, H)``, ``position_ids (B, T)``, ``attention_mask``
        ``(B, 1, T, S)`` bool (True = attend; S = cached + T) -> predicted next features ``(B, T, H)``."""
        x = self.fc(torch.cat([token_embeds, features], dim=-1))  # (B, T, H)
        pos_emb = self.rotary(x, position_ids=position_ids)
        return self.layer(x, attention_mask=attention_mask, position_ids=position_ids, cache=cache,
                          use_cache=cache is not None, position_embeddings=pos_emb, **kwargs)

    def lm_weight(self, lm_head: nn.Module) -> torch.Tensor:
        """``(Vd, H)`` rows of the target's LM head for the draft vocabulary."""
        w = lm_head.weight
        return w if self.draft_vocab.numel() == 0 else w[self.draft_vocab]

    # ---- the interface the drafter uses for every head type (see eagle/heads/eagle3.py) -------
    feature_layers = None  # reads the target's final feature

    def enter(self, features: torch.Tensor) -> torch.Tensor:
        """Target features as the head's input: the final feature goes in as it is."""
        return features

    def pre_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden  # the predicted feature is already in the target's final (normed) space

    def draft_weight(self, target_lm_head: nn.Module) -> torch.Tensor:
        return self.lm_weight(target_lm_head)

    @property
    def vocab_map(self) -> torch.Tensor | None:
        """``(Vd,)`` target id of each draft id, or None for the full vocabulary."""
        return self.draft_vocab if self.draft_vocab.numel() else None

    def flops_per_token(self) -> int:
        """Multiply-adds x 2 of one drafted token (fc + layer + draft LM head), attention excluded."""
        n_params = sum(p.numel() for n, p in self.named_parameters() if "norm" not in n)
        vd = self.draft_vocab.numel() or getattr(self.layer_config, "vocab_size", 0)
        return 2 * (n_params + vd * self.hidden_size)
