"""Drafting with the EAGLE head: level by level, all frontier nodes of a level in one head forward.

The head keeps its own KV cache of committed pairs ``(f_i, x_{i+1})`` (true target features). While
drafting, tree nodes append their entries after the committed ones and attend to the committed
prefix plus their own ancestors; afterwards the cache is cropped back to the committed part, and the
next ``propose`` appends the newly accepted pairs (recomputed from the target's true features).
"""
from __future__ import annotations

import torch
from transformers import DynamicCache

from ..head import DraftHead
from ..target import Target, project
from ..tree import Tree
from .base import Drafter, Sampling
from .shape import TreeShape


class EagleDrafter(Drafter):
    def __init__(self, target: Target, head: DraftHead, shape: TreeShape, sample: bool = False):
        self.target, self.head, self.shape, self.sample = target, head, shape, sample
        self.lm_w = head.lm_weight(target.lm_head).detach()  # (Vd, H)
        self.vocab = target.lm_head.weight.shape[0]
        self.d2t = head.draft_vocab.to(target.device) if head.draft_vocab.numel() else None
        if target.use_kernel:  # the head's tree levels go through the same kernel as the target
            from ..target import register_tree_attention

            head.layer_config._attn_implementation = register_tree_attention()

    def reset(self, prompt_ids: torch.Tensor) -> None:
        super().reset(prompt_ids)
        self.cache = DynamicCache()
        self.pending_f: list[torch.Tensor] = []
        self.pending_x: list[torch.Tensor] = []

    def extend(self, features: torch.Tensor, tokens: torch.Tensor) -> None:
        super().extend(features, tokens)
        self.pending_f.append(features)
        self.pending_x.append(tokens)

    # ---- head calls ---------------------------------------------------------------------------
    def _forward(self, feats: torch.Tensor, toks: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor,
                 tree_mask: torch.Tensor | None = None) -> torch.Tensor:
        """``feats (n, H)``, ``toks (n,)``, ``pos (n,)``, ``mask (n, S)`` -> predicted features ``(n, H)``.
        ``tree_mask``: the tree part of ``mask`` (its last columns), for the tree-attention kernel."""
        emb = self.target.embed(toks)[None]  # (1, n, H)
        extra = {"tree_mask": tree_mask} if tree_mask is not None and self.target.use_kernel else {}
        out = self.head(feats[None].to(emb.dtype), emb, pos[None], mask[None, None], cache=self.cache, **extra)
        return out[0]

    def _logits(self, feats: torch.Tensor) -> torch.Tensor:
        """Draft logits ``(n, Vd)`` over the draft vocabulary (``self.d2t`` maps them to target ids)."""
        return project(feats, self.lm_w).float()

    def catch_up(self) -> torch.Tensor:
        """Run the pending committed pairs through the head; returns the last predicted feature."""
        feats = torch.cat(self.pending_f)  # (m, H)
        toks = torch.cat(self.pending_x)  # (m,)
        self.pending_f, self.pending_x = [], []
        c = self.cache.get_seq_length()
        pos = torch.arange(c, c + len(toks), device=toks.device)
        causal = torch.ones(len(toks), len(toks), dtype=torch.bool, device=toks.device).tril()
        mask = torch.cat([torch.ones(len(toks), c, dtype=torch.bool, device=toks.device), causal], dim=1)
        return self._forward(feats, toks, pos, mask)[-1]

    @torch.no_grad()
    def propose(self, root: int, sampling: Sampling) -> Tree:
        committed = self.cache.get_seq_length() + sum(len(x) for x in self.pending_x)
        root_feat = self.catch_up()  # predicted feature at the root's position
        feat = {0: root_feat}  # node -> predicted feature after it
        slot: dict[int, int] = {}  # node -> index of its entry among the tree's cache entries

        def expand(tree: Tree, nodes: list[int]) -> torch.Tensor:
            new = [n for n in nodes if n not in feat]
            if new:
                par = tree.parents.tolist()
                dev = root_feat.device
                # each new node sees the committed prefix, its ancestors' tree entries and itself;
                # walking up the parents is cheaper than a full ancestor mask of a large pool
                tree_part = torch.zeros(len(new), len(slot), dtype=torch.bool)
                depth = []
                for i, n in enumerate(new):
                    a, d = par[n], 1
                    while a > 0:
                        tree_part[i, slot[a]] = True
                        a, d = par[a], d + 1
                    depth.append(d)
                tree_cols = torch.cat([tree_part, torch.eye(len(new), dtype=torch.bool)], dim=1).to(dev)
                mask = torch.cat([torch.ones(len(new), committed, dtype=torch.bool, device=dev), tree_cols], dim=1)
                pos = committed - 1 + torch.tensor(depth, device=dev)
                f_in = torch.stack([feat[par[n]] for n in new])
                out = self._forward(f_in, tree.tokens[new].to(dev), pos, mask, tree_cols)
                for i, n in enumerate(new):
                    feat[n] = out[i]
                    slot[n] = len(slot)
            return self._logits(torch.stack([feat[n] for n in nodes]))

        tree = self.shape.grow(root, expand, sampling, self.sample, vocab_map=self.d2t, vocab_size=self.vocab)
        Target.crop(self.cache, committed)
        return tree
