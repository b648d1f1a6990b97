"""The backend interface, with the eager behaviour as its defaults.

A backend is made per :class:`~eagle.target.Target` (``eagle.backends.make_backend``) and holds what
it prepares for that target's model. What a Target asks of it:

* :meth:`Backend.prepare`: the model to run (a parameter-sharing view with another attention
  implementation; the caller's model is never changed), and whatever the backend builds beside it;
* :meth:`Backend.decoder` / :meth:`Backend.head_rows`: the decoder a static step of ``size`` rows
  runs, and how many of its rows the LM head multiplies (the padded bucket or the tree's);
* :meth:`Backend.compile_step`: the compiled form of one step function;
* :meth:`Backend.project` / :meth:`Backend.greedy_argmax`: the LM-head product and, where the
  backend has a faster way, its per-row argmax without every logit.

Drafters and training ask for :meth:`Backend.head_attention`, :meth:`Backend.fast_linears`,
:meth:`Backend.draft_dtype`, :meth:`Backend.int8_linear` and :meth:`Backend.fast_model` (the same speed-ups on their modules).
"""
from __future__ import annotations

import os

import torch
from torch import nn

from ..attention import attention_view, folds_gqa, register_gqa_sdpa
from .tree_kernel import register_tree_attention

__all__ = ["Backend", "use_inductor_cache"]


def use_inductor_cache() -> None:
    """Compiled graphs go under ``$EAGLE_CACHE/inductor`` (unless the user chose another folder
    than inductor's default), so a second process loads them from disk instead of compiling."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    from eagle_kernels.cpuinfo import cache_dir

    chosen = os.environ.get("TORCHINDUCTOR_CACHE_DIR")  # inductor itself fills in its default on first use
    if chosen is None or os.path.abspath(chosen) == os.path.abspath(default_cache_dir()):
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache_dir() / "inductor")


class Backend:
    """The eager backend: transformers' own forward with SDPA (grouped-query calls folded, see
    eagle/attention.py) or the Triton tree kernel; ``torch.compile`` for compiled steps."""

    name = "eager"
    tree_kernel_default = False  # whether attention "auto" takes the Triton tree kernel
    compiles_draft_levels = False  # whether a compiled target also compiles a draft head's tree levels
    compile_fallback = True  # a step whose compilation fails runs eagerly (with a warning) instead of raising

    def __init__(self, device="cpu"):
        self.device = torch.device(device)

    @classmethod
    def usable(cls, device) -> str | None:
        """Why this backend cannot run on ``device`` (one phrase), or ``None`` when it can."""
        return None

    # ---- the target -----------------------------------------------------------------------------
    def prepare(self, model: nn.Module, runtime, tree_kernel: bool) -> nn.Module:
        """The model a Target runs for ``runtime`` (an :class:`eagle.runtime.RuntimeConfig`):
        ``tree_kernel``: the model switched to the tree-attention kernel (the one change a Target
        makes to its model); else grouped-query SDPA models run on a parameter-sharing view."""
        if tree_kernel:
            model.set_attn_implementation(register_tree_attention())
            return model
        if folds_gqa(model.config.get_text_config(decoder=True)):
            return attention_view(model, self.gqa_attention())
        return model

    def gqa_attention(self) -> str:
        """The registered attention implementation grouped-query SDPA models (targets and draft
        heads) run on: query heads folded per KV head (eagle/attention.py)."""
        return register_gqa_sdpa()

    def decoder(self, size: int) -> nn.Module | None:
        """The decoder a static step of ``size`` rows runs (``None``: the model's own)."""
        return None

    def head_rows(self, size: int, nodes: int) -> int:
        """How many rows of a ``size``-row padded step (``nodes`` of them a tree's) the LM head
        multiplies; the first ``nodes`` logits are kept either way."""
        return nodes

    def compile_step(self, step, size: int, decoder: nn.Module):
        """The compiled form of ``step(tokens, positions, masks, slots, cache, decoder=None, **kernel)``
        for ``size``-row steps on ``decoder``: one fixed-shape graph."""
        use_inductor_cache()
        return torch.compile(lambda *args, **kw: step(*args, decoder=decoder, **kw), dynamic=False)

    def compile(self, fn):
        """``fn`` compiled for fixed shapes (a draft head's tree level)."""
        use_inductor_cache()
        return torch.compile(fn, dynamic=False)

    def project(self, hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """``hidden (T, H) @ weight (V, H).T -> (T, V)``."""
        return torch.nn.functional.linear(hidden, weight)

    def greedy_argmax(self, hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor | None:
        """``(T,)`` int64, the argmax of ``project(hidden, weight)`` per row (lowest index on a tie)
        without every logit, or ``None`` where this backend has no such way."""
        return None

    # ---- drafters and training ------------------------------------------------------------------
    def head_attention(self, config, tree_kernel: bool) -> str | None:
        """The attention implementation a draft head of layer ``config`` should run (``None``: its own)."""
        if tree_kernel:
            return register_tree_attention()
        return self.gqa_attention() if folds_gqa(config) else None

    def fast_linears(self, module: nn.Module, rows: int, upto: int = 64) -> nn.Module | None:
        """A parameter-sharing copy of ``module`` (a draft head; a model's layers) whose products
        of 1..``upto`` rows run faster here (timed at ``rows`` rows), or ``None``."""
        return None

    def draft_dtype(self, lm_weight: torch.Tensor, linears: list[nn.Linear], rows: int) -> torch.dtype:
        """``drafter.dtype: auto``: the precision in which a draft level's products (``rows`` rows
        through ``linears`` and the draft LM head ``lm_weight``) run fastest here; ``torch.int8``
        stands for weight-only int8 products (:meth:`int8_linear`)."""
        return torch.float32

    def int8_linear(self, x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        """``x (T, K) @ (q (N, K) int8 * scale (N,)).T -> (T, N)`` in ``x``'s dtype (weight-only int8
        drafting, eagle/heads/int8.py); here by dequantizing the weight."""
        from ..heads.int8 import int8_linear_reference

        return int8_linear_reference(x, q, scale)

    def fast_model(self, model: nn.Module, batch_sizes) -> nn.Module:
        """``model`` or a parameter-sharing twin whose forwards of ``batch_sizes`` rows run faster."""
        return model
