"""``tree.shape: auto``: each step's tree sized from measured costs and calibrated acceptance.

Objective: expected tokens per second of the step about to run,

    rate(levels, n) = (1 + sum of the n best node values) / (overhead + draft(levels) + verify(bucket(n + 1)))

* a node's *value* is the chance that the verifier accepts it: the product, along its root path,
  of the calibrated acceptance of each edge, where an edge's draft probability q (the drafter's
  softmax of the child under its parent) is mapped to the acceptance actually observed for drafted
  nodes of that confidence band whose parent was accepted, scaled by how the recent steps' acceptance
  compares with that table (the text at hand is easier or harder than the average; :class:`Calibration`). Siblings exclude
  each other and a node needs its parent, so 1 + the sum of the values is the expected number of
  tokens a step emits;
* ``verify(b)``: what the last steps that verified a ``b``-node bucket took (their median), once
  there are a few; before that ``scale * shape(b)``: ``shape(b)``, a ``b``-node bucket's verification
  forward relative to the others, measured with the buckets interleaved (eagle/costs.py, once per cache
  capacity, on the decoder's own cache), and ``scale``, the seconds of the steps that actually ran, each
  divided by its bucket's ``shape``. Inside decoding the buckets cost otherwise than in that
  back-to-back measurement (the drafter runs between two verifications and the target's weights come
  back from memory), so the steps' own times are what counts; ``draft(levels)``: the measured seconds of
  each drafted level; ``overhead``: the rest of a step (the drafter's catch-up, bookkeeping), measured.

Growing: level by level like EAGLE-2 (the ``top_k`` most valuable frontier nodes expanded with
their ``top_k`` best children each), at most ``depth`` levels. After each level it asks whether the
next one is worth its time: each frontier node ``f`` is expected to bring ``top_k`` children of values
``value(f) * p_r`` (``p_r``: the calibrated acceptance the level just drafted gave its rank-``r``
children, averaged over its parents), and drafting stops when the best rate with those nodes, at one
more level's cost, is not above the best rate now. Then it
verifies the best ``n`` nodes, with ``n`` the count (at most ``total_tokens``) that maximises the
rate, which is always a bucket boundary or everything drafted. ``n = 0`` (a plain step) is allowed.
Every ``EXPLORE``-th step drafts one level more than the rate asks for, and every other one verifies
the next bucket up: so the costs and acceptance of the choices not taken stay measured.

Exactness does not depend on any of this: the tree is chosen before the target sees it, and the
verifier is exact for every tree (greedy: identical to plain decoding; sampling: the target's
distribution, deterministic children verified as point-mass proposals).
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch

from ..tree import Tree
from .grow import Expand, add_level, select_dynamic
from .shape import DynamicShape, register_tree_shape

__all__ = ["Calibration", "StepCosts", "AutoTreePolicy", "AutoShape"]


class Calibration:
    """Acceptance per draft-probability band: ``rate(q)`` is the share of drafted nodes with edge
    probability ``q`` in that band that were accepted, counting only nodes whose parent was
    accepted (the others were never tried). Starts from a prior of ``prior_weight`` pseudo-trials
    at the band's mid-point (a perfectly calibrated draft).

    The band table is pooled over everything decoded; how predictable the text at hand is moves
    acceptance at every band alike (on a 2-core Xeon's Spec-Bench first turns the pooled table
    expected 20-30% too few accepted tokens on math, QA and translation answers; docs/tree-policy.md).
    So ``rate`` scales the table by ``factor()``: the accepted tried nodes
    over what the table expected of them, over the recent steps (each observation's weight decays
    by ``1 - 1/recent_window`` per later one; prior: 2 nodes at 1.0).

    It also keeps ``child()``, reported with the policy's state (``eagle generate -v``, the bench
    JSON): how often an accepted node with drafted children had one of them accepted, over the
    recent steps (decaying by ``1 - 1/child_window``). That chance hardly depends
    on the depth or on the node's own draft probability, but it moves with the text: on the same
    first turns, 0.91 for math reasoning, 0.40 for summarization, 0.55 for MT-bench, and 0.59-0.71
    at depths 0-3 over all of them."""

    def __init__(self, bands: int = 10, prior_weight: float = 4.0, prior_child: float = 0.5,
                 child_window: float = 32.0, recent_window: float = 64.0):
        self.bands = bands
        mid = (torch.arange(bands, dtype=torch.float64) + 0.5) / bands
        self.hits = mid * prior_weight  # (bands,)
        self.trials = torch.full((bands,), prior_weight, dtype=torch.float64)
        self.prior_child = prior_child
        self.child_decay = 1.0 - 1.0 / child_window
        self.child_hits = 0.0  # recency-weighted counts
        self.child_trials = 0.0
        self.recent_decay = 1.0 - 1.0 / recent_window
        self.recent_hits = 0.0  # recency-weighted: accepted tried nodes, and the table's expectation of them
        self.recent_expected = 0.0

    def band(self, q: torch.Tensor) -> torch.Tensor:
        return (q.double() * self.bands).long().clamp_(0, self.bands - 1)

    def factor(self) -> float:
        """How the recent steps' acceptance compares with the band table's (1.0: as the table says)."""
        return (self.recent_hits + 2.0) / (self.recent_expected + 2.0)

    def rate(self, q: torch.Tensor) -> torch.Tensor:
        """Calibrated acceptance of edges with draft probabilities ``q`` (any shape), float64: the
        band's long-run rate x :meth:`factor`, at most 1."""
        return ((self.hits / self.trials)[self.band(q)] * self.factor()).clamp_(max=1.0)

    def child(self) -> float:
        """Chance that an accepted node with drafted children has one of them accepted, over the
        recent steps (prior ``prior_child`` with weight 2)."""
        return (self.child_hits + 2 * self.prior_child) / (self.child_trials + 2)

    def observe(self, q: torch.Tensor, parents: torch.Tensor, path: list[int]) -> None:
        """One verified tree: ``q (T,)`` edge probabilities (the root's unused), ``parents`` and the
        accepted ``path`` (node indices from the root)."""
        on_path = torch.zeros(len(parents), dtype=torch.bool)
        on_path[path] = True
        tried = on_path[parents.clamp(min=0)] & (parents >= 0)  # (T,) the parent was accepted
        b = self.band(q[tried])
        keep = self.recent_decay ** len(b)  # this step's nodes count as the newest
        self.recent_expected = keep * self.recent_expected + float((self.hits / self.trials)[b].sum())
        self.recent_hits = keep * self.recent_hits + float(on_path[tried].sum())
        self.trials.index_add_(0, b, torch.ones(len(b), dtype=torch.float64))
        self.hits.index_add_(0, b, on_path[tried].double())
        has_kids = torch.zeros(len(parents), dtype=torch.bool)
        has_kids[parents[parents >= 0]] = True
        for node in path:
            if has_kids[node]:
                self.child_trials = self.child_decay * self.child_trials + 1
                self.child_hits = self.child_decay * self.child_hits + (node != path[-1])

    def table(self) -> list[dict]:
        """Per band: its range, the acceptance used now and the trials observed (prior excluded)."""
        return [{"q": [i / self.bands, (i + 1) / self.bands], "rate": float(self.hits[i] / self.trials[i]),
                 "trials": float(self.trials[i])} for i in range(self.bands)]


class _Recent:
    """The median of the last ``window`` values: a machine's odd slow call (a page fault, the other
    core busy) moves it no more than one value in a window does. The median is kept, not recomputed
    on each read (the objective reads it several times per drafted level)."""

    def __init__(self, window: int = 15, skip: int = 0):
        self.window, self.values, self.skip = window, [], skip  # skip: first calls not counted (warm-up)
        self.value: float | None = None

    def add(self, x: float) -> None:
        if self.skip:
            self.skip -= 1
            return
        self.values = self.values[-(self.window - 1):] + [x]
        self.value = statistics.median(self.values)

    def reset(self, values: list[float]) -> None:
        self.values = list(values)[-self.window:]
        self.value = statistics.median(self.values) if self.values else None


class _VerifyCosts:
    """A verification forward's seconds per bucket on one cache capacity (one set of compiled
    forwards): ``shape`` (relative costs measured at start), ``scale`` (seconds per unit of shape,
    from that measurement and every step) and each bucket's own recent steps."""

    def __init__(self, buckets: list[int], seconds: dict[int, float] | None = None):
        first = seconds[buckets[0]] if seconds else None
        self.shape = {b: seconds[b] / first if seconds else 1.0 for b in buckets}  # bucket -> relative cost
        self.scale = _Recent(window=31)
        if first is not None:
            self.scale.reset([first])
        self.steps: dict[int, _Recent] = {b: _Recent() for b in buckets}  # bucket -> its steps' seconds
        self.count = 0  # steps verified on this capacity
        self.last: dict[int, int] = {b: 0 for b in buckets}  # bucket -> the count at its latest step


class StepCosts:
    """Seconds of the parts of a step on this machine and backend: a verification forward per
    bucket (the median of its recent steps once it has ``SURE`` of them; before that its relative
    cost measured at start times the scale all recent steps show; both per cache capacity), each
    drafted level, and the rest of a step (medians of recent steps)."""

    SURE = 3
    STALE = 64  # a bucket's own steps count while one of them is among the last STALE steps

    def __init__(self, buckets: list[int]):
        self.buckets = list(buckets)
        self.by_capacity: dict = {}  # cache capacity (None: a dynamic cache) -> its measured costs
        self.verify = _VerifyCosts(self.buckets)  # the capacity in use (unmeasured until set_verify)
        self.levels: list[_Recent] = []
        self.overhead = _Recent()

    @property
    def shape(self) -> dict[int, float]:
        return self.verify.shape

    def bucket(self, n: int) -> int:
        return next((b for b in self.buckets if b >= n), self.buckets[-1])

    def verify_s(self, n: int) -> float:
        """Seconds to verify ``n`` nodes (root included): what their bucket's recent steps took, or,
        with fewer than ``SURE`` of them or none among the last ``STALE`` steps (a slow spell's
        times would otherwise stay with a bucket the policy stopped picking because of them), the
        bucket's relative cost x the scale."""
        b, v = self.bucket(n), self.verify
        if len(v.steps[b].values) >= self.SURE and v.count - v.last[b] < self.STALE:
            return v.steps[b].value
        return (v.scale.value or 0.0) * v.shape[b]

    def set_verify(self, seconds: dict[int, float], capacity=None) -> None:
        """A measurement of every bucket (interleaved) on the cache ``capacity`` now in use."""
        self.verify = self.by_capacity[capacity] = _VerifyCosts(self.buckets, seconds)

    def use_capacity(self, capacity) -> bool:
        """Switch to the costs of cache ``capacity``; False if it was never measured."""
        if capacity not in self.by_capacity:
            return False
        self.verify = self.by_capacity[capacity]
        return True

    def add_verify(self, n: int, seconds: float) -> None:
        """A step verified ``n`` nodes in ``seconds``."""
        b, v = self.bucket(n), self.verify
        v.scale.add(seconds / v.shape[b])
        v.steps[b].add(seconds)
        v.count += 1
        v.last[b] = v.count

    def level_s(self, d: int) -> float:
        """Seconds of drafted level ``d`` (0-based). A level with fewer than ``SURE`` measurements
        counts as cheap as the cheapest well-measured level (0 if none): optimism, so that the
        policy drafts it a few times and learns what it costs (its first call, often a warm-up, is
        not counted)."""
        m = self.levels[d] if d < len(self.levels) else None
        if m is not None and len(m.values) >= self.SURE:
            return m.value
        known = [x.value for x in self.levels if len(x.values) >= self.SURE]
        return min(known) if known else 0.0

    def draft_s(self, levels: int) -> float:
        return sum(self.level_s(d) for d in range(levels))

    def add_levels(self, seconds: list[float]) -> None:
        for d, s in enumerate(seconds):
            while len(self.levels) <= d:
                self.levels.append(_Recent(skip=1))
            self.levels[d].add(s)

    def as_dict(self) -> dict:
        ms = lambda m: None if m.value is None else 1000 * m.value  # noqa: E731
        return {"verify_ms": {b: 1000 * self.verify_s(b) for b in self.buckets}, "level_ms": [ms(m) for m in self.levels],
                "overhead_ms": ms(self.overhead)}


@dataclass
class _Proposal:
    """What the last grown tree was made of, for :meth:`AutoTreePolicy.observe`."""

    q: torch.Tensor  # (T,) edge draft probabilities of the verified nodes
    levels_s: float  # seconds of the drafted levels
    expected: float  # the drafted tokens the verification is expected to accept (sum of the values)
    seconds: float  # the step's time the objective counted on (overhead + drafted levels + verification)
    values: torch.Tensor  # (N,) the calibrated value of every drafted node (root first), verified or not
    level_ends: list[int]  # the pool's size after each drafted level (values[:level_ends[L - 1]]: L levels)


class AutoTreePolicy:
    """The state of ``tree.shape: auto`` for one decoder: costs and calibration, kept from one
    generation to the next (a warm-up generation calibrates the timed ones).

    The decoder calls :meth:`prepare` after each prefill (measures the verification forwards on a
    new cache capacity) and :meth:`observe` after each verification; the tree grower calls
    :meth:`grow`. Attributes ``costs`` and ``calibration`` are public for reports."""

    EXPLORE = 32  # every EXPLORE-th step drafts one level past where the policy would stop

    def __init__(self, buckets: list[int], max_nodes: int, repeats: int = 5):
        self.buckets = [b for b in buckets if b <= max_nodes] or [max_nodes]
        if self.buckets[-1] < max_nodes:  # trees past the last bucket run at their own size
            self.buckets.append(max_nodes)
        self.max_nodes, self.repeats = max_nodes, repeats
        self.costs = StepCosts(self.buckets)
        self.calibration = Calibration()
        self.last: _Proposal | None = None
        self.steps = 0

    # ---- the decoder's calls ------------------------------------------------------------------
    def prepare(self, target, cache, layers=None) -> None:
        """Measure each bucket's verification forward after the prompt in ``cache`` (once per cache
        capacity: on a compiled path another capacity is another graph, compiled here, not inside a
        later step)."""
        key = getattr(cache, "capacity", None)
        if self.costs.use_capacity(key):
            return
        from ..costs import verify_costs

        costs, _ = verify_costs(target, cache, self.buckets, self.repeats, layers)
        self.costs.set_verify(costs, key)

    def grown(self, tree: Tree) -> _Proposal | None:
        """What the grower made ``tree`` of, or None for a step the grower did not make."""
        return self.last if self.last is not None and len(self.last.q) == len(tree) else None

    def observe(self, tree: Tree, path: list[int], draft_s: float, verify_s: float, other_s: float) -> None:
        """One finished step: its verified ``tree``, the accepted ``path`` and its timings."""
        self.costs.add_verify(len(tree), verify_s)
        made = self.grown(tree)
        if made is None:
            return
        self.costs.overhead.add(max(draft_s - made.levels_s, 0.0) + other_s)
        self.calibration.observe(made.q, tree.parents.cpu(), path)
        self.last = None

    # ---- the objective ------------------------------------------------------------------------
    def step_s(self, levels: int, n: int) -> float:
        """Seconds of a step that drafts ``levels`` levels and verifies ``n`` drafted nodes (and the
        root): the measured overhead, those levels and the verification bucket of ``n + 1`` nodes."""
        return (self.costs.overhead.value or 0.0) + self.costs.draft_s(levels) + self.costs.verify_s(n + 1)

    def best_count(self, values: torch.Tensor, levels: int, step_up: bool = False) -> tuple[int, float]:
        """``(n, rate)``: how many of the nodes with ``values`` (sorted descending) to verify after
        ``levels`` drafted levels, and the expected tokens per second of that step. ``step_up``: the
        next larger candidate count instead of the best (where there is one), to measure its bucket."""
        N = min(len(values), self.max_nodes - 1)
        gain = [0.0] + values[:N].cumsum(0).tolist()  # [n] = expected accepted tokens of the n best
        # a bucket costs the same for any n in it and values are positive: only the largest n of each
        # bucket can be best
        counts = sorted({0} | {min(b - 1, N) for b in self.costs.buckets})
        rates = []
        for n in counts:
            t = self.step_s(levels, n)
            rates.append((1 + gain[n]) / t if t > 0 else 1 + gain[n])
        i = max(range(len(counts)), key=lambda j: (rates[j], -j))  # the best; ties: the fewer nodes
        if step_up and i + 1 < len(counts):
            i += 1
        return counts[i], rates[i]

    def worth_another_level(self, values: torch.Tensor, frontier_values: torch.Tensor, levels: int,
                            profile: torch.Tensor) -> bool:
        """Whether drafting level ``levels + 1`` is expected to pay: the best rate with the nodes so
        far against the best rate with, in addition, the nodes the next level is expected to bring
        (each frontier node's value x ``profile``: the calibrated acceptance the level just drafted
        gave its children, rank by rank) at one more level's cost."""
        _, now = self.best_count(values.sort(descending=True).values, levels)
        extra = (frontier_values[:, None] * profile[None, :]).flatten()  # (F * k,)
        _, then = self.best_count(torch.cat([values, extra]).sort(descending=True).values, levels + 1)
        return then > now

    # ---- growing ------------------------------------------------------------------------------
    def grow(self, root: int, depth: int, top_k: int, expand: Expand, vocab_map: torch.Tensor | None = None) -> Tree:
        """The step's tree (see the module docstring)."""
        tokens = torch.tensor([root], dtype=torch.long)  # (N,)
        parents = torch.tensor([-1], dtype=torch.long)  # (N,)
        scores = torch.zeros(1)  # (N,) cumulative draft log-prob (the Tree's scores)
        q = torch.ones(1)  # (N,) edge draft probability
        value = torch.ones(1, dtype=torch.float64)  # (N,) calibrated chance of acceptance
        frontier = torch.tensor([0], dtype=torch.long)  # (F,)
        levels: list[float] = []
        level_ends: list[int] = []
        self.steps += 1
        explore = self.steps % self.EXPLORE == 0  # keeps the deeper levels' costs and acceptance measured
        step_up = self.steps % self.EXPLORE == self.EXPLORE // 2  # keeps the larger buckets' costs measured
        for d in range(depth):
            t0 = time.perf_counter()
            logits = expand(Tree(tokens, parents), frontier.tolist())  # (F, V)
            n0 = len(tokens)
            tokens, parents, scores, logq = add_level(tokens, parents, scores, frontier, logits, top_k, vocab_map)
            levels.append(time.perf_counter() - t0)
            level_ends.append(len(tokens))
            q = torch.cat([q, logq.exp().flatten()])
            rates = self.calibration.rate(logq.exp())  # (F, k) children's calibrated acceptance
            new_value = (value[frontier][:, None] * rates).flatten()  # (F * k,)
            value = torch.cat([value, new_value])
            if d + 1 == depth:
                break
            frontier = (n0 + torch.sort(-new_value, stable=True).indices[:top_k]).sort().values
            profile = rates.sort(dim=-1, descending=True).values.mean(0)  # (k,) per child rank
            if not self.worth_another_level(value[1:], value[frontier], len(levels), profile):
                if not explore:
                    break
                explore = False
        self.costs.add_levels(levels)
        n, _ = self.best_count(value[1:].sort(descending=True).values, len(levels), step_up)
        # best n by value; ties towards the earlier (shallower) node, closed under ancestors
        keep = select_dynamic(value.log().float(), parents, n)
        self.last = _Proposal(q[keep], sum(levels), float(value[keep][1:].sum()), self.step_s(len(levels), n),
                              value, level_ends)
        return Tree(tokens, parents, None, scores).select(keep)

    def report(self) -> dict:
        """The costs and calibration in use now (for ``eagle generate -v`` and the bench JSON)."""
        return {"costs": self.costs.as_dict(), "calibration": self.calibration.table(),
                "child_acceptance": self.calibration.child(), "recent_factor": self.calibration.factor()}


@register_tree_shape("auto")
class AutoShape(DynamicShape):
    """``tree.shape: auto``: the options of the dynamic tree as bounds (at most ``depth`` levels of
    ``top_k`` x ``top_k`` candidates, at most ``total_tokens`` verified), each step sized by the
    decoder's :class:`AutoTreePolicy` (``sampling`` is not needed: children are the draft's top-k,
    verified as deterministic proposals)."""

    needs_grow = True

    def new_policy(self, buckets: list[int]) -> AutoTreePolicy:
        return AutoTreePolicy(buckets, self.max_nodes)

    def grow(self, root, expand, sampling, sample=False, vocab_map=None, vocab_size=None, policy=None) -> Tree:
        if policy is None:
            raise ValueError("tree.shape 'auto' needs the decoder's AutoTreePolicy (a TreeDecoder attaches one "
                             "to its drafter)")
        return policy.grow(root, self.depth, self.top_k, expand, vocab_map)
