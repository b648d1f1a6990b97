"""The EAGLE draft head: ``fc([embed(next token); target feature]) -> one decoder layer``.

The decoder layer is the target's own transformers class (built from a one-layer copy of the
target config), with its first input norm removed as in EAGLE. The target's embedding and LM head
are shared and frozen: they are arguments of the calls, never stored in the head or its checkpoint.

Pairs and positions: the head's input at position i is the pair ``(f_i, x_{i+1})`` (the target
feature at position i and the token that follows it); its output predicts ``f_{i+1}``.
"""
from __future__ import annotations

import copy
import json
import tempfile
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from ..io import check_safetensors, replace_dir

__all__ = ["DraftHead", "HeadConfig", "load_head", "read_head_config", "check_head", "save_head", "HeadError", "HeadNotFoundError",
           "HeadMismatchError"]


class HeadError(ValueError):
    """A folder that is not a usable head checkpoint; the message names the folder or file and what is wrong."""


class HeadNotFoundError(HeadError, FileNotFoundError):
    """No head checkpoint at the given path (also a FileNotFoundError, as it was before HeadError)."""


class HeadMismatchError(HeadError):
    """A head checkpoint that does not fit the target it is loaded onto."""


@dataclass
class HeadConfig:
    target: str  # name or path of the target the head was trained for
    model_type: str
    hidden_size: int
    vocab_size: int
    draft_vocab: list[int] = field(default_factory=list)  # draft id -> target id; empty = full vocab
    target_config: dict = field(default_factory=dict)  # the target's text config (for the layer)
    type: str = "eagle"  # eagle (EAGLE-1/2, this module) | eagle3 (eagle/heads/eagle3.py)
    feature_layers: list[int] = field(default_factory=list)  # eagle3: target hidden_states indices it fuses

    def to_json(self) -> str:
        return json.dumps(asdict(self))


def _layer_config(target_config):
    cfg = copy.deepcopy(target_config.get_text_config(decoder=True))
    cfg.num_hidden_layers = 1
    if getattr(cfg, "layer_types", None):
        cfg.layer_types = ["full_attention"]
    if hasattr(cfg, "sliding_window"):
        cfg.sliding_window = None
    cfg._attn_implementation = "sdpa"
    return cfg


class DraftHead(nn.Module):
    """EAGLE-1/2 draft head.

    Args:
        target_config: the target's transformers config (its decoder-layer class is reused).
        layer_cls: the target's decoder-layer class, e.g. ``type(model.model.layers[0])``.
        rotary_cls: the target's rotary-embedding class.
        draft_vocab: optional ``(Vd,)`` target ids of a reduced draft vocabulary.
    """

    def __init__(self, target_config, layer_cls, rotary_cls, draft_vocab: torch.Tensor | None = None):
        super().__init__()
        cfg = _layer_config(target_config)
        H = cfg.hidden_size
        self.layer_config = cfg
        self.fc = nn.Linear(2 * H, H, bias=True)
        self.layer = layer_cls(cfg, layer_idx=0)
        self.layer.input_layernorm = nn.Identity()  # EAGLE: the fc output goes in un-normalized
        self.rotary = rotary_cls(config=cfg)
        dv = torch.arange(0) if draft_vocab is None else torch.as_tensor(draft_vocab, dtype=torch.long)
        self.register_buffer("draft_vocab", dv, persistent=True)

    @classmethod
    def for_target(cls, model, draft_vocab: torch.Tensor | None = None) -> "DraftHead":
        """A freshly initialized head matching ``model`` (an unmodified transformers causal LM)."""
        base = model.get_decoder()
        head = cls(model.config, type(base.layers[0]), type(base.rotary_emb), draft_vocab)
        # start as "the next feature equals the current one": fc passes the feature half through,
        # and the layer's residual branch learns the difference
        H = head.hidden_size
        with torch.no_grad():
            head.fc.weight.zero_()
            head.fc.weight[:, H:].copy_(torch.eye(H))
            head.fc.bias.zero_()
        return head.to(next(model.parameters()).device)

    @property
    def hidden_size(self) -> int:
        return self.fc.out_features

    def forward(self, features: torch.Tensor, token_embeds: torch.Tensor, position_ids: torch.Tensor,
                attention_mask: torch.Tensor | None, cache=None, **kwargs) -> torch.Tensor:
        """``features, token_embeds (B, T, H)``, ``position_ids (B, T)``, ``attention_mask``
        ``(B, 1, T, S)`` bool (True = attend; S = cached + T) -> predicted next features ``(B, T, H)``."""
        x = self.fc(torch.cat([token_embeds, features], dim=-1))  # (B, T, H)
        pos_emb = self.rotary(x, position_ids=position_ids)
        return self.layer(x, attention_mask=attention_mask, position_ids=position_ids, cache=cache,
                          use_cache=cache is not None, position_embeddings=pos_emb, **kwargs)

    def lm_weight(self, lm_head: nn.Module) -> torch.Tensor:
        """``(Vd, H)`` rows of the target's LM head for the draft vocabulary."""
        w = lm_head.weight
        return w if self.draft_vocab.numel() == 0 else w[self.draft_vocab]

    # ---- the interface the drafter uses for every head type (see eagle/heads/eagle3.py) -------
    feature_layers = None  # reads the target's final feature

    def enter(self, features: torch.Tensor) -> torch.Tensor:
        """Target features as the head's input: the final feature goes in as it is."""
        return features

    def pre_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden  # the predicted feature is already in the target's final (normed) space

    def draft_weight(self, target_lm_head: nn.Module) -> torch.Tensor:
        return self.lm_weight(target_lm_head)

    @property
    def vocab_map(self) -> torch.Tensor | None:
        """``(Vd,)`` target id of each draft id, or None for the full vocabulary."""
        return self.draft_vocab if self.draft_vocab.numel() else None

    def flops_per_token(self) -> int:
        """Multiply-adds x 2 of one drafted token (fc + layer + draft LM head), attention excluded."""
        n_params = sum(p.numel() for n, p in self.named_parameters() if "norm" not in n)
        vd = self.draft_vocab.numel() or getattr(self.layer_config, "vocab_size", 0)
        return 2 * (n_params + vd * self.hidden_size)


def save_head(head: nn.Module, folder: str | Path, config: HeadConfig, dtype: torch.dtype | None = None) -> None:
    """Write ``model.safetensors`` + ``config.json`` atomically into ``folder`` (floating-point
    weights cast to ``dtype`` when given, e.g. float16 to halve a shipped checkpoint; loading casts
    back; integer and bool buffers such as EAGLE-3's ``d2t`` / ``t2d`` keep their type)."""
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=folder.name + ".tmp", dir=folder.parent))
    state = {k: v.detach().cpu().to(dtype if dtype is not None and v.is_floating_point() else v.dtype).contiguous()
             for k, v in head.state_dict().items() if k != "draft_vocab" and not k.startswith("rotary.")}
    save_file(state, str(tmp / "model.safetensors"))
    (tmp / "config.json").write_text(config.to_json())
    replace_dir(tmp, folder)


_HEAD_FILES = "config.json + model.safetensors"
HEAD_KINDS = ("eagle", "eagle3")


def _looks_like(folder: Path, raw: dict) -> str:
    """What a folder given as a head seems to be instead, as a hint ('' when unclear)."""
    if (folder / "draft.json").is_file():
        return "; it is a draft model made by `eagle distill`: use it with drafter type 'model'"
    if "architectures" in raw or "num_hidden_layers" in raw:
        arch = ", ".join(raw.get("architectures") or []) or raw.get("model_type", "?")
        return f"; it looks like a causal LM folder ({arch}): use drafter type 'model'"
    return ""


def read_config_json(folder: Path, what: str, kind: str, files: str) -> dict:
    """The ``config.json`` object of a head folder; one-line :class:`HeadNotFoundError` /
    :class:`HeadError` naming the folder or file when there is none, or it is not a JSON object
    (``what``: "head" / "Medusa head"; ``kind``: "an EAGLE head"...; ``files``: what a folder holds)."""
    if not folder.exists():
        raise HeadNotFoundError(f"no {what} checkpoint at {folder}: no such folder (expected {files})")
    if not folder.is_dir():
        raise HeadError(f"{folder}: not a folder (a {what} checkpoint is a folder with {files})")
    path = folder / "config.json"
    if not path.is_file():
        raise HeadError(f"{folder}: not {kind} (no config.json; expected {files})")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as e:  # invalid JSON or not UTF-8
        raise HeadError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(raw, dict):
        raise HeadError(f"{path}: expected a JSON object, got a {type(raw).__name__}")
    return raw


def read_head_config(folder: str | Path) -> HeadConfig:
    """The checked :class:`HeadConfig` of a head folder, read without loading any weights.

    Raises :class:`HeadNotFoundError` when there is no such folder, and :class:`HeadError` (one line
    naming the folder or file) for a folder that is not a head: no config.json or model.safetensors,
    a config.json that is not valid JSON, lacks keys, has unknown keys or values of the wrong type."""
    folder = Path(folder)
    raw = read_config_json(folder, "head", "an EAGLE head", _HEAD_FILES)
    path = folder / "config.json"
    known = [f.name for f in fields(HeadConfig)]
    required = [f.name for f in fields(HeadConfig) if f.default is MISSING and f.default_factory is MISSING]
    missing = [k for k in required if k not in raw]
    if missing:
        raise HeadError(f"{folder}: not an EAGLE head (config.json has no {', '.join(map(repr, missing))})"
                        + _looks_like(folder, raw))
    unknown = sorted(k for k in raw if k not in known)
    if unknown:
        raise HeadError(f"{path}: unknown keys {unknown} (a head config has {known})")
    for key, typ, what in (("target", str, "a string"), ("model_type", str, "a string"), ("hidden_size", int, "an integer"),
                           ("vocab_size", int, "an integer"), ("draft_vocab", list, "a list"),
                           ("target_config", dict, "an object"), ("type", str, "a string"),
                           ("feature_layers", list, "a list")):
        if key in raw and (not isinstance(raw[key], typ) or isinstance(raw[key], bool)):
            raise HeadError(f"{path}: '{key}' must be {what}, got {json.dumps(raw[key])[:60]}")
    if raw["hidden_size"] < 1 or raw["vocab_size"] < 1:
        raise HeadError(f"{path}: hidden_size and vocab_size must be >= 1")
    if raw.get("type", "eagle") not in HEAD_KINDS:
        raise HeadError(f"{path}: 'type' must be one of {', '.join(HEAD_KINDS)}, got {json.dumps(raw['type'])[:60]}")
    if raw.get("type") == "eagle3" and not raw.get("feature_layers"):
        raise HeadError(f"{path}: an eagle3 head needs 'feature_layers' (the target layers it fuses)")
    if not all(isinstance(i, int) and i >= 0 for i in raw.get("feature_layers", [])):
        raise HeadError(f"{path}: 'feature_layers' must hold layer indices >= 0")
    if not all(isinstance(i, int) and 0 <= i < raw["vocab_size"] for i in raw.get("draft_vocab", [])):
        raise HeadError(f"{path}: 'draft_vocab' must hold token ids in [0, {raw['vocab_size']})")
    if not (folder / "model.safetensors").is_file():
        raise HeadError(f"{folder}: no model.safetensors (the head's weights; expected {_HEAD_FILES})")
    return HeadConfig(**raw)


def check_head(folder: str | Path) -> HeadConfig:
    """:func:`read_head_config` plus a read of the weight file's header (a truncated or corrupt
    file is found here, before any model is loaded): the cheap check a command runs first. Folders in
    the official EAGLE-1/2 or EAGLE-3 layout or vLLM's get their own check (:mod:`eagle.heads.formats`)."""
    from .formats import check_layout, detect_layout

    if detect_layout(folder) != "native":
        return check_layout(folder)
    cfg = read_head_config(folder)
    check_safetensors(Path(folder) / "model.safetensors", HeadError)
    return cfg


def check_fits_target(label: str, cfg, tcfg) -> None:
    """:class:`HeadMismatchError` when a head's recorded ``hidden_size``, ``vocab_size`` or
    ``model_type`` (``cfg``) differ from the target's text config ``tcfg``; ``label`` names the head."""
    for what, mine, theirs in (("hidden size", cfg.hidden_size, tcfg.hidden_size),
                               ("vocabulary of", cfg.vocab_size, tcfg.vocab_size)):
        if mine != theirs:
            raise HeadMismatchError(f"{label} was trained for a {what} {mine}, the target has {theirs}")
    if cfg.model_type != tcfg.model_type:
        raise HeadMismatchError(f"{label} was trained for a '{cfg.model_type}' target, this one is '{tcfg.model_type}'")


def check_tensor_shapes(where: str, found: dict, expected: dict, name=None, why: str = "", limit: int = 4) -> None:
    """One-line :class:`HeadMismatchError` for the first kind of difference between two
    ``{name: shape}`` maps: tensors missing, unexpected, or of another shape. ``where`` starts the
    message (it names the head), ``name`` turns our tensor name into the one shown (the file's),
    ``why`` is added to the missing/unexpected messages (e.g. what config.json says), and at most
    ``limit`` tensors are named."""
    name = name or (lambda k: k)
    note = f"; {why}" if why else ""
    missing = [k for k in expected if k not in found][:limit]
    if missing:
        raise HeadMismatchError(f"{where}: tensor {', '.join(repr(name(k)) for k in missing)} missing (expected shape "
                                f"{', '.join(str(list(expected[k])) for k in missing)}{note})")
    extra = [k for k in found if k not in expected][:limit]
    if extra:
        raise HeadMismatchError(f"{where}: unexpected tensor {', '.join(f'{name(k)!r} {list(found[k])}' for k in extra)}"
                                + (f" ({why})" if why else ""))
    for k, shape in expected.items():
        if tuple(found[k]) != tuple(shape):
            raise HeadMismatchError(f"{where}: tensor {name(k)!r} has shape {list(found[k])}, expected {list(shape)}")


def read_checked_state(label: str, folder: Path, cfg, model) -> dict[str, torch.Tensor]:
    """The tensors of ``folder/model.safetensors`` after checking that the head (``cfg``, named
    ``label``) fits the target ``model`` and that the file is readable."""
    check_fits_target(label, cfg, model.config.get_text_config(decoder=True))
    weights = Path(folder) / "model.safetensors"
    check_safetensors(weights, HeadError)
    return load_file(str(weights))


def load_head(folder: str | Path, model) -> DraftHead:
    """Load a head checkpoint onto ``model``.

    Raises :class:`HeadError` for a folder that is not a readable head (see :func:`read_head_config`;
    also a truncated or corrupt model.safetensors), :class:`HeadMismatchError` for a head trained for
    another hidden size, vocabulary or architecture. A folder in the official EAGLE-1/2 or EAGLE-3
    layout (SafeAILab/EAGLE; SGLang's) or vLLM's is recognised from its files and converted on the fly
    (:func:`eagle.heads.formats.load_layout`; docs/interop.md)."""
    from .formats import detect_layout, load_layout

    if detect_layout(folder) != "native":
        return load_layout(folder, model)
    folder = Path(folder)
    cfg = read_head_config(folder)
    tcfg = model.config.get_text_config(decoder=True)
    state = read_checked_state(f"head {folder}", folder, cfg, model)
    if cfg.type == "eagle3":
        from .formats import eagle3_for_target

        bad = [i for i in cfg.feature_layers if i > tcfg.num_hidden_layers]
        if bad:
            raise HeadMismatchError(f"head {folder} reads target layers {bad}; the target has {tcfg.num_hidden_layers}")
        if "d2t" not in state:
            raise HeadMismatchError(f"head {folder} is an eagle3 head without a 'd2t' tensor")
        d2t = state["d2t"].long()
        # an imported head keeps its own layer (e.g. the official heads' RoPE base) in target_config
        head = eagle3_for_target(model, torch.arange(len(d2t)) + d2t, cfg.feature_layers, cfg.target_config)
    else:
        head = DraftHead.for_target(model, torch.tensor(cfg.draft_vocab, dtype=torch.long) if cfg.draft_vocab else None)
    try:
        missing, unexpected = head.load_state_dict(state, strict=False)
    except RuntimeError as e:  # a tensor of another shape than the target's layer has
        raise HeadMismatchError(f"head {folder} does not match the target's layer: " + " ".join(str(e).split())) from None
    missing = [k for k in missing if k != "draft_vocab" and not k.startswith("rotary.")]
    if missing or unexpected:
        raise HeadMismatchError(f"head {folder} does not match the target's layer: missing {missing}, "
                                f"unexpected {unexpected}")
    head.config = cfg
    return head.eval()
