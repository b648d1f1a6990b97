"""Prompt-lookup (n-gram) drafting: continue the text the way an earlier occurrence of its last n
tokens continued. Several matching continuations become the branches of a tree."""
from __future__ import annotations

import numpy as np

from ..tree import Tree
from .base import Drafter, Sampling


class NgramDrafter(Drafter):
    """Args:
        max_ngram / min_ngram: suffix lengths tried, longest first.
        depth: tokens drafted per continuation.
        branches: at most this many distinct continuations (tree branches).
    """

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1, depth: int = 5, branches: int = 1):
        self.max_ngram, self.min_ngram, self.depth, self.branches = max_ngram, min_ngram, depth, branches

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
        return found

    def propose(self, root: int, sampling: Sampling) -> Tree:
        tokens, parents = [root], [-1]
        trie: dict[tuple[int, int], int] = {}
        for cont in self.continuations():
            node = 0
            for t in cont:
                if (node, t) not in trie:
                    tokens.append(t)
                    parents.append(node)
                    trie[(node, t)] = len(tokens) - 1
                node = trie[(node, t)]
        return Tree.from_lists(tokens, parents)
