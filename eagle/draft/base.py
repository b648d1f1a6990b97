"""The drafter interface: everything the decoding loop needs from a drafter, nothing more."""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

from ..tree import Tree

__all__ = ["Drafter", "NoDrafter", "Sampling"]


@dataclass(frozen=True)
class Sampling:
    """How tokens are chosen: greedy when ``temperature == 0``; drafts must use the same settings."""

    temperature: float = 0.0
    top_p: float = 1.0
    generator: torch.Generator | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


class Drafter(ABC):
    """A drafter proposes a candidate tree rooted at the last emitted token.

    The decoder drives it with three calls:

    * ``reset(prompt_ids)`` once per generation;
    * ``extend(features, tokens)`` whenever target positions become final: ``features (m, H)`` are
      the target's last hidden states at those positions (or, when the drafter sets
      ``feature_layers``, the hidden states entering those target layers, concatenated:
      ``(m, k*H)``) and ``tokens (m,)`` the token that follows each of them (for the prompt:
      ``prompt[1:] + [first token]``);
    * ``propose(root, sampling) -> Tree`` once per step.
    """

    # transformers ``hidden_states`` indices the drafter reads instead of the final feature
    feature_layers: tuple[int, ...] | None = None
    # ``tree.shape: auto``: the decoder's AutoTreePolicy (eagle/draft/auto.py), which a drafter that
    # grows its tree through ``TreeShape.grow`` passes on as ``policy=``
    tree_policy = None

    def reset(self, prompt_ids: torch.Tensor) -> None:
        # history[i + 1] is always the token that follows position i; the first ``extend`` call
        # brings the rest of the prompt and the first generated token.
        self.history: list[int] = prompt_ids[:1].tolist()

    def extend(self, features: torch.Tensor, tokens: torch.Tensor) -> None:
        self.history.extend(tokens.tolist())

    @abstractmethod
    def propose(self, root: int, sampling: Sampling) -> Tree:
        ...


class NoDrafter(Drafter):
    """Plain decoding through the same loop: a one-node tree, one token per target forward."""

    def propose(self, root: int, sampling: Sampling) -> Tree:
        return Tree.chain([root])
