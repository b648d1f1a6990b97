"""Spec-Bench / MT-bench question files in `eagle bench`: multi-turn conversations, the stratified
subset, per-subtask results, the plot, bad rows, and resuming an interrupted bench."""
import json
from pathlib import Path

import pytest

from conftest import run_cli, write_prompt_lines

ROOT = Path(__file__).resolve().parents[1]
SPEC_BENCH = ROOT.parent / "shared" / "data" / "spec-bench" / "question.jsonl"
MT_BENCH = SPEC_BENCH.with_name("mt_bench.jsonl")
NGRAM = str(ROOT / "experiments/configs/ngram.yaml")

ROWS = [{"question_id": 1, "category": "writing", "turns": ["Write a haiku.", "Now make it rhyme."]},
        {"question_id": 2, "category": "coding", "turns": ["Print hello in Python.", "And in C?"]},
        {"question_id": 3, "category": "summarization", "turns": ["Summarize: the cat sat on the mat."]},
        {"question_id": 4, "category": "summarization", "turns": ["Summarize: it rained all day."]},
        {"question_id": 5, "category": "rag", "turns": ["Context: water boils at 100 C. When does water boil?"]}]


def _write(path, rows):
    return write_prompt_lines(path, [json.dumps(r) for r in rows])


def test_questions_turns_categories_and_subtasks(tmp_path):
    from eagle.prompts import load_questions

    qs = load_questions(_write(tmp_path / "q.jsonl", ROWS + [{"prompt": "Plain prompt."}]))
    assert [len(q.turns) for q in qs] == [2, 2, 1, 1, 1, 1]
    assert [q.subtask for q in qs] == ["mt_bench", "mt_bench", "summarization", "summarization", "rag", "uncategorized"]
    assert qs[0].question_id == "1" and qs[0].turns[1] == "Now make it rhyme."
    # the first N rows of each category, file order kept; then --limit
    sub = load_questions(tmp_path / "q.jsonl", per_category=1)
    assert [q.question_id for q in sub] == ["1", "2", "3", "5"]  # the uncategorized row is not in any category
    assert [q.question_id for q in load_questions(tmp_path / "q.jsonl", limit=3, per_category=1)] == ["1", "2", "3"]


@pytest.mark.parametrize("row, message", [
    ({"category": "qa"}, r':2: needs a "prompt" string or a non-empty "turns" list'),
    ({"turns": []}, r':2: "turns" must be a non-empty list of strings'),
    ({"turns": "just one"}, r':2: "turns" must be a non-empty list of strings'),
    ({"turns": ["ok", "  "]}, r":2: turn 2 is empty"),
    ({"turns": ["ok", 3]}, r":2: turn 2 is not a string \(int\)"),
    ({"prompt": 7}, r':2: "prompt" is not a string'),
    ({"turns": ["ok"], "category": 5}, r':2: "category" is not a string'),
])
def test_bad_rows_name_file_and_line(tmp_path, row, message):
    from eagle.prompts import PromptFileError, load_questions

    path = _write(tmp_path / "q.jsonl", [ROWS[0], row])
    with pytest.raises(PromptFileError, match=r"q\.jsonl" + message):
        load_questions(path)


def test_subtasks_select_rows_before_per_category(tmp_path):
    from eagle.prompts import PromptFileError, load_questions

    path = _write(tmp_path / "q.jsonl", ROWS)
    assert [q.question_id for q in load_questions(path, subtasks=["summarization", "rag"])] == ["3", "4", "5"]
    assert [q.question_id for q in load_questions(path, per_category=1, subtasks=["summarization", "rag"])] == ["3", "5"]
    assert [q.question_id for q in load_questions(path, subtasks=["mt_bench"])] == ["1", "2"]  # the pooled name
    with pytest.raises(PromptFileError, match=r"--subtasks: .*q\.jsonl has no rows of qa \(it has: mt_bench, rag, "
                                              r"summarization\)"):
        load_questions(path, subtasks=["rag", "qa"])


def test_per_category_that_selects_nothing(tmp_path):
    from eagle.prompts import PromptFileError, load_questions

    path = _write(tmp_path / "q.jsonl", [{"prompt": "a"}, {"prompt": "b"}])
    with pytest.raises(PromptFileError, match="--per-category 2 selects nothing: no row of .* has a \"category\""):
        load_questions(path, per_category=2)


def test_bad_row_fails_before_any_model_loads(tmp_path, capsys):
    path = _write(tmp_path / "q.jsonl", [ROWS[0], {"turns": ["fine", ["nested"]]}])
    code, out, err = run_cli(["bench", "--prompts", path, "--config", NGRAM, "--target", str(tmp_path / "no-such-model"),
                              "--json", str(tmp_path / "o.json")], capsys)
    assert code == 2 and err.count("\n") == 1
    assert err.startswith(f"eagle: error: {path}:2: turn 2 is not a string (list)")
    code, out, err = run_cli(["bench", "--prompts", _write(tmp_path / "p.jsonl", [{"prompt": "a"}]), "--per-category", "1",
                              "--config", NGRAM, "--target", str(tmp_path / "no-such-model"),
                              "--json", str(tmp_path / "o.json")], capsys)
    assert code == 2 and "selects nothing" in err


def test_conversation_encoding_holds_earlier_turns_and_answers():
    import transformers as tf

    from eagle.models import resolve_target
    from eagle.prompts import encode_chat, encode_conversation

    tok = tf.AutoTokenizer.from_pretrained(resolve_target("smollm2-135m"))
    one = encode_conversation(tok, ["Hi there."])
    assert one.tolist() == encode_chat(tok, "Hi there.").tolist()
    two = tok.decode(encode_conversation(tok, ["Hi there.", "Say more."], ["Hello! How can I help?"]))
    assert two.index("Hi there.") < two.index("Hello! How can I help?") < two.index("Say more.")
    assert two.rstrip().endswith("assistant")  # ends with the generation prompt
    with pytest.raises(ValueError, match="needs 1 answers"):
        encode_conversation(tok, ["a", "b"])


def test_bench_multi_turn_categories_step_cost_plot_and_resume(tiny_target, tmp_path, capsys, monkeypatch):
    import eagle.bench as bench
    from eagle.prompts import encode_conversation

    prompts = _write(tmp_path / "q.jsonl", ROWS)
    (tmp_path / "plain-twin.yaml").write_text("runtime: {cache: static}\n")
    out_json = tmp_path / "out.json"
    args = ["bench", "--prompts", prompts, "--config", str(tmp_path / "plain-twin.yaml"), "--config", NGRAM,
            "--per-category", "1", "--max-new-tokens", "10", "--target", tiny_target, "--json", str(out_json)]
    seen, budgets = [], []  # every prompt a generation was asked to continue, and its token budget
    real_generate = bench.TreeDecoder.generate

    def generate(self, ids, max_new_tokens, *a, **k):
        seen.append(ids.tolist())
        budgets.append(max_new_tokens)
        return real_generate(self, ids, max_new_tokens, *a, **k)

    monkeypatch.setattr(bench.TreeDecoder, "generate", generate)
    code, out, err = run_cli(args, capsys)
    assert code == 0, err
    r = json.loads(out_json.read_text())
    # per-category 1: questions 1 (2 turns), 2 (2 turns), 3 and 5
    assert r["plain"]["prompts"] == 4 and r["plain"]["turns"] == 6
    cats = r["plain"]["categories"]
    assert list(cats) == ["mt_bench", "summarization", "rag"]
    assert (cats["mt_bench"]["prompts"], cats["mt_bench"]["turns"]) == (2, 4)
    assert (cats["rag"]["prompts"], cats["rag"]["turns"]) == (1, 1)
    fields = {"prompts", "turns", "new_tokens", "tau", "tokens_per_s", "speedup", "speedup_vs_hf", "identical"}
    for entry in [r["plain"], r["generate"]] + r["runs"]:
        assert list(entry["categories"]) == list(cats)
        for c in entry["categories"].values():
            assert set(c) >= fields and c["tokens_per_s"] > 0
    assert sum(c["new_tokens"] for c in r["runs"][1]["categories"].values()) == sum(
        c["new_tokens"] for c in cats.values())  # greedy ngram: the same tokens as plain
    for run in r["runs"]:
        assert run["identical_to_plain"] == 6 and all(c["identical"] == c["turns"] for c in run["categories"].values())
        # a step's time over plain-twin's (plain decoding in the same precision, from the configs)
        assert run["step_cost_vs"] == "plain-twin" and run["step_cost"] > 0
        assert run["tree_sizes"]["depth"] and sum(run["tree_sizes"]["nodes"]) == sum(run["tree_sizes"]["depth"])
    assert r["runs"][0]["step_cost"] == 1.0
    # turn 2 of question 1 was asked after turn 1 and plain decoding's answer to it
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_target)
    state = json.loads((tmp_path / "out.records.json").read_text())
    answer = tok.decode(state["records"]["plain"]["0"]["tokens"], skip_special_tokens=True)
    turn2 = encode_conversation(tok, ROWS[0]["turns"], [answer]).tolist()
    assert sum(ids == turn2 for ids in seen) >= 3  # plain, ngram and plain-twin answered it (generate: HF's own)
    # one block per subtask and a pooled row; the PNG beside the JSON
    assert "mt_bench (2 questions, 4 turns" in out and "rag (1 questions, 1 turns" in out and "pooled (4 questions, 6 turns)" in out
    png = out_json.with_suffix(".png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # a rerun resumes from the records: nothing runs again, the same tokens come out
    budgets.clear()
    code, out, err2 = run_cli(args, capsys)
    assert code == 0 and "resuming" in err2
    assert budgets and 10 not in budgets  # only plain decoding's short warm-ups: no timed run again
    r2 = json.loads(out_json.read_text())
    assert r2["resumed_runs"] == 24 and r2["runs"][1]["categories"] == r["runs"][1]["categories"]


@pytest.mark.skipif(not SPEC_BENCH.is_file(), reason="the Spec-Bench copy of the development machines is absent")
def test_spec_bench_file_loads_with_its_six_subtasks():
    from eagle.prompts import load_questions

    qs = load_questions(SPEC_BENCH)
    assert len(qs) == 480
    subtasks = [q.subtask for q in qs]
    assert {s: subtasks.count(s) for s in set(subtasks)} == {"mt_bench": 80, "translation": 80, "summarization": 80,
                                                             "qa": 80, "math_reasoning": 80, "rag": 80}
    assert all(len(q.turns) == 2 for q in qs if q.subtask == "mt_bench")
    sub = load_questions(SPEC_BENCH, per_category=2)
    assert len(sub) == 8 * 2 + 5 * 2 and sub[0].question_id == "81"
    mt = load_questions(MT_BENCH)
    assert [q.turns for q in mt] == [q.turns for q in qs[:80]]  # MT-bench: Spec-Bench's first 80 rows


def test_sweep_reads_question_files_per_category(tiny_target, tmp_path, capsys):
    from eagle.cli import main

    prompts = _write(tmp_path / "q.jsonl", ROWS)
    out = tmp_path / "sw"
    args = ["sweep", "--base", NGRAM, "--grid", "tree.depth=1,2", "--prompts", prompts, "--per-category", "1",
            "--max-new-tokens", "6", "--target", tiny_target, "--out", str(out)]
    assert main(args) == 0, capsys.readouterr().err
    r = json.loads((out / "results.json").read_text())
    assert r["settings"]["per_category"] == 1
    for c in r["cells"]:
        assert c["prompts"] == 4 and c["turns"] == 6 and c["identical_to_plain"] == 6
        assert list(c["categories"]) == ["mt_bench", "summarization", "rag"]
    table = (out / "table.md").read_text()
    assert "(first 1 rows per category, all prompts)" in table and "| 6/6 |" in table  # identical turns of all turns
    # --subtasks: only those rows (the settings record it, so the folder does not resume another subset)
    out2 = tmp_path / "sw2"
    assert main(args[:-1] + [str(out2), "--subtasks", "rag,summarization"]) == 0, capsys.readouterr().err
    r = json.loads((out2 / "results.json").read_text())
    assert r["settings"]["subtasks"] == ["rag", "summarization"]
    assert [list(c["categories"]) for c in r["cells"]] == [["summarization", "rag"]] * 2
    assert "(subtasks rag, summarization, first 1 rows per category, all prompts)" in (out2 / "table.md").read_text()
