"""The drafter interface: everything the decoding loop needs from a drafter, nothing more."""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

from ..tree import Tree
from .registry import Registry

__all__ = ["Drafter", "NoDrafter", "Sampling", "DRAFTERS", "register_drafter"]


@dataclass(frozen=True)
class Sampling:
    """How tokens are chosen: greedy when ``temperature == 0``; drafts must use the same settings."""

    temperature: float = 0.0
    top_p: float = 1.0
    generator: torch.Generator | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


class Drafter(ABC):
    """A drafter proposes a candidate tree rooted at the last emitted token.

    The decoder drives it with three calls:

    * ``reset(prompt_ids)`` once per generation;
    * ``extend(features, tokens)`` whenever target positions become final: ``features (m, H)`` are
      the target's last hidden states at those positions (or, when the drafter sets
      ``feature_layers``, the hidden states entering those target layers, concatenated:
      ``(m, k*H)``) and ``tokens (m,)`` the token that follows each of them (for the prompt:
      ``prompt[1:] + [first token]``);
    * ``propose(root, sampling) -> Tree`` once per step.

    A drafter whose trees carry side rows (:class:`eagle.tree.SideRows`, e.g. lookahead decoding's
    window) gets their output from the same target forward through :meth:`observe_side`, after
    verification and before ``extend``.

    A drafter that a config can name registers with :func:`register_drafter` and is built as
    ``cls(target, tree, options)``: the :class:`eagle.Target`, the config's tree shape
    (:class:`eagle.draft.shape.TreeShape`) and its nested dataclass ``Options`` filled from the
    ``drafter:`` section's other keys (an optional ``Options.validate()`` raises ``ValueError``
    on bad values). Subclasses that take the defaults keep ``target``, ``shape`` and ``options``.
    """

    name = ""  # the registered name (``drafter.type``), set by register_drafter
    # transformers ``hidden_states`` indices the drafter reads instead of the final feature
    feature_layers: tuple[int, ...] | None = None
    # what the tree shape's ``new_policy`` made (``tree.shape: auto``: the decoder's AutoTreePolicy,
    # eagle/draft/auto.py); a drafter growing its tree through ``TreeShape.grow`` passes it on as ``policy=``
    tree_policy = None
    # whether its trees come from ``self.shape.grow`` (a shape that only exists as grown, like
    # ``auto``, needs such a drafter)
    grows_tree = True

    @dataclass
    class Options:
        """No options."""

    def __init__(self, target=None, tree=None, options=None):
        self.target, self.shape = target, tree
        self.options = options if options is not None else type(self).Options()

    @classmethod
    def check(cls, tree, options) -> None:
        """Raise ``ValueError`` where ``options`` (or this drafter with ``tree``) cannot work; the
        config loader calls it. Checks ``options.validate()``, and that a ``sample: true`` option
        and a shape that only exists as grown get a shape and a drafter that can."""
        validate = getattr(options, "validate", None)
        if validate is not None:
            validate()
        if getattr(options, "sample", False) and not tree.samples:
            raise ValueError(f"drafter.sample: true needs a tree shape that samples its children (chain, static), "
                             f"not '{tree.shape}' (it is always grown from the draft's top-k)")
        if tree.needs_grow and not cls.grows_tree:
            raise ValueError(f"tree.shape '{tree.shape}' needs a drafter that grows a tree through the shape, "
                             f"not '{cls.name}'")

    @classmethod
    def check_files(cls, tree, options) -> None:
        """Read what ``options`` name on disk (a checkpoint's config, its weight file's header) and
        raise where it cannot work, before any model loads (``eagle bench`` / ``eagle generate``)."""

    @classmethod
    def max_nodes(cls, tree, options) -> int | None:
        """The most nodes (root included) of a tree this drafter proposes with ``tree`` and
        ``options``: the target's step buckets are cut there. None: not known (a drafter built
        without a shape)."""
        return None if tree is None else tree.max_nodes

    def reset(self, prompt_ids: torch.Tensor) -> None:
        # history[i + 1] is always the token that follows position i; the first ``extend`` call
        # brings the rest of the prompt and the first generated token.
        self.history: list[int] = prompt_ids[:1].tolist()

    def extend(self, features: torch.Tensor, tokens: torch.Tensor) -> None:
        self.history.extend(tokens.tolist())

    @abstractmethod
    def propose(self, root: int, sampling: Sampling) -> Tree:
        ...

    def observe_side(self, side) -> None:
        """The output (:class:`eagle.target.TreeOutput`: ``greedy()``, ``logits``, ``hidden``) of
        the side rows the last proposed tree carried, from the verifying forward. Default: ignored."""


DRAFTERS = Registry("drafter", Drafter)


def register_drafter(name: str):
    """``@register_drafter(name)``: a class decorator that makes a :class:`Drafter` subclass with a
    nested dataclass ``Options`` the config's ``drafter.type: name``; the decoder builds it as
    ``cls(target, tree, options)`` (docs/extending.md)."""
    return DRAFTERS.register(name)


@register_drafter("none")
class NoDrafter(Drafter):
    """Plain decoding through the same loop: a one-node tree, one token per target forward."""

    grows_tree = False

    @classmethod
    def max_nodes(cls, tree, options) -> int:
        return 1

    def propose(self, root: int, sampling: Sampling) -> Tree:
        return Tree.chain([root])
