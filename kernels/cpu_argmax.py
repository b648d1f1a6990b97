"""The exact argmax of a float32 LM head through a bfloat16 screen on the CPU (``cpu_argmax.cpp``,
built into the extension of ``cpu_gemm.cpp``): what a greedy decoding or verification step needs
of the head, reading half its bytes.

Greedy steps use only each row's argmax. The op multiplies the rows by a bfloat16 copy of the head,
bounds each screened logit's error (the operands' rounding, ``2^-8`` of each, and the float32
sum's; Cauchy-Schwarz over the row norms), keeps the tokens whose bound reaches the best lower bound
(a few of SmolLM2's 49,152) and recomputes those in double precision from the float32 head. The
result is the argmax of the exact logits (lowest index on a tie), whichever screen ran, which a
float32 ``F.linear`` also gives unless two logits lie within its own rounding of each other.

Three screens (three ways to the same result): ``"kernel"``, the small-row kernel on float32 rows
(float32 arithmetic on the widened bf16 copy: the tightest bound, but bound by arithmetic from
~16 rows), ``"onednn"``, oneDNN's bfloat16 GEMM on bf16-rounded rows (AMX or AVX512-BF16 where
the CPU has them: 64 rows cost about what one does; a bound three times wider, so a few more
candidates), and ``"dot"``, the op's own loop of AVX512-BF16 dot products on bf16-rounded rows (32
multiply-adds an instruction: twice the kernel's arithmetic; oneDNN's bound; up to
:data:`KERNEL_MAX_ROWS` rows, where the CPU has AVX512-BF16). :func:`way` measures those this
machine has once per process, head shape and row bucket and keeps the fastest (a ``choice``
argument overrides; docs/cpu-backend.md, screen-way).

As for the other kernels:

* :func:`screened_argmax`: the fast path (falls back to the reference where it does not apply);
  :func:`applies` says whether it takes a call; the bfloat16 copies and the row norms are made on
  first use and kept while the head lives (56 MB for SmolLM2 per way used);
* :func:`screened_argmax_reference`: the logits in float64, then argmax: the obviously-correct version;
* :func:`available`: whether the extension built on this machine (``cpu_gemm.available``).
"""
from __future__ import annotations

import threading

import torch

from .onednn import onednn_available, onednn_pack
from .timing import timed_pass
from .weightmemo import WeightMemo

from . import cpu_gemm

__all__ = ["MAX_ROWS", "KERNEL_MAX_ROWS", "WAYS", "applies", "available", "measurements", "pack_pairs", "screened_argmax",
           "screened_argmax_reference", "way"]

# rows up to which the kernel's screen pays: its float32 arithmetic on the widened bf16 copy, not
# the bytes it saves, bounds it from ~64 rows (docs/cpu-backend.md, screened-argmax)
KERNEL_MAX_ROWS = 32
# rows the op takes at most where oneDNN's screen is available (KERNEL_MAX_ROWS where it is not)
MAX_ROWS = 256
# which screen a call asks for: "measure" (the fastest on this machine, per row bucket), "kernel",
# "onednn" or "dot" ("onednn" and "dot" fall back to the kernel where they are not available)
WAYS = ("measure", "kernel", "onednn", "dot")

_OPS: dict[str, object] = {}  # op name -> torch.ops.<extension name>.<op> (None: not built)
_ONEDNN: bool | None = None  # whether the oneDNN screen runs here (None: not asked yet)
_DOT: bool | None = None  # whether the dot-product screen runs here (None: not asked yet)
_PAIRS = WeightMemo()  # head -> its bfloat16 copy packed in pairs of k for the dot screen, (blocks, ceil(K/2), 32)
_NORMS = WeightMemo()  # head -> its row norms in float64, (V,)
_COPIES = WeightMemo()  # head -> its bfloat16 copy packed for the kernel, (blocks, K, 16)
_HELD = WeightMemo()  # head -> the cpu_gemm.HeldWeight of oneDNN's packed bfloat16 copy
_MEASURED: dict[tuple, dict] = {}  # (V, K, row bucket) -> {"kernel_ms", "onednn_ms", "way"}
_LOCK = threading.Lock()


def _op(name: str = "screened_argmax"):
    if name not in _OPS:
        _OPS[name] = cpu_gemm.extension_op(name)
    return _OPS[name]


def _onednn() -> bool:
    """Whether the oneDNN screen runs here (asked once: every greedy step asks)."""
    global _ONEDNN
    if _ONEDNN is None:

        _ONEDNN = onednn_available() and _op("screened_argmax_held") is not None
    return _ONEDNN


def _dot() -> bool:
    """Whether the dot-product screen runs here: the CPU has AVX512-BF16 (asked once)."""
    global _DOT
    if _DOT is None:
        supported = _op("screen_dot_supported")
        _DOT = bool(supported is not None and supported() and _op("screened_argmax_dot") is not None)
    return _DOT


def available() -> bool:
    """Whether the op runs on this machine (the CPU extension built)."""
    return _op() is not None


def applies(hidden: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether :func:`screened_argmax` takes these tensors: float32 CPU ``hidden (T, K)`` with at
    most :data:`MAX_ROWS` rows (:data:`KERNEL_MAX_ROWS` without oneDNN's bf16 GEMM) and
    ``weight (V, K)``, no autograd, the extension available."""
    return (hidden.dim() == 2 and weight.dim() == 2 and hidden.shape[1] == weight.shape[1]
            and hidden.shape[0] <= (MAX_ROWS if _onednn() else KERNEL_MAX_ROWS)
            and hidden.dtype == torch.float32 and weight.dtype == torch.float32 and hidden.is_cpu and weight.is_cpu
            and not (torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad))
            and _op() is not None)


def _norms(weight: torch.Tensor) -> torch.Tensor:
    """``(V,)`` float64 row norms of ``weight``, made once for both screens."""
    norms = _NORMS.get(weight)
    if norms is None:
        with _LOCK, torch.no_grad():
            norms = _NORMS.put(weight, weight.detach().double().norm(dim=1))
    return norms


def _copies(weight: torch.Tensor) -> torch.Tensor:
    """The kernel screen's packed bfloat16 copy of ``weight``, ``(blocks, K, 16)``."""
    packed = _COPIES.get(weight)
    if packed is None:
        with _LOCK, torch.no_grad():
            packed = _COPIES.put(weight, cpu_gemm._load().pack(weight.detach().to(torch.bfloat16)))
    return packed


def pack_pairs(weight: torch.Tensor) -> torch.Tensor:
    """``(V, K)`` -> the dot screen's copy of its bfloat16 rounding, ``(ceil(V/16), ceil(K/2), 32)``:
    line ``(b, kk)`` holds ``w[16b + j, 2kk + h]`` at ``2j + h`` (zeros pad V and an odd K)."""
    V, K = weight.shape
    blocks, K2 = -(-V // 16), -(-K // 2)
    padded = torch.zeros(blocks * 16, K2 * 2, dtype=torch.bfloat16)
    padded[:V, :K] = weight.detach()
    return padded.view(blocks, 16, K2, 2).permute(0, 2, 1, 3).contiguous().view(blocks, K2, 32)


def _pairs(weight: torch.Tensor) -> torch.Tensor:
    """The dot screen's pair-packed bfloat16 copy of ``weight`` (:func:`pack_pairs`), made once."""
    pairs = _PAIRS.get(weight)
    if pairs is None:
        with _LOCK, torch.no_grad():
            pairs = _PAIRS.put(weight, pack_pairs(weight))
    return pairs


def _held(weight: torch.Tensor) -> cpu_gemm.HeldWeight:
    """The oneDNN screen's packed bfloat16 copy of ``weight``, in the extension's table."""
    held = _HELD.get(weight)
    if held is None:

        with _LOCK, torch.no_grad():
            held = _HELD.put(weight, cpu_gemm.HeldWeight(onednn_pack(weight.detach().to(torch.bfloat16))))
    return held


def _run(name: str, hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """The op of screen ``name`` ("kernel", "onednn" or "dot") on ``hidden``: ``(T,)``, -1 for rows
    whose screen is not finite."""
    if name == "onednn":
        return _op("screened_argmax_held")(hidden, _held(weight).slot, weight, _norms(weight))
    if name == "dot":
        return _op("screened_argmax_dot")(hidden, _pairs(weight), weight, _norms(weight))
    return _op()(hidden, _copies(weight), weight, _norms(weight))


def _bucket(rows: int) -> int:
    return 1 << max(0, rows - 1).bit_length()  # the power of two >= rows


def _ways(bucket: int) -> list[str]:
    """The screens this machine has for a row bucket."""
    if bucket > KERNEL_MAX_ROWS:
        return ["onednn"] if _onednn() else ["kernel"]
    return ["kernel"] + (["onednn"] if _onednn() else []) + (["dot"] if _dot() else [])


def way(rows: int, weight: torch.Tensor, choice: str = "measure") -> str:
    """Which screen takes ``rows`` rows against ``weight`` (V, K): ``"kernel"``, ``"onednn"`` or
    ``"dot"``. With ``choice`` ``"measure"``, those this machine has are timed once per process,
    head shape and row bucket (the power of two >= rows; best of 3, interleaved, on random rows)
    and the fastest is kept; only ``"onednn"`` past :data:`KERNEL_MAX_ROWS` rows. A forced
    ``choice`` (one of :data:`WAYS`) this machine lacks falls back to ``"kernel"``."""
    if choice not in WAYS:
        raise ValueError(f"screened argmax way must be one of {WAYS}, got '{choice}'")
    bucket = _bucket(rows)
    ways = _ways(bucket)
    if choice != "measure":
        return choice if choice in ways else ways[0]
    if len(ways) == 1:
        return ways[0]
    key = (*weight.shape, bucket)
    if key not in _MEASURED:

        x = torch.randn(bucket, weight.shape[1], generator=torch.Generator().manual_seed(0))
        # the warm-up call of each makes its copy
        ms = dict(zip(ways, (1000 * t for t in timed_pass([lambda n=n: _run(n, x, weight) for n in ways], 3))))
        _MEASURED[key] = {**{f"{n}_ms": ms[n] for n in ways}, "way": min(ms, key=ms.get)}
    return _MEASURED[key]["way"]


def measurements() -> dict[tuple, dict]:
    """What :func:`way` measured: ``(V, K, row bucket) -> {"kernel_ms", "onednn_ms", "dot_ms" (those
    this machine has), "way"}``."""
    return dict(_MEASURED)


def screened_argmax(hidden: torch.Tensor, weight: torch.Tensor, choice: str = "measure") -> torch.Tensor:
    """``argmax_j hidden[t] . weight[j]`` for every row -> ``(T,)`` int64: the argmax of the exact
    logits ``hidden (T, K) @ weight (V, K).T`` (module docstring), through the screen :func:`way`
    picks (``choice``: see there). Falls back to :func:`screened_argmax_reference` where :func:`applies` is false, and for
    rows that are not finite."""
    if not applies(hidden, weight):
        return screened_argmax_reference(hidden, weight)
    best = _run(way(hidden.shape[0], weight, choice), hidden, weight)  # (T,); -1: a row whose screen is not finite
    bad = best < 0
    if bool(bad.any()):
        best[bad] = screened_argmax_reference(hidden[bad], weight)
    return best


def screened_argmax_reference(hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """The logits ``hidden @ weight.T`` in float64, then their argmax -> ``(T,)`` int64."""
    return (hidden.double() @ weight.double().T).argmax(dim=-1)
