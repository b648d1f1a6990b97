"""Hybrid drafting (``drafter.type: hybrid``): the longest prompt/history match grafted into the
EAGLE head's tree, under one node budget, verified by one target forward.

Each step:

1. the head grows its tree exactly as ``drafter.type: eagle`` would, on any shape (``auto`` too);
2. the n-gram search of :class:`eagle.draft.ngram.NgramDrafter` (longest suffix of the text, most
   recent occurrence; prompt included) gives the match's continuation, up to ``match_depth`` tokens;
3. a continuation of at least ``min_match_len`` tokens becomes a branch from the root, merged with
   the head's tree as a trie: where its tokens coincide with the head's nodes they share them, the
   rest hangs as a chain under the last shared node;
4. the merged tree keeps the shape's ``max_nodes``: the head's nodes of lowest draft score (a
   cumulative log-probability) are dropped to make room, never the root or the shared path; or,
   with ``value_match``, the match's tokens are scored like the head's nodes (the k-th below the
   shared path: that node's score + k log ``rate``, ``rate`` the measured chance that a reached
   match token is accepted) and the best nodes of both stay.

The branch is valued by its measured acceptance: ``gain``, a running mean (weight ``1/4`` for the
newest graft) of the match tokens the verifier accepted beyond the shared nodes, starts at
``min_match_len`` (optimistic) and a branch is grafted while ``gain >= min_gain``. Below that, every
``EXPLORE``-th step that has a match grafts anyway, so a text that starts copying is noticed.

Exactness: grafted nodes are deterministic proposals (point masses, like the n-gram drafter's).
When the head sampled its children (``drafter.sample``, ``tree.q`` given), every step offered a match
drops ``q``, grafted or not (whether the match is already in the tree depends on the sampled
children, so keeping ``q`` for those trees alone would bias the sampled verification): the verifier
then takes every child as a point mass, which is exact for any candidates fixed before verification
(such steps accept the sampled children a little less often). Greedy output is plain decoding's.

With ``tree.shape: auto`` the policy sizes the head's part and the merged tree stays within the
verification bucket the policy chose (or the smallest that holds a ``min_match_len`` match, on a
step the policy left plain); a step whose tree the graft changed is
left out of the policy's acceptance calibration (its tree is no longer the one the policy grew);
its verification cost is still measured.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..draft.base import Sampling, register_drafter
from ..draft.grow import select_dynamic
from ..draft.ngram import NgramDrafter
from ..draft.shape import ChainShape, TreeShape
from ..target import Target
from ..tree import Tree
from .drafter import EagleDrafter, EagleOptions

__all__ = ["HybridDrafter", "HybridHeadDrafter", "HybridOptions", "graft"]


def graft(tree: Tree, cont: list[int], budget: int, rate: float | None = None) -> tuple[Tree, int, int]:
    """``tree`` with the continuation ``cont`` (tokens after the root) merged in as a trie branch,
    at most ``budget`` nodes in all.

    Returns ``(merged, shared, added)``: ``shared`` leading tokens of ``cont`` were already a path
    of ``tree`` (the first child carrying the token at each step, the one the verifier would take),
    ``added`` more hang as a chain under that path's end. The merged tree keeps the head's nodes
    first, in their order, then the chain. ``q`` is dropped whether or not anything is added: with
    sampled children, whether the match is already a path of the tree depends on the sampled
    tokens, so keeping ``q`` for exactly those trees would bias sampled verification (every child
    of a merged tree is verified as a point mass, exact for any candidates fixed in advance).

    Which nodes stay within ``budget``:

    - ``rate`` None (or a tree without ``scores``): the whole chain (up to the budget), and the
      head's nodes of lowest ``tree.scores`` (lowest index first without scores) make room;
    - ``rate`` in (0, 1): the chain is valued like the head's nodes, whose scores are cumulative
      draft log-probabilities: its k-th token below the shared path's end (score ``s``) scores
      ``s + k log(rate)`` (each match token accepted with probability ``rate``), and the best
      ``budget - 1`` nodes of head and chain together stay (ancestor-closed), so a weak match keeps
      only its first tokens, or none, and a strong one pushes out the head's long shots."""
    if tree.q is not None:
        tree = Tree(tree.tokens, tree.parents, None, tree.scores, tree.side)
    tokens, parents = tree.tokens.tolist(), tree.parents.tolist()
    child: dict[tuple[int, int], int] = {}
    for i in range(len(tokens) - 1, 0, -1):  # backwards: the first child with a token wins
        child[(parents[i], tokens[i])] = i
    path = [0]
    for t in cont:
        nxt = child.get((path[-1], t))
        if nxt is None:
            break
        path.append(nxt)
    shared = len(path) - 1
    rest = cont[shared:][: max(budget - len(path), 0)]  # root + path + rest <= budget
    if not rest:
        return tree, shared, 0
    dev, T, at = tree.tokens.device, len(tree), path[-1]
    # the head and the chain as one pool of T + A nodes, then the best `budget` of it, ancestor-closed
    par = torch.tensor(parents + [at] + list(range(T, T + len(rest) - 1)), dtype=torch.long)  # (T + A,)
    # head scores: (T,) cumulative draft log-prob, so a parent never ranks below its child
    head = tree.scores.detach().float().cpu() if tree.scores is not None else -torch.arange(T, dtype=torch.float32)
    valued = rate is not None and tree.scores is not None
    if valued:  # the chain falls by log(rate) per token below `at`
        chain = head[at] + torch.arange(1, len(rest) + 1, dtype=torch.float32) * torch.log(torch.tensor(rate))
    else:  # the shared path and the whole chain stay; the head's lowest-scored nodes make room
        head = head.clone()
        head[path] = float("inf")
        chain = torch.full((len(rest),), float("inf"))
    score = torch.cat([head, chain])  # (T + A,)
    keep = select_dynamic(score, par, min(budget, T + len(rest)) - 1)  # (<= budget,) sorted, root included
    added = int((keep >= T).sum())
    if not added:
        return tree, shared, 0
    # the chain's nodes are point masses: a q over the whole tree would claim they were sampled
    full = Tree(torch.cat([tree.tokens, torch.tensor(rest, dtype=torch.long, device=dev)]), par.to(dev), None,
                score.to(dev) if valued else None, tree.side)
    return full.select(keep.to(dev)), shared, added


class HybridDrafter(EagleDrafter):
    """An :class:`EagleDrafter` whose trees also carry the text's longest match (module docstring).

    ``match``: the n-gram search's options (``max_ngram``, ``min_ngram``); ``match_depth``: the most
    match tokens grafted; ``min_match_len``: the shortest continuation worth a branch; ``min_gain``:
    the measured accepted match tokens per graft below which grafting pauses (explored every
    ``EXPLORE``-th matching step); ``value_match``: the match's tokens compete with the head's nodes
    for the budget, valued by ``rate`` (:func:`graft`), instead of always displacing the head's
    weakest nodes. Counters for reports: ``grafts`` (steps that grafted a branch),
    ``match_accepted`` (match tokens accepted beyond the head's own nodes), ``gain``, ``rate``."""

    EXPLORE = 16  # below min_gain, one matching step in EXPLORE still grafts (keeps `gain` measured)
    RECENT = 0.25  # weight of the newest graft in the running mean `gain`
    MEMORY = 0.9  # `rate`'s counts decay by this per graft (a memory of about ten grafts)
    PRIOR = (1.0, 2.0)  # `rate` starts as 1 accepted of 2 reached match tokens

    def __init__(self, target: Target, head, shape: TreeShape, max_ngram: int = 3, min_ngram: int = 2,
                 match_depth: int = 5, min_match_len: int = 2, min_gain: float = 0.0, value_match: bool = True,
                 **eagle):
        super().__init__(target, head, shape, **eagle)
        self.budget = shape.max_nodes
        self.match_depth, self.min_match_len, self.min_gain = match_depth, min_match_len, min_gain
        self.value_match = value_match
        self._hits, self._tries = self.PRIOR  # decayed counts of match tokens accepted / reached
        self.matcher = NgramDrafter(None, ChainShape(ChainShape.Options(depth=match_depth)),
                                    NgramDrafter.Options(max_ngram=max_ngram, min_ngram=min_ngram, branches=1))
        self.gain = float(min_match_len)
        self.grafts = self.match_accepted = 0
        self._waited = 0  # matching steps not grafted since the last graft
        self._last: tuple[list[int], int] | None = None  # (grafted match tokens from the root, shared)

    @property
    def rate(self) -> float:
        """Measured chance that a grafted match token is accepted when the verifier reaches it."""
        return min(max(self._hits / self._tries, 0.02), 0.98)

    def reset(self, prompt_ids: torch.Tensor) -> None:
        super().reset(prompt_ids)
        self.matcher.history = self.history  # one list: extend appends to both
        self._last = None

    def extend(self, features: torch.Tensor, tokens: torch.Tensor) -> None:
        super().extend(features, tokens)
        if self._last is None:
            return
        match, shared = self._last
        self._last = None
        emitted = tokens.tolist()[:-1]  # the accepted drafted tokens (the last one is the bonus)
        lead = next((i for i, (a, b) in enumerate(zip(emitted, match)) if a != b), min(len(emitted), len(match)))
        accepted = max(lead - shared, 0)
        self.match_accepted += accepted
        self.gain += self.RECENT * (accepted - self.gain)
        if lead >= shared:  # the verifier reached the chain: its first `accepted` tokens passed
            reached = min(accepted + 1, len(match) - shared)
            self._hits = self.MEMORY * self._hits + accepted
            self._tries = self.MEMORY * self._tries + reached

    def wants_branch(self) -> bool:
        """Whether this step grafts a match: while the measured gain pays, or to explore."""
        if self.gain >= self.min_gain:
            return True
        self._waited += 1
        return self._waited >= self.EXPLORE

    def step_budget(self, nodes: int) -> int:
        """The nodes a merged tree may hold when the head proposed ``nodes``: the shape's budget, or
        with ``tree.shape: auto`` the verification bucket the policy chose (at least the smallest
        holding a shortest match), so the graft fills the rows that step pays for anyway."""
        costs = getattr(self.tree_policy, "costs", None)
        if costs is None:
            return self.budget
        return min(costs.bucket(max(nodes, 1 + self.min_match_len)), self.budget)

    @torch.no_grad()
    def propose(self, root: int, sampling: Sampling) -> Tree:
        tree = super().propose(root, sampling)
        conts = self.matcher.continuations()
        cont = conts[0] if conts else []
        if len(cont) < self.min_match_len or not self.wants_branch():
            return tree
        merged, shared, added = graft(tree, cont, self.step_budget(len(tree)), self.rate if self.value_match else None)
        if not added:
            return merged  # the head's tree, without q (see graft)
        self._waited = 0
        self.grafts += 1
        self._last = (cont[: shared + added], shared)
        if getattr(self.tree_policy, "last", None) is not None:  # tree.shape auto: not the tree it grew
            self.tree_policy.last = None
        return merged


@dataclass
class HybridOptions(EagleOptions):
    """``drafter:`` keys of ``type: hybrid``: the EAGLE head drafter's, and the match's."""

    # defaults: hybrid-cpu's, chosen on Spec-Bench (docs/model-free.md, experiments/ablations/hybrid.yaml)
    max_ngram: int = 3  # suffix lengths searched, longest first, down to min_ngram
    min_ngram: int = 2
    match_depth: int = 5  # the most match tokens grafted
    min_match_len: int = 2  # the shortest continuation worth a branch
    min_gain: float = 0.0  # graft while the measured accepted match tokens per graft are at least this
    value_match: bool = True  # match tokens valued by their measured acceptance against the head's nodes

    def validate(self) -> None:
        super().validate()
        if not 1 <= self.min_ngram <= self.max_ngram:
            raise ValueError("drafter needs 1 <= min_ngram <= max_ngram")
        if not 1 <= self.min_match_len <= self.match_depth:
            raise ValueError("drafter needs 1 <= min_match_len <= match_depth")
        if self.min_gain < 0:
            raise ValueError(f"drafter.min_gain must be >= 0, got {self.min_gain}")


@register_drafter("hybrid")
class HybridHeadDrafter(HybridDrafter):
    """``drafter.type: hybrid``: :class:`HybridDrafter` with the EAGLE-1/2 or EAGLE-3 head of
    ``options.head`` (loaded as ``type: eagle`` / ``eagle3`` load theirs)."""

    Options = HybridOptions

    def __init__(self, target: Target, tree: TreeShape, options: HybridOptions):
        from . import load_head  # the package's, looked up when called

        head = load_head(options.head, target.model).to(target.device)
        o = options
        super().__init__(target, head, tree, max_ngram=o.max_ngram, min_ngram=o.min_ngram, match_depth=o.match_depth,
                         min_match_len=o.min_match_len, min_gain=o.min_gain, value_match=o.value_match,
                         sample=o.sample, prompt_vocab=o.prompt_vocab, **o.precision(target, head, tree))
        self.options = options

    @classmethod
    def check(cls, tree: TreeShape, options: HybridOptions) -> None:
        if not options.head:
            raise ValueError("drafter.type 'hybrid' needs drafter.head (an EAGLE head checkpoint folder)")
        super().check(tree, options)
        if options.min_match_len > tree.max_nodes - 1:
            raise ValueError(f"drafter.min_match_len ({options.min_match_len}) must fit the tree: at most "
                             f"{tree.max_nodes - 1} drafted nodes")

    @classmethod
    def check_files(cls, tree: TreeShape, options: HybridOptions) -> None:
        from . import check_head

        check_head(options.head)
