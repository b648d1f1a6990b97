"""Tests of the Triton tree-attention kernel (run on the CPU through the Triton interpreter).

Ground truth is float64: the dense reference on upcast inputs, and an independent per-node check
that gathers the prefix plus each node's root-to-node path and runs plain softmax attention for
that one query. Error bound per dtype (``TOL``): ``|out - ref| <= tol * (1 + |ref|)``.
"""
from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # must precede the first import of triton / kernels

import pytest
import torch

from eagle_kernels import tree_attention as ta
from eagle_kernels.tree_attention import (
    dense_tree_mask,
    pack_ancestors,
    tree_attention,
    tree_attention_reference,
    unpack_ancestors,
    use_triton,
)

# atol = rtol = tol. Observed worst case over 40 random trees (P < 100, D <= 64) in the interpreter:
# fp32 5e-7, fp16 2.7e-4, bf16 4.8e-3 (in units of 1 + |ref|): bf16/fp16 are dominated by rounding
# the output and the softmax weights P to the input dtype before P @ V.
TOL = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 1e-2}
DTYPES = list(TOL)


# ------------------------------------------------------------------------------------------------
# helpers
# ------------------------------------------------------------------------------------------------
def random_parents(T: int, gen: torch.Generator) -> list[int]:
    """A random non-uniform tree in topological order: parents[0] = -1, parents[i] < i."""
    return [-1] + [int(torch.randint(0, i, (1,), generator=gen)) for i in range(1, T)]


def chain_parents(T: int) -> list[int]:
    return list(range(-1, T - 1))


def ancestors_of(parents: list[int]) -> torch.Tensor:
    """(T, T) bool, [i, j] iff j is i or an ancestor of i (walk the parent pointers)."""
    T = len(parents)
    anc = torch.zeros(T, T, dtype=torch.bool)
    for i in range(T):
        j = i
        while j >= 0:
            anc[i, j] = True
            j = parents[j]
    return anc


def path_of(parents: list[int], i: int) -> list[int]:
    path = []
    while i >= 0:
        path.append(i)
        i = parents[i]
    return path[::-1]


def make_qkv(B, Hq, Hkv, T, P, D, dtype, gen, q_scale=1.0):
    q = (torch.randn(B, Hq, T, D, generator=gen) * q_scale).to(dtype)  # (B, Hq, T, D)
    k = torch.randn(B, Hkv, P + T, D, generator=gen).to(dtype)  # (B, Hkv, P+T, D)
    v = torch.randn(B, Hkv, P + T, D, generator=gen).to(dtype)
    return q, k, v


def ref64(q, k, v, anc, scale=None):
    """float64 dense reference on the (already rounded) inputs."""
    return tree_attention_reference(q.double(), k.double(), v.double(), anc, scale)


def path_attention(q, k, v, parents_per_batch, scale=None):
    """Per-node ground truth: node i attends to prefix + path(i) only; plain softmax, one query.

    ``parents_per_batch``: list (len B) of parents lists. Returns float64 (B, Hq, T, D).
    """
    B, Hq, T, D = q.shape
    Hkv, P = k.shape[1], k.shape[2] - T
    G = Hq // Hkv
    scale = D ** -0.5 if scale is None else scale
    out = torch.empty(B, Hq, T, D, dtype=torch.float64)
    for b in range(B):
        for i in range(T):
            idx = torch.tensor(list(range(P)) + [P + j for j in path_of(parents_per_batch[b], i)])
            for h in range(Hq):
                kk = k[b, h // G, idx].double()  # (P + depth + 1, D)
                vv = v[b, h // G, idx].double()
                w = torch.softmax(kk @ q[b, h, i].double() * scale, dim=0)  # (P + depth + 1,)
                out[b, h, i] = w @ vv
    return out


def assert_close(out, ref, dtype):
    assert out.dtype == dtype
    tol = TOL[dtype]
    err = (out.double() - ref).abs()
    bound = tol * (1 + ref.abs())
    assert torch.isfinite(out).all(), "non-finite output"
    worst = (err / (1 + ref.abs())).max().item()
    assert bool((err <= bound).all()), f"{dtype}: max error {worst:.3g} (x (1 + |ref|)) exceeds {tol:g}"


# ------------------------------------------------------------------------------------------------
# correctness
# ------------------------------------------------------------------------------------------------
INTERPRETER_HINT = (
    "the Triton kernel is not running in the interpreter: triton was imported before TRITON_INTERPRET=1 "
    "was set (e.g. by another test module); set it in tests/conftest.py or the environment")


@pytest.fixture(autouse=True)
def _kernel_must_be_interpreted(request):
    """Without the interpreter every CPU call would silently test the torch fallback instead."""
    if "falls_back" not in request.node.name and "use_triton" not in request.node.name:
        assert use_triton("cpu"), INTERPRETER_HINT


def test_runs_the_triton_interpreter():
    assert use_triton("cpu") and ta._KERNEL_INTERPRETED, INTERPRETER_HINT


# (B, Hq, Hkv, T, P, D): GQA ratios 1/3/4/8, P = 0, P not a multiple of the 32-key block,
# T = 1, T spanning two mask words and two key blocks (T = 40 > 32), D not a power of two.
CASES = [
    (1, 2, 2, 7, 32, 16),  # MHA, P one full block
    (1, 3, 1, 9, 45, 32),  # GQA 3, ragged prefix tail
    (2, 4, 1, 12, 0, 16),  # GQA 4, no prefix, batch 2
    (1, 8, 1, 5, 19, 16),  # GQA 8, P < one block
    (1, 4, 2, 1, 33, 32),  # single node
    (1, 2, 1, 40, 70, 16),  # two mask words, two tree blocks, tail
    (1, 2, 2, 6, 20, 24),  # head dim padded 24 -> 32
    (1, 2, 1, 16, 64, 64),  # D = 64, two full prefix blocks
]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).split(".")[-1])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "B{}_Hq{}_Hkv{}_T{}_P{}_D{}".format(*c))
def test_random_tree_matches_float64_reference(case, dtype):
    B, Hq, Hkv, T, P, D = case
    gen = torch.Generator().manual_seed(hash(case) % 2**31)
    anc = ancestors_of(random_parents(T, gen))
    q, k, v = make_qkv(B, Hq, Hkv, T, P, D, dtype, gen)
    out = tree_attention(q, k, v, anc)
    assert out.shape == q.shape
    assert_close(out, ref64(q, k, v, anc), dtype)


@pytest.mark.parametrize("gqa", [1, 3, 4, 8])
def test_each_node_equals_attention_over_prefix_and_its_path(gqa):
    """Independent of the dense mask: gather prefix + ancestor path keys and attend with one query."""
    B, Hkv, T, P, D = 1, 1, 11, 21, 16
    gen = torch.Generator().manual_seed(100 + gqa)
    parents = random_parents(T, gen)
    q, k, v = make_qkv(B, Hkv * gqa, Hkv, T, P, D, torch.float32, gen)
    truth = path_attention(q, k, v, [parents])
    out = tree_attention(q, k, v, ancestors_of(parents))
    assert_close(out, truth, torch.float32)
    # and the reference itself agrees with the per-node definition
    torch.testing.assert_close(ref64(q, k, v, ancestors_of(parents)), truth, atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).split(".")[-1])
def test_batch_with_a_different_tree_per_item(dtype):
    B, Hq, Hkv, T, P, D = 3, 4, 2, 10, 25, 16
    gen = torch.Generator().manual_seed(7)
    parents = [random_parents(T, gen), chain_parents(T), [-1] + [0] * (T - 1)]  # random, chain, star
    anc = torch.stack([ancestors_of(p) for p in parents])  # (B, T, T)
    q, k, v = make_qkv(B, Hq, Hkv, T, P, D, dtype, gen)
    out = tree_attention(q, k, v, anc)
    assert_close(out, path_attention(q, k, v, parents), dtype)
    # each item equals running it alone with its own (T, T) mask
    for b in range(B):
        alone = tree_attention(q[b:b + 1], k[b:b + 1], v[b:b + 1], anc[b])
        assert torch.equal(out[b:b + 1], alone)


def test_shared_2d_mask_broadcasts_over_batch():
    B, Hq, Hkv, T, P, D = 2, 2, 1, 6, 17, 16
    gen = torch.Generator().manual_seed(8)
    parents = random_parents(T, gen)
    q, k, v = make_qkv(B, Hq, Hkv, T, P, D, torch.float32, gen)
    anc = ancestors_of(parents)
    out = tree_attention(q, k, v, anc)
    assert torch.equal(out, tree_attention(q, k, v, anc.expand(B, T, T).contiguous()))
    assert_close(out, path_attention(q, k, v, [parents] * B), torch.float32)


@pytest.mark.parametrize("T,P", [(8, 0), (8, 40), (1, 0), (1, 5)])
def test_chain_and_single_node(T, P):
    """A chain is causal attention over prefix + drafted tokens; T = 1 with P = 0 returns v itself."""
    gen = torch.Generator().manual_seed(T * 100 + P)
    q, k, v = make_qkv(1, 2, 1, T, P, 16, torch.float32, gen)
    out = tree_attention(q, k, v, ancestors_of(chain_parents(T)))
    causal = torch.nn.functional.scaled_dot_product_attention(
        q.double(), k.double().repeat_interleave(2, 1), v.double().repeat_interleave(2, 1),
        attn_mask=torch.ones(T, P + T, dtype=torch.bool).tril(P))
    assert_close(out, causal, torch.float32)
    if T == 1 and P == 0:
        torch.testing.assert_close(out, v.expand_as(out), atol=1e-6, rtol=1e-6)


def test_several_query_and_key_blocks_with_small_tiles():
    """Force 16 x 16 tiles: 3 query blocks, 3 tree blocks, 2 mask words, ragged prefix tail."""
    B, Hq, Hkv, T, P, D = 1, 2, 1, 37, 29, 16
    gen = torch.Generator().manual_seed(9)
    parents = random_parents(T, gen)
    anc = ancestors_of(parents)
    q, k, v = make_qkv(B, Hq, Hkv, T, P, D, torch.float32, gen)
    out = ta._tree_attention_triton(q, k, v, pack_ancestors(anc), D ** -0.5, block_m=16, block_n=16)
    assert_close(out, path_attention(q, k, v, [parents]), torch.float32)


def test_packed_and_bool_masks_give_identical_outputs():
    B, Hq, Hkv, T, P, D = 2, 2, 1, 35, 10, 16
    gen = torch.Generator().manual_seed(10)
    anc = torch.stack([ancestors_of(random_parents(T, gen)) for _ in range(B)])  # (B, T, T)
    q, k, v = make_qkv(B, Hq, Hkv, T, P, D, torch.float16, gen)
    packed = pack_ancestors(anc)  # (B, T, 2)
    assert packed.dtype == torch.int32 and packed.shape == (B, T, 2)
    assert torch.equal(tree_attention(q, k, v, anc), tree_attention(q, k, v, packed))
    assert torch.equal(tree_attention(q, k, v, anc[0:1].expand(B, T, T)),
                       tree_attention(q, k, v, pack_ancestors(anc[0])))


def test_packing_layout_matches_eagle_tree():
    from eagle.tree import Tree, pack_bits

    gen = torch.Generator().manual_seed(11)
    for T in (1, 5, 31, 32, 33, 64, 100):
        parents = random_parents(T, gen)
        anc = ancestors_of(parents)
        tree = Tree(torch.zeros(T, dtype=torch.long), torch.tensor(parents))
        assert torch.equal(tree.ancestor_mask(), anc)
        assert torch.equal(pack_ancestors(anc), pack_bits(anc))
        assert torch.equal(pack_ancestors(anc), tree.packed_mask())
        assert torch.equal(unpack_ancestors(pack_bits(anc), T), anc)
    # bit 31 set -> negative int32 word (two's complement), decoded correctly by the kernel's shift
    anc = ancestors_of(chain_parents(40))
    assert int(pack_ancestors(anc)[39, 0]) == -1


def test_dense_tree_mask():
    anc = ancestors_of([-1, 0, 0, 1])
    m = dense_tree_mask(anc, 3)
    assert m.shape == (4, 7) and m[:, :3].all() and torch.equal(m[:, 3:], anc)
    assert torch.equal(dense_tree_mask(pack_ancestors(anc), 3), m)
    assert dense_tree_mask(anc, 0).shape == (4, 4)


def test_noncontiguous_inputs_slices_of_a_cache():
    """q as a transposed (B, T, H, D) projection, k/v as the first P+T slots of a larger cache."""
    B, Hq, Hkv, T, P, D = 2, 4, 2, 7, 30, 16
    gen = torch.Generator().manual_seed(12)
    parents = random_parents(T, gen)
    q = torch.randn(B, T, Hq, D, generator=gen).transpose(1, 2)  # (B, Hq, T, D) non-contiguous
    cache_k = torch.randn(B, Hkv, P + T + 13, D, generator=gen)
    cache_v = torch.randn(B, Hkv, P + T + 13, D, generator=gen)
    k, v = cache_k[:, :, :P + T], cache_v[:, :, :P + T]  # (B, Hkv, P+T, D) strided views
    assert not q.is_contiguous() and not k.is_contiguous()
    out = tree_attention(q, k, v, ancestors_of(parents))
    assert_close(out, path_attention(q, k, v, [parents] * B), torch.float32)
    assert torch.equal(out, tree_attention(q.contiguous(), k.contiguous(), v.contiguous(), ancestors_of(parents)))


def test_custom_scale_and_large_logits_are_stable():
    B, Hq, Hkv, T, P, D = 1, 2, 1, 9, 40, 32
    gen = torch.Generator().manual_seed(13)
    parents = random_parents(T, gen)
    q, k, v = make_qkv(B, Hq, Hkv, T, P, D, torch.float32, gen, q_scale=30.0)  # logits ~ +-100s
    for scale in (None, 0.5, 1.0):
        out = tree_attention(q, k, v, ancestors_of(parents), scale)
        assert_close(out, path_attention(q, k, v, [parents], scale), torch.float32)


def test_growing_tree_level_by_level_keeps_earlier_outputs():
    """Draft-head use: nodes never see later nodes, so adding a level leaves earlier rows unchanged."""
    B, Hq, Hkv, P, D = 1, 2, 1, 12, 16
    gen = torch.Generator().manual_seed(14)
    parents = [-1, 0, 0, 1, 1, 2, 3, 3, 5]  # levels: {0}, {1,2}, {3,4,5}, {6,7,8}
    T = len(parents)
    q, k, v = make_qkv(B, Hq, Hkv, T, P, D, torch.float32, gen)
    full = tree_attention(q, k, v, ancestors_of(parents))
    for n in (1, 3, 6):
        part = tree_attention(q[:, :, :n], k[:, :, :P + n], v[:, :, :P + n], ancestors_of(parents[:n]))
        torch.testing.assert_close(part, full[:, :, :n], atol=1e-6, rtol=1e-6)


def test_row_with_no_visible_key_is_zero_on_both_paths():
    gen = torch.Generator().manual_seed(15)
    q, k, v = make_qkv(1, 1, 1, 3, 0, 16, torch.float32, gen)
    anc = ancestors_of([-1, 0, 1])
    anc[1] = False  # breaks the contract (no diagonal); defined as a zero output
    out = tree_attention(q, k, v, anc)
    ref = tree_attention_reference(q, k, v, anc)
    assert torch.equal(out[0, 0, 1], torch.zeros(16)) and torch.equal(ref[0, 0, 1], torch.zeros(16))
    torch.testing.assert_close(out, ref, atol=1e-6, rtol=1e-6)


def test_falls_back_to_reference_without_triton(monkeypatch):
    gen = torch.Generator().manual_seed(16)
    q, k, v = make_qkv(1, 4, 2, 5, 9, 16, torch.bfloat16, gen)
    anc = ancestors_of(random_parents(5, gen))
    monkeypatch.setattr(ta, "use_triton", lambda device: False)
    out = tree_attention(q, k, v, pack_ancestors(anc))
    assert torch.equal(out, tree_attention_reference(q, k, v, anc))
    assert_close(out, ref64(q, k, v, anc), torch.bfloat16)


def test_use_triton_needs_cuda_or_the_interpreter(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET")
    assert not use_triton("cpu")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert use_triton(torch.device("cpu"))


# ------------------------------------------------------------------------------------------------
# validation
# ------------------------------------------------------------------------------------------------
def _valid(B=1, Hq=4, Hkv=2, T=5, P=3, D=16, dtype=torch.float32):
    q = torch.zeros(B, Hq, T, D, dtype=dtype)
    k = torch.zeros(B, Hkv, P + T, D, dtype=dtype)
    v = torch.zeros(B, Hkv, P + T, D, dtype=dtype)
    return q, k, v, torch.eye(T, dtype=torch.bool)


@pytest.mark.parametrize("fn", [tree_attention, tree_attention_reference], ids=["kernel", "reference"])
def test_errors(fn):
    q, k, v, anc = _valid()
    with pytest.raises(ValueError, match="q must be 4-D"):
        fn(q[0], k, v, anc)
    with pytest.raises(ValueError, match="k must be 4-D"):
        fn(q, k[0], v, anc)
    with pytest.raises(ValueError, match="q dtype torch.int64 is not supported"):
        fn(q.long(), k.long(), v.long(), anc)
    with pytest.raises(ValueError, match="share one dtype"):
        fn(q, k.half(), v, anc)
    with pytest.raises(ValueError, match="k and v shapes differ"):
        fn(q, k, v[:, :, 1:], anc)
    with pytest.raises(ValueError, match="batch size mismatch"):
        fn(q, k.expand(2, -1, -1, -1), v.expand(2, -1, -1, -1), anc)
    with pytest.raises(ValueError, match="head dim mismatch"):
        fn(q, k[..., :8], v[..., :8], anc)
    with pytest.raises(ValueError, match=r"query heads \(4\) must be a multiple of key/value heads \(3\)"):
        q2, k2, v2, _ = _valid(Hkv=3)
        fn(q2, k2, v2, anc)
    with pytest.raises(ValueError, match="fewer than the T=5 tree nodes"):
        fn(q, k[:, :, :4], v[:, :, :4], anc)
    with pytest.raises(ValueError, match="head dim 512 is outside"):
        q2, k2, v2, _ = _valid(D=512)
        fn(q2, k2, v2, anc)
    with pytest.raises(ValueError, match=r"bool ancestors mask must be .*got shape \(5, 4\)"):
        fn(q, k, v, anc[:, :4])
    with pytest.raises(ValueError, match=r"bool ancestors mask must be .*got shape \(6, 6\)"):
        fn(q, k, v, torch.eye(6, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"bool ancestors mask must be .*got shape \(2, 5, 5\)"):
        fn(q, k, v, anc.expand(2, 5, 5))  # batch 1, mask for 2
    with pytest.raises(ValueError, match=r"bool ancestors mask must be .*got shape \(5,\)"):
        fn(q, k, v, anc[0])
    with pytest.raises(ValueError, match=r"packed int32 ancestors mask must be .*W = ceil\(T/32\).*got shape \(5, 5\)"):
        fn(q, k, v, anc.int())  # an unpacked 0/1 int32 matrix is not the packed form
    with pytest.raises(ValueError, match="ancestors dtype must be torch.bool .* or torch.int32"):
        fn(q, k, v, anc.float())
    with pytest.raises(ValueError, match="must be a torch.Tensor"):
        fn(q, k, v, anc.tolist())


def test_kernel_rejects_float64_but_reference_accepts_it():
    q, k, v, anc = _valid()
    with pytest.raises(ValueError, match="q dtype torch.float64 is not supported"):
        tree_attention(q.double(), k.double(), v.double(), anc)
    assert tree_attention_reference(q.double(), k.double(), v.double(), anc).dtype == torch.float64


# ------------------------------------------------------------------------------------------------
# benchmark smoke mode
# ------------------------------------------------------------------------------------------------
def test_bench_smoke_mode_in_process(tmp_path, capsys):
    from eagle_kernels import bench_tree_attention as bench

    out = tmp_path / "bench.md"
    assert bench.main(["--smoke", "--out", str(out)]) == 0
    text = out.read_text()
    assert "interpreter" in text.lower() and "| P |" in text
    assert "max err" in text
    printed = capsys.readouterr().out
    assert "smoke" in printed.lower()


# ------------------------------------------------------------------------------------------------
# GPU readiness without a GPU: compile the real (non-interpreted) kernel for Hopper and Ampere
# ------------------------------------------------------------------------------------------------
_COMPILE_SCRIPT = r'''
import os, re, subprocess, sys
import torch, triton
from triton.backends.compiler import GPUTarget
from triton.backends.nvidia.compiler import get_ptxas
from triton.compiler import ASTSource
from eagle_kernels import tree_attention as ta
assert not ta._KERNEL_INTERPRETED
fn = ta._tree_attn_fwd
names = list(fn.arg_names)
TY = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}
for arch, dtype, D, T in [(90, torch.bfloat16, 128, 16), (90, torch.bfloat16, 128, 128), (90, torch.float16, 64, 64),
                          (90, torch.bfloat16, 256, 16), (90, torch.float32, 64, 16), (80, torch.bfloat16, 128, 16)]:
    cfg = ta._launch_config(T, D, dtype, interpret=False)
    ty = TY[dtype]
    sig = {n: "i32" for n in names}
    sig.update(Q="*" + ty, K="*" + ty, V="*" + ty, O="*" + ty, MASK="*i32", PLEN="*i32", qk_scale="fp32")
    # what a launch on contiguous (B, H, S, D) tensors specializes: unit strides become constants,
    # 16-aligned pointers and strides carry tt.divisibility
    const = {n: 1 for n in ("stride_qd", "stride_kd", "stride_vd", "stride_od", "stride_mw")}
    const.update(GROUP=4, HEAD_DIM=D, BLOCK_D=D, BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"],
                 DOT_PRECISION="ieee" if dtype == torch.float32 else "tf32", DOT_UPCAST=False)
    sig.update({n: "constexpr" for n in const})
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in
             ("Q", "K", "V", "O", "MASK", "stride_qb", "stride_qh", "stride_qt", "stride_kb", "stride_kh",
              "stride_kn", "stride_vb", "stride_vh", "stride_vn", "stride_ob", "stride_oh", "stride_ot")}
    k = triton.compile(ASTSource(fn, sig, constexprs=const, attrs=attrs), target=GPUTarget("cuda", arch, 32),
                       options={"num_warps": cfg["num_warps"], "num_stages": cfg["num_stages"]})
    assert k.asm["cubin"], "no cubin"
    ptx = os.path.join(os.environ["TMPDIR_K"], "k.ptx")
    open(ptx, "w").write(k.asm["ptx"])
    res = subprocess.run([get_ptxas(arch).path, "-v", f"--gpu-name=sm_{arch}{'a' if arch == 90 else ''}", ptx,
                          "-o", ptx + ".o"], capture_output=True, text=True, check=True)
    spills = int(re.search(r"(\d+) bytes spill stores", res.stderr).group(1))
    regs = int(re.search(r"Used (\d+) registers", res.stderr).group(1))
    print(f"sm_{arch} {ty} D={D} T={T} {cfg} shared={k.metadata.shared} regs={regs} spill={spills}")
    if dtype != torch.float32:  # fp32 (exact FMA dot, no tensor cores) is a correctness path, not tuned
        assert spills == 0, f"register spills for {ty} D={D} T={T}: {spills} bytes"
'''


@pytest.mark.ptxas
def test_kernel_compiles_for_hopper_and_ampere_without_spills(tmp_path):
    """The interpreter accepts code the GPU compiler may reject: compile the real kernel (ptxas
    included) for sm_90 / sm_80 at the launch configs, and check half-precision tiles do not spill."""
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TMPDIR_K"] = str(tmp_path)
    env["TRITON_CACHE_DIR"] = str(tmp_path / "cache")
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = repo + os.pathsep + env.get("PYTHONPATH", "")
    res = subprocess.run([sys.executable, "-c", _COMPILE_SCRIPT], cwd=repo, env=env, capture_output=True,
                         text=True, timeout=600)
    print(res.stdout)
    assert res.returncode == 0, res.stdout + res.stderr[-3000:]
    assert res.stdout.count("spill=") == 6, res.stdout


# ------------------------------------------------------------------------------------------------
# slot buffers: the prefix length from a device tensor (static caches, compiled steps)
# ------------------------------------------------------------------------------------------------
def _slot_case(B, Hq, Hkv, T, C, D, dtype, gen, prefixes):
    """Random (q, buffer k/v of C slots filled with noise everywhere, per-batch trees) and, per batch
    item, the contiguous ``[prefix | tree]`` keys the same attention reads."""
    q = torch.randn(B, Hq, T, D, generator=gen).to(dtype)  # (B, Hq, T, D)
    k = torch.randn(B, Hkv, C, D, generator=gen)  # (B, Hkv, C, D)
    v = torch.randn(B, Hkv, C, D, generator=gen)
    for b, P in enumerate(prefixes):  # slots past the tree: large, so reading any of them shows
        k[b, :, P + T:] *= 100
        v[b, :, P + T:] = 1e4
    k, v = k.to(dtype), v.to(dtype)
    parents = [random_parents(T, gen) for _ in range(B)]
    anc = torch.stack([ancestors_of(p) for p in parents])  # (B, T, T)
    plen = torch.tensor(prefixes, dtype=torch.int32)  # (B,)
    return q, k, v, anc, plen, parents


@pytest.mark.parametrize("dtype", DTYPES)
def test_slot_buffer_equals_prefix_and_tree_keys(dtype):
    """Keys in a slot buffer (tree at prefix_len[b], noise past it), a different prefix length and
    tree per batch item, GQA: each item equals the kernel on its own contiguous [prefix | tree]
    keys and the per-node path attention; the reference agrees."""
    B, Hq, Hkv, T, C, D = 3, 4, 2, 13, 96, 32
    gen = torch.Generator().manual_seed(21)
    q, k, v, anc, plen, parents = _slot_case(B, Hq, Hkv, T, C, D, dtype, gen, [0, 37, 83])
    out = tree_attention(q, k, v, pack_ancestors(anc), prefix_len=plen)
    ref = tree_attention_reference(q.double(), k.double(), v.double(), anc, prefix_len=plen)
    assert_close(out, ref, dtype)
    for b, P in enumerate(plen.tolist()):
        kb, vb = k[b:b + 1, :, :P + T], v[b:b + 1, :, :P + T]  # [prefix | tree]
        assert_close(out[b:b + 1], path_attention(q[b:b + 1], kb, vb, [parents[b]]), dtype)
        assert torch.equal(out[b:b + 1], tree_attention(q[b:b + 1], kb, vb, pack_ancestors(anc[b])))


def test_slot_buffer_one_length_for_the_batch_and_small_tiles():
    """prefix_len of shape (1,) broadcasts; 16 x 16 tiles cover several blocks and a ragged tail."""
    B, Hq, Hkv, T, C, D = 2, 2, 1, 37, 128, 16
    gen = torch.Generator().manual_seed(22)
    q, k, v, anc, _, parents = _slot_case(B, Hq, Hkv, T, C, D, torch.float32, gen, [45, 45])
    plen = torch.tensor([45], dtype=torch.int32)
    out = ta._tree_attention_triton(q, k, v, pack_ancestors(anc), D ** -0.5, block_m=16, block_n=16, prefix_len=plen)
    assert_close(out, path_attention(q, k[:, :, :45 + T], v[:, :, :45 + T], parents), torch.float32)


def test_slot_tree_mask_layout():
    anc = ancestors_of([-1, 0, 0])  # root, two children
    m = ta.slot_tree_mask(anc, torch.tensor([2], dtype=torch.int32), 7)
    assert m.shape == (1, 3, 7)
    assert m[0].int().tolist() == [[1, 1, 1, 0, 0, 0, 0], [1, 1, 1, 1, 0, 0, 0], [1, 1, 1, 0, 1, 0, 0]]
    m2 = ta.slot_tree_mask(pack_ancestors(anc), torch.tensor([0, 4], dtype=torch.int32), 7)
    assert m2.shape == (2, 3, 7) and torch.equal(m2[1], torch.cat([torch.ones(3, 4, dtype=torch.bool), anc], 1))


def test_slot_buffer_errors():
    q, k, v, anc = _valid()
    for bad in (torch.tensor([1]), torch.tensor([[1]], dtype=torch.int32), torch.tensor([1, 2], dtype=torch.int32), 3):
        with pytest.raises(ValueError, match=r"prefix_len must be an int32 tensor of shape \(1,\) or \(B,\)"):
            tree_attention(q, k, v, anc, prefix_len=bad)


def test_custom_op_schema_and_fake_tensor():
    """torch.library's own checks of the registered op (schema, fake implementation, autograd
    registration, dispatch), on the interpreted kernel."""
    B, Hq, Hkv, T, C, D = 2, 4, 2, 9, 48, 16
    gen = torch.Generator().manual_seed(23)
    q, k, v, anc, plen, _ = _slot_case(B, Hq, Hkv, T, C, D, torch.float32, gen, [5, 30])
    args = (q, k, v, pack_ancestors(anc), plen, D ** -0.5)
    torch.library.opcheck(torch.ops.eagle.tree_attention.default, args)
    assert torch.equal(torch.ops.eagle.tree_attention(*args), tree_attention(q, k, v, args[3], prefix_len=plen))


@pytest.mark.compile
def test_custom_op_stays_one_node_in_a_compiled_graph():
    """torch.compile(fullgraph=True) of attention through the op (no graph break, the kernel not
    traced into) equals eager, and a second prefix length reuses the graph (no recompile)."""
    import torch._dynamo

    B, Hq, Hkv, T, C, D = 1, 4, 2, 8, 64, 16
    gen = torch.Generator().manual_seed(24)
    q, k, v, anc, _, _ = _slot_case(B, Hq, Hkv, T, C, D, torch.float32, gen, [0])
    words = pack_ancestors(anc)

    def attend(q, k, v, words, plen):
        return torch.ops.eagle.tree_attention(q * 1.0, k, v, words, plen, D ** -0.5) + 1.0

    torch._dynamo.reset()
    counts = torch._dynamo.utils.counters
    counts.clear()
    fn = torch.compile(attend, fullgraph=True, dynamic=False)
    for P in (3, 40):
        plen = torch.tensor([P], dtype=torch.int32)
        torch.testing.assert_close(fn(q, k, v, words, plen), attend(q, k, v, words, plen), atol=1e-6, rtol=1e-6)
    assert counts["stats"]["unique_graphs"] == 1
