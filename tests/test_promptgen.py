"""The synthetic prompt set: deterministic, balanced, distinct, held-out split disjoint."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from collections import Counter

import pytest

_spec = importlib.util.spec_from_file_location("promptgen", Path(__file__).resolve().parents[1] / "experiments/promptgen.py")
promptgen = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(promptgen)
CATEGORIES, make_prompts, write_prompt_sets = promptgen.CATEGORIES, promptgen.make_prompts, promptgen.write_prompt_sets

N = 1500


@pytest.fixture(scope="module")
def prompts():
    return make_prompts(N, seed=0)


def test_deterministic_for_seed(prompts):
    assert make_prompts(N, seed=0) == prompts
    assert make_prompts(N, seed=1) != prompts


def test_count_and_fields(prompts):
    assert len(prompts) >= N
    for r in prompts:
        assert set(r) == {"id", "category", "prompt"}
        assert isinstance(r["id"], str) and isinstance(r["prompt"], str)
        assert r["prompt"].strip() and r["prompt"] == r["prompt"].strip()
        assert len(r["prompt"]) < 1500
    assert len({r["id"] for r in prompts}) == len(prompts)


def test_categories_balanced(prompts):
    cnt = Counter(r["category"] for r in prompts)
    assert set(cnt) == set(CATEGORIES)
    for c in CATEGORIES:
        assert cnt[c] / len(prompts) >= 0.08, (c, cnt[c])


def test_no_duplicates(prompts):
    texts = [r["prompt"] for r in prompts]
    assert len(set(texts)) == len(texts)
    assert len({" ".join(t.lower().split()) for t in texts}) == len(texts)


def test_default_size_builds():
    rows = make_prompts(5000, seed=0)
    assert len(rows) == 5000 and len({r["prompt"] for r in rows}) == 5000


def test_write_prompt_sets(tmp_path):
    tp, hp = write_prompt_sets(tmp_path / "p", n=1000, heldout=90, seed=3)
    train = [json.loads(line) for line in tp.read_text(encoding="utf-8").splitlines()]
    held = [json.loads(line) for line in hp.read_text(encoding="utf-8").splitlines()]
    assert len(train) == 910 and len(held) == 90
    assert {r["category"] for r in held} == set(CATEGORIES)
    assert not {r["prompt"] for r in train} & {r["prompt"] for r in held}
    assert not {r["id"] for r in train} & {r["id"] for r in held}
    for r in train + held:
        assert set(r) == {"id", "category", "prompt"} and r["prompt"].strip() and len(r["prompt"]) < 1500
    # same arguments, same files
    tp2, hp2 = write_prompt_sets(tmp_path / "q", n=1000, heldout=90, seed=3)
    assert tp2.read_text(encoding="utf-8") == tp.read_text(encoding="utf-8")
    assert hp2.read_text(encoding="utf-8") == hp.read_text(encoding="utf-8")


def test_small_heldout_still_stratified(tmp_path):
    _, hp = write_prompt_sets(tmp_path, n=400, heldout=len(CATEGORIES), seed=0)
    held = [json.loads(line) for line in hp.read_text(encoding="utf-8").splitlines()]
    assert sorted(r["category"] for r in held) == sorted(CATEGORIES)


def test_more_extends_without_touching_the_heldout_set(tmp_path):
    """--more: a larger set extends a smaller one; only prompts train/heldout lack are written."""
    write_prompt_sets(tmp_path, n=300, heldout=30, seed=0)
    base = {json.loads(l)["prompt"] for f in ("train.jsonl", "heldout.jsonl")
            for l in (tmp_path / f).read_text().splitlines()}
    assert {r["prompt"] for r in make_prompts(300, 0)} <= {r["prompt"] for r in make_prompts(600, 0)}
    path = promptgen.write_more(tmp_path, "more.jsonl", 600, 0)
    more = [json.loads(l)["prompt"] for l in path.read_text().splitlines()]
    assert len(more) == 300 and not set(more) & base


def test_committed_prompt_sets_are_what_the_generator_writes(tmp_path):
    """The committed training and held-out prompts are this generator's output over the word file,
    byte for byte (the commands in promptgen's docstring): an edit to the code or to the order of a
    list in experiments/data/promptgen_words.json that changes the stream shows here."""
    committed = Path(__file__).resolve().parents[1] / "experiments/data/prompts"
    write_prompt_sets(tmp_path, n=5000, heldout=200, seed=0)
    promptgen.write_more(tmp_path, "train-more.jsonl", 13500, 0)
    for name in ("train.jsonl", "heldout.jsonl", "train-more.jsonl"):
        assert (tmp_path / name).read_bytes() == (committed / name).read_bytes(), name


def test_word_file_holds_the_lists_the_generator_uses():
    words = json.loads(promptgen.WORDS.read_text(encoding="utf-8"))
    assert set(words) == {"shared", *CATEGORIES}
    # every {slot} of a template category has its vocabulary
    for cat, vocab, templates in (("writing", promptgen.W_VOCAB, promptgen.W_TEMPLATES),
                                  ("humanities", promptgen.H_VOCAB, promptgen.H_TEMPLATES),
                                  ("chat", promptgen.C_VOCAB, promptgen.C_TEMPLATES)):
        slots = {m.group(2) for t in templates for m in promptgen._SLOT.finditer(t)}
        assert slots <= set(vocab), (cat, slots - set(vocab))
