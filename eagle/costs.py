"""Measuring what a verification forward costs on this machine, per tree size.

The same measurement serves the cost curve (``experiments/cost_curve.py``: forward time against tree
size, per runtime path) and the ``auto`` tree policy (eagle/draft/auto.py), which sizes each step's
tree from it: a greedy verification step's forward (``Target.tree_forward`` then the argmax of every
node) over a random tree of T nodes after the prompt in ``cache``, sizes interleaved round by round
so that a slow spell of the machine hits every size alike, median of ``repeats``.
"""
from __future__ import annotations

import statistics
import time

import torch

from .tree import Tree

__all__ = ["random_tree", "verify_costs"]


def random_tree(T: int, vocab: int, gen: torch.Generator) -> Tree:
    """A tree of ``T`` nodes with uniformly random parents and tokens."""
    parents = [-1] + [int(torch.randint(0, i, (1,), generator=gen)) for i in range(1, T)]
    tokens = torch.randint(0, vocab, (T,), generator=gen).tolist()
    return Tree.from_lists(tokens, parents)


@torch.no_grad()
def verify_costs(target, cache, sizes: list[int], repeats: int = 5, layers: tuple[int, ...] | None = None,
                 seed: int = 0) -> tuple[dict[int, float], float]:
    """Median seconds of a greedy verification forward of each tree size in ``sizes`` after the
    prefix already in ``cache`` (left as it was), and the seconds of the first round (a warm-up:
    it compiles each size on a compiled path, and is not counted). ``layers``: the feature layers
    the forward also returns (an EAGLE-3 drafter's), as in decoding."""
    gen = torch.Generator().manual_seed(seed)
    vocab = target.lm_head.weight.shape[0]
    prefix = cache.get_seq_length()
    times: dict[int, list[float]] = {T: [] for T in sizes}
    first = 0.0
    for r in range(repeats + 1):
        t_round = time.perf_counter()
        for T in sizes:
            tree = random_tree(T, vocab, gen)
            t0 = time.perf_counter()
            target.tree_forward(tree, cache, layers).greedy()
            dt = time.perf_counter() - t0
            target.crop(cache, prefix)
            if r:  # round 0 is a warm-up
                times[T].append(dt)
        if r == 0:
            first = time.perf_counter() - t_round
    return {T: statistics.median(v) for T, v in times.items()}, first
