"""Benchmark the Triton tree-attention kernel against SDPA (dense mask) and FlexAttention.

GPU mode (default when CUDA is available): a Llama-8B-like layer (Hq/Hkv/D = 32/8/128, bf16) for
P in {512, 2k, 8k, 32k}, T in {16, 64, 128}, B in {1, 8}; medians from ``triton.testing.do_bench``;
achieved bandwidth = bytes of Q + K + V + O (+ the packed mask) / time, compared with the device's
measured copy bandwidth. Writes a markdown table into ``--out`` (default ``docs/tree-attention.md``,
between the ``bench:gpu`` markers, replacing the previous table).

Smoke mode (``--smoke``, or automatically without CUDA): runs the kernel in the Triton interpreter
on CPU tensors at tiny sizes, checks it against the float64 reference and prints
``time.perf_counter`` medians (interpreter timings say nothing about GPU speed). Writes the table
only when ``--out`` is given (between the ``bench:smoke`` markers).

    python kernels/bench_tree_attention.py --out docs/tree-attention.md      # on a GPU
    python kernels/bench_tree_attention.py --smoke                    # anywhere, ~1 minute on CPU
"""
from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
import time
import warnings
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "docs" / "tree-attention.md"
MARKERS = {
    "gpu": ("<!-- bench:gpu:start -->", "<!-- bench:gpu:end -->"),
    "smoke": ("<!-- bench:smoke:start -->", "<!-- bench:smoke:end -->"),
}
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true",
                    help="tiny CPU run in the Triton interpreter (automatic when CUDA is unavailable)")
    ap.add_argument("--out", type=Path, default=None,
                    help=f"markdown file to update (GPU default: {DEFAULT_OUT.relative_to(REPO)}; smoke: none)")
    ap.add_argument("--prefix", type=int, nargs="+", default=None, help="prefix lengths P")
    ap.add_argument("--tree", type=int, nargs="+", default=None, help="tree sizes T")
    ap.add_argument("--batch", type=int, nargs="+", default=None, help="batch sizes B")
    ap.add_argument("--hq", type=int, default=None, help="query heads (GPU default 32)")
    ap.add_argument("--hkv", type=int, default=None, help="key/value heads (GPU default 8)")
    ap.add_argument("--head-dim", type=int, default=None, help="head dim (GPU default 128)")
    ap.add_argument("--dtype", choices=sorted(DTYPES), default=None, help="GPU default bf16, smoke fp32")
    ap.add_argument("--no-flex", action="store_true", help="skip FlexAttention (its compiles take a while)")
    ap.add_argument("--repeats", type=int, default=3, help="smoke mode: timed runs per case (median)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    smoke = args.smoke or not torch.cuda.is_available()
    args.mode = "smoke" if smoke else "gpu"
    defaults = dict(prefix=[0, 40], tree=[5, 16], batch=[1, 2], hq=4, hkv=2, head_dim=16, dtype="fp32") if smoke \
        else dict(prefix=[512, 2048, 8192, 32768], tree=[16, 64, 128], batch=[1, 8], hq=32, hkv=8, head_dim=128,
                  dtype="bf16")
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.out is None and not smoke:
        args.out = DEFAULT_OUT
    return args


# ------------------------------------------------------------------------------------------------
# inputs
# ------------------------------------------------------------------------------------------------
def random_ancestors(B: int, T: int, gen: torch.Generator) -> torch.Tensor:
    """(B, T, T) bool ancestor masks of B random trees (parents[i] uniform in [0, i))."""
    anc = torch.zeros(B, T, T, dtype=torch.bool)
    for b in range(B):
        parents = [-1] + [int(torch.randint(0, i, (1,), generator=gen)) for i in range(1, T)]
        for i in range(T):
            anc[b, i, i] = True
            if i:
                anc[b, i] |= anc[b, parents[i]]
    return anc


def make_case(B, Hq, Hkv, T, P, D, dtype, device, gen, dev_gen):
    """Random q/k/v drawn on ``device`` (``dev_gen``) and B random trees (``gen``, CPU)."""
    q = torch.randn(B, Hq, T, D, generator=dev_gen, device=device, dtype=dtype)  # (B, Hq, T, D)
    k = torch.randn(B, Hkv, P + T, D, generator=dev_gen, device=device, dtype=dtype)  # (B, Hkv, P+T, D)
    v = torch.randn(B, Hkv, P + T, D, generator=dev_gen, device=device, dtype=dtype)
    anc = random_ancestors(B, T, gen).to(device)  # (B, T, T)
    return q, k, v, anc


def io_bytes(B, Hq, Hkv, T, P, D, dtype) -> int:
    """Bytes the kernel must move at least: read Q, K, V and the packed mask, write O."""
    elt = torch.empty((), dtype=dtype).element_size()
    return elt * (2 * B * Hq * T * D + 2 * B * Hkv * (P + T) * D) + 4 * B * T * ((T + 31) // 32)


def make_flex(anc: torch.Tensor, P: int, B: int, T: int, device, compiled: bool):
    """FlexAttention closure with a block mask from the ancestor table; None if unavailable."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    def mask_mod(b, h, q_idx, kv_idx):  # prefix always visible, tree keys by the ancestor table
        return (kv_idx < P) | anc[b, q_idx, (kv_idx - P).clamp(min=0)]

    block_mask = create_block_mask(mask_mod, B, None, T, P + T, device=device)
    fn = torch.compile(flex_attention, dynamic=False) if compiled else flex_attention

    def run(q, k, v):
        with warnings.catch_warnings():  # eager (CPU smoke) flex warns that it is unfused; we know
            warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
            return fn(q, k, v, block_mask=block_mask, enable_gqa=True)

    return run


def sdpa_dense(q, k, v, dense):
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=dense, enable_gqa=True)


def max_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """max |out - ref| / (1 + |ref|), the measure the tests bound."""
    ref = ref.double()
    return ((out.double() - ref).abs() / (1 + ref.abs())).max().item()


# ------------------------------------------------------------------------------------------------
# timing
# ------------------------------------------------------------------------------------------------
def cpu_median_ms(fn, repeats: int) -> float:
    fn()  # warm-up (interpreter/kernel setup)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def gpu_median_ms(fn) -> float:
    import triton.testing

    return triton.testing.do_bench(fn, return_mode="median")


def copy_bandwidth_gbs(device) -> float:
    """Device memory bandwidth measured by a 1 GiB tensor copy (read + write), in GB/s."""
    n = 1 << 30
    src = torch.empty(n, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    ms = gpu_median_ms(lambda: dst.copy_(src))
    del src, dst
    return 2 * n / (ms * 1e-3) / 1e9


# ------------------------------------------------------------------------------------------------
# report
# ------------------------------------------------------------------------------------------------
def render(header: list[str], rows: list[list[str]], notes: list[str], mode: str) -> str:
    start, end = MARKERS[mode]
    lines = [start, ""] + notes + [""]
    lines.append("| " + " | ".join(header) + " |")
    lines.append("|" + "|".join("---:" for _ in header) + "|")
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    lines += ["", end]
    return "\n".join(lines)


def write_section(path: Path, section: str, mode: str) -> None:
    """Replace the text between this mode's markers in ``path``; append (or create) if absent."""
    start, end = MARKERS[mode]
    text = path.read_text() if path.exists() else ""
    if start in text and end in text:
        before, rest = text.split(start, 1)
        after = rest.split(end, 1)[1]
        text = before + section + after
    else:
        text = (text.rstrip("\n") + "\n\n" if text else "") + section + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def fmt(x: float | None, spec: str = ".3f") -> str:
    return "n/a" if x is None else format(x, spec)


# ------------------------------------------------------------------------------------------------
# main
# ------------------------------------------------------------------------------------------------
def main(argv=None) -> int:
    args = parse_args(argv)
    smoke = args.mode == "smoke"
    if smoke:
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernel module is first imported
    from eagle_kernels import tree_attention as ta

    if smoke and not ta.use_triton("cpu"):
        print("error: eagle_kernels.tree_attention was imported before TRITON_INTERPRET=1 was set (or triton is "
              "missing); run the smoke mode in a fresh process", file=sys.stderr)
        return 2
    if not smoke and ta._KERNEL_INTERPRETED:
        print("error: TRITON_INTERPRET=1 is set; unset it to benchmark on the GPU", file=sys.stderr)
        return 2

    device = torch.device("cpu" if smoke else "cuda")
    dtype = DTYPES[args.dtype]
    gen = torch.Generator().manual_seed(args.seed)
    dev_gen = gen if smoke else torch.Generator(device=device).manual_seed(args.seed)
    Hq, Hkv, D = args.hq, args.hkv, args.head_dim
    tol = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 1e-2}[dtype]
    print(f"tree attention benchmark ({'smoke: Triton interpreter on CPU' if smoke else torch.cuda.get_device_name()})"
          f", Hq={Hq} Hkv={Hkv} D={D} {args.dtype}", flush=True)

    copy_bw = None if smoke else copy_bandwidth_gbs(device)
    if copy_bw is not None:
        print(f"device copy bandwidth: {copy_bw:.0f} GB/s", flush=True)

    flex_note = None
    rows, failures = [], []
    for B in args.batch:
        for T in args.tree:
            for P in args.prefix:
                q, k, v, anc = make_case(B, Hq, Hkv, T, P, D, dtype, device, gen, dev_gen)
                packed = ta.pack_ancestors(anc)  # (B, T, W), built once per step in real use
                dense = ta.dense_tree_mask(anc, P)[:, None]  # (B, 1, T, P+T)
                out = ta.tree_attention(q, k, v, packed)
                ref = ta.tree_attention_reference(q.double() if smoke else q.float(),
                                                  k.double() if smoke else k.float(),
                                                  v.double() if smoke else v.float(), anc)
                err = max_err(out, ref)
                del ref
                if not err <= tol:
                    failures.append(f"B={B} T={T} P={P}: error {err:.3g} > {tol:g}")

                timer = (lambda fn: cpu_median_ms(fn, args.repeats)) if smoke else gpu_median_ms
                t_kernel = timer(lambda: ta.tree_attention(q, k, v, packed))
                t_sdpa = timer(lambda: sdpa_dense(q, k, v, dense))
                t_flex = None
                if not args.no_flex and flex_note is None:
                    try:
                        flex = make_flex(anc, P, B, T, device, compiled=not smoke)
                        flex_err = max_err(flex(q, k, v), out.double())
                        if not flex_err <= 2 * tol:
                            failures.append(f"B={B} T={T} P={P}: FlexAttention disagrees ({flex_err:.3g})")
                        t_flex = timer(lambda: flex(q, k, v))
                    except Exception as exc:  # noqa: BLE001 - report and keep benchmarking the rest
                        flex_note = f"FlexAttention skipped: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
                        print(flex_note, flush=True)

                ratio = ".3g" if smoke else ".2f"
                nbytes = io_bytes(B, Hq, Hkv, T, P, D, dtype)
                gbs = nbytes / (t_kernel * 1e-3) / 1e9
                row = [str(B), str(T), str(P), fmt(t_kernel), fmt(t_sdpa), fmt(t_flex),
                       fmt(t_sdpa / t_kernel, ratio), fmt(None if t_flex is None else t_flex / t_kernel, ratio),
                       f"{nbytes / 2**20:.2f}", fmt(gbs, ".3g" if smoke else ".0f")]
                if not smoke:
                    row.append(fmt(100 * gbs / copy_bw, ".0f"))
                row.append(f"{err:.1e}")
                rows.append(row)
                print("  ".join(row), flush=True)
                del q, k, v, dense, out

    header = ["B", "T", "P", "kernel ms", "SDPA ms", "Flex ms", "SDPA/kernel", "Flex/kernel", "MiB moved",
              "kernel GB/s"] + ([] if smoke else ["% of copy BW"]) + ["max err"]
    import triton

    when = datetime.date.today().isoformat()
    if smoke:
        notes = [f"**Interpreter timings (CPU, TRITON_INTERPRET=1) - not meaningful for speed.** {when}, "
                 f"torch {torch.__version__}, triton {triton.__version__}; Hq={Hq}, Hkv={Hkv}, D={D}, "
                 f"{args.dtype}, median of {args.repeats} runs (time.perf_counter). SDPA and FlexAttention run "
                 "eagerly on the CPU (Flex unfused, uncompiled). max err = max |kernel - float64 reference| "
                 f"/ (1 + |ref|), bound {tol:g}."]
    else:
        notes = [f"{torch.cuda.get_device_name()}, {when}, torch {torch.__version__}, triton {triton.__version__}; "
                 f"Hq={Hq}, Hkv={Hkv}, D={D}, {args.dtype}; medians of triton.testing.do_bench (ms). "
                 f"Copy bandwidth (1 GiB tensor copy, read + write): {copy_bw:.0f} GB/s. "
                 "GB/s = (Q + K + V + O + packed mask bytes) / kernel time. SDPA: dense bool mask, "
                 "enable_gqa=True, backend chosen by torch. Flex: torch.compile(flex_attention) with a "
                 "create_block_mask from the ancestor table (mask built outside the timing). "
                 f"max err = max |kernel - fp32 reference| / (1 + |ref|), bound {tol:g}."]
    if flex_note:
        notes.append("")
        notes.append(flex_note)
    section = render(header, rows, notes, args.mode)
    if args.out is not None:
        write_section(Path(args.out), section, args.mode)
        print(f"wrote {args.out}", flush=True)
    if smoke:
        print("smoke mode: interpreter timings on CPU, not meaningful for speed", flush=True)
    if failures:
        print("FAILED:\n  " + "\n  ".join(failures), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
