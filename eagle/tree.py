"""Candidate trees: the data structure every drafter produces and the verifier consumes.

A tree is stored in topological order as two parallel arrays: ``tokens[T]`` and ``parents[T]``.
Node 0 is the root: the last token already emitted by the decoder but not yet in the target's
KV cache. ``parents[0] == -1`` and ``parents[i] < i`` for every other node, so a parent always comes
before its children (this is what lets one left-to-right pass compute depths and masks).

Everything else (depth, positions, the ancestor mask, root-to-leaf paths) is derived, never stored.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Sequence

import torch

__all__ = ["Tree", "SideRows", "choices_to_parents", "chain_choices", "pack_bits", "ancestors_from_parents"]


def ancestors_from_parents(parents: torch.Tensor) -> torch.Tensor:
    """``(T, T)`` bool ancestor table (self included) of ``parents (T,)`` as tensor ops.

    Starts from "self or parent" and squares the relation ``ceil(log2 T)`` times (path doubling):
    after k squarings every ancestor up to distance 2^k is reached. No Python loop over nodes, so
    it runs on the parents' device; a few (T, T) products for the trees of a decoding step.
    """
    T = parents.shape[0]
    idx = torch.arange(T, device=parents.device)
    step = torch.zeros(T, T, dtype=torch.float32, device=parents.device)  # (T, T) self or parent
    step[idx, idx] = 1.0
    has_parent = parents >= 0
    step[idx[has_parent], parents[has_parent]] = 1.0
    for _ in range(max(T - 1, 1).bit_length()):
        step = ((step @ step) > 0).float()  # reach doubles each round
    return step > 0


def pack_bits(mask: torch.Tensor) -> torch.Tensor:
    """Bit-pack the last dim of a bool mask into int32 words.

    ``mask (..., T, S)`` -> ``(..., T, ceil(S / 32))`` int32 where bit ``b`` of word ``w`` in row ``i``
    is ``mask[..., i, 32 * w + b]``. This is the layout the Triton tree-attention kernel reads.
    """
    *lead, T, S = mask.shape
    W = (S + 31) // 32
    padded = torch.zeros(*lead, T, W * 32, dtype=torch.int64, device=mask.device)
    padded[..., :S] = mask.to(torch.int64)
    weights = torch.ones(32, dtype=torch.int64, device=mask.device) << torch.arange(32, device=mask.device)
    words = (padded.view(*lead, T, W, 32) * weights).sum(-1)  # (..., T, W) in [0, 2^32)
    # reinterpret the unsigned 32-bit value as a signed int32 (two's complement)
    words = torch.where(words >= 2**31, words - 2**32, words)
    return words.to(torch.int32)


def chain_choices(k: int) -> list[list[int]]:
    """The choice list of a chain of ``k`` drafted tokens: ``[[0], [0, 0], ...]``."""
    return [[0] * d for d in range(1, k + 1)]


def choices_to_parents(choices: Sequence[Sequence[int]]) -> tuple[list[int], list[int]]:
    """Turn a Medusa/EAGLE-1 choice list into ``(parents, ranks)`` for a tree with a root at 0.

    Each choice is a path of child ranks from the root, e.g. ``[0, 1]`` is "the second-best child
    of the best child of the root". Every prefix of a path must itself be a choice. Nodes are
    ordered by depth, then lexicographically, so parents come before children. ``ranks[i]`` is the
    rank of node ``i`` among its siblings (``-1`` for the root).
    """
    paths = [tuple(int(r) for r in c) for c in choices]
    if len(set(paths)) != len(paths):
        raise ValueError("tree choices contain a duplicate path")
    for p in paths:
        if len(p) == 0:
            raise ValueError("tree choices contain an empty path")
        if min(p) < 0:
            raise ValueError(f"tree choice {list(p)} has a negative rank")
    known = set(paths)
    for p in paths:
        if len(p) > 1 and p[:-1] not in known:
            raise ValueError(f"tree choice {list(p)} has no parent path {list(p[:-1])} in the list")
    ordered = sorted(paths, key=lambda p: (len(p), p))
    index = {(): 0}
    parents, ranks = [-1], [-1]
    for i, p in enumerate(ordered, start=1):
        index[p] = i
        parents.append(index[p[:-1]])
        ranks.append(p[-1])
    return parents, ranks


@dataclass(frozen=True)
class SideRows:
    """Rows a target forward runs beside a tree without being part of it (lookahead decoding's
    Jacobi window): their outputs go back to the drafter, never to the verifier.

    Attributes:
        tokens: ``(S,)`` int64 token ids.
        offsets: ``(S,)`` int64 positions after the prefix (the root sits at offset 0, so a side
            row continuing the root's text has offset >= 1): position = ``prefix_len + offset``.
        sees: ``(S, S)`` bool; ``[i, j]``: side row i attends side row j (each row sees itself).
            Every side row also sees the whole prefix and the tree's root (the last emitted token,
            at offset 0); no tree node sees a side row and no side row sees another tree node.
    """

    tokens: torch.Tensor
    offsets: torch.Tensor
    sees: torch.Tensor

    def __post_init__(self):
        S = self.tokens.shape[0] if self.tokens.dim() == 1 else -1
        if S < 1 or self.offsets.shape != (S,) or self.sees.shape != (S, S) or self.sees.dtype != torch.bool:
            raise ValueError(f"side rows need tokens (S,), offsets (S,) and a bool sees (S, S), got "
                             f"{tuple(self.tokens.shape)}, {tuple(self.offsets.shape)}, {tuple(self.sees.shape)}")
        if not bool(self.sees.diagonal().all()):
            raise ValueError("every side row must see itself (sees[i, i])")
        if bool((self.offsets < 1).any()):
            raise ValueError("side rows sit after the root: offsets must be >= 1")

    def __len__(self) -> int:
        return int(self.tokens.shape[0])


@dataclass(frozen=True)
class Tree:
    """A candidate tree rooted at the last emitted token.

    Attributes:
        tokens: ``(T,)`` int64 token ids; ``tokens[0]`` is the root.
        parents: ``(T,)`` int64; ``parents[0] == -1``, ``parents[i] < i``.
        q: optional ``(T, V)`` draft distribution *at* node ``i`` from which its children were
            sampled without replacement (in child order). ``None`` means the children are
            deterministic (e.g. top-k); the stochastic verifier then treats each one as a point mass.
        scores: optional ``(T,)`` cumulative draft log-probability of each node (for inspection).
        side: optional :class:`SideRows` the same target forward runs beside the tree (not part
            of it: ``len(tree)``, masks, paths and verification are the tree's alone).
    """

    tokens: torch.Tensor
    parents: torch.Tensor
    q: torch.Tensor | None = None
    scores: torch.Tensor | None = None
    side: SideRows | None = None

    def __post_init__(self):
        tokens, parents = self.tokens, self.parents
        if tokens.dim() != 1 or parents.shape != tokens.shape:
            raise ValueError(f"tokens and parents must be 1-D of equal length, got {tuple(tokens.shape)} and {tuple(parents.shape)}")
        if len(tokens) == 0:
            raise ValueError("a tree needs at least its root")
        if int(parents[0]) != -1:
            raise ValueError("parents[0] must be -1 (node 0 is the root)")
        idx = torch.arange(len(parents), device=parents.device)
        if len(parents) > 1 and not bool(((parents[1:] >= 0) & (parents[1:] < idx[1:])).all()):
            raise ValueError("every non-root node needs a parent with a smaller index (parents before children)")
        if self.q is not None and self.q.shape[0] != len(tokens):
            raise ValueError(f"q has {self.q.shape[0]} rows for {len(tokens)} nodes")

    # ---- construction -------------------------------------------------------------------------
    @classmethod
    def from_lists(cls, tokens: Sequence[int], parents: Sequence[int], device=None) -> "Tree":
        return cls(torch.tensor(list(tokens), dtype=torch.long, device=device),
                   torch.tensor(list(parents), dtype=torch.long, device=device))

    @classmethod
    def chain(cls, tokens: Sequence[int], device=None) -> "Tree":
        """A chain: root ``tokens[0]`` followed by ``tokens[1:]``, each the child of the previous."""
        return cls.from_lists(tokens, list(range(-1, len(tokens) - 1)), device=device)

    @classmethod
    def trie(cls, root: int, continuations, device=None) -> "Tree":
        """The trie of token ``continuations`` (lists) under ``root``: shared prefixes share nodes,
        in the order the continuations come."""
        tokens, parents = [root], [-1]
        index: dict[tuple[int, int], int] = {}
        for cont in continuations:
            node = 0
            for t in cont:
                if (node, t) not in index:
                    tokens.append(t)
                    parents.append(node)
                    index[(node, t)] = len(tokens) - 1
                node = index[(node, t)]
        return cls.from_lists(tokens, parents, device=device)

    def select(self, keep: torch.Tensor) -> "Tree":
        """The sub-tree of nodes ``keep`` (sorted indices, must include 0 and be ancestor-closed)."""
        keep = torch.as_tensor(keep, dtype=torch.long, device=self.tokens.device).sort().values
        remap = torch.full((len(self),), -1, dtype=torch.long, device=keep.device)
        remap[keep] = torch.arange(len(keep), device=keep.device)
        old_par = self.parents[keep]
        new_par = torch.where(old_par >= 0, remap[old_par.clamp(min=0)], old_par)
        if bool((new_par[1:] < 0).any()) or int(keep[0]) != 0:
            raise ValueError("select() needs the root and every kept node's parent")
        return Tree(self.tokens[keep], new_par,
                    None if self.q is None else self.q[keep],
                    None if self.scores is None else self.scores[keep], self.side)

    def with_side(self, side: SideRows | None) -> "Tree":
        """This tree with ``side`` rows run beside it in the same forward."""
        return Tree(self.tokens, self.parents, self.q, self.scores, side)

    def forward_rows(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """What one target forward runs: ``tokens (T+S,)``, ``offsets (T+S,)`` after the prefix
        (a node's depth; a side row's offset) and ``sees (T+S, T+S)`` bool: the ancestor mask and
        the side rows' own mask on the diagonal, the side rows seeing the root, nothing else across
        (``S = 0`` without side rows)."""
        anc = self.ancestor_mask()
        if self.side is None:
            return self.tokens, self.depth, anc
        T, S, dev = len(self), len(self.side), self.tokens.device
        sees = torch.zeros(T + S, T + S, dtype=torch.bool, device=dev)
        sees[:T, :T] = anc
        sees[T:, T:] = self.side.sees.to(dev)
        sees[T:, 0] = True  # the root: the last emitted token, which the side rows continue
        return (torch.cat([self.tokens, self.side.tokens.to(dev)]), torch.cat([self.depth, self.side.offsets.to(dev)]),
                sees)

    # ---- derived structure --------------------------------------------------------------------
    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    @cached_property
    def depth(self) -> torch.Tensor:
        """``(T,)`` int64 distance from the root (root = 0): ancestors (self included) minus one."""
        return self.ancestor_mask().sum(dim=1) - 1

    def positions(self, prefix_len: int) -> torch.Tensor:
        """``(T,)`` absolute position ids: a node sits right after its ancestors."""
        return self.depth + prefix_len

    @cached_property
    def _ancestors(self) -> torch.Tensor:
        return ancestors_from_parents(self.parents)

    def ancestor_mask(self) -> torch.Tensor:
        """``(T, T)`` bool; ``[i, j]`` is true iff node j is node i or one of its ancestors.
        Built once per tree with tensor ops (see :func:`ancestors_from_parents`) and cached."""
        return self._ancestors

    def packed_mask(self) -> torch.Tensor:
        """``(T, ceil(T/32))`` int32 bit-packed ancestor mask (see :func:`pack_bits`)."""
        return pack_bits(self.ancestor_mask())

    def children(self) -> list[list[int]]:
        """``children()[i]``: node indices of i's children, in index order."""
        out: list[list[int]] = [[] for _ in range(len(self))]
        for i, p in enumerate(self.parents.tolist()):
            if p >= 0:
                out[p].append(i)
        return out

    def leaves(self) -> list[int]:
        return [i for i, ch in enumerate(self.children()) if not ch]

    def path_to(self, node: int) -> list[int]:
        """Node indices from the root to ``node`` inclusive."""
        par = self.parents.tolist()
        path = [node]
        while par[path[-1]] >= 0:
            path.append(par[path[-1]])
        return path[::-1]

    def paths(self) -> list[list[int]]:
        """Every root-to-leaf path as a list of node indices."""
        return [self.path_to(leaf) for leaf in self.leaves()]

    def __str__(self) -> str:
        """An indented drawing, one node per line: ``[index] token (depth)``."""
        children = self.children()
        toks = self.tokens.tolist()
        lines = [f"Tree(T={len(self)}, depth={int(self.depth.max())})"]

        def draw(i: int, prefix: str, last: bool, top: bool) -> None:
            branch = "" if top else ("└─ " if last else "├─ ")
            lines.append(f"{prefix}{branch}[{i}] {toks[i]}")
            ext = "" if top else ("   " if last else "│  ")
            for n, c in enumerate(children[i]):
                draw(c, prefix + ext, n == len(children[i]) - 1, False)

        draw(0, "", True, True)
        return "\n".join(lines)
