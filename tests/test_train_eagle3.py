"""Training the EAGLE-3 head (eagle/train/eagle3.py): the training-time-test masks, the batched unrolled
computation == a step-by-step loop feeding the head its own outputs, loss going down, checkpoint
round trip and an exact resume. Data: a tiny random target's own features (all layers) in shards."""
from __future__ import annotations

import pytest
import torch

from eagle.heads import load_head
from eagle.heads.eagle3 import Eagle3Head
from eagle.train.data import ShardDataset, load_manifest, write_shard
from eagle.train.eagle3 import Eagle3Recipe, Eagle3TTT, ttt_mask
from eagle.train.trainer import TrainConfig, train

from conftest import PROMPT_LEN, TINY_VOCAB, causal_mask, make_tiny_train_model

V = TINY_VOCAB
LAYERS = [0, 1, 2]


def test_ttt_mask_on_a_tiny_example():
    m = ttt_mask(3, 2).int().tolist()
    assert m == [[1, 0, 0, 1, 0, 0, 1, 0, 0],
                 [1, 1, 0, 0, 1, 0, 0, 1, 0],
                 [1, 1, 1, 0, 0, 1, 0, 0, 1]]
    assert ttt_mask(4, 0).equal(torch.ones(4, 4, dtype=torch.bool).tril())


@pytest.fixture(scope="module")
def model():
    m = make_tiny_train_model(2)
    m.generation_config.eos_token_id = 1
    return m


@pytest.fixture(scope="module")
def data(model, tmp_path_factory):
    """Shards of random sequences with the tiny target's own final feature and fused layers."""
    folder = tmp_path_factory.mktemp("e3data")
    g = torch.Generator().manual_seed(0)
    m = load_manifest(folder)
    for shard in range(3):
        ids, hid, lay = [], [], []
        for _ in range(12):
            seq = torch.randint(2, V, (int(torch.randint(PROMPT_LEN + 6, 40, (), generator=g)),), generator=g)
            with torch.no_grad():
                hs = model.model(seq[None], output_hidden_states=True).hidden_states
            ids.append(seq)
            hid.append(hs[-1][0])
            lay.append(torch.cat([hs[i][0] for i in LAYERS], -1))
        m = write_shard(folder, m, ids, hid, [PROMPT_LEN] * 12, prompts_done=12 * (shard + 1), layers=lay)
    m["feature_layers"] = LAYERS
    return folder


def cfg_for(tmp_path, data, name="run", **kw):
    prompts = tmp_path / "prompts.jsonl"  # the data is there already: the data stage has nothing to do
    prompts.write_text('{"prompt": "hi"}\n')
    base = dict(target="tiny", head="eagle3", data_dir=str(data), feature_layers=LAYERS, prompts=str(prompts),
                num_prompts=1, ttt_steps=3, batch_size=4, max_seq_len=40, lr=3e-3, warmup_steps=2, epochs=1,
                draft_vocab_size=48, heldout_fraction=0.15, eval_every=1000, checkpoint_every=4, seed=0,
                out_dir=str(tmp_path / name), export=str(tmp_path / (name + "-head")), export_dtype="float32")
    base.update(kw)
    cfg = TrainConfig(**base)
    cfg.validate()
    return cfg


def test_unrolled_batch_equals_stepwise_loop(model, data, tmp_path):
    """Each step-j row of the one-forward-per-step computation == running the head along one chain:
    the true pairs of positions 0..i, then its own outputs of steps 0..j-1 as the next pairs'
    hidden inputs (positions i+1..i+j), each with the next true token."""
    cfg = cfg_for(tmp_path, data, ttt_steps=3)
    seqs = ShardDataset(data, load_layers=True).sequences[:3]
    recipe = Eagle3Recipe(cfg, model, seqs, "cpu")
    head: Eagle3Head = recipe.module.head
    with torch.no_grad():
        for p in head.parameters():  # away from the init, so every part matters
            p.add_(torch.randn_like(p) * 0.05)
    fused, tok_emb, target_p, weight = recipe.batch(seqs, [0, 1, 2], 0, "cpu")
    # the batched computation, with the per-step logits captured
    captured = []
    real_lm = head.lm_head.forward
    head.lm_head.forward = lambda x: captured.append(x.detach().clone()) or real_lm(x)
    try:
        with torch.no_grad():
            recipe.module(fused, tok_emb, target_p, weight)
    finally:
        head.lm_head.forward = real_lm
    T = fused.shape[1]
    for j in range(3):
        rows = (weight[:, j: j + T] > 0).nonzero().tolist()  # the (b, i) rows scored at step j, in order
        assert len(rows) == len(captured[j]) > 0
        for r, (b, i) in enumerate(rows[:: max(1, len(rows) // 7)]):
            k = rows.index([b, i])
            with torch.no_grad():
                h = head.enter(fused[b: b + 1, : i + 1])  # (1, i+1, H) true pairs 0..i
                x = tok_emb[b: b + 1, : i + 1]
                for step in range(j + 1):
                    n = h.shape[1]
                    out = head(h, x, torch.arange(n)[None], causal_mask(1, n))
                    if step < j:  # its own output becomes the next pair's hidden, with the next true token
                        h = torch.cat([h, out[:, -1:]], dim=1)
                        x = torch.cat([x, tok_emb[b: b + 1, i + step + 1: i + step + 2]], dim=1)
                want = head.norm(out[0, -1])
            torch.testing.assert_close(captured[j][k], want, atol=1e-4, rtol=1e-4)


def test_training_lowers_the_loss_and_exports(model, data, tmp_path):
    cfg = cfg_for(tmp_path, data, max_steps=40, eval_every=20)
    out = train(cfg, model=model, tok=None, progress=False)
    first, last = out["eval"][0], out["eval"][-1]
    assert last["loss"] < first["loss"]
    assert len(last["acc"]) == 3
    head = load_head(cfg.export, model)
    assert isinstance(head, Eagle3Head) and head.feature_layers == tuple(LAYERS) and len(head.d2t) == 48
    trained = load_head(cfg.export, model).state_dict()
    ref = Eagle3Head.for_target(model, head.draft_ids, LAYERS).state_dict()
    assert not torch.equal(trained["fc.weight"], ref["fc.weight"])


def test_resume_after_interrupt_is_exact(model, data, tmp_path):
    full = cfg_for(tmp_path, data, "full", max_steps=10)
    train(full, model=model, progress=False)

    class Stop(Exception):
        pass

    def stop_at(step):
        if step == 6:
            raise Stop

    part = cfg_for(tmp_path, data, "part", max_steps=10)
    with pytest.raises(Stop):
        train(part, model=model, progress=False, on_step=stop_at)
    train(part, model=model, progress=False)  # resumes from the step-4 checkpoint
    a = load_head(full.export, model).state_dict()
    b = load_head(part.export, model).state_dict()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_data_without_the_head_layers_is_refused(model, data, tmp_path):
    cfg = cfg_for(tmp_path, data, feature_layers=[0, 2])
    with pytest.raises(Exception, match="fused layers per token"):
        train(cfg, model=model, progress=False)


def test_bf16_training_runs_its_products_in_bf16_and_learns(model, data, tmp_path):
    """train_dtype bfloat16: the TTT loss of one batch within ~2% of float32's with the layer's and the
    LM head's products in bf16; a short run lowers the held-out loss and keeps float32 weights."""
    from eagle.train.common import step_precision

    cfg = cfg_for(tmp_path, data, "bf16", train_dtype="bfloat16", max_steps=40, eval_every=20)
    seqs = ShardDataset(data, load_layers=True).sequences[:4]
    recipe = Eagle3Recipe(cfg, model, seqs, "cpu")
    batch = recipe.batch(seqs, [0, 1, 2, 3], 0, "cpu")
    losses, dtypes = {}, []
    hook = recipe.module.head.lm_head.register_forward_hook(lambda m, i, o: dtypes.append(o.dtype))
    for dt in ("float32", "bfloat16"):
        with torch.no_grad(), step_precision(dt, "cpu"):
            total, count, _ = recipe.loss(recipe.module, batch)
        losses[dt] = float(total / count)
    hook.remove()
    assert dtypes == [torch.float32] * 3 + [torch.bfloat16] * 3  # 3 TTT steps each
    assert losses["bfloat16"] == pytest.approx(losses["float32"], rel=0.02)
    out = train(cfg, model=model, progress=False)
    assert out["eval"][-1]["loss"] < out["eval"][0]["loss"]
    from safetensors.torch import load_file

    saved = load_file(str(tmp_path / "bf16" / "checkpoint" / "head.safetensors"))
    assert saved and all(v.dtype == torch.float32 for v in saved.values() if v.is_floating_point())  # master weights


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_structured_ttt_attention_equals_the_masked_reference(arch):
    """ttt_attention (causal scores against step 0 + one dot product per later step) == SDPA under
    the explicit ttt_mask: the same loss, hits and gradients on random inputs and a random head
    (grouped-query heads included: the tiny models have fewer key heads than query heads)."""
    import copy

    from conftest import make_tiny_head_target

    model = make_tiny_head_target(arch)
    torch.manual_seed(1)
    head = Eagle3Head.for_target(model, torch.arange(40) * 2, [0, 1, 2]).float()
    with torch.no_grad():
        for p in head.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    tcfg = model.config.get_text_config(decoder=True)
    assert tcfg.num_key_value_heads < tcfg.num_attention_heads
    B, T, s, H = 3, 11, 4, tcfg.hidden_size
    fused = torch.randn(B, T, 3 * H)
    tok_emb = torch.randn(B, T + s, H)
    target_p = torch.softmax(torch.randn(B, T + s, 40) * 3, -1)
    weight = (torch.rand(B, T + s) > 0.2).float()
    results = []
    for structured in (True, False):
        m = Eagle3TTT(copy.deepcopy(head), s, 0.8, structured=structured)
        total, hits = m(fused, tok_emb, target_p, weight)
        total.backward()
        results.append((total.detach(), torch.stack(hits), {n: p.grad for n, p in m.named_parameters()}))
    (a, ha, ga), (b, hb, gb) = results
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    assert torch.equal(ha, hb)
    for n in ga:
        scale = float(gb[n].abs().max())  # float32 sums in another order: rounding relative to the largest entry
        torch.testing.assert_close(ga[n], gb[n], rtol=1e-4, atol=1e-5 * scale, msg=lambda m: f"{n}: {m}")
