"""Drafters behind one small interface (:class:`Drafter`), built from a config by name."""
from __future__ import annotations

import torch

from .base import Drafter, NoDrafter, Sampling
from .ngram import NgramDrafter
from .selfdraft import SelfDrafter
from .shape import TreeShape

__all__ = ["Drafter", "NoDrafter", "NgramDrafter", "SelfDrafter", "Sampling", "TreeShape", "build_drafter"]


def build_drafter(config, target) -> Drafter:
    """The drafter a :class:`eagle.config.DecodeConfig` asks for, bound to ``target``."""
    d = config.drafter
    if d.type == "none":
        return NoDrafter()
    if d.type == "self":
        return SelfDrafter(target, config.tree, sample=d.sample)
    if d.type == "ngram":
        return NgramDrafter(d.max_ngram, d.min_ngram, config.tree.depth, d.branches)
    if d.type in ("eagle", "eagle3"):
        from ..heads import load_head
        from ..heads.drafter import EagleDrafter

        head = load_head(d.head, target.model).to(target.device)
        kind = "eagle3" if head.feature_layers else "eagle"
        if kind != d.type:
            raise ValueError(f"head {d.head} is an {kind} head: use drafter type '{kind}', not '{d.type}'")
        if d.dtype == "auto":  # the faster of float32 and bfloat16 for a level's products here
            from ..heads.drafter import fastest_dtype

            dtype = fastest_dtype(target, head, rows=config.tree.top_k)
        else:
            dtype = getattr(torch, d.dtype) if d.dtype else None
        return EagleDrafter(target, head, config.tree, sample=d.sample, dtype=dtype, prompt_vocab=d.prompt_vocab)
    if d.type == "medusa":
        from ..heads.medusa import MedusaDrafter, load_medusa

        return MedusaDrafter(target, load_medusa(d.head, target.model), config.tree, sample=d.sample,
                             dtype=getattr(torch, d.dtype) if d.dtype else None)
    if d.type == "model":
        from ..draft_model import is_draft_model, load_draft_model
        from ..models import load_model
        from ..target import Target

        if is_draft_model(d.model):  # distilled by `eagle distill`: shares the target's embedding
            small = load_draft_model(d.model, target.model)
        else:  # any transformers checkpoint with the target's vocabulary
            small = load_model(d.model, device=target.device, dtype=target.lm_head.weight.dtype)
        if small.get_output_embeddings().weight.shape[0] != target.lm_head.weight.shape[0]:
            raise ValueError(f"draft model {d.model} has another vocabulary size than the target")
        return SelfDrafter(Target(small, config.attention), config.tree, sample=d.sample)
    raise ValueError(f"unknown drafter type '{d.type}'")
