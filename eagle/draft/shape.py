"""Tree shapes: how a model-like drafter grows its tree each step, chosen by ``tree.shape``.

A shape registers with :func:`register_tree_shape` and is built as ``cls(options)`` from its
nested dataclass ``Options`` (the ``tree:`` section's keys other than ``shape``). Drafters stay
shape-agnostic: they read the common interface (``depth``, ``top_k``, ``max_nodes``) and call
``grow``. Shipped: ``chain`` and ``static`` (fixed choice lists, here), ``dynamic`` (EAGLE-2,
here) and ``auto`` (sized each step from measured costs, eagle/draft/auto.py)."""
from __future__ import annotations

from abc import ABCMeta, abstractmethod
from dataclasses import dataclass, field
from typing import Any

from ..tree import Tree, chain_choices, choices_to_parents
from .base import Sampling
from .grow import Expand, grow_dynamic, grow_static
from .registry import Registry

__all__ = ["TreeShape", "ChainShape", "StaticShape", "DynamicShape", "TREE_SHAPES", "register_tree_shape"]


class _ShapeMeta(ABCMeta):
    def __call__(cls, *args, **kwargs):
        if cls is TreeShape:  # TreeShape("dynamic", depth=4): the registered shape of that name
            return _by_name(*args, **kwargs)
        return super().__call__(*args, **kwargs)


@dataclass(init=False)
class TreeShape(metaclass=_ShapeMeta):
    """One tree shape with its options. ``shape``: its registered name; ``options``: its ``Options``
    (checked by ``Options.validate()`` where the shape has one, here at construction).
    ``TreeShape(name, **options)`` is the registered shape ``name`` with those options, e.g.
    ``TreeShape("dynamic", depth=4, top_k=3, total_tokens=7)``; a subclass is built as ``cls(options)``.

    The common interface:

    * ``depth``: the most drafted levels (the root is depth 0);
    * ``top_k``: the most nodes one level expands at once (a drafted level's rows);
    * ``max_nodes``: the most nodes of a tree, root included;
    * ``grow(root, expand, sampling, ...)``: the step's tree (``expand``: eagle/draft/grow.py);
    * ``validate()``: ``ValueError`` on options that cannot make a tree;
    * ``samples``: whether ``grow`` can draw children by sampling (``drafter.sample``);
    * ``needs_grow``: whether only a drafter growing through ``grow`` can draft it;
    * ``new_policy(buckets)``: per-decoder state the shape needs (kept across generations), or None.
    """

    shape: str
    options: Any
    name = ""  # the registered name, set by register_tree_shape
    samples = False
    needs_grow = False

    @dataclass
    class Options:
        """No options."""

    def __init__(self, options=None):
        self.shape = type(self).name
        self.options = options if options is not None else type(self).Options()
        self.validate()

    def validate(self) -> None:
        """``ValueError`` where the options cannot make a tree (``Options.validate()``)."""
        validate = getattr(self.options, "validate", None)
        if validate is not None:
            validate()

    @property
    @abstractmethod
    def depth(self) -> int:
        ...

    @property
    @abstractmethod
    def top_k(self) -> int:
        ...

    @property
    @abstractmethod
    def max_nodes(self) -> int:
        ...

    def new_policy(self, buckets: list[int]):
        """State a decoder keeps for this shape across generations (given its target's step
        buckets) and hands its drafter as ``tree_policy``; None for shapes without any."""
        return None

    @abstractmethod
    def grow(self, root: int, expand: Expand, sampling: Sampling, sample: bool = False, vocab_map=None,
             vocab_size: int | None = None, policy=None) -> Tree:
        """Grow this shape from ``root``; ``vocab_map``/``vocab_size``: see :mod:`eagle.draft.grow`;
        ``sample``: draw children without replacement from the draft (shapes with ``samples``);
        ``policy``: what :meth:`new_policy` made."""


TREE_SHAPES = Registry("tree shape", TreeShape)


def register_tree_shape(name: str):
    """``@register_tree_shape(name)``: a class decorator that makes a :class:`TreeShape` subclass
    with a nested dataclass ``Options`` the config's ``tree.shape: name`` (docs/extending.md)."""
    return TREE_SHAPES.register(name)


def _by_name(shape: str, **options) -> TreeShape:
    cls = TREE_SHAPES.get(shape)
    if cls is None:
        raise ValueError(f"tree.shape must be one of the registered tree shapes ({', '.join(TREE_SHAPES.names())}), "
                         f"got '{shape}'")
    return cls(cls.Options(**options))


def _at_least_one(**values: int) -> None:
    for key, v in values.items():
        if v < 1:
            raise ValueError(f"tree.{key} must be >= 1, got {v}")


@register_tree_shape("chain")
class ChainShape(TreeShape):
    """``depth`` tokens, each the best (or a sampled) child of the one before."""

    samples = True

    @dataclass
    class Options:
        depth: int = 4

        def validate(self) -> None:
            _at_least_one(depth=self.depth)

    depth = property(lambda self: self.options.depth)
    top_k = property(lambda self: 1)
    max_nodes = property(lambda self: 1 + self.options.depth)

    def grow(self, root, expand, sampling, sample=False, vocab_map=None, vocab_size=None, policy=None) -> Tree:
        return grow_static(root, chain_choices(self.depth), expand, sampling, sample, vocab_map, vocab_size)


@register_tree_shape("static")
class StaticShape(TreeShape):
    """A fixed choice list (Medusa / EAGLE-1): each entry is a path of child ranks from the root,
    every prefix of a path itself an entry."""

    samples = True

    @dataclass
    class Options:
        choices: list[list[int]] = field(default_factory=list)

        def validate(self) -> None:
            if not self.choices:
                raise ValueError("tree.shape 'static' needs a non-empty tree.choices list")
            choices_to_parents(self.choices)  # raises on malformed lists

    @property
    def depth(self) -> int:
        return max(len(c) for c in self.options.choices)

    @property
    def top_k(self) -> int:
        """The most nodes of one depth that have children (the nodes a level expands)."""
        parents, _ = choices_to_parents(self.options.choices)
        depth = [0] * len(parents)
        for i in range(1, len(parents)):
            depth[i] = depth[parents[i]] + 1
        expanding = {p for p in parents[1:]}
        per_depth: dict[int, int] = {}
        for node in expanding:
            per_depth[depth[node]] = per_depth.get(depth[node], 0) + 1
        return max(per_depth.values())

    @property
    def max_nodes(self) -> int:
        return 1 + len(self.options.choices)

    def grow(self, root, expand, sampling, sample=False, vocab_map=None, vocab_size=None, policy=None) -> Tree:
        return grow_static(root, self.options.choices, expand, sampling, sample, vocab_map, vocab_size)


@register_tree_shape("dynamic")
class DynamicShape(TreeShape):
    """EAGLE-2's dynamic tree: ``depth`` levels, the ``top_k`` best frontier nodes expanded with
    their ``top_k`` best children each, the best ``total_tokens`` drafted nodes kept."""

    @dataclass
    class Options:
        depth: int = 4
        top_k: int = 10
        total_tokens: int = 60

        def validate(self) -> None:
            _at_least_one(depth=self.depth, top_k=self.top_k, total_tokens=self.total_tokens)

    depth = property(lambda self: self.options.depth)
    top_k = property(lambda self: self.options.top_k)

    @property
    def max_nodes(self) -> int:
        """``total_tokens + 1``, or the whole candidate pool (``top_k`` at the first level and
        ``top_k**2`` at each later one, root included) when that is smaller."""
        o = self.options
        return 1 + min(o.total_tokens, o.top_k + (o.depth - 1) * o.top_k ** 2)

    def grow(self, root, expand, sampling, sample=False, vocab_map=None, vocab_size=None, policy=None) -> Tree:
        o = self.options
        return grow_dynamic(root, o.depth, o.top_k, o.total_tokens, expand, sampling, vocab_map)
