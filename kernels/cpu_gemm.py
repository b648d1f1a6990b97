"""A float32 (or bfloat16) linear layer for few rows on x86 CPUs with AVX-512 or AVX2 + FMA (``cpu_gemm.cpp`` beside this file).

A decoding step multiplies 1-32 rows (one token, a padded tree) by every weight of the model, and
MKL's GEMM streams the weights at a fraction of the memory's speed at those row counts, so the
step is bound by it. The C++ loop here streams each weight once at near the memory's speed and
keeps the x rows in L1 (docs/cpu-backend.md, small-row-gemm). Callers choose it by measurement per
row count (the CPU backend: ``eagle/backends/cpu``), since which GEMM wins depends on the machine.

Three things, as for the Triton kernel:

* :func:`small_linear`: the fast path (falls back to the reference where it cannot run);
  :func:`packed_weight` is the packed copy it uses;
* :func:`small_linear_reference`: ``F.linear``, the obviously-correct version;
* :func:`available` / :func:`unavailable_reason`: whether this machine has it. The extension is
  compiled on first use with the system C++ compiler and ninja (a dependency of the package; ~20 s,
  once per machine and source: cached under ``$EAGLE_CACHE/torch_extensions``), only on CPUs whose
  flags include AVX-512F (the zmm build) or AVX2 and FMA (the ymm build); both
  builds compute every output by the same chain of FMAs, so they give the same bits (:func:`isa`
  says which one runs).

bfloat16 weights and x take the same float32 FMA chain on their (exactly) widened values, the
weights streamed at half the bytes, and the result is rounded to bf16 once; callers choose it or
oneDNN per row count by measurement (docs/cpu-backend.md, gemm-bf16-form). :class:`HeldWeight` /
:func:`held_op` let compiled graphs call oneDNN on packed bf16 copies, which they cannot take as
inputs.

A row's result does not depend on the other rows of the call (same chain of FMAs per output),
which keeps a tree's products bitwise equal to the one-token products of the same rows.
"""
from __future__ import annotations

import hashlib
import os
import platform
import threading
import warnings
import weakref
from pathlib import Path

import torch
import torch.nn.functional as F

from .cpuinfo import cache_dir
from .cpuinfo import cpu_flags as _cpu_flags
from .timing import MARGIN, timed_pass
from .weightmemo import WeightMemo

__all__ = ["available", "extension_op", "isa", "plan", "set_plan", "tile_blocks", "unavailable_reason", "small_linear", "small_linear_reference", "supports", "packed_weight",
           "packed_op", "HeldWeight", "held_op", "held_mkl_op"]

_SOURCE = Path(__file__).with_name("cpu_gemm.cpp")
_ATTENTION_SOURCE = Path(__file__).with_name("cpu_attention.cpp")  # built into the same extension (cpu_attention.py)
_ARGMAX_SOURCE = Path(__file__).with_name("cpu_argmax.cpp")  # built into the same extension (cpu_argmax.py)
_LOCK = threading.Lock()
_EXT = None  # the loaded extension module
_REASON: str | None = None  # why it is unavailable (None: not tried yet, or available)
_TRIED = False
_PACKS = WeightMemo()  # weight -> its packed copy
_DTYPES = (torch.float32, torch.bfloat16)  # what the kernel multiplies (bfloat16: float32 arithmetic)


# instruction sets the kernel is built for, best first: (name, CPU flags it needs, compiler flags)
ISAS = (("avx512", ("avx512f",), ("-mavx512f", "-mfma")), ("avx2", ("avx2", "fma"), ("-mavx2", "-mfma")))


def _machine_isa(flags: set[str] | None = None) -> str | None:
    """The best of :data:`ISAS` this CPU has (``flags``: its feature flags), or ``None``."""
    flags = _cpu_flags() if flags is None else flags
    return next((name for name, need, _ in ISAS if all(f in flags for f in need)), None)


def _build(variant: str = "", defines: tuple[str, ...] = (), source: Path = _SOURCE):
    """Compile (or load the cached build of) ``cpu_gemm.cpp``; ``variant``/``defines``/``source``:
    another build, with preprocessor switches or of another version of the source (benchmarks only).
    Built for the best of :data:`ISAS` this CPU has; the extension of ``cpu_gemm.cpp`` itself also
    holds ``cpu_attention.cpp`` and ``cpu_argmax.cpp`` (another revision's source is built alone)."""
    import sys

    from torch.utils.cpp_extension import load


    # torch runs `ninja` from PATH: the one pip installed beside this interpreter counts too
    bindir = str(Path(sys.executable).parent)
    if bindir not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = bindir + os.pathsep + os.environ.get("PATH", "")

    # the source's hash in the folder: a new source never rebuilds over a library a running process has loaded
    sources = [Path(source)] + ([_ATTENTION_SOURCE, _ARGMAX_SOURCE] if Path(source) == _SOURCE else [])
    digest = hashlib.sha256(b"".join(src.read_bytes() for src in sources)).hexdigest()[:10]
    isa = _machine_isa()
    isa_flags = next(cflags for name, _, cflags in ISAS if name == isa)
    folder = (cache_dir() / "torch_extensions"
              / f"cpu_gemm{variant}-{isa}-torch{torch.__version__.split('+')[0]}-{digest}")
    folder.mkdir(parents=True, exist_ok=True)
    return load(name=f"eagle_cpu_gemm{variant.replace('-', '_')}_{isa}", sources=[str(src) for src in sources],
                build_directory=str(folder),
                extra_cflags=["-O3", *isa_flags, "-fopenmp", *(f"-D{d}" for d in defines)],
                extra_ldflags=["-fopenmp"], verbose=False)


def _load():
    """The extension, built on first use; ``None`` (with the reason kept) where it cannot be."""
    global _EXT, _REASON, _TRIED
    if _TRIED:
        return _EXT
    with _LOCK:
        if _TRIED:
            return _EXT
        if os.environ.get("EAGLE_CPU_GEMM", "1") == "0":
            _REASON = "disabled by EAGLE_CPU_GEMM=0"
        elif platform.machine().lower() not in ("x86_64", "amd64"):
            _REASON = f"needs an x86-64 CPU (this is {platform.machine()})"
        elif _machine_isa() is None:
            _REASON = "needs a CPU with AVX-512F or AVX2 + FMA"
        else:
            try:
                _EXT = _build()
                _register_op(_EXT)
            except Exception as e:  # no compiler, no headers, ...: the plain GEMM is used instead
                _REASON = f"could not build kernels/cpu_gemm.cpp: {type(e).__name__}: {str(e).splitlines()[0][:200]}"
                warnings.warn(f"eagle: small-row CPU GEMM off ({_REASON})", RuntimeWarning, stacklevel=3)
            if _EXT is not None:  # outside the build's except: a bad EAGLE_CPU_GEMM_* setting is its own error
                _choose_plan(_EXT)
        _TRIED = True
    return _EXT


PREFETCH_CANDIDATES = (4096, 16384)  # bytes ahead in a weight's stream, tried at start-up
DEFAULT_PLAN = {"width": 1, "prefetch": 4096, "prefetch_many": 4096, "turns": 1}  # kept unless beaten by MARGIN
_PLAN_ENV = {"width": "EAGLE_CPU_GEMM_TILE_BLOCKS", "prefetch": "EAGLE_CPU_GEMM_PREFETCH",
             "prefetch_many": "EAGLE_CPU_GEMM_PREFETCH_MANY", "turns": "EAGLE_CPU_GEMM_TURNS"}


def _choice_record(ext, name: str):
    """A start-up choice kept beside the build, per thread count (the test workers run
    single-threaded): ``(saved, save)``, ``saved`` the record's fields where it exists and was made
    on this machine (else ``None``), ``save(**fields)`` writing it (silently skipped where the folder
    is read-only)."""
    import json

    threads = torch.get_num_threads()
    path = Path(ext.__file__).with_name(f"{name}-{threads}t.json")
    machine = f"{platform.processor()}|{sorted(_cpu_flags())}|{os.cpu_count()}|{threads}"
    try:
        saved = json.loads(path.read_text())
        saved = saved if isinstance(saved, dict) and saved.get("machine") == machine else None
    except (OSError, ValueError):
        saved = None

    def save(**fields):
        try:
            path.write_text(json.dumps({"machine": machine, **fields}))
        except OSError:
            pass

    return saved, save


def _apply_plan(ext, plan: dict[str, int]) -> None:
    """Set every setting of a full plan (:func:`plan`'s keys) on the extension module ``ext``."""
    ext.set_tile_blocks(int(plan["width"]))
    ext.set_prefetch_bytes(int(plan["prefetch"]), int(plan["prefetch_many"]))
    ext.set_turns(bool(plan["turns"]))


def _forced_plan(ext) -> dict[str, int]:
    """The settings forced by environment variables (``EAGLE_CPU_GEMM_TILE_BLOCKS=1..3``,
    ``EAGLE_CPU_GEMM_PREFETCH`` / ``EAGLE_CPU_GEMM_PREFETCH_MANY`` = bytes, a multiple of 64 up to
    1 MiB, ``EAGLE_CPU_GEMM_TURNS=0|1``); raises ValueError naming a bad value."""
    top = int(getattr(ext, "MAX_TILE_BLOCKS", 1))
    ok = {"width": lambda v: 1 <= v <= top, "prefetch": lambda v: 64 <= v <= 2 ** 20 and v % 64 == 0,
          "turns": lambda v: v in (0, 1)}
    ok["prefetch_many"] = ok["prefetch"]
    need = {"width": f"1..{top} here", "prefetch": "a multiple of 64 from 64 to 1048576 (bytes)",
            "turns": "0 or 1"}
    need["prefetch_many"] = need["prefetch"]
    out = {}
    for key, var in _PLAN_ENV.items():
        text = os.environ.get(var)
        if text:
            if not text.isdigit() or not ok[key](int(text)):
                raise ValueError(f"{var} must be {need[key]}, got '{text}'")
            out[key] = int(text)
    return out


def _choose_plan(ext, repeats: int = 3, mbytes: int = 640) -> dict[str, int]:
    """Set the kernel's speed settings (:func:`plan`; every setting gives the same bits) to the
    fastest measured on this machine, once per machine, build and thread count (~1-2 s, kept beside
    the build in ``plan-<threads>t.json`` with the times), then apply what environment variables
    force (:func:`_forced_plan`). Calls of up to 8 rows: tile width x prefetch distance, timed at 1
    and 8 rows; calls of more: turns or one-block tiles x prefetch distance, timed at 16 rows; each
    over ``mbytes`` of weights (more than the last-level cache, as a decoding step streams them),
    interleaved, best of ``repeats`` (:func:`timing.timed_pass`). A setting other than
    :data:`DEFAULT_PLAN`'s is taken only where it is faster by ``timing.MARGIN``. What wins
    differs by machine (docs/cpu-backend.md, gemm-plan)."""

    forced = _forced_plan(ext)  # checked first: a bad value is an error even where a record exists
    top = int(getattr(ext, "MAX_TILE_BLOCKS", 1))
    ext.set_turns(True)
    turn_options = (1, 0) if ext.turns() else (0,)  # the AVX2 build has no turns
    default = {**DEFAULT_PLAN, "turns": turn_options[0]}
    saved, save = _choice_record(ext, "plan")
    chosen = None
    if saved is not None and isinstance(saved.get("chosen"), dict) and set(saved["chosen"]) == set(default):
        try:
            chosen = {k: int(v) for k, v in saved["chosen"].items()}
        except (TypeError, ValueError):
            pass
    if chosen is None:
        n, k = 1536, 576
        few = [(w, p) for w in range(1, top + 1) for p in PREFETCH_CANDIDATES]
        many = [(t, p) for t in turn_options for p in PREFETCH_CANDIDATES]
        with torch.no_grad():
            # zeros (no denormals), written (no shared zero page); the layout of ext.pack's copies
            packs = [torch.zeros(n // 16, k, 16) for _ in range(max(1, mbytes * 2 ** 20 // (n * k * 4)))]
            gen = torch.Generator().manual_seed(0)
            xs = {r: torch.randn(r, k, generator=gen) for r in (1, 8, 16)}

            def run(rows, **settings):
                def fn():
                    _apply_plan(ext, {**DEFAULT_PLAN, "turns": 0, **settings})
                    for r in rows:
                        for p in packs:
                            ext.packed_linear(xs[r], p, n, None)
                return fn

            times = timed_pass([run((1, 8), width=w, prefetch=p) for w, p in few]
                                + [run((16,), turns=t, prefetch_many=p) for t, p in many], repeats)
        t_few, t_many = dict(zip(few, times)), dict(zip(many, times[len(few):]))  # seconds per option

        def pick(times_of, base):
            best = min(times_of, key=times_of.get)
            return best if times_of[best] < (1 - MARGIN) * times_of[base] else base

        w, p = pick(t_few, (default["width"], default["prefetch"]))
        t, pm = pick(t_many, (default["turns"], default["prefetch_many"]))
        chosen = {"width": w, "prefetch": p, "prefetch_many": pm, "turns": t}
        ms_few = {f"width={a} prefetch={b}": 1e3 * sec for (a, b), sec in t_few.items()}
        ms_many = {f"turns={a} prefetch_many={b}": 1e3 * sec for (a, b), sec in t_many.items()}
        save(chosen=chosen, ms={"up to 8 rows (1 + 8)": ms_few, "more rows (16)": ms_many})
    chosen = {**chosen, **forced}
    _apply_plan(ext, chosen)
    return chosen


def tile_blocks() -> int:
    """Blocks of 16 outputs per tile the kernel runs here in calls of up to 8 rows (1 where it is
    unavailable)."""
    ext = _load()
    return 1 if ext is None else int(ext.tile_blocks())


def plan() -> dict[str, int]:
    """The kernel's speed settings here (none changes a bit of any result): ``width``, blocks of 16
    outputs per tile in calls of up to 8 rows; ``prefetch`` / ``prefetch_many``, how far ahead in a
    weight's stream lines are prefetched (bytes) in calls of up to 8 rows / of more; ``turns``, 1
    where calls of more than 8 rows run units of 3 blocks in turns, 0 where they run one-block tiles
    of up to 16 rows. Empty where the kernel is unavailable."""
    ext = _load()
    if ext is None:
        return {}
    few, many = ext.prefetch_bytes()
    return {"width": int(ext.tile_blocks()), "prefetch": int(few), "prefetch_many": int(many),
            "turns": int(ext.turns())}


def set_plan(width: int | None = None, prefetch: int | None = None, prefetch_many: int | None = None,
             turns: int | bool | None = None) -> None:
    """Set the kernel's speed settings (see :func:`plan`; ``None`` keeps one): for A/B runs
    (``kernels/bench_cpu_gemm.py --plans``); at start-up :func:`_choose_plan` sets them."""
    ext = _load()
    if ext is None:
        raise RuntimeError(f"the small-row kernel is not available here: {_REASON}")
    given = {"width": width, "prefetch": prefetch, "prefetch_many": prefetch_many, "turns": turns}
    _apply_plan(ext, {**plan(), **{k: v for k, v in given.items() if v is not None}})


def extension_op(name: str, fake=None):
    """``torch.ops.<extension>.<name>``, an op the extension's sources register (the attention and
    argmax ops), with ``fake`` registered as its shape function for tracing; ``None`` where the
    extension is not available."""
    ext = _load()
    if ext is None:
        return None
    if fake is not None:
        torch.library.register_fake(f"{ext.__name__}::{name}", fake)
    return getattr(getattr(torch.ops, ext.__name__), name)


def available() -> bool:
    """Whether :func:`small_linear` runs the AVX-512 kernel on this machine (builds it on first call)."""
    return _load() is not None


def isa() -> str | None:
    """Which build runs: ``"avx512"`` or ``"avx2"`` (``None`` where the kernel is not available)."""
    ext = _load()
    return None if ext is None else ext.ISA


def unavailable_reason() -> str | None:
    """Why :func:`available` is false (``None`` when it is true)."""
    _load()
    return _REASON


def supports(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether the kernel applies to these tensors: float32 or bfloat16 CPU tensors (both the same),
    no autograd."""
    # tensor attributes only (``.is_cpu``, not ``.device.type``): this runs on every product of a step
    return (x.dtype == weight.dtype and x.dtype in _DTYPES and x.is_cpu and weight.is_cpu
            and weight.ndim == 2 and not (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad)))


def small_linear_reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x (..., K) @ weight (N, K).T + bias -> (..., N)``: the obviously-correct version."""
    return F.linear(x, weight, bias)


def packed_weight(weight: torch.Tensor) -> torch.Tensor:
    """The kernel's packed copy ``(ceil(N/16), K, 16)`` of a float32 CPU ``weight (N, K)``: made on
    first use and kept while the weight lives; made again after an in-place update of the weight
    (its version counter moved). Views of the weight's memory (same pointer, shape and strides)
    share the copy, since they share the version counter too."""
    ext = _load()
    if ext is None:
        raise RuntimeError(f"the small-row kernel is not available: {_REASON}")
    packed = _PACKS.get(weight)
    if packed is not None:
        return packed
    with _LOCK:
        with torch.no_grad():
            return _PACKS.put(weight, ext.pack(weight.detach()))  # (blocks, K, 16)


def small_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x (..., K) @ weight (N, K).T + bias -> (..., N)`` through the AVX-512 / AVX2 kernel where it applies
    (float32 CPU tensors, no autograd, kernel available), else :func:`small_linear_reference`.
    Meant for few rows: it reads each weight once but keeps all rows' work on the vector units,
    so from some row count on (machine-dependent; docs/cpu-backend.md, small-row-gemm) MKL's GEMM is faster. The first call
    with a weight packs it (:func:`packed_weight`)."""
    ext = _load()
    if ext is None or not supports(x, weight) or (bias is not None and bias.dtype != x.dtype):
        return small_linear_reference(x, weight, bias)
    if torch.compiler.is_compiling():  # inside torch.compile: the registered op (no graph break)
        y = torch.ops.eagle.small_linear(x.reshape(-1, x.shape[-1]), weight, bias)  # (M, N)
        return y.view(*x.shape[:-1], weight.shape[0])
    # eager: the extension directly (the op's dispatch would add ~5 us per call); it flattens x's
    # leading dimensions itself and returns (..., N)
    return ext.packed_linear(x, packed_weight(weight), weight.shape[0], bias)


_OP = None  # torch.ops.<extension name>.packed_linear: the extension's function as a dispatcher op
_HELD_OP = None  # torch.ops.<extension name>.held_linear
_HELD_MKL_OP = None  # torch.ops.<extension name>.held_mkl_linear


def _register_op(ext) -> None:
    """Give the build's dispatcher ops (registered by cpu_gemm.cpp) their shape functions, for tracing."""
    global _OP, _HELD_OP, _HELD_MKL_OP

    def fake(x, p, n, b):
        return x.new_empty(*x.shape[:-1], n)

    def fake_mkl(x, slot, weight, b):
        return x.new_empty(*x.shape[:-1], weight.shape[0])

    for op in ("packed_linear", "held_linear"):
        torch.library.register_fake(f"{ext.__name__}::{op}", fake)
    torch.library.register_fake(f"{ext.__name__}::held_mkl_linear", fake_mkl)
    _OP = getattr(torch.ops, ext.__name__).packed_linear
    _HELD_OP = getattr(torch.ops, ext.__name__).held_linear
    _HELD_MKL_OP = getattr(torch.ops, ext.__name__).held_mkl_linear


def packed_op(x: torch.Tensor, packed: torch.Tensor, n: int, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x (..., K) @ w.T + bias -> (..., n)`` against ``packed = packed_weight(w)``, through the
    extension's dispatcher op: for compiled graphs that hold the packed copy (the CPU backend's packed twin),
    where the op costs a C++ dispatch per call instead of :func:`small_linear_op`'s Python one."""
    if _OP is None:
        raise RuntimeError(f"the small-row kernel is not available: {unavailable_reason()}")
    return _OP(x, packed, n, bias)


@torch.library.custom_op("eagle::small_linear", mutates_args=())
def small_linear_op(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``x (M, K) @ weight (N, K).T + bias -> (M, N)`` as one opaque op for compiled graphs
    (inductor calls it as an extern kernel; the elementwise work around it still fuses)."""
    ext = _load()
    if ext is None:
        return F.linear(x, weight, bias)
    return ext.packed_linear(x, packed_weight(weight), weight.shape[0], bias)


@small_linear_op.register_fake
def _small_linear_fake(x, weight, bias):
    return x.new_empty(x.shape[0], weight.shape[0])


class HeldWeight:
    """A weight kept in the extension's table of held weights (``cpu_gemm.cpp``) for compiled graphs
    that cannot take it as an input: oneDNN's packed bfloat16 copy of a linear layer's weight
    (``torch.ops.mkldnn._reorder_linear_weight``, an MKLDNN-layout tensor). ``slot`` is its number
    in the table as a one-element int64 tensor, which a graph does take (a buffer of the layer), and
    :func:`held_op` multiplies by the weight held there. The slot is freed when this object goes."""

    def __init__(self, packed: torch.Tensor):
        ext = _load()
        if ext is None:
            raise RuntimeError(f"the CPU GEMM extension is not available: {_REASON}")
        n = ext.hold(packed)
        self.slot = torch.tensor([n], dtype=torch.int64)  # (1,)
        self._finalizer = weakref.finalize(self, ext.release, n)


def held_mkl_op(x: torch.Tensor, slot: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x (..., K) @ weight.T + bias -> (..., N)`` through MKL's packed GEMM on the copy held at
    ``slot`` (a :class:`HeldWeight` of ``torch.ops.mkl._mkl_reorder_linear_weight(weight, M)``,
    packed for x's M rows): the extension's dispatcher op ``held_mkl_linear``, for compiled graphs
    (the same ``mkl::_mkl_linear`` as eager packed buckets, so the same result)."""
    if _HELD_MKL_OP is None:
        raise RuntimeError(f"the CPU GEMM extension is not available: {unavailable_reason()}")
    return _HELD_MKL_OP(x, slot, weight, bias)


def held_op(x: torch.Tensor, slot: torch.Tensor, n: int, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x (..., K) @ w.T + bias -> (..., n)``, ``w`` the weight held at ``slot`` (a
    :class:`HeldWeight`'s), through oneDNN's ``mkldnn::_linear_pointwise``: the extension's
    dispatcher op ``held_linear``, for compiled graphs."""
    if _HELD_OP is None:
        raise RuntimeError(f"the CPU GEMM extension is not available: {unavailable_reason()}")
    return _HELD_OP(x, slot, n, bias)
