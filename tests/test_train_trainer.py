"""Training the EAGLE head (eagle/train/trainer.py) on tiny self-made shards: the loss goes down,
unrolled training, the loss against a per-sequence reference, bit-exact resume after an interruption,
DDP (2 gloo processes) == 1 process, atomic checkpoints, online feature extraction == offline.

The data is written with ``write_shard`` from a tiny random model's own features over random token
sequences (``make_data`` in conftest.py), and a prompts file whose length equals the manifest's
``prompts_done`` makes the trainer skip self-distillation.
"""
from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from eagle.heads import DraftHead, load_head
from eagle.train.data import ShardDataset, load_manifest
from eagle.train.common import read_state
from eagle.train.trainer import TrainConfig, head_loss, train

from conftest import (N_SEQ, PROMPT_LEN, TINY_HIDDEN, TINY_VOCAB, exported, features, make_data, make_tiny_train_model,
                      sequences, train_config)

V, H = TINY_VOCAB, TINY_HIDDEN


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
    cfg = train_config(root, data, prompts, "loss", max_steps=30, eval_every=10)
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
    cfg = train_config(root, data, prompts, "unroll", max_steps=3, unroll=2)
    summary = train(cfg, model=model, progress=False)
    assert len(summary["eval"]) == 1
    ev = summary["eval"][0]
    assert len(ev["acc"]) == 2 and all(0.0 <= a <= 1.0 for a in ev["acc"])
    assert torch.isfinite(torch.tensor(ev["loss"]))
    # the second pass sees the head's own predictions: a different loss from unroll=1
    cfg1 = train_config(root, data, prompts, "unroll1", max_steps=3, unroll=1)
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
    cfg = train_config(root, data, prompts, "run-a", max_steps=8, checkpoint_every=2)
    summary = train(cfg, model=model, progress=False)
    return cfg, summary


def test_resume_after_interrupt_is_exact(offline, model, run_a, capsys):
    root, data, prompts = offline
    cfg_a, summary_a = run_a
    assert summary_a["steps"] == 8
    cfg = train_config(root, data, prompts, "run-b", max_steps=8, checkpoint_every=2)
    seen = []

    def interrupt(step):
        seen.append(step)
        if step == 5:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train(cfg, model=model, progress=False, on_step=interrupt)
    assert seen == [1, 2, 3, 4, 5]
    assert not Path(cfg.export).exists()
    state = read_state(Path(cfg.out_dir) / "checkpoint")
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
    cfg = train_config(root, data, prompts, "run-c", max_steps=2)
    train(cfg, model=model, progress=False)
    for over, needle in (({"lr": 1e-3}, r"lr: 0\.003 -> 0\.001"), ({"max_steps": 4}, "max_steps: 2 -> 4"),
                         ({"draft_vocab_size": 32}, "draft_vocab_size")):
        with pytest.raises(ValueError, match=needle):
            train(train_config(root, data, prompts, "run-c", **over), model=model, progress=False)
    seen = []
    train(train_config(root, data, prompts, "run-c", max_steps=2, eval_every=1, checkpoint_every=1), model=model,
          progress=False, on_step=seen.append)
    assert seen == []  # resumed at its last step: nothing left to train


def test_checkpoints_are_atomic(run_a):
    cfg, _ = run_a
    out = Path(cfg.out_dir)
    ckpt = out / "checkpoint"
    assert sorted(p.name for p in ckpt.iterdir()) == ["head.safetensors", "optimizer.safetensors", "state.json"]
    assert sorted(p.name for p in out.iterdir()) == ["checkpoint"]  # no ckpt.tmp* / checkpoint.old left
    export = Path(cfg.export)
    assert sorted(p.name for p in export.parent.iterdir()) == sorted(["run", export.name])
    assert sorted(p.name for p in export.iterdir()) == ["config.json", "model.safetensors"]
    leftovers = [p for p in Path(cfg.out_dir).parent.rglob("*") if ".tmp" in p.name or p.name.endswith(".old")]
    assert not leftovers, leftovers
    # the last checkpoint holds the final weights (the export drops only the draft_vocab buffer)
    state = read_state(ckpt)
    assert state["step"] == 8 and state["optimizer"]["state"] and state["optimizer"]["param_groups"]
    ck = load_file(str(ckpt / "head.safetensors"))
    ex = exported(cfg)
    assert set(ex) <= set(ck)
    for k in ex:
        assert torch.equal(ck[k], ex[k]), k


def test_stale_old_folders_do_not_break_saving(offline, model):
    """A crash between "new folder in place" and "old folder removed" leaves ``checkpoint.old`` (and
    ``<export>.old``) behind; the next run must still resume, save and export."""
    root, data, prompts = offline
    cfg = train_config(root, data, prompts, "stale", max_steps=6, checkpoint_every=2)

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
    assert read_state(out / "checkpoint")["step"] == 6
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
    single = train_config(root, data, prompts, "ddp-1", max_steps=4, checkpoint_every=2)
    train(single, model=model, progress=False)
    ddp = train_config(root, data, prompts, "ddp-2", max_steps=4, checkpoint_every=2)
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


def test_online_extraction_matches_offline(offline, model):
    root, data, prompts = offline
    # featureless shards of the same sequences; the manifest carries the hidden size as
    # generate_shards writes it (see test_train_data.py::test_shards_without_features_load for a fresh manifest)
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

        cfg = train_config(root, d, prompts, f"extract-{name}", max_steps=1, eval_every=1, extraction=extraction)
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


# ------------------------------------------------------------------------------------------------
# checkpoint folders


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


def test_batch_order_grouped_by_length():
    """Grouped batches: the same full batches' worth of indices, each once, seeded, in random order,
    with far less padding than random batches; without lengths the order is the plain permutation."""
    from eagle.train.common import batch_order

    g = torch.Generator().manual_seed(1)
    lengths = torch.randint(20, 300, (1003,), generator=g).tolist()
    plain = batch_order(1003, 16, 0, 2)
    grouped = batch_order(1003, 16, 0, 2, lengths, group=8)
    assert all(len(b) == 16 for b in plain + grouped) and len(grouped) == len(plain) == 1003 // 16
    assert sorted(i for b in grouped for i in b) == sorted(i for b in plain for i in b)  # the same sequences
    assert len({i for b in grouped for i in b}) == 16 * len(grouped)
    assert grouped == batch_order(1003, 16, 0, 2, lengths, group=8)  # a resumed run sees the same batches
    assert grouped != batch_order(1003, 16, 0, 3, lengths, group=8)  # another epoch, another order

    def padding(batches):
        return sum(16 * max(lengths[i] for i in b) - sum(lengths[i] for i in b) for b in batches)

    assert padding(grouped) < 0.25 * padding(plain)
    firsts = [min(lengths[i] for i in b) for b in grouped]
    assert firsts != sorted(firsts)  # the batches themselves are shuffled, not sorted by length


def test_train_dtype_choices_and_autocast(monkeypatch):
    """train_dtype: a bad value is a config error; bfloat16 (and auto where bf16 is native) runs the
    step's products in bf16, float32 (and auto elsewhere) leaves them alone."""
    from eagle.config import ConfigError
    from eagle.train.common import full_precision, step_precision

    with pytest.raises(ConfigError, match="train_dtype must be one of float32, bfloat16, auto, got 'bf16'"):
        TrainConfig(train_dtype="bf16").validate()
    a, b = torch.randn(4, 8), torch.randn(8, 3)
    with step_precision("bfloat16", "cpu"):
        assert (a @ b).dtype == torch.bfloat16
        with full_precision("cpu"):
            assert (a @ b).dtype == torch.float32
    with step_precision("float32", "cpu"):
        assert (a @ b).dtype == torch.float32
    monkeypatch.setattr("eagle.backends.native_bf16", lambda device="cpu": True)
    with step_precision("auto", "cpu"):
        assert (a @ b).dtype == torch.bfloat16
    monkeypatch.setattr("eagle.backends.native_bf16", lambda device="cpu": False)
    with step_precision("auto", "cpu"):
        assert (a @ b).dtype == torch.float32


def test_bf16_loss_keeps_the_target_exact_and_close(model):
    """Under bf16 autocast the head's products run in bf16, its loss stays within ~2% of float32's,
    and the target's distribution (the labels) is computed in float32 exactly as without autocast."""
    from eagle.train import trainer
    from eagle.train.common import step_precision

    torch.manual_seed(0)
    head = DraftHead.for_target(model, None)
    feats, ids, weight, lengths = _fixed_batch(model)
    lm_w = head.lm_weight(model.get_output_embeddings()).float()
    seen = []
    real = torch.log_softmax

    def spy(x, dim):  # the first log_softmax of head_loss is the target's
        seen.append(x.detach().clone())
        return real(x, dim=dim)

    losses = {}
    for dt in ("float32", "bfloat16"):
        out_dtypes = []
        hook = head.fc.register_forward_hook(lambda m, i, o: out_dtypes.append(o.dtype))
        try:
            trainer.torch.log_softmax = spy
            with torch.no_grad(), step_precision(dt, "cpu"):
                loss, _ = head_loss(head.eval(), model.get_input_embeddings(), lm_w, feats, ids, weight,
                                    torch.zeros_like(feats[:, :-1]), lengths, 0.1, 1)
        finally:
            trainer.torch.log_softmax = real
            hook.remove()
        assert out_dtypes == [torch.float32 if dt == "float32" else torch.bfloat16]
        losses[dt] = float(loss)
    # seen: [target fp32, head fp32, target under bf16, head under bf16]
    assert seen[2].dtype == torch.float32 and torch.equal(seen[0], seen[2])
    assert seen[3].dtype == torch.float32 and not torch.equal(seen[1], seen[3])
    assert losses["bfloat16"] == pytest.approx(losses["float32"], rel=0.02)



def test_resume_reads_no_pickle_and_refuses_an_old_state_pt(offline, model, monkeypatch):
    """Training state is safetensors + JSON: resuming never unpickles, and a folder holding an old
    (or foreign) pickled ``state.pt`` is refused with one line naming it."""
    root, data, prompts = offline
    cfg = train_config(root, data, prompts, "no-pickle", max_steps=2)
    train(cfg, model=model, progress=False)
    ckpt = Path(cfg.out_dir) / "checkpoint"
    import json

    meta = json.loads((ckpt / "state.json").read_text())
    assert meta["step"] == 2 and meta["optimizer"]["param_groups"]

    def no_unpickling(*a, **k):
        raise AssertionError("resume called torch.load")

    monkeypatch.setattr(torch, "load", no_unpickling)
    seen = []
    train(cfg, model=model, progress=False, on_step=seen.append)  # resumes at step 2: nothing left
    assert seen == []
    state = read_state(ckpt)
    assert state["step"] == 2 and all(torch.is_tensor(v) for s in state["optimizer"]["state"].values()
                                      for v in s.values() if not isinstance(v, (int, float)))
    monkeypatch.undo()
    for name in ("state.json", "optimizer.safetensors"):
        (ckpt / name).unlink()
    torch.save({"step": 2}, ckpt / "state.pt")
    with pytest.raises(ValueError, match=r"state\.pt is a checkpoint in the old pickled format"):
        train(cfg, model=model, progress=False)
