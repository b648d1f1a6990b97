"""Lookahead decoding: draft-free speculation from Jacobi iteration and an n-gram pool.

Each step's target forward carries two branches under one mask:

* the **lookahead branch**, side rows (:class:`eagle.tree.SideRows`) holding a 2-D window of the
  last ``level - 1`` Jacobi iterations over ``window`` future positions. Cell ``(j, i)`` (level j,
  column i) sits at offset ``i + j + 1`` after the root and sees level 0's columns ``0..i`` and its
  own column's levels ``1..j``: exactly one token per offset ``1..i+j+1``, so every cell continues
  ``prefix + root + its trajectory``. The last level's greedy outputs are the next Jacobi
  iteration: each column's trajectory plus that output is an ``level``-gram for the pool.
* the **verification branch**, the tree: up to ``guesses`` pool n-grams that start with the root,
  as a trie. Only this branch is verified (point-mass children, ``q = None``), so greedy output is
  plain decoding's and sampling is exact whatever the pool holds.

The window lives at absolute positions (``start`` = level 0, column 0), so it needs no change when
the root advances by one token; when a step accepts more, the columns now in the past are dropped
and fresh ones (tokens of the text, as the method initialises its window) are appended.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from ..tree import SideRows, Tree
from .base import Drafter, Sampling, register_drafter

__all__ = ["LookaheadDrafter", "NgramPool", "window_rows"]


class NgramPool:
    """N-grams keyed by their first token: ``key -> continuations`` (tuples of ``n - 1`` tokens),
    most recent first, at most ``cap`` per key (the oldest is dropped; a repeat moves to the front)."""

    def __init__(self, n: int, cap: int):
        self.n, self.cap = n, cap
        self.table: dict[int, list[tuple[int, ...]]] = {}

    def add(self, gram) -> None:
        """Record ``gram`` (``n`` tokens) as the most recent n-gram starting with ``gram[0]``."""
        if self.cap < 1:
            return
        key, cont = int(gram[0]), tuple(int(t) for t in gram[1:])
        conts = self.table.setdefault(key, [])
        if cont in conts:
            conts.remove(cont)
        conts.insert(0, cont)
        del conts[self.cap:]

    def get(self, key: int, k: int) -> list[tuple[int, ...]]:
        """Up to ``k`` continuations of ``key``, most recent first."""
        return self.table.get(int(key), [])[:k]

    def __len__(self) -> int:
        return sum(len(c) for c in self.table.values())


def window_rows(levels: list[list[int]], first_offset: int = 1) -> SideRows:
    """The side rows of a Jacobi window ``levels`` (l lists of W tokens), level-major: row
    ``j * W + i`` is cell ``(j, i)`` at offset ``first_offset + i + j``, seeing level 0's columns
    ``0..i`` and column i's levels ``1..j`` (itself included)."""
    l, W = len(levels), len(levels[0])
    j = torch.arange(l).repeat_interleave(W)  # (S,) level of each row
    i = torch.arange(W).repeat(l)  # (S,) column of each row
    same_col = (i[:, None] == i[None, :]) & (j[None, :] <= j[:, None])  # (S, S) own trajectory
    level0 = (j[None, :] == 0) & (i[None, :] <= i[:, None])  # (S, S) the first level up to the column
    return SideRows(torch.tensor([t for lv in levels for t in lv], dtype=torch.long), first_offset + i + j,
                    same_col | level0)


@register_drafter("lookahead")
class LookaheadDrafter(Drafter):
    """``drafter: {type: lookahead, level: N, window: W, guesses: G}``: lookahead decoding (Jacobi
    window + n-gram pool); needs no draft model and ignores the tree shape."""

    grows_tree = False

    @dataclass
    class Options:
        level: int = 4  # N: the n-gram size; the window keeps the last N - 1 Jacobi iterations
        window: int = 5  # W: future positions the window guesses at once
        guesses: int = 5  # G: pool n-grams verified per step (and kept per first token)
        from_text: bool = True  # also pool the n-grams of the prompt and the accepted text

        def validate(self) -> None:
            if self.level < 2:
                raise ValueError(f"drafter.level must be >= 2, got {self.level}")
            if self.window < 1:
                raise ValueError(f"drafter.window must be >= 1, got {self.window}")
            if self.guesses < 0:
                raise ValueError(f"drafter.guesses must be >= 0, got {self.guesses}")

    def __init__(self, target=None, tree=None, options: Options | None = None):
        super().__init__(target, tree, options)
        o = self.options
        self.n, self.W, self.G = o.level, o.window, o.guesses

    @classmethod
    def max_nodes(cls, tree, options) -> int:
        # the root, G continuations of N - 1 tokens, and the full window of (N - 1) x W side rows
        return 1 + options.guesses * (options.level - 1) + (options.level - 1) * options.window

    def reset(self, prompt_ids: torch.Tensor) -> None:
        super().reset(prompt_ids)
        self.pool = NgramPool(self.n, self.G)
        self.rng = random.Random(0)  # the fresh window cells: deterministic for a given text
        self.levels: list[list[int]] = []  # the window, oldest level first; empty until the first propose
        self.start = 0  # absolute position of cell (0, 0); cell (j, i) sits at start + i + j
        self.pooled = 0  # history[:pooled + n - 1] has had its n-grams pooled
        self.proposed: list[list[int]] | None = None  # the window the last proposed tree carried

    def extend(self, features: torch.Tensor, tokens: torch.Tensor) -> None:
        super().extend(features, tokens)
        if self.options.from_text:
            h = self.history
            for s in range(self.pooled, len(h) - self.n + 1):
                self.pool.add(h[s: s + self.n])
            self.pooled = max(self.pooled, len(h) - self.n + 1)

    def _fresh(self, count: int) -> list[int]:
        return [self.history[self.rng.randrange(len(self.history))] for _ in range(count)]

    def _align(self) -> None:
        """Move the window's level 0 to the position right after the root: drop the columns now
        in the past, append fresh ones (text tokens) to keep W columns."""
        root_pos = len(self.history) - 1  # history ends with the root
        drop = root_pos + 1 - self.start
        if not self.levels or drop >= self.W:  # (re)start: one level of text tokens, filled by Jacobi steps
            self.levels = [self._fresh(self.W)]
        elif drop > 0:
            self.levels = [lv[drop:] + self._fresh(drop) for lv in self.levels]
        self.start = root_pos + 1

    def propose(self, root: int, sampling: Sampling) -> Tree:
        tree = Tree.trie(root, self.pool.get(root, self.G))
        self._align()
        self.proposed = [list(lv) for lv in self.levels]
        return tree.with_side(window_rows(self.proposed))

    def observe_side(self, side) -> None:
        """One Jacobi step: the last level's greedy outputs become the newest level; once the window
        is full, each column's trajectory plus its output is pooled and the oldest level dropped."""
        levels, self.proposed = self.proposed, None
        if levels is None:
            return
        out = side.greedy().view(len(levels), self.W)[-1].tolist()  # (W,) cell (l-1, i) predicts start + i + l
        if len(levels) == self.n - 1:
            for i in range(self.W):
                self.pool.add([lv[i] for lv in levels] + [out[i]])
            levels = levels[1:]
            self.start += 1  # the old level 1 is the new level 0, one position later
        self.levels = levels + [out]
