"""The EAGLE-3 head (eagle/heads/eagle3.py) and its drafting: official parameter names and shapes, the
d2t / t2d convention, the drafted tree's scores == the head run step by step (fused target layers for
the committed text, then its own outputs along each node's path), lossless greedy decoding, and the
checkpoint round trip.

Every model here is a tiny random 2-layer fp32 model; the head fuses ``hidden_states[0, 1, 2]``.
"""
from __future__ import annotations

import random

import pytest
import torch

from eagle import Target, TreeDecoder
from eagle.config import config_from_dict
from eagle.draft import NoDrafter, TreeShape
from eagle.heads import HeadConfig, load_head, save_head
from eagle.heads.drafter import EagleDrafter
from eagle.heads.eagle3 import Eagle3Head, default_feature_layers, vocab_maps

from conftest import TINY_VOCAB, causal_mask, make_tiny_head_target

V = TINY_VOCAB
LAYERS = (0, 1, 2)  # embeddings, after layer 0, after the final norm (a 2-layer target)
STATIC = [[0], [1], [2], [0, 0], [0, 1], [1, 0], [0, 0, 0], [0, 0, 1], [0, 1, 0]]
SHAPES = [TreeShape(shape="dynamic", depth=3, top_k=3, total_tokens=8), TreeShape(shape="static", choices=STATIC)]


def random_eagle3(model, seed: int = 1, draft_ids=None, scale: float = 0.1) -> Eagle3Head:
    torch.manual_seed(seed)
    head = Eagle3Head.for_target(model, draft_ids, LAYERS)
    with torch.no_grad():
        for name, p in head.named_parameters():
            p.add_(torch.randn_like(p) * scale)
    return head.eval()


def test_official_names_and_shapes():
    model = make_tiny_head_target("llama")
    H = model.config.hidden_size
    ids = torch.tensor(sorted(random.Random(0).sample(range(V), 40)))
    head = Eagle3Head.for_target(model, ids, LAYERS)
    shapes = {k: tuple(v.shape) for k, v in head.state_dict().items() if not k.startswith("rotary.")}
    q_out = model.model.layers[0].self_attn.q_proj.out_features
    kv_out = model.model.layers[0].self_attn.k_proj.out_features
    assert shapes["fc.weight"] == (H, 3 * H) and "fc.bias" not in shapes
    assert shapes["midlayer.self_attn.q_proj.weight"] == (q_out, 2 * H)
    assert shapes["midlayer.self_attn.k_proj.weight"] == (kv_out, 2 * H)
    assert shapes["midlayer.self_attn.v_proj.weight"] == (kv_out, 2 * H)
    assert shapes["midlayer.self_attn.o_proj.weight"] == (H, q_out)
    for norm in ("midlayer.input_layernorm.weight", "midlayer.hidden_norm.weight",
                 "midlayer.post_attention_layernorm.weight", "norm.weight"):
        assert shapes[norm] == (H,)
    assert shapes["lm_head.weight"] == (40, H) and shapes["d2t"] == (40,) and shapes["t2d"] == (V,)
    # the draft LM head starts as the target's rows of the draft vocabulary
    assert torch.equal(head.lm_head.weight, model.get_output_embeddings().weight[ids])
    assert default_feature_layers(30) == (2, 15, 27) and default_feature_layers(32) == (2, 16, 29)


def test_d2t_t2d_convention():
    ids = torch.tensor([3, 7, 8, 20])
    d2t, t2d = vocab_maps(ids, 25)
    assert d2t.tolist() == [3, 6, 6, 17]  # target id = draft id + d2t[draft id]
    assert torch.equal(torch.arange(4) + d2t, ids)
    assert t2d.nonzero()[:, 0].tolist() == [3, 7, 8, 20] and t2d.dtype == torch.bool
    assert torch.equal(torch.arange(25)[t2d], ids)  # t2d selects the draft vocabulary in target order


class CheckedEagle3(EagleDrafter):
    """Checks every drafted tree against a step-by-step recomputation without cache or tree mask."""

    def reset(self, prompt_ids):
        super().reset(prompt_ids)
        self.checked = 0

    def propose(self, root, sampling):
        tree = super().propose(root, sampling)
        check_scores(self, tree)
        self.checked += 1
        return tree


def check_scores(dr: EagleDrafter, tree) -> None:
    n = dr.cache.get_seq_length()
    text, nxt = torch.tensor(dr.history[:n]), torch.tensor(dr.history[1: n + 1])
    toks, par = tree.tokens.tolist(), tree.parents.tolist()
    head = dr.head
    with torch.no_grad():
        hs = dr.target.base(input_ids=text[None], output_hidden_states=True).hidden_states
        fused = head.enter(torch.cat([hs[i] for i in head.feature_layers], -1))  # (1, n, H)
        pred = {}
        for node in range(len(tree)):
            path = tree.path_to(node)
            h, x = fused, nxt
            for depth, a in enumerate(path[1:], start=1):  # own outputs feed the next step
                out = head(h, dr.target.embed(x)[None], torch.arange(len(x))[None], causal_mask(1, len(x)))
                h = torch.cat([h, out[:, -1:]], dim=1)
                x = torch.cat([x, torch.tensor([toks[a]])])
            out = head(h, dr.target.embed(x)[None], torch.arange(len(x))[None], causal_mask(1, len(x)))
            pred[node] = out[0, -1]
        ids = head.draft_ids.tolist()
        col = {t: i for i, t in enumerate(ids)}
        for node in range(1, len(tree)):
            logq = torch.log_softmax(head.lm_head(head.norm(pred[par[node]])).float(), dim=-1)
            want = float(tree.scores[par[node]]) + float(logq[col[toks[node]]])
            assert float(tree.scores[node]) == pytest.approx(want, abs=1e-3, rel=1e-4), node


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
@pytest.mark.parametrize("shape", SHAPES, ids=["dynamic", "static"])
def test_drafts_match_stepwise_recomputation_and_decoding_is_lossless(arch, shape):
    model = make_tiny_head_target(arch)
    target = Target(model, "reference")
    ids = torch.tensor(sorted(random.Random(5).sample(range(V), 48)))
    head = random_eagle3(model, seed=2, draft_ids=ids)
    dr = CheckedEagle3(target, head, shape)
    assert dr.feature_layers == LAYERS
    prompt = torch.randint(0, V, (10,), generator=torch.Generator().manual_seed(4))
    out = TreeDecoder(target, dr).generate(prompt, 20)
    plain = TreeDecoder(target, NoDrafter()).generate(prompt, 20)
    assert out.tokens == plain.tokens
    assert dr.checked == out.stats.target_forwards
    assert all(t in set(ids.tolist()) for t in dr.d2t.tolist())


def test_bfloat16_drafting_stays_lossless():
    model = make_tiny_head_target("llama")
    target = Target(model, "reference")
    head = random_eagle3(model, seed=3)
    dr = EagleDrafter(target, head, SHAPES[0], dtype=torch.bfloat16)
    assert dr.head is not head and dr.head.fc.weight.dtype == torch.bfloat16 and head.fc.weight.dtype == torch.float32
    prompt = torch.randint(0, V, (9,), generator=torch.Generator().manual_seed(1))
    assert TreeDecoder(target, dr).generate(prompt, 16).tokens == TreeDecoder(target, NoDrafter()).generate(prompt, 16).tokens


@pytest.mark.parametrize("backend", ["eager", "cpu"])
def test_int8_drafting_stays_lossless(backend):
    """Weight-only int8 (eagle/heads/int8.py) on an EAGLE-3 head: its fc and layer quantized, its own
    LM head the quantized draft LM head (left a float layer in the copy); greedy stays lossless."""
    from eagle.backends.cpu import CpuBackend
    from eagle.backends.eager import EagerBackend
    from eagle.heads.int8 import Int8Linear, quantize_rows

    model = make_tiny_head_target("llama")
    target = Target(model, "reference", backend=EagerBackend() if backend == "eager" else CpuBackend())
    head = random_eagle3(model, seed=3)
    dr = EagleDrafter(target, head, SHAPES[0], int8=True)
    assert isinstance(dr.head.fc, Int8Linear) and type(dr.head.lm_head) is torch.nn.Linear and type(head.fc) is torch.nn.Linear
    x = torch.randn(3, head.lm_head.in_features)
    q, scale = quantize_rows(head.lm_head.weight)
    torch.testing.assert_close(dr._project(x), x @ (q.float() * scale[:, None]).T, atol=0.05, rtol=0.02)
    prompt = torch.randint(0, V, (9,), generator=torch.Generator().manual_seed(1))
    assert TreeDecoder(target, dr).generate(prompt, 16).tokens == TreeDecoder(target, NoDrafter()).generate(prompt, 16).tokens


def test_checkpoint_round_trip_and_drafter_type(tmp_path):
    model = make_tiny_head_target("llama")
    tcfg = model.config
    ids = torch.tensor(sorted(random.Random(1).sample(range(V), 30)))
    head = random_eagle3(model, seed=4, draft_ids=ids)
    cfg = HeadConfig(target="tiny", model_type=tcfg.model_type, hidden_size=tcfg.hidden_size, vocab_size=V,
                     type="eagle3", feature_layers=list(LAYERS))
    save_head(head, tmp_path / "h", cfg, dtype=torch.float16)
    back = load_head(tmp_path / "h", model)
    assert isinstance(back, Eagle3Head) and back.feature_layers == LAYERS
    assert torch.equal(back.d2t, head.d2t) and torch.equal(back.t2d, head.t2d)
    for k, v in head.state_dict().items():
        if v.is_floating_point():
            torch.testing.assert_close(back.state_dict()[k], v.half().float(), atol=0, rtol=0)
    target = Target(model, "reference")
    conf = config_from_dict({"drafter": {"type": "eagle3", "head": str(tmp_path / "h")},
                             "tree": {"shape": "dynamic", "depth": 3, "top_k": 3, "total_tokens": 8}}, tmp_path / "c.yaml")
    assert isinstance(conf.build_drafter(target), EagleDrafter)
    conf.drafter.type = "eagle"
    with pytest.raises(ValueError, match="eagle3 head: use drafter type 'eagle3'"):
        conf.build_drafter(target)
    (tmp_path / "h" / "config.json").write_text((tmp_path / "h" / "config.json").read_text().replace(
        '"feature_layers": [0, 1, 2]', '"feature_layers": [0, 1, 9]'))
    from eagle.heads import HeadMismatchError

    with pytest.raises(HeadMismatchError, match=r"reads target layers \[9\]"):
        load_head(tmp_path / "h", model)


def test_head_info_describes_an_eagle3_head(tmp_path, monkeypatch, capsys):
    import eagle.models

    from conftest import run_cli

    model = make_tiny_head_target("llama")
    ids = torch.arange(0, V, 2)
    head = random_eagle3(model, seed=5, draft_ids=ids)
    save_head(head, tmp_path / "h", HeadConfig(target="tiny", model_type="llama", hidden_size=model.config.hidden_size,
                                               vocab_size=V, type="eagle3", feature_layers=list(LAYERS)))
    monkeypatch.setattr(eagle.models, "load_target", lambda name, **kw: (model, None))
    code, out, err = run_cli(["head-info", "--head", str(tmp_path / "h"), "--target", "tiny"], capsys)
    assert code == 0, err
    assert "EAGLE-3 head fusing target layers [0, 1, 2]" in out
    assert f"draft vocabulary: {len(ids)} tokens" in out
