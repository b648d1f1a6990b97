"""Prompt files and chat formatting."""
from __future__ import annotations

import json
from pathlib import Path

import torch

__all__ = ["load_prompts", "encode_chat", "PromptFileError"]


class PromptFileError(ValueError):
    """A prompts file that cannot be used; the message names the file and line."""


def load_prompts(path: str | Path, limit: int | None = None) -> list[str]:
    """Read a JSONL file: one object per line with a ``"prompt"`` string, or MT-bench style
    ``"turns"`` (the first turn is used). Blank lines are skipped."""
    path = Path(path)
    if not path.is_file():
        raise PromptFileError(f"prompts file not found: {path}")
    prompts = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise PromptFileError(f"{path}:{n}: not valid JSON ({e.msg})") from None
        if not isinstance(obj, dict):
            raise PromptFileError(f"{path}:{n}: expected a JSON object")
        if isinstance(obj.get("prompt"), str):
            text = obj["prompt"]
        elif isinstance(obj.get("turns"), list) and obj["turns"] and isinstance(obj["turns"][0], str):
            text = obj["turns"][0]
        else:
            raise PromptFileError(f"{path}:{n}: needs a \"prompt\" string or a non-empty \"turns\" list of strings")
        if not text.strip():
            raise PromptFileError(f"{path}:{n}: empty prompt")
        prompts.append(text)
        if limit is not None and len(prompts) >= limit:
            break
    if not prompts:
        raise PromptFileError(f"prompts file has no prompts: {path}")
    return prompts


def encode_chat(tokenizer, text: str) -> torch.Tensor:
    """Token ids ``(N,)`` of ``text`` as a user message with the generation prompt appended
    (plain tokenization when the tokenizer has no chat template, e.g. a base model)."""
    if getattr(tokenizer, "chat_template", None):
        enc = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)
    else:
        enc = tokenizer(text)
    ids = enc["input_ids"] if hasattr(enc, "keys") else enc
    return torch.tensor(ids, dtype=torch.long)
