"""Growing a tree from any model-like drafter: static choice lists (chain included) and EAGLE-2's
dynamic tree. A drafter supplies ``expand(tree, nodes) -> logits (len(nodes), V')``: its next-token
logits after each of ``nodes`` of the partial ``tree`` (built so far, parents before children).
A drafter with a reduced vocabulary returns logits over it (V' = Vd) and passes ``vocab_map``
(``(Vd,)`` target ids) so that top-k and softmax run over Vd entries, not the full vocabulary."""
from __future__ import annotations

from typing import Callable, Sequence

import torch

from ..tree import Tree, choices_to_parents
from ..verify import probs_from_logits
from .base import Sampling

__all__ = ["grow_static", "grow_dynamic", "select_dynamic", "add_level", "Expand"]

Expand = Callable[[Tree, list[int]], torch.Tensor]


def _children_of(logits: torch.Tensor, k: int, sampling: Sampling, sample: bool):
    """Top-k tokens (deterministic) or k tokens sampled without replacement from q (Gumbel top-k).

    Returns ``(tokens (k',), logq (k',), q (V',) or None)`` in the logits' own index space; k' <= k
    when q has fewer nonzero entries.
    """
    if sample and not sampling.greedy:
        q = probs_from_logits(logits, sampling.temperature, sampling.top_p)  # (V,)
        k = min(k, int((q > 0).sum()))
        u = torch.rand(q.shape, generator=sampling.generator, device=q.device if sampling.generator is None else "cpu").to(q.device)
        gumbel = -torch.log(-torch.log(u.clamp_min(1e-20)))
        keys = torch.where(q > 0, q.log() + gumbel, torch.full_like(q, -float("inf")))
        toks = keys.topk(k).indices  # ordered: a sequential sample without replacement
        return toks, q[toks].log(), q
    logq = torch.log_softmax(logits.float(), dim=-1)
    top = logq.topk(k)
    return top.indices, top.values, None


def _to_target(toks: torch.Tensor, vocab_map: torch.Tensor | None) -> torch.Tensor:
    return toks if vocab_map is None else vocab_map[toks]


def grow_static(root: int, choices: Sequence[Sequence[int]], expand: Expand, sampling: Sampling,
                sample: bool = False, vocab_map: torch.Tensor | None = None, vocab_size: int | None = None) -> Tree:
    """Fill a static shape (Medusa/EAGLE-1 choice list; a chain is ``chain_choices(K)``) level by level.

    Each level is one ``expand`` call over that level's nodes that have children; a node's child of
    rank r gets the r-th best token (or the r-th draw without replacement when ``sample``).
    """
    parents, ranks = choices_to_parents(choices)
    depth = [0] * len(parents)
    for i in range(1, len(parents)):
        depth[i] = depth[parents[i]] + 1
    tokens = [root] + [0] * (len(parents) - 1)
    scores = [0.0] * len(parents)
    q_rows: dict[int, torch.Tensor] = {}
    kids: dict[int, list[int]] = {}
    for i in range(1, len(parents)):
        kids.setdefault(parents[i], []).append(i)
    n_built = 1
    for d in range(max(depth)):
        frontier = [i for i in range(n_built) if depth[i] == d and i in kids]
        built = Tree.from_lists(tokens[:n_built], parents[:n_built])
        logits = expand(built, frontier)  # (F, V)
        sampled = sample and not sampling.greedy
        for f, row in zip(frontier, logits):
            # sampled children must be the FIRST draws without replacement (the verifier's proposal
            # for a child removes exactly its earlier siblings), so rank gaps are closed up
            want = len(kids[f]) if sampled else max(ranks[c] for c in kids[f]) + 1
            toks, logq, q = _children_of(row, want, sampling, sample)
            toks = _to_target(toks, vocab_map)
            if q is not None:
                q_rows[f] = q if vocab_map is None else torch.zeros(vocab_size, dtype=q.dtype,
                                                                      device=q.device).index_copy_(0, vocab_map, q)
            for j, c in enumerate(kids[f]):
                r = j if sampled else ranks[c]
                r = r if r < len(toks) else len(toks) - 1  # tiny support: reuse the last
                tokens[c] = int(toks[r])
                scores[c] = scores[f] + float(logq[r])
        n_built = sum(1 for x in depth if x <= d + 1)
    tree = Tree.from_lists(tokens, parents)
    keep = _dedupe(tree)
    q = None
    if sample and not sampling.greedy:
        V = next(iter(q_rows.values())).shape[-1]
        q = torch.zeros(len(tokens), V)
        for f, row in q_rows.items():
            q[f] = row.cpu()
    tree = Tree(tree.tokens, tree.parents, q, torch.tensor(scores))
    return tree if keep is None else tree.select(keep)


def _dedupe(tree: Tree):
    """Drop duplicate siblings (a tiny support can give the same token twice) with their subtrees."""
    seen, drop = set(), set()
    toks, par = tree.tokens.tolist(), tree.parents.tolist()
    for i in range(1, len(toks)):
        if par[i] in drop or (par[i], toks[i]) in seen:
            drop.add(i)
        else:
            seen.add((par[i], toks[i]))
    if not drop:
        return None
    return torch.tensor([i for i in range(len(toks)) if i not in drop])


def select_dynamic(scores: torch.Tensor, parents: torch.Tensor, total: int) -> torch.Tensor:
    """Keep the best ``total`` non-root nodes by cumulative score, closed under ancestors.

    Returns sorted node indices including the root (0). Because a child's cumulative log-prob never
    exceeds its parent's, the top set is ancestor-closed except for ties; ties are broken towards
    shallower (earlier) nodes, and any missing ancestor is added by construction.
    """
    order = (torch.sort(-scores[1:].float(), stable=True).indices + 1).tolist()  # ties: lower index first
    par = parents.tolist()
    keep: set[int] = {0}
    for i in order:
        if len(keep) - 1 >= total:
            break
        chain, j = [], i
        while j not in keep:
            chain.append(j)
            j = par[j]
        if len(keep) - 1 + len(chain) <= total:
            keep.update(chain)
    return torch.tensor(sorted(keep), dtype=torch.long)


def add_level(tokens: torch.Tensor, parents: torch.Tensor, scores: torch.Tensor, frontier: torch.Tensor,
              logits: torch.Tensor, top_k: int, vocab_map: torch.Tensor | None = None):
    """One level of a top-k tree: each frontier node's ``top_k`` best children by draft log-prob
    (``logits (F, V')``), appended parent-major to the pool ``tokens``, ``parents`` and ``scores``
    (cumulative draft log-prob). Returns the grown pool and the children's edge log-probs ``(F, k)``."""
    top = torch.log_softmax(logits.float(), dim=-1).topk(top_k, dim=-1)  # (F, k)
    logq = top.values.cpu()
    tokens = torch.cat([tokens, _to_target(top.indices, vocab_map).flatten().cpu()])
    parents = torch.cat([parents, frontier.repeat_interleave(logq.shape[1])])
    scores = torch.cat([scores, (scores[frontier][:, None] + logq).flatten()])
    return tokens, parents, scores, logq


def grow_dynamic(root: int, depth: int, top_k: int, total_tokens: int, expand: Expand,
                 sampling: Sampling, vocab_map: torch.Tensor | None = None) -> Tree:
    """EAGLE-2 dynamic tree: expand the ``top_k`` best frontier nodes (by cumulative draft
    log-prob) at each of ``depth`` levels, each with its ``top_k`` best children, then keep the best
    ``total_tokens`` drafted nodes (parents before children)."""
    tokens = torch.tensor([root], dtype=torch.long)  # (N,) the pool grows by F * top_k per level
    parents = torch.tensor([-1], dtype=torch.long)  # (N,)
    scores = torch.zeros(1)  # (N,) cumulative draft log-prob
    frontier = torch.tensor([0], dtype=torch.long)  # (F,)
    for d in range(depth):
        logits = expand(Tree(tokens, parents), frontier.tolist())  # (F, V)
        n0 = len(tokens)
        tokens, parents, scores, _ = add_level(tokens, parents, scores, frontier, logits, top_k, vocab_map)
        if d + 1 < depth:  # best top_k by score, ties towards the earlier node; kept in pool order
            frontier = (n0 + torch.sort(-scores[n0:], stable=True).indices[:top_k]).sort().values
    return Tree(tokens, parents, None, scores).select(select_dynamic(scores, parents, total_tokens))
