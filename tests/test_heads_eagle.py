"""The EAGLE draft head itself (eagle/heads/eagle.py): shapes and parameters, causal and tree mask semantics;
its checkpoint in our layout (eagle/heads/formats.py): round trips, and one-line errors for folders that
are not (or not quite) a head.

Every model here is a tiny random fp32 model (``make_tiny_head_target`` in conftest.py; no downloads,
no real weights).
"""
from __future__ import annotations

import json
import random
import shutil

import pytest
import torch

from eagle.heads import (DraftHead, HeadConfig, HeadError, HeadMismatchError, HeadNotFoundError, load_head,
                        read_head_config, save_head)
from eagle.tree import Tree

from conftest import TINY_HIDDEN, TINY_VOCAB, causal_mask, make_tiny_head_target, random_head, random_parents_py

V = TINY_VOCAB
H = TINY_HIDDEN
ARCHS = ("llama", "qwen2", "qwen3", "mistral")


# ------------------------------------------------------------------------------------------------
# 1. construction and shapes
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ARCHS)
def test_for_target_shapes_and_parameters(arch):
    model = make_tiny_head_target(arch)
    head = DraftHead.for_target(model).eval()
    assert isinstance(head.layer, type(model.model.layers[0]))
    assert isinstance(head.layer.input_layernorm, torch.nn.Identity)
    assert head.hidden_size == H
    B, T = 2, 7
    g = torch.Generator().manual_seed(0)
    feats, embeds = torch.randn(B, T, H, generator=g), torch.randn(B, T, H, generator=g)
    pos = torch.arange(T)[None].expand(B, T)
    with torch.no_grad():
        out = head(feats, embeds, pos, causal_mask(B, T))
    assert out.shape == (B, T, H) and out.dtype == torch.float32
    assert torch.isfinite(out).all()

    # the target's embedding and LM head are shared, never stored
    sd = head.state_dict()
    assert all(k.startswith(("fc.", "layer.")) or k == "draft_vocab" for k in sd), sorted(sd)
    shared_w = (model.get_input_embeddings().weight, model.get_output_embeddings().weight)
    assert not any(v.shape == w.shape and torch.equal(v, w) for v in sd.values() for w in shared_w)
    shared = {w.data_ptr() for w in shared_w}
    assert not any(p.data_ptr() in shared for p in head.parameters())
    n_layer = sum(p.numel() for p in model.model.layers[0].parameters())
    n_norm = model.model.layers[0].input_layernorm.weight.numel()
    assert sum(p.numel() for p in head.parameters()) == (2 * H * H + H) + n_layer - n_norm
    assert torch.equal(head.lm_weight(model.get_output_embeddings()), model.get_output_embeddings().weight)

    dv = torch.tensor(sorted(random.Random(0).sample(range(V), 40)))
    head_dv = DraftHead.for_target(model, dv)
    w = head_dv.lm_weight(model.get_output_embeddings())
    assert w.shape == (40, H)
    assert torch.equal(w, model.get_output_embeddings().weight[dv])
    assert torch.equal(head_dv.draft_vocab, dv)


# ------------------------------------------------------------------------------------------------
# 2. mask semantics
# ------------------------------------------------------------------------------------------------


def _perturbed_outputs(head, feats, embeds, pos, mask):
    """Output with every position j perturbed in turn: ``(T, T, H)`` with ``[j, i]`` = output i."""
    T = feats.shape[1]
    g = torch.Generator().manual_seed(123)
    outs = []
    with torch.no_grad():
        for j in range(T):
            f, e = feats.clone(), embeds.clone()
            f[0, j] += torch.randn(H, generator=g)
            e[0, j] += torch.randn(H, generator=g)
            outs.append(head(f, e, pos, mask)[0])
    return torch.stack(outs)


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_causal_mask_semantics(arch):
    model = make_tiny_head_target(arch)
    head = random_head(model)
    T = 9
    g = torch.Generator().manual_seed(1)
    feats, embeds = torch.randn(1, T, H, generator=g), torch.randn(1, T, H, generator=g)
    pos = torch.arange(T)[None]
    with torch.no_grad():
        base = head(feats, embeds, pos, causal_mask(1, T))[0]
    pert = _perturbed_outputs(head, feats, embeds, pos, causal_mask(1, T))
    for j in range(T):
        diff = (pert[j] - base).abs().amax(-1)  # (T,)
        for i in range(T):
            if i < j:
                assert diff[i] < 1e-6, (i, j, float(diff[i]))
            else:
                assert diff[i] > 1e-4, (i, j, float(diff[i]))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_tree_mask_semantics(seed):
    model = make_tiny_head_target("llama")
    head = random_head(model)
    rng = random.Random(seed)
    T = 11
    tree = Tree.from_lists([0] * T, random_parents_py(T, rng))
    anc = tree.ancestor_mask()  # (T, T): [i, j] = j is i or an ancestor of i
    assert not anc.all()  # some non-ancestors to perturb
    g = torch.Generator().manual_seed(seed)
    feats, embeds = torch.randn(1, T, H, generator=g), torch.randn(1, T, H, generator=g)
    pos = tree.depth[None]
    mask = anc[None, None]
    with torch.no_grad():
        base = head(feats, embeds, pos, mask)[0]
    pert = _perturbed_outputs(head, feats, embeds, pos, mask)
    for j in range(T):
        diff = (pert[j] - base).abs().amax(-1)
        for i in range(T):
            if anc[i, j]:
                assert diff[i] > 1e-4, (i, j)
            else:
                assert diff[i] < 1e-6, (i, j, float(diff[i]))
    # and a node's output equals a plain causal forward over its root-to-node path
    for i in range(T):
        path = tree.path_to(i)
        with torch.no_grad():
            alone = head(feats[:, path], embeds[:, path], torch.arange(len(path))[None], causal_mask(1, len(path)))[0, -1]
        torch.testing.assert_close(alone, base[i], atol=1e-5, rtol=1e-5)


# ------------------------------------------------------------------------------------------------
# 3. checkpoints
# ------------------------------------------------------------------------------------------------


def _head_config(model, draft_vocab=()) -> HeadConfig:
    c = model.config
    return HeadConfig(target="tiny", model_type=c.model_type, hidden_size=c.hidden_size,
                      vocab_size=c.vocab_size, draft_vocab=list(draft_vocab))


@pytest.mark.parametrize("with_dv", [False, True])
def test_checkpoint_round_trip(tmp_path, with_dv):
    model = make_tiny_head_target("qwen3")
    dv = torch.tensor(sorted(random.Random(2).sample(range(V), 50))) if with_dv else None
    head = random_head(model, seed=7, draft_vocab=dv)
    folder = tmp_path / "head"
    save_head(DraftHead.for_target(model), folder, _head_config(model))  # then overwrite it
    save_head(head, folder, _head_config(model, [] if dv is None else dv.tolist()))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["head"]  # no temp/old folders left behind
    loaded = load_head(folder, model)
    assert not loaded.training
    assert torch.equal(loaded.draft_vocab, head.draft_vocab)
    sd1, sd2 = head.state_dict(), loaded.state_dict()
    assert sd1.keys() == sd2.keys()
    for k in sd1:
        assert torch.equal(sd1[k], sd2[k]), k
    g = torch.Generator().manual_seed(0)
    T = 6
    f, e = torch.randn(2, T, H, generator=g), torch.randn(2, T, H, generator=g)
    pos = torch.arange(T)[None].expand(2, T)
    with torch.no_grad():
        assert torch.equal(head(f, e, pos, causal_mask(2, T)), loaded(f, e, pos, causal_mask(2, T)))
    lm = model.get_output_embeddings()
    assert torch.equal(head.lm_weight(lm), loaded.lm_weight(lm))


def test_checkpoint_half_precision_storage(tmp_path):
    """A float16 export is half the size and loads back (as float32) to the rounded weights."""
    model = make_tiny_head_target("llama")
    head = random_head(model, seed=3)
    save_head(head, tmp_path / "fp32", _head_config(model))
    save_head(head, tmp_path / "fp16", _head_config(model), dtype=torch.float16)
    size = lambda d: (tmp_path / d / "model.safetensors").stat().st_size
    assert size("fp16") < 0.6 * size("fp32")
    loaded = load_head(tmp_path / "fp16", model)
    for k, v in head.state_dict().items():
        assert loaded.state_dict()[k].dtype == v.dtype
        assert torch.equal(loaded.state_dict()[k], v.half().to(v.dtype)), k


def test_checkpoint_mismatch_raises(tmp_path):
    model = make_tiny_head_target("llama")
    folder = tmp_path / "head"
    save_head(random_head(model), folder, _head_config(model))
    with pytest.raises(HeadMismatchError, match=r"hidden size 64.*32"):
        load_head(folder, make_tiny_head_target("llama", hidden=32))
    with pytest.raises(HeadMismatchError, match=r"vocabulary of 128.*96"):
        load_head(folder, make_tiny_head_target("llama", vocab=96))
    with pytest.raises(HeadMismatchError, match=r"'llama'.*'qwen2'"):
        load_head(folder, make_tiny_head_target("qwen2"))
    with pytest.raises(FileNotFoundError):
        load_head(tmp_path / "nope", model)
    load_head(folder, model)  # the right target still loads


def _edit_config(change):
    """A breaker that rewrites config.json with ``change(cfg dict)`` applied."""
    def edit(folder):
        cfg = json.loads((folder / "config.json").read_text())
        change(cfg)
        (folder / "config.json").write_text(json.dumps(cfg))
    return edit


def _write_config(text: str):
    return lambda folder: (folder / "config.json").write_text(text) and None


# each breaker spoils a saved head folder in one way (returning the path to load when it is not the
# folder itself); the error is one line naming the folder or file
NOT_A_HEAD = {
    "no folder": (shutil.rmtree, r"no head checkpoint at \S+/head: no such folder"),
    "a file": (lambda f: f / "model.safetensors", r"head/model\.safetensors: not a folder"),
    "no config": (lambda f: (f / "config.json").unlink(), r"head: not an EAGLE head \(no config\.json"),
    "no weights": (lambda f: (f / "model.safetensors").unlink(), r"head: no model\.safetensors"),
    "invalid json": (_write_config('{"target": "tiny",'), r"head/config\.json: not valid JSON \(Expecting"),
    "not an object": (_write_config("[1, 2]"), r"head/config\.json: expected a JSON object, got a list"),
    "missing keys": (_edit_config(lambda c: [c.pop("target"), c.pop("vocab_size")]),
                     r"head: not an EAGLE head \(config\.json has no 'target', 'vocab_size'\)$"),
    "unknown key": (_edit_config(lambda c: c.update(hidden=3)), r"head/config\.json: unknown keys \['hidden'\]"),
    "wrong type": (_edit_config(lambda c: c.update(hidden_size="64")),
                   r"head/config\.json: 'hidden_size' must be an integer, got \"64\""),
    "bad draft vocab": (_edit_config(lambda c: c.update(draft_vocab=[1, V])),
                        r"head/config\.json: 'draft_vocab' must hold token ids in \[0, 128\)"),
}


@pytest.mark.parametrize("case", list(NOT_A_HEAD))
def test_not_a_head_is_a_clear_error(tmp_path, case):
    model = make_tiny_head_target("llama")
    folder = tmp_path / "head"
    save_head(random_head(model), folder, _head_config(model))
    breaker, message = NOT_A_HEAD[case]
    path = breaker(folder) or folder
    with pytest.raises(HeadError, match=message) as err:
        load_head(path, model)
    assert "\n" not in str(err.value)
    assert isinstance(err.value, HeadNotFoundError) == (case == "no folder")
    if case == "no folder":
        assert isinstance(err.value, FileNotFoundError)  # what it raised before HeadError existed


def test_causal_lm_and_draft_model_folders_are_named_as_such(tmp_path):
    """A model folder passed as a head says what it is and which drafter type takes it."""
    from eagle.draft_model import build_draft_model, save_draft_model

    model = make_tiny_head_target("llama")
    model.save_pretrained(tmp_path / "lm")
    with pytest.raises(HeadError, match=r"lm: not an EAGLE head \(config\.json has no 'target'\); it looks like a "
                                        r"causal LM folder \(LlamaForCausalLM\): use drafter type 'model'"):
        load_head(tmp_path / "lm", model)
    save_draft_model(build_draft_model(model, [0]), tmp_path / "draft", "tiny")
    with pytest.raises(HeadError, match=r"draft: not an EAGLE head .*made by `eagle distill`: use it with drafter "
                                        r"type 'model'"):
        load_head(tmp_path / "draft", model)


def test_shipped_draft_model_is_not_a_head():
    """The shipped distilled draft model, given where a head is expected (no model is loaded)."""
    with pytest.raises(HeadError, match=r"draft-models/smollm2-135m-3l: not an EAGLE head .*drafter type 'model'"):
        read_head_config("draft-models/smollm2-135m-3l")


@pytest.mark.parametrize("cut", ["half", "header", "empty", "garbage"])
def test_truncated_or_corrupt_weights_are_a_clear_error(tmp_path, cut):
    model = make_tiny_head_target("llama")
    folder = tmp_path / "head"
    save_head(random_head(model), folder, _head_config(model))
    weights = folder / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes({"half": data[: len(data) // 2], "header": data[:6], "empty": b"",
                         "garbage": b"this is not a safetensors file"}[cut])
    with pytest.raises(HeadError, match=r"head/model\.safetensors: truncated or corrupt, not a readable safetensors "
                                        r"file \(") as err:
        load_head(folder, model)
    assert "\n" not in str(err.value)


def test_weights_of_another_shape_are_a_mismatch(tmp_path):
    """A config.json that fits the target over weights that do not (e.g. copied from another head)."""
    small, model = make_tiny_head_target("llama", hidden=32), make_tiny_head_target("llama")
    save_head(random_head(small), tmp_path / "small", _head_config(small))
    save_head(random_head(model), tmp_path / "head", _head_config(model))
    (tmp_path / "head" / "model.safetensors").write_bytes((tmp_path / "small" / "model.safetensors").read_bytes())
    with pytest.raises(HeadMismatchError, match=r"head \S+/head does not match the target's layer: .*size mismatch "
                                                r"for fc\.weight"):
        load_head(tmp_path / "head", model)


def test_public_api_names():
    import eagle

    assert eagle.DraftHead is DraftHead and eagle.load_head is load_head
