"""A separate small draft model for chain drafting (Leviathan et al.), distilled from the target.

The student is the target's own transformers class with fewer decoder layers, initialised from a
chosen subset of the target's layers (plus its final norm), and trained against the target's
next-token distributions (:mod:`eagle.train.distill`). Its token embedding and LM head are the
target's, frozen: they are most of a small model's parameters (49152 x 576 = 28 M for SmolLM2), so a
checkpoint stores only the weights that differ from the target and :func:`load_draft_model`
re-attaches the shared ones from the target it is loaded onto (the same trick as the EAGLE head).

Checkpoint folder: ``config.json`` (the student's transformers config), ``draft.json`` (what it was
made from, which weights are shared) and ``model.safetensors`` (the rest).

:class:`ModelDrafter` is ``drafter.type: model``: such a model (or any other with the target's
vocabulary) drafting for the target.
"""
from __future__ import annotations

import copy
import json
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from .draft.base import register_drafter
from .draft.selfdraft import SelfDrafter
from .io import check_safetensors, replace_dir
from .target import Target

__all__ = ["build_draft_model", "save_draft_model", "load_draft_model", "check_draft_model", "is_draft_model",
           "DraftModelError", "DraftModelMismatchError", "shared_weight_names", "ModelDrafter"]

_LAYER = re.compile(r"(^|\.)layers\.(\d+)\.")


class DraftModelError(ValueError):
    """A draft model folder that cannot be read; the message names the file and what is wrong."""


class DraftModelMismatchError(DraftModelError):
    """A draft model checkpoint does not fit the target it is loaded onto."""


def shared_weight_names(model) -> list[str]:
    """State-dict names of the token embedding and LM head (shared with the target, not stored)."""
    out = []
    for module in (model.get_input_embeddings(), model.get_output_embeddings()):
        for name, mod in model.named_modules():
            if mod is module:
                out.append(name + ".weight")
                break
    return sorted(set(out))


def build_draft_model(target, layers: list[int]):
    """A copy of ``target`` keeping only the decoder layers ``layers`` (in that order), with the
    target's embedding, final norm and LM head. Embedding and LM head are the target's own
    parameters (shared, frozen); everything else is a trainable copy."""
    tcfg = target.config
    n = tcfg.get_text_config(decoder=True).num_hidden_layers
    if not layers or any(not 0 <= i < n for i in layers):
        raise ValueError(f"init layers must be indices into the target's {n} layers, got {layers}")
    cfg = copy.deepcopy(tcfg)
    cfg.num_hidden_layers = len(layers)
    if getattr(cfg, "layer_types", None):  # Gemma-3 / Qwen2: per-layer attention kinds follow the layers
        cfg.layer_types = [tcfg.layer_types[i] for i in layers]
    student = type(target)(cfg).to(dtype=target.dtype, device=target.device)
    src = target.state_dict()
    shared = set(shared_weight_names(student))  # re-pointed at the target's tensors below, not copied
    with torch.no_grad():
        for name, p in student.state_dict().items():
            if name in shared:
                continue
            p.copy_(src[_LAYER.sub(lambda m: f"{m.group(1)}layers.{layers[int(m.group(2))]}.", name, count=1)])
    _share(student, target)
    student.config.eagle_init_layers = list(layers)
    return student


def _share(student, target) -> None:
    """Point the student's embedding and LM head at the target's (frozen) parameters."""
    student.get_input_embeddings().weight = target.get_input_embeddings().weight
    student.get_output_embeddings().weight = target.get_output_embeddings().weight


def save_draft_model(model, folder: str | Path, target_name: str, dtype: torch.dtype | None = None,
                     extra: dict | None = None) -> None:
    """Write the draft model atomically (shared embedding / LM head left out; see module doc)."""
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=folder.name + ".tmp", dir=folder.parent))
    shared = shared_weight_names(model)
    state = {k: v.detach().cpu().to(dtype or v.dtype).contiguous() for k, v in model.state_dict().items()
             if k not in shared}
    save_file(state, str(tmp / "model.safetensors"))
    model.config.to_json_file(str(tmp / "config.json"))
    tcfg = model.config.get_text_config(decoder=True)
    meta = {"format": "eagle-draft-model", "target": target_name, "model_type": tcfg.model_type,
            "hidden_size": tcfg.hidden_size, "vocab_size": tcfg.vocab_size, "shared_from_target": shared,
            "init_layers": getattr(model.config, "eagle_init_layers", None),
            "parameters": {"stored": sum(v.numel() for v in state.values()),
                           "shared": sum(p.numel() for p in {id(p): p for p in (
                               model.get_input_embeddings().weight, model.get_output_embeddings().weight)}.values())}}
    meta.update(extra or {})
    (tmp / "draft.json").write_text(json.dumps(meta, indent=1))
    replace_dir(tmp, folder)


def is_draft_model(folder: str | Path) -> bool:
    return (Path(folder) / "draft.json").is_file()


def check_draft_model(folder: str | Path) -> dict:
    """The ``draft.json`` of a draft model folder, after reading it and the weight file's header
    (a truncated or corrupt file is found here, before any model is loaded)."""
    folder = Path(folder)
    if not is_draft_model(folder):
        raise FileNotFoundError(f"no draft model at {folder} (expected draft.json, config.json, model.safetensors)")
    try:
        meta = json.loads((folder / "draft.json").read_text(encoding="utf-8"))
    except ValueError as e:
        raise DraftModelError(f"{folder / 'draft.json'}: not valid JSON ({e})") from None
    missing = [k for k in ("model_type", "hidden_size", "vocab_size", "shared_from_target") if k not in meta]
    if missing:
        raise DraftModelError(f"{folder / 'draft.json'}: missing {', '.join(missing)}")
    check_safetensors(folder / "model.safetensors", DraftModelError)
    return meta


def load_draft_model(folder: str | Path, target):
    """Load a :func:`save_draft_model` checkpoint onto ``target`` (same device and dtype, shared
    embedding and LM head). Raises :class:`DraftModelMismatchError` when it was made for a target of
    another architecture, hidden size or vocabulary."""
    from transformers import AutoConfig, AutoModelForCausalLM

    folder = Path(folder)
    meta = check_draft_model(folder)
    tcfg = target.config.get_text_config(decoder=True)
    for key in ("model_type", "hidden_size", "vocab_size"):
        if meta[key] != getattr(tcfg, key):
            raise DraftModelMismatchError(f"draft model {folder} was made for a target with {key} {meta[key]!r}, "
                                          f"this target has {getattr(tcfg, key)!r}")
    cfg = AutoConfig.from_pretrained(str(folder))
    impl = "eager" if target.config._attn_implementation == "eager" else "sdpa"
    model = AutoModelForCausalLM.from_config(cfg, dtype=target.dtype, attn_implementation=impl)
    state = load_file(str(folder / "model.safetensors"))  # its header was read by check_draft_model
    missing, unexpected = model.load_state_dict({k: v.to(target.dtype) for k, v in state.items()}, strict=False)
    missing = [k for k in missing if k not in meta["shared_from_target"]]
    if missing or unexpected:
        raise DraftModelMismatchError(f"draft model {folder}: missing weights {missing}, unexpected {unexpected}")
    _share(model, target)
    model.to(target.device).eval().requires_grad_(False)
    return model


@register_drafter("model")
class ModelDrafter(SelfDrafter):
    """``drafter.type: model``: a separate small causal LM sharing the target's tokenizer drafts the
    tree shape as the target would for itself (:class:`~eagle.draft.SelfDrafter` on a Target of its
    own). ``options.model``: a folder of :func:`save_draft_model` (loaded onto the target, sharing
    its embedding and LM head), or any transformers checkpoint or embedded name with the target's
    vocabulary (loaded on the target's device, in its LM head's precision). The small model's
    Target takes the target's attention (the tree kernel where the target uses it, else SDPA), so
    the config's ``attention`` reaches it through the target."""

    @dataclass
    class Options:
        model: str = field(default="", metadata={"path": "model"})  # an embedded target name or a local folder
        sample: bool = False  # sample children without replacement from q (temperature > 0) instead of top-k

        def validate(self) -> None:
            if not self.model:
                raise ValueError("drafter.type 'model' needs drafter.model (a model name or folder)")

    def __init__(self, target: Target, tree, options: Options):
        from .models import load_model

        if is_draft_model(options.model):  # distilled by `eagle distill`: shares the target's embedding
            small = load_draft_model(options.model, target.model)
        else:  # any transformers checkpoint with the target's vocabulary
            small = load_model(options.model, device=target.device, dtype=target.lm_head.weight.dtype)
        if small.get_output_embeddings().weight.shape[0] != target.lm_head.weight.shape[0]:
            raise ValueError(f"draft model {options.model} has another vocabulary size than the target")
        super().__init__(Target(small, "triton" if target.use_kernel else "reference"), tree, options)

    @classmethod
    def check_files(cls, tree, options: Options) -> None:
        if is_draft_model(options.model):
            check_draft_model(options.model)
