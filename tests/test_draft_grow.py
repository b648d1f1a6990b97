"""EAGLE-2 tree growth (eagle/draft/grow.py): select_dynamic against an exhaustive search, grow_dynamic
against a slow EAGLE-2 reference written over token paths."""
from __future__ import annotations

import itertools
import random
import zlib

import pytest
import torch

from eagle.draft import Sampling
from eagle.draft.grow import grow_dynamic, select_dynamic
from eagle.tree import Tree

from conftest import random_parents_py


# ------------------------------------------------------------------------------------------------
# select_dynamic against an exhaustive search
# ------------------------------------------------------------------------------------------------


def _closed(nodes, parents) -> bool:
    s = set(nodes) | {0}
    return all(parents[i] in s for i in nodes)


def brute_force_best(scores: list[float], parents: list[int], k: int) -> float:
    """Best score sum over all ancestor-closed sets of ``k`` non-root nodes (exhaustive)."""
    best = None
    for comb in itertools.combinations(range(1, len(scores)), k):
        if _closed(comb, parents):
            s = sum(scores[i] for i in comb)
            best = s if best is None else max(best, s)
    return best


def monotone_scores(parents: list[int], rng: random.Random, ties: bool) -> list[float]:
    scores = [0.0]
    for i in range(1, len(parents)):
        # multiples of 1/4: exact in float32 (so ties are real ties), strictly negative log-probs
        logp = -rng.choice([0.25, 0.5, 0.75]) if ties else -rng.uniform(0.01, 3.0)
        scores.append(scores[parents[i]] + logp)
    return scores


CASES = [(T, seed, ties) for T in range(2, 13) for seed in range(4) for ties in (True, False)]


@pytest.mark.parametrize("T, seed, ties", CASES)
def test_select_dynamic_matches_brute_force(T, seed, ties):
    rng = random.Random(1000 * T + seed + (7 if ties else 0))
    parents = random_parents_py(T, rng)
    scores = monotone_scores(parents, rng, ties)
    sc = torch.tensor(scores, dtype=torch.float32)
    for total in sorted({1, 2, T // 2, T - 2, T - 1, T, T + 3} - {0, -1}):
        if total < 1:
            continue
        keep = select_dynamic(sc, torch.tensor(parents), total).tolist()
        k = min(total, T - 1)
        assert keep[0] == 0 and keep == sorted(set(keep)), keep
        assert len(keep) - 1 == k, (keep, total)
        assert _closed(keep[1:], parents)
        assert sum(scores[i] for i in keep[1:]) == pytest.approx(brute_force_best(scores, parents, k), abs=1e-9)
        # monotone scores: exactly the top-k by score, ties towards the lower index
        top = sorted(range(1, T), key=lambda i: (-scores[i], i))[:k]
        assert keep == [0] + sorted(top)
        # the selection gives a valid tree
        Tree.from_lists(list(range(T)), parents).select(torch.tensor(keep))


# ------------------------------------------------------------------------------------------------
# grow_dynamic against a slow EAGLE-2 reference
# ------------------------------------------------------------------------------------------------


VG = 20


def path_logits(path: tuple[int, ...]) -> torch.Tensor:
    """Deterministic random logits, a function of the token path only."""
    g = torch.Generator().manual_seed(zlib.crc32(repr(path).encode()))
    return torch.randn(VG, generator=g) * 2.0


def eagle2_reference(root: int, depth: int, top_k: int, total: int) -> dict[tuple, float]:
    """EAGLE-2 written over token paths: expand the top_k best nodes of each level (by cumulative
    log-prob) with their top_k children, then rerank every drafted node and keep the best ``total``."""
    score = {(root,): 0.0}
    frontier = [(root,)]
    drafted = []
    for _ in range(depth):
        level = []
        for p in frontier:
            logp = torch.log_softmax(path_logits(p).float(), dim=-1)
            best = sorted(range(VG), key=lambda t: -float(logp[t]))[:top_k]
            for t in best:
                score[p + (t,)] = score[p] + float(logp[t])
                level.append(p + (t,))
        drafted += level
        frontier = sorted(level, key=lambda q: -score[q])[:top_k]
    keep = sorted(drafted, key=lambda q: -score[q])[:total]
    return {q: score[q] for q in keep}


def _path_tokens(tree: Tree, node: int) -> tuple[int, ...]:
    toks = tree.tokens.tolist()
    return tuple(toks[n] for n in tree.path_to(node))


GROW = [(3, 2, 1), (3, 2, 5), (3, 2, 10), (3, 2, 50), (4, 3, 8), (4, 3, 20), (4, 3, 30), (3, 4, 12),
        (3, 4, 36), (4, 4, 25), (1, 3, 2), (1, 3, 3)]


@pytest.mark.parametrize("depth, top_k, total", GROW)
@pytest.mark.parametrize("root", [0, 7])
def test_grow_dynamic_matches_reference(depth, top_k, total, root):
    calls = []

    def expand(tree: Tree, nodes: list[int]) -> torch.Tensor:
        calls.append(list(nodes))
        assert all(n < len(tree) for n in nodes)
        return torch.stack([path_logits(_path_tokens(tree, n)) for n in nodes])

    tree = grow_dynamic(root, depth, top_k, total, expand, Sampling())
    ref = eagle2_reference(root, depth, top_k, total)
    pool = top_k + (depth - 1) * top_k * top_k
    assert len(calls) == depth
    assert int(tree.tokens[0]) == root and int(tree.parents[0]) == -1
    assert len(tree) - 1 == min(total, pool) == len(ref)
    par = tree.parents.tolist()
    assert all(0 <= par[i] < i for i in range(1, len(tree)))  # parents before children
    got = {_path_tokens(tree, n): float(tree.scores[n]) for n in range(1, len(tree))}
    assert set(got) == set(ref)
    for p, s in ref.items():
        assert got[p] == pytest.approx(s, abs=1e-5)
