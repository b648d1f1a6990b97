"""Training the EAGLE head on tiny self-made shards: the loss goes down, unrolled training,
bit-exact resume after an interruption, DDP (2 gloo processes) == 1 process, atomic checkpoints,
online feature extraction == offline.

The data is written with ``write_shard`` from a tiny random model's own features over random token
sequences, and a prompts file whose length equals the manifest's ``prompts_done`` makes the trainer
skip self-distillation.
"""
from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from eagle.config import ConfigError
from eagle.head import DraftHead, load_head
from eagle.prompts import PromptFileError
from eagle.train.data import ShardDataset, load_manifest, write_shard
from eagle.train.trainer import TrainConfig, head_loss, load_train_config, train

from conftest import make_tiny_train_model

V, H = 128, 64
N_SEQ = 40
PROMPT_LEN = 5


def sequences(n: int = N_SEQ, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, V, (int(torch.randint(20, 61, (), generator=g)),), generator=g) for _ in range(n)]


@torch.no_grad()
def features(model, ids: torch.Tensor) -> torch.Tensor:
    return model.get_decoder()(input_ids=ids[None]).last_hidden_state[0]  # (n, H) after the final norm


def make_data(root: Path, model, with_hidden: bool = True, manifest: dict | None = None) -> tuple[Path, Path]:
    """Shards (two of them) + a prompts file of N_SEQ prompts; returns ``(data_dir, prompts)``."""
    data = root / ("data" if with_hidden else "data-online")
    seqs = sequences()
    m = load_manifest(data) if manifest is None else manifest
    half = N_SEQ // 2
    for lo, hi in ((0, half), (half, N_SEQ)):
        hid = [features(model, x) for x in seqs[lo:hi]] if with_hidden else None
        m = write_shard(data, m, seqs[lo:hi], hid, [PROMPT_LEN] * (hi - lo), prompts_done=hi)
    prompts = root / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"prompt {i}"}) + "\n" for i in range(N_SEQ)))
    return data, prompts


def config(root: Path, data: Path, prompts: Path, name: str, **over) -> TrainConfig:
    kw = dict(target="tiny-llama", prompts=str(prompts), num_prompts=N_SEQ, data_dir=str(data),
              draft_vocab_size=64, batch_size=4, max_seq_len=64, max_steps=8, lr=3e-3, warmup_steps=2,
              eval_every=1000, checkpoint_every=1000, heldout_fraction=0.1, seed=0,
              out_dir=str(root / name / "run"), export=str(root / name / "head"))
    kw.update(over)
    cfg = TrainConfig(**kw)
    cfg.validate()
    return cfg


def exported(cfg: TrainConfig) -> dict[str, torch.Tensor]:
    return load_file(str(Path(cfg.export) / "model.safetensors"))


def assert_same_weights(a: dict, b: dict, atol: float) -> None:
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=atol, rtol=0, msg=k)


@pytest.fixture(scope="module")
def model():
    return make_tiny_train_model()


@pytest.fixture(scope="module")
def offline(tmp_path_factory, model):
    root = tmp_path_factory.mktemp("train")
    data, prompts = make_data(root, model)
    return root, data, prompts


# ------------------------------------------------------------------------------------------------


def _fixed_batch(model, n: int = 8):
    """The first ``n`` sequences as a padded batch, with the trainer's loss weights (answer only)."""
    seqs = sequences()[:n]
    lengths = [len(s) for s in seqs]
    T = max(lengths)
    ids = torch.zeros(n, T, dtype=torch.long)
    feats = torch.zeros(n, T, H)
    weight = torch.zeros(n, T - 1)
    for b, s in enumerate(seqs):
        ids[b, : len(s)] = s
        feats[b, : len(s)] = features(model, s)
        weight[b, PROMPT_LEN - 1: len(s) - 1] = 1.0
    return feats, ids, weight, lengths


def batch_loss(head, model, batch) -> float:
    feats, ids, weight, lengths = batch
    lm_w = head.lm_weight(model.get_output_embeddings()).float()
    with torch.no_grad():
        loss, _ = head_loss(head.eval(), model.get_input_embeddings(), lm_w, feats, ids, weight,
                            torch.zeros_like(feats[:, :-1]), lengths, 0.1, 1)
    return float(loss / weight.sum())


def test_training_lowers_the_loss(offline, model):
    root, data, prompts = offline
    cfg = config(root, data, prompts, "loss", max_steps=30, eval_every=10)
    summary = train(cfg, model=model, progress=False)
    assert summary["steps"] == 30
    assert summary["train_sequences"] + summary["eval_sequences"] == N_SEQ
    losses = [e["loss"] for e in summary["eval"]]
    assert [e["step"] for e in summary["eval"]] == [10, 20, 30]
    assert losses[-1] < losses[0] * 0.95, losses

    head = load_head(cfg.export, model)
    assert head.draft_vocab.numel() == 64
    fresh = DraftHead.for_target(model, head.draft_vocab)  # the trainer's starting point
    batch = _fixed_batch(model)
    before, after = batch_loss(fresh, model, batch), batch_loss(head, model, batch)
    assert after < 0.9 * before, (before, after)


def test_unroll_two(offline, model):
    root, data, prompts = offline
    cfg = config(root, data, prompts, "unroll", max_steps=3, unroll=2)
    summary = train(cfg, model=model, progress=False)
    assert len(summary["eval"]) == 1
    ev = summary["eval"][0]
    assert len(ev["acc"]) == 2 and all(0.0 <= a <= 1.0 for a in ev["acc"])
    assert torch.isfinite(torch.tensor(ev["loss"]))
    # the second pass sees the head's own predictions: a different loss from unroll=1
    cfg1 = config(root, data, prompts, "unroll1", max_steps=3, unroll=1)
    ev1 = train(cfg1, model=model, progress=False)["eval"][0]
    assert len(ev1["acc"]) == 1 and ev1["loss"] != pytest.approx(ev["loss"], rel=1e-4)


@torch.no_grad()
def reference_loss(head, model, lm_w, seqs, unroll: int, cls_weight: float = 0.1):
    """EAGLE loss written out per sequence (no padding): pass k feeds the head its pass k-1
    predictions as input features (the first feature stays the true f_0)."""
    embed = model.get_input_embeddings()
    total, accs = 0.0, [0.0] * unroll
    for s in seqs:
        n = len(s)
        F = features(model, s)  # (n, H)
        tok = embed(s[1:])[None]
        mask = torch.ones(n - 1, n - 1, dtype=torch.bool).tril()[None, None]
        sel = torch.arange(PROMPT_LEN - 1, n - 1)  # pairs j predicting f_{j+1} in the answer
        tgt = F[1:][sel]
        tgt_p = torch.softmax(tgt @ lm_w.T, -1)
        inp = F[:-1]
        for k in range(unroll):
            pred = head(inp[None], tok, torch.arange(n - 1)[None], mask)[0]  # (n-1, H)
            reg = torch.nn.functional.smooth_l1_loss(pred[sel], tgt, reduction="none").mean(-1)
            logq = torch.log_softmax(pred[sel] @ lm_w.T, -1)
            ce = -(tgt_p * logq).sum(-1)
            total += float((reg + cls_weight * ce).sum()) / unroll
            accs[k] += float((logq.argmax(-1) == tgt_p.argmax(-1)).sum())
            inp = torch.cat([F[:1], pred[:-1]])
    return total, accs


@pytest.mark.parametrize("unroll", [1, 2, 3])
def test_head_loss_matches_reference(model, unroll):
    torch.manual_seed(0)
    dv = torch.arange(0, V, 2)
    head = DraftHead.for_target(model, dv).eval()
    with torch.no_grad():
        for p in head.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    lm_w = head.lm_weight(model.get_output_embeddings())
    feats, ids, weight, lengths = _fixed_batch(model)
    with torch.no_grad():
        got, accs = head_loss(head, model.get_input_embeddings(), lm_w, feats, ids, weight,
                              torch.zeros_like(feats[:, :-1]), lengths, 0.1, unroll)
        want, want_accs = reference_loss(head, model, lm_w, sequences()[:len(lengths)], unroll)
    assert float(got) == pytest.approx(want, rel=1e-4)
    assert [float(a) for a in accs] == want_accs
    if unroll > 1:  # the fed-back passes really differ from the first one
        first, _ = reference_loss(head, model, lm_w, sequences()[:len(lengths)], 1)
        assert want != pytest.approx(first, rel=1e-3)


@pytest.fixture(scope="module")
def run_a(offline, model):
    """The uninterrupted reference run: 8 steps, a checkpoint every 2."""
    root, data, prompts = offline
    cfg = config(root, data, prompts, "run-a", max_steps=8, checkpoint_every=2)
    summary = train(cfg, model=model, progress=False)
    return cfg, summary


def test_resume_after_interrupt_is_exact(offline, model, run_a, capsys):
    root, data, prompts = offline
    cfg_a, summary_a = run_a
    assert summary_a["steps"] == 8
    cfg = config(root, data, prompts, "run-b", max_steps=8, checkpoint_every=2)
    seen = []

    def interrupt(step):
        seen.append(step)
        if step == 5:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train(cfg, model=model, progress=False, on_step=interrupt)
    assert seen == [1, 2, 3, 4, 5]
    assert not Path(cfg.export).exists()
    state = torch.load(Path(cfg.out_dir) / "checkpoint" / "state.pt", weights_only=False)
    assert state["step"] == 4

    seen.clear()
    capsys.readouterr()
    summary = train(cfg, model=model, progress=False, on_step=seen.append)
    assert seen == [5, 6, 7, 8]  # resumed after the step-4 checkpoint, not restarted
    assert "resuming at step 4 from the checkpoint in" in capsys.readouterr().err  # said, even without a bar
    assert summary["steps"] == 8
    assert_same_weights(exported(cfg), exported(cfg_a), atol=1e-6)
    assert summary["eval"][-1]["loss"] == pytest.approx(summary_a["eval"][-1]["loss"], abs=1e-6)


def test_resume_refuses_a_checkpoint_of_other_settings(offline, model):
    """A checkpoint left by a run with other settings is not silently continued (that would mix two
    runs); settings that do not touch the weights (eval/checkpoint cadence, export) may change."""
    root, data, prompts = offline
    cfg = config(root, data, prompts, "run-c", max_steps=2)
    train(cfg, model=model, progress=False)
    for over, needle in (({"lr": 1e-3}, r"lr: 0\.003 -> 0\.001"), ({"max_steps": 4}, "max_steps: 2 -> 4"),
                         ({"draft_vocab_size": 32}, "draft_vocab_size")):
        with pytest.raises(ValueError, match=needle):
            train(config(root, data, prompts, "run-c", **over), model=model, progress=False)
    seen = []
    train(config(root, data, prompts, "run-c", max_steps=2, eval_every=1, checkpoint_every=1), model=model,
          progress=False, on_step=seen.append)
    assert seen == []  # resumed at its last step: nothing left to train


def test_checkpoints_are_atomic(run_a):
    cfg, _ = run_a
    out = Path(cfg.out_dir)
    ckpt = out / "checkpoint"
    assert sorted(p.name for p in ckpt.iterdir()) == ["head.safetensors", "state.pt"]
    assert sorted(p.name for p in out.iterdir()) == ["checkpoint"]  # no ckpt.tmp* / checkpoint.old left
    export = Path(cfg.export)
    assert sorted(p.name for p in export.parent.iterdir()) == sorted(["run", export.name])
    assert sorted(p.name for p in export.iterdir()) == ["config.json", "model.safetensors"]
    leftovers = [p for p in Path(cfg.out_dir).parent.rglob("*") if ".tmp" in p.name or p.name.endswith(".old")]
    assert not leftovers, leftovers
    # the last checkpoint holds the final weights (the export drops only the draft_vocab buffer)
    state = torch.load(ckpt / "state.pt", weights_only=False)
    assert state["step"] == 8 and "optimizer" in state
    ck = load_file(str(ckpt / "head.safetensors"))
    ex = exported(cfg)
    assert set(ex) <= set(ck)
    for k in ex:
        assert torch.equal(ck[k], ex[k]), k


def test_stale_old_folders_do_not_break_saving(offline, model):
    """A crash between "new folder in place" and "old folder removed" leaves ``checkpoint.old`` (and
    ``<export>.old``) behind; the next run must still resume, save and export."""
    root, data, prompts = offline
    cfg = config(root, data, prompts, "stale", max_steps=6, checkpoint_every=2)

    def interrupt(step):
        if step == 4:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train(cfg, model=model, progress=False, on_step=interrupt)
    out, export = Path(cfg.out_dir), Path(cfg.export)
    for stale in (out / "checkpoint.old", export.with_name(export.name + ".old")):
        stale.mkdir()
        (stale / "leftover").write_text("from a crashed save")
    seen = []
    summary = train(cfg, model=model, progress=False, on_step=seen.append)
    assert seen == [3, 4, 5, 6] and summary["steps"] == 6  # from the step-2 checkpoint
    assert torch.load(out / "checkpoint" / "state.pt", weights_only=False)["step"] == 6
    load_head(export, model)


# ------------------------------------------------------------------------------------------------
# DDP: 2 gloo processes x 2 sequences == 1 process x 4 sequences


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ddp_worker(rank: int, world: int, port: int, cfg_kwargs: dict) -> None:
    """Child process (spawned): one DDP rank of ``train``."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank), OMP_NUM_THREADS="1")
    torch.set_num_threads(1)
    import torch.distributed as dist

    try:
        train(TrainConfig(**cfg_kwargs), model=make_tiny_train_model(), progress=False)
        # really one rank of a 2-process group (not 2 independent single-process runs)
        assert dist.is_initialized() and dist.get_world_size() == world and dist.get_rank() == rank
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


@pytest.mark.multiproc
def test_ddp_two_processes_equal_one(offline, model):
    import dataclasses

    import torch.multiprocessing as mp

    root, data, prompts = offline
    single = config(root, data, prompts, "ddp-1", max_steps=4, checkpoint_every=2)
    train(single, model=model, progress=False)
    ddp = config(root, data, prompts, "ddp-2", max_steps=4, checkpoint_every=2)
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        assert var not in os.environ
    mp.start_processes(_ddp_worker, args=(2, _free_port(), dataclasses.asdict(ddp)), nprocs=2, join=True,
                       start_method="spawn")
    assert_same_weights(exported(ddp), exported(single), atol=1e-5)
    # and both moved away from the initial weights
    init = DraftHead.for_target(model).state_dict()
    assert not torch.allclose(exported(single)["fc.weight"], init["fc.weight"], atol=1e-4)


# ------------------------------------------------------------------------------------------------
# online extraction


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


def test_online_extraction_matches_offline(offline, model):
    root, data, prompts = offline
    # featureless shards of the same sequences; the manifest carries the hidden size as
    # generate_shards writes it (see test_shards_without_features_load for a fresh manifest)
    manifest = {"shards": [], "prompts_done": 0, "tokens": 0, "hidden_size": H}
    data_online, _ = make_data(root, model, with_hidden=False, manifest=manifest)
    assert not load_manifest(data_online)["has_hidden"]
    import eagle.train.trainer as trainer

    results = {}
    for name, d, extraction in (("off", data, "offline"), ("on", data_online, "online")):
        calls = []

        def recording_loss(head, embed, lm_w, feats, ids, weight, noise, lengths, *args, **kw):
            out = head_loss(head, embed, lm_w, feats, ids, weight, noise, lengths, *args, **kw)
            valid = [feats[b, :n].detach().clone() for b, n in enumerate(lengths)]  # padding may differ
            calls.append((float(out[0].detach()) / float(weight.sum()), valid, ids.clone()))
            return out

        cfg = config(root, d, prompts, f"extract-{name}", max_steps=1, eval_every=1, extraction=extraction)
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(trainer, "head_loss", recording_loss)
            summary = train(cfg, model=model, progress=False)
        assert len(calls) == 2  # the training step, then the held-out evaluation
        results[name] = (summary, calls)
    (s_off, calls_off), (s_on, calls_on) = results["off"], results["on"]
    assert s_on["train_sequences"] == s_off["train_sequences"] and s_on["tokens"] == s_off["tokens"]
    for (l_off, f_off, i_off), (l_on, f_on, i_on) in zip(calls_off, calls_on):
        assert torch.equal(i_off, i_on)  # the same batch
        # online features == the stored ones up to their fp16 rounding
        for a, b in zip(f_on, f_off):
            torch.testing.assert_close(a, b, atol=1e-2, rtol=1e-2)
        assert l_on == pytest.approx(l_off, rel=1e-3)
    assert s_on["eval"][0]["loss"] == pytest.approx(s_off["eval"][0]["loss"], rel=1e-3)
    # the fp16 stored features are the model's features
    ds = ShardDataset(data)
    for s in ds.sequences[:5]:
        torch.testing.assert_close(s.hidden.float(), features(model, s.input_ids), atol=1e-2, rtol=1e-2)


def test_resume_from_a_save_interrupted_between_renames(tmp_path):
    """Only ``checkpoint.old`` is left when a save dies between its two renames: it is still used."""
    from eagle.io import existing_dir, replace_dir

    folder = tmp_path / "checkpoint"
    (tmp_path / "checkpoint.old").mkdir()
    assert existing_dir(folder) == tmp_path / "checkpoint.old"
    new = tmp_path / "new"
    new.mkdir()
    (new / "x").write_text("1")
    replace_dir(new, folder)
    assert (folder / "x").read_text() == "1" and existing_dir(folder) == folder


# ------------------------------------------------------------------------------------------------
# the data stage in the same call: errors before the target loads, reproducible heads


@pytest.fixture
def no_target_load(monkeypatch):
    """Fails a test that loads the target: prompt-file errors must come first."""
    import eagle.models

    monkeypatch.setattr(eagle.models, "load_target", lambda *a, **kw: pytest.fail("the target was loaded"))


BAD_PROMPTS = {
    "missing": (None, r"prompts file not found: \S+prompts\.jsonl$"),
    "empty": ("", r"prompts\.jsonl: empty prompts file"),
    "blank lines": ("\n  \n", r"prompts\.jsonl: empty prompts file"),
    "bad json": ('{"prompt": "a"}\n\n{"prompt": "b"\n', r"prompts\.jsonl:3: not valid JSON \(Expecting"),
    "no prompt": ('{"prompt": "a"}\n{"text": "b"}\n', r"prompts\.jsonl:2: no prompt \(expected a JSON object"),
    "not an object": ('{"prompt": "a"}\n["b"]\n', r"prompts\.jsonl:2: no prompt"),
    "bad json list": ('[{"prompt": "a"},\n {"prompt": }]', r"prompts\.jsonl:2: not valid JSON"),
    "empty json list": ("[]", r"prompts\.jsonl: no prompts"),
}


def write_prompts(path: Path, case: str) -> Path:
    if BAD_PROMPTS[case][0] is not None:
        path.write_text(BAD_PROMPTS[case][0])
    return path


@pytest.mark.parametrize("case", list(BAD_PROMPTS))
def test_bad_prompts_file_fails_before_the_target_loads(tmp_path, no_target_load, case):
    prompts = write_prompts(tmp_path / "prompts.jsonl", case)
    cfg = config(tmp_path, tmp_path / "data", prompts, "bad")
    with pytest.raises(PromptFileError, match=BAD_PROMPTS[case][1]) as err:
        train(cfg, progress=False)
    assert "eagle data" not in str(err.value) and "\n" not in str(err.value)
    assert not (tmp_path / "data").exists()


def test_bad_extra_data_file_is_named(tmp_path, no_target_load):
    good = tmp_path / "prompts.jsonl"
    good.write_text('{"prompt": "a"}\n')
    extra = write_prompts(tmp_path / "sharegpt.json", "bad json list")
    cfg = config(tmp_path, tmp_path / "data", good, "bad", extra_data=[str(extra)])
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
    first = config(tmp_path, tmp_path / "data", prompts, "first", **kw)
    train(first, model=model, tok=ByteTokenizer(), progress=False)  # generates the data, then trains
    manifest = load_manifest(tmp_path / "data")
    assert manifest["prompts_done"] == n and [s["sequences"] for s in manifest["shards"]] == [5, 5, 2]
    mtimes = [p.stat().st_mtime_ns for p in (tmp_path / "data").iterdir()]
    second = config(tmp_path, tmp_path / "data", prompts, "second", **kw)
    train(second, model=model, tok=ByteTokenizer(), progress=False)  # finds the data there
    assert [p.stat().st_mtime_ns for p in (tmp_path / "data").iterdir()] == mtimes  # not regenerated
    a, b = exported(first), exported(second)
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
