"""Head checkpoint layouts: ours, the official EAGLE-1/2 one and vLLM's; detection, import, export.

Three layouts hold the same EAGLE-1/2 head (``fc(cat[embed, feature])`` with bias, then one Llama
decoder layer without its input norm); docs/interop.md has the full mapping and the sources:

* ``native``: our folder (``config.json`` = :class:`HeadConfig`, ``model.safetensors`` with
  ``fc.*`` and ``layer.*``), written by :func:`eagle.heads.save_head`;
* ``eagle``: what SafeAILab/EAGLE publishes for EAGLE-1/2 (``eagle/model/cnets1.py`` reads it): the
  ``config.json`` of a one-layer ``LlamaForCausalLM`` and ``fc.*`` + ``layers.0.*`` (optionally
  ``embed_tokens.weight``) in ``pytorch_model.bin`` or ``model.safetensors``. Its loader reads
  ``"bias"`` (default true) as "fc has a bias" and ``"qkv_bias"`` for q/k/v biases;
* ``vllm``: the same tensors under ``architectures: ["EagleLlamaForCausalLM"]`` (the name vLLM's
  registry maps to ``llama_eagle.py``) without ``fc.bias``: that model builds ``fc`` with
  ``bias=False``, and its Llama layer reads a ``"bias"`` config key as *attention* bias.

:func:`detect_layout` tells them apart from the files; :func:`load_layout` loads a non-native
folder onto a target (``eagle.load_head`` dispatches to it); :func:`export_head` writes a head (a
folder of any layout, or a loaded :class:`DraftHead`) in the ``eagle`` or ``vllm`` layout.

A layout is one :class:`Layout` row of :data:`LAYOUTS` (tensor-name renames, architecture name,
what happens to ``fc.bias``, a config.json builder). An EAGLE-3 head type adds rows of kind
``"eagle3"`` (and its reader); until then an EAGLE-3 folder is detected and refused by name.
"""
from __future__ import annotations

import json
import os
import pickle
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from ..io import check_safetensors, replace_dir
from .eagle import DraftHead, HeadConfig, HeadError, HeadMismatchError, read_head_config

__all__ = ["Layout", "LayerSpec", "LAYOUTS", "EXPORT_FORMATS", "LLAMA_LAYER_TARGETS", "detect_layout",
           "load_layout", "check_layout", "export_head"]

# model types whose decoder layer is exactly a Llama layer (Qwen2: plus q/k/v biases); the official
# and vLLM EAGLE-1 heads are Llama layers, so only these targets' heads convert without loss
LLAMA_LAYER_TARGETS = ("llama", "mistral", "qwen2")
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")  # read in this order
EMBED = "embed_tokens.weight"  # the target's embedding; checked on import, never written
EXPORT_FORMATS = ("eagle", "eagle3", "vllm")
FORMAT_KIND = {"eagle": "eagle", "vllm": "eagle", "eagle3": "eagle3"}  # which head type a format holds
_OFFICIAL_ROPE = ("linear", "dynamic")  # rope_scaling types cnets1.LlamaAttention._init_rope knows


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
        """Our names and shapes of every tensor of a head with this layer."""
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


def _official_config(spec: LayerSpec, dtype: str) -> dict:
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


def _vllm_config(spec: LayerSpec, dtype: str) -> dict:
    cfg = _llama_config(spec, "EagleLlamaForCausalLM", dtype)
    if spec.head_dim != spec.hidden_size // spec.num_attention_heads:
        cfg["head_dim"] = spec.head_dim  # vLLM's LlamaAttention reads it
    if spec.rope_scaling is not None:
        cfg["rope_scaling"] = dict(spec.rope_scaling)
    return cfg


@dataclass(frozen=True)
class Layout:
    """One checkpoint layout of a head type: how tensor names and config.json map to ours."""

    name: str
    kind: str  # the head type it holds: "eagle" (EAGLE-1/2, DraftHead); an EAGLE-3 row says "eagle3"
    architecture: str  # config.json "architectures"
    renames: tuple[tuple[str, str], ...]  # (our prefix, file prefix), first match wins
    fc_bias: str  # "stored": fc.bias in the file; "absent": not in the file, only a zero bias converts
    build_config: Callable[[LayerSpec, str], dict]  # (layer, dtype name) -> config.json

    def to_file(self, name: str) -> str:
        return next((f + name[len(o):] for o, f in self.renames if name.startswith(o)), name)

    def from_file(self, name: str) -> str | None:
        """Our name for a tensor of the file, None for a tensor the layout does not hold."""
        return next((o + name[len(f):] for o, f in self.renames if name.startswith(f)), None)


_EAGLE_RENAMES = (("fc.", "fc."), ("layer.", "layers.0."))
LAYOUTS: dict[str, Layout] = {
    "eagle": Layout("eagle", "eagle", "LlamaForCausalLM", _EAGLE_RENAMES, "stored", _official_config),
    "vllm": Layout("vllm", "eagle", "EagleLlamaForCausalLM", _EAGLE_RENAMES, "absent", _vllm_config),
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
        return _Probe("eagle3", raw, weights)
    if weights is None:  # a one-layer model config without weights is taken for a head missing them
        return _Probe("eagle" if raw.get("num_hidden_layers") == 1 else "native", raw)
    names, state = _weight_names(weights)
    if any(n.startswith(("midlayer.", "d2t", "t2d")) for n in names):
        return _Probe("eagle3", raw, weights)
    # EAGLE keys are top-level (fc.*, layers.0.*); a transformers causal LM's sit under model.*
    if not any(n.startswith(("fc.", "layers.")) for n in names):
        return _Probe("native")
    return _Probe("vllm" if "EagleLlamaForCausalLM" in archs else "eagle", raw, weights, state)


def detect_layout(folder: str | Path) -> str:
    """``"native"``, ``"eagle"`` (official EAGLE-1/2), ``"vllm"`` or ``"eagle3"`` (an official EAGLE-3
    head, not loadable as an EAGLE-1/2 head), from the folder's files. Folders that are not a head at
    all come back as ``"native"``: its reader gives the one-line error for them."""
    return _probe(folder).layout


def _refuse_eagle3(folder, probe: _Probe) -> None:
    if probe.layout == "eagle3":
        archs = ", ".join((probe.config or {}).get("architectures") or []) or "EAGLE-3 tensors"
        raise HeadError(f"head {folder} is an EAGLE-3 head ({archs}); this reads EAGLE-1/2 heads "
                        f"(layouts native, {', '.join(LAYOUTS)})")


def _shape(t) -> str:
    return str(list(t))


def _fits(folder, found: dict[str, tuple], expected: dict[str, tuple], name: Callable[[str], str], what: str) -> None:
    """One-line HeadMismatchError for the first kind of difference between two {name: shape} maps
    (``name`` turns our name into the one shown: the file's)."""
    missing = [k for k in expected if k not in found]
    if missing:
        raise HeadMismatchError(f"head {folder} {what}: tensor {', '.join(repr(name(k)) for k in missing[:4])} "
                                f"missing (expected shape {', '.join(_shape(expected[k]) for k in missing[:4])})")
    extra = [k for k in found if k not in expected]
    if extra:
        raise HeadMismatchError(f"head {folder} {what}: unexpected tensor "
                                f"{', '.join(f'{name(k)!r} {_shape(found[k])}' for k in extra[:4])}")
    for k, shape in expected.items():
        if tuple(found[k]) != tuple(shape):
            raise HeadMismatchError(f"head {folder} {what}: tensor {name(k)!r} has shape {_shape(found[k])}, "
                                    f"expected {_shape(shape)}")


@dataclass
class _Head:
    """A head read from any layout, in our tensor names."""

    spec: LayerSpec
    state: dict[str, torch.Tensor]
    draft_vocab: list[int]
    model_type: str  # the target's ("llama" when an official config says no more)
    embed: torch.Tensor | None = None  # an official file's embed_tokens.weight


def _read_official(folder: Path, probe: _Probe) -> _Head:
    layout = LAYOUTS[probe.layout]
    raw, where = probe.config, folder / "config.json"
    if raw.get("num_hidden_layers", 1) != 1:
        raise HeadError(f"{where}: num_hidden_layers is {raw.get('num_hidden_layers')}; EAGLE-1/2 heads have one layer")
    if probe.weights is None:
        raise HeadError(f"{folder}: no {' or '.join(WEIGHT_FILES)} (the head's weights)")
    spec = LayerSpec.from_config(raw, str(where), raw.get("qkv_bias", False), head_dim_key=layout.name != "eagle")
    file_state = probe.state if probe.state is not None else _read_weights(probe.weights)
    embed = file_state.get(EMBED)
    state, unknown = {}, []
    for k, v in file_state.items():
        ours = layout.from_file(k)
        if ours is not None:
            state[ours] = v
        elif k != EMBED:
            unknown.append(k)
    if unknown:
        listed = ", ".join(f"{k!r} {_shape(file_state[k].shape)}" for k in unknown[:4])
        raise HeadMismatchError(f"head {folder}: unexpected tensor {listed} (an EAGLE-1/2 head holds fc.*, layers.0.* "
                                f"and optionally {EMBED})")
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
    return _Head(LayerSpec.of_target(d), load_file(str(weights)), list(cfg.draft_vocab), cfg.model_type)


def _read_any(folder: Path, probe: _Probe) -> _Head:
    _refuse_eagle3(folder, probe)
    return _read_native(folder) if probe.layout == "native" else _read_official(folder, probe)


def check_layout(folder: str | Path) -> HeadConfig:
    """The cheap check of a non-native head folder (config and weight names, no target): what
    :func:`eagle.heads.check_head` does for ours. Returns a HeadConfig describing it (target unknown: '')."""
    folder = Path(folder)
    probe = _probe(folder)
    _refuse_eagle3(folder, probe)
    raw = probe.config or {}
    spec = LayerSpec.from_config(raw, str(folder / "config.json"), raw.get("qkv_bias", False))
    if probe.weights is None:
        raise HeadError(f"{folder}: no {' or '.join(WEIGHT_FILES)} (the head's weights)")
    return HeadConfig(target="", model_type=str(raw.get("model_type", "llama")), hidden_size=spec.hidden_size,
                      vocab_size=spec.vocab_size)


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


def load_layout(folder: str | Path, model) -> DraftHead:
    """Load a head folder in a non-native layout (see :func:`detect_layout`) onto ``model``.

    The head is a :class:`DraftHead` of the target's own layer class, so this accepts targets whose
    layer is a Llama layer (:data:`LLAMA_LAYER_TARGETS`) and a config.json whose layer fits the
    target's. Raises :class:`HeadError` / :class:`HeadMismatchError` with one line naming the field
    or tensor (the file's name, expected vs found)."""
    folder = Path(folder)
    probe = _probe(folder)
    _refuse_eagle3(folder, probe)
    if probe.layout not in LAYOUTS:
        raise HeadError(f"head {folder} is in our own layout (or not a head): load it with eagle.load_head")
    tcfg = model.config.get_text_config(decoder=True)
    if tcfg.model_type not in LLAMA_LAYER_TARGETS:
        raise HeadMismatchError(f"head {folder} ({probe.layout} layout) holds a Llama decoder layer; it loads onto "
                                f"{', '.join(LLAMA_LAYER_TARGETS)} targets, whose layer is one, not a "
                                f"'{tcfg.model_type}' target")
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


def _from_module(head: DraftHead) -> _Head:
    d = head.layer_config.to_dict()
    state = {k: v.detach().cpu() for k, v in head.state_dict().items() if k != "draft_vocab" and not k.startswith("rotary.")}
    return _Head(LayerSpec.of_target(d), state, head.draft_vocab.tolist(), d.get("model_type", ""))


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


def export_head(head: str | Path | DraftHead, fmt: str, out: str | Path, full_vocab: bool = False) -> list[str]:
    """Write ``head`` (a folder in any layout, or a loaded :class:`DraftHead`) to the folder ``out``
    in the layout ``fmt`` (``"eagle"``: official EAGLE-1/2; ``"vllm"``: vLLM's EAGLE-1), atomically.
    Returns notes for the user. Refuses (one-line :class:`HeadError`), never losing a tensor silently:

    * a head with a reduced draft vocabulary unless ``full_vocab`` (the layouts have no such field:
      the exported head then drafts over the whole vocabulary);
    * a non-zero ``fc.bias`` for ``vllm`` (vLLM's EAGLE-1 ``fc`` has no bias; it cannot be folded
      into the weight: the input ``[embed; feature]`` has no constant component);
    * a layer that is not a Llama layer (e.g. Qwen3's q/k norms), RoPE or head_dim the layout cannot state.
    """
    if fmt not in EXPORT_FORMATS:
        raise HeadError(f"unknown export format {fmt!r} (one of {', '.join(EXPORT_FORMATS)})")
    name = f"head {head}" if not isinstance(head, DraftHead) else "this head"
    src = Path(head) if not isinstance(head, DraftHead) else None
    out = Path(out)
    if src is not None:
        probe = _probe(src)
        _refuse_eagle3(src, probe)
    if FORMAT_KIND[fmt] != "eagle":
        raise HeadError(f"{name} is an EAGLE-1/2 head; {fmt} export needs an EAGLE-3 head")
    _check_out(out, src)
    if src is not None and probe.layout == "native":  # the cheap refusal before the target's config is read
        cfg = read_head_config(src)
        _draft_vocab_note(name, cfg.draft_vocab, cfg.vocab_size, fmt, full_vocab)
    h = _from_module(head) if src is None else _read_any(src, probe)
    layout = LAYOUTS[fmt]
    notes = [n for n in [_draft_vocab_note(name, h.draft_vocab, h.spec.vocab_size, fmt, full_vocab)] if n]
    if h.model_type not in LLAMA_LAYER_TARGETS:
        raise HeadError(f"{name} was trained for a '{h.model_type}' target, whose decoder layer is not a Llama "
                        f"layer; the {fmt} layout holds a Llama layer ({', '.join(LLAMA_LAYER_TARGETS)} targets)")
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
        config = layout.build_config(h.spec, dtype)
    except HeadError as e:
        raise HeadError(f"{name} cannot be exported as {fmt}: {e}") from None
    files = {layout.to_file(k): v.contiguous() for k, v in state.items()}
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=out.name + ".tmp", dir=out.parent))
    save_file(files, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    for p, mode in ((tmp, 0o755), (tmp / "model.safetensors", 0o644), (tmp / "config.json", 0o644)):
        os.chmod(p, mode)  # a folder to hand to a server, not mkdtemp's private 0700
    replace_dir(tmp, out)
    return notes
