"""Prompt-lookup (n-gram) drafting: continue the text the way an earlier occurrence of its last n
tokens continued. Several matching continuations become the branches of a tree."""
from __future__ import annotations

import numpy as np

from dataclasses import dataclass

from ..tree import Tree
from .base import Drafter, Sampling, register_drafter


@register_drafter("ngram")
class NgramDrafter(Drafter):
    """``drafter.type: ngram``. Drafts ``tree.depth`` tokens per continuation whatever the shape
    (its trees are tries of continuations, not grown); needs no target."""

    grows_tree = False
    # extra continuations keyed by the last token, tried after the text's own matches: e.g. a
    # lookahead drafter's pool (eagle.draft.lookahead.NgramPool: ``get(token, k)``); None: unused
    pool = None

    @dataclass
    class Options:
        max_ngram: int = 3  # suffix lengths tried, longest first, down to min_ngram
        min_ngram: int = 1
        branches: int = 1  # at most this many distinct continuations (tree branches)

        def validate(self) -> None:
            if not 1 <= self.min_ngram <= self.max_ngram:
                raise ValueError("drafter needs 1 <= min_ngram <= max_ngram")
            if self.branches < 1:
                raise ValueError("drafter.branches must be >= 1")

    def __init__(self, target, tree, options: Options | None = None):
        super().__init__(target, tree, options)
        o = self.options
        self.max_ngram, self.min_ngram, self.depth, self.branches = o.max_ngram, o.min_ngram, tree.depth, o.branches

    @classmethod
    def max_nodes(cls, tree, options) -> int:
        return 1 + tree.depth * options.branches

    def continuations(self) -> list[list[int]]:
        hist = np.asarray(self.history, dtype=np.int64)
        found: list[list[int]] = []
        for n in range(min(self.max_ngram, len(hist) - 1), self.min_ngram - 1, -1):
            suffix = hist[-n:]
            windows = np.lib.stride_tricks.sliding_window_view(hist[:-1], n)  # (L - n, n)
            starts = np.flatnonzero((windows == suffix).all(axis=1))[::-1]  # most recent first
            for s in starts:
                cont = hist[s + n: s + n + self.depth].tolist()
                if cont and not any(f[: len(cont)] == cont for f in found):
                    found.append(cont)
                    if len(found) >= self.branches:
                        return found
        if self.pool is not None:
            for cont in self.pool.get(int(hist[-1]), self.branches):
                cont = list(cont[: self.depth])
                if len(found) < self.branches and not any(f[: len(cont)] == cont for f in found):
                    found.append(cont)
        return found

    def propose(self, root: int, sampling: Sampling) -> Tree:
        return Tree.trie(root, self.continuations())
