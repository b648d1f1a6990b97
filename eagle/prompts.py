"""Prompt files (one-turn prompts and Spec-Bench / MT-bench questions) and chat formatting."""
from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import torch

__all__ = ["Question", "question_row", "load_questions", "load_prompts", "encode_chat", "encode_conversation", "subtask",
           "MT_BENCH_CATEGORIES", "PromptFileError"]

# MT-bench's eight categories: Spec-Bench reports them pooled as one subtask, ``mt_bench``
MT_BENCH_CATEGORIES = frozenset({"writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem",
                                 "humanities"})


class PromptFileError(ValueError):
    """A prompts file that cannot be used; the message names the file and line."""


@dataclass(frozen=True)
class Question:
    """One row of a prompts file: ``turns`` are user messages, asked one after another (turn k after
    the conversation so far); a ``{"prompt": ...}`` row is a one-turn question."""

    turns: tuple[str, ...]
    category: str = ""
    question_id: str = ""

    @property
    def subtask(self) -> str:
        return subtask(self.category)


def subtask(category: str) -> str:
    """The Spec-Bench subtask a category is reported under: ``mt_bench`` for the eight MT-bench
    categories, the category itself otherwise (``uncategorized`` for rows without one)."""
    if category in MT_BENCH_CATEGORIES:
        return "mt_bench"
    return category or "uncategorized"


def question_row(obj, where: str) -> Question:
    """One checked row (a ``{"prompt"}`` or ``{"turns": [...]}`` object); ``where`` (file:line) names it in errors."""
    if not isinstance(obj, dict):
        raise PromptFileError(f"{where}: expected a JSON object")
    if "turns" in obj:
        turns = obj["turns"]
        if not isinstance(turns, list) or not turns:
            raise PromptFileError(f"{where}: \"turns\" must be a non-empty list of strings")
        for k, t in enumerate(turns):
            if not isinstance(t, str):
                raise PromptFileError(f"{where}: turn {k + 1} is not a string ({type(t).__name__})")
            if not t.strip():
                raise PromptFileError(f"{where}: turn {k + 1} is empty")
    elif "prompt" in obj:
        if not isinstance(obj["prompt"], str):
            raise PromptFileError(f"{where}: \"prompt\" is not a string ({type(obj['prompt']).__name__})")
        if not obj["prompt"].strip():
            raise PromptFileError(f"{where}: empty prompt")
        turns = [obj["prompt"]]
    else:
        raise PromptFileError(f"{where}: needs a \"prompt\" string or a non-empty \"turns\" list of strings")
    category = obj.get("category", "")
    if not isinstance(category, str):
        raise PromptFileError(f"{where}: \"category\" is not a string")
    return Question(tuple(turns), category, str(obj.get("question_id", "")))


def load_questions(path: str | Path, limit: int | None = None, per_category: int | None = None,
                   subtasks: list[str] | None = None) -> list[Question]:
    """Read a JSONL prompts file: one object per line, either ``{"prompt": str}`` or the Spec-Bench /
    MT-bench form ``{"question_id", "category", "turns": [str, ...]}``. Blank lines are skipped.

    ``subtasks``: keep only the rows of these Spec-Bench subtasks (:func:`subtask`: ``mt_bench`` or a
    category); ``per_category``: then keep the first N rows of each ``category`` (file order kept: a
    deterministic stratified subset); ``limit``: then keep the first N rows. Every row is checked, so a
    bad row fails here (naming file and line) before any model is loaded.
    """
    path = Path(path)
    if not path.is_file():
        raise PromptFileError(f"prompts file not found: {path}")
    rows = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise PromptFileError(f"{path}:{n}: not valid JSON ({e.msg})") from None
        rows.append(question_row(obj, f"{path}:{n}"))
    if not rows:
        raise PromptFileError(f"prompts file has no prompts: {path}")
    if subtasks:
        have = sorted({q.subtask for q in rows})
        if unknown := [t for t in subtasks if t not in have]:
            raise PromptFileError(f"--subtasks: {path} has no rows of {', '.join(unknown)} (it has: {', '.join(have)})")
        rows = [q for q in rows if q.subtask in subtasks]
    if per_category is not None:
        if not any(q.category for q in rows):
            raise PromptFileError(f"--per-category {per_category} selects nothing: no row of {path} has a "
                                  f"\"category\"")
        seen: Counter = Counter()
        kept = []
        for q in rows:
            if q.category and seen[q.category] < per_category:
                seen[q.category] += 1
                kept.append(q)
        if not kept:
            raise PromptFileError(f"--per-category {per_category} selects nothing from {path}")
        rows = kept
    return rows[:limit] if limit is not None else rows


def load_prompts(path: str | Path, limit: int | None = None) -> list[str]:
    """The first turn of each row of a prompts file (see :func:`load_questions`)."""
    return [q.turns[0] for q in load_questions(path, limit)]


def encode_chat(tokenizer, text: str) -> torch.Tensor:
    """Token ids ``(N,)`` of ``text`` as a user message with the generation prompt appended
    (plain tokenization when the tokenizer has no chat template, e.g. a base model)."""
    return encode_conversation(tokenizer, [text])


def encode_conversation(tokenizer, turns, answers=()) -> torch.Tensor:
    """Token ids ``(N,)`` of a conversation ending with the generation prompt for the last user turn:
    ``turns[k]`` are user messages, ``answers[k]`` the assistant's answer to turn k (one fewer than
    turns). Without a chat template (a base model) the texts are joined by blank lines."""
    turns, answers = list(turns), list(answers)
    if len(answers) != len(turns) - 1:
        raise ValueError(f"a conversation of {len(turns)} user turns needs {len(turns) - 1} answers, "
                         f"got {len(answers)}")
    if getattr(tokenizer, "chat_template", None):
        messages = []
        for k, text in enumerate(turns):
            messages.append({"role": "user", "content": text})
            if k < len(answers):
                messages.append({"role": "assistant", "content": answers[k]})
        enc = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    else:
        parts = [p for k, t in enumerate(turns) for p in ([t, answers[k]] if k < len(answers) else [t])]
        enc = tokenizer("\n\n".join(parts))
    ids = enc["input_ids"] if hasattr(enc, "keys") else enc
    return torch.tensor(ids, dtype=torch.long)
