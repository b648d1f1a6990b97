"""eagle/attention.py: grouped-query SDPA with the query heads folded (against transformers' own SDPA
attention, which copies K/V to every query head) and the Target's parameter-sharing attention view;
eagle/backends/cpu/attention.py: the CPU backend's form of it, which sends small masked calls to
the CPU extension's op."""
from __future__ import annotations

import types

import pytest
import torch
from conftest import make_random_tree, make_tiny_model
from transformers.integrations import sdpa_attention

from eagle_kernels import cpu_attention

from eagle.attention import FOLD_BELOW, GQA_SDPA, attention_view, folds_gqa, gqa_sdpa, register_gqa_sdpa
from eagle.backends.cpu import CpuBackend
from eagle.backends.cpu.attention import CPU_SDPA, cpu_sdpa
from eagle.backends.eager import EagerBackend
from eagle.runtime import RuntimeConfig
from eagle.target import Target

BACKENDS = {"eager": (EagerBackend, GQA_SDPA), "cpu": (CpuBackend, CPU_SDPA)}  # name -> (class, implementation)


def _inputs(B, Hkv, groups, T, P, D, gen, batch_mask=False):
    """Random query/key/value and a boolean mask: every query sees the P prefix keys and its
    ancestors in a random tree of T nodes (keys ``[prefix | tree]``)."""
    q = torch.randn(B, T, Hkv * groups, D, generator=gen).transpose(1, 2)  # (B, Hq, T, D), as the models make it
    k = torch.randn(B, Hkv, P + T, D, generator=gen)
    v = torch.randn(B, Hkv, P + T, D, generator=gen)
    masks = []
    for _ in range(B if batch_mask else 1):
        anc = make_random_tree(T, 50, gen).ancestor_mask()  # (T, T)
        masks.append(torch.cat([torch.ones(T, P, dtype=torch.bool), anc], dim=1))  # (T, P+T)
    return q, k, v, torch.stack(masks)[:, None]  # mask (B|1, 1, T, P+T)


@pytest.mark.parametrize("groups", [1, 2, 3])
@pytest.mark.parametrize("T", [1, 2, 7, 16, 63, 64])
@pytest.mark.parametrize("B,batch_mask", [(1, False), (2, False), (2, True)])
def test_gqa_sdpa_equals_transformers_sdpa(groups, T, B, batch_mask):
    gen = torch.Generator().manual_seed(groups * 100 + T * 10 + B)
    q, k, v, mask = _inputs(B, 3, groups, T, 29, 16, gen, batch_mask)
    module = types.SimpleNamespace(num_key_value_groups=groups, is_causal=True)
    out, _ = gqa_sdpa(module, q, k, v, mask, scaling=0.3)
    ref, _ = sdpa_attention.sdpa_attention_forward(module, q, k, v, mask, scaling=0.3)
    assert out.shape == ref.shape == (B, T, 3 * groups, 16)
    torch.testing.assert_close(out, ref, atol=1e-6, rtol=1e-5)


def test_gqa_sdpa_folds_trees_and_hands_the_rest_to_transformers(monkeypatch):
    def no_cpu_op(*a, **kw):
        raise AssertionError("gqa_sdpa (the eager backend's) never takes the CPU op")

    monkeypatch.setattr(cpu_attention, "masked_attention", no_cpu_op)  # the folding itself (the CPU op: below)
    calls = []
    original = sdpa_attention.sdpa_attention_forward
    monkeypatch.setattr(sdpa_attention, "sdpa_attention_forward", lambda *a, **kw: calls.append(1) or original(*a, **kw))
    gen = torch.Generator().manual_seed(0)
    q, k, v, mask = _inputs(1, 2, 2, 16, 10, 8, gen)
    module = types.SimpleNamespace(num_key_value_groups=2, is_causal=True)
    gqa_sdpa(module, q, k, v, mask)
    assert calls == []  # folded: no repeat_kv
    gqa_sdpa(module, q, k, v, None)  # no mask: transformers' own (SDPA's enable_gqa or is_causal)
    gqa_sdpa(types.SimpleNamespace(num_key_value_groups=1, is_causal=True), q[:, :2], k, v, mask)  # no grouping
    gqa_sdpa(module, q, k, v, mask.expand(1, 4, 16, 26))  # a per-head mask
    big = _inputs(1, 2, 2, FOLD_BELOW // 2, 10, 8, gen)  # folded, FOLD_BELOW query rows
    gqa_sdpa(module, *big)
    assert len(calls) == 4
    with pytest.raises(ValueError, match="softcap"):  # refused as transformers' SDPA refuses it
        gqa_sdpa(module, q, k, v, mask, softcap=20.0)


@pytest.mark.skipif(not cpu_attention.available(), reason="no CPU extension")
def test_cpu_sdpa_takes_the_cpu_op_for_few_rows_with_a_boolean_mask(monkeypatch):
    """cpu_sdpa: CPU calls of at most MAX_ROWS query rows with a (B|1, 1, T, S) boolean mask go to
    kernels/cpu_attention.py's op (and give gqa_sdpa's result); others, and calls with
    score-changing keywords, take gqa_sdpa."""
    taken = []
    original = cpu_attention.masked_attention
    monkeypatch.setattr(cpu_attention, "masked_attention", lambda *a, **kw: taken.append(a[0].shape[2]) or original(*a, **kw))
    gen = torch.Generator().manual_seed(5)
    module = types.SimpleNamespace(num_key_value_groups=2, is_causal=True)
    for T in (1, 16, cpu_attention.MAX_ROWS):
        inputs = _inputs(1, 2, 2, T, 10, 8, gen)
        out, _ = cpu_sdpa(module, *inputs)
        torch.testing.assert_close(out, gqa_sdpa(module, *inputs)[0], atol=1e-5, rtol=1e-4)
    assert taken == [1, 16, cpu_attention.MAX_ROWS]
    q, k, v, mask = _inputs(1, 2, 2, cpu_attention.MAX_ROWS + 1, 10, 8, gen)
    cpu_sdpa(module, q, k, v, mask)  # a prefill's many rows
    q, k, v, mask = _inputs(1, 2, 2, 16, 10, 8, gen)
    cpu_sdpa(module, q, k, v, mask.expand(1, 4, 16, 26))  # a per-head mask
    cpu_sdpa(module, q, k, v, torch.zeros(mask.shape).masked_fill(~mask, float("-inf")))  # an additive mask
    cpu_sdpa(module, q.requires_grad_(), k, v, mask)  # autograd
    with pytest.raises(ValueError, match="softcap"):
        cpu_sdpa(module, q.detach(), k, v, mask, softcap=20.0)
    assert taken == [1, 16, cpu_attention.MAX_ROWS]


def test_attention_view_shares_weights_and_leaves_the_model_alone():
    model = make_tiny_model("llama")
    assert folds_gqa(model.config)
    view = attention_view(model, register_gqa_sdpa())
    assert view is not model and view.config is not model.config
    assert model.config._attn_implementation == "sdpa" and view.config._attn_implementation == GQA_SDPA
    ours = dict(view.named_parameters())
    assert all(ours[n] is p for n, p in model.named_parameters())  # no weight is copied
    assert attention_view(model, GQA_SDPA) is view  # one view per model
    assert attention_view(view, GQA_SDPA) is view


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_target_runs_the_view_and_matches_the_model(backend):
    """Each backend runs a grouped-query model on a view with its own implementation (eager:
    gqa_sdpa, cpu: cpu_sdpa); the caller's model keeps transformers' SDPA; same logits."""
    cls, implementation = BACKENDS[backend]
    if backend == "cpu" and not cpu_attention.available():
        pytest.skip("no CPU extension")
    model = make_tiny_model("qwen2")
    target = Target(model, "reference", RuntimeConfig(cache="static"), backend=cls())
    assert target.model.config._attn_implementation == implementation and model.config._attn_implementation == "sdpa"
    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 128, (20,), generator=gen)
    cache = target.new_cache()
    out = target.prefill(ids, cache)
    with torch.no_grad():
        ref = model(ids[None]).logits[0, -1:]
    torch.testing.assert_close(out.logits, ref, atol=1e-5, rtol=0)


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_no_view_without_grouped_queries(backend):
    model = make_tiny_model("llama")
    model.config.num_key_value_heads = model.config.num_attention_heads  # the check reads the config only
    assert not folds_gqa(model.config)
    eager = make_tiny_model("llama", attn="eager")
    assert not folds_gqa(eager.config)
    assert Target(eager, "reference", backend=BACKENDS[backend][0]()).model is eager
