"""The small-row CPU GEMM (kernels/cpu_gemm.py) against its reference, F.linear, in float64: random
shapes with K and N tails, bias or not, 1-40 rows; a row's result does not depend on the other rows
of the call; anything the kernel does not take goes to the reference."""
from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

from eagle_kernels.weightmemo import WeightMemo
from eagle_kernels import cpu_gemm

needs_kernel = pytest.mark.skipif(not cpu_gemm.available(), reason=f"small-row kernel: {cpu_gemm.unavailable_reason()}")


def _ref(x, w, b):
    return F.linear(x.double(), w.double(), None if b is None else b.double())


@needs_kernel
@pytest.mark.parametrize("seed", range(12))
def test_random_shapes_equal_the_reference(seed):
    gen = torch.Generator().manual_seed(seed)
    M = int(torch.randint(1, 41, (1,), generator=gen))
    K = int(torch.randint(1, 700, (1,), generator=gen))  # tails of K % 16
    N = int(torch.randint(1, 300, (1,), generator=gen))  # tails of N % 4
    x, w = torch.randn(M, K, generator=gen), torch.randn(N, K, generator=gen) / K ** 0.5
    b = torch.randn(N, generator=gen) if seed % 2 else None
    y = cpu_gemm.small_linear(x, w, b)
    assert y.shape == (M, N) and y.dtype == torch.float32
    torch.testing.assert_close(y.double(), _ref(x, w, b), atol=2e-5, rtol=1e-5)


@needs_kernel
def test_model_shapes_and_leading_dims():
    gen = torch.Generator().manual_seed(0)
    for K, N in [(576, 576), (576, 192), (576, 1536), (1536, 576), (64, 49152 // 64)]:
        x, w, b = torch.randn(1, 5, K, generator=gen), torch.randn(N, K, generator=gen) * 0.02, torch.randn(N, generator=gen)
        y = cpu_gemm.small_linear(x, w, b)  # (1, 5, N)
        assert y.shape == (1, 5, N)
        torch.testing.assert_close(y.double(), _ref(x, w, b), atol=2e-5, rtol=1e-5)


@needs_kernel
def test_a_rows_result_does_not_depend_on_the_other_rows():
    """Bitwise: row m of an M-row call == the same row alone (what keeps a padded tree's products
    equal to one-token products), for M across the tile sizes (1-16 rows of one block, or 1-8 rows of
    the wider tiles, with AVX-512; 1-6 with AVX2) and the groups of more rows."""
    gen = torch.Generator().manual_seed(1)
    w, b = torch.randn(131, 577, generator=gen), torch.randn(131, generator=gen)
    x = torch.randn(37, 577, generator=gen)
    full = cpu_gemm.small_linear(x, w, b)
    for m in range(37):
        assert torch.equal(full[m], cpu_gemm.small_linear(x[m:m + 1], w, b)[0])
    for rows in (2, 3, 4, 5, 6, 8, 13, 16, 17, 24):
        assert torch.equal(full[:rows], cpu_gemm.small_linear(x[:rows], w, b))


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_every_tile_width_gives_the_same_bits(dtype):
    """Bitwise: tiles of 1, 2 or 3 blocks of 16 outputs (the width is measured per machine when the
    extension loads) give the same outputs, for widths that do not divide the blocks, a partial last
    block, and rows past a wide tile's 8 (one block)."""
    ext = cpu_gemm._load()
    before = ext.tile_blocks()
    gen = torch.Generator().manual_seed(4)
    try:
        for N, K in ((16, 40), (19, 33), (37, 64), (53, 17), (131, 577)):
            w, b = torch.randn(N, K, generator=gen).to(dtype), torch.randn(N, generator=gen).to(dtype)
            x = torch.randn(20, K, generator=gen).to(dtype)
            for rows in (1, 3, 7, 8, 9, 20):
                outs = []
                for nb in range(1, ext.MAX_TILE_BLOCKS + 1):
                    ext.set_tile_blocks(nb)
                    outs.append(cpu_gemm.small_linear(x[:rows], w, b))
                assert all(torch.equal(o, outs[0]) for o in outs[1:]), (N, K, rows)
    finally:
        ext.set_tile_blocks(before)


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_every_plan_gives_the_same_bits(dtype):
    """Bitwise: calls of more than 8 rows in turns or in one-block tiles of up to 16 rows, and any
    prefetch distances, give the same outputs (the plan is measured per machine at load)."""
    before = cpu_gemm.plan()
    gen = torch.Generator().manual_seed(5)
    plans = [dict(turns=t, prefetch=p, prefetch_many=q) for t in (1, 0) for p, q in ((4096, 4096), (64, 16384))]
    try:
        for N, K in ((16, 40), (37, 64), (131, 577)):
            w, b = torch.randn(N, K, generator=gen).to(dtype), torch.randn(N, generator=gen).to(dtype)
            x = torch.randn(40, K, generator=gen).to(dtype)
            for rows in (1, 8, 9, 13, 16, 17, 33, 40):
                outs = []
                for plan in plans:
                    cpu_gemm.set_plan(**plan)
                    outs.append(cpu_gemm.small_linear(x[:rows], w, b))
                assert all(torch.equal(o, outs[0]) for o in outs[1:]), (N, K, rows)
    finally:
        cpu_gemm.set_plan(**before)


@needs_kernel
def test_the_plan_can_be_forced_and_is_checked(monkeypatch):
    ext = cpu_gemm._load()
    before = cpu_gemm.plan()
    assert set(before) == {"width", "prefetch", "prefetch_many", "turns"}
    try:
        monkeypatch.setenv("EAGLE_CPU_GEMM_TILE_BLOCKS", "1")
        monkeypatch.setenv("EAGLE_CPU_GEMM_PREFETCH", "8192")
        monkeypatch.setenv("EAGLE_CPU_GEMM_PREFETCH_MANY", "2048")
        monkeypatch.setenv("EAGLE_CPU_GEMM_TURNS", "0")
        want = {"width": 1, "prefetch": 8192, "prefetch_many": 2048, "turns": 0}
        assert cpu_gemm._choose_plan(ext) == want == cpu_gemm.plan()
        assert ext.tile_blocks() == 1 == cpu_gemm.tile_blocks()
        for var, bad, match in (("EAGLE_CPU_GEMM_TILE_BLOCKS", str(ext.MAX_TILE_BLOCKS + 1), "EAGLE_CPU_GEMM_TILE_BLOCKS must be 1"),
                                ("EAGLE_CPU_GEMM_PREFETCH", "100", "EAGLE_CPU_GEMM_PREFETCH must be a multiple of 64"),
                                ("EAGLE_CPU_GEMM_PREFETCH_MANY", "big", "EAGLE_CPU_GEMM_PREFETCH_MANY must be"),
                                ("EAGLE_CPU_GEMM_TURNS", "2", "EAGLE_CPU_GEMM_TURNS must be 0 or 1")):
            good = os.environ[var]
            monkeypatch.setenv(var, bad)
            with pytest.raises(ValueError, match=match):
                cpu_gemm._choose_plan(ext)
            monkeypatch.setenv(var, good)
        with pytest.raises(RuntimeError, match="set_tile_blocks"):
            ext.set_tile_blocks(0)
        with pytest.raises(RuntimeError, match="set_prefetch_bytes"):
            ext.set_prefetch_bytes(4096, 100)
    finally:
        cpu_gemm.set_plan(**before)


def _fma32(a: float, b: float, c: float) -> float:
    """``a * b + c`` of float32 values, rounded once to float32 (nearest, ties to even): the
    exact result as a Fraction, then the nearest of the float32 values around it."""
    import numpy as np
    from fractions import Fraction

    exact = Fraction(a) * Fraction(b) + Fraction(c)
    f = np.float32(float(exact))
    cands = [f, np.nextafter(f, np.float32(np.inf)), np.nextafter(f, np.float32(-np.inf))]
    best = min(abs(Fraction(float(v)) - exact) for v in cands)
    near = [v for v in cands if abs(Fraction(float(v)) - exact) == best]
    return float(min(near, key=lambda v: int(v.view(np.int32)) & 1))  # a tie: the even one


def _fma_chain(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``(M, N)`` float32: ``fma(w[n, K-1], x[m, K-1], ... fma(w[n, 0], x[m, 0], 0)) + b[n]``, each
    step rounded once (computed exactly, :func:`_fma32`)."""
    xs, ws, bs = x.tolist(), w.tolist(), b.tolist()
    want = torch.empty(x.shape[0], w.shape[0])
    for m in range(x.shape[0]):
        for n in range(w.shape[0]):
            acc = 0.0
            for k in range(x.shape[1]):
                acc = _fma32(ws[n][k], xs[m][k], acc)
            want[m, n] = torch.tensor(acc, dtype=torch.float32) + torch.tensor(bs[n], dtype=torch.float32)
    return want


@needs_kernel
@pytest.mark.parametrize("M,K,N", [(1, 23, 19), (5, 23, 19), (7, 23, 19), (18, 23, 19), (7, 300, 19), (18, 300, 19),
                                   (12, 40, 67), (17, 40, 49), (9, 33, 35)])
def test_every_output_is_the_float32_fma_chain_over_k(M, K, N):
    """Bitwise: y[m, n] = fma(w[n, K-1], x[m, K-1], ... fma(w[n, 0], x[m, 0], 0)) + b[n] in float32,
    whatever the build (AVX-512 or AVX2), the tile, the row groups and their panels of x: what
    makes both builds give the same bits, and a tree's products the one-token products.
    N = 19: a tail block (19 = 16 + 3), upper-half lanes of the AVX2 tile. Past 8 rows (AVX-512),
    units of 3 blocks take the row groups in turns of 16 k-steps: K = 40 and 33 end in a partial
    turn; N = 67, 49 and 35 end in a unit of 2, 1 and 3 blocks, the last one partial."""
    gen = torch.Generator().manual_seed(7)
    x, w, b = torch.randn(M, K, generator=gen), torch.randn(N, K, generator=gen), torch.randn(N, generator=gen)
    y = cpu_gemm.small_linear(x, w, b)
    assert torch.equal(y, _fma_chain(x, w, b))


def test_the_build_follows_the_cpu_flags():
    assert cpu_gemm._machine_isa({"avx2", "fma", "avx512f"}) == "avx512"
    assert cpu_gemm._machine_isa({"avx2", "fma"}) == "avx2"
    assert cpu_gemm._machine_isa({"avx2"}) is None and cpu_gemm._machine_isa(set()) is None


@pytest.mark.compile
@pytest.mark.parametrize("isa", [name for name, _, _ in cpu_gemm.ISAS])
def test_each_instruction_set_form_of_the_source_compiles(isa):
    """Both forms of cpu_gemm.cpp compile (syntax and intrinsics, not run): a machine of one kind
    (and its CI) cannot run the other form, so this catches a change that breaks it."""
    import shutil
    import subprocess
    import sysconfig

    from torch.utils.cpp_extension import include_paths

    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    flags = next(cflags for name, _, cflags in cpu_gemm.ISAS if name == isa)
    includes = [f"-I{d}" for d in [*include_paths(), sysconfig.get_paths()["include"]]]
    for source in (cpu_gemm._SOURCE, cpu_gemm._ATTENTION_SOURCE, cpu_gemm._ARGMAX_SOURCE):  # the extension's files
        run = subprocess.run([cxx, "-fsyntax-only", "-std=c++17", "-fopenmp", *flags, *includes,
                              "-DTORCH_EXTENSION_NAME=check", str(source)], capture_output=True, text=True)
        assert run.returncode == 0, (source.name, run.stderr[-2000:])


@needs_kernel
@pytest.mark.parametrize("M,K,N", [(1, 23, 19), (7, 300, 19), (18, 300, 19), (12, 40, 67)])
def test_bfloat16_outputs_are_the_float32_fma_chain_rounded_once(M, K, N):
    """bfloat16 weights and x: every output is the float32 FMA chain over k of their (exactly)
    widened values, plus the bias, rounded once to bfloat16 (bitwise); a row's result does not
    depend on the other rows of the call."""
    gen = torch.Generator().manual_seed(11)
    x, w, b = (torch.randn(*s, generator=gen).bfloat16() for s in ((M, K), (N, K), (N,)))
    y = cpu_gemm.small_linear(x, w, b)
    assert y.dtype == torch.bfloat16 and y.shape == (M, N)
    assert torch.equal(y, _fma_chain(x.float(), w.float(), b.float()).bfloat16())
    assert torch.equal(y, torch.cat([cpu_gemm.small_linear(x[m:m + 1], w, b) for m in range(M)]))


@needs_kernel
@pytest.mark.parametrize("M,K,N", [(1, 23, 19), (12, 40, 67)])
def test_float32_x_with_bfloat16_weights_gives_the_float32_chain_unrounded(M, K, N):
    """The mixed form (kernels/cpu_argmax.py's screen): float32 x against a bf16 packed copy gives
    float32 outputs, the FMA chain over the widened weights, not rounded to bf16."""
    gen = torch.Generator().manual_seed(13)
    x, w = torch.randn(M, K, generator=gen), torch.randn(N, K, generator=gen).bfloat16()
    ext = cpu_gemm._load()
    y = ext.packed_linear(x, ext.pack(w), N, None)
    assert y.dtype == torch.float32 and y.shape == (M, N)
    assert torch.equal(y, _fma_chain(x, w.float(), torch.zeros(N)))


@needs_kernel
def test_non_contiguous_inputs_and_what_goes_to_the_reference():
    gen = torch.Generator().manual_seed(2)
    w = torch.randn(64, 48, generator=gen)
    xt = torch.randn(48, 3, generator=gen).T  # (3, 48), not contiguous
    torch.testing.assert_close(cpu_gemm.small_linear(xt, w).double(), _ref(xt, w, None), atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(cpu_gemm.small_linear(xt, w.T.contiguous().T).double(), _ref(xt, w, None),
                               atol=2e-5, rtol=1e-5)
    xh, wh = xt.half(), w.half()
    assert not cpu_gemm.supports(xh, wh) and torch.equal(cpu_gemm.small_linear(xh, wh), F.linear(xh, wh))
    assert cpu_gemm.supports(xt.bfloat16(), w.bfloat16()) and not cpu_gemm.supports(xt.bfloat16(), w)  # alike only
    wg = w.clone().requires_grad_(True)
    assert not cpu_gemm.supports(xt, wg)
    cpu_gemm.small_linear(xt, wg).sum().backward()  # autograd's path: the reference
    assert wg.grad is not None
    with torch.no_grad():
        assert cpu_gemm.supports(xt, wg)


@needs_kernel
def test_packed_copy_is_kept_remade_after_an_update_and_dropped_with_the_weight():
    """The packed copy: made once per weight (views of its memory share it); an in-place update of
    the weight makes a new one (results follow the new values); it goes when the weight goes."""
    import gc

    gen = torch.Generator().manual_seed(3)
    w, x = torch.randn(40, 33, generator=gen), torch.randn(5, 33, generator=gen)
    p = cpu_gemm.packed_weight(w)
    assert p.shape == (3, 33, 16) and cpu_gemm.packed_weight(w) is p
    assert cpu_gemm.packed_weight(w.view(40, 33)) is p  # a view: same memory, same version counter
    assert torch.equal(p.transpose(1, 2).reshape(48, 33)[:40], w) and not p.transpose(1, 2).reshape(48, 33)[40:].any()
    before = cpu_gemm.small_linear(x, w)
    with torch.no_grad():
        w.mul_(-2.0)
    assert cpu_gemm.packed_weight(w) is not p
    torch.testing.assert_close(cpu_gemm.small_linear(x, w), -2.0 * before, atol=1e-5, rtol=1e-5)
    key = WeightMemo._key(w, ())
    assert key in cpu_gemm._PACKS._entries
    del w
    gc.collect()
    assert key not in cpu_gemm._PACKS._entries


def test_unavailable_means_the_reference(monkeypatch):
    monkeypatch.setattr(cpu_gemm, "_EXT", None)
    monkeypatch.setattr(cpu_gemm, "_TRIED", True)
    monkeypatch.setattr(cpu_gemm, "_REASON", "needs a CPU with AVX-512F or AVX2 + FMA")
    x, w = torch.randn(2, 16), torch.randn(8, 16)
    assert not cpu_gemm.available() and cpu_gemm.unavailable_reason() == "needs a CPU with AVX-512F or AVX2 + FMA"
    assert cpu_gemm.isa() is None
    assert torch.equal(cpu_gemm.small_linear(x, w), F.linear(x, w))



@pytest.mark.parametrize("case", ["disabled", "build fails", "no avx512 or avx2"])
def test_where_the_kernel_cannot_run_it_says_why(case, monkeypatch):
    """EAGLE_CPU_GEMM=0, a failed build (no compiler, ...) and a CPU with neither AVX-512F nor AVX2 +
    FMA (here: AVX2 alone) each leave the
    kernel off with a reason (a failed build also warns once) and small_linear == F.linear."""
    monkeypatch.setattr(cpu_gemm, "_EXT", None)
    monkeypatch.setattr(cpu_gemm, "_TRIED", False)
    monkeypatch.setattr(cpu_gemm, "_REASON", None)
    monkeypatch.setattr(cpu_gemm.platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(cpu_gemm, "_cpu_flags", lambda: {"avx2"} if case == "no avx512 or avx2" else {"avx512f"})
    if case == "disabled":
        monkeypatch.setenv("EAGLE_CPU_GEMM", "0")

    def failing_build():
        raise OSError("g++: command not found")

    monkeypatch.setattr(cpu_gemm, "_build", failing_build)
    if case == "build fails":
        with pytest.warns(RuntimeWarning, match="small-row CPU GEMM off"):
            assert not cpu_gemm.available()
    else:
        assert not cpu_gemm.available()
    reason = cpu_gemm.unavailable_reason()
    assert reason == {"disabled": "disabled by EAGLE_CPU_GEMM=0", "no avx512 or avx2": "needs a CPU with AVX-512F or AVX2 + FMA",
                      "build fails": "could not build kernels/cpu_gemm.cpp: OSError: g++: command not found"}[case]
    x, w = torch.randn(3, 16), torch.randn(8, 16)
    assert torch.equal(cpu_gemm.small_linear(x, w), F.linear(x, w))


@needs_kernel
def test_bench_roofline_rows_take_the_larger_bound(capsys):
    from eagle_kernels import bench_cpu_gemm as bench

    gen = torch.Generator().manual_seed(0)
    weights = [torch.randn(64, 576, generator=gen), torch.randn(32, 1536, generator=gen)]
    assert bench.roofline(weights, [1, 4], rounds=1, gen=gen, bw=0.5, calls=40) == 0
    out = capsys.readouterr().out
    gemm = [line for line in out.splitlines() if "MKL's GEMM of 1024 x 1024 in cache" in line]
    assert len(gemm) == 1 and float(gemm[0].split(": ")[1].split()[0]) > 0
    rows = [r.split("|")[1:-1] for r in out.splitlines() if r.startswith("| 1 |") or r.startswith("| 4 |")]
    assert len(rows) == 2
    mb = (64 * 576 + 32 * 1536) * 4 / 1e6
    for r in rows:
        rate, mem, arith, bound, measured, ratio = (float(c) for c in r[1:])
        assert rate > 0 and mem == pytest.approx(mb / 0.5, abs=0.05)
        assert bound == pytest.approx(max(mem, arith), abs=0.05)
        assert ratio == pytest.approx(measured / bound, abs=0.01 + 0.06 / bound)


@needs_kernel
def test_bench_against_a_revision(capsys, monkeypatch):
    """`--against REV`: the revision's source is built beside this one (here: stand-ins, no compiler
    run) and both are timed on the same weights; a source with the old `small_linear(x, w, b)` API
    is called on the plain weights; a revision without the file is an error naming it."""
    from eagle_kernels import bench_cpu_gemm as bench

    gen = torch.Generator().manual_seed(0)
    weights = [torch.randn(64, 576, generator=gen), torch.randn(32, 1536, generator=gen)]
    real, built, calls = cpu_gemm._load(), [], []

    class OldApi:  # a revision from before the packed layout
        @staticmethod
        def small_linear(x, w, b):
            calls.append(tuple(w.shape))
            return F.linear(x, w, b)

    for base in (real, OldApi()):
        monkeypatch.setattr(cpu_gemm, "_build", lambda variant, source, base=base: built.append(
            (variant, source.read_text()[:2])) or base)
        assert bench.against(weights, [1, 3], rounds=1, gen=gen, rev="HEAD") == 0
        rows = [r for r in capsys.readouterr().out.splitlines() if r.startswith("| 1 |") or r.startswith("| 3 |")]
        assert len(rows) == 2 and all(float(r.split("|")[4]) > 0 for r in rows)
    assert built == [("-rev-HEAD", "//")] * 2  # the revision's own cpu_gemm.cpp, a build of its own
    assert set(calls) == {(64, 576), (32, 1536)}
    assert bench.against(weights, [1], rounds=1, gen=gen, rev="no-such-revision-xyz") == 2
    assert "no kernels/cpu_gemm.cpp at revision 'no-such-revision-xyz'" in capsys.readouterr().err


def test_bench_variants_parse_and_reject():
    from eagle_kernels import bench_cpu_gemm as bench

    assert bench.parse_variants("pf8k:CPU_GEMM_PREFETCH_BYTES=8192, both:CPU_GEMM_CHUNK_K=8;CPU_GEMM_PREFETCH_T0") == [
        ("pf8k", ("CPU_GEMM_PREFETCH_BYTES=8192",)), ("both", ("CPU_GEMM_CHUNK_K=8", "CPU_GEMM_PREFETCH_T0"))]
    for bad, msg in [("pf8k", "is not NAME:DEFINE"), ("x:", "is not NAME:DEFINE"), ("a-b:CPU_GEMM_CHUNK_K=8", "is not NAME"),
                     ("x:OTHER=1", "is not a CPU_GEMM_"), ("x:CPU_GEMM_CHUNK_K=8;rm -rf", "is not a CPU_GEMM_"),
                     ("x:CPU_GEMM_CHUNK_K=8,x:CPU_GEMM_CHUNK_K=4", "each name once"), ("", "at least one")]:
        with pytest.raises(ValueError, match=msg):
            bench.parse_variants(bad)


def test_bench_variants_cli_error(capsys):
    from eagle_kernels import bench_cpu_gemm as bench

    assert bench.main(["--rows", "1", "--variants", "x:OTHER"]) == 2
    assert "'OTHER' is not a CPU_GEMM_* switch" in capsys.readouterr().err


@needs_kernel
def test_bench_variants_table(capsys, monkeypatch):
    """Each variant is built with its switches (here: stand-ins for the builds) and timed beside the
    shipped build on the same weights; the table has one ratio per variant."""
    from eagle_kernels import bench_cpu_gemm as bench

    gen = torch.Generator().manual_seed(0)
    weights = [torch.randn(64, 576, generator=gen), torch.randn(32, 1536, generator=gen)]
    built = []
    monkeypatch.setattr(cpu_gemm, "_build", lambda variant, defines: built.append((variant, defines)) or cpu_gemm._load())
    specs = bench.parse_variants("a:CPU_GEMM_CHUNK_K=8,b:CPU_GEMM_PREFETCH_T0")
    assert bench.variants(weights, [1, 12], rounds=1, gen=gen, specs=specs) == 0
    assert built == [("-var-a", ("CPU_GEMM_CHUNK_K=8",)), ("-var-b", ("CPU_GEMM_PREFETCH_T0",))]
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "| rows | shipped, ms | a, ms | b, ms | a / shipped | b / shipped |"
    rows = [r.split("|")[1:-1] for r in out if r.startswith("| 1 |") or r.startswith("| 12 |")]
    assert len(rows) == 2
    for r in rows:  # (the times are too short here to check the ratios against the rounded times)
        assert len(r) == 6 and all(float(c) >= 0 for c in r[1:4]) and all(float(c) > 0 for c in r[4:])


@needs_kernel
@pytest.mark.compile
def test_switches_keep_results_bitwise():
    """A build with other turn and prefetch settings (what `--variants` times) computes the same FMA
    chain per output: its results equal the shipped build's bit for bit, rows in turns included."""
    ext = cpu_gemm._load()
    other = cpu_gemm._build("-var-test", ("CPU_GEMM_CHUNK_K=7", "CPU_GEMM_PREFETCH_EVERY_GROUP", "CPU_GEMM_PREFETCH_BYTES=1024"))
    gen = torch.Generator().manual_seed(3)
    for n, k in [(100, 576), (48, 1536), (17, 40)]:
        w = torch.randn(n, k, generator=gen)
        p = cpu_gemm.packed_weight(w)
        b = torch.randn(n, generator=gen)
        for rows in (1, 9, 16, 23):
            x = torch.randn(rows, k, generator=gen)
            assert torch.equal(other.packed_linear(x, p, n, b), ext.packed_linear(x, p, n, b)), (n, k, rows)


def test_bench_plans_parse_and_reject(capsys):
    from eagle_kernels import bench_cpu_gemm as bench

    assert bench.parse_plans("a:width=1;prefetch_many=16384, b:turns=0") == [
        ("a", {"width": 1, "prefetch_many": 16384}), ("b", {"turns": 0})]
    for bad, msg in [("a", "is not NAME:KEY"), ("a-b:turns=0", "is not NAME"), ("a:speed=2", "is not one of width=INT"),
                     ("a:turns=x", "is not one of"), ("a:turns=0,a:turns=1", "each name once"), ("", "at least one")]:
        with pytest.raises(ValueError, match=msg):
            bench.parse_plans(bad)
    assert bench.main(["--rows", "1", "--plans", "a:speed=2"]) == 2
    assert "'speed=2' is not one of" in capsys.readouterr().err


@needs_kernel
def test_bench_plans_table_restores_the_chosen_plan(capsys):
    """Each plan is timed beside the chosen one (a key left out keeps the chosen value), and the
    chosen plan is in force again afterwards."""
    from eagle_kernels import bench_cpu_gemm as bench

    gen = torch.Generator().manual_seed(0)
    weights = [torch.randn(64, 576, generator=gen), torch.randn(32, 1536, generator=gen)]
    before = cpu_gemm.plan()
    specs = bench.parse_plans("far:prefetch_many=16384;turns=0,near:prefetch=128")
    assert bench.plans(weights, [1, 12], rounds=1, gen=gen, specs=specs) == 0
    assert cpu_gemm.plan() == before
    out = capsys.readouterr().out.splitlines()
    assert "far: width=%d, prefetch=%d, prefetch_many=16384, turns=0" % (before["width"], before["prefetch"]) in out[0]
    assert out[1] == "| rows | chosen, ms | far, ms | near, ms | far / chosen | near / chosen |"
    rows = [r for r in out if r.startswith("| 1 |") or r.startswith("| 12 |")]
    assert len(rows) == 2  # (times too short here to check the ratios against the rounded times)
    for r in rows:
        cells = [float(c) for c in r.split("|")[2:-1]]
        assert len(cells) == 5 and all(c >= 0 for c in cells[:3]) and all(c > 0 for c in cells[3:])
