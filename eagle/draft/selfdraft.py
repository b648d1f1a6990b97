"""The target drafting for itself: an oracle that proposes exactly what the target would say.

Used to test the machinery (a K-chain must give tau = K + 1 under greedy decoding) and as the
upper bound of any drafter's acceptance. It keeps its own KV cache of the target."""
from __future__ import annotations

import torch

from ..target import Target
from ..tree import Tree
from .base import Drafter, Sampling
from .shape import TreeShape


class SelfDrafter(Drafter):
    def __init__(self, target: Target, shape: TreeShape, sample: bool = False):
        self.target, self.shape, self.sample = target, shape, sample

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
