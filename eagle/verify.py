"""Tree verification: which drafted branch does the target accept?

Pure functions of (tree, target logits, sampling settings, RNG). Both return the accepted path as
node indices starting at the root, and one extra "bonus" token drawn from the target at the end of
that path, so every decoding step emits ``len(path) - 1 + 1`` new tokens.

* Greedy: walk from the root, each time taking the child whose token equals the argmax of the
  target at the current node. Output is token-for-token plain greedy decoding.
* Sampling: recursive rejection sampling over siblings. At a node with target distribution ``p``
  the children are tried in order; child ``x`` drawn from proposal ``q_i`` is accepted with
  probability ``min(1, p(x) / q_i(x))``, otherwise ``p <- normalize((p - q_i)+)`` and the next
  sibling is tried; if every child is rejected the bonus token is drawn from what is left of ``p``.
  Each stage is a standard speculative-sampling step whose output is distributed as the ``p`` it
  started from, so by induction the emitted token is distributed exactly as the target's. The
  proposal ``q_i`` depends on how the drafter chose the children:
    - sampled without replacement from the draft distribution ``q`` (``tree.q`` is given):
      ``q_i`` is ``q`` with the earlier siblings' tokens removed and renormalized;
    - deterministic (top-k, n-gram, ...; ``tree.q is None``): ``q_i`` is a point mass on the
      child's token, so acceptance is ``p(x)`` and the residual is ``p`` with ``x`` removed.
"""
from __future__ import annotations

import torch

from .tree import Tree

__all__ = ["probs_from_logits", "greedy_accept", "greedy_verify", "greedy_verify_reference", "sample_verify", "verify"]


def probs_from_logits(logits: torch.Tensor, temperature: float, top_p: float = 1.0) -> torch.Tensor:
    """Sampling distribution(s) for ``logits (..., V)``: temperature, then nucleus (top-p) filtering.

    The same transformation must be applied to the target and to a sampling drafter, otherwise the
    drafter proposes from a different distribution than the one verification assumes.
    """
    if temperature <= 0:
        raise ValueError("probs_from_logits needs temperature > 0 (temperature 0 is greedy)")
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    if top_p < 1.0:
        sorted_p, order = probs.sort(dim=-1, descending=True)
        # keep a token if the mass strictly before it is < top_p (the top token is always kept)
        drop_sorted = (sorted_p.cumsum(-1) - sorted_p) >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        probs = probs.masked_fill(drop, 0.0)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def greedy_verify(tree: Tree, logits: torch.Tensor) -> tuple[list[int], int]:
    """Longest path whose tokens equal the target argmax of their parent, plus the bonus token.

    Tensor ops with one host transfer: a node is accepted iff every node on its root path matches
    its parent's argmax (the ancestor table turns "every ancestor" into one reduction), and a
    matching node only counts if no earlier sibling carries the same token (the walk of
    :func:`greedy_verify_reference` takes the first such child). The accepted nodes form one
    root path; the deepest one gives the bonus token.

    Args:
        tree: the candidate tree (T nodes).
        logits: ``(T, V)`` target logits; row i is the next-token prediction after node i.
    Returns:
        ``(path, bonus)``: node indices from the root, and the target's argmax after the last one.
    """
    return greedy_accept(tree, logits.argmax(dim=-1))


def greedy_accept(tree: Tree, best: torch.Tensor) -> tuple[list[int], int]:
    """:func:`greedy_verify` given each node's target argmax ``best (T,)`` instead of the logits
    (what ``TreeOutput.greedy`` gives without computing every logit)."""
    dev = best.device
    tokens, parents = tree.tokens.to(dev), tree.parents.to(dev)
    anc = tree.ancestor_mask().to(dev)  # (T, T)
    T = tokens.shape[0]
    idx = torch.arange(T, device=dev)
    match = tokens == best[parents.clamp(min=0)]  # (T,) node's token is its parent's argmax
    # an earlier sibling with the same token shadows this node
    same = (parents[:, None] == parents[None, :]) & (tokens[:, None] == tokens[None, :]) & (idx[None, :] < idx[:, None])
    ok = (match & ~same.any(dim=1)) | (idx == 0)  # (T,) the root is always on the path
    accepted = ~(anc & ~ok[None, :]).any(dim=1)  # (T,) every node on the root path is ok
    path = idx[accepted]  # increasing index = increasing depth (parents come first)
    out = torch.cat([path, best[path[-1:]]]).tolist()  # the one host transfer
    return out[:-1], out[-1]


def greedy_verify_reference(tree: Tree, logits: torch.Tensor) -> tuple[list[int], int]:
    """The plain walk: from the root, repeatedly take the first child whose token equals the
    target's argmax at the current node (the slow, obviously-correct twin of :func:`greedy_verify`)."""
    best = logits.argmax(dim=-1).tolist()  # (T,)
    tokens = tree.tokens.tolist()
    children = tree.children()
    node, path = 0, [0]
    while True:
        nxt = next((c for c in children[node] if tokens[c] == best[node]), None)
        if nxt is None:
            return path, best[node]
        node = nxt
        path.append(node)


def _uniform(generator: torch.Generator | None) -> float:
    return float(torch.rand((), generator=generator))


def sample_verify(tree: Tree, logits: torch.Tensor, temperature: float, top_p: float = 1.0,
                  generator: torch.Generator | None = None) -> tuple[list[int], int]:
    """Exact multi-candidate tree speculative sampling (see the module docstring).

    Args:
        tree: candidate tree; ``tree.q`` (T, V) when children were sampled without replacement
            from the draft, ``None`` for deterministic children.
        logits: ``(T, V)`` target logits.
        temperature, top_p: applied to the target exactly as the drafter applied them to ``q``.
        generator: torch RNG (CPU) for reproducibility.
    Returns:
        ``(path, bonus)`` as in :func:`greedy_verify`; the emitted tokens are distributed exactly
        as ancestral sampling from the target.
    """
    probs = probs_from_logits(logits, temperature, top_p).cpu().double()  # (T, V)
    q_all = None if tree.q is None else tree.q.detach().cpu().double()
    tokens = tree.tokens.tolist()
    children = tree.children()
    node, path = 0, [0]
    while True:
        p = probs[node].clone()  # (V,)
        q = None if q_all is None else q_all[node].clone()
        accepted = None
        for c in children[node]:
            x = tokens[c]
            qx = 1.0 if q is None else float(q[x])
            if qx > 0 and _uniform(generator) * qx < float(p[x]):  # accept w.p. min(1, p(x)/q(x))
                accepted = c
                break
            # rejected: remove the proposal's mass from p
            if q is None:
                p[x] = 0.0
            else:
                p = (p - q).clamp_(min=0.0)
                q[x] = 0.0
                qs = q.sum()
                q = q / qs if qs > 0 else q
            ps = p.sum()
            if ps <= 0:  # only reachable through rounding: p == q_i exactly (acceptance was certain)
                p = probs[node].clone()
            else:
                p = p / ps
        if accepted is None:
            bonus = int(torch.multinomial(p, 1, generator=generator))
            return path, bonus
        node = accepted
        path.append(node)


def verify(tree: Tree, logits: torch.Tensor, temperature: float = 0.0, top_p: float = 1.0,
           generator: torch.Generator | None = None) -> tuple[list[int], int]:
    """Greedy verification when ``temperature == 0``, exact sampling verification otherwise."""
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if temperature == 0:
        return greedy_verify(tree, logits)
    return sample_verify(tree, logits, temperature, top_p, generator)
