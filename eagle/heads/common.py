"""What every draft-head kind shares: the errors, the EAGLE head config, the one-layer copy of a
target config a head's decoder layer is built from, and the checks a checkpoint reader runs (its
config.json, tensor shapes, fit to the target). Imports no head kind; the kinds and the checkpoint
module (:mod:`eagle.heads.formats`) import it.
"""
from __future__ import annotations

import copy
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file

from ..io import check_safetensors

__all__ = ["HeadError", "HeadNotFoundError", "HeadMismatchError", "HeadConfig", "layer_config", "read_config_json",
           "check_fits_target", "check_tensor_shapes", "read_checked_state"]


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
    type: str = "eagle"  # eagle (EAGLE-1/2, eagle/heads/eagle.py) | eagle3 (eagle/heads/eagle3.py)
    feature_layers: list[int] = field(default_factory=list)  # eagle3: target hidden_states indices it fuses

    def to_json(self) -> str:
        return json.dumps(asdict(self))


def layer_config(target_config):
    """A one-layer copy of the target's text config for a head's decoder layer: full attention
    (no sliding window) over SDPA."""
    cfg = copy.deepcopy(target_config.get_text_config(decoder=True))
    cfg.num_hidden_layers = 1
    if getattr(cfg, "layer_types", None):
        cfg.layer_types = ["full_attention"]
    if hasattr(cfg, "sliding_window"):
        cfg.sliding_window = None
    cfg._attn_implementation = "sdpa"
    return cfg


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
