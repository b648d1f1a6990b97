"""Training prompts for the kinds of work Spec-Bench measures, written from the target's own text.

The head's first training set (experiments/promptgen.py) holds short template instructions; the
Spec-Bench subtasks where its acceptance falls most read long passages (summarization, RAG), ask
follow-ups on an answer (multi-turn) or translate German (docs/specbench.md, "Why acceptance
falls"). No corpus can be downloaded here, so the passages are the target's own answers to the
first training set (its committed token store): prose the target wrote, which its answers to the
new prompts then summarize, quote and rework. Six kinds:

- ``summarization``: one to three answers joined into an article, then an instruction to summarize it;
- ``rag``: two or three answers as retrieved passages, then the question one of them answers;
- ``follow_up``: a training prompt, the target's answer, and a second turn about that answer
  (``{"turns": [...], "answers": [...]}`` rows, which the data stage answers after the conversation);
- ``translation``: "Translate German to English" over German sentences that the target itself wrote
  by translating sentences of its answers (greedy, one batched pass at generation time);
- ``math``: grade-school word problems (names, quantities and prices drawn into templates; the
  target's answers reason them through, as on GSM8K, Spec-Bench's math_reasoning);
- ``extraction``: an answer as a document, then an instruction to pull facts out of it or rework
  it (MT-bench's extraction and writing questions).

The committed file (the shipped head's data) is the first part: ``COUNTS`` rows (seed ``s``).
``--parts 2`` appends a second, ``MORE_COUNTS`` rows (seed ``s + 1``; the word problems and
extraction are only there), so a token store that answered the first part stays valid (the data
stage resumes after the prompts it answered; eagle/train/tokens.py). What training on both parts
did: docs/acceptance.md, "Twice the data".

    python experiments/subtask_prompts.py --out experiments/data/prompts/subtasks.jsonl [--parts 2]

Deterministic for a seed (the German passes are greedy); both parts ~10 min on 2 cores of an Intel
Xeon, most of it the German passes. Nothing of Spec-Bench is read.
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

__all__ = ["answers_of_store", "make_subtask_prompts", "word_problem", "COUNTS", "MORE_COUNTS"]

COUNTS = {"summarization": 450, "rag": 350, "follow_up": 350, "translation": 300}
# the second part (--parts 2), appended: word problems and extraction, and more of the kinds Spec-Bench's
# pooled tau weighs most (MT-bench's follow-ups) or where the first part moved tau most (translation)
MORE_COUNTS = {"math": 320, "extraction": 200, "summarization": 200, "rag": 200, "follow_up": 300,
               "translation": 150}
KINDS = ("summarization", "rag", "follow_up", "translation", "math", "extraction")
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
EXTRACT = [
    "{p}\n\nList the key facts stated in the text above.",
    "Extract the main names, places and numbers mentioned in the following text.\n\n{p}",
    "Read this text and answer in JSON with the keys \"topic\" and \"key_points\".\n\n{p}",
    "{p}\n\nRewrite the text above as a short email to a colleague.",
    "Identify the three most important ideas in the passage below and explain each in one sentence.\n\n{p}",
    "{p}\n\nWrite five questions that the text above answers.",
    "Turn the following text into a bulleted list of facts.\n\n{p}",
    "{p}\n\nWhat is the tone of this text? Quote a sentence that shows it.",
]
NAMES = ["Anna", "Ben", "Carla", "David", "Emma", "Farid", "Grace", "Hiro", "Ines", "James", "Kofi", "Lena",
         "Maria", "Noah", "Olivia", "Pedro", "Quinn", "Rosa", "Sam", "Tara", "Umar", "Vera", "Will", "Yuki"]
ITEMS = ["apples", "marbles", "stickers", "pencils", "books", "cookies", "cards", "shells", "stamps", "toy cars"]
GOODS = ["notebook", "sandwich", "shirt", "ticket", "plant", "lamp", "backpack", "mug"]
# (rng, name, other name, items, good) -> a problem; each draws its numbers so the answer is whole
PROBLEMS = [
    lambda r, n, m, it, g: f"{n} has {r.randint(12, 60)} {it}. {n} buys {r.randint(5, 30)} more and gives "
                           f"{r.randint(2, 10)} to {m}. How many {it} does {n} have now?",
    lambda r, n, m, it, g: (lambda p, k: f"A store sells a {g} for ${p}. {n} buys {k} of them and pays with a "
                                         f"${50 if p * k < 50 else 100} bill. How much change does {n} get?")(
        r.randint(2, 15), r.randint(2, 6)),
    lambda r, n, m, it, g: (lambda d, b: f"{n} reads {d} pages a day. How many days will it take to finish a "
                                         f"{d * b}-page book?")(r.randint(8, 40), r.randint(5, 20)),
    lambda r, n, m, it, g: f"A train travels at {r.randint(40, 90)} miles per hour for {r.randint(2, 5)} hours, "
                           f"then at {r.randint(30, 70)} miles per hour for {r.randint(1, 4)} hours. "
                           "How far does it travel in total?",
    lambda r, n, m, it, g: f"{n} earns ${r.randint(11, 30)} an hour and works {r.randint(10, 40)} hours a week. "
                           f"How much does {n} earn in {r.randint(2, 8)} weeks?",
    lambda r, n, m, it, g: f"There are {r.choice((20, 25, 30, 40))} students in a class and "
                           f"{r.choice((20, 40, 60))}% of them are girls. How many boys are in the class?",
    lambda r, n, m, it, g: (lambda f, e, k: f"{n} baked {f * k + e} cookies, ate {e} of them and shared the rest "
                                            f"equally among {f} friends. How many cookies did each friend get?")(
        r.randint(3, 8), r.randint(1, 6), r.randint(2, 9)),
    lambda r, n, m, it, g: f"A garden is {r.randint(4, 30)} meters long and {r.randint(3, 20)} meters wide. "
                           "What are its area and its perimeter?",
    lambda r, n, m, it, g: f"{n} is {r.randint(6, 40)} years old and {m} is {r.randint(2, 15)} years older. "
                           f"How old will {m} be in {r.randint(2, 10)} years?",
    lambda r, n, m, it, g: f"A farmer has {r.randint(5, 40)} chickens and {r.randint(2, 20)} cows. "
                           "How many legs do the animals have in total?",
    lambda r, n, m, it, g: (lambda w, k: f"{n} saves ${w} every week. How many weeks does {n} need to save "
                                         f"${w * k}?")(r.randint(5, 25), r.randint(4, 20)),
    lambda r, n, m, it, g: f"A pizza is cut into {r.choice((8, 10, 12))} slices. {n} eats {r.randint(1, 3)} slices "
                           f"and {m} eats {r.randint(1, 3)}. What fraction of the pizza is left?",
    lambda r, n, m, it, g: f"A {g} costs ${r.choice((20, 40, 60, 80))}. It is on sale for "
                           f"{r.choice((10, 25, 50))}% off. What is the sale price?",
    lambda r, n, m, it, g: f"{n} runs {r.randint(2, 8)} kilometers on Monday, {r.randint(2, 8)} on Tuesday and "
                           "twice as far as on Tuesday on Wednesday. How many kilometers does "
                           f"{n} run in the three days?",
    lambda r, n, m, it, g: f"{n} had ${4 * r.randint(13, 50)}. {n} spent a quarter of it on a {g} and $"
                           f"{r.randint(3, 12)} on lunch. How much money is left?",
    lambda r, n, m, it, g: f"A bus carries {r.randint(20, 50)} people. At the first stop {r.randint(3, 12)} get off "
                           f"and {r.randint(2, 15)} get on. At the second stop half of the people get off. "
                           "How many people are left on the bus?",
]
MATH_ASK = ["{q}", "{q}", "{q}", "Solve step by step: {q}", "{q} Explain your reasoning.", "Question: {q}\nAnswer:"]


def word_problem(rng: random.Random) -> str:
    """A grade-school word problem: one of ``PROBLEMS`` with names, items and numbers drawn."""
    n, m = rng.sample(NAMES, 2)
    q = rng.choice(PROBLEMS)(rng, n, m, rng.choice(ITEMS), rng.choice(GOODS))
    return rng.choice(MATH_ASK).format(q=q)


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


def make_subtask_prompts(answers: list[dict], model, tok, counts: dict[str, int] = COUNTS, seed: int = 0,
                         start: int = 0) -> list[dict]:
    """The rows of one part of the prompt file (see the module docstring), shuffled, deterministic
    for ``seed``; ids count from ``start``."""
    unknown = sorted(set(counts) - set(KINDS))
    if unknown:
        raise ValueError(f"unknown prompt kinds {unknown}: known are {list(KINDS)}")
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
    rows += [{"category": "math", "prompt": word_problem(rng)} for _ in range(counts.get("math", 0))]
    for _ in range(counts.get("extraction", 0)):
        doc = _passages(prose, rng, 1)[0]["answer"]
        rows.append({"category": "extraction", "prompt": rng.choice(EXTRACT).format(p=doc)})
    rng.shuffle(rows)
    return [{"id": f"sub-{start + i:05d}", **r} for i, r in enumerate(rows)]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="experiments/data/prompts/subtasks.jsonl")
    ap.add_argument("--tokens", default="experiments/data/selfdistill/smollm2-135m",
                    help="the token store whose answers become passages")
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--parts", type=int, choices=(1, 2), default=1,
                    help="1: the shipped head's prompts; 2: with the second part appended (see above)")
    a = ap.parse_args(argv)
    from eagle.models import load_target

    if not (Path(a.tokens) / "manifest.json").is_file():
        raise SystemExit(f"subtask_prompts: no token store at {a.tokens}")
    model, tok = load_target(a.target)
    answers = answers_of_store(a.tokens, tok)
    rows = make_subtask_prompts(answers, model, tok, COUNTS, seed=a.seed)
    if a.parts == 2:
        rows += make_subtask_prompts(answers, model, tok, MORE_COUNTS, seed=a.seed + 1, start=len(rows))
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    cnt = {c: sum(r["category"] == c for r in rows) for c in KINDS}
    print(f"{out}: {len(rows)} prompts  " + " ".join(f"{c}={n}" for c, n in cnt.items()))


if __name__ == "__main__":
    main()
