"""The target drafting for itself: an oracle that proposes exactly what the target would say.

Used to test the machinery (a K-chain must give tau = K + 1 under greedy decoding) and as the
upper bound of any drafter's acceptance. It keeps its own KV cache of the target."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..target import Target
from ..tree import Tree
from .base import Drafter, Sampling, register_drafter
from .shape import TreeShape


@register_drafter("self")
class SelfDrafter(Drafter):
    """``drafter.type: self``: ``target`` drafts the tree ``shape`` for itself."""

    @dataclass
    class Options:
        sample: bool = False  # sample children without replacement from q (temperature > 0) instead of top-k

    def __init__(self, target: Target, tree: TreeShape, options: Options | None = None):
        super().__init__(target, tree, options)
        self.sample = self.options.sample

    def reset(self, prompt_ids: torch.Tensor) -> None:
        super().reset(prompt_ids)
        self.cache = self.target.new_cache()

    def propose(self, root: int, sampling: Sampling) -> Tree:
        cached = self.cache.get_seq_length()
        pending = self.history[cached:-1]  # everything but the root is committed context
        if pending:
            self.target.prefill(torch.tensor(pending, device=self.target.device), self.cache)
        prefix_len = self.cache.get_seq_length()

        def expand(tree: Tree, nodes: list[int]) -> torch.Tensor:
            out = self.target.tree_forward(tree, self.cache)
            Target.crop(self.cache, prefix_len)
            return out.logits[nodes]

        return self.shape.grow(root, expand, sampling, self.sample, policy=self.tree_policy)
