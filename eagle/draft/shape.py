"""Tree shapes as config: a chain of K, a static choice list, or EAGLE-2's dynamic tree."""
from __future__ import annotations

from dataclasses import dataclass, field

from ..tree import Tree, chain_choices, choices_to_parents
from .base import Sampling
from .auto import grow_auto
from .grow import Expand, grow_dynamic, grow_static

SHAPES = ("chain", "static", "dynamic", "auto")


@dataclass
class TreeShape:
    """``shape``: chain (``depth`` tokens), static (``choices``), dynamic (``depth``, ``top_k``,
    ``total_tokens``), or auto (sized each step from measured costs and calibrated acceptance,
    eagle/draft/auto.py; ``depth``, ``top_k`` and ``total_tokens`` are its bounds)."""

    shape: str = "chain"
    depth: int = 4
    choices: list[list[int]] = field(default_factory=list)
    top_k: int = 10
    total_tokens: int = 60

    def validate(self) -> None:
        if self.shape not in SHAPES:
            raise ValueError(f"tree.shape must be one of {SHAPES}, got '{self.shape}'")
        if self.depth < 1:
            raise ValueError(f"tree.depth must be >= 1, got {self.depth}")
        if self.shape == "static":
            if not self.choices:
                raise ValueError("tree.shape 'static' needs a non-empty tree.choices list")
            choices_to_parents(self.choices)  # raises on malformed lists
        if self.shape in ("dynamic", "auto") and (self.top_k < 1 or self.total_tokens < 1):
            raise ValueError("tree.top_k and tree.total_tokens must be >= 1")

    @property
    def max_nodes(self) -> int:
        """The most nodes (root included) a tree of this shape can have: a chain's ``depth + 1``, a
        static list's choices + 1, the dynamic tree's ``total_tokens + 1`` (or its whole candidate
        pool, ``top_k`` at the first level and ``top_k**2`` at each later one, when that is smaller)."""
        if self.shape in ("dynamic", "auto"):
            return 1 + min(self.total_tokens, self.top_k + (self.depth - 1) * self.top_k ** 2)
        if self.shape == "static":
            return 1 + len(self.choices)
        return 1 + self.depth

    def grow(self, root: int, expand: Expand, sampling: Sampling, sample: bool = False, vocab_map=None,
             vocab_size: int | None = None, policy=None) -> Tree:
        """Grow this shape from ``root``; ``vocab_map``/``vocab_size``: see :mod:`eagle.draft.grow`;
        ``policy``: the decoder's :class:`eagle.draft.auto.AutoTreePolicy` (shape auto)."""
        if self.shape == "auto":
            return grow_auto(root, self.depth, self.top_k, expand, sampling, policy, vocab_map)
        if self.shape == "dynamic":
            return grow_dynamic(root, self.depth, self.top_k, self.total_tokens, expand, sampling, vocab_map)
        choices = chain_choices(self.depth) if self.shape == "chain" else self.choices
        return grow_static(root, choices, expand, sampling, sample, vocab_map, vocab_size)
