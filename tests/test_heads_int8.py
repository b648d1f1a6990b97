"""Weight-only int8 drafting (eagle/heads/int8.py, ``drafter.dtype: int8``): the quantization, the
CPU backend's int8 product against the dequantizing reference on random shapes, an int8 drafter
that drafts what the dequantized float head computes one pair at a time (random trees), and greedy
decoding with it staying lossless."""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from eagle import Target, TreeDecoder
from eagle.backends.cpu import CpuBackend
from eagle.backends.eager import EagerBackend
from eagle.draft import TreeShape
from eagle.heads.drafter import EagleDrafter
from eagle.heads.int8 import Int8Linear, int8_copy, int8_linear_reference, quantize_rows

from conftest import TINY_VOCAB as V, bigram_head, make_tiny_head_target, random_head
from test_heads_drafter import STATIC, CheckedDrafter, check_head_cache, path_features


def test_quantize_rows_round_trips_within_half_a_step():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(37, 80, generator=g) * torch.rand(37, 1, generator=g) * 3
    w[5] = 0  # an all-zero row
    q, scale = quantize_rows(w)
    assert q.dtype == torch.int8 and q.shape == w.shape and scale.shape == (37,)
    assert int(q.abs().max()) == 127 and scale[5] == 1 and not q[5].any()
    assert ((q.float() * scale[:, None] - w).abs() <= scale[:, None] / 2 + 1e-6).all()
    assert torch.equal(q.abs().amax(1)[w.abs().amax(1) > 0], torch.full((36,), 127, dtype=torch.int8))


@pytest.mark.parametrize("T,K,N", [(1, 64, 32), (3, 576, 40), (5, 48, 7), (16, 128, 300),
                                   (3, 72, 16), (2, 65, 9), (4, 40, 16)])  # the last three: K % 16 != 0
def test_cpu_int8_product_matches_the_reference(T, K, N):
    """The CPU backend's product (torch's int8 kernel, bf16 activations) == dequantize-then-multiply
    with the activations rounded to bf16, within bf16's output rounding; inner sizes the kernel
    gets wrong (not a multiple of 16) take the reference itself."""
    g = torch.Generator().manual_seed(T * 1000 + K + N)
    x, w = torch.randn(T, K, generator=g), torch.randn(N, K, generator=g)
    q, scale = quantize_rows(w)
    got = CpuBackend().int8_linear(x, q, scale)
    assert got.dtype == torch.float32 and got.shape == (T, N)
    if K % 16:
        assert torch.equal(got, int8_linear_reference(x, q, scale))
        return
    want = int8_linear_reference(x.bfloat16().float(), q, scale.bfloat16().float())
    torch.testing.assert_close(got, want, atol=1e-2 * float(want.abs().max()), rtol=1e-2)
    assert torch.equal(EagerBackend().int8_linear(x, q, scale), int8_linear_reference(x, q, scale))


def test_int8_linear_is_the_dequantized_linear():
    torch.manual_seed(1)
    lin = nn.Linear(32, 24)
    m = Int8Linear(lin)
    x = torch.randn(2, 3, 32)  # (B, T, K)
    deq = lin.weight.detach().clone()
    q, scale = quantize_rows(deq)
    want = torch.nn.functional.linear(x, q.float() * scale[:, None], lin.bias)
    torch.testing.assert_close(m(x), want, atol=1e-5, rtol=1e-5)
    assert m(x).shape == (2, 3, 24)


def dequantized(head: nn.Module) -> nn.Module:
    """A float copy of ``head`` whose linear weights are their int8 round trip (what an int8
    drafter's products multiply by)."""
    ref = copy.deepcopy(head)
    with torch.no_grad():
        for m in ref.modules():
            if type(m) is nn.Linear:
                q, scale = quantize_rows(m.weight)
                m.weight.copy_(q.float() * scale[:, None])
    return ref


class CheckedInt8(CheckedDrafter):
    """An int8 drafter checked after every step against the dequantized float head (its head cache)
    and the dequantized head and LM head run one pair at a time (every drafted score)."""

    def __init__(self, target, head, shape, tol):
        EagleDrafter.__init__(self, target, head, shape, int8=True)
        self.ref_head, self.tol = dequantized(head), tol
        q, scale = quantize_rows(target.lm_head.weight)  # per row: the same rows as the draft vocabulary's
        self.ref_lm = q.float() * scale[:, None]  # (V, H)

    def propose(self, root, sampling):
        tree = EagleDrafter.propose(self, root, sampling)
        check_head_cache(self)
        torch.testing.assert_close(tree.scores, ref_scores(self, tree), atol=10 * self.tol, rtol=10 * self.tol)
        return tree


def ref_scores(dr, tree) -> torch.Tensor:
    """Each node's cumulative draft log-prob from ``dr.ref_head`` and ``dr.ref_lm``, one pair at a time."""
    pred = path_features(dr, tree)
    toks, par = tree.tokens.tolist(), tree.parents.tolist()
    out = torch.zeros(len(tree))
    with torch.no_grad():
        for node in range(1, len(tree)):
            out[node] = out[par[node]] + torch.log_softmax(pred[par[node]] @ dr.ref_lm.T, dim=-1)[toks[node]]
    return out


@pytest.mark.parametrize("backend", ["eager", "cpu"])
@pytest.mark.parametrize("shape", [TreeShape("dynamic", depth=4, top_k=3, total_tokens=10),
                                   TreeShape("static", choices=STATIC), TreeShape("auto", depth=4, top_k=3, total_tokens=10)],
                         ids=["dynamic", "static", "auto"])
def test_int8_drafter_drafts_what_the_dequantized_head_computes(shape, backend):
    """Exact up to float rounding through the reference product, within bf16 rounding through the
    CPU kernel. The caller's head is left untouched; decoding stays lossless."""
    model = make_tiny_head_target("llama")
    target = Target(model, "reference", backend=EagerBackend() if backend == "eager" else CpuBackend())
    head = random_head(model, seed=3)
    before = {k: v.clone() for k, v in head.state_dict().items()}
    dr = CheckedInt8(target, head, shape, tol=1e-4 if backend == "eager" else 0.05)
    assert dr.int8 and any(isinstance(m, Int8Linear) for m in dr.head.modules())
    assert not any(type(m) is nn.Linear for m in dr.head.modules())
    prompt = torch.randint(0, V, (30,), generator=torch.Generator().manual_seed(5))
    out = TreeDecoder(target, dr).generate(prompt, 24)
    assert dr.checked == out.stats.target_forwards >= 3
    assert out.tokens == TreeDecoder(target, None).generate(prompt, 24).tokens
    assert all(torch.equal(v, head.state_dict()[k]) for k, v in before.items())


@pytest.mark.parametrize("shape", ["dynamic", "static", "chain"])
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_greedy_int8_drafting_is_lossless(arch, shape):
    model = make_tiny_head_target(arch)
    target = Target(model, "reference", backend=CpuBackend())
    shapes = {"dynamic": TreeShape("dynamic", depth=4, top_k=3, total_tokens=10),
              "static": TreeShape("static", choices=STATIC), "chain": TreeShape("chain", depth=4)}
    accepted = 0
    for seed, n in ((0, 5), (1, 13)):
        prompt = torch.randint(0, V, (n,), generator=torch.Generator().manual_seed(seed))
        out = TreeDecoder(target, EagleDrafter(target, bigram_head(model), shapes[shape], int8=True)).generate(prompt, 40)
        assert out.tokens == TreeDecoder(target, None).generate(prompt, 40).tokens
        accepted += out.stats.new_tokens - 1 - out.stats.target_forwards
    assert accepted >= 5  # the int8 head's drafts are still accepted


def test_config_dtype_int8_builds_an_int8_drafter(tmp_path, monkeypatch):
    from eagle.config import ConfigError, config_from_dict

    model = make_tiny_head_target("llama")
    target = Target(model, "reference")
    head = random_head(model, seed=3)
    (tmp_path / "head").mkdir()
    monkeypatch.setattr("eagle.heads.load_head", lambda path, model: head)
    tree = {"shape": "dynamic", "depth": 3, "top_k": 2, "total_tokens": 6}
    for kind in ("eagle", "hybrid"):
        cfg = config_from_dict({"drafter": {"type": kind, "head": "head", "dtype": "int8"}, "tree": tree},
                               tmp_path / "int8.yaml")
        drafter = cfg.build_drafter(target)
        assert drafter.int8 and drafter.dtype == torch.float32
        assert any(isinstance(m, Int8Linear) for m in drafter.head.modules())
    with pytest.raises(ConfigError, match=r"drafter.dtype must be one of .*'int8'.*got 'int4'"):
        config_from_dict({"drafter": {"type": "eagle", "head": "head", "dtype": "int4"}, "tree": tree}, tmp_path / "x.yaml")


def test_int8_copy_shares_everything_but_the_linears():
    model = make_tiny_head_target("llama")
    head = random_head(model, seed=2)
    twin = int8_copy(head)
    assert twin.layer.post_attention_layernorm.weight is head.layer.post_attention_layernorm.weight
    assert type(head.fc) is nn.Linear and isinstance(twin.fc, Int8Linear)
