"""Training prompts for the kinds of work Spec-Bench measures, written from the target's own text.

The head's first training set (experiments/promptgen.py) holds short template instructions; the
Spec-Bench subtasks where its acceptance falls most read long passages (summarization, RAG), ask
follow-ups on an answer (multi-turn) or translate German (docs/specbench.md, "Why acceptance
falls"). No corpus can be downloaded here, so the passages are the target's own answers to the
first training set (its committed token store): prose the target wrote, which its answers to the
new prompts then summarize, quote and rework. Four kinds:

- ``summarization``: one to three answers joined into an article, then an instruction to summarize it;
- ``rag``: two or three answers as retrieved passages, then the question one of them answers;
- ``follow_up``: a training prompt, the target's answer, and a second turn about that answer
  (``{"turns": [...], "answers": [...]}`` rows, which the data stage answers after the conversation);
- ``translation``: "Translate German to English" over German sentences that the target itself wrote
  by translating sentences of its answers (greedy, one batched pass at generation time).

    python experiments/subtask_prompts.py --out experiments/data/prompts/subtasks.jsonl

Deterministic for a seed (the German pass is greedy); about a minute on 2 cores. Nothing of
Spec-Bench is read.
"""
from __future__ import annotations

import argparse
import json
import random
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

__all__ = ["answers_of_store", "make_subtask_prompts", "COUNTS"]

COUNTS = {"summarization": 450, "rag": 350, "follow_up": 350, "translation": 300}
PASSAGE_TOKENS = 450  # an article or a set of passages stays below this many tokens (whole answers)

SUMMARIZE = [
    "Summarize: {p}",
    "Summarize the following article in a few sentences.\n\n{p}",
    "{p}\n\nSummarize the text above.",
    "Write a short summary of this text:\n\n{p}",
    "Give me the main points of the following passage.\n\n{p}",
    "Read the article below and summarize it in one paragraph.\n\n{p}",
    "TL;DR: {p}",
    "Summarize this for a busy reader:\n{p}",
]
RAG = [
    "{p}\n\n{q}",
    "Answer the question using the passages below.\n\n{p}\n\nQuestion: {q}",
    "Context:\n{p}\n\nBased on the context, {q}",
    "{p}\n\nUsing the information above, answer: {q}",
    "Here are some documents.\n\n{p}\n\n{q}",
]
FOLLOW_UPS = [
    "Rewrite your previous response in a more formal tone.",
    "Summarize your answer in two sentences.",
    "Can you give a concrete example?",
    "Now explain it like I'm five.",
    "Turn your answer into a bulleted list.",
    "What assumptions have you made in your response?",
    "Make it shorter.",
    "Can you expand on the second point?",
    "Rewrite your previous response. Start every sentence with the letter A.",
    "What is the most important part of your answer, and why?",
    "Write a title for your answer.",
    "Are there any counterarguments to what you said?",
    "Now rewrite it as a short poem.",
    "Explain that again in simpler words.",
    "Can you add a conclusion to your answer?",
    "Rewrite it for a professional audience.",
    "Which of these points would you prioritize?",
    "Give three follow-up questions a reader might ask.",
    "Can you make it more persuasive?",
    "Put your answer into a table.",
]
TO_GERMAN = "Translate English to German: {s}"
FROM_GERMAN = "Translate German to English: {s}"


def _user_text(prompt: str) -> str:
    """The user message of a chat-templated prompt (SmolLM2's ChatML), else the text itself."""
    m = re.search(r"<\|im_start\|>user\n(.*?)<\|im_end\|>", prompt, flags=re.S)
    return m.group(1).strip() if m else prompt.strip()


def _whole_sentences(text: str) -> str:
    """``text`` up to its last sentence end (answers cut at the token limit end mid-sentence)."""
    text = text.strip()
    cut = max(text.rfind(". "), text.rfind(".\n"), text.rfind("!"), text.rfind("?"))
    if text.endswith((".", "!", "?")):
        return text
    return text[: cut + 1].strip() if cut > len(text) // 2 else text


def answers_of_store(tokens_dir: str | Path, tok) -> list[dict]:
    """``{"prompt", "answer", "tokens"}`` for every sequence of a self-distillation token store
    (eagle/train/tokens.py), in store order."""
    from eagle.train.data import read_tensors
    from eagle.train.tokens import load_token_manifest

    tokens_dir = Path(tokens_dir)
    out = []
    for s in load_token_manifest(tokens_dir)["shards"]:
        t = read_tensors(tokens_dir / s["file"], ("input_ids", "offsets", "prompt_lens"))
        off = t["offsets"].tolist()
        for i in range(len(off) - 1):
            ids = t["input_ids"][off[i]: off[i + 1]].tolist()
            pl = int(t["prompt_lens"][i])
            answer = _whole_sentences(tok.decode(ids[pl:], skip_special_tokens=True))
            out.append({"prompt": _user_text(tok.decode(ids[:pl])), "answer": answer,
                        "tokens": len(tok(answer)["input_ids"]) if answer else 0})
    return out


def _repetitive(text: str, n: int = 3, min_share: float = 0.8) -> bool:
    """True when under ``min_share`` of the word ``n``-grams are distinct (a looping answer)."""
    w = text.split()
    grams = [tuple(w[i: i + n]) for i in range(len(w) - n + 1)]
    return bool(grams) and len(set(grams)) < min_share * len(grams)


def _prose(a: dict) -> bool:
    """An answer that reads as an article: no code, few list lines, long enough, not looping."""
    lines = [x for x in a["answer"].splitlines() if x.strip()]
    listy = sum(bool(re.match(r"\s*(\d+\.|[-*#])", x)) for x in lines)
    return (60 <= a["tokens"] <= 260 and "```" not in a["answer"] and listy <= len(lines) // 3
            and not _repetitive(a["answer"]))


def _sentences(text: str) -> list[str]:
    return [s.strip() for s in re.split(r"(?<=[.!?])\s+", text)
            if 8 <= len(s.split()) <= 28 and not re.search(r"[*#`|:\d]", s) and s.strip()[:1].isupper()]


def _passages(pool: list[dict], rng: random.Random, k: int) -> list[dict]:
    """Up to ``k`` distinct answers whose tokens stay below PASSAGE_TOKENS together (at least one)."""
    picked, total = [], 0
    for a in rng.sample(pool, min(len(pool), 4 * k)):
        if len(picked) == k:
            break
        if total + a["tokens"] <= PASSAGE_TOKENS or not picked:
            picked.append(a)
            total += a["tokens"]
    return picked


GERMAN = {"der", "die", "das", "und", "ist", "ein", "eine", "nicht", "mit", "für", "ich", "wir", "sie", "es", "zu",
          "den", "von", "im", "auf", "dem", "sich", "auch", "wie", "werden", "sind", "wird", "einer", "zur"}
ENGLISH = {"the", "and", "of", "is", "to", "that", "with", "for", "are", "this", "was", "which"}


def _germanish(text: str) -> bool:
    """German words outnumber English ones (the target sometimes repeats the English)."""
    w = [x.strip(".,;:!?\"'").lower() for x in text.split()]
    return sum(x in GERMAN for x in w) >= 2 and sum(x in ENGLISH for x in w) <= 1


def _german(model, tok, sentences: list[str], batch: int = 48) -> list[str]:
    """The target's greedy German for each English sentence (its first line, whole sentences)."""
    import torch

    from eagle.train.data import _generate_batch, eos_and_pad

    eos, pad = eos_and_pad(model, tok)
    out = []
    with torch.no_grad():
        for b in range(0, len(sentences), batch):
            chunk = [TO_GERMAN.format(s=s) for s in sentences[b: b + batch]]
            for ids, _, _, pl in _generate_batch(model, tok, chunk, 64, 0.0, 1.0, eos, pad, store_hidden=False):
                text = tok.decode(ids[pl:].tolist(), skip_special_tokens=True).strip()
                out.append(text.splitlines()[0].strip() if text else "")
    return out


def make_subtask_prompts(answers: list[dict], model, tok, counts: dict[str, int] = COUNTS, seed: int = 0) -> list[dict]:
    """The rows of the prompt file (see the module docstring), shuffled, deterministic for ``seed``."""
    rng = random.Random(seed)
    prose = [a for a in answers if _prose(a)]
    with_q = [a for a in prose if 3 <= len(a["prompt"].split()) <= 60 and "\n" not in a["prompt"]]
    rows = []
    for i in range(counts.get("summarization", 0)):
        p = "\n\n".join(a["answer"] for a in _passages(prose, rng, rng.choice((1, 2, 2, 3))))
        rows.append({"category": "summarization", "prompt": rng.choice(SUMMARIZE).format(p=p)})
    for i in range(counts.get("rag", 0)):
        docs = _passages(with_q, rng, rng.choice((2, 3)))
        q = rng.choice(docs)["prompt"]
        rows.append({"category": "rag", "prompt": rng.choice(RAG).format(p="\n\n".join(d["answer"] for d in docs), q=q)})
    for i in range(counts.get("follow_up", 0)):
        a = rng.choice([x for x in answers if x["answer"] and x["tokens"] <= 260 and not _repetitive(x["answer"])])
        rows.append({"category": "follow_up", "turns": [a["prompt"], rng.choice(FOLLOW_UPS)], "answers": [a["answer"]]})
    n_tr = counts.get("translation", 0)
    if n_tr:
        pool = sorted({s for a in prose for s in _sentences(a["answer"])})
        english = rng.sample(pool, min(len(pool), 3 * n_tr))
        german = _german(model, tok, english)
        # a usable German line: about as long as the English, not the English itself, not looping
        kept = [g for e, g in zip(english, german) if 0.6 <= len(g.split()) / len(e.split()) <= 1.6
                and _germanish(g) and not _repetitive(g, 2, 0.9)][:n_tr]
        rows += [{"category": "translation", "prompt": FROM_GERMAN.format(s=g)} for g in kept]
    rng.shuffle(rows)
    return [{"id": f"sub-{i:05d}", **r} for i, r in enumerate(rows)]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="experiments/data/prompts/subtasks.jsonl")
    ap.add_argument("--tokens", default="experiments/data/selfdistill/smollm2-135m",
                    help="the token store whose answers become passages")
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    from eagle.models import load_target

    if not (Path(a.tokens) / "manifest.json").is_file():
        raise SystemExit(f"subtask_prompts: no token store at {a.tokens}")
    model, tok = load_target(a.target)
    rows = make_subtask_prompts(answers_of_store(a.tokens, tok), model, tok, seed=a.seed)
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    cnt = {c: sum(r["category"] == c for r in rows) for c in COUNTS}
    print(f"{out}: {len(rows)} prompts  " + " ".join(f"{c}={n}" for c, n in cnt.items()))


if __name__ == "__main__":
    main()
