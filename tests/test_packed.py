"""The packed GEMM (eagle/backends/cpu/packed.py): PackedLinear == F.linear, the packed twin shares
the model's weights and leaves the model untouched, and a target whose CPU backend runs a twin ==
the plain target. Ways are forced through explicit arguments (``decide=``, ``CpuBackend(linear=)``)."""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from eagle import Target
from eagle.backends.cpu import CpuBackend
from eagle.backends.cpu.packed import (MIN_ROWS, PackedLinear, linear_ways, packed_row_counts, packed_twin, packing_measurements,
                                      packing_pays, stream_row_counts)
from eagle_kernels import cpu_gemm
from eagle_kernels.onednn import onednn_available, packed_gemm_available
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
    assert type(twin.get_output_embeddings()) is nn.Linear  # the LM head: eagle.backends.cpu.lmhead.project
    assert packed_twin(model, [1, 2, 3]) is None  # nothing >= MIN_ROWS to pack for
    assert packed_twin(copy.deepcopy(model).to(torch.bfloat16), [8]) is None  # not float32


@needs_mkl
def test_packed_target_equals_plain_target(tiny_model):
    model = tiny_model("qwen2")  # q/k/v carry biases
    gen = torch.Generator().manual_seed(5)
    prefix = torch.randint(0, V, (17,), generator=gen)
    # packing chosen for every bucket >= MIN_ROWS ("always"; on a tiny model the measurement would decide by noise)
    on, off = (Target(model, "reference", RuntimeConfig(packed_linear=p), backend=CpuBackend(linear="always"))
               for p in (True, False))
    assert on.backend.twin is not None and off.backend.twin is None and off.backend.packed_rows == frozenset()
    assert on.backend.packed_rows == {b for b in on.runtime.buckets if b >= MIN_ROWS}
    for t in (on, off):
        t.cache = t.new_cache(64)
        t.prefill(prefix, t.cache)
    tree = make_random_tree(13, V, gen)
    torch.testing.assert_close(on.tree_forward(tree, on.cache).logits, off.tree_forward(tree, off.cache).logits,
                               atol=1e-4, rtol=0)
    packed = [m for m in on.backend.twin.modules() if isinstance(m, PackedLinear)]
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
    import eagle.backends.cpu.packed as pk

    model = copy.deepcopy(tiny_model("llama"))
    monkeypatch.setattr(pk, "_MEASURED", {})  # packing_pays measures (decide="measure" by default)
    monkeypatch.setattr(pk.cpu_gemm, "available", lambda: False)  # two ways here; three below
    calls = []
    verdict = {4: (1.0, 0.5), 8: (1.0, 0.99), 16: (1.0, 1.5)}  # rows -> (plain s, packed s)

    def fake(fns, repeats):
        rows = [r for r in verdict if r not in calls][0]
        calls.append(rows)
        for fn in fns:  # both ways really run on the model's weights
            fn()
        return list(verdict[rows])

    monkeypatch.setattr(pk, "timed_pass", fake)
    assert packing_pays(model, [1, 2, 4, 8, 16]) == frozenset({4})  # 8: within the margin; 16: slower
    assert calls == [4, 8, 16]
    assert packing_pays(model, [4, 8, 16]) == frozenset({4}) and calls == [4, 8, 16]  # memo: not measured again
    got = {m["rows"]: m for m in packing_measurements()}
    assert got[4]["packed"] and not got[8]["packed"] and got[16]["packed_ms"] == 1500.0
    assert packing_pays(copy.deepcopy(model).half(), [8]) == frozenset() and len(calls) == 3  # float16: nothing to measure
    # a Target whose CPU backend measures every bucket slower packed runs without a twin
    monkeypatch.setattr(pk, "_MEASURED", {})
    timed = []

    def plain_wins(fns, repeats):
        timed.append(len(fns))
        return [1.0] + [2.0] * (len(fns) - 1)

    monkeypatch.setattr(pk, "timed_pass", plain_wins)
    target = Target(model, "reference", RuntimeConfig(), backend=CpuBackend(linear="measure"))
    assert timed and target.backend.twin is None and target.backend.twin_rows == frozenset()
    assert target.backend.decoder(max(target.runtime.buckets)) is None


@needs_mkl
def test_packing_pays_measures_real_products(tiny_model, monkeypatch):
    """Without a fake timer: a real measurement returns a subset of the asked row counts >= MIN_ROWS
    and records both timings."""
    import eagle.backends.cpu.packed as pk

    monkeypatch.setattr(pk, "_MEASURED", {})
    won = packing_pays(tiny_model("llama"), [1, 4, 8])
    assert won <= {4, 8}
    got = {m["rows"]: m for m in packing_measurements()}
    assert sorted(got) == ([1, 4, 8] if cpu_gemm.available() else [4, 8])  # one row: only with the kernel
    assert all(got[r]["plain_ms"] > 0 and got[r]["packed_ms"] > 0 for r in (4, 8))
    assert all(m["stream_ms"] > 0 for m in got.values()) if cpu_gemm.available() else True
    assert all(m["way"] in ("plain", "packed", "stream") for m in got.values())


needs_kernel = pytest.mark.skipif(not cpu_gemm.available(), reason=f"small-row kernel: {cpu_gemm.unavailable_reason()}")


def _fake_timings(monkeypatch, verdict: dict, order: list) -> None:
    """linear_ways' timer replaced: the row counts are measured in ``order``, and row count r's ways
    take ``verdict[r]`` seconds (in linear_ways' order of ways); every way still runs once."""
    import eagle.backends.cpu.packed as pk

    rows = iter(order)

    def fake(fns, repeats):
        r = next(rows)
        assert len(fns) == len(verdict[r])
        for fn in fns:  # every way really runs on the model's weights
            fn()
        return list(verdict[r])

    monkeypatch.setattr(pk, "timed_pass", fake)


@needs_kernel
def test_linear_ways_picks_the_fastest_of_three(tiny_model, monkeypatch):
    """Each row count gets the fastest way (a non-plain way must win by MARGIN); one to three rows
    are never packed; decide="stream" sends every row count to the kernel."""
    import eagle.backends.cpu.packed as pk

    model = copy.deepcopy(tiny_model("llama"))
    monkeypatch.setattr(pk, "_MEASURED", {})
    # rows -> seconds of (plain, packed, stream), or (plain, stream) below MIN_ROWS
    verdict = {1: (1.0, 0.5), 2: (1.0, 0.99), 4: (1.0, 0.6, 0.8), 8: (1.0, 0.9, 0.5), 16: (1.0, 2.0, 3.0)}
    _fake_timings(monkeypatch, verdict, [1, 2, 4, 8, 16])
    assert linear_ways(model, [1, 2, 4, 8, 16]) == {1: "stream", 2: "plain", 4: "packed", 8: "stream", 16: "plain"}
    assert packing_pays(model, [4, 8]) == frozenset({4})  # memo: nothing measured again
    assert linear_ways(model, [1, 8], decide="stream") == {1: "stream", 8: "stream"}
    with pytest.raises(ValueError, match="linear way must be one of"):
        linear_ways(model, [8], decide="bogus")


def _same_tree_steps(on: Target, off: Target, prefix: torch.Tensor, gen: torch.Generator, tol) -> None:
    """Both targets prefill ``prefix``, then run random trees of 1, 3 and 9 nodes: the same logits
    and hidden states (``tol``: atol, rtol) and the same greedy tokens."""
    for t in (on, off):
        t.cache = t.new_cache(64)
        t.prefill(prefix, t.cache)
    for n in (1, 3, 9):
        tree = make_random_tree(n, V, gen)
        a, b = on.tree_forward(tree, on.cache), off.tree_forward(tree, off.cache)
        torch.testing.assert_close(a.logits, b.logits, atol=tol[0], rtol=tol[1])
        torch.testing.assert_close(a.hidden, b.hidden, atol=tol[0], rtol=tol[1])
        assert torch.equal(a.logits.argmax(-1), b.logits.argmax(-1))
        for t in (on, off):
            t.crop(t.cache, len(prefix))


@needs_kernel
@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma3"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_streamed_target_equals_plain_target(arch, dtype, tiny_model):
    """A twin whose buckets run the small-row kernel (one-token steps included) gives the plain
    target's logits on random trees (bfloat16: up to its rounding, the same tokens); the caller's
    model is untouched."""
    model = copy.deepcopy(tiny_model(arch))  # its own twin
    gen = torch.Generator().manual_seed(7)
    prefix = torch.randint(0, V, (19,), generator=gen)
    on, off = (Target(model, "reference", RuntimeConfig(packed_linear=p, dtype=dtype), backend=CpuBackend(linear="stream"))
               for p in (True, False))
    tol = (1e-4, 0) if dtype == "float32" else (0.1, 0.02)
    assert stream_row_counts(on.backend.twin) >= {1, 4, 8, 16} and on.backend.twin_rows >= {1, 4, 8, 16}
    assert off.backend.twin is None
    assert all(type(m) is nn.Linear for m in model.modules() if isinstance(m, nn.Linear))
    _same_tree_steps(on, off, prefix, gen, tol)


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
@pytest.mark.parametrize("dtype,way,op,tol", [("float32", "stream", "packed_linear", (1e-4, 0)),
                                              ("float32", "packed", "held_mkl_linear", (1e-4, 0)),
                                              ("bfloat16", "stream", "packed_linear", (0.1, 0.02)),
                                              ("bfloat16", "onednn", "held_linear", (0.1, 0.02))])
def test_compiled_steps_run_the_kernel_as_an_op(dtype, way, op, tol, tiny_model, tmp_path, monkeypatch):
    """A compiled bucket step on the twin (one graph, each decoder layer a compiled region,
    eagle/backends/cpu/regions.py) calls the extension's C++ dispatcher op for every decoder product, with no
    graph break, and equals the eager plain target. float32: the small-row kernel on its packed
    copies, or MKL's packed GEMM on copies held in the extension's table (buckets that MKL packs
    for); bfloat16: oneDNN on packed copies held in the extension's table (up to bf16
    rounding, which the compiled graph's fused elementwise ops do differently; the same tokens)."""
    from torch.profiler import ProfilerActivity, profile

    if way == "onednn" and not onednn_available():
        pytest.skip("no oneDNN bfloat16 GEMM in this torch build / on this CPU")
    if way == "packed" and not packed_gemm_available():
        pytest.skip("no MKL packed GEMM in this torch build")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    model = copy.deepcopy(tiny_model("llama"))
    # the bucket's way: the kernel ("stream"), or "always" (MKL packed for float32, oneDNN for bfloat16)
    backend = CpuBackend(linear="stream" if way == "stream" else "always")
    comp = Target(model, "reference", RuntimeConfig(buckets=[8], compile=True, dtype=dtype), backend=backend)
    plain = Target(comp.model, "reference", RuntimeConfig(buckets=[8], packed_linear=False))
    assert {"stream": backend.stream_rows, "onednn": backend.onednn_rows, "packed": backend.packed_rows}[way] == {8}
    assert backend.twin_rows == {8} and plain.backend.twin is None
    op_name = f"{cpu_gemm._load().__name__}::{op}"
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
        torch.testing.assert_close(a.logits, b.logits, atol=tol[0], rtol=tol[1])
        assert torch.equal(a.logits.argmax(-1), b.logits.argmax(-1))
        for t, c in ((comp, cc), (plain, cp)):
            t.crop(c, len(prefix))
    n_linears = sum(1 for m in model.modules() if type(m) is nn.Linear) - 1  # the LM head: eagle.backends.cpu.lmhead
    assert calls == 2 * n_linears  # every decoder product of both steps went through the op
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1  # the whole step
    assert list(comp.compile_s) == [8] and not torch._dynamo.utils.counters["graph_break"]


# ------------------------------------------------------------------------------------------------
# bfloat16: oneDNN's GEMM on a packed copy of each weight
# ------------------------------------------------------------------------------------------------

needs_onednn = pytest.mark.skipif(not onednn_available(), reason="no oneDNN bfloat16 GEMM in this torch build / on this CPU")


@needs_onednn
@pytest.mark.parametrize("bias", [True, False])
def test_onednn_linear_is_the_product_and_rows_do_not_depend_on_the_call(bias):
    """PackedLinear's oneDNN way: close to the float32 product of the same bf16 values, each row of a
    call bitwise what that row gets alone (the tree / one-token consistency greedy decoding needs),
    one packed copy for every row count, refreshed after an in-place update of the weight; row
    counts it does not own, and trained weights, take F.linear.

    The weight comes from the test's own generator, and K is 64: oneDNN's row independence holds for
    the model shapes (K a multiple of 64, or N >= 576) but not for every small shape (K = 40 or
    N = 64 with K = 1152 change the sum's order at 32-64 rows), so a shape drawn by chance would test
    luck, not the code."""
    gen = torch.Generator().manual_seed(1)
    lin = nn.Linear(64, 96, bias=bias).to(torch.bfloat16).requires_grad_(False)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(96, 64, generator=gen))
        if bias:
            lin.bias.copy_(torch.randn(96, generator=gen))
    pl = PackedLinear(lin, [], onednn_rows=range(1, 65))
    for rows in (1, 3, 8, 17, 64):
        x = torch.randn(rows, 64, generator=gen).to(torch.bfloat16)
        y = pl(x[None])[0]  # (rows, 96), leading dims flattened and restored
        ref = torch.nn.functional.linear(x.float(), lin.weight.float(), None if lin.bias is None else lin.bias.float())
        assert y.shape == (rows, 96) and y.dtype == torch.bfloat16
        torch.testing.assert_close(y.float(), ref, atol=0.05, rtol=0.02)
        assert torch.equal(y, torch.cat([pl(x[i:i + 1]) for i in range(rows)]))
    assert list(pl.packed) == ["onednn"] and pl.packed["onednn"].layout == torch._mkldnn
    with torch.no_grad():
        lin.weight.mul_(-1.5)
    x = torch.randn(4, 64, generator=gen).to(torch.bfloat16)
    torch.testing.assert_close(pl(x).float(), torch.nn.functional.linear(x, lin.weight, lin.bias).float(),
                               atol=0.05, rtol=0.02)
    other = PackedLinear(lin, [], onednn_rows=[8])
    assert torch.equal(other(x), torch.nn.functional.linear(x, lin.weight, lin.bias)) and not other.packed
    trained = PackedLinear(nn.Linear(64, 96).to(torch.bfloat16), [], onednn_rows=[4])
    trained(x).float().sum().backward()
    assert trained.weight.grad is not None and not trained.packed


@needs_mkl
@needs_kernel
def test_a_held_mkl_copy_is_mkls_product_and_its_slot_is_freed():
    """cpu_gemm.held_mkl_op on a HeldWeight of MKL's packed copy (packed for the call's rows) equals
    mkl::_mkl_linear on that copy bitwise, leading dimensions flattened and restored; a weight
    that does not match x is an error; the slot goes with the HeldWeight. A float32 PackedLinear
    holds one slot per row count it is asked for and packs for (buffers ``mkl_slot_<rows>``)."""
    import gc

    ext = cpu_gemm._load()
    gen = torch.Generator().manual_seed(5)
    w = torch.randn(96, 40, generator=gen)
    b = torch.randn(96, generator=gen)
    packed = torch.ops.mkl._mkl_reorder_linear_weight(w, 10)
    gc.collect()  # earlier tests' compiled targets hold weights until they are collected
    before = ext.held_count()
    held = cpu_gemm.HeldWeight(packed)
    x = torch.randn(2, 5, 40, generator=gen)
    want = torch.ops.mkl._mkl_linear(x.reshape(10, 40), packed, w, b, 10).view(2, 5, 96)
    assert torch.equal(cpu_gemm.held_mkl_op(x, held.slot, w, b), want)
    with pytest.raises(RuntimeError, match="do not match"):
        cpu_gemm.held_mkl_op(x, held.slot, torch.randn(96, 39), b)
    del held
    gc.collect()
    assert ext.held_count() == before
    pl = PackedLinear(nn.Linear(40, 96).requires_grad_(False), [4, 16])
    for rows in (16, 8, 16):  # 8: not a row count it packs for; 16 again: held already
        pl.hold_mkl_copy(rows)
    assert [n for n, _ in pl.named_buffers() if n.startswith("mkl_slot_")] == ["mkl_slot_16"]
    assert ext.held_count() == before + 1 and list(pl.packed) == [16]


@needs_onednn
@needs_kernel
def test_a_held_weight_is_the_packed_product_and_its_slot_is_freed():
    """cpu_gemm.held_op on a HeldWeight equals oneDNN's product on the same packed copy, bitwise;
    the table slot goes with the HeldWeight."""
    import gc

    ext = cpu_gemm._load()
    gen = torch.Generator().manual_seed(3)
    w = torch.randn(96, 40, generator=gen).to(torch.bfloat16)
    b = torch.randn(96, generator=gen).to(torch.bfloat16)
    packed = torch.ops.mkldnn._reorder_linear_weight(w, 1)
    gc.collect()  # earlier tests' compiled targets hold weights until they are collected
    before = ext.held_count()
    held = cpu_gemm.HeldWeight(packed)
    assert ext.held_count() == before + 1 and held.slot.dtype == torch.int64 and held.slot.shape == (1,)
    x = torch.randn(2, 5, 40, generator=gen).to(torch.bfloat16)
    want = torch.ops.mkldnn._linear_pointwise(x.reshape(10, 40), packed, b, "none", [], "").view(2, 5, 96)
    assert torch.equal(cpu_gemm.held_op(x, held.slot, 96, b), want)
    with pytest.raises(RuntimeError, match="shapes"):
        cpu_gemm.held_op(x, held.slot, 95, b)
    del held
    gc.collect()
    assert ext.held_count() == before
    with pytest.raises(RuntimeError, match="no weight is held"):
        cpu_gemm.held_op(x, torch.tensor([10_000]), 96, b)


@needs_onednn
def test_linear_ways_measures_onednn_for_bfloat16(tiny_model, monkeypatch):
    """A bfloat16 model's row counts choose among F.linear, the small-row kernel (where it runs) and
    oneDNN on packed copies (a way other than plain must win by MARGIN), measured per precision;
    decide="always" takes oneDNN; float16 stays plain."""
    import eagle.backends.cpu.packed as pk

    model = copy.deepcopy(tiny_model("llama")).to(torch.bfloat16)
    monkeypatch.setattr(pk, "_MEASURED", {})
    kernel = cpu_gemm.available()
    # rows -> seconds of (plain, stream, onednn), or (plain, onednn) without the kernel
    verdict = {1: (1.0, 0.4, 0.5), 4: (1.0, 0.995, 0.99), 8: (1.0, 0.9, 0.8)}
    if not kernel:
        verdict = {r: (v[0], v[2]) for r, v in verdict.items()}
    _fake_timings(monkeypatch, verdict, [1, 4, 8])
    assert linear_ways(model, [1, 4, 8]) == {1: "stream" if kernel else "onednn", 4: "plain", 8: "onednn"}
    assert {m["dtype"] for m in packing_measurements()} == {"bfloat16"}
    assert linear_ways(model, [1, 16], decide="always") == {1: "onednn", 16: "onednn"}
    assert linear_ways(copy.deepcopy(tiny_model("llama")).half(), [1, 16], decide="always") == {1: "plain", 16: "plain"}


@needs_onednn
@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma3"])
def test_onednn_target_equals_plain_bfloat16_target(arch, tiny_model):
    """A bfloat16 target whose buckets take oneDNN on packed copies (``CpuBackend(linear="always")``) gives
    the F.linear target's logits on random trees, up to bf16 rounding, and picks the same tokens."""
    model = tiny_model(arch)
    gen = torch.Generator().manual_seed(5)
    prefix = torch.randint(0, V, (19,), generator=gen)
    on, off = (Target(model, "reference", RuntimeConfig(dtype="bfloat16", packed_linear=p), backend=CpuBackend(linear="always"))
               for p in (True, False))
    assert on.backend.onednn_rows == set(on.runtime.buckets) and off.backend.twin is None
    _same_tree_steps(on, off, prefix, gen, (0.05, 0.02))


def test_onednn_way_needs_native_bf16(tmp_path):
    """oneDNN's bf16 GEMM is offered only where bf16 products are native: emulated, a row's sum
    changes with the call's row count (what tree steps checked against one-token steps cannot have)."""
    emulated, native = tmp_path / "emulated", tmp_path / "native"
    emulated.write_text("processor : 0\nflags : fpu sse avx2 avx512f avx512bw avx512vl avx512_vnni\n")
    native.write_text("processor : 0\nflags : fpu sse avx2 avx512f avx512bw avx512vl avx512_bf16\n")
    assert not onednn_available(str(emulated))
    assert onednn_available(str(native)) == (torch.backends.mkldnn.is_available()
                                             and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported()))
