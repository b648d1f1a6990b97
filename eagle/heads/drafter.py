"""Drafting with the EAGLE head: level by level, all frontier nodes of a level in one head forward.

The head keeps its own KV cache of committed pairs ``(f_i, x_{i+1})`` (true target features): a
preallocated :class:`eagle.kv.SlotCache`, like the target's. While drafting, tree nodes write their
entries at the slots after the committed ones (in the order they are run) and attend to the
committed prefix plus their own ancestors; the committed length never moves, so the next
``propose`` simply overwrites them with the newly accepted pairs (recomputed from the target's true
features).

``dtype`` runs the head's fc + layer and the draft LM head in another precision than the target
(e.g. bfloat16: half the weight bytes per level, and native bf16 products where the machine has them).
Drafts only propose; the verifier still checks every token against the target in its own precision,
so this changes speed and acceptance, never the output. The head's products run the target
backend's fastest way (``Backend.fast_linears``, ``Backend.project``).

Where the target's backend compiles draft levels (``runtime.compile`` on CUDA), the head's tree levels are compiled too: a level's
new nodes are padded to a fixed row count (``level_rows``, a power of two >= ``top_k``) and attend
over the whole cache buffer under a dense mask (committed slots + their ancestors' slots), so every
level of every step is the same graph (one per row count and cache capacity); padding rows write
their keys past the level's nodes, where the next level writes its own.
"""
from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field

import torch

from .eagle import DraftHead
from .int8 import int8_copy, quantize_rows
from ..attention import sharing_copy
from ..kv import SlotCache
from ..target import Target
from ..tree import Tree
from ..draft.base import Drafter, Sampling, register_drafter
from ..draft.shape import TreeShape
from ..runtime import DTYPES


def fastest_dtype(target: Target, head: DraftHead, rows: int) -> torch.dtype:
    """``drafter.dtype: auto``: the precision, float32, bfloat16 or weight-only int8 (``torch.int8``),
    in which a tree level's products (``rows`` rows: the head's linear layers and the draft LM head)
    run fastest here, as the target's backend finds it (``Backend.draft_dtype``). A draft only
    proposes, so each keeps decoding lossless."""
    linears = [m for m in head.modules() if type(m) is torch.nn.Linear]
    return target.backend.draft_dtype(head.draft_weight(target.lm_head).detach(), linears, rows)  # (Vd, H) head


class EagleDrafter(Drafter):
    """Drafts with an EAGLE-1/2 head (:class:`~eagle.heads.eagle.DraftHead`) or an EAGLE-3 head
    (:class:`~eagle.heads.eagle3.Eagle3Head`): both take ``(hidden, token embedding)`` pairs and
    predict the next hidden state; they differ in what enters from the target (``head.enter``: the
    final feature as is, or fused layers through ``fc``), in the readout (``head.pre_logits``,
    ``head.draft_weight``) and in the draft-to-target vocabulary map (``head.vocab_map``).

    ``head`` is used as given when ``dtype`` is None or its own dtype; otherwise the drafter
    works on a copy cast to ``dtype`` (the rotary embedding stays in float32: positions in the
    hundreds are not representable exactly in bfloat16)."""

    def __init__(self, target: Target, head: DraftHead, shape: TreeShape, sample: bool = False,
                 dtype: torch.dtype | None = None, prompt_vocab: bool = False, int8: bool = False):
        if prompt_vocab and (head.feature_layers or head.vocab_map is None):
            raise ValueError("drafter.prompt_vocab needs an EAGLE-1/2 head with a reduced draft vocabulary (it "
                             "drafts through the target's LM head rows; an EAGLE-3 head has its own LM head)")
        self.prompt_vocab = prompt_vocab
        given = head
        self.dtype = dtype or head.fc.weight.dtype
        if self.dtype != head.fc.weight.dtype:
            head = copy.deepcopy(head)
            for name, child in head.named_children():
                if name != "rotary":
                    child.to(self.dtype)
        lm_w = head.draft_weight(target.lm_head).detach().to(self.dtype)  # (Vd, H)
        mm = target.backend.int8_linear
        if int8:  # weight-only int8 products (eagle/heads/int8.py); the rest in self.dtype. An
            # EAGLE-3 head's own LM head is read only as the draft LM head, quantized below
            head = int8_copy(head, mm, skip=getattr(head, "lm_head", None))
        else:  # faster products for a level's rows (top_k frontier nodes) where the backend has a way
            head = target.backend.fast_linears(head, shape.top_k) or head
        # the head's tree levels go through the target's tree kernel, or the backend's attention
        # for grouped-query heads (each KV head read once for its query heads, no K/V copies)
        attention = target.backend.head_attention(head.layer_config, target.use_kernel)
        if attention is not None:
            if head is given:  # a config of its own: the caller's head keeps its attention
                head = sharing_copy(head)
            head.layer_config._attn_implementation = attention
        self.target, self.head, self.shape, self.sample = target, head, shape, sample
        self.feature_layers = head.feature_layers
        self.lm_w = lm_w
        self.int8 = int8
        if int8:  # the draft LM head as int8 rows and their scales: (Vd, H), (Vd,)
            lm_q, lm_scale = quantize_rows(self.lm_w)
            self._project = lambda x: mm(x, lm_q, lm_scale)
        else:
            self._project = lambda x: target.backend.project(x, self.lm_w)
        self.vocab = target.lm_head.weight.shape[0]
        vmap = head.vocab_map
        self.d2t = None if vmap is None else vmap.to(target.device)
        self.base_d2t = self.d2t
        self.extra_w = None  # prompt_vocab: the target LM head rows of the prompt's tokens outside Vd
        # compile the tree levels with the target's steps where the backend says it pays (CUDA
        # graphs; on the CPU compiled levels drafted no faster than eager ones: docs/cpu-backend.md)
        self.compiled = target.compiled and target.backend.compiles_draft_levels
        self._levels: dict = {}  # (rows, cache capacity) -> compiled level
        self.compile_s: dict[tuple[int, int], float] = {}  # (rows, capacity) -> seconds of its first call

    def reset(self, prompt_ids: torch.Tensor) -> None:
        super().reset(prompt_ids)
        if self.prompt_vocab:  # answers copy their prompt (summaries, RAG): its tokens become draftable
            ids = prompt_ids.to(self.base_d2t.device).unique()
            extra = ids[~torch.isin(ids, self.base_d2t)]  # (E,) target ids outside the draft vocabulary
            self.extra_w = self.target.lm_head.weight[extra].detach().to(self.dtype) if len(extra) else None
            self.d2t = torch.cat([self.base_d2t, extra])  # (Vd + E,) draft id -> target id
        self.cache = SlotCache(1, 256)  # grows (rarely) when a generation needs more room
        self.pending_f: list[torch.Tensor] = []
        self.pending_x: list[torch.Tensor] = []

    def extend(self, features: torch.Tensor, tokens: torch.Tensor) -> None:
        super().extend(features, tokens)
        self.pending_f.append(features)
        self.pending_x.append(tokens)

    # ---- head calls ---------------------------------------------------------------------------
    def _forward(self, feats: torch.Tensor, toks: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor,
                 tree_mask: torch.Tensor | None = None) -> torch.Tensor:
        """``feats (n, H)``, ``toks (n,)``, ``pos (n,)``, ``mask (n, S)`` -> predicted features ``(n, H)``.
        The n new entries go to cache slots ``S - n .. S``. ``tree_mask``: the tree part of ``mask``
        (its last columns), for the tree-attention kernel."""
        n, S = mask.shape
        self.cache.reserve(S)
        slots = torch.arange(S - n, S, device=toks.device)  # (n,)
        emb = self.target.embed(toks)[None].to(self.dtype)  # (1, n, H)
        extra = {"tree_mask": tree_mask} if tree_mask is not None and self.target.use_kernel else {}
        out = self.head(feats[None].to(self.dtype), emb, pos[None], mask[None, None], cache=self.cache,
                        cache_slots=slots, cache_kv_len=S, **extra)
        return out[0]

    def level_rows(self, n: int) -> int:
        """Rows a compiled level of ``n`` new nodes is padded to: ``top_k``, or the next power of two."""
        rows = max(1, self.shape.top_k)
        while rows < n:
            rows *= 2
        return rows

    def _level_fixed(self, feats: torch.Tensor, toks: torch.Tensor, pos: torch.Tensor, committed: int,
                     tree_cols: torch.Tensor) -> torch.Tensor:
        """The compiled form of a tree level (same result as :meth:`_forward`): ``feats (n, H)``,
        ``toks (n,)``, ``pos (n,)``, ``tree_cols (n, S + n)`` (the ancestors among the S earlier tree
        entries, and self) -> ``(n, H)``. The n nodes go to slots ``committed + S ..``."""
        n, width = tree_cols.shape
        rows, dev = self.level_rows(n), toks.device
        start = committed + width - n  # the level's first slot
        self.cache.reserve(start + rows)
        C = self.cache.capacity
        allowed = torch.zeros(rows, C, dtype=torch.bool, device=dev)  # (rows, C) the whole buffer
        allowed[:, :committed] = True  # padding rows too: no row without a key (no NaN)
        allowed[:n, committed: committed + width] = tree_cols
        pad = rows - n
        feats = torch.cat([feats, feats[:1].expand(pad, -1)]) if pad else feats  # (rows, H)
        toks = torch.cat([toks, toks[:1].expand(pad)]) if pad else toks  # (rows,)
        pos = torch.cat([pos, pos[:1].expand(pad)]) if pad else pos  # (rows,)
        slots = torch.arange(start, start + rows, device=dev)  # (rows,) padding: past the level's nodes
        emb = self.target.embed(toks)[None].to(self.dtype)  # (1, rows, H)
        out = self._level_step(rows, C)(feats[None].to(self.dtype), emb, pos[None], allowed[None, None], slots,
                                        self.cache)
        return out[0, :n]

    def _level_step(self, rows: int, capacity: int):
        """The compiled head forward of a ``rows``-row level over a ``capacity``-slot cache."""
        key = (rows, capacity)
        if key in self._levels:
            return self._levels[key]
        head = self.head

        def level(feats, emb, pos, mask, slots, cache):  # the whole buffer: no cache_kv_len
            return head(feats, emb, pos, mask, cache=cache, cache_slots=slots)

        compiled = self.target.backend.compile(level)

        def first_call(*args):
            t0 = time.perf_counter()
            out = compiled(*args)
            self.compile_s[key] = time.perf_counter() - t0
            self._levels[key] = compiled
            return out

        return first_call

    def _logits(self, feats: torch.Tensor) -> torch.Tensor:
        """Draft logits ``(n, Vd)`` over the draft vocabulary (``self.d2t`` maps them to target ids);
        with ``prompt_vocab``, ``(n, Vd + E)``: the prompt's E other tokens after them."""
        x = self.head.pre_logits(feats)
        logits = self._project(x).float()
        if self.extra_w is None:
            return logits
        return torch.cat([logits, torch.nn.functional.linear(x, self.extra_w).float()], dim=-1)

    def catch_up(self) -> torch.Tensor:
        """Run the pending committed pairs through the head; returns the last predicted feature."""
        feats = self.head.enter(torch.cat(self.pending_f).to(self.dtype))  # (m, H): EAGLE-3 fuses (m, 3H)
        toks = torch.cat(self.pending_x)  # (m,)
        self.pending_f, self.pending_x = [], []
        c = self.cache.length
        pos = torch.arange(c, c + len(toks), device=toks.device)
        causal = torch.ones(len(toks), len(toks), dtype=torch.bool, device=toks.device).tril()
        mask = torch.cat([torch.ones(len(toks), c, dtype=torch.bool, device=toks.device), causal], dim=1)
        out = self._forward(feats, toks, pos, mask)[-1]
        self.cache.advance(len(toks))
        return out

    @torch.no_grad()
    def propose(self, root: int, sampling: Sampling) -> Tree:
        root_feat = self.catch_up()  # predicted feature at the root's position
        committed = self.cache.length
        dev = root_feat.device
        # Drafted nodes get cache slots in the order they are run. Per slot: its row in `feats`
        # (row 0 = the root's feature, row 1 + s = the feature predicted after slot s), its depth,
        # and its row of the ancestor matrix `anc` (slot x slot, self included).
        feats = root_feat[None]  # (1 + S, H)
        anc = torch.zeros(0, 0, dtype=torch.bool)  # (S, S), built on the CPU: a few small ops per level
        slot: dict[int, int] = {}  # tree node -> slot
        depth: list[int] = []  # slot -> depth of its node (the root is depth 0)

        def row(n: int) -> int:  # node -> its row in `feats`
            return 0 if n == 0 else 1 + slot[n]

        def expand(tree: Tree, nodes: list[int]) -> torch.Tensor:
            nonlocal feats, anc
            new = [n for n in nodes if n != 0 and n not in slot]
            if new:
                par = tree.parents[new].tolist()
                S, F = len(depth), len(new)
                ps = torch.tensor([slot.get(p, -1) for p in par], dtype=torch.long)  # (F,) -1 = the root
                # a new node sees its parent's ancestors and its parent (nothing for the root's children)
                above = anc[ps.clamp(min=0)] & (ps >= 0)[:, None] if S else torch.zeros(F, 0, dtype=torch.bool)
                tree_cols = torch.cat([above, torch.eye(F, dtype=torch.bool)], dim=1)  # (F, S + F)
                anc = torch.cat([torch.cat([anc, torch.zeros(S, F, dtype=torch.bool)], dim=1), tree_cols])
                d_new = [1 + (depth[slot[p]] if p else 0) for p in par]
                for n, d in zip(new, d_new):
                    slot[n] = len(depth)
                    depth.append(d)
                tree_cols = tree_cols.to(dev)
                pos = committed - 1 + torch.tensor(d_new, device=dev)  # (F,)
                f_in = feats[torch.tensor([row(p) for p in par], device=dev)]  # (F, H)
                if self.compiled:  # builds its own mask over the whole buffer
                    out = self._level_fixed(f_in, tree.tokens[new].to(dev), pos, committed, tree_cols)
                else:
                    mask = torch.cat([torch.ones(F, committed, dtype=torch.bool, device=dev), tree_cols], dim=1)
                    out = self._forward(f_in, tree.tokens[new].to(dev), pos, mask, tree_cols)
                feats = torch.cat([feats, out])
            return self._logits(feats[torch.tensor([row(n) for n in nodes], device=dev)])

        # the drafted slots stay beyond the committed length: the next catch-up overwrites them
        return self.shape.grow(root, expand, sampling, self.sample, vocab_map=self.d2t, vocab_size=self.vocab,
                               policy=self.tree_policy)


# ---- the config's drafters: drafter.type eagle / eagle3 ----------------------------------------
@dataclass
class HeadOptions:
    """``drafter:`` keys of an EAGLE head drafter."""

    head: str = field(default="", metadata={"path": "file"})  # the head checkpoint folder
    sample: bool = False  # sample children without replacement from q (temperature > 0) instead of top-k
    # run the head in float32 | bfloat16 | float16 | int8 (weight-only int8 products, the rest in the
    # target's precision) | auto (the fastest here of float32, bfloat16 and int8); "" = the target's
    dtype: str = ""

    def validate(self) -> None:
        if self.dtype not in HEAD_DTYPES:
            raise ValueError(f"drafter.dtype must be one of {HEAD_DTYPES[1:]} (or empty for the target's), "
                             f"got '{self.dtype}'")

    def precision(self, target: Target, head: DraftHead, tree: TreeShape) -> dict:
        """The drafter's ``dtype`` and ``int8`` arguments for this ``dtype`` option (``auto``:
        :func:`fastest_dtype` for a level of ``tree.top_k`` rows)."""
        if self.dtype == "int8":
            return {"dtype": None, "int8": True}
        if self.dtype == "auto":
            dtype = fastest_dtype(target, head, rows=tree.top_k)
            return {"dtype": None, "int8": True} if dtype == torch.int8 else {"dtype": dtype, "int8": False}
        return {"dtype": getattr(torch, self.dtype) if self.dtype else None, "int8": False}


HEAD_DTYPES = ("", "auto") + DTYPES + ("int8",)


@dataclass
class EagleOptions(HeadOptions):
    prompt_vocab: bool = False  # the prompt's tokens join the draft vocabulary per generation


@register_drafter("eagle")
class EagleHeadDrafter(EagleDrafter):
    """``drafter.type: eagle``: :class:`EagleDrafter` with an EAGLE-1/2 head loaded from
    ``options.head`` (resolved from the config file's folder by the loader) onto the target's
    device, in ``options.dtype`` (:meth:`HeadOptions.precision`)."""

    Options = EagleOptions

    def __init__(self, target: Target, tree: TreeShape, options: HeadOptions):
        from . import load_head  # the package's, looked up when called

        head = load_head(options.head, target.model).to(target.device)
        kind = "eagle3" if head.feature_layers else "eagle"
        if kind != self.name:
            raise ValueError(f"head {options.head} is an {kind} head: use drafter type '{kind}', not '{self.name}'")
        super().__init__(target, head, tree, sample=options.sample, prompt_vocab=getattr(options, "prompt_vocab", False),
                         **options.precision(target, head, tree))
        self.options = options

    @classmethod
    def check(cls, tree: TreeShape, options: HeadOptions) -> None:
        if not options.head:
            raise ValueError(f"drafter.type '{cls.name}' needs drafter.head (a head checkpoint folder)")
        super().check(tree, options)

    @classmethod
    def check_files(cls, tree: TreeShape, options: HeadOptions) -> None:
        from . import check_head

        check_head(options.head)


@register_drafter("eagle3")
class Eagle3HeadDrafter(EagleHeadDrafter):
    """``drafter.type: eagle3``: as ``eagle``, with an EAGLE-3 head."""

    Options = HeadOptions
