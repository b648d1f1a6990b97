"""``TreeDecoder``: draft a tree, verify it with ONE target forward, commit the accepted branch.

Plain decoding is the same loop with a one-node tree, so a speedup always compares like with like.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from .config import as_config
from .draft.base import Drafter, NoDrafter, Sampling
from .draft.shape import TreeShape
from .fallback import FallbackConfig, FallbackPolicy
from .runtime import RuntimeConfig
from .target import Target
from .tree import Tree
from .verify import greedy_accept, probs_from_logits, verify

__all__ = ["TreeDecoder", "DecodeStats", "GenerationResult"]


@dataclass
class DecodeStats:
    """Counters of one generation. tau counts decode-phase tokens (the first token comes from the
    prefill forward) per tree-verification forward."""

    new_tokens: int = 0
    prompt_tokens: int = 0
    target_forwards: int = 0  # tree-verification forwards (the prefill forward is not counted)
    plain_steps: int = 0  # of those, steps the fallback ran without drafting
    tree_nodes: int = 0  # nodes verified in total
    side_rows: int = 0  # rows run beside the trees, not verified (a lookahead window), in total
    accepted_hist: list[int] = field(default_factory=list)  # [a] = steps that accepted a drafted tokens
    depth_tried: list[int] = field(default_factory=list)  # [d-1] = steps whose tree reached depth d
    depth_accepted: list[int] = field(default_factory=list)  # [d-1] = ... and accepted a token at depth d
    reached: int = 0  # drafted positions the verifier reached (all earlier tokens on the path accepted)
    depth_hist: list[int] = field(default_factory=list)  # [d] = steps whose tree was d levels deep
    nodes_hist: list[int] = field(default_factory=list)  # [n] = steps that verified n nodes (root included)
    prefill_s: float = 0.0
    draft_s: float = 0.0
    verify_s: float = 0.0
    other_s: float = 0.0
    generations: int = 0  # generations summed into these counters (``generate`` sets 1; merge adds)

    @property
    def tau(self) -> float:
        """Mean tokens emitted per target forward in the decode phase: each generation's first token
        comes from its prefill, so one token per generation is left out (merged stats included)."""
        return (self.new_tokens - max(self.generations, 1)) / self.target_forwards if self.target_forwards else 1.0

    @property
    def alpha(self) -> float:
        """Token-level acceptance: accepted drafted tokens / drafted positions the verifier reached
        (a position is reached when every token before it on the path was accepted). For a chain
        this is the alpha of Leviathan et al.; for a tree, the chance that some child is accepted."""
        return sum(self.depth_accepted) / self.reached if self.reached else 0.0

    @property
    def per_depth_acceptance(self) -> list[float]:
        return [a / t if t else 0.0 for a, t in zip(self.depth_accepted, self.depth_tried)]

    @property
    def decode_s(self) -> float:
        return self.draft_s + self.verify_s + self.other_s

    def record(self, tree_depth: int, accepted: int, nodes: int = 0) -> None:
        for lst, n in ((self.accepted_hist, accepted + 1), (self.depth_tried, tree_depth),
                       (self.depth_accepted, tree_depth), (self.depth_hist, tree_depth + 1),
                       (self.nodes_hist, nodes + 1)):
            lst.extend([0] * (n - len(lst)))
        self.accepted_hist[accepted] += 1
        self.depth_hist[tree_depth] += 1
        self.nodes_hist[nodes] += nodes > 0
        self.reached += min(accepted + 1, tree_depth)
        for d in range(tree_depth):
            self.depth_tried[d] += 1
            if d < accepted:
                self.depth_accepted[d] += 1

    def merge(self, other: "DecodeStats") -> None:
        for name in ("new_tokens", "prompt_tokens", "target_forwards", "plain_steps", "tree_nodes", "side_rows", "reached", "prefill_s", "draft_s",
                     "verify_s", "other_s", "generations"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for name in ("accepted_hist", "depth_tried", "depth_accepted", "depth_hist", "nodes_hist"):
            a, b = getattr(self, name), getattr(other, name)
            a.extend([0] * (len(b) - len(a)))
            for i, v in enumerate(b):
                a[i] += v

    def as_dict(self) -> dict:
        return {"new_tokens": self.new_tokens, "target_forwards": self.target_forwards, "tau": self.tau, "alpha": self.alpha,
                "plain_steps": self.plain_steps,
                "accepted_hist": self.accepted_hist, "per_depth_acceptance": self.per_depth_acceptance,
                "mean_tree_nodes": self.tree_nodes / max(self.target_forwards, 1),
                "mean_side_rows": self.side_rows / max(self.target_forwards, 1),
                "depth_hist": self.depth_hist, "nodes_hist": self.nodes_hist,
                "time_s": {"prefill": self.prefill_s, "draft": self.draft_s, "verify": self.verify_s,
                           "bookkeeping": self.other_s}}


@dataclass
class GenerationResult:
    tokens: list[int]  # the new tokens only (EOS included when generation stopped on it)
    stats: DecodeStats


def _eos_set(model, eos_token_id) -> set[int]:
    if eos_token_id is None:
        gen = getattr(model, "generation_config", None)
        eos_token_id = getattr(gen, "eos_token_id", None) if gen is not None else None
        if eos_token_id is None:
            eos_token_id = getattr(model.config, "eos_token_id", None)
    if eos_token_id is None:
        return set()
    return {int(e) for e in (eos_token_id if isinstance(eos_token_id, (list, tuple)) else [eos_token_id])}


class TreeDecoder:
    """Lossless speculative decoding with tree drafts.

    Args:
        model: an unmodified transformers causal LM, or an :class:`eagle.Target` wrapping one.
        drafter: a :class:`eagle.Drafter`; ``None`` = plain decoding through the same loop.
        eos_token_id: int or list; defaults to the model's generation config.
        attention: "auto" | "triton" | "reference" (ignored when ``model`` is already a Target).
        fallback: :class:`eagle.fallback.FallbackConfig`; when enabled, steps run without drafting
            while drafting measures slower than plain decoding (see eagle/fallback.py); what it
            has measured carries over from one ``generate`` call to the next.
        runtime: :class:`eagle.runtime.RuntimeConfig` of the target's forward (cache kind, buckets,
            precision, compilation); ignored when ``model`` is already a Target. Its buckets are cut
            at the drafter's largest tree (:meth:`make_target`).

    Example::

        dec = TreeDecoder.from_config(model, "eagle2-cpu")
        out = dec.generate(ids, max_new_tokens=64)
        print(out.tokens, out.stats.tau)
    """

    def __init__(self, model, drafter: Drafter | None = None, eos_token_id=None, attention: str = "auto",
                 fallback: FallbackConfig | None = None, runtime: RuntimeConfig | None = None):
        self.drafter = drafter or NoDrafter()
        shape = getattr(self.drafter, "shape", None)
        shape = shape if isinstance(shape, TreeShape) else None
        self.target = self.make_target(model, type(self.drafter).max_nodes(shape, getattr(self.drafter, "options", None)),
                                       attention, runtime)
        self.eos = _eos_set(self.target.model, eos_token_id)
        self.fallback = fallback or FallbackConfig()
        self.policy = FallbackPolicy(self.fallback)  # kept across generate calls (eagle/fallback.py)
        # the shape's own state (tree.shape auto: its costs and calibration), kept across generate calls
        if self.drafter.tree_policy is None and shape is not None:
            self.drafter.tree_policy = shape.new_policy(self.target.runtime.buckets)
        self.tree_policy = self.drafter.tree_policy

    @staticmethod
    def make_target(model, max_nodes: int | None, attention: str = "auto",
                    runtime: RuntimeConfig | None = None) -> Target:
        """``model`` as the decoder's :class:`eagle.Target`: as given when it is one, else wrapped with
        ``runtime``'s buckets cut at ``max_nodes``, the drafter's largest tree
        (:meth:`eagle.runtime.RuntimeConfig.fitted`; 16-bit steps at a multiple of 16 rows; all
        buckets kept when ``max_nodes`` is None)."""
        if isinstance(model, Target):
            return model
        runtime = runtime or RuntimeConfig()
        if max_nodes is not None:
            dtype = getattr(torch, runtime.dtype) if runtime.dtype else model.get_output_embeddings().weight.dtype
            runtime = runtime.fitted(max_nodes, 16 if dtype.itemsize == 2 else 1)
        return Target(model, attention, runtime)

    @classmethod
    def from_config(cls, model, config, eos_token_id=None) -> "TreeDecoder":
        """The decoder and its drafter from a config: a :class:`eagle.config.DecodeConfig`, a
        mapping, a YAML path or a shipped config's name (``"eagle2-cpu"``; :func:`eagle.config.as_config`).
        The target is made as the constructor makes it (:meth:`make_target`), at the config's largest
        tree, before the drafter that needs it."""
        config = as_config(config)
        target = cls.make_target(model, config.max_tree_nodes(), config.attention, config.runtime)
        return cls(target, config.build_drafter(target), eos_token_id, fallback=config.fallback)

    @staticmethod
    def _sample(logits: torch.Tensor, sampling: Sampling) -> int:
        """One token drawn from ``logits (V,)`` at the sampling settings (greedy steps take
        ``TreeOutput.greedy()`` instead)."""
        probs = probs_from_logits(logits, sampling.temperature, sampling.top_p).cpu()
        return int(torch.multinomial(probs, 1, generator=sampling.generator))

    def cache_room(self, prompt_len: int, max_new_tokens: int) -> int:
        """Positions the KV cache of a ``generate`` call gets: the prompt, the answer and the largest
        bucketed tree (the target rounds it up, :meth:`eagle.Target.cache_capacity`)."""
        return prompt_len + max_new_tokens + self.target.runtime.buckets[-1]

    @torch.no_grad()
    def generate(self, input_ids, max_new_tokens: int, temperature: float = 0.0, top_p: float = 1.0,
                 seed: int | None = None,
                 on_tokens: Callable[[list[int]], None] | None = None, cache_room: int | None = None) -> GenerationResult:
        """Generate up to ``max_new_tokens`` new tokens after ``input_ids`` (1-D, or (1, N)).

        Greedy when ``temperature == 0`` (identical to plain greedy decoding); otherwise exact
        sampling from the target at that temperature / top-p. Stops right after an EOS token.
        ``on_tokens`` is called with each batch of newly accepted tokens (for streaming).
        ``cache_room``: allocate the KV cache for at least this many positions (default: what this
        generation needs, :meth:`cache_room`); a warm-up passes a longer generation's room so that
        compiled steps meet the cache shape that generation will have.
        """
        ids = torch.as_tensor(input_ids, dtype=torch.long)
        if ids.dim() == 2:
            if ids.shape[0] != 1:
                raise ValueError(f"generate takes one sequence, got a batch of {ids.shape[0]}")
            ids = ids[0]
        if ids.dim() != 1 or len(ids) == 0:
            raise ValueError("input_ids must be a non-empty 1-D sequence of token ids")
        if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be a positive integer, got {max_new_tokens!r}")
        if temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {temperature}")
        if not 0.0 < top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {top_p}")
        if len(ids) + max_new_tokens > self.target.max_positions:
            raise ValueError(f"prompt of {len(ids)} tokens + {max_new_tokens} new tokens exceeds the model's "
                             f"context of {self.target.max_positions} positions")
        gen = None
        if temperature > 0:
            gen = torch.Generator()
            gen.manual_seed(seed if seed is not None else int(torch.randint(0, 2**62, ())))
        sampling = Sampling(temperature, top_p, gen)
        target, drafter, stats = self.target, self.drafter, DecodeStats(prompt_tokens=len(ids), generations=1)
        ids = ids.to(target.device)

        t0 = time.perf_counter()
        # room for the prompt, the answer and the largest bucketed tree (a larger tree grows it)
        cache = target.new_cache(max(self.cache_room(len(ids), max_new_tokens), cache_room or 0))
        layers = drafter.feature_layers  # EAGLE-3: fused low/mid/high target layers, else the final feature
        out = target.prefill(ids, cache, layers)
        if self.tree_policy is not None:  # verification costs on this cache capacity (once per capacity)
            self.tree_policy.prepare(target, cache, layers)
        root = int(out.greedy()[-1]) if sampling.greedy else self._sample(out.logits[-1], sampling)
        drafter.reset(ids)
        drafter.extend(out.features, torch.cat([ids[1:], ids.new_tensor([root])]))
        stats.prefill_s = time.perf_counter() - t0
        emitted = [root]
        if on_tokens:
            on_tokens([root])
        done = root in self.eos or max_new_tokens == 1
        policy = self.policy

        while not done:
            t0 = time.perf_counter()
            drafting = policy.use_draft()
            tree = drafter.propose(root, sampling) if drafting else Tree.chain([root])
            t1 = time.perf_counter()
            prefix_len = cache.get_seq_length()
            res = target.tree_forward(tree, cache, layers)
            # the LM head runs on first use: here, inside the forward's time
            scores = res.greedy() if sampling.greedy else res.logits  # (T,) argmax | (T, V)
            t2 = time.perf_counter()
            path, bonus = greedy_accept(tree, scores) if sampling.greedy else verify(tree, scores, temperature, top_p, gen)
            Target.commit(cache, prefix_len, path)
            if tree.side is not None:  # rows the drafter ran beside the tree (e.g. a lookahead window)
                drafter.observe_side(res.side)
            new = tree.tokens[path[1:]].tolist() + [bonus]
            # stop exactly at EOS or at the token budget
            room = max_new_tokens - len(emitted)
            for i, tok in enumerate(new):
                if tok in self.eos or i + 1 >= room:
                    new, done = new[: i + 1], True
                    break
            emitted.extend(new)
            stats.target_forwards += 1
            stats.plain_steps += not drafting
            stats.tree_nodes += len(tree)
            stats.side_rows += len(tree.side) if tree.side is not None else 0
            stats.record(int(tree.depth.max()), len(path) - 1, len(tree))
            if on_tokens:
                on_tokens(new)
            if not done:
                drafter.extend(res.features[path], torch.tensor(new, device=res.hidden.device))
                root = bonus
            t3 = time.perf_counter()
            policy.record(drafting, len(new), t3 - t0)
            if self.tree_policy is not None:
                self.tree_policy.observe(tree, path, t1 - t0, t2 - t1, t3 - t2)
            stats.draft_s += t1 - t0
            stats.verify_s += t2 - t1
            stats.other_s += t3 - t2

        stats.new_tokens = len(emitted)
        return GenerationResult(emitted, stats)
