"""The packed GEMM (eagle/packed.py): PackedLinear == F.linear, the packed twin shares the model's
weights and leaves the model untouched, and a target with packed linears == the plain target."""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from eagle import Target
from eagle.packed import (MIN_ROWS, PackedLinear, linear_ways, packed_gemm_available, packed_row_counts, packed_twin,
                          packing_measurements, packing_pays, stream_row_counts)
from kernels import cpu_gemm
from eagle.runtime import RuntimeConfig

from conftest import TINY_VOCAB, make_random_tree

V = TINY_VOCAB
needs_mkl = pytest.mark.skipif(not packed_gemm_available(), reason="this torch build has no MKL packed GEMM")


@needs_mkl
@pytest.mark.parametrize("bias", [True, False])
def test_packed_linear_equals_linear(bias):
    gen = torch.Generator().manual_seed(0)
    lin = nn.Linear(40, 96, bias=bias).requires_grad_(False)
    pl = PackedLinear(lin, [8])
    assert pl.weight is lin.weight and pl.bias is lin.bias  # shared, not copied
    x8, x3 = torch.randn(1, 8, 40, generator=gen), torch.randn(3, 40, generator=gen)
    y8 = pl(x8)
    torch.testing.assert_close(y8, lin(x8), atol=1e-5, rtol=1e-5)
    assert y8.shape == (1, 8, 96) and list(pl.packed) == [8]  # packed for 8 rows, on first use
    torch.testing.assert_close(pl(x8.reshape(8, 40)), lin(x8.reshape(8, 40)), atol=1e-5, rtol=1e-5)
    assert list(pl.packed) == [8]  # the same packed copy reused
    assert torch.equal(pl(x3), lin(x3))  # 3 rows: not packed, plain F.linear
    with torch.no_grad():
        lin.weight.mul_(-1.5)  # updated in place: the packed copy is stale and must go
    torch.testing.assert_close(pl(x8), lin(x8), atol=1e-5, rtol=1e-5)
    half = PackedLinear(nn.Linear(40, 96).half().requires_grad_(False), [8])
    assert half(x8.half()).dtype == torch.float16 and not half.packed  # not float32: untouched
    trained = PackedLinear(nn.Linear(40, 96), [8])  # requires_grad: autograd's path
    trained(x8).sum().backward()
    assert trained.weight.grad is not None and not trained.packed


@needs_mkl
def test_packed_twin_shares_weights_and_leaves_the_model_alone(tiny_model):
    model = copy.deepcopy(tiny_model("llama"))  # its own twin: other tests' Targets extend the cached model's
    before = {n: type(m) for n, m in model.named_modules()}
    twin = packed_twin(model, [1, 4, 8])
    assert twin is not model and packed_twin(model, [16]) is twin  # one twin per model, extended
    assert packed_row_counts(twin) == {4, 8, 16}
    assert {n: type(m) for n, m in model.named_modules()} == before  # the caller's model is untouched
    ours, theirs = dict(model.named_parameters()), dict(twin.named_parameters())
    assert ours.keys() == theirs.keys() and all(theirs[k] is ours[k] for k in ours)  # no weight copied
    swapped = [n for n, m in twin.named_modules() if isinstance(m, PackedLinear)]
    plain = [n for n, m in model.named_modules() if type(m) is nn.Linear and m is not model.get_output_embeddings()]
    assert swapped == plain and len(swapped) > 0
    assert type(twin.get_output_embeddings()) is nn.Linear  # the LM head: eagle.lmhead.project
    assert packed_twin(model, [1, 2, 3]) is None  # nothing >= MIN_ROWS to pack for
    assert packed_twin(copy.deepcopy(model).to(torch.bfloat16), [8]) is None  # not float32


@needs_mkl
def test_packed_target_equals_plain_target(tiny_model, monkeypatch):
    model = tiny_model("qwen2")  # q/k/v carry biases
    gen = torch.Generator().manual_seed(5)
    prefix = torch.randint(0, V, (17,), generator=gen)
    # packing chosen for every bucket (on a tiny model the measurement would decide by noise)
    monkeypatch.setattr("eagle.target.linear_ways", lambda m, rows: {r: "packed" if r >= MIN_ROWS else "plain" for r in rows})
    on, off = (Target(model, "reference", RuntimeConfig(packed_linear=p)) for p in (True, False))
    assert on.packed is not None and off.packed is None and off.packed_rows == frozenset()
    for t in (on, off):
        t.cache = t.new_cache(64)
        t.prefill(prefix, t.cache)
    tree = make_random_tree(13, V, gen)
    torch.testing.assert_close(on.tree_forward(tree, on.cache).logits, off.tree_forward(tree, off.cache).logits,
                               atol=1e-4, rtol=0)
    packed = [m for m in on.packed.modules() if isinstance(m, PackedLinear)]
    assert packed and all(16 in m.packed for m in packed)  # the 13-node tree ran as a packed 16-node bucket


@needs_mkl
def test_packed_twin_follows_the_models_attention_implementation(tiny_model):
    model = copy.deepcopy(tiny_model("llama"))
    twin = packed_twin(model, [8])
    model.set_attn_implementation("eager")  # e.g. a later Target selecting the tree kernel
    assert packed_twin(model, [8]) is twin and twin.config._attn_implementation == "eager"


@needs_mkl
def test_packing_pays_keeps_the_row_counts_that_measured_faster(tiny_model, monkeypatch):
    """Per row count: packed chosen only when it beats the plain GEMM by MARGIN; measured once per
    process (memo), over the model's decoder weights; nothing measured where packing cannot apply;
    a Target whose buckets all lose to the plain GEMM runs without a twin."""
    import eagle.packed as pk

    model = copy.deepcopy(tiny_model("llama"))
    monkeypatch.setattr(pk, "_MEASURED", {})
    monkeypatch.setattr(pk, "DECIDE", "measure")  # tests/conftest.py sets "always"
    monkeypatch.setattr(pk.cpu_gemm, "available", lambda: False)  # two ways here; three below
    calls = []
    verdict = {4: (1.0, 0.5), 8: (1.0, 0.99), 16: (1.0, 1.5)}  # rows -> (plain s, packed s)

    def fake(fns, repeats):
        rows = [r for r in verdict if r not in calls][0]
        calls.append(rows)
        for fn in fns:  # both ways really run on the model's weights
            fn()
        return list(verdict[rows])

    monkeypatch.setattr(pk, "_timed_pass", fake)
    assert packing_pays(model, [1, 2, 4, 8, 16]) == frozenset({4})  # 8: within the margin; 16: slower
    assert calls == [4, 8, 16]
    assert packing_pays(model, [4, 8, 16]) == frozenset({4}) and calls == [4, 8, 16]  # memo: not measured again
    got = {m["rows"]: m for m in packing_measurements()}
    assert got[4]["packed"] and not got[8]["packed"] and got[16]["packed_ms"] == 1500.0
    assert packing_pays(copy.deepcopy(model).to(torch.bfloat16), [8]) == frozenset() and len(calls) == 3
    monkeypatch.setattr("eagle.target.linear_ways", lambda m, rows: dict.fromkeys(rows, "plain"))
    assert Target(model, "reference", RuntimeConfig()).packed is None


@needs_mkl
def test_packing_pays_measures_real_products(tiny_model, monkeypatch):
    """Without a fake timer: a real measurement returns a subset of the asked row counts >= MIN_ROWS
    and records both timings."""
    import eagle.packed as pk

    monkeypatch.setattr(pk, "_MEASURED", {})
    monkeypatch.setattr(pk, "DECIDE", "measure")
    won = packing_pays(tiny_model("llama"), [1, 4, 8])
    assert won <= {4, 8}
    got = {m["rows"]: m for m in packing_measurements()}
    assert sorted(got) == ([1, 4, 8] if cpu_gemm.available() else [4, 8])  # one row: only with the kernel
    assert all(got[r]["plain_ms"] > 0 and got[r]["packed_ms"] > 0 for r in (4, 8))
    assert all(m["stream_ms"] > 0 for m in got.values()) if cpu_gemm.available() else True
    assert all(m["way"] in ("plain", "packed", "stream") for m in got.values())


needs_kernel = pytest.mark.skipif(not cpu_gemm.available(), reason=f"small-row kernel: {cpu_gemm.unavailable_reason()}")


@needs_kernel
def test_linear_ways_picks_the_fastest_of_three(tiny_model, monkeypatch):
    """Each row count gets the fastest way (a non-plain way must win by MARGIN); one to three rows
    are never packed; DECIDE="stream" sends every row count to the kernel."""
    import eagle.packed as pk

    model = copy.deepcopy(tiny_model("llama"))
    monkeypatch.setattr(pk, "_MEASURED", {})
    monkeypatch.setattr(pk, "DECIDE", "measure")
    # rows -> seconds of (plain, packed, stream), or (plain, stream) below MIN_ROWS
    verdict = {1: (1.0, 0.5), 2: (1.0, 0.99), 4: (1.0, 0.6, 0.8), 8: (1.0, 0.9, 0.5), 16: (1.0, 2.0, 3.0)}
    order = iter([1, 2, 4, 8, 16])

    def fake(fns, repeats):
        r = next(order)
        assert len(fns) == len(verdict[r])
        for fn in fns:  # every way really runs on the model's weights
            fn()
        return list(verdict[r])

    monkeypatch.setattr(pk, "_timed_pass", fake)
    assert linear_ways(model, [1, 2, 4, 8, 16]) == {1: "stream", 2: "plain", 4: "packed", 8: "stream", 16: "plain"}
    assert packing_pays(model, [4, 8]) == frozenset({4})  # memo: nothing measured again
    monkeypatch.setattr(pk, "DECIDE", "stream")
    assert linear_ways(model, [1, 8]) == {1: "stream", 8: "stream"}


@needs_kernel
@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma3"])
def test_streamed_target_equals_plain_target(arch, tiny_model, monkeypatch):
    """A twin whose buckets run the small-row kernel (one-token steps included) gives the plain
    target's logits on random trees; the caller's model is untouched."""
    model = copy.deepcopy(tiny_model(arch))  # its own twin
    gen = torch.Generator().manual_seed(7)
    prefix = torch.randint(0, V, (19,), generator=gen)
    monkeypatch.setattr("eagle.target.linear_ways", lambda m, rows: dict.fromkeys(rows, "stream"))
    on, off = (Target(model, "reference", RuntimeConfig(packed_linear=p)) for p in (True, False))
    assert stream_row_counts(on.packed) >= {1, 4, 8, 16} and on.twin_rows >= {1, 4, 8, 16} and off.packed is None
    assert all(type(m) is nn.Linear for m in model.modules() if isinstance(m, nn.Linear))
    for t in (on, off):
        t.cache = t.new_cache(64)
        t.prefill(prefix, t.cache)
    for n in (1, 3, 9):
        tree = make_random_tree(n, V, gen)
        a, b = on.tree_forward(tree, on.cache), off.tree_forward(tree, off.cache)
        torch.testing.assert_close(a.logits, b.logits, atol=1e-4, rtol=0)
        torch.testing.assert_close(a.hidden, b.hidden, atol=1e-4, rtol=0)
        for t in (on, off):
            t.crop(t.cache, len(prefix))


@needs_kernel
def test_twin_stream_and_packed_rows_do_not_overlap(tiny_model):
    model = copy.deepcopy(tiny_model("llama"))
    twin = packed_twin(model, [4, 8], stream_rows=[1, 8])
    assert stream_row_counts(twin) == {1, 8} and packed_row_counts(twin) == {4}  # the kernel takes precedence
    assert packed_twin(model, [16], stream_rows=[4]) is twin
    assert stream_row_counts(twin) == {1, 4, 8} and packed_row_counts(twin) == {16}
    assert packed_row_counts(twin) | stream_row_counts(twin) == {1, 4, 8, 16}


@needs_kernel
@pytest.mark.compile
def test_compiled_steps_run_the_kernel_as_an_op(tiny_model, tmp_path, monkeypatch):
    """A compiled bucket step on the twin (each decoder layer compiled, eagle.target._layerwise)
    calls the kernel's C++ dispatcher op for every decoder product, with no graph break, and equals
    the eager plain target; one graph serves every layer."""
    from torch.profiler import ProfilerActivity, profile

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    monkeypatch.setattr("eagle.target.linear_ways", lambda m, rows: dict.fromkeys(rows, "stream"))
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    model = copy.deepcopy(tiny_model("llama"))
    comp = Target(model, "reference", RuntimeConfig(buckets=[8], compile=True))
    plain = Target(model, "reference", RuntimeConfig(buckets=[8], packed_linear=False))
    assert comp.stream_rows == {8} and plain.packed is None
    op_name = f"{cpu_gemm._load().__name__}::packed_linear"
    gen = torch.Generator().manual_seed(4)
    prefix = torch.randint(0, V, (15,), generator=gen)
    cc, cp = comp.new_cache(64), plain.new_cache(64)
    comp.prefill(prefix, cc)
    plain.prefill(prefix, cp)
    comp.tree_forward(make_random_tree(5, V, gen), cc)  # compiles (tracing calls the op too)
    comp.crop(cc, len(prefix))
    calls = 0
    for _ in range(2):
        tree = make_random_tree(int(torch.randint(2, 9, (), generator=gen)), V, gen)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            a = comp.tree_forward(tree, cc)
        calls += sum(e.count for e in prof.key_averages() if e.key == op_name)
        b = plain.tree_forward(tree, cp)
        torch.testing.assert_close(a.logits, b.logits, atol=1e-4, rtol=0)
        for t, c in ((comp, cc), (plain, cp)):
            t.crop(c, len(prefix))
    n_linears = sum(1 for m in model.modules() if type(m) is nn.Linear) - 1  # the LM head: eagle.lmhead
    assert calls == 2 * n_linears  # every decoder product of both steps went through the op
    # two layers: a first graph specialized to layer 0, then one with a symbolic layer index
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] <= 2
    assert list(comp.compile_s) == [8] and not torch._dynamo.utils.counters["graph_break"]
