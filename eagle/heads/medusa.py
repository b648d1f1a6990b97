"""Medusa-1 heads: the simple baseline drafter of the lesson.

K heads read the target's last feature ``f_t`` (after its final norm) and nothing else. Head k
(k = 1..K) is one residual block ``h_k = f_t + SiLU(W_k f_t + b_k)`` followed by an LM head, and
predicts the token k + 1 steps after position t: the target's own LM head already gives
``x_{t+1}`` (the root of the decoding step's tree), so head k gives the candidates at tree depth k.
Unlike the EAGLE head, a Medusa head never sees the tokens it drafts: every node at depth d of a
tree gets the same candidates (head d's), so a whole tree costs one pass over the K heads.

The LM head is either ``shared`` (the target's frozen LM head, restricted to the draft vocabulary's
rows when there is one; not stored in the checkpoint) or ``own`` (one trainable LM head per head
over the draft vocabulary, initialised from the target's rows, as Medusa-1 does; stored). The
measured trade-off is in docs/results.md ("Medusa heads against the EAGLE head").

Checkpoint: a folder with ``config.json`` (``{"type": "medusa", "target", "model_type",
"hidden_size", "vocab_size", "num_heads", "lm_head", "draft_vocab"}``) and ``model.safetensors``
(``blocks.{k}.weight/bias``, ``lm_heads.{k}.weight`` for an own LM head; k from 0).
"""
from __future__ import annotations

import copy
import json
import tempfile
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from safetensors.torch import save_file
from torch import nn

from ..draft.base import Drafter, Sampling, register_drafter
from ..draft.shape import TreeShape
from ..io import check_safetensors, replace_dir
from ..tree import Tree
from .common import HeadError, check_tensor_shapes, read_checked_state, read_config_json

if TYPE_CHECKING:  # eagle.target imports transformers: not needed to read or check a checkpoint
    from ..target import Target

__all__ = ["MedusaHeads", "MedusaConfig", "MedusaDrafter", "save_medusa", "load_medusa", "read_medusa_config",
           "check_medusa", "is_medusa", "MedusaOptions", "MedusaHeadsDrafter", "LM_HEADS"]

LM_HEADS = ("shared", "own")
_FILES = "config.json + model.safetensors"


@dataclass
class MedusaConfig:
    target: str  # name or path of the target the heads were trained for
    model_type: str
    hidden_size: int
    vocab_size: int
    num_heads: int
    lm_head: str = "shared"  # shared: the target's frozen LM head | own: one trained LM head per head
    draft_vocab: list[int] = field(default_factory=list)  # draft id -> target id; empty = full vocabulary
    type: str = "medusa"

    def to_json(self) -> str:
        return json.dumps(asdict(self))


class MedusaHeads(nn.Module):
    """K Medusa-1 heads over hidden size H.

    Args:
        hidden_size: the target's hidden size H.
        num_heads: K.
        vocab_size: the target's vocabulary size V.
        draft_vocab: optional ``(Vd,)`` sorted target ids of a reduced draft vocabulary.
        lm_head: ``shared`` (the target's LM head rows, passed to :meth:`logits`) or ``own``
            (``K`` trainable ``(Vd, H)`` LM heads).
    """

    def __init__(self, hidden_size: int, num_heads: int, vocab_size: int, draft_vocab: torch.Tensor | None = None,
                 lm_head: str = "shared"):
        super().__init__()
        if lm_head not in LM_HEADS:
            raise ValueError(f"lm_head must be one of {LM_HEADS}, got '{lm_head}'")
        if num_heads < 1:
            raise ValueError(f"num_heads must be >= 1, got {num_heads}")
        H = hidden_size
        self.vocab_size, self.lm_head_kind = vocab_size, lm_head
        dv = torch.arange(0) if draft_vocab is None else torch.as_tensor(draft_vocab, dtype=torch.long)
        self.register_buffer("draft_vocab", dv, persistent=True)
        self.blocks = nn.ModuleList(nn.Linear(H, H) for _ in range(num_heads))
        vd = dv.numel() or vocab_size
        self.lm_heads = nn.ModuleList(nn.Linear(H, vd, bias=False) for _ in range(num_heads)) if lm_head == "own" else None
        # Medusa-1's start: every block is zero, so h_k = f_t and each head begins as the target's
        # own next-token prediction (the residual branch learns the look-ahead)
        with torch.no_grad():
            for b in self.blocks:
                b.weight.zero_()
                b.bias.zero_()

    @classmethod
    def for_target(cls, model, num_heads: int, draft_vocab: torch.Tensor | None = None,
                   lm_head: str = "shared") -> "MedusaHeads":
        """Fresh heads for ``model`` (an unmodified transformers causal LM); an own LM head starts as
        a copy of the target's (draft-vocabulary rows)."""
        tcfg = model.config.get_text_config(decoder=True)
        heads = cls(tcfg.hidden_size, num_heads, tcfg.vocab_size, draft_vocab, lm_head)
        w = model.get_output_embeddings().weight
        heads = heads.to(device=w.device, dtype=torch.float32)
        if heads.lm_heads is not None:
            with torch.no_grad():
                rows = w if heads.draft_vocab.numel() == 0 else w[heads.draft_vocab]
                for lm in heads.lm_heads:
                    lm.weight.copy_(rows)
        return heads

    @property
    def num_heads(self) -> int:
        return len(self.blocks)

    @property
    def hidden_size(self) -> int:
        return self.blocks[0].in_features

    def states(self, features: torch.Tensor, num: int | None = None) -> torch.Tensor:
        """``features (..., H)`` -> head states ``(..., k, H)`` of the first ``num`` heads (default all)."""
        blocks = self.blocks[: num or self.num_heads]
        return torch.stack([features + nn.functional.silu(b(features)) for b in blocks], dim=-2)

    def forward(self, features: torch.Tensor, shared_w: torch.Tensor | None = None) -> torch.Tensor:
        """``features (..., H)`` -> draft logits ``(..., K, Vd)`` of every head (``shared_w``: the
        shared LM head's ``(Vd, H)`` rows, see :meth:`lm_weight`; unused with own LM heads)."""
        return self.logits(self.states(features), shared_w)

    def lm_weight(self, lm_head: nn.Module) -> torch.Tensor:
        """``(Vd, H)`` rows of the target's LM head for the draft vocabulary (the shared LM head)."""
        w = lm_head.weight
        return w if self.draft_vocab.numel() == 0 else w[self.draft_vocab]

    def logits(self, states: torch.Tensor, shared_w: torch.Tensor | None = None) -> torch.Tensor:
        """Head states ``(..., k, H)`` -> draft logits ``(..., k, Vd)`` (head j's own LM head on
        ``states[..., j, :]``, or the shared rows ``shared_w (Vd, H)`` for every head)."""
        if self.lm_heads is None:
            return states @ shared_w.T
        return torch.stack([lm(states[..., j, :]) for j, lm in enumerate(self.lm_heads[: states.shape[-2]])], dim=-2)

    def flops_per_step(self, vocab: int | None = None) -> int:
        """Multiply-adds x 2 of drafting a whole tree (all K heads on one feature)."""
        vd = self.draft_vocab.numel() or vocab or self.vocab_size
        H = self.hidden_size
        return 2 * self.num_heads * (H * H + vd * H)


# ---------------------------------------------------------------------------------------------
# checkpoint


def save_medusa(heads: MedusaHeads, folder: str | Path, config: MedusaConfig, dtype: torch.dtype | None = None) -> None:
    """Write ``model.safetensors`` + ``config.json`` atomically into ``folder`` (weights cast to
    ``dtype`` when given; loading casts back to float32)."""
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=folder.name + ".tmp", dir=folder.parent))
    state = {k: v.detach().cpu().to(dtype or v.dtype).contiguous() for k, v in heads.state_dict().items()
             if k != "draft_vocab"}
    save_file(state, str(tmp / "model.safetensors"))
    (tmp / "config.json").write_text(config.to_json())
    replace_dir(tmp, folder)


def _read_json(folder: Path) -> dict:
    return read_config_json(folder, "Medusa head", "a Medusa head", _FILES)


def is_medusa(folder: str | Path) -> bool:
    """Whether ``folder`` holds a config.json of type medusa (nothing else is checked)."""
    try:
        return _read_json(Path(folder)).get("type") == "medusa"
    except HeadError:
        return False


def read_medusa_config(folder: str | Path) -> MedusaConfig:
    """The checked :class:`MedusaConfig` of a head folder, without loading weights.

    Raises :class:`HeadNotFoundError` when there is no such folder and :class:`HeadError` (one line
    naming the folder or file) for anything that is not a Medusa head checkpoint."""
    folder = Path(folder)
    raw = _read_json(folder)
    path = folder / "config.json"
    if raw.get("type") != "medusa":
        hint = ""
        if "type" not in raw and "hidden_size" in raw and "vocab_size" in raw and "num_hidden_layers" not in raw:
            hint = "; it looks like an EAGLE head: use drafter type 'eagle'"
        elif "architectures" in raw or "num_hidden_layers" in raw:
            hint = "; it looks like a causal LM or an official EAGLE head folder"
        raise HeadError(f"{folder}: not a Medusa head (config.json has no \"type\": \"medusa\"){hint}")
    known = [f.name for f in fields(MedusaConfig)]
    required = [f.name for f in fields(MedusaConfig) if f.default is MISSING and f.default_factory is MISSING]
    missing = [k for k in required if k not in raw]
    if missing:
        raise HeadError(f"{path}: a Medusa head config needs {', '.join(map(repr, missing))}")
    unknown = sorted(k for k in raw if k not in known)
    if unknown:
        raise HeadError(f"{path}: unknown keys {unknown} (a Medusa head config has {known})")
    for key, typ, what in (("target", str, "a string"), ("model_type", str, "a string"),
                           ("hidden_size", int, "an integer"), ("vocab_size", int, "an integer"),
                           ("num_heads", int, "an integer"), ("lm_head", str, "a string"), ("draft_vocab", list, "a list")):
        if key in raw and (not isinstance(raw[key], typ) or isinstance(raw[key], bool)):
            raise HeadError(f"{path}: '{key}' must be {what}, got {json.dumps(raw[key])[:60]}")
    if raw["hidden_size"] < 1 or raw["vocab_size"] < 1 or raw["num_heads"] < 1:
        raise HeadError(f"{path}: hidden_size, vocab_size and num_heads must be >= 1")
    if raw.get("lm_head", "shared") not in LM_HEADS:
        raise HeadError(f"{path}: 'lm_head' must be one of {LM_HEADS}, got {json.dumps(raw['lm_head'])[:60]}")
    if not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < raw["vocab_size"]
               for i in raw.get("draft_vocab", [])):
        raise HeadError(f"{path}: 'draft_vocab' must hold token ids in [0, {raw['vocab_size']})")
    if not (folder / "model.safetensors").is_file():
        raise HeadError(f"{folder}: no model.safetensors (the heads' weights; expected {_FILES})")
    return MedusaConfig(**raw)


def check_medusa(folder: str | Path) -> MedusaConfig:
    """:func:`read_medusa_config` plus a read of the weight file's header: the cheap check a command
    runs before the target loads."""
    cfg = read_medusa_config(folder)
    check_safetensors(Path(folder) / "model.safetensors", HeadError)
    return cfg


def load_medusa(folder: str | Path, model) -> MedusaHeads:
    """Load a Medusa checkpoint onto ``model`` (float32 weights on the model's device).

    Raises :class:`HeadError` for a folder that is not a readable Medusa head and
    :class:`HeadMismatchError` for heads trained for another hidden size, vocabulary or architecture,
    or whose tensors do not match their config (the message names the tensor)."""
    folder = Path(folder)
    cfg = read_medusa_config(folder)
    state = read_checked_state(f"Medusa head {folder}", folder, cfg, model)
    dv = torch.tensor(cfg.draft_vocab, dtype=torch.long) if cfg.draft_vocab else None
    heads = MedusaHeads(cfg.hidden_size, cfg.num_heads, cfg.vocab_size, dv, cfg.lm_head)
    expected = {k: tuple(v.shape) for k, v in heads.state_dict().items() if k != "draft_vocab"}
    check_tensor_shapes(f"Medusa head {folder}", {k: tuple(v.shape) for k, v in state.items()}, expected,
                        why=f"config.json says {cfg.num_heads} heads, lm_head '{cfg.lm_head}'", limit=1)
    heads.load_state_dict({k: v.float() for k, v in state.items()}, strict=False)
    heads.config = cfg
    return heads.to(model.get_output_embeddings().weight.device).eval()


# ---------------------------------------------------------------------------------------------
# drafting


class MedusaDrafter(Drafter):
    """Grows the configured tree shape with Medusa heads.

    It keeps the last committed target feature (the last row of ``extend``'s features: the position
    whose next token is the step's root). ``propose`` runs the heads the tree needs once on it;
    ``expand`` then answers every node at depth d with head d + 1's logits (Medusa-1 heads do not
    depend on the parent token). Static shapes and the dynamic shape come from the shared growers
    (eagle/draft/grow.py), so with ``sample`` the tree carries the draft distribution ``q`` of every
    expanded node and stochastic verification stays exact. ``dtype`` runs the blocks and the LM
    head(s) in that precision on a copy (drafts only; the output never changes).
    """

    def __init__(self, target: Target, heads: MedusaHeads, shape: TreeShape, sample: bool = False,
                 dtype: torch.dtype | None = None):
        from ..config import ConfigError
        self._project = target.backend.project
        depth = shape.depth
        if depth > heads.num_heads:
            raise ConfigError(f"tree depth {depth} needs {depth} Medusa heads, the head has {heads.num_heads} "
                              f"(tree.depth / the longest tree.choices entry must be <= {heads.num_heads})")
        self.dtype = dtype or torch.float32
        if heads.blocks[0].weight.dtype != self.dtype:
            heads = copy.deepcopy(heads).to(self.dtype)
        self.target, self.heads, self.shape, self.sample, self.depth = target, heads, shape, sample, depth
        # the shared LM head's rows (a cast copy when the dtype differs), or the own LM heads stacked
        # (D, Vd, H): one batched product in bf16/fp16 (measured faster than D separate ones here)
        if heads.lm_heads is None:
            self.lm_w, self.own_w = heads.lm_weight(target.lm_head).detach().to(self.dtype), None
        else:
            self.lm_w, self.own_w = None, torch.stack([lm.weight for lm in heads.lm_heads[:depth]]).detach()
        self.vocab = target.lm_head.weight.shape[0]
        self.d2t = heads.draft_vocab.to(target.device) if heads.draft_vocab.numel() else None

    def reset(self, prompt_ids: torch.Tensor) -> None:
        super().reset(prompt_ids)
        self.feature: torch.Tensor | None = None

    def extend(self, features: torch.Tensor, tokens: torch.Tensor) -> None:
        super().extend(features, tokens)
        self.feature = features[-1]

    @torch.no_grad()
    def head_logits(self) -> torch.Tensor:
        """``(D, Vd)`` float32 logits of the first D heads (D = the tree's depth) on the last feature."""
        states = self.heads.states(self.feature.to(self.dtype), self.depth)  # (D, H)
        if self.lm_w is not None:
            return self._project(states, self.lm_w).float()
        if self.dtype == torch.float32:  # per head, through the backend's product (its fastest way for one row)
            return torch.cat([self._project(states[j: j + 1], w) for j, w in enumerate(self.own_w)])
        return torch.bmm(self.own_w, states[:, :, None])[..., 0].float()  # (D, Vd, H) @ (D, H, 1)

    @torch.no_grad()
    def propose(self, root: int, sampling: Sampling) -> Tree:
        logits = self.head_logits()  # (D, Vd): row d - 1 drafts tree depth d

        def expand(tree: Tree, nodes: list[int]) -> torch.Tensor:
            par = tree.parents.tolist()
            rows = []
            for n in nodes:  # a node's depth; its children come from the next head
                d = 0
                while par[n] >= 0:
                    n, d = par[n], d + 1
                rows.append(d)
            return logits[torch.tensor(rows, device=logits.device)]

        return self.shape.grow(root, expand, sampling, self.sample, vocab_map=self.d2t, vocab_size=self.vocab,
                               policy=self.tree_policy)


@dataclass
class MedusaOptions:
    """``drafter:`` keys of the Medusa drafter."""

    head: str = field(default="", metadata={"path": "file"})  # the Medusa head folder
    sample: bool = False  # sample children without replacement from q (temperature > 0) instead of top-k
    dtype: str = ""  # blocks + LM head(s) in float32 | bfloat16 | float16 on a copy; "" = float32

    def validate(self) -> None:
        from ..runtime import DTYPES

        if self.dtype == "auto":
            raise ValueError("drafter.dtype 'auto' applies to the eagle and eagle3 drafters only; "
                             "give medusa a precision (float32 | bfloat16 | float16)")
        if self.dtype not in ("",) + DTYPES:
            raise ValueError(f"drafter.dtype must be one of {DTYPES} (or empty), got '{self.dtype}'")


@register_drafter("medusa")
class MedusaHeadsDrafter(MedusaDrafter):
    """``drafter.type: medusa``: :class:`MedusaDrafter` with the heads loaded from ``options.head``
    (resolved from the config file's folder by the loader)."""

    Options = MedusaOptions

    def __init__(self, target: Target, tree: TreeShape, options: MedusaOptions):
        super().__init__(target, load_medusa(options.head, target.model), tree, sample=options.sample,
                         dtype=getattr(torch, options.dtype) if options.dtype else None)
        self.options = options

    @classmethod
    def check(cls, tree: TreeShape, options: MedusaOptions) -> None:
        if not options.head:
            raise ValueError("drafter.type 'medusa' needs drafter.head (a Medusa head folder)")
        super().check(tree, options)

    @classmethod
    def check_files(cls, tree: TreeShape, options: MedusaOptions) -> None:
        k = check_medusa(options.head).num_heads
        if tree.depth > k:
            raise ValueError(f"tree depth {tree.depth} needs {tree.depth} Medusa heads, {options.head} has {k}")
