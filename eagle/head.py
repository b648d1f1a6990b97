"""The EAGLE draft head: ``fc([embed(next token); target feature]) -> one decoder layer``.

The decoder layer is the target's own transformers class (built from a one-layer copy of the
target config), with its first input norm removed as in EAGLE. The target's embedding and LM head
are shared and frozen: they are arguments of the calls, never stored in the head or its checkpoint.

Pairs and positions: the head's input at position i is the pair ``(f_i, x_{i+1})`` (the target
feature at position i and the token that follows it); its output predicts ``f_{i+1}``.
"""
from __future__ import annotations

import copy
import json
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from .io import replace_dir

__all__ = ["DraftHead", "HeadConfig", "load_head", "save_head", "HeadMismatchError"]


class HeadMismatchError(ValueError):
    """A head checkpoint that does not fit the target it is loaded onto."""


@dataclass
class HeadConfig:
    target: str  # name or path of the target the head was trained for
    model_type: str
    hidden_size: int
    vocab_size: int
    draft_vocab: list[int] = field(default_factory=list)  # draft id -> target id; empty = full vocab
    target_config: dict = field(default_factory=dict)  # the target's text config (for the layer)

    def to_json(self) -> str:
        return json.dumps(asdict(self))


def _layer_config(target_config):
    cfg = copy.deepcopy(target_config.get_text_config(decoder=True))
    cfg.num_hidden_layers = 1
    if getattr(cfg, "layer_types", None):
        cfg.layer_types = ["full_attention"]
    if hasattr(cfg, "sliding_window"):
        cfg.sliding_window = None
    cfg._attn_implementation = "sdpa"
    return cfg


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
        cfg = _layer_config(target_config)
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

    def flops_per_token(self) -> int:
        """Multiply-adds x 2 of one drafted token (fc + layer + draft LM head), attention excluded."""
        n_params = sum(p.numel() for n, p in self.named_parameters() if "norm" not in n)
        vd = self.draft_vocab.numel() or getattr(self.layer_config, "vocab_size", 0)
        return 2 * (n_params + vd * self.hidden_size)


def save_head(head: DraftHead, folder: str | Path, config: HeadConfig, dtype: torch.dtype | None = None) -> None:
    """Write ``model.safetensors`` + ``config.json`` atomically into ``folder`` (weights cast to
    ``dtype`` when given, e.g. float16 to halve a shipped checkpoint; loading casts back)."""
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=folder.name + ".tmp", dir=folder.parent))
    state = {k: v.detach().cpu().to(dtype or v.dtype).contiguous() for k, v in head.state_dict().items()
             if k != "draft_vocab" and not k.startswith("rotary.")}
    save_file(state, str(tmp / "model.safetensors"))
    (tmp / "config.json").write_text(config.to_json())
    replace_dir(tmp, folder)


def load_head(folder: str | Path, model) -> DraftHead:
    """Load a head checkpoint onto ``model``; a head trained for another hidden size or vocabulary
    raises :class:`HeadMismatchError` naming the mismatch."""
    folder = Path(folder)
    if not (folder / "config.json").exists():
        raise FileNotFoundError(f"no head checkpoint at {folder} (expected config.json + model.safetensors)")
    cfg = HeadConfig(**json.loads((folder / "config.json").read_text()))
    tcfg = model.config.get_text_config(decoder=True)
    if cfg.hidden_size != tcfg.hidden_size:
        raise HeadMismatchError(f"head {folder} was trained for hidden size {cfg.hidden_size}, "
                                f"the target has {tcfg.hidden_size}")
    if cfg.vocab_size != tcfg.vocab_size:
        raise HeadMismatchError(f"head {folder} was trained for a vocabulary of {cfg.vocab_size}, "
                                f"the target has {tcfg.vocab_size}")
    if cfg.model_type != tcfg.model_type:
        raise HeadMismatchError(f"head {folder} was trained for a '{cfg.model_type}' target, this one is "
                                f"'{tcfg.model_type}'")
    head = DraftHead.for_target(model, torch.tensor(cfg.draft_vocab, dtype=torch.long) if cfg.draft_vocab else None)
    state = load_file(str(folder / "model.safetensors"))
    missing, unexpected = head.load_state_dict(state, strict=False)
    missing = [k for k in missing if k != "draft_vocab" and not k.startswith("rotary.")]
    if missing or unexpected:
        raise HeadMismatchError(f"head {folder} does not match the target's layer: missing {missing}, "
                                f"unexpected {unexpected}")
    head.config = cfg
    return head.eval()
