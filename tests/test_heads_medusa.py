"""Medusa-1 heads (eagle/heads/medusa.py) and their training (eagle/train/medusa.py): head shapes, the
checkpoint and its one-line errors, static and dynamic trees (depths, parents, scores = sums of head
log-probs), lossless greedy decoding and the draft distribution q for sampling on tiny models,
the loss against a per-position reference, training lowers the loss, exact resume, and the shipped
head on the real SmolLM2 (slow)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from eagle import Target, TreeDecoder
from eagle.config import ConfigError, config_from_dict
from eagle.draft.base import Sampling
from eagle.draft.shape import TreeShape
from eagle.heads import HeadError, HeadMismatchError, HeadNotFoundError
from eagle.heads.medusa import (MedusaConfig, MedusaDrafter, MedusaHeads, check_medusa, load_medusa,
                                read_medusa_config, save_medusa)
from eagle.tree import choices_to_parents
from eagle.verify import probs_from_logits

from conftest import (N_SEQ, TINY_HIDDEN, TINY_VOCAB, exported, features, make_data, make_tiny_head_target,
                      make_tiny_train_model, plain_greedy, prompt_ids, run_cli, shipped_config_mean_tau, train_config,
                      write_prompt_lines)

ROOT = Path(__file__).resolve().parents[1]
V, H = TINY_VOCAB, TINY_HIDDEN
DV = torch.arange(0, V, 2)  # a reduced draft vocabulary: the even ids
CHOICES = [[0], [1], [2], [0, 0], [0, 1], [1, 0], [0, 0, 0], [0, 0, 1]]


def random_heads(model, K: int = 3, draft_vocab=None, lm_head: str = "shared", seed: int = 1) -> MedusaHeads:
    """``MedusaHeads.for_target`` with every block (and own LM head) perturbed: not the zero init."""
    torch.manual_seed(seed)
    heads = MedusaHeads.for_target(model, K, draft_vocab, lm_head)
    with torch.no_grad():
        for b in heads.blocks:
            b.weight.add_(torch.randn_like(b.weight) * 0.3)
            b.bias.add_(torch.randn_like(b.bias) * 0.3)
        if heads.lm_heads is not None:
            for lm in heads.lm_heads:
                lm.weight.add_(torch.randn_like(lm.weight) * lm.weight.std())
    return heads.eval().requires_grad_(False)


def save_heads(folder: Path, model, heads: MedusaHeads, lm_head: str = "shared", dtype=None) -> Path:
    tcfg = model.config
    save_medusa(heads, folder, MedusaConfig(target="tiny", model_type=tcfg.model_type, hidden_size=tcfg.hidden_size,
                                            vocab_size=tcfg.vocab_size, num_heads=heads.num_heads, lm_head=lm_head,
                                            draft_vocab=heads.draft_vocab.tolist()), dtype=dtype)
    return folder


@pytest.fixture(scope="module")
def model():
    return make_tiny_head_target()


@pytest.fixture(scope="module")
def target(model):
    return Target(model, "reference")


def started(drafter: MedusaDrafter, model, seed: int = 0) -> MedusaDrafter:
    """The drafter after the prefill of a random prompt (features of the whole prompt)."""
    ids = prompt_ids(seed)
    drafter.reset(ids)
    drafter.extend(features(model, ids), torch.cat([ids[1:], ids.new_tensor([7])]))
    return drafter


# ---- the module --------------------------------------------------------------------------------


@pytest.mark.parametrize("lm_head", ["shared", "own"])
@pytest.mark.parametrize("draft_vocab", [None, DV], ids=["full", "reduced"])
def test_head_shapes_and_init(model, lm_head, draft_vocab):
    heads = MedusaHeads.for_target(model, 3, draft_vocab, lm_head)
    vd = V if draft_vocab is None else len(DV)
    f = torch.randn(2, 5, H)
    assert heads.states(f).shape == (2, 5, 3, H) and heads.states(f, 2).shape == (2, 5, 2, H)
    w = heads.lm_weight(model.get_output_embeddings())
    assert w.shape == (vd, H)
    logits = heads(f, w)
    assert logits.shape == (2, 5, 3, vd)
    # Medusa-1's init: zero blocks, so every head starts as the target's own next-token prediction
    torch.testing.assert_close(logits, (f @ w.T)[..., None, :].expand(2, 5, 3, vd))
    n_own = 3 * vd * H if lm_head == "own" else 0
    assert sum(p.numel() for p in heads.parameters()) == 3 * (H * H + H) + n_own
    assert heads.flops_per_step() == 2 * 3 * (H * H + vd * H)


def test_bad_head_arguments():
    with pytest.raises(ValueError, match="lm_head must be one of"):
        MedusaHeads(H, 2, V, lm_head="tied")
    with pytest.raises(ValueError, match="num_heads must be >= 1"):
        MedusaHeads(H, 0, V)


# ---- the checkpoint ----------------------------------------------------------------------------


@pytest.mark.parametrize("lm_head", ["shared", "own"])
def test_checkpoint_round_trip(tmp_path, model, lm_head):
    heads = random_heads(model, 3, DV, lm_head)
    folder = save_heads(tmp_path / "m", model, heads, lm_head)
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "model.safetensors"]
    raw = json.loads((folder / "config.json").read_text())
    assert raw["type"] == "medusa" and raw["num_heads"] == 3 and raw["lm_head"] == lm_head
    assert raw["draft_vocab"] == DV.tolist() and raw["hidden_size"] == H and raw["vocab_size"] == V
    assert check_medusa(folder) == read_medusa_config(folder)
    back = load_medusa(folder, model)
    assert back.config.num_heads == 3 and torch.equal(back.draft_vocab, DV)
    w = heads.lm_weight(model.get_output_embeddings())
    f = torch.randn(4, H)
    torch.testing.assert_close(back(f, w), heads(f, w), rtol=0, atol=0)
    # float16 storage: loads back as float32, close to the original
    half = load_medusa(save_heads(tmp_path / "h", model, heads, lm_head, torch.float16), model)
    assert half.blocks[0].weight.dtype == torch.float32
    torch.testing.assert_close(half(f, w), heads(f, w), rtol=1e-2, atol=0.1)


@pytest.fixture(scope="module")
def saved(tmp_path_factory, model):
    """A valid checkpoint folder (3 heads, own LM head over DV) to break in the error tests."""
    return save_heads(tmp_path_factory.mktemp("medusa") / "ok", model, random_heads(model, 3, DV, "own"), "own")


def _copy(saved: Path, tmp_path: Path, edit=None) -> Path:
    import shutil

    folder = tmp_path / "copy"
    shutil.copytree(saved, folder)
    if edit is not None:
        raw = json.loads((folder / "config.json").read_text())
        edit(raw)
        (folder / "config.json").write_text(json.dumps(raw))
    return folder


@pytest.mark.parametrize("case, error, pattern", [
    ("missing folder", HeadNotFoundError, r"no Medusa head checkpoint at \S+nowhere: no such folder"),
    ("a file", HeadError, r"not a folder"),
    ("no config", HeadError, r"not a Medusa head \(no config\.json"),
    ("bad json", HeadError, r"config\.json: not valid JSON"),
    ("not medusa", HeadError, r"not a Medusa head \(config\.json has no \"type\": \"medusa\"\)"),
    ("eagle head", HeadError, r"looks like an EAGLE head: use drafter type 'eagle'"),
    ("missing key", HeadError, r"a Medusa head config needs 'num_heads'"),
    ("unknown key", HeadError, r"unknown keys \['heads'\]"),
    ("wrong type", HeadError, r"'num_heads' must be an integer, got \"3\""),
    ("bad lm_head", HeadError, r"'lm_head' must be one of"),
    ("bad draft id", HeadError, r"'draft_vocab' must hold token ids in \[0, 128\)"),
    ("no weights", HeadError, r"no model\.safetensors"),
    ("truncated", HeadError, r"model\.safetensors: truncated or corrupt"),
])
def test_checkpoint_errors_are_one_line(saved, tmp_path, case, error, pattern):
    if case == "missing folder":
        folder = tmp_path / "nowhere"
    elif case == "a file":
        folder = tmp_path / "file"
        folder.write_text("x")
    else:
        edits = {"not medusa": lambda r: r.pop("type"), "missing key": lambda r: r.pop("num_heads"),
                 "unknown key": lambda r: r.update(heads=3), "wrong type": lambda r: r.update(num_heads="3"),
                 "bad lm_head": lambda r: r.update(lm_head="tied"), "bad draft id": lambda r: r.update(draft_vocab=[128])}
        folder = _copy(saved, tmp_path, edits.get(case))
        if case == "no config":
            (folder / "config.json").unlink()
        elif case == "bad json":
            (folder / "config.json").write_text("{oops")
        elif case == "no weights":
            (folder / "model.safetensors").unlink()
        elif case == "truncated":
            w = folder / "model.safetensors"
            w.write_bytes(w.read_bytes()[:100])
        elif case == "eagle head":
            (folder / "config.json").write_text(json.dumps({"target": "t", "model_type": "llama", "hidden_size": H,
                                                            "vocab_size": V, "draft_vocab": []}))
    with pytest.raises(error, match=pattern) as e:
        check_medusa(folder)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("case, pattern", [
    ("hidden", r"trained for a hidden size 64, the target has 32"),
    ("vocab", r"trained for a vocabulary of 128, the target has 96"),
    ("arch", r"trained for a 'llama' target, this one is 'qwen2'"),
    ("heads", r"tensor 'blocks\.3\.weight' missing \(expected shape \[64, 64\]; config\.json says 4 heads"),
    ("lm", r"unexpected tensor 'lm_heads\.0\.weight' \[64, 64\] \(config\.json says 3 heads, lm_head 'shared'\)"),
])
def test_mismatched_heads_are_one_line(saved, tmp_path, case, pattern):
    from conftest import make_tiny_model

    other = {"hidden": lambda: make_tiny_model("llama", hidden=32), "vocab": lambda: make_tiny_model("llama", vocab=96),
             "arch": lambda: make_tiny_model("qwen2")}.get(case, make_tiny_head_target)()
    edit = {"heads": lambda r: r.update(num_heads=4), "lm": lambda r: r.update(lm_head="shared")}.get(case)
    with pytest.raises(HeadMismatchError, match=pattern) as e:
        load_medusa(_copy(saved, tmp_path, edit), other)
    assert "\n" not in str(e.value)


def test_eagle_loader_refuses_a_medusa_folder(saved):
    from eagle.heads import load_head

    with pytest.raises(HeadError):
        load_head(saved, make_tiny_head_target())


# ---- drafting ----------------------------------------------------------------------------------


@pytest.mark.parametrize("lm_head", ["shared", "own"])
@pytest.mark.parametrize("draft_vocab", [None, DV], ids=["full", "reduced"])
def test_static_tree_from_a_choice_list(model, target, lm_head, draft_vocab):
    heads = random_heads(model, 3, draft_vocab, lm_head)
    drafter = started(MedusaDrafter(target, heads, TreeShape("static", choices=CHOICES)), model)
    logits = heads(drafter.feature, heads.lm_weight(model.get_output_embeddings()))  # (K, Vd)
    torch.testing.assert_close(drafter.head_logits(), logits, rtol=1e-5, atol=1e-4)
    logp = torch.log_softmax(logits, -1)
    to_target = (lambda i: i) if draft_vocab is None else (lambda i: int(DV[i]))
    tree = drafter.propose(5, Sampling())
    parents, ranks = choices_to_parents(CHOICES)
    assert tree.parents.tolist() == parents and int(tree.tokens[0]) == 5
    depth = tree.depth.tolist()
    assert max(depth) == 3 and tree.q is None
    for i in range(1, len(tree)):
        d, r = depth[i], ranks[i]
        top = logp[d - 1].topk(3).indices  # head d: the same candidates under every parent (Medusa-1)
        assert int(tree.tokens[i]) == to_target(int(top[r]))
        expect = float(tree.scores[parents[i]]) + float(logp[d - 1, top[r]])
        assert float(tree.scores[i]) == pytest.approx(expect, abs=1e-5)


@pytest.mark.parametrize("draft_vocab", [None, DV], ids=["full", "reduced"])
def test_dynamic_tree_scores_are_sums_of_head_log_probs(model, target, draft_vocab):
    heads = random_heads(model, 3, draft_vocab, "own")
    shape = TreeShape("dynamic", depth=3, top_k=3, total_tokens=7)
    drafter = started(MedusaDrafter(target, heads, shape), model)
    logp = torch.log_softmax(drafter.head_logits(), -1)  # (3, Vd)
    to_draft = {int(t): i for i, t in enumerate(DV)} if draft_vocab is not None else None
    tree = drafter.propose(9, Sampling())
    assert len(tree) == 8 and int(tree.tokens[0]) == 9
    depth, par = tree.depth.tolist(), tree.parents.tolist()
    assert max(depth) <= 3
    for i in range(1, len(tree)):
        tok = int(tree.tokens[i]) if to_draft is None else to_draft[int(tree.tokens[i])]
        assert depth[i] == depth[par[i]] + 1
        assert tok in logp[depth[i] - 1].topk(3).indices.tolist()
        expect = float(tree.scores[par[i]]) + float(logp[depth[i] - 1, tok])
        assert float(tree.scores[i]) == pytest.approx(expect, abs=1e-5)
    # the best node of depths 1 and 2 (head 1's top-1, then head 2's top-1 under it) rank among the
    # 4 best scores of the pool, so they are kept
    best = logp.argmax(-1).tolist()
    toks = tree.tokens.tolist() if to_draft is None else [to_draft.get(t, -1) for t in tree.tokens.tolist()]
    one = [i for i in range(len(tree)) if depth[i] == 1 and toks[i] == best[0]]
    assert len(one) == 1 and any(par[i] == one[0] and toks[i] == best[1] for i in range(len(tree)))


def test_the_drafter_keeps_the_last_committed_feature(model, target):
    drafter = started(MedusaDrafter(target, random_heads(model), TreeShape("chain", depth=2)), model)
    f = torch.randn(3, H)
    drafter.extend(f, torch.tensor([1, 2, 3]))
    assert torch.equal(drafter.feature, f[-1]) and drafter.history[-3:] == [1, 2, 3]


@pytest.mark.parametrize("shape", [TreeShape("chain", depth=4), TreeShape("dynamic", depth=5),
                                   TreeShape("static", choices=[[0], [0, 0], [0, 0, 0], [0, 0, 0, 0]])],
                         ids=["chain", "dynamic", "static"])
def test_a_tree_deeper_than_the_heads_is_a_config_error(model, target, shape):
    with pytest.raises(ConfigError, match=r"tree depth \d needs \d Medusa heads, the head has 3"):
        MedusaDrafter(target, random_heads(model), shape)


def test_bfloat16_drafts_leave_the_head_alone(model, target):
    heads = random_heads(model, 3, DV, "own")
    shape = TreeShape("static", choices=CHOICES)
    ref = started(MedusaDrafter(target, heads, shape), model)
    low = started(MedusaDrafter(target, heads, shape, dtype=torch.bfloat16), model)
    assert heads.blocks[0].weight.dtype == torch.float32  # the drafter works on a copy
    torch.testing.assert_close(low.head_logits(), ref.head_logits(), rtol=0.05, atol=0.5)


# ---- decoding: lossless greedy, q for sampling -------------------------------------------------


SHAPES = {"static": TreeShape("static", choices=CHOICES), "chain": TreeShape("chain", depth=3),
          "dynamic": TreeShape("dynamic", depth=3, top_k=4, total_tokens=10),
          "auto": TreeShape("auto", depth=3, top_k=4, total_tokens=10)}


@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("lm_head, draft_vocab", [("shared", None), ("own", DV)], ids=["shared-full", "own-reduced"])
def test_greedy_equals_plain(model, target, shape, lm_head, draft_vocab):
    dec = TreeDecoder(target, MedusaDrafter(target, random_heads(model, 3, draft_vocab, lm_head), SHAPES[shape]))
    for seed in range(3):
        p = prompt_ids(seed)
        out = dec.generate(p, 40)
        assert out.tokens == plain_greedy(model, p, 40)


def test_built_from_a_decoding_config(tmp_path, model, target):
    folder = save_heads(tmp_path / "m", model, random_heads(model, 3, DV, "own"), "own")
    cfg = config_from_dict({"drafter": {"type": "medusa", "head": str(folder), "dtype": "bfloat16"},
                            "tree": {"shape": "dynamic", "depth": 3, "top_k": 3, "total_tokens": 6}}, tmp_path / "c.yaml")
    dec = TreeDecoder.from_config(target, cfg)
    assert isinstance(dec.drafter, MedusaDrafter) and dec.drafter.dtype == torch.bfloat16
    p = prompt_ids(4)
    assert dec.generate(p, 30).tokens == plain_greedy(model, p, 30)
    with pytest.raises(ConfigError, match="drafter.type 'medusa' needs drafter.head"):
        config_from_dict({"drafter": {"type": "medusa"}}, tmp_path / "c.yaml")
    with pytest.raises(ConfigError, match="unknown key 'drafter.heads'"):
        config_from_dict({"drafter": {"type": "medusa", "heads": str(folder)}}, tmp_path / "c.yaml")
    deep = config_from_dict({"drafter": {"type": "medusa", "head": str(folder)}, "tree": {"shape": "chain", "depth": 4}},
                            tmp_path / "c.yaml")
    with pytest.raises(ConfigError, match="tree depth 4 needs 4 Medusa heads"):
        TreeDecoder.from_config(target, deep)


def test_cli_checks_the_medusa_head_before_the_target_loads(tmp_path, model, capsys):
    folder = save_heads(tmp_path / "m", model, random_heads(model, 3), "shared")
    prompts = write_prompt_lines(tmp_path / "p.jsonl", [json.dumps({"prompt": "Hi"})])
    deep = tmp_path / "deep.yaml"
    deep.write_text(f"drafter: {{type: medusa, head: {folder}}}\ntree: {{shape: chain, depth: 5}}\n")
    args = ["bench", "--prompts", prompts, "--config", str(deep), "--json", str(tmp_path / "o.json"),
            "--target", "no-such-model"]  # an unknown target would be the other error
    code, out, err = run_cli(args, capsys)
    assert code == 2 and err.count("\n") == 1 and "deep: tree depth 5 needs 5 Medusa heads" in err
    w = folder / "model.safetensors"
    w.write_bytes(w.read_bytes()[:100])
    deep.write_text(f"drafter: {{type: medusa, head: {folder}}}\ntree: {{shape: chain, depth: 2}}\n")
    code, out, err = run_cli(args, capsys)
    assert code == 2 and err.count("\n") == 1 and "model.safetensors: truncated or corrupt" in err


def test_sampled_children_carry_the_draft_distribution(model, target):
    heads = random_heads(model, 3, DV, "own")
    drafter = started(MedusaDrafter(target, heads, TreeShape("static", choices=CHOICES), sample=True), model)
    s = Sampling(temperature=4.0, top_p=0.95, generator=torch.Generator().manual_seed(0))
    tree = drafter.propose(3, s)
    assert tree.q is not None and tree.q.shape == (len(tree), V) and len(tree) == len(CHOICES) + 1
    q_heads = probs_from_logits(drafter.head_logits(), 4.0, 0.95)  # (3, Vd)
    depth, kids = tree.depth.tolist(), tree.children()
    for i in range(len(tree)):
        if not kids[i]:
            assert float(tree.q[i].sum()) == 0  # not expanded
            continue
        expect = torch.zeros(V).index_copy_(0, DV, q_heads[depth[i]])
        torch.testing.assert_close(tree.q[i], expect)
        assert all(float(tree.q[i, tree.tokens[c]]) > 0 for c in kids[i])
        assert len({int(tree.tokens[c]) for c in kids[i]}) == len(kids[i])  # without replacement
    # and a sampled generation runs through the exact verifier
    dec = TreeDecoder(target, drafter)
    out = dec.generate(prompt_ids(2), 30, temperature=0.8, top_p=0.9, seed=1)
    assert len(out.tokens) == 30
    again = dec.generate(prompt_ids(2), 30, temperature=0.8, top_p=0.9, seed=1)
    assert again.tokens == out.tokens


# ---- training ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def train_model():
    return make_tiny_train_model()


@pytest.fixture(scope="module")
def offline(tmp_path_factory, train_model):
    root = tmp_path_factory.mktemp("medusa-train")
    data, prompts = make_data(root, train_model)
    return root, data, prompts


def medusa_config(offline, name, **over):
    root, data, prompts = offline
    kw = dict(head="medusa", medusa_heads=3, medusa_lm_head="own")
    kw.update(over)
    return train_config(root, data, prompts, name, **kw)


def test_loss_matches_a_per_position_reference(offline, train_model):
    from eagle.train.data import ShardDataset
    from eagle.train.medusa import MedusaRecipe

    cfg = medusa_config(offline, "ref", medusa_decay=0.8)
    seqs = ShardDataset(cfg.data_dir).sequences[:4]
    recipe = MedusaRecipe(cfg, train_model, seqs, "cpu")
    heads = random_heads(train_model, 3, recipe.draft_vocab, "own")
    loss, count, hits = recipe.loss(heads, recipe.batch(seqs, [0, 1, 2, 3], 0, "cpu"))
    lm_w = recipe.lm_w
    ref, n, ref_hits = 0.0, 0, [0, 0, 0]
    with torch.no_grad():
        for s in seqs:
            f = s.hidden.float()
            for t in range(s.prompt_len - 1, len(f) - 3):
                n += 1
                logq = torch.log_softmax(heads(f[t], lm_w), -1)  # (3, Vd)
                for k in range(1, 4):
                    p = torch.softmax(f[t + k] @ lm_w.T, -1)
                    ref += 0.8 ** (k - 1) * float(-(p * logq[k - 1]).sum())
                    ref_hits[k - 1] += int(logq[k - 1].argmax() == p.argmax())
    assert int(count) == n
    assert float(loss) == pytest.approx(ref, rel=1e-4)
    assert [int(h) for h in hits] == ref_hits
    # held-out batches count hits against the target's top-1 over the FULL vocabulary
    _, _, full_hits = recipe.loss(heads, recipe.batch(seqs, [0, 1, 2, 3], 0, "cpu", train=False))
    W = train_model.get_output_embeddings().weight
    expect = [0, 0, 0]
    for s in seqs:
        f = s.hidden.float()
        for t in range(s.prompt_len - 1, len(f) - 3):
            top = heads(f[t], lm_w).argmax(-1)
            for k in range(1, 4):
                expect[k - 1] += int(int(recipe.draft_vocab[top[k - 1]]) == int((f[t + k] @ W.T).argmax()))
    assert [int(h) for h in full_hits] == expect


@pytest.mark.parametrize("lm_head", ["own", "shared"])
def test_training_lowers_the_loss_and_exports(offline, train_model, lm_head):
    from eagle.train.trainer import train

    cfg = medusa_config(offline, f"loss-{lm_head}", medusa_lm_head=lm_head, max_steps=30, eval_every=10)
    summary = train(cfg, model=train_model, progress=False)
    assert summary["steps"] == 30 and summary["train_sequences"] + summary["eval_sequences"] == N_SEQ
    losses = [e["loss"] for e in summary["eval"]]
    assert losses[-1] < losses[0] * 0.95, losses
    assert all(len(e["acc"]) == 3 for e in summary["eval"])
    heads = load_medusa(cfg.export, train_model)
    assert heads.config.lm_head == lm_head and heads.num_heads == 3 and heads.draft_vocab.numel() == 64
    names = set(exported(cfg))
    assert {"blocks.0.weight", "blocks.2.bias"} <= names and ("lm_heads.2.weight" in names) == (lm_head == "own")
    target = Target(train_model, "reference")
    dec = TreeDecoder(target, MedusaDrafter(target, heads, SHAPES["dynamic"]))
    p = prompt_ids(5)
    assert dec.generate(p, 30).tokens == plain_greedy(train_model, p, 30)


def test_trained_heads_draft_accepted_tokens(tmp_path):
    """Self-distilled data from the tiny target's own greedy answers: trained heads get drafts accepted."""
    from eagle.train.data import write_shard
    from eagle.train.trainer import train

    model = make_tiny_train_model(seed=3)
    seqs = [torch.tensor(plain_greedy(model, prompt_ids(100 + i, 4), 60)) for i in range(N_SEQ)]
    seqs = [torch.cat([prompt_ids(100 + i, 4), s]) for i, s in enumerate(seqs)]
    m = write_shard(tmp_path / "data", {"shards": [], "prompts_done": 0, "tokens": 0}, seqs,
                    [features(model, s) for s in seqs], [4] * N_SEQ, prompts_done=N_SEQ)
    assert m["tokens"] == 64 * N_SEQ
    prompts = write_prompt_lines(tmp_path / "p.jsonl", [json.dumps({"prompt": str(i)}) for i in range(N_SEQ)])
    cfg = train_config(tmp_path, tmp_path / "data", Path(prompts), "greedy", head="medusa", medusa_heads=2,
                       draft_vocab_size=0, max_steps=60, lr=1e-2)
    train(cfg, model=model, progress=False)
    target = Target(model, "reference")
    dec = TreeDecoder(target, MedusaDrafter(target, load_medusa(cfg.export, model), TreeShape("chain", depth=2)))
    p = prompt_ids(100, 4)  # a training prompt: its answer is what the heads learned
    out = dec.generate(p, 40)
    assert out.tokens == plain_greedy(model, p, 40)
    assert out.stats.tau > 1.3


def test_resume_after_interrupt_is_exact(offline, train_model, capsys):
    from eagle.train.trainer import train

    ref = medusa_config(offline, "resume-a", max_steps=6)
    train(ref, model=train_model, progress=False)
    cfg = medusa_config(offline, "resume-b", max_steps=6, checkpoint_every=2)

    def interrupt(step):
        if step == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train(cfg, model=train_model, progress=False, on_step=interrupt)
    seen = []
    capsys.readouterr()
    train(cfg, model=train_model, progress=False, on_step=seen.append)
    assert seen == [3, 4, 5, 6] and "resuming at step 2" in capsys.readouterr().err
    a, b = exported(ref), exported(cfg)
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=1e-6, rtol=0, msg=k)


@pytest.mark.parametrize("over, pattern", [
    ({"medusa_heads": 0}, "medusa_heads must be >= 1"),
    ({"medusa_lm_head": "tied"}, "medusa_lm_head must be 'own' or 'shared'"),
    ({"medusa_decay": 0.0}, r"medusa_decay must be in \(0, 1\]"),
    ({"extraction": "online"}, "head: medusa trains on the stored features"),
])
def test_train_config_errors(offline, over, pattern):
    with pytest.raises(ConfigError, match=pattern):
        medusa_config(offline, "bad", **over)


def test_shipped_training_config_reads_the_eagle_heads_data():
    from eagle.train.trainer import load_train_config

    medusa = load_train_config(ROOT / "experiments/configs/train-smollm2-medusa.yaml")
    eagle = load_train_config(ROOT / "experiments/configs/train-smollm2.yaml")
    assert medusa.head == "medusa" and medusa.data_tokens > 0 and medusa.export == "heads/smollm2-135m-medusa"
    for key in ("prompts", "extra_data", "num_prompts", "data_dir", "gen_batch_size", "gen_max_new_tokens",
                "gen_temperature", "feature_layers", "shard_prompts", "seed", "extraction"):
        assert getattr(medusa, key) == getattr(eagle, key), key


# ---- the shipped head on the real target ---------------------------------------------------------


@pytest.mark.slow
def test_shipped_head_greedy_identical(smollm2):
    model, _ = smollm2
    heads = load_medusa(ROOT / "heads/smollm2-135m-medusa", model)
    assert heads.config.target == "smollm2-135m" and heads.config.hidden_size == 576
    _, tau = shipped_config_mean_tau(smollm2, ROOT / "experiments/configs/medusa.yaml")
    assert tau > 1.2  # trained heads: drafts do get accepted



def test_head_info_describes_a_medusa_head(model, tmp_path, monkeypatch, capsys):
    import eagle.models
    from conftest import run_cli

    H, V_ = model.config.hidden_size, model.config.vocab_size
    folder = save_heads(tmp_path / "m", model, MedusaHeads(H, 3, V_))
    monkeypatch.setattr(eagle.models, "load_target", lambda name, **kw: (model, None))
    code, out, err = run_cli(["head-info", "--head", str(folder), "--target", "tiny"], capsys)
    assert code == 0, err
    assert "Medusa-1, 3 heads" in out and "LM head: shared" in out
