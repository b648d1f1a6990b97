"""The EAGLE-3 draft head: fused low/mid/high target features, its own norm and draft-vocabulary LM head.

Per position the head reads the target's hidden states entering three layers (``feature_layers``,
by default ``[2, L//2, L-3]`` of an L-layer target: transformers' ``hidden_states[i]``),
concatenated ``(3H,)``; ``fc`` fuses them to ``H``. Its one decoder layer attends over
``[norm(embed(token)); norm(hidden)]`` (``2H`` in, ``H`` out, the residual is the hidden input),
then ``norm`` and ``lm_head`` give logits over a reduced draft vocabulary; draft id ``i`` is target
id ``i + d2t[i]``, and ``t2d`` marks the target ids that have a draft id. After the first draft
step the head feeds its own output hidden state forward (no ``fc``), exactly as at training time
(the training-time test in eagle/train/eagle3.py).

Parameter and buffer names follow the official EAGLE-3 checkpoints (``fc``, ``midlayer.*``,
``norm``, ``lm_head``, ``d2t``, ``t2d``), so a checkpoint converts by its config only. The layer
reuses the target's own attention, MLP and RMSNorm classes (its q/k/v projections take ``2H``).
"""
from __future__ import annotations

import torch
from torch import nn

from .common import layer_config

__all__ = ["Eagle3Head", "Eagle3Layer", "default_feature_layers", "vocab_maps"]


def default_feature_layers(num_layers: int) -> tuple[int, int, int]:
    """EAGLE-3's low/mid/high layers of an ``num_layers``-layer target (``hidden_states`` indices)."""
    return (2, num_layers // 2, num_layers - 3)


def vocab_maps(draft_ids: torch.Tensor, vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(d2t (Vd,) int64, t2d (V,) bool)`` for the sorted target ids ``draft_ids`` of a draft
    vocabulary, in the official convention: ``target = draft + d2t[draft]``."""
    draft_ids = draft_ids.sort().values
    d2t = draft_ids - torch.arange(len(draft_ids), dtype=draft_ids.dtype)
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[draft_ids] = True
    return d2t.long(), t2d


class Eagle3Layer(nn.Module):
    """One decoder layer whose attention reads ``cat([norm(embeds), norm(hidden)])`` (2H)."""

    def __init__(self, cfg, layer_cls):
        super().__init__()
        H = cfg.hidden_size
        proto = layer_cls(cfg, layer_idx=0)  # the target's own layer class, for its submodules
        self.self_attn, self.mlp = proto.self_attn, proto.mlp
        norm_cls, eps = type(proto.post_attention_layernorm), cfg.rms_norm_eps
        for name in ("q_proj", "k_proj", "v_proj"):  # 2H in: the token half and the hidden half
            old = getattr(self.self_attn, name)
            setattr(self.self_attn, name, nn.Linear(2 * H, old.out_features, bias=old.bias is not None))
        self.input_layernorm = norm_cls(H, eps=eps)  # on the token embedding
        self.hidden_norm = norm_cls(H, eps=eps)  # on the hidden input
        self.post_attention_layernorm = norm_cls(H, eps=eps)

    def forward(self, hidden: torch.Tensor, token_embeds: torch.Tensor, position_embeddings, attention_mask,
                cache=None, **kwargs) -> torch.Tensor:
        """``hidden, token_embeds (B, T, H)`` -> ``(B, T, H)``."""
        x = torch.cat([self.input_layernorm(token_embeds), self.hidden_norm(hidden)], dim=-1)  # (B, T, 2H)
        attn, _ = self.self_attn(hidden_states=x, position_embeddings=position_embeddings, attention_mask=attention_mask,
                                 cache=cache, **kwargs)
        h = hidden + attn  # the residual stream is the hidden input, not the 2H concatenation
        return h + self.mlp(self.post_attention_layernorm(h))


class Eagle3Head(nn.Module):
    """EAGLE-3 draft head.

    Args:
        target_config: the target's transformers config (its layer classes are reused).
        layer_cls: the target's decoder-layer class; rotary_cls: its rotary-embedding class.
        draft_ids: ``(Vd,)`` sorted target ids of the draft vocabulary.
        feature_layers: the target ``hidden_states`` indices fused by ``fc``.
    """

    def __init__(self, target_config, layer_cls, rotary_cls, draft_ids: torch.Tensor, feature_layers):
        super().__init__()
        cfg = layer_config(target_config)
        H = cfg.hidden_size
        self.layer_config = cfg
        self.feature_layers = tuple(int(i) for i in feature_layers)
        self.fc = nn.Linear(len(self.feature_layers) * H, H, bias=False)
        self.midlayer = Eagle3Layer(cfg, layer_cls)
        self.norm = type(self.midlayer.hidden_norm)(H, eps=cfg.rms_norm_eps)
        self.lm_head = nn.Linear(H, len(draft_ids), bias=False)
        self.rotary = rotary_cls(config=cfg)
        d2t, t2d = vocab_maps(torch.as_tensor(draft_ids, dtype=torch.long), cfg.vocab_size)
        self.register_buffer("d2t", d2t)
        self.register_buffer("t2d", t2d)

    @classmethod
    def for_target(cls, model, draft_ids: torch.Tensor | None = None, feature_layers=None) -> "Eagle3Head":
        """A freshly initialized head for ``model``: ``draft_ids`` default to the whole vocabulary,
        ``feature_layers`` to :func:`default_feature_layers`; the LM head starts as the target's
        rows for the draft vocabulary (a trained readout of the final hidden space)."""
        base = model.get_decoder()
        tcfg = model.config.get_text_config(decoder=True)
        if draft_ids is None:
            draft_ids = torch.arange(tcfg.vocab_size)
        layers = feature_layers or default_feature_layers(tcfg.num_hidden_layers)
        head = cls(model.config, type(base.layers[0]), type(base.rotary_emb), draft_ids, layers)
        with torch.no_grad():
            head.lm_head.weight.copy_(model.get_output_embeddings().weight[head.draft_ids])
        return head.to(next(model.parameters()).device)

    # ---- what the drafter and the trainer use --------------------------------------------------
    @property
    def hidden_size(self) -> int:
        return self.fc.out_features

    @property
    def draft_ids(self) -> torch.Tensor:
        """``(Vd,)`` target id of each draft id."""
        return torch.arange(len(self.d2t), device=self.d2t.device) + self.d2t

    @property
    def vocab_map(self) -> torch.Tensor:
        return self.draft_ids

    def enter(self, features: torch.Tensor) -> torch.Tensor:
        """Fuse target features ``(..., k*H)`` to the head's hidden size ``(..., H)``."""
        return self.fc(features)

    def forward(self, hidden: torch.Tensor, token_embeds: torch.Tensor, position_ids: torch.Tensor,
                attention_mask: torch.Tensor | None, cache=None, **kwargs) -> torch.Tensor:
        """``hidden`` (fused target features after :meth:`enter`, or the head's own previous
        outputs), ``token_embeds (B, T, H)``, ``position_ids (B, T)``, ``attention_mask (B, 1, T, S)``
        bool -> the next hidden states ``(B, T, H)`` (before ``norm``)."""
        pos_emb = self.rotary(hidden, position_ids=position_ids)
        return self.midlayer(hidden, token_embeds, pos_emb, attention_mask, cache=cache,
                             use_cache=cache is not None, **kwargs)

    def pre_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.norm(hidden)

    def draft_weight(self, target_lm_head: nn.Module) -> torch.Tensor:
        """``(Vd, H)``: the head's own LM head (the target's is not used)."""
        return self.lm_head.weight

    def flops_per_token(self) -> int:
        """Multiply-adds x 2 of one drafted token (layer + LM head; fc once per committed token)."""
        n = sum(p.numel() for n_, p in self.named_parameters() if "norm" not in n_ and not n_.startswith("fc."))
        return 2 * n
