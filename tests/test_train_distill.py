"""Distilling a draft model (eagle/train/distill.py): the target's top-k cache from stored features, the
KL loss against a dense reference, training lowers held-out KL, exact resume, checkpoint round trip
with the shared embedding, config and prompt-file errors."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from eagle.config import ConfigError
from eagle.draft_model import build_draft_model, load_draft_model
from eagle.prompts import PromptFileError
from eagle.train.data import ShardDataset, load_manifest
from eagle.train.distill import (DistillConfig, cache_target_topk, distill, distill_loss, load_distill_config,
                                 load_topk)

from conftest import BAD_PROMPTS, N_SEQ, make_data, make_tiny_train_model, train_config, write_bad_prompts

K = 16


@pytest.fixture(scope="module")
def model():
    return make_tiny_train_model()


@pytest.fixture(scope="module")
def data(tmp_path_factory, model):
    root = tmp_path_factory.mktemp("distill")
    data_dir, prompts = make_data(root, model)
    head_cfg = train_config(root, data_dir, prompts, "head")
    data_yaml = root / "data.yaml"
    data_yaml.write_text(yaml.safe_dump({"target": "tiny-llama", "prompts": str(prompts), "num_prompts": N_SEQ,
                                         "data_dir": str(data_dir)}))
    assert head_cfg.data_dir == str(data_dir)
    return root, data_dir, data_yaml


def dcfg(root: Path, data_yaml: Path, name: str, **over) -> DistillConfig:
    kw = dict(target="tiny-llama", data=str(data_yaml), init_layers=[1], top_k=K, batch_size=4, max_seq_len=64,
              max_steps=12, lr=1e-3, warmup_steps=2, eval_every=1000, checkpoint_every=1000, heldout_fraction=0.2,
              out_dir=str(root / name / "run"), export=str(root / name / "draft"), export_dtype="float32")
    kw.update(over)
    cfg = DistillConfig(**kw)
    cfg.validate()
    return cfg


# ------------------------------------------------------------------------------------------------


def test_topk_cache_equals_the_target_distribution(data, model):
    _, data_dir, _ = data
    cache_target_topk(data_dir, model, K, chunk=7, progress=False)  # chunk not dividing the shard
    seqs = ShardDataset(data_dir).sequences
    topk = load_topk(data_dir, K)
    assert len(topk) == len(seqs) == N_SEQ
    for s, (ids, logp) in zip(seqs[::7], topk[::7]):
        ref = torch.log_softmax(model.lm_head(s.hidden.float()), -1).topk(K, -1)
        torch.testing.assert_close(logp, ref.values, atol=1e-5, rtol=0)
        assert torch.equal(ids, ref.indices)
    # cached shards are not recomputed (resume): the files stay untouched
    names = [data_dir / s["file"].replace(".safetensors", f".top{K}.safetensors") for s in load_manifest(data_dir)["shards"]]
    before = [p.stat().st_mtime_ns for p in names]
    cache_target_topk(data_dir, model, K, progress=False)
    assert [p.stat().st_mtime_ns for p in names] == before


def test_distill_loss_matches_a_dense_reference(model):
    g = torch.Generator().manual_seed(3)
    student = build_draft_model(model, [0])
    lengths = [9, 6]
    ids = torch.randint(0, 128, (2, 9), generator=g)
    weight = torch.zeros(2, 9)
    weight[0, 2:9] = 1
    weight[1, 0:6] = 1
    t_logp = torch.log_softmax(torch.randn(2, 9, 128, generator=g) * 3, -1).topk(K, -1)
    kl, agree = distill_loss(student, ids, lengths, weight, t_logp.indices, t_logp.values)
    ref_kl = ref_agree = 0.0
    for b, n in enumerate(lengths):
        logq = torch.log_softmax(student(ids[b:b + 1, :n]).logits[0], -1).detach()  # (n, V), unpadded forward
        for t in range(n):
            if weight[b, t]:
                p = torch.zeros(128)
                p[t_logp.indices[b, t]] = t_logp.values[b, t].exp()
                p /= p.sum()
                ref_kl += float((p[p > 0] * (p[p > 0].log() - logq[t][p > 0])).sum())
                ref_agree += float(logq[t].argmax() == t_logp.indices[b, t, 0])
    assert abs(float(kl.detach()) - ref_kl) < 1e-3 * max(1.0, ref_kl)
    assert float(agree) == ref_agree


def _eval_kl(cfg, model, split: str = "heldout") -> float:
    from eagle.train.distill import _evaluate, heldout_split  # the held-out split the trainer uses

    data_cfg = yaml.safe_load(Path(cfg.data).read_text())
    cache_target_topk(data_cfg["data_dir"], model, K, progress=False)
    pairs = list(zip(ShardDataset(data_cfg["data_dir"], load_hidden=False).sequences, load_topk(data_cfg["data_dir"], K)))
    tr, ev = heldout_split(pairs, cfg.heldout_fraction, cfg.seed)
    ev = ev if split == "heldout" else tr
    student = load_draft_model(cfg.export, model) if Path(cfg.export).exists() else build_draft_model(model, cfg.init_layers)
    return _evaluate(student, [p[0] for p in ev], [p[1] for p in ev], cfg, torch.device("cpu"))["kl"]


def test_distilling_lowers_heldout_kl_and_round_trips(data, model):
    root, _, data_yaml = data
    cfg = dcfg(root, data_yaml, "plain")
    untrained = replace(cfg, export=str(root / "nowhere"))
    before, before_train = _eval_kl(untrained, model), _eval_kl(untrained, model, "train")
    summary = distill(cfg, model, None, progress=False)
    assert summary["steps"] == 12 and summary["eval"]
    after = summary["eval"][-1]["kl"]
    assert after < 0.9 * before, (before, after)
    assert _eval_kl(cfg, model, "train") < 0.7 * before_train
    # the exported model gives the trained student's numbers, with the target's embedding re-attached
    assert abs(_eval_kl(cfg, model) - after) < 1e-4
    small = load_draft_model(cfg.export, model)
    assert small.get_input_embeddings().weight is model.get_input_embeddings().weight
    stored = load_file(str(Path(cfg.export) / "model.safetensors"))
    assert not any("embed_tokens" in k or "lm_head" in k for k in stored)
    # the target itself was not touched by training
    assert not any(p.requires_grad for p in model.parameters())


def test_resume_after_interrupt_is_exact(data, model, capsys):
    root, _, data_yaml = data
    full = dcfg(root, data_yaml, "full", checkpoint_every=4)
    distill(full, model, None, progress=False)
    part = dcfg(root, data_yaml, "resumed", checkpoint_every=4)

    class Stop(Exception):
        pass

    def interrupt(step):
        if step == 6:  # after the checkpoint at step 4: steps 5-6 are lost and redone
            raise Stop

    with pytest.raises(Stop):
        distill(part, model, None, progress=False, on_step=interrupt)
    capsys.readouterr()
    distill(part, model, None, progress=False)
    assert "resuming at step 4 from the checkpoint in" in capsys.readouterr().err
    a = load_file(str(Path(full.export) / "model.safetensors"))
    b = load_file(str(Path(part.export) / "model.safetensors"))
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=1e-6, rtol=0, msg=k)


def test_num_prompts_limits_the_data(data, model):
    root, _, data_yaml = data
    s = distill(dcfg(root, data_yaml, "few", num_prompts=20, max_steps=1, export=""), model, None, progress=False)
    assert s["train_sequences"] + s["eval_sequences"] == 20
    with pytest.raises(ValueError, match="num_prompts 41"):
        distill(dcfg(root, data_yaml, "many", num_prompts=N_SEQ + 1, max_steps=1), model, None, progress=False)


def test_config_validation(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("init_layers: []\n")
    with pytest.raises(ConfigError, match="init_layers"):
        load_distill_config(bad)
    bad.write_text("top_k: 8\nlayers: [0]\n")
    with pytest.raises(ConfigError, match="layers"):
        load_distill_config(bad)


@pytest.mark.parametrize("case", ["missing", "empty", "bad json", "no prompt"])
def test_bad_prompts_file_fails_before_the_target_loads(tmp_path, no_target_load, case):
    """The prompts of the head's training config (``data:``) are checked before the target loads."""
    prompts = write_bad_prompts(tmp_path / "prompts.jsonl", case)
    data_yaml = tmp_path / "data.yaml"
    data_yaml.write_text(yaml.safe_dump({"target": "tiny-llama", "prompts": str(prompts), "data_dir": str(tmp_path / "d")}))
    with pytest.raises(PromptFileError, match=BAD_PROMPTS[case][1]) as err:
        distill(dcfg(tmp_path, data_yaml, "bad"), progress=False)
    assert "eagle data" not in str(err.value)
    assert not (tmp_path / "d").exists()
