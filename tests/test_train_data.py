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

from conftest import (BAD_PROMPTS, PROMPT_LEN, ByteTokenizer, TINY_VOCAB, exported, make_tiny_train_model, sequences, train_config,
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


def test_sample_next_greedy_and_top_p():
    """temperature 0 = argmax; top-p keeps the smallest head of the sorted distribution whose mass
    reaches p (the top token always), and draws only from it."""
    from eagle.train.data import sample_next

    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05], [0.05, 0.15, 0.3, 0.5]]))
    assert sample_next(logits, 0.0, 1.0).tolist() == [0, 3]
    torch.manual_seed(0)
    draws = torch.stack([sample_next(logits, 1.0, 0.7) for _ in range(400)])  # (400, 2)
    assert set(draws[:, 0].tolist()) == {0, 1} and set(draws[:, 1].tolist()) == {3, 2}
    assert 0.55 < (draws[:, 0] == 0).float().mean() < 0.8  # 0.5 / 0.8 = 0.625
    draws = torch.stack([sample_next(logits, 1.0, 1.0) for _ in range(2000)])
    assert set(draws[:, 0].tolist()) == {0, 1, 2, 3}


def test_generate_batch_greedy_equals_generate_and_forward():
    """The data stage's own batched loop (left padding, finished sequences leaving the batch), greedy:
    every sequence equals ``model.generate`` on that prompt alone, its stored features equal a plain
    forward over the stored tokens (final feature and the asked layers), and the token whose feature
    was never computed (EOS or the cut-off) is dropped."""
    from eagle.train.data import _generate_batch

    model = make_tiny_train_model(3)
    tok = ByteTokenizer()
    prompts = [f"q{i} " + "abc" * i for i in range(9)]
    # an end token that some greedy answers reach early and others never do
    free = [model.generate(torch.tensor(tok(p)["input_ids"])[None], max_new_tokens=12, do_sample=False,
                           pad_token_id=0)[0, len(tok(p)["input_ids"]):].tolist() for p in prompts]
    eos = next(t for t in range(V) if 0 < sum(t in f[:10] for f in free) < len(prompts))
    layers = (1, 2)
    outs = list(_generate_batch(model, tok, prompts, 12, 0.0, 1.0, eos, 0, True, layers))
    assert len(outs) == len(prompts)
    ended = 0
    for p, (ids, hid, fused, plen) in zip(prompts, outs):
        enc = torch.tensor(tok(p)["input_ids"])
        assert plen == len(enc) and torch.equal(ids[:plen], enc)
        ref = model.generate(enc[None], max_new_tokens=12, do_sample=False, eos_token_id=eos, pad_token_id=0)[0]
        assert torch.equal(ids, ref[:-1])  # the last token (EOS or the 12th) has no feature
        ended += int(ref[-1]) == eos
        with torch.no_grad():
            hs = model.model(ids[None], output_hidden_states=True).hidden_states
        torch.testing.assert_close(hid, hs[-1][0], atol=1e-4, rtol=0)
        torch.testing.assert_close(fused.float(), torch.cat([hs[i][0] for i in layers], -1), atol=2e-3, rtol=1e-3)
    assert 0 < ended < len(prompts)  # some sequences left the batch early, some ran to the budget


def test_max_tokens_reads_the_first_shards_only(tmp_path):
    """``max_tokens``: shards in order, up to the first one that reaches the budget."""
    seqs = [torch.arange(2, 12) for _ in range(4)]  # 10 tokens each
    m = load_manifest(tmp_path)
    for k in range(3):  # 3 shards of 2 sequences (20 tokens each)
        m = write_shard(tmp_path, m, seqs[:2], None, [PROMPT_LEN] * 2, prompts_done=2 * (k + 1))
    assert len(ShardDataset(tmp_path, load_hidden=False)) == 6
    assert len(ShardDataset(tmp_path, load_hidden=False, max_tokens=20)) == 2
    assert len(ShardDataset(tmp_path, load_hidden=False, max_tokens=21)) == 4


def test_a_second_writer_on_the_same_folder_is_refused(tmp_path):
    """One data stage per folder: a live lock holder stops a second one; a dead one's lock is taken over."""
    import os

    from eagle.train.data import writer_lock

    (tmp_path / ".writer.lock").write_text(str(os.getpid()))  # "another" live process: this one
    with pytest.raises(ValueError, match="being written by process"):
        with writer_lock(tmp_path):
            pass
    (tmp_path / ".writer.lock").write_text("999999999")  # no such process
    with writer_lock(tmp_path):
        assert (tmp_path / ".writer.lock").read_text() == str(os.getpid())
    assert not (tmp_path / ".writer.lock").exists()
