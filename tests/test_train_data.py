"""Training data (eagle/train/data.py): shards without features, the data stage inside `eagle train`
(prompt files checked before the target loads; the same head whether the data was generated in the
same call or before), shard_prompts, an empty data folder."""
from __future__ import annotations

import json

import pytest
import torch

from eagle.config import ConfigError
from eagle.prompts import PromptFileError
from eagle.train.data import ShardDataset, load_manifest, write_shard
from eagle.train.trainer import TrainConfig, load_train_config, train

from conftest import (BAD_PROMPTS, PROMPT_LEN, TINY_VOCAB, exported, make_tiny_train_model, sequences, train_config,
                      write_bad_prompts)

V = TINY_VOCAB


def test_shards_without_features_load(tmp_path):
    """``write_shard(hidden=None)`` on a fresh manifest gives a folder ``ShardDataset`` can read."""
    seqs = sequences(6)
    m = write_shard(tmp_path, load_manifest(tmp_path), seqs, None, [PROMPT_LEN] * 6, prompts_done=6)
    assert m["has_hidden"] is False
    ds = ShardDataset(tmp_path, load_hidden=False)
    assert len(ds) == 6 and all(s.hidden is None for s in ds)
    assert all(torch.equal(s.input_ids, x) for s, x in zip(ds, seqs))
    with pytest.raises(ValueError, match="no features"):
        ShardDataset(tmp_path, load_hidden=True)


# ------------------------------------------------------------------------------------------------
# the data stage in the same call: errors before the target loads, reproducible heads


@pytest.mark.parametrize("case", list(BAD_PROMPTS))
def test_bad_prompts_file_fails_before_the_target_loads(tmp_path, no_target_load, case):
    prompts = write_bad_prompts(tmp_path / "prompts.jsonl", case)
    cfg = train_config(tmp_path, tmp_path / "data", prompts, "bad")
    with pytest.raises(PromptFileError, match=BAD_PROMPTS[case][1]) as err:
        train(cfg, progress=False)
    assert "eagle data" not in str(err.value) and "\n" not in str(err.value)
    assert not (tmp_path / "data").exists()


def test_bad_extra_data_file_is_named(tmp_path, no_target_load):
    good = tmp_path / "prompts.jsonl"
    good.write_text('{"prompt": "a"}\n')
    extra = write_bad_prompts(tmp_path / "sharegpt.json", "bad json list")
    cfg = train_config(tmp_path, tmp_path / "data", good, "bad", extra_data=[str(extra)])
    with pytest.raises(PromptFileError, match=r"sharegpt\.json:2: not valid JSON"):
        train(cfg, progress=False)


def test_empty_data_folder_message(tmp_path):
    with pytest.raises(ValueError, match=r"no shards in \S+ \(the data stage of `eagle train` writes them") as err:
        ShardDataset(tmp_path)
    assert "eagle data" not in str(err.value)


def test_shard_prompts_is_validated(tmp_path):
    path = tmp_path / "train.yaml"
    path.write_text("shard_prompts: 0\n")
    with pytest.raises(ConfigError, match=r"train\.yaml: shard_prompts must be >= 1"):
        load_train_config(path)
    path.write_text("shard_prompts: 5\n")
    assert load_train_config(path).shard_prompts == 5 and TrainConfig().shard_prompts == 96


class ByteTokenizer:
    """Just enough of a tokenizer for the data stage (no chat template): a token per UTF-8 byte."""

    chat_template = None
    pad_token_id = 0

    def __call__(self, text: str) -> dict:
        return {"input_ids": [2 + b % (V - 2) for b in text.encode()]}


def test_same_head_whether_data_was_generated_in_the_same_call_or_before(tmp_path):
    """The data stage samples with the global RNG; the head's init must not inherit its state."""
    model = make_tiny_train_model()
    model.generation_config.eos_token_id = 1  # the data stage needs an end token
    n = 12
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"question {i} " * (1 + i % 3)}) + "\n" for i in range(n)))
    kw = dict(num_prompts=n, gen_batch_size=4, gen_max_new_tokens=10, shard_prompts=5, max_steps=2, heldout_fraction=0.1)
    first = train_config(tmp_path, tmp_path / "data", prompts, "first", **kw)
    train(first, model=model, tok=ByteTokenizer(), progress=False)  # generates the data, then trains
    manifest = load_manifest(tmp_path / "data")
    assert manifest["prompts_done"] == n and [s["sequences"] for s in manifest["shards"]] == [5, 5, 2]
    mtimes = [p.stat().st_mtime_ns for p in (tmp_path / "data").iterdir()]
    second = train_config(tmp_path, tmp_path / "data", prompts, "second", **kw)
    train(second, model=model, tok=ByteTokenizer(), progress=False)  # finds the data there
    assert [p.stat().st_mtime_ns for p in (tmp_path / "data").iterdir()] == mtimes  # not regenerated
    a, b = exported(first), exported(second)
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
