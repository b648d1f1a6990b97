"""Training on the Spec-Bench kinds of work: follow-up (multi-turn) prompts in the data stage, a run
that replays another config's data and starts from a shipped head, and the subtask prompt writer
(experiments/subtask_prompts.py)."""
from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest
import torch
import yaml

from eagle.config import ConfigError
from eagle.heads import HeadError
from eagle.prompts import PromptFileError, encode_conversation
from eagle.train.data import ShardDataset, encode_prompt, read_prompt_records
from eagle.train.tokens import prompts_hash
from eagle.train.trainer import make_data as run_data_stage, train

from conftest import N_SEQ, ByteTokenizer, exported, make_data, make_tiny_train_model, train_config

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))
import subtask_prompts as sp  # noqa: E402


@pytest.fixture(scope="module")
def model():
    m = make_tiny_train_model()
    m.generation_config.eos_token_id = 1
    return m


def _jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


# --- follow-up prompts -----------------------------------------------------------------------------


def test_turns_rows_are_conversations(tmp_path):
    p = _jsonl(tmp_path / "p.jsonl", [{"prompt": "one"}, {"turns": ["a", "b"], "answers": ["A"]},
                                      {"turns": ["solo"]}, {"turns": ["x", "y", "z"], "answers": ["X", "Y"]}])
    assert read_prompt_records(p) == ["one", ("a", "A", "b"), "solo", ("x", "X", "y", "Y", "z")]


@pytest.mark.parametrize("row, message", [
    ({"turns": ["a", "b"]}, "'answers' must be a list of 1 strings"),
    ({"turns": ["a", "b"], "answers": ["A", "B"]}, "'answers' must be a list of 1 strings"),
    ({"turns": ["a", ""], "answers": ["A"]}, "turn 2 is empty"),
    ({"turns": [], "answers": []}, "\"turns\" must be a non-empty list of strings"),
    ({"turns": ["a", 3], "answers": ["A"]}, r"turn 2 is not a string \(int\)"),
])
def test_bad_turns_rows_name_file_and_line(tmp_path, row, message):
    p = _jsonl(tmp_path / "p.jsonl", [{"prompt": "ok"}, row])
    with pytest.raises(PromptFileError, match=rf"p.jsonl:2: .*{message}"):
        read_prompt_records(p)


def test_prompts_hash_of_plain_prompts_is_unchanged():
    h = hashlib.sha256()
    for p in ("a", "bb"):
        h.update(len(p.encode()).to_bytes(8, "little"))
        h.update(p.encode())
    assert prompts_hash(["a", "bb"]) == h.hexdigest()  # the committed token stores keep matching
    assert prompts_hash([("a", "A", "b")]) != prompts_hash(["a\n\nA\n\nb"])


def test_the_data_stage_answers_the_last_turn_after_the_conversation(tmp_path, model):
    tok = ByteTokenizer()
    conv = ("first question", "an answer", "and a follow-up")
    p = _jsonl(tmp_path / "p.jsonl", [{"prompt": "plain question"},
                                      {"turns": [conv[0], conv[2]], "answers": [conv[1]]}])
    cfg = train_config(tmp_path, tmp_path / "data", p, "run", num_prompts=2, gen_batch_size=2, gen_max_new_tokens=6,
                       gen_temperature=0.6, shard_prompts=2)
    run_data_stage(cfg, model, tok)
    seqs = sorted(ShardDataset(cfg.data_dir).sequences, key=lambda s: s.prompt_len)
    want = encode_prompt(tok, conv)
    assert torch.equal(want, encode_conversation(tok, conv[0::2], conv[1::2]))
    assert seqs[1].prompt_len == len(want) and torch.equal(seqs[1].input_ids[: len(want)], want)
    assert seqs[0].prompt_len == len(encode_prompt(tok, "plain question"))


# --- replay and init_from ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def two_sets(tmp_path_factory, model):
    """Two data folders of N_SEQ sequences each (one the "new" data, one replayed), a replay config."""
    root = tmp_path_factory.mktemp("replay")
    new, prompts = make_data(root / "new", model)
    old, old_prompts = make_data(root / "old", model)
    replay = root / "replay.yaml"
    replay.write_text(yaml.safe_dump({"target": "tiny-llama", "prompts": str(old_prompts), "num_prompts": N_SEQ,
                                      "data_dir": str(old)}))
    return root, new, prompts, replay


def test_replay_adds_the_other_configs_data(two_sets, model):
    root, new, prompts, replay = two_sets
    alone = train(train_config(root, new, prompts, "alone", max_steps=1), model=model, tok=ByteTokenizer(), progress=False)
    both = train(train_config(root, new, prompts, "both", max_steps=1, replay_config=str(replay)), model=model,
                 tok=ByteTokenizer(), progress=False)
    n = lambda s: s["train_sequences"] + s["eval_sequences"]  # noqa: E731
    assert n(alone) == N_SEQ and n(both) == 2 * N_SEQ
    part = train(train_config(root, new, prompts, "part", max_steps=1, replay_config=str(replay), replay_tokens=1),
                 model=model, tok=ByteTokenizer(), progress=False)
    assert N_SEQ < n(part) < 2 * N_SEQ  # the first shard of the replayed data only


def test_init_from_starts_at_the_heads_weights(two_sets, model):
    root, new, prompts, _ = two_sets
    src_cfg = train_config(root, new, prompts, "src", max_steps=4)
    train(src_cfg, model=model, tok=ByteTokenizer(), progress=False)
    src = exported(src_cfg)
    # lr ~0 (Adam moves a weight by about lr): the exported head is the one training started from
    same = train_config(root, new, prompts, "same", max_steps=1, lr=1e-12, init_from=src_cfg.export)
    fresh = train_config(root, new, prompts, "fresh", max_steps=1, lr=1e-12)
    for c in (same, fresh):
        train(c, model=model, tok=ByteTokenizer(), progress=False)
    got, rnd = exported(same), exported(fresh)
    assert got.keys() == src.keys()
    for k in src:
        torch.testing.assert_close(got[k], src[k], msg=k)
    assert any(not torch.equal(rnd[k], src[k]) for k in src)


def test_init_from_a_head_of_another_shape_is_refused(two_sets, model, tmp_path):
    root, new, prompts, _ = two_sets
    bad = tmp_path / "head"
    bad.mkdir()
    with pytest.raises(HeadError):
        train(train_config(root, new, prompts, "bad", max_steps=1, init_from=str(bad)), model=model,
              tok=ByteTokenizer(), progress=False)


@pytest.mark.parametrize("over, message", [
    (dict(head="eagle3", init_from="x"), "init_from fine-tunes an EAGLE-1/2 head"),
    (dict(replay_tokens=5), "replay_tokens needs replay_config"),
    (dict(replay_tokens=-1, replay_config="x.yaml"), "replay_tokens must be >= 0"),
])
def test_bad_fine_tuning_settings(tmp_path, over, message):
    with pytest.raises(ConfigError, match=message):
        train_config(tmp_path, tmp_path / "d", tmp_path / "p.jsonl", "x", **over)


def test_replay_of_another_target_is_refused(two_sets, model, tmp_path):
    root, new, prompts, replay = two_sets
    other = tmp_path / "other.yaml"
    other.write_text(replay.read_text().replace("tiny-llama", "smollm2-135m"))
    with pytest.raises(ConfigError, match="trains for target smollm2-135m"):
        train(train_config(root, new, prompts, "other", max_steps=1, replay_config=str(other)), model=model,
              tok=ByteTokenizer(), progress=False)


# --- the subtask prompt writer -------------------------------------------------------------------------


def test_text_filters():
    assert sp._whole_sentences("A first complete sentence stands here. Cut mid") == "A first complete sentence stands here."
    assert sp._whole_sentences("Short. Then a long sentence that was cut") == "Short. Then a long sentence that was cut"
    assert sp._whole_sentences("Complete. Also complete!") == "Complete. Also complete!"
    assert sp._repetitive("I am a travel agent. " * 6) and not sp._repetitive("a b c d e f g h i j")
    assert sp._germanish("Das ist ein Haus und es ist nicht groß.")
    assert not sp._germanish("This is the house and it is not big.")
    assert sp._user_text("<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nQ?<|im_end|>\n") == "Q?"


def _answers(n=80):
    import random

    rng = random.Random(0)
    words = [f"w{i}" for i in range(500)]
    out = []
    for i in range(n):
        text = " ".join(" ".join(rng.choice(words) for _ in range(12)).capitalize() + "." for _ in range(6))
        out.append({"prompt": f"Tell me about topic {i} please", "answer": text, "tokens": 100})
    return out


def test_subtask_rows_read_back_and_are_deterministic(tmp_path):
    counts = {"summarization": 5, "rag": 4, "follow_up": 3, "translation": 0}
    rows = sp.make_subtask_prompts(_answers(), None, None, counts, seed=1)
    assert rows == sp.make_subtask_prompts(_answers(), None, None, counts, seed=1)
    assert {c: sum(r["category"] == c for r in rows) for c in counts} == counts
    prompts = read_prompt_records(_jsonl(tmp_path / "s.jsonl", rows))
    assert sum(isinstance(p, tuple) for p in prompts) == 3
    rag = [r["prompt"] for r in rows if r["category"] == "rag"]
    assert all(r.rstrip().endswith("please") for r in rag)  # the question comes after the passages


def test_word_problems_and_extraction_and_the_appended_part():
    """The second part's kinds: word problems with whole answers, documents to extract from; a
    part with other counts and seed leaves the first part's rows (and ids) as they were."""
    import random
    import re

    first = sp.make_subtask_prompts(_answers(), None, None, {"summarization": 4, "rag": 3}, seed=0)
    more = sp.make_subtask_prompts(_answers(), None, None, {"math": 40, "extraction": 5, "rag": 2}, seed=1,
                                   start=len(first))
    assert first == sp.make_subtask_prompts(_answers(), None, None, {"summarization": 4, "rag": 3}, seed=0)
    assert [r["id"] for r in first + more] == [f"sub-{i:05d}" for i in range(len(first) + len(more))]
    assert {c: sum(r["category"] == c for r in more) for c in ("math", "extraction", "rag")} == \
        {"math": 40, "extraction": 5, "rag": 2}
    math = [r["prompt"] for r in more if r["category"] == "math"]
    assert len(set(math)) > 30 and all("?" in q and re.search(r"\d", q) for q in math)
    docs = {a["answer"] for a in _answers()}
    assert all(any(d in r["prompt"] for d in docs) for r in more if r["category"] == "extraction")
    rng = random.Random(5)
    for _ in range(300):  # change is never negative, a quarter of the money is whole
        q = sp.word_problem(rng)
        m = re.search(r"for \$(\d+)\. \w+ buys (\d+) of them and pays with a \$(\d+) bill", q)
        if m:
            assert int(m[1]) * int(m[2]) <= int(m[3])
        m = re.search(r"had \$(\d+)\. \w+ spent a quarter", q)
        if m:
            assert int(m[1]) % 4 == 0
    with pytest.raises(ValueError, match="unknown prompt kinds \\['poetry'\\]"):
        sp.make_subtask_prompts(_answers(), None, None, {"poetry": 1})


def test_data_only_also_builds_the_replayed_data(tmp_path, model):
    """`eagle train --data-only` runs the replayed config's data stage too, not only the run's."""
    own = _jsonl(tmp_path / "own.jsonl", [{"prompt": "own question"}])
    old = _jsonl(tmp_path / "old.jsonl", [{"prompt": "old one"}, {"prompt": "old two"}])
    replay = tmp_path / "replay.yaml"
    replay.write_text(yaml.safe_dump({"target": "tiny-llama", "prompts": str(old), "num_prompts": 2,
                                      "data_dir": str(tmp_path / "old-data"), "gen_batch_size": 2,
                                      "gen_max_new_tokens": 4, "shard_prompts": 2}))
    cfg = train_config(tmp_path, tmp_path / "own-data", own, "run", num_prompts=1, gen_batch_size=1,
                       gen_max_new_tokens=4, shard_prompts=1, replay_config=str(replay))
    run_data_stage(cfg, model, ByteTokenizer())
    assert len(ShardDataset(tmp_path / "own-data")) == 1 and len(ShardDataset(tmp_path / "old-data")) == 2
