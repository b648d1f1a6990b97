"""Tree attention: every drafted tree node attends to the committed prefix plus its own ancestors.

This is the attention a verifier (target model) or a draft head runs over a candidate tree. The
``T`` tree nodes are appended after ``P`` committed prefix positions in the KV cache; node ``i``
may see all ``P`` prefix keys and, among the last ``T`` keys, exactly the nodes ``j`` with
``ancestors[i, j]`` (itself and its ancestors).

Three things live here, as in Triton's fused-attention tutorial:

* ``_tree_attn_fwd``: the Triton kernel (flash-attention-style online softmax over KV blocks;
  the prefix blocks run unmasked, the tree blocks decode a bit-packed ancestor mask).
* :func:`tree_attention`: the wrapper (validation, packing, launch; falls back to the reference
  when Triton cannot run on the tensors' device).
* :func:`tree_attention_reference`: the obviously-correct dense torch version.

Shapes (everything in ``(batch, heads, positions, head_dim)`` layout):

* ``q``: ``(B, Hq, T, D)``, ``k, v``: ``(B, Hkv, P + T, D)``, ``Hq % Hkv == 0`` (GQA).
* ``ancestors``: ``bool (T, T)`` / ``(B, T, T)``, or bit-packed ``int32 (T, W)`` / ``(B, T, W)``
  with ``W = ceil(T / 32)`` in the layout of :func:`eagle.tree.pack_bits`: bit ``b`` of word ``w``
  in row ``i`` is ``mask[i, 32 * w + b]`` (int32 two's complement).

See ``docs/tree-attention.md`` for the design notes and error bounds.
"""
from __future__ import annotations

import contextlib
import os

import torch

try:  # triton is a hard dependency of the project, but keep the torch path importable without it
    import triton
    import triton.language as tl

    from triton.runtime.errors import OutOfResources

    HAS_TRITON = True
except ImportError:  # pragma: no cover - exercised only on installs without triton
    triton = None
    tl = None
    HAS_TRITON = False

__all__ = [
    "tree_attention",
    "tree_attention_reference",
    "dense_tree_mask",
    "pack_ancestors",
    "unpack_ancestors",
    "use_triton",
    "slot_tree_mask",
    "tree_attention_op",
]

SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
MAX_HEAD_DIM = 256
_LOG2E = 1.4426950408889634


# ------------------------------------------------------------------------------------------------
# Bit-packing helpers (same layout as eagle.tree.pack_bits; tests check they agree)
# ------------------------------------------------------------------------------------------------
def pack_ancestors(mask: torch.Tensor) -> torch.Tensor:
    """Bit-pack a bool mask ``(..., T, S)`` into int32 words ``(..., T, ceil(S / 32))``.

    Bit ``b`` of word ``w`` in row ``i`` is ``mask[..., i, 32 * w + b]``; words are stored as int32
    two's complement. This is exactly the layout of :func:`eagle.tree.pack_bits`.
    """
    *lead, rows, cols = mask.shape
    n_words = (cols + 31) // 32
    padded = torch.zeros(*lead, rows, n_words * 32, dtype=torch.int64, device=mask.device)
    padded[..., :cols] = mask.to(torch.int64)
    weights = torch.ones(32, dtype=torch.int64, device=mask.device) << torch.arange(32, device=mask.device)
    words = (padded.view(*lead, rows, n_words, 32) * weights).sum(-1)  # (..., T, W) in [0, 2^32)
    words = torch.where(words >= 2**31, words - 2**32, words)  # unsigned -> two's complement
    return words.to(torch.int32)


def unpack_ancestors(words: torch.Tensor, n_cols: int) -> torch.Tensor:
    """Inverse of :func:`pack_ancestors`: int32 ``(..., T, W)`` -> bool ``(..., T, n_cols)``."""
    shifts = torch.arange(32, device=words.device, dtype=torch.int32)  # (32,)
    bits = (words.to(torch.int32).unsqueeze(-1) >> shifts) & 1  # (..., T, W, 32)
    return bits.flatten(-2)[..., :n_cols].bool()  # (..., T, n_cols)


def dense_tree_mask(ancestors: torch.Tensor, prefix_len: int) -> torch.Tensor:
    """The dense attention mask ``[ones(T, P) | ancestors]``: bool ``(..., T, P + T)``.

    ``ancestors`` may be bool ``(..., T, T)`` or packed int32 ``(..., T, W)``. Entry ``[i, s]`` is
    true iff tree node ``i`` may attend to key position ``s`` (every node sees the whole prefix).
    """
    if ancestors.dtype == torch.int32:
        ancestors = unpack_ancestors(ancestors, ancestors.shape[-2])  # (..., T, T)
    elif ancestors.dtype != torch.bool:
        raise ValueError(f"ancestors must be torch.bool or packed torch.int32, got {ancestors.dtype}")
    *lead, T, _ = ancestors.shape
    prefix = torch.ones(*lead, T, prefix_len, dtype=torch.bool, device=ancestors.device)  # (..., T, P)
    return torch.cat([prefix, ancestors], dim=-1)  # (..., T, P + T)


def slot_tree_mask(ancestors: torch.Tensor, prefix_len: torch.Tensor, capacity: int) -> torch.Tensor:
    """The dense mask over a slot buffer of ``capacity`` keys whose tree sits at slots
    ``prefix_len[b] .. prefix_len[b] + T``: bool ``(B', T, capacity)``, entry ``[b, i, s]`` true iff
    ``s < P_b`` or ``ancestors[i, s - P_b]`` (slots past the tree: false). Tensor ops only (no host
    sync); ``prefix_len``: ``(1,)`` or ``(B,)``, ``ancestors``: ``(T, T)`` / ``(B, T, T)`` bool or packed."""
    if ancestors.dtype == torch.int32:
        ancestors = unpack_ancestors(ancestors, ancestors.shape[-2])  # (..., T, T)
    anc = ancestors if ancestors.dim() == 3 else ancestors[None]  # (Ba, T, T)
    T = anc.shape[-1]
    col = torch.arange(capacity, device=anc.device)  # (C,)
    P = prefix_len.to(torch.long)[:, None]  # (Bp, 1)
    rel = col[None, :] - P  # (Bp, C) slot -> tree node
    in_tree = (rel >= 0) & (rel < T)  # (Bp, C)
    Bm = max(anc.shape[0], P.shape[0])
    seen = torch.gather(anc.expand(Bm, T, T), 2, rel.clamp(0, T - 1)[:, None, :].expand(Bm, T, capacity))  # (Bm, T, C)
    return (col[None, :] < P)[:, None, :] | (in_tree[:, None, :] & seen)  # (Bm, T, C)


# ------------------------------------------------------------------------------------------------
# Validation shared by the kernel wrapper and the reference
# ------------------------------------------------------------------------------------------------
def _check_inputs(q, k, v, ancestors, dtypes, prefix_len=None) -> tuple[int, int, int, int, int | None, int, int, bool]:
    """Validate the contract; return ``(B, Hq, Hkv, T, P, D, mask_batch, packed)`` (``P`` None when
    the prefix length comes as a tensor: slot-buffer keys)."""
    for name, x in (("q", q), ("k", k), ("v", v), ("ancestors", ancestors)):
        if not isinstance(x, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.dim() != 4:
            raise ValueError(f"{name} must be 4-D (B, H, positions, D), got shape {tuple(x.shape)}")
    if q.dtype not in dtypes:
        raise ValueError(f"q dtype {q.dtype} is not supported (expected one of {', '.join(map(str, dtypes))})")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(f"q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device == ancestors.device):
        raise ValueError(f"q, k, v, ancestors must be on one device, got {q.device}, {k.device}, "
                         f"{v.device}, {ancestors.device}")
    B, Hq, T, D = q.shape
    if k.shape != v.shape:
        raise ValueError(f"k and v shapes differ: {tuple(k.shape)} vs {tuple(v.shape)}")
    Bk, Hkv, S, Dk = k.shape
    if Bk != B:
        raise ValueError(f"batch size mismatch: q has {B}, k/v have {Bk}")
    if Dk != D:
        raise ValueError(f"head dim mismatch: q has {D}, k/v have {Dk}")
    if D < 1 or D > MAX_HEAD_DIM:
        raise ValueError(f"head dim {D} is outside the supported range 1..{MAX_HEAD_DIM}")
    if T < 1:
        raise ValueError("q must hold at least one tree node (T >= 1)")
    if Hkv < 1 or Hq % Hkv != 0:
        raise ValueError(f"query heads ({Hq}) must be a multiple of key/value heads ({Hkv})")
    if S < T:
        raise ValueError(f"k/v hold {S} positions, fewer than the T={T} tree nodes they must end with")
    P = S - T
    if prefix_len is not None:
        if not isinstance(prefix_len, torch.Tensor) or prefix_len.dtype != torch.int32 or prefix_len.dim() != 1 \
                or prefix_len.shape[0] not in (1, B):
            raise ValueError("prefix_len must be an int32 tensor of shape (1,) or (B,)")
        if prefix_len.device != q.device:
            raise ValueError(f"prefix_len is on {prefix_len.device}, q on {q.device}")
        P = None  # on the device; the caller guarantees prefix_len + T <= S

    if ancestors.dtype == torch.bool:
        packed, width, want = False, T, f"(T, T) or (B, T, T) = ({T}, {T}) or ({B}, {T}, {T})"
    elif ancestors.dtype == torch.int32:
        W = (T + 31) // 32
        packed, width, want = True, W, f"(T, W) or (B, T, W) = ({T}, {W}) or ({B}, {T}, {W}), W = ceil(T/32)"
    else:
        raise ValueError(f"ancestors dtype must be torch.bool (dense) or torch.int32 (bit-packed), "
                         f"got {ancestors.dtype}")
    kind = "packed int32" if packed else "bool"
    if ancestors.dim() == 2:
        mask_batch = 1
    elif ancestors.dim() == 3:
        mask_batch = ancestors.shape[0]
    else:
        raise ValueError(f"{kind} ancestors mask must be {want}, got shape {tuple(ancestors.shape)}")
    if tuple(ancestors.shape[-2:]) != (T, width) or (ancestors.dim() == 3 and mask_batch != B):
        raise ValueError(f"{kind} ancestors mask must be {want}, got shape {tuple(ancestors.shape)}")
    return B, Hq, Hkv, T, P, D, mask_batch, packed


# ------------------------------------------------------------------------------------------------
# Reference (portable path)
# ------------------------------------------------------------------------------------------------
def tree_attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ancestors: torch.Tensor,
                             scale: float | None = None, prefix_len: torch.Tensor | None = None) -> torch.Tensor:
    """Dense torch tree attention: softmax over ``[prefix | ancestors]`` with a dense bool mask.

    Same contract as :func:`tree_attention`; additionally accepts float64 inputs (the tests'
    ground truth). fp16/bf16 are computed in float32 and cast back. GQA is handled by viewing the
    query heads as ``(Hkv, group)`` rather than by repeating K/V. A node that may see no key at all
    (only possible with ``P == 0`` and an all-false mask row, which breaks the contract) gets 0.
    """
    B, Hq, Hkv, T, P, D, _, _ = _check_inputs(q, k, v, ancestors, SUPPORTED_DTYPES + (torch.float64,), prefix_len)
    if scale is None:
        scale = D ** -0.5
    G = Hq // Hkv
    S = k.shape[2]
    cdt = torch.float64 if q.dtype == torch.float64 else torch.float32
    # (T, S) or (B, T, S): [prefix | tree], or the slot buffer with the tree at prefix_len
    mask = dense_tree_mask(ancestors, P) if prefix_len is None else slot_tree_mask(ancestors, prefix_len, S)
    mask = mask.view(-1, 1, 1, T, S)  # (B or 1, 1, 1, T, S)
    qg = q.to(cdt).reshape(B, Hkv, G, T, D)  # (B, Hkv, G, T, D)
    kf, vf = k.to(cdt), v.to(cdt)  # (B, Hkv, S, D)
    scores = torch.einsum("bhgtd,bhsd->bhgts", qg, kf) * scale  # (B, Hkv, G, T, S)
    scores = scores.masked_fill(~mask, float("-inf"))
    probs = torch.softmax(scores, dim=-1)  # (B, Hkv, G, T, S)
    probs = torch.where(mask.any(-1, keepdim=True), probs, torch.zeros((), dtype=cdt, device=q.device))
    out = torch.einsum("bhgts,bhsd->bhgtd", probs, vf)  # (B, Hkv, G, T, D)
    return out.reshape(B, Hq, T, D).to(q.dtype)  # (B, Hq, T, D)


# ------------------------------------------------------------------------------------------------
# Triton kernel
# ------------------------------------------------------------------------------------------------
if HAS_TRITON:

    @triton.jit
    def _dot_operand(x, DOT_UPCAST: tl.constexpr):
        """Upcast a loaded tile to fp32 when DOT_UPCAST (only under the interpreter, for bf16)."""
        if DOT_UPCAST:
            x = x.to(tl.float32)
        return x

    @triton.jit
    def _online_softmax_step(acc, l_i, m_i, qk, v, IN_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr):
        """Fold one block of (already scaled, already masked with -inf) log2-scores into the state.

        ``p`` is rounded to the input dtype before the P @ V product (as in flash attention); ``v``
        may have been upcast to fp32 (interpreter bf16 workaround), hence ``.to(v.dtype)`` after.
        """
        m_ij = tl.maximum(m_i, tl.max(qk, 1))  # (BLOCK_M,)
        # a row that has seen only masked keys so far keeps m = -inf; shift by 0 to avoid inf - inf
        m_safe = tl.where(m_ij == float("-inf"), 0.0, m_ij)
        p = tl.math.exp2(qk - m_safe[:, None])  # (BLOCK_M, BLOCK_N), masked entries -> 0
        alpha = tl.math.exp2(m_i - m_safe)  # (BLOCK_M,) rescale of the old state
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(IN_DTYPE).to(v.dtype), v, acc, input_precision=DOT_PRECISION)  # (BLOCK_M, BLOCK_D)
        return acc, l_i, m_ij

    @triton.jit
    def _tree_attn_fwd(
        Q, K, V, O, MASK,
        qk_scale,  # sm_scale * log2(e)
        stride_qb, stride_qh, stride_qt, stride_qd,
        stride_kb, stride_kh, stride_kn, stride_kd,
        stride_vb, stride_vh, stride_vn, stride_vd,
        stride_ob, stride_oh, stride_ot, stride_od,
        stride_mb, stride_mt, stride_mw,
        PLEN, stride_pb,  # prefix length per batch row, int32 in memory (stride 0: one for all)
        HQ, T,
        GROUP: tl.constexpr,  # Hq // Hkv
        HEAD_DIM: tl.constexpr,  # true head dim D
        BLOCK_D: tl.constexpr,  # D rounded up to a power of two >= 16
        BLOCK_M: tl.constexpr,  # tree nodes (queries) per program
        BLOCK_N: tl.constexpr,  # keys per inner step
        DOT_PRECISION: tl.constexpr,  # "ieee" for fp32 inputs (no TF32), default otherwise
        DOT_UPCAST: tl.constexpr,  # upcast dot operands to fp32 (the interpreter's bf16 dot is broken)
    ):
        IN_DTYPE: tl.constexpr = Q.dtype.element_ty
        start_m = tl.program_id(0)
        off_bh = tl.program_id(1)
        off_b = (off_bh // HQ).to(tl.int64)  # int64: batch offsets of a long KV cache exceed 2^31
        off_h = (off_bh % HQ).to(tl.int64)
        off_kvh = off_h // GROUP  # GQA: read the shared kv head directly, never a repeated copy
        # read from memory, not passed by value: a compiled / CUDA-graph step replays with new
        # prefix lengths without a new launch configuration (keys past P + T are never read)
        P = tl.load(PLEN + off_b * stride_pb)

        offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)  # (BLOCK_M,) tree node index
        offs_d = tl.arange(0, BLOCK_D)  # (BLOCK_D,)
        offs_j = tl.arange(0, BLOCK_N)  # (BLOCK_N,)
        row_ok = offs_m < T
        d_ok = offs_d < HEAD_DIM

        q_ptrs = Q + off_b * stride_qb + off_h * stride_qh \
            + offs_m[:, None] * stride_qt + offs_d[None, :] * stride_qd  # (BLOCK_M, BLOCK_D)
        q = tl.load(q_ptrs, mask=row_ok[:, None] & d_ok[None, :], other=0.0)
        q = _dot_operand(q, DOT_UPCAST)

        k_base = K + off_b * stride_kb + off_kvh * stride_kh
        v_base = V + off_b * stride_vb + off_kvh * stride_vh

        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

        # ---- committed prefix (keys 0 .. P-1): full blocks, no mask ---------------------------
        p_full = (P // BLOCK_N) * BLOCK_N
        for start_n in range(0, p_full, BLOCK_N):
            offs_n = start_n + offs_j  # (BLOCK_N,) key position
            kt = tl.load(k_base + offs_n[None, :] * stride_kn + offs_d[:, None] * stride_kd,
                         mask=d_ok[:, None], other=0.0)  # (BLOCK_D, BLOCK_N) = K^T tile
            v = tl.load(v_base + offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd,
                        mask=d_ok[None, :], other=0.0)  # (BLOCK_N, BLOCK_D)
            kt = _dot_operand(kt, DOT_UPCAST)
            v = _dot_operand(v, DOT_UPCAST)
            qk = tl.dot(q, kt, input_precision=DOT_PRECISION) * qk_scale  # (BLOCK_M, BLOCK_N)
            acc, l_i, m_i = _online_softmax_step(acc, l_i, m_i, qk, v, IN_DTYPE, DOT_PRECISION)

        # ---- committed prefix: ragged tail block (bounds mask only) ----------------------------
        if p_full < P:
            offs_n = p_full + offs_j
            col_ok = offs_n < P  # (BLOCK_N,)
            kt = tl.load(k_base + offs_n[None, :] * stride_kn + offs_d[:, None] * stride_kd,
                         mask=d_ok[:, None] & col_ok[None, :], other=0.0)
            v = tl.load(v_base + offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd,
                        mask=col_ok[:, None] & d_ok[None, :], other=0.0)
            kt = _dot_operand(kt, DOT_UPCAST)
            v = _dot_operand(v, DOT_UPCAST)
            qk = tl.dot(q, kt, input_precision=DOT_PRECISION) * qk_scale
            qk = tl.where(col_ok[None, :], qk, float("-inf"))
            acc, l_i, m_i = _online_softmax_step(acc, l_i, m_i, qk, v, IN_DTYPE, DOT_PRECISION)

        # ---- tree nodes (keys P .. P+T-1): ancestor mask decoded from the packed words ---------
        m_rows = MASK + off_b * stride_mb + offs_m[:, None] * stride_mt  # (BLOCK_M, 1) row starts
        for start_n in range(0, T, BLOCK_N):
            offs_n = start_n + offs_j  # (BLOCK_N,) tree node index of each key
            col_ok = offs_n < T
            words = tl.load(m_rows + (offs_n // 32)[None, :] * stride_mw,
                            mask=row_ok[:, None] & col_ok[None, :], other=0)  # (BLOCK_M, BLOCK_N) int32
            visible = ((words >> (offs_n % 32)[None, :]) & 1) != 0  # bit j%32 of word j//32
            kt = tl.load(k_base + (P + offs_n)[None, :] * stride_kn + offs_d[:, None] * stride_kd,
                         mask=d_ok[:, None] & col_ok[None, :], other=0.0)
            v = tl.load(v_base + (P + offs_n)[:, None] * stride_vn + offs_d[None, :] * stride_vd,
                        mask=col_ok[:, None] & d_ok[None, :], other=0.0)
            kt = _dot_operand(kt, DOT_UPCAST)
            v = _dot_operand(v, DOT_UPCAST)
            qk = tl.dot(q, kt, input_precision=DOT_PRECISION) * qk_scale
            qk = tl.where(visible, qk, float("-inf"))
            acc, l_i, m_i = _online_softmax_step(acc, l_i, m_i, qk, v, IN_DTYPE, DOT_PRECISION)

        l_safe = tl.where(l_i == 0.0, 1.0, l_i)  # rows that saw nothing (padding, empty mask) -> 0
        out = acc / l_safe[:, None]  # (BLOCK_M, BLOCK_D)
        o_ptrs = O + off_b * stride_ob + off_h * stride_oh \
            + offs_m[:, None] * stride_ot + offs_d[None, :] * stride_od
        tl.store(o_ptrs, out.to(O.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])

    _KERNEL_INTERPRETED = type(_tree_attn_fwd).__name__ == "InterpretedFunction"
else:  # pragma: no cover
    _KERNEL_INTERPRETED = False


def use_triton(device: torch.device | str) -> bool:
    """Whether :func:`tree_attention` runs the Triton kernel for tensors on ``device``.

    True for CUDA tensors (when triton is installed), or when ``TRITON_INTERPRET == "1"`` (the
    Triton CPU interpreter; it must be set before this module is imported, because ``triton.jit``
    decides at decoration time). Otherwise the portable :func:`tree_attention_reference` is used.
    """
    if not HAS_TRITON:
        return False
    device = torch.device(device)
    if os.environ.get("TRITON_INTERPRET") == "1" and _KERNEL_INTERPRETED:
        return True
    return device.type == "cuda" and not _KERNEL_INTERPRETED


def _launch_config(T: int, D: int, dtype: torch.dtype, interpret: bool) -> dict:
    """Heuristic tile sizes and launch options; checked for register spills by compiling for
    sm_90 (see docs/tree-attention.md) but not timed on a GPU yet, so not tuned."""
    BLOCK_D = max(16, triton.next_power_of_2(D))
    BLOCK_M = max(16, min(64, triton.next_power_of_2(T)))
    if interpret:  # the interpreter is slow per op: few, modest tiles (tl.dot needs dims >= 16)
        return dict(BLOCK_M=BLOCK_M, BLOCK_N=32, num_warps=1, num_stages=1)
    half = dtype != torch.float32
    BLOCK_N = 64 if (half and BLOCK_D <= 128) else 32
    num_warps = 4 if BLOCK_M * BLOCK_D <= 2048 else 8
    return dict(BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, num_warps=num_warps, num_stages=3 if half else 2)


_SHRUNK_CONFIGS: dict = {}  # (device, dtype, D, BLOCK_M, BLOCK_N) -> smaller config that fit in shared memory


def _tree_attention_triton(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, words: torch.Tensor,
                           scale: float, block_m: int | None = None, block_n: int | None = None,
                           prefix_len: torch.Tensor | None = None) -> torch.Tensor:
    """Launch the kernel on validated inputs. ``words``: packed mask, int32 ``(T, W)`` or ``(B, T, W)``;
    ``prefix_len``: int32 ``(1,)`` / ``(B,)`` on the device (slot-buffer keys), or None (``[prefix | tree]``
    keys, ``P = S - T``).

    ``block_m`` / ``block_n`` override the heuristic tile sizes (powers of two >= 16); the tests
    use them to cover several query blocks and several tree blocks at small T.
    """
    B, Hq, T, D = q.shape  # (B, Hq, T, D)
    Hkv, S = k.shape[1], k.shape[2]  # (B, Hkv, P + T, D)
    out = torch.empty((B, Hq, T, D), dtype=q.dtype, device=q.device)  # (B, Hq, T, D)
    if out.numel() == 0:
        return out
    if words.dim() == 2:
        words = words.unsqueeze(0)  # (1, T, W): one tree shared by the whole batch
    stride_mb = 0 if words.shape[0] == 1 else words.stride(0)
    if prefix_len is None:
        prefix_len = torch.full((1,), S - T, dtype=torch.int32, device=q.device)
    stride_pb = 0 if prefix_len.shape[0] == 1 else prefix_len.stride(0)

    interpret = _KERNEL_INTERPRETED
    cfg = _launch_config(T, D, q.dtype, interpret)
    if block_m is not None:
        cfg["BLOCK_M"] = block_m
    if block_n is not None:
        cfg["BLOCK_N"] = block_n
    key = (q.device, q.dtype, D, cfg["BLOCK_M"], cfg["BLOCK_N"])
    cfg = _SHRUNK_CONFIGS.get(key, cfg)

    def launch(c: dict) -> None:
        grid = (triton.cdiv(T, c["BLOCK_M"]), B * Hq)
        opts = {} if interpret else {"num_warps": c["num_warps"], "num_stages": c["num_stages"]}
        _tree_attn_fwd[grid](
            q, k, v, out, words,
            float(scale) * _LOG2E,
            *q.stride(), *k.stride(), *v.stride(), *out.stride(),
            stride_mb, words.stride(1), words.stride(2),
            prefix_len, stride_pb,
            Hq, T,
            GROUP=Hq // Hkv, HEAD_DIM=D, BLOCK_D=max(16, triton.next_power_of_2(D)),
            BLOCK_M=c["BLOCK_M"], BLOCK_N=c["BLOCK_N"],
            DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
            DOT_UPCAST=interpret and q.dtype == torch.bfloat16,
            **opts,
        )

    with torch.cuda.device(q.device) if q.device.type == "cuda" else contextlib.nullcontext():
        try:
            launch(cfg)
        except OutOfResources:
            # a GPU with less shared memory than an H100/A100: fewer pipeline stages, then smaller tiles
            for smaller in (dict(cfg, num_stages=1), dict(cfg, num_stages=1, BLOCK_N=16)):
                try:
                    launch(smaller)
                except OutOfResources:
                    continue
                _SHRUNK_CONFIGS[key] = smaller
                break
            else:
                raise
    return out


def tree_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ancestors: torch.Tensor,
                   scale: float | None = None, prefix_len: torch.Tensor | None = None) -> torch.Tensor:
    """Attention of ``T`` tree nodes over ``P`` prefix keys plus their ancestors among the tree.

    Args:
        q: ``(B, Hq, T, D)`` queries of the tree nodes (fp32, fp16 or bf16), ``1 <= D <= 256``.
        k, v: ``(B, Hkv, P + T, D)``; the first ``P`` positions are the committed prefix, the last
            ``T`` the tree nodes in the same order as ``q``. ``Hq % Hkv == 0`` (GQA). ``P`` may be 0.
            Any strides (no copies are made).
        ancestors: ``bool (T, T)`` or ``(B, T, T)``, ``[i, j]`` true iff node ``j`` is node ``i`` or
            one of its ancestors; or the same mask already bit-packed as ``int32 (T, W)`` /
            ``(B, T, W)``, ``W = ceil(T / 32)``, layout of :func:`eagle.tree.pack_bits`. Pack once
            per decoding step and pass the int32 form to every layer: the kernel reads it directly
            (a bool mask is packed on every call, then runs the same kernel).
        scale: softmax scale, default ``D ** -0.5``.
        prefix_len: None, or int32 ``(1,)`` / ``(B,)`` on the device: then ``k, v`` are a slot
            buffer ``(B, Hkv, C, D)`` (a static KV cache) whose prefix is slots ``0 .. P_b - 1`` and
            whose tree nodes are slots ``P_b .. P_b + T - 1``; slots past them are never read. The
            length stays on the device (no host sync, one launch shape for every step), which is what
            a compiled or CUDA-graph step needs; the caller guarantees ``P_b + T <= C``.

    Returns:
        ``(B, Hq, T, D)`` with ``q``'s dtype (contiguous).

    Raises:
        ValueError: on bad ranks/shapes, unsupported or mismatched dtypes, devices, a GQA head
            count that does not divide, or a mask of the wrong size/dtype.

    Dispatch: the Triton kernel runs when :func:`use_triton` says so: CUDA tensors, or
    ``TRITON_INTERPRET=1`` set before this module is imported (the Triton interpreter then runs it
    on CPU tensors, slowly). Otherwise, e.g. CPU tensors without ``TRITON_INTERPRET``, it falls back
    to :func:`tree_attention_reference`, which computes the same thing densely in torch.
    A node whose mask row is all false with ``P == 0`` (impossible for a real ancestor mask, which
    has the diagonal) gets a zero output on both paths.
    """
    _, _, _, _, _, D, _, packed = _check_inputs(q, k, v, ancestors, SUPPORTED_DTYPES, prefix_len)
    if scale is None:
        scale = D ** -0.5
    if not use_triton(q.device):
        return tree_attention_reference(q, k, v, ancestors, scale, prefix_len)
    words = ancestors if packed else pack_ancestors(ancestors)  # (T, W) or (B, T, W) int32
    return _tree_attention_triton(q, k, v, words, scale, prefix_len=prefix_len)


# ------------------------------------------------------------------------------------------------
# The op inside compiled graphs
# ------------------------------------------------------------------------------------------------
@torch.library.custom_op("eagle::tree_attention", mutates_args=())
def tree_attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ancestors: torch.Tensor,
                      prefix_len: torch.Tensor, scale: float) -> torch.Tensor:
    """``torch.ops.eagle.tree_attention``: :func:`tree_attention` over a slot buffer as one opaque
    op, so ``torch.compile`` (and CUDA graphs under ``mode="reduce-overhead"``) keep the Triton kernel
    in the graph instead of tracing into, or breaking at, its launch. Same arguments as
    :func:`tree_attention` with ``prefix_len`` required (the prefix length lives on the device)."""
    return tree_attention(q, k, v, ancestors, scale=scale, prefix_len=prefix_len)


@tree_attention_op.register_fake
def _tree_attention_fake(q, k, v, ancestors, prefix_len, scale):
    return torch.empty_like(q, memory_format=torch.contiguous_format)  # (B, Hq, T, D)
