"""Drafters behind one small interface (:class:`Drafter`) and the tree shapes they grow, each
registered by name (:func:`register_drafter`, :func:`register_tree_shape`). A config names them
(``drafter.type``, ``tree.shape``); :mod:`eagle.config` finds the class and fills its ``Options``.
Drafters with weights of their own register from their modules (eagle/heads, eagle/draft_model.py)."""
from __future__ import annotations

from .auto import AutoShape
from .base import DRAFTERS, Drafter, NoDrafter, Sampling, register_drafter
from .ngram import NgramDrafter
from .selfdraft import SelfDrafter
from .shape import TREE_SHAPES, ChainShape, DynamicShape, StaticShape, TreeShape, register_tree_shape

__all__ = ["Drafter", "NoDrafter", "NgramDrafter", "SelfDrafter", "Sampling", "TreeShape", "ChainShape", "StaticShape",
           "DynamicShape", "AutoShape", "DRAFTERS", "TREE_SHAPES", "register_drafter", "register_tree_shape"]
