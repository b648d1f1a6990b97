"""EAGLE head checkpoints: ours, the official EAGLE-1/2 and EAGLE-3 layouts and vLLM's; save, read, check,
load (any layout), export.

An EAGLE-1/2 head (``fc(cat[embed, feature])`` with bias, then one Llama decoder layer without its
input norm) and an EAGLE-3 head (``fc`` over three fused target layers without bias, ``midlayer``
attending over ``[norm(embed); norm(hidden)]``, its own ``norm`` and draft-vocabulary ``lm_head``
with ``d2t`` / ``t2d``) are each held in several folder layouts; docs/interop.md has the full
mapping and the sources:

* ``native``: our folder (``config.json`` = :class:`HeadConfig`, ``model.safetensors``), written by
  :func:`save_head`: ``fc.*`` + ``layer.*`` (EAGLE-1/2), or the official EAGLE-3 names
  with ``"type": "eagle3"`` and ``"feature_layers"``;
* ``eagle``: what SafeAILab/EAGLE publishes for EAGLE-1/2 (``eagle/model/cnets1.py`` reads it): the
  ``config.json`` of a one-layer ``LlamaForCausalLM`` and ``fc.*`` + ``layers.0.*`` (optionally
  ``embed_tokens.weight``) in ``pytorch_model.bin`` or ``model.safetensors``. Its loader reads
  ``"bias"`` (default true) as "fc has a bias" and ``"qkv_bias"`` for q/k/v biases;
* ``vllm``: the same tensors under ``architectures: ["EagleLlamaForCausalLM"]`` (the name vLLM's
  registry maps to ``llama_eagle.py``) without ``fc.bias``: that model builds ``fc`` with
  ``bias=False``, and its Llama layer reads a ``"bias"`` config key as *attention* bias;
* ``eagle3``: the official EAGLE-3 layout (``eagle/model/cnets.py``; SGLang's
  ``LlamaForCausalLMEagle3`` reads the same): a one-layer Llama config plus ``draft_vocab_size``,
  tensors ``fc.weight`` ``[H, 3H]``, ``midlayer.*``, ``norm.weight``, ``lm_head.weight``
  ``[draft_vocab, H]``, ``d2t`` (int64 offsets: target id = draft id + d2t[draft id]) and ``t2d``
  (bool mask over the target vocabulary). The target layers it fuses are not stored: the official
  code reads ``(2, L//2, L-3)`` of an L-layer target (:func:`eagle.heads.eagle3.default_feature_layers`);
* ``vllm-eagle3``: vLLM's EAGLE-3 (``Eagle3LlamaForCausalLM``, ``llama_eagle3.py``): the same
  tensors (vLLM also accepts ``layers.0.*`` for ``midlayer.*`` and ignores ``t2d``), the fused
  layers in ``eagle_aux_hidden_state_layer_ids`` (the hidden state *entering* each layer, like our
  ``feature_layers``; vLLM's default is the official one when the key is absent).

:func:`load_head` / :func:`check_head` take a folder of any layout: :func:`detect_layout` tells
them apart from the files, :func:`read_head_config` reads ours and :func:`load_layout` /
:func:`check_layout` the others. :func:`export_head` writes a head (a folder of any layout, or a
loaded head) in a foreign layout: ``--format eagle|vllm`` for EAGLE-1/2 heads, ``--format
eagle3|vllm`` for EAGLE-3 heads.

A layout is one :class:`Layout` row of :data:`LAYOUTS` (tensor-name renames, architecture name,
what happens to ``fc.bias``, a config.json builder); its ``kind`` says which head type it holds.
"""
from __future__ import annotations

import copy
import json
import os
import pickle
import re
import tempfile
from dataclasses import MISSING, dataclass, fields, replace
from pathlib import Path
from typing import Callable

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torch import nn

from ..io import check_safetensors, replace_dir
from .common import HeadConfig, HeadError, HeadMismatchError, check_tensor_shapes, read_checked_state, read_config_json
from .eagle import DraftHead
from .eagle3 import Eagle3Head, default_feature_layers

__all__ = ["save_head", "read_head_config", "check_head", "load_head", "HEAD_KINDS", "Layout", "LayerSpec", "LAYOUTS",
           "EXPORT_FORMATS", "LLAMA_LAYER_TARGETS", "detect_layout", "load_layout", "check_layout", "export_head",
           "eagle3_for_target"]

# model types whose decoder layer is exactly a Llama layer (Qwen2: plus q/k/v biases); the official
# and vLLM EAGLE heads are Llama layers, so only these targets' heads convert without loss
LLAMA_LAYER_TARGETS = ("llama", "mistral", "qwen2")
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")  # read in this order
EMBED = "embed_tokens.weight"  # the target's embedding; checked on import, never written
EXPORT_FORMATS = ("eagle", "eagle3", "vllm")
# (--format, head type) -> the layout written
FORMAT_LAYOUT = {("eagle", "eagle"): "eagle", ("vllm", "eagle"): "vllm",
                 ("eagle3", "eagle3"): "eagle3", ("vllm", "eagle3"): "vllm-eagle3"}
_OFFICIAL_ROPE = ("linear", "dynamic")  # rope_scaling types cnets(1).LlamaAttention._init_rope knows
OFFICIAL_EAGLE3_ARCH = "LlamaForCausalLMEagle3"  # SafeAILab's published EAGLE-3 configs; SGLang's EntryClass
VLLM_EAGLE3_ARCH = "Eagle3LlamaForCausalLM"  # vLLM's registry: llama_eagle3.Eagle3LlamaForCausalLM


# ---- our own layout (native); loading and checking a folder of any layout ---------------------------


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
    the official EAGLE-1/2 or EAGLE-3 layout or vLLM's get their own check (:func:`check_layout`)."""
    if detect_layout(folder) != "native":
        return check_layout(folder)
    cfg = read_head_config(folder)
    check_safetensors(Path(folder) / "model.safetensors", HeadError)
    return cfg


def load_head(folder: str | Path, model) -> DraftHead | Eagle3Head:
    """Load a head checkpoint onto ``model``.

    Raises :class:`HeadError` for a folder that is not a readable head (see :func:`read_head_config`;
    also a truncated or corrupt model.safetensors), :class:`HeadMismatchError` for a head trained for
    another hidden size, vocabulary or architecture. A folder in the official EAGLE-1/2 or EAGLE-3
    layout (SafeAILab/EAGLE; SGLang's) or vLLM's is recognised from its files and converted on the fly
    (:func:`load_layout`; docs/interop.md)."""
    if detect_layout(folder) != "native":
        return load_layout(folder, model)
    folder = Path(folder)
    cfg = read_head_config(folder)
    tcfg = model.config.get_text_config(decoder=True)
    state = read_checked_state(f"head {folder}", folder, cfg, model)
    if cfg.type == "eagle3":
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


# ---- the layer's hyperparameters, from any of the configs ------------------------------------------


def _rope(d: dict) -> tuple[float, dict | None]:
    """``(rope_theta, scaling)`` of a config dict in transformers 5 (``rope_parameters``) or legacy
    (``rope_theta`` + ``rope_scaling`` with ``type`` or ``rope_type``) form; scaling ``None`` = plain
    RoPE, else ``{"rope_type": ..., <its parameters>}``."""
    rp = d.get("rope_parameters")
    if isinstance(rp, dict) and ("rope_type" in rp or "rope_theta" in rp):
        theta, kind = rp.get("rope_theta", d.get("rope_theta", 10000.0)), rp.get("rope_type", "default")
        params = {k: v for k, v in rp.items() if k not in ("rope_theta", "rope_type")}
    else:
        rs = d.get("rope_scaling") or {}
        theta, kind = d.get("rope_theta", 10000.0), rs.get("rope_type", rs.get("type", "default"))
        params = {k: v for k, v in rs.items() if k not in ("rope_type", "type")}
    return float(theta), None if kind == "default" else {"rope_type": kind, **params}


@dataclass(frozen=True)
class LayerSpec:
    """What defines the head's decoder layer, whichever config it was read from."""

    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    hidden_act: str
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict | None
    vocab_size: int
    qkv_bias: bool
    max_position_embeddings: int | None = None
    bos_token_id: int | list | None = None
    eos_token_id: int | list | None = None
    pad_token_id: int | None = None

    # fields a head and its target must agree on (the rest only describe the target)
    COMPARED = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                "hidden_act", "rms_norm_eps", "rope_theta", "rope_scaling", "vocab_size", "qkv_bias")
    # an EAGLE-3 head's own layer: every loader builds it from the head's config, not the target's, so
    # these may differ from the target's (the official LLaMA-3.1 heads: RoPE base 10000, the target 500000)
    OWN_LAYER = ("intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim", "hidden_act",
                 "rms_norm_eps", "rope_theta", "rope_scaling")

    @classmethod
    def from_config(cls, d: dict, where: str, qkv_bias: bool, head_dim_key: bool = True) -> "LayerSpec":
        """From a transformers text-config dict (a target's) or an official head's config.json, with
        the official code's defaults for absent keys. ``head_dim_key=False``: ignore a ``head_dim``
        key (cnets1 always uses hidden_size // num_attention_heads)."""
        missing = [k for k in ("hidden_size", "intermediate_size", "num_attention_heads", "vocab_size")
                   if not isinstance(d.get(k), int) or isinstance(d.get(k), bool)]
        if missing:
            raise HeadError(f"{where}: no integer {', '.join(map(repr, missing))} (a one-layer Llama config has them)")
        H, nh = d["hidden_size"], d["num_attention_heads"]
        theta, scaling = _rope(d)
        return cls(hidden_size=H, intermediate_size=d["intermediate_size"], num_attention_heads=nh,
                   num_key_value_heads=d.get("num_key_value_heads") or nh,
                   head_dim=(d.get("head_dim") if head_dim_key else None) or H // nh,
                   hidden_act=d.get("hidden_act", "silu"), rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
                   rope_theta=theta, rope_scaling=scaling, vocab_size=d["vocab_size"], qkv_bias=bool(qkv_bias),
                   max_position_embeddings=d.get("max_position_embeddings"), bos_token_id=d.get("bos_token_id"),
                   eos_token_id=d.get("eos_token_id"), pad_token_id=d.get("pad_token_id"))

    @classmethod
    def of_target(cls, d: dict) -> "LayerSpec":
        """From a target's text config dict (Qwen2's layer has q/k/v biases; Llama's when attention_bias)."""
        return cls.from_config(d, "target config", d.get("model_type") == "qwen2" or bool(d.get("attention_bias")))

    def tensors(self) -> dict[str, tuple[int, ...]]:
        """Our names and shapes of every tensor of an EAGLE-1/2 head with this layer."""
        H, I, q, kv = self.hidden_size, self.intermediate_size, self.num_attention_heads * self.head_dim, \
            self.num_key_value_heads * self.head_dim
        t = {"fc.weight": (H, 2 * H), "fc.bias": (H,),
             "layer.self_attn.q_proj.weight": (q, H), "layer.self_attn.k_proj.weight": (kv, H),
             "layer.self_attn.v_proj.weight": (kv, H), "layer.self_attn.o_proj.weight": (H, q),
             "layer.mlp.gate_proj.weight": (I, H), "layer.mlp.up_proj.weight": (I, H),
             "layer.mlp.down_proj.weight": (H, I), "layer.post_attention_layernorm.weight": (H,)}
        if self.qkv_bias:
            t.update({"layer.self_attn.q_proj.bias": (q,), "layer.self_attn.k_proj.bias": (kv,),
                      "layer.self_attn.v_proj.bias": (kv,)})
        return t

    def eagle3_tensors(self, draft_vocab: int) -> dict[str, tuple[int, ...]]:
        """The names (official = ours) and shapes of every tensor of an EAGLE-3 head with this layer
        and a draft vocabulary of ``draft_vocab`` tokens: q/k/v read ``2H`` (``[embed; hidden]``)."""
        H, I, q, kv = self.hidden_size, self.intermediate_size, self.num_attention_heads * self.head_dim, \
            self.num_key_value_heads * self.head_dim
        t = {"fc.weight": (H, 3 * H),
             "midlayer.self_attn.q_proj.weight": (q, 2 * H), "midlayer.self_attn.k_proj.weight": (kv, 2 * H),
             "midlayer.self_attn.v_proj.weight": (kv, 2 * H), "midlayer.self_attn.o_proj.weight": (H, q),
             "midlayer.mlp.gate_proj.weight": (I, H), "midlayer.mlp.up_proj.weight": (I, H),
             "midlayer.mlp.down_proj.weight": (H, I), "midlayer.input_layernorm.weight": (H,),
             "midlayer.hidden_norm.weight": (H,), "midlayer.post_attention_layernorm.weight": (H,),
             "norm.weight": (H,), "lm_head.weight": (draft_vocab, H), "d2t": (draft_vocab,), "t2d": (self.vocab_size,)}
        if self.qkv_bias:
            t.update({"midlayer.self_attn.q_proj.bias": (q,), "midlayer.self_attn.k_proj.bias": (kv,),
                      "midlayer.self_attn.v_proj.bias": (kv,)})
        return t


@dataclass(frozen=True)
class Eagle3Info:
    """What an EAGLE-3 config.json states beyond the layer: the draft vocabulary size and the fused
    target layers (``None``: not stated, i.e. the official default of whatever target), and the
    target's layer count when known (to check the layers against it)."""

    draft_vocab_size: int
    feature_layers: tuple[int, ...] | None
    target_layers: int | None


# ---- the layouts --------------------------------------------------------------------------------------


def _llama_config(spec: LayerSpec, arch: str, dtype: str) -> dict:
    """config.json of a one-layer LlamaForCausalLM-like model with the head's layer."""
    cfg = {"architectures": [arch], "model_type": "llama", "hidden_size": spec.hidden_size,
           "intermediate_size": spec.intermediate_size, "num_hidden_layers": 1,
           "num_attention_heads": spec.num_attention_heads, "num_key_value_heads": spec.num_key_value_heads,
           "hidden_act": spec.hidden_act, "rms_norm_eps": spec.rms_norm_eps, "rope_theta": spec.rope_theta,
           "max_position_embeddings": spec.max_position_embeddings or 2048, "vocab_size": spec.vocab_size,
           "tie_word_embeddings": False, "torch_dtype": dtype}
    for k in ("bos_token_id", "eos_token_id", "pad_token_id"):
        if getattr(spec, k) is not None:
            cfg[k] = getattr(spec, k)
    if spec.qkv_bias:
        cfg["qkv_bias"] = True  # cnets1 and vLLM's Llama layer: q/k/v biases, none on o_proj
    return cfg


def _official_config(spec: LayerSpec, dtype: str, e3: Eagle3Info | None = None) -> dict:
    # no "bias" key: cnets1's loader defaults it to true (fc has a bias), while vLLM's and SGLang's
    # Llama layers would read "bias": true as attention biases
    if spec.head_dim != spec.hidden_size // spec.num_attention_heads:
        raise HeadError(f"the official code computes head_dim as hidden_size / num_attention_heads = "
                        f"{spec.hidden_size // spec.num_attention_heads}; this head's layer has head_dim {spec.head_dim}")
    cfg = _llama_config(spec, "LlamaForCausalLM", dtype)
    if spec.rope_scaling is not None:
        kind, factor = spec.rope_scaling["rope_type"], spec.rope_scaling.get("factor")
        if kind not in _OFFICIAL_ROPE or set(spec.rope_scaling) != {"rope_type", "factor"}:
            raise HeadError(f"the official code knows RoPE scaling {' and '.join(_OFFICIAL_ROPE)} (type + factor), "
                            f"this head's layer has {spec.rope_scaling}")
        cfg["rope_scaling"] = {"type": kind, "factor": float(factor)}
    return cfg


def _vllm_config(spec: LayerSpec, dtype: str, e3: Eagle3Info | None = None) -> dict:
    cfg = _llama_config(spec, "EagleLlamaForCausalLM", dtype)
    if spec.head_dim != spec.hidden_size // spec.num_attention_heads:
        cfg["head_dim"] = spec.head_dim  # vLLM's LlamaAttention reads it
    if spec.rope_scaling is not None:
        cfg["rope_scaling"] = dict(spec.rope_scaling)
    return cfg


def _check_layers(layers, num_layers: int) -> str:
    """'' when ``layers`` are three increasing ``hidden_states`` indices in ``[0, L)`` (what the
    official code, vLLM and SGLang capture: the hidden state entering a layer, never the final
    normed output), else what is wrong."""
    layers = list(layers)
    if len(layers) != 3 or any(b <= a for a, b in zip(layers, layers[1:])) or layers[0] < 0 \
            or layers[-1] >= num_layers:
        return (f"{layers} are not three increasing layers of this {num_layers}-layer target (indices "
                f"0..{num_layers - 1}: the hidden state entering each)")
    return ""


def _known_layers(e3: Eagle3Info, fmt_name: str) -> int:
    if e3.target_layers is None:
        raise HeadError(f"it reads target layers {list(e3.feature_layers)} and does not record its target's layer "
                        f"count, so the {fmt_name} layers cannot be checked: load it onto its target (eagle.load_head) and "
                        "export the loaded head")
    return e3.target_layers


def _official3_config(spec: LayerSpec, dtype: str, e3: Eagle3Info) -> dict:
    """The official EAGLE-3 config (cnets.Model; SGLang's LlamaForCausalLMEagle3). No ``bias`` key
    (SGLang builds ``fc`` with ``bias=config.bias``), no ``target_hidden_size`` (its presence makes
    cnets skip loading the target's embedding), ``tie_word_embeddings`` false (SGLang would use the
    embedding as LM head), no layer ids (the official code has none: it reads ``(2, L//2, L-3)``)."""
    cfg = _official_config(spec, dtype)
    cfg["architectures"] = [OFFICIAL_EAGLE3_ARCH]
    cfg["draft_vocab_size"] = e3.draft_vocab_size
    if e3.feature_layers is not None:
        L = _known_layers(e3, "official")
        default = default_feature_layers(L)
        if tuple(e3.feature_layers) != default:
            raise HeadError(f"it reads target layers {list(e3.feature_layers)}, but the official EAGLE-3 code always "
                            f"reads (2, L//2, L-3) = {list(default)} of this {L}-layer target and has no field for "
                            "others; export --format vllm instead (eagle_aux_hidden_state_layer_ids)")
        bad = _check_layers(default, L)
        if bad:
            raise HeadError(f"the official default layers {bad}")
    return cfg


def _vllm3_config(spec: LayerSpec, dtype: str, e3: Eagle3Info) -> dict:
    """vLLM's EAGLE-3 config (llama_eagle3.Eagle3LlamaForCausalLM): ``draft_vocab_size``, the layers
    as ``eagle_aux_hidden_state_layer_ids`` (read from the draft config by vLLM's
    ``get_eagle3_aux_layers_from_config``), ``norm_before_residual`` false (the official residual:
    the hidden state before ``hidden_norm``)."""
    cfg = _vllm_config(spec, dtype)
    cfg["architectures"] = [VLLM_EAGLE3_ARCH]
    cfg["draft_vocab_size"] = e3.draft_vocab_size
    cfg["norm_before_residual"] = False
    if e3.feature_layers is not None:
        L = _known_layers(e3, "vLLM")
        bad = _check_layers(e3.feature_layers, L)
        if bad:
            raise HeadError(f"its target layers {bad}")
        if e3.feature_layers[0] == 0:
            raise HeadError("it reads target layer 0 (the embeddings), which vLLM's Llama cannot capture (it adds "
                            "the residual, still None before layer 0)")
        cfg["eagle_aux_hidden_state_layer_ids"] = list(e3.feature_layers)
    return cfg


@dataclass(frozen=True)
class Layout:
    """One checkpoint layout of a head type: how tensor names and config.json map to ours."""

    name: str
    kind: str  # the head type it holds: "eagle" (EAGLE-1/2, DraftHead) or "eagle3" (Eagle3Head)
    architecture: str  # config.json "architectures"
    renames: tuple[tuple[str, str], ...]  # (our prefix, file prefix), first match wins
    fc_bias: str  # "stored": fc.bias in the file; "absent": not in the file, only a zero bias converts; "none": no bias
    build_config: Callable[[LayerSpec, str, Eagle3Info | None], dict]  # (layer, dtype, EAGLE-3 info) -> config.json

    def to_file(self, name: str) -> str:
        return next((f + name[len(o):] for o, f in self.renames if name.startswith(o)), name)

    def from_file(self, name: str) -> str | None:
        """Our name for a tensor of the file, None for a tensor the layout does not hold."""
        return next((o + name[len(f):] for o, f in self.renames if name.startswith(f)), None)


_EAGLE_RENAMES = (("fc.", "fc."), ("layer.", "layers.0."))
# EAGLE-3 names are the official ones on both sides; "layers.0." is read as "midlayer." (vLLM's own
# name, which its loader maps midlayer. to) but never written
_EAGLE3_RENAMES = (("fc.", "fc."), ("midlayer.", "midlayer."), ("norm.", "norm."), ("lm_head.", "lm_head."),
                   ("d2t", "d2t"), ("t2d", "t2d"), ("midlayer.", "layers.0."))
LAYOUTS: dict[str, Layout] = {
    "eagle": Layout("eagle", "eagle", "LlamaForCausalLM", _EAGLE_RENAMES, "stored", _official_config),
    "vllm": Layout("vllm", "eagle", "EagleLlamaForCausalLM", _EAGLE_RENAMES, "absent", _vllm_config),
    "eagle3": Layout("eagle3", "eagle3", OFFICIAL_EAGLE3_ARCH, _EAGLE3_RENAMES, "none", _official3_config),
    "vllm-eagle3": Layout("vllm-eagle3", "eagle3", VLLM_EAGLE3_ARCH, _EAGLE3_RENAMES, "none", _vllm3_config),
}


# ---- reading folders ----------------------------------------------------------------------------------


def _one_line(e: BaseException, limit: int = 200) -> str:
    return " ".join(str(e).split())[:limit]


def _load_bin(path: Path) -> dict[str, torch.Tensor]:
    """A PyTorch checkpoint read with ``weights_only=True`` (never a full unpickle)."""
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        m = re.search(r"Unsupported global: GLOBAL (\S+)", str(e))
        what = f"a pickled {m.group(1)}" if m else "objects other than tensors"
        raise HeadError(f"{path}: refused by torch.load(weights_only=True): it holds {what} (a head checkpoint "
                        "holds only named tensors; it is not unpickled further)") from None
    except Exception as e:  # a truncated zip, not a checkpoint at all, ...
        raise HeadError(f"{path}: truncated or corrupt, not a readable PyTorch checkpoint "
                        f"({type(e).__name__}: {_one_line(e)})") from None
    if not isinstance(obj, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in obj.items()):
        raise HeadError(f"{path}: expected a dict of named tensors, got a {type(obj).__name__}"
                        + (" holding other values" if isinstance(obj, dict) else ""))
    return obj


def _weights_file(folder: Path) -> Path | None:
    return next((folder / n for n in WEIGHT_FILES if (folder / n).is_file()), None)


def _read_weights(path: Path) -> dict[str, torch.Tensor]:
    if path.suffix == ".bin":
        return _load_bin(path)
    check_safetensors(path, HeadError)
    return load_file(str(path))


def _weight_names(path: Path) -> tuple[list[str], dict | None]:
    """The tensor names of a weight file (and the tensors when they had to be read: a .bin)."""
    if path.suffix == ".bin":
        state = _load_bin(path)
        return list(state), state
    check_safetensors(path, HeadError)
    with safe_open(str(path), "pt") as f:
        return list(f.keys()), None


def _read_json(path: Path):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


@dataclass
class _Probe:
    layout: str
    config: dict | None = None
    weights: Path | None = None
    state: dict | None = None  # already read (a .bin), else None


def _eagle3_layout(archs: list[str]) -> str:
    """vLLM names its EAGLE-3 class ``Eagle3…``; the official / SGLang configs say ``…Eagle3`` (or,
    from the official training code, plain ``LlamaForCausalLM`` with ``draft_vocab_size``)."""
    return "vllm-eagle3" if any(a.startswith("Eagle3") for a in archs) else "eagle3"


def _probe(folder: str | Path) -> _Probe:
    """The layout of a folder, judged from its files. Anything not recognisably another layout is
    ``native`` (whose reader then says precisely what is wrong with it)."""
    folder = Path(folder)
    raw = _read_json(folder / "config.json") if folder.is_dir() else None
    if not isinstance(raw, dict) or (folder / "draft.json").is_file():
        return _Probe("native")
    if "architectures" not in raw and "num_hidden_layers" not in raw:
        return _Probe("native")  # our HeadConfig has neither
    archs = [a for a in raw.get("architectures") or [] if isinstance(a, str)]
    weights = _weights_file(folder)
    if any("eagle3" in a.lower() for a in archs) or "draft_vocab_size" in raw:
        return _Probe(_eagle3_layout(archs), raw, weights)
    if weights is None:  # a one-layer model config without weights is taken for a head missing them
        return _Probe("eagle" if raw.get("num_hidden_layers") == 1 else "native", raw)
    names, state = _weight_names(weights)
    if any(n.startswith(("midlayer.", "d2t", "t2d")) for n in names):
        return _Probe(_eagle3_layout(archs), raw, weights, state)
    # EAGLE keys are top-level (fc.*, layers.0.*); a transformers causal LM's sit under model.*
    if not any(n.startswith(("fc.", "layers.")) for n in names):
        return _Probe("native")
    return _Probe("vllm" if "EagleLlamaForCausalLM" in archs else "eagle", raw, weights, state)


def detect_layout(folder: str | Path) -> str:
    """``"native"``, ``"eagle"`` (official EAGLE-1/2), ``"vllm"`` (vLLM's EAGLE-1), ``"eagle3"``
    (official EAGLE-3, also SGLang's) or ``"vllm-eagle3"`` (vLLM's EAGLE-3), from the folder's files.
    Folders that are not a head at all come back as ``"native"``: its reader gives the one-line
    error for them."""
    return _probe(folder).layout


def _shape(t) -> str:
    return str(list(t))


def _fits(folder, found: dict[str, tuple], expected: dict[str, tuple], name: Callable[[str], str], what: str) -> None:
    """One-line HeadMismatchError for the first kind of difference between two {name: shape} maps
    (``name`` turns our name into the one shown: the file's)."""
    check_tensor_shapes(f"head {folder} {what}", found, expected, name)


@dataclass
class _Head:
    """A head read from any layout, in our tensor names."""

    spec: LayerSpec
    state: dict[str, torch.Tensor]
    draft_vocab: list[int]
    model_type: str  # the target's ("llama" when an official config says no more)
    embed: torch.Tensor | None = None  # an official file's embed_tokens.weight
    kind: str = "eagle"  # "eagle" (EAGLE-1/2) or "eagle3"
    e3: Eagle3Info | None = None  # EAGLE-3: draft vocabulary size, fused layers, the target's layer count


def _renamed_state(folder, probe: "_Probe", layout: "Layout", holds: str) -> tuple[dict, torch.Tensor | None]:
    """The folder's tensors under our names (``layout.from_file``) and its ``embed_tokens.weight``
    (or None); any other tensor is a one-line error listing it and saying what the layout ``holds``."""
    file_state = probe.state if probe.state is not None else _read_weights(probe.weights)
    state, unknown = {}, []
    for k, v in file_state.items():
        ours = layout.from_file(k)
        if ours is not None:
            state[ours] = v
        elif k != EMBED:
            unknown.append(k)
    if unknown:
        listed = ", ".join(f"{k!r} {_shape(file_state[k].shape)}" for k in unknown[:4])
        raise HeadMismatchError(f"head {folder}: unexpected tensor {listed} ({holds})")
    return state, file_state.get(EMBED)


def _read_official(folder: Path, probe: _Probe) -> _Head:
    layout = LAYOUTS[probe.layout]
    raw, where = probe.config, folder / "config.json"
    if raw.get("num_hidden_layers", 1) != 1:
        raise HeadError(f"{where}: num_hidden_layers is {raw.get('num_hidden_layers')}; EAGLE-1/2 heads have one layer")
    if probe.weights is None:
        raise HeadError(f"{folder}: no {' or '.join(WEIGHT_FILES)} (the head's weights)")
    spec = LayerSpec.from_config(raw, str(where), raw.get("qkv_bias", False), head_dim_key=layout.name != "eagle")
    state, embed = _renamed_state(folder, probe, layout, f"an EAGLE-1/2 head holds fc.*, layers.0.* and optionally {EMBED}")
    fc_w = state.get("fc.weight")

    def zero_bias() -> torch.Tensor:  # the bias a layout without one stands for (a missing fc.weight is named later)
        if fc_w is None:
            return torch.zeros(spec.hidden_size)
        return torch.zeros(fc_w.shape[0], dtype=fc_w.dtype)

    if layout.fc_bias == "stored":
        if raw.get("bias", True) is False:  # cnets1: fc without a bias
            if "fc.bias" in state:
                raise HeadMismatchError(f"head {folder}: config.json says \"bias\": false but the weights hold fc.bias")
            state["fc.bias"] = zero_bias()
    else:
        if raw.get("bias"):
            raise HeadMismatchError(f"head {folder}: config.json has \"bias\": true, which vLLM's Llama layer reads as "
                                    "attention biases this head does not have")
        if "fc.bias" in state:
            raise HeadMismatchError(f"head {folder}: holds fc.bias, which vLLM's EagleLlamaForCausalLM (fc without "
                                    "bias) would not load")
        state["fc.bias"] = zero_bias()
    model_type = raw.get("model_type")
    return _Head(spec, state, [], model_type if isinstance(model_type, str) else "llama", embed)


def _layer_ids(value, where, key: str) -> list[int]:
    if not isinstance(value, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in value):
        raise HeadError(f"{where}: '{key}' must be a list of layer indices, got {json.dumps(value)[:60]}")
    return value


def _config_layers(raw: dict, where) -> tuple[int, ...] | None:
    """The target layers an EAGLE-3 config names, as ``hidden_states`` indices, or None (the default).

    vLLM reads a top-level ``eagle_aux_hidden_state_layer_ids`` as the hidden states *entering* those
    layers (it captures before running layer i): our convention. SGLang reads
    ``eagle_config.eagle_aux_hidden_state_layer_ids`` as layer *outputs* (it captures before layer
    ``i + 1``): ``hidden_states[i + 1]``."""
    top = raw.get("eagle_aux_hidden_state_layer_ids")
    ec = raw.get("eagle_config")
    if ec is not None and not isinstance(ec, dict):
        raise HeadError(f"{where}: 'eagle_config' must be an object, got {json.dumps(ec)[:60]}")
    ec = ec or {}
    if ec.get("use_aux_hidden_state") is False:
        raise HeadError(f"{where}: eagle_config.use_aux_hidden_state is false (a head reading only the final "
                        "feature); the EAGLE-3 head here fuses three target layers")
    vllm = tuple(_layer_ids(top, where, "eagle_aux_hidden_state_layer_ids")) if top is not None else None
    sg = ec.get("eagle_aux_hidden_state_layer_ids")
    sglang = tuple(i + 1 for i in _layer_ids(sg, where, "eagle_config.eagle_aux_hidden_state_layer_ids")) \
        if sg is not None else None
    if vllm and sglang and vllm != sglang:
        raise HeadMismatchError(f"{where}: eagle_aux_hidden_state_layer_ids {list(vllm)} (vLLM: the inputs of those "
                                f"layers) and eagle_config.eagle_aux_hidden_state_layer_ids {sg} (SGLang: their "
                                f"outputs, i.e. inputs {list(sglang)}) name different target layers")
    return vllm or sglang or None


def _check_vocab_maps(folder, d2t: torch.Tensor, t2d: torch.Tensor, vocab: int) -> None:
    """d2t: integer offsets to distinct target ids in range; t2d: the bool mask of exactly those ids."""
    if d2t.is_floating_point() or d2t.dtype == torch.bool or d2t.is_complex():
        raise HeadMismatchError(f"head {folder}: d2t has dtype {str(d2t.dtype).removeprefix('torch.')}; it holds "
                                "integer offsets (target id = draft id + d2t[draft id])")
    ids = torch.arange(len(d2t)) + d2t.long()
    out = ((ids < 0) | (ids >= vocab)).nonzero().flatten()
    if out.numel():
        i = int(out[0])
        raise HeadMismatchError(f"head {folder}: d2t maps draft id {i} to target id {int(ids[i])}, outside the "
                                f"vocabulary [0, {vocab}) (target id = draft id + d2t[draft id])")
    order = ids.argsort()
    same = (ids[order][1:] == ids[order][:-1]).nonzero().flatten()
    if same.numel():
        a, b = sorted((int(order[same[0]]), int(order[same[0] + 1])))
        raise HeadMismatchError(f"head {folder}: d2t maps draft ids {a} and {b} to the same target id {int(ids[a])}")
    if t2d.dtype != torch.bool:
        raise HeadMismatchError(f"head {folder}: t2d has dtype {str(t2d.dtype).removeprefix('torch.')}, expected bool "
                                "(the mask of the target ids in the draft vocabulary)")
    mask = torch.zeros(vocab, dtype=torch.bool)
    mask[ids] = True
    diff = (mask != t2d).nonzero().flatten()
    if diff.numel():
        k = int(diff[0])
        raise HeadMismatchError(f"head {folder}: t2d does not match d2t: t2d marks {int(t2d.sum())} target ids, d2t "
                                f"maps to {len(ids)} (first difference: token {k}, {'marked' if t2d[k] else 'not marked'} "
                                "by t2d)")


def _read_eagle3(folder: Path, probe: _Probe, target: LayerSpec | None = None) -> _Head:
    """An official / SGLang or vLLM EAGLE-3 folder, checked against its own config.json and, given
    the ``target``'s layer, its hidden and vocabulary sizes against the target's."""
    layout = LAYOUTS[probe.layout]
    raw, where = probe.config, folder / "config.json"
    archs = ", ".join(a for a in raw.get("architectures") or [] if isinstance(a, str)) or "EAGLE-3 tensors"
    if "speculators_config" in raw or "transformer_layer_config" in raw:
        raise HeadError(f"{where}: a speculators-format EAGLE-3 config ({archs}); this reads the official "
                        f"({OFFICIAL_EAGLE3_ARCH}) and vLLM ({VLLM_EAGLE3_ARCH}) configs")
    if raw.get("num_hidden_layers", 1) != 1:
        raise HeadError(f"{where}: num_hidden_layers is {raw.get('num_hidden_layers')}; the EAGLE-3 heads read here "
                        "have one layer (midlayer)")
    if probe.weights is None:
        raise HeadError(f"{folder}: no {' or '.join(WEIGHT_FILES)} (the head's weights)")
    for key, reader in (("bias", "SGLang builds fc with it"), ("attention_bias", "vLLM's layer reads it"),
                        ("qkv_bias", "vLLM's Llama layer reads it")):
        if raw.get(key):
            raise HeadMismatchError(f"head {folder}: config.json has \"{key}\": true ({reader}); the EAGLE-3 fc and "
                                    "attention here have no biases")
    spec = LayerSpec.from_config(raw, str(where), False)
    for key in ("hidden_size", "vocab_size") if target is not None else ():
        found, expected = getattr(spec, key), getattr(target, key)
        if found != expected:
            raise HeadMismatchError(f"head {folder} does not fit the target: config.json has {key} = {found!r}, "
                                    f"the target has {expected!r}")
    draft = raw.get("draft_vocab_size", spec.vocab_size)  # vLLM's default when absent
    if not isinstance(draft, int) or isinstance(draft, bool) or not 0 < draft <= spec.vocab_size:
        raise HeadError(f"{where}: draft_vocab_size must be an integer in [1, vocab_size = {spec.vocab_size}], "
                        f"got {json.dumps(draft)[:40]}")
    th = raw.get("target_hidden_size")
    if th is not None and th != spec.hidden_size:
        raise HeadMismatchError(f"head {folder}: config.json has target_hidden_size = {th!r} and hidden_size = "
                                f"{spec.hidden_size}; a draft narrower or wider than its target is not supported "
                                "(Eagle3Head works at the target's hidden size)")
    layers = _config_layers(raw, where)
    state, embed = _renamed_state(folder, probe, layout, "an EAGLE-3 head holds fc.weight, midlayer.*, norm.weight, "
                                  f"lm_head.weight, d2t, t2d and optionally {EMBED}")
    lm = state.get("lm_head.weight")
    if lm is not None and lm.dim() == 2 and lm.shape[0] != draft:
        said = f"draft_vocab_size = {draft}" if "draft_vocab_size" in raw else \
            f"no draft_vocab_size (= vocab_size {draft})"
        raise HeadMismatchError(f"head {folder}: config.json has {said}, but lm_head.weight has {lm.shape[0]} rows")
    if "d2t" not in state:
        if draft != spec.vocab_size:
            raise HeadMismatchError(f"head {folder}: tensor 'd2t' missing (expected shape [{draft}]): a draft "
                                    f"vocabulary of {draft} of {spec.vocab_size} tokens needs its draft-to-target map")
        state["d2t"] = torch.zeros(draft, dtype=torch.long)  # full vocabulary: the official loader drops d2t / t2d
    d2t = state["d2t"]
    if "t2d" not in state and d2t.dim() == 1 and not d2t.is_floating_point():  # vLLM and SGLang ignore t2d
        ids = torch.arange(len(d2t)) + d2t.long()
        t2d = torch.zeros(spec.vocab_size, dtype=torch.bool)
        t2d[ids[(ids >= 0) & (ids < spec.vocab_size)]] = True
        state["t2d"] = t2d
    _fits(folder, {k: tuple(v.shape) for k, v in state.items()}, spec.eagle3_tensors(draft), layout.to_file,
          "does not fit its config.json")
    _check_vocab_maps(folder, state["d2t"], state["t2d"], spec.vocab_size)
    state["d2t"] = state["d2t"].long()
    model_type = raw.get("model_type")
    return _Head(spec, state, [], model_type if isinstance(model_type, str) else "llama", embed, kind="eagle3",
                 e3=Eagle3Info(draft, layers, None))


def _target_dict(cfg: HeadConfig, folder) -> dict:
    """The target's text config of a native head: stored in it, or read from the target it names."""
    if cfg.target_config:
        return cfg.target_config
    from transformers import AutoConfig

    from ..models import TargetNotFound, resolve_target

    try:
        path = resolve_target(cfg.target)
    except TargetNotFound as e:
        raise HeadError(f"head {folder} stores no target_config, and its target cannot be read for the layer's "
                        f"configuration: {e}") from None
    d = AutoConfig.from_pretrained(path).get_text_config(decoder=True).to_dict()
    for key in ("hidden_size", "vocab_size", "model_type"):
        if d.get(key) != getattr(cfg, key):
            raise HeadMismatchError(f"head {folder} was trained for {key} {getattr(cfg, key)!r}, its target "
                                    f"{cfg.target!r} ({path}) has {d.get(key)!r}")
    return d


def _read_native(folder: Path) -> _Head:
    cfg = read_head_config(folder)
    weights = folder / "model.safetensors"
    check_safetensors(weights, HeadError)
    d = _target_dict(cfg, folder)
    state = load_file(str(weights))
    if cfg.type == "eagle3":
        d2t, lm = state.get("d2t"), state.get("lm_head.weight")
        draft = d2t.shape[0] if d2t is not None and d2t.dim() == 1 else lm.shape[0] if lm is not None else 0
        return _Head(LayerSpec.of_target(d), state, [], cfg.model_type, kind="eagle3",
                     e3=Eagle3Info(draft, tuple(cfg.feature_layers), d.get("num_hidden_layers")))
    return _Head(LayerSpec.of_target(d), state, list(cfg.draft_vocab), cfg.model_type)


def _read_any(folder: Path, probe: _Probe) -> _Head:
    if probe.layout == "native":
        return _read_native(folder)
    return _read_eagle3(folder, probe) if LAYOUTS[probe.layout].kind == "eagle3" else _read_official(folder, probe)


def check_layout(folder: str | Path) -> HeadConfig:
    """The cheap check of a non-native head folder (config and weight names, no target): what
    :func:`eagle.heads.check_head` does for ours. Returns a HeadConfig describing it (target unknown: '';
    an EAGLE-3 head's ``feature_layers`` empty when its config names none: the target's default)."""
    folder = Path(folder)
    probe = _probe(folder)
    raw = probe.config or {}
    where = folder / "config.json"
    eagle3 = probe.layout in LAYOUTS and LAYOUTS[probe.layout].kind == "eagle3"
    spec = LayerSpec.from_config(raw, str(where), False if eagle3 else raw.get("qkv_bias", False))
    if probe.weights is None:
        raise HeadError(f"{folder}: no {' or '.join(WEIGHT_FILES)} (the head's weights)")
    if not eagle3:
        return HeadConfig(target="", model_type=str(raw.get("model_type", "llama")), hidden_size=spec.hidden_size,
                          vocab_size=spec.vocab_size)
    if probe.state is None:
        _weight_names(probe.weights)  # the safetensors header, or the .bin under weights_only=True
    layers = _config_layers(raw, where)
    return HeadConfig(target="", model_type=str(raw.get("model_type", "llama")), hidden_size=spec.hidden_size,
                      vocab_size=spec.vocab_size, type="eagle3", feature_layers=list(layers or []))


# ---- import onto a target -------------------------------------------------------------------------------


def _check_embedding(folder, stored: torch.Tensor, model) -> None:
    """An official file's embed_tokens.weight must be the target's (up to 16-bit rounding): a head
    trained on another vocabulary or model is refused, never silently loaded."""
    emb = model.get_input_embeddings().weight.detach()
    if tuple(stored.shape) != tuple(emb.shape):
        raise HeadMismatchError(f"head {folder}: {EMBED} has shape {_shape(stored.shape)}, the target's embedding "
                                f"{_shape(emb.shape)} (another vocabulary)")
    a, b = stored.float(), emb.float().cpu()
    close = (a - b).abs() <= 1e-2 * b.abs() + 1e-6  # 16-bit storage rounds by < 0.4 %
    if not bool(close.all()):
        rows = (~close).any(dim=1).nonzero().flatten()
        raise HeadMismatchError(f"head {folder}: {EMBED} differs from the target's input embedding in "
                                f"{rows.numel()} of {emb.shape[0]} rows (first: token {int(rows[0])}); the head was "
                                "trained for another model or vocabulary")


def _with_layer(tcfg, spec: LayerSpec | None):
    """A copy of the target's text config whose :attr:`LayerSpec.OWN_LAYER` fields are ``spec``'s
    where they differ (``spec`` None: an unchanged copy)."""
    cfg = copy.deepcopy(tcfg)
    if spec is None:
        return cfg
    want = LayerSpec.of_target(cfg.to_dict())
    for key in ("intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim", "hidden_act",
                "rms_norm_eps"):
        if getattr(spec, key) != getattr(want, key):
            setattr(cfg, key, getattr(spec, key))
    if (spec.rope_theta, spec.rope_scaling) != (want.rope_theta, want.rope_scaling):
        cfg.rope_parameters = ({"rope_type": "default", "rope_theta": spec.rope_theta} if spec.rope_scaling is None
                               else {**spec.rope_scaling, "rope_theta": spec.rope_theta})
    return cfg


def _own_layer(spec: LayerSpec | None, target: LayerSpec) -> dict:
    """The fields in which ``spec`` (an EAGLE-3 head's layer) differs from the target's layer."""
    if spec is None:
        return {}
    return {k: getattr(spec, k) for k in LayerSpec.OWN_LAYER if getattr(spec, k) != getattr(target, k)}


def eagle3_for_target(model, draft_ids: torch.Tensor, feature_layers,
                      layer: dict | LayerSpec | None = None) -> Eagle3Head:
    """A fresh :class:`Eagle3Head` for ``model`` whose own layer is ``layer`` (a config dict such as
    a native head's ``HeadConfig.target_config``, or a :class:`LayerSpec`) where that differs from the
    target's in :attr:`LayerSpec.OWN_LAYER` (RoPE, widths, heads, norm eps, activation); without a
    difference, exactly :meth:`Eagle3Head.for_target`. Every EAGLE-3 loader builds the draft layer
    from the draft's config, so an imported head keeps its own RoPE base even when the target's differs."""
    tcfg = model.config.get_text_config(decoder=True)
    spec = LayerSpec.of_target(layer) if isinstance(layer, dict) and layer else layer or None
    if not _own_layer(spec, LayerSpec.of_target(tcfg.to_dict())):
        return Eagle3Head.for_target(model, draft_ids, feature_layers)
    base = model.get_decoder()
    head = Eagle3Head(_with_layer(tcfg, spec), type(base.layers[0]), type(base.rotary_emb),
                      torch.as_tensor(draft_ids, dtype=torch.long), feature_layers)
    with torch.no_grad():  # as for_target: the LM head starts as the target's rows
        head.lm_head.weight.copy_(model.get_output_embeddings().weight[head.draft_ids])
    return head.to(next(model.parameters()).device)


def _load_eagle3(folder: Path, probe: _Probe, model, tcfg) -> Eagle3Head:
    h = _read_eagle3(folder, probe, LayerSpec.of_target(tcfg.to_dict()))
    L = tcfg.num_hidden_layers
    layers = h.e3.feature_layers
    if layers is None:
        layers = default_feature_layers(L)
        bad = _check_layers(layers, L)
        if bad:
            raise HeadMismatchError(f"head {folder} names no target layers, and the official default (2, L//2, L-3) "
                                    f"= {bad}")
    else:
        bad = _check_layers(layers, L)
        if bad:
            raise HeadMismatchError(f"head {folder}: config.json names target layers {bad}")
    if h.embed is not None:
        _check_embedding(folder, h.embed, model)
    head = eagle3_for_target(model, torch.arange(len(h.state["d2t"])) + h.state["d2t"], layers, h.spec)
    expected = {k: tuple(v.shape) for k, v in head.state_dict().items() if not k.startswith("rotary.")}
    state = dict(h.state)
    for k, shape in expected.items():  # a Qwen2 target's layer has q/k/v biases; the EAGLE-3 layer has none
        if k.endswith("_proj.bias") and k not in state:
            state[k] = torch.zeros(shape, dtype=state["fc.weight"].dtype)
    _fits(folder, {k: tuple(v.shape) for k, v in state.items()}, expected, LAYOUTS[probe.layout].to_file,
          "does not fit the target's layer")
    device = next(head.parameters()).device
    head.load_state_dict({k: v.to(device) for k, v in state.items()}, strict=False)
    layer_dict = _with_layer(tcfg, h.spec).to_dict()  # the target's config with the head's own layer fields
    head.config = HeadConfig(target=getattr(model, "name_or_path", "") or "", model_type=tcfg.model_type,
                             hidden_size=tcfg.hidden_size, vocab_size=tcfg.vocab_size,
                             target_config=json.loads(json.dumps(layer_dict, default=str)), type="eagle3",
                             feature_layers=list(layers))
    head.layout = probe.layout
    return head.eval()


def load_layout(folder: str | Path, model) -> DraftHead | Eagle3Head:
    """Load a head folder in a non-native layout (see :func:`detect_layout`) onto ``model``.

    An EAGLE-1/2 folder gives a :class:`DraftHead`, an EAGLE-3 folder an :class:`Eagle3Head`; both use
    the target's own layer class, so this accepts targets whose layer is a Llama layer
    (:data:`LLAMA_LAYER_TARGETS`). An EAGLE-1/2 config's layer must be the target's; an EAGLE-3
    config's hidden and vocabulary sizes must be, its layer is its own (e.g. its RoPE base), and its
    fused layers are the config's ``eagle_aux_hidden_state_layer_ids`` (vLLM) or
    ``eagle_config.eagle_aux_hidden_state_layer_ids`` (SGLang, plus one), else the official
    ``(2, L//2, L-3)``. Raises :class:`HeadError` / :class:`HeadMismatchError` with one line naming
    the field or tensor (the file's name, expected vs found)."""
    folder = Path(folder)
    probe = _probe(folder)
    if probe.layout not in LAYOUTS:
        raise HeadError(f"head {folder} is in our own layout (or not a head): load it with eagle.load_head")
    tcfg = model.config.get_text_config(decoder=True)
    if tcfg.model_type not in LLAMA_LAYER_TARGETS:
        raise HeadMismatchError(f"head {folder} ({probe.layout} layout) holds a Llama decoder layer; it loads onto "
                                f"{', '.join(LLAMA_LAYER_TARGETS)} targets, whose layer is one, not a "
                                f"'{tcfg.model_type}' target")
    if LAYOUTS[probe.layout].kind == "eagle3":
        return _load_eagle3(folder, probe, model, tcfg)
    head_src = _read_official(folder, probe)
    target_dict = tcfg.to_dict()
    want = LayerSpec.of_target(target_dict)
    for key in LayerSpec.COMPARED:
        found, expected = getattr(head_src.spec, key), getattr(want, key)
        if found != expected:
            raise HeadMismatchError(f"head {folder} does not fit the target: config.json has {key} = {found!r}, "
                                    f"the target's layer has {expected!r}")
    if head_src.embed is not None:
        _check_embedding(folder, head_src.embed, model)
    head = DraftHead.for_target(model)
    expected = {k: tuple(v.shape) for k, v in head.state_dict().items()
                if k != "draft_vocab" and not k.startswith("rotary.")}
    lay = LAYOUTS[probe.layout]
    _fits(folder, {k: tuple(v.shape) for k, v in head_src.state.items()}, expected, lay.to_file,
          "does not fit the target's layer")
    device = next(head.parameters()).device
    head.load_state_dict({k: v.to(device) for k, v in head_src.state.items()}, strict=False)
    head.config = HeadConfig(target=getattr(model, "name_or_path", "") or "", model_type=tcfg.model_type,
                             hidden_size=tcfg.hidden_size, vocab_size=tcfg.vocab_size,
                             target_config=json.loads(json.dumps(target_dict, default=str)))
    head.layout = probe.layout
    return head.eval()


# ---- export ---------------------------------------------------------------------------------------------


def _from_module(head: nn.Module) -> _Head:
    d = head.layer_config.to_dict()
    state = {k: v.detach().cpu() for k, v in head.state_dict().items() if k != "draft_vocab" and not k.startswith("rotary.")}
    if not isinstance(head, Eagle3Head):
        return _Head(LayerSpec.of_target(d), state, head.draft_vocab.tolist(), d.get("model_type", ""))
    cfg = getattr(head, "config", None)  # load_head sets it: the target's layer count comes from its target config
    L = _target_dict(cfg, "(loaded)").get("num_hidden_layers") if isinstance(cfg, HeadConfig) else None
    return _Head(LayerSpec.of_target(d), state, [], d.get("model_type", ""), kind="eagle3",
                 e3=Eagle3Info(len(head.d2t), tuple(head.feature_layers), L))


def _head_kind(src: Path | None, probe: _Probe | None, head) -> str:
    if src is None:
        return "eagle3" if isinstance(head, Eagle3Head) else "eagle"
    if probe.layout == "native":
        return read_head_config(src).type
    return LAYOUTS[probe.layout].kind


def _check_out(out: Path, src: Path | None) -> None:
    if src is not None and out.resolve() == src.resolve():
        raise HeadError(f"--out {out} is the head folder itself; name a new folder")
    if out.exists() and not out.is_dir():
        raise HeadError(f"--out {out} exists and is not a folder")
    if out.is_dir():
        others = sorted(p.name for p in out.iterdir() if p.name not in ("config.json", "model.safetensors"))
        if others:
            raise HeadError(f"--out {out} exists and holds other files ({', '.join(others[:3])}); name a new or "
                            "empty folder (a previous export there is replaced)")


def _draft_vocab_note(name: str, draft_vocab: list[int], vocab: int, fmt: str, full_vocab: bool) -> str:
    """'' for a full-vocabulary head; a reduced one is refused unless ``full_vocab`` (then: the note)."""
    if not draft_vocab:
        return ""
    if not full_vocab:
        raise HeadError(f"{name} drafts over a reduced vocabulary ({len(draft_vocab)} of {vocab} tokens) that the "
                        f"{fmt} layout cannot store; add --full-vocab to export it drafting over all {vocab} tokens "
                        "(docs/interop.md)")
    return (f"the draft vocabulary ({len(draft_vocab)} of {vocab} tokens) is not exported: the exported head "
            f"drafts over all {vocab} tokens")


def _write(out: Path, files: dict[str, torch.Tensor], config: dict) -> None:
    """config.json + model.safetensors into ``out``, atomically (a previous export there is replaced)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=out.name + ".tmp", dir=out.parent))
    save_file(files, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    for p, mode in ((tmp, 0o755), (tmp / "model.safetensors", 0o644), (tmp / "config.json", 0o644)):
        os.chmod(p, mode)  # a folder to hand to a server, not mkdtemp's private 0700
    replace_dir(tmp, out)


def _export_eagle3(h: _Head, name: str, src, fmt: str, layout: Layout, out: Path) -> list[str]:
    notes = []
    _fits(src or "(loaded)", {k: tuple(v.shape) for k, v in h.state.items()},
          h.spec.eagle3_tensors(h.e3.draft_vocab_size), lambda k: k, f"cannot be exported as {fmt}")
    _check_vocab_maps(src or "(loaded)", h.state["d2t"].cpu(), h.state["t2d"].cpu(), h.spec.vocab_size)
    state, spec = dict(h.state), h.spec
    if spec.qkv_bias:  # a Qwen2 target's layer; the official, vLLM and SGLang EAGLE-3 q/k/v have no bias
        biases = {k: state.pop(k) for k in [k for k in state if k.endswith("_proj.bias")]}
        worst = max(float(b.abs().max()) for b in biases.values())
        if worst != 0:
            raise HeadError(f"{name} has non-zero q/k/v biases (max |b| = {worst:.3g}), which the EAGLE-3 layer of the "
                            "official code, vLLM and SGLang does not have (q/k/v without bias)")
        notes.append("the q/k/v biases are all zeros and are not written (the EAGLE-3 layer has none)")
        spec = replace(spec, qkv_bias=False)
    if h.embed is not None:
        notes.append(f"{EMBED} is not written: every loader takes the target's embedding")
    dtype = str(state["fc.weight"].dtype).removeprefix("torch.")
    try:
        config = layout.build_config(spec, dtype, h.e3)
    except HeadError as e:
        raise HeadError(f"{name} cannot be exported as {fmt}: {e}") from None
    state["d2t"], state["t2d"] = state["d2t"].long(), state["t2d"].bool()
    _write(out, {layout.to_file(k): v.contiguous() for k, v in state.items()}, config)
    return notes


def export_head(head: str | Path | nn.Module, fmt: str, out: str | Path, full_vocab: bool = False) -> list[str]:
    """Write ``head`` (a folder in any layout, or a loaded :class:`DraftHead` / :class:`Eagle3Head`)
    to the folder ``out`` in the layout ``fmt`` asks for, atomically: ``"eagle"``: official EAGLE-1/2;
    ``"eagle3"``: official EAGLE-3 (also SGLang's); ``"vllm"``: vLLM's EAGLE-1 or EAGLE-3, by the
    head's type. Returns notes for the user. Refuses (one-line :class:`HeadError`), never losing a
    tensor or a setting silently:

    * a format for the other head type (``eagle`` with an EAGLE-3 head, ``eagle3`` with an EAGLE-1/2 one);
    * EAGLE-1/2: a reduced draft vocabulary unless ``full_vocab`` (the layouts have no such field:
      the exported head then drafts over the whole vocabulary); a non-zero ``fc.bias`` for ``vllm``
      (vLLM's EAGLE-1 ``fc`` has no bias; it cannot be folded into the weight: the input
      ``[embed; feature]`` has no constant component);
    * EAGLE-3: fused target layers the format cannot state (official: only ``(2, L//2, L-3)``;
      vLLM: three increasing layers in ``1..L-1``), non-zero q/k/v biases (a Qwen2 target's);
    * a layer that is not a Llama layer (e.g. Qwen3's q/k norms), RoPE or head_dim the layout cannot state.
    """
    if fmt not in EXPORT_FORMATS:
        raise HeadError(f"unknown export format {fmt!r} (one of {', '.join(EXPORT_FORMATS)})")
    module = isinstance(head, nn.Module)
    name = "this head" if module else f"head {head}"
    src = None if module else Path(head)
    out = Path(out)
    probe = None if src is None else _probe(src)
    kind = _head_kind(src, probe, head)
    if (fmt, kind) not in FORMAT_LAYOUT:
        if kind == "eagle":
            raise HeadError(f"{name} is an EAGLE-1/2 head; {fmt} export needs an EAGLE-3 head")
        raise HeadError(f"{name} is an EAGLE-3 head; --format {fmt} writes EAGLE-1/2 heads "
                        "(use --format eagle3 or vllm)")
    layout = LAYOUTS[FORMAT_LAYOUT[fmt, kind]]
    _check_out(out, src)
    if src is not None and probe.layout == "native" and kind == "eagle":  # cheap refusal before the target's config
        cfg = read_head_config(src)
        _draft_vocab_note(name, cfg.draft_vocab, cfg.vocab_size, fmt, full_vocab)
    h = _from_module(head) if src is None else _read_any(src, probe)
    if h.model_type not in LLAMA_LAYER_TARGETS:
        raise HeadError(f"{name} was trained for a '{h.model_type}' target, whose decoder layer is not a Llama "
                        f"layer; the {fmt} layout holds a Llama layer ({', '.join(LLAMA_LAYER_TARGETS)} targets)")
    if kind == "eagle3":
        return _export_eagle3(h, name, src, fmt, layout, out)
    notes = [n for n in [_draft_vocab_note(name, h.draft_vocab, h.spec.vocab_size, fmt, full_vocab)] if n]
    _fits(src or "(loaded)", {k: tuple(v.shape) for k, v in h.state.items()}, h.spec.tensors(), lambda k: k,
          f"cannot be exported as {fmt}")
    state = dict(h.state)
    if layout.fc_bias == "absent":
        b = state.pop("fc.bias")
        if bool(b.ne(0).any()):
            raise HeadError(f"{name} has a non-zero fc.bias (max |b| = {float(b.abs().max()):.3g}), which vLLM's "
                            f"EagleLlamaForCausalLM cannot hold (fc without bias) and which cannot be folded into "
                            f"fc.weight; export --format eagle instead (the official code and SGLang keep the bias)")
        notes.append("fc.bias is all zeros and is not written (vLLM's EAGLE-1 fc has no bias)")
    if h.embed is not None:
        notes.append(f"{EMBED} is not written: every loader takes the target's embedding")
    dtype = str(state["fc.weight"].dtype).removeprefix("torch.")
    try:
        config = layout.build_config(h.spec, dtype, None)
    except HeadError as e:
        raise HeadError(f"{name} cannot be exported as {fmt}: {e}") from None
    _write(out, {layout.to_file(k): v.contiguous() for k, v in state.items()}, config)
    return notes
