"""A/B of compiled CPU target steps within one process: each side runs the same tree right after
the other, in alternating order, so a slow spell of the machine hits both alike (the machines this
project runs on drift by 2x over an hour; only such pairs are compared).

``--what guards``: warm keys with dynamo's differentiating guards only (as shipped) against every
guard on every layer call (the CPU backend's ``_guards_of``, eagle/backends/cpu/__init__.py, replaced by a
no-op for that side). One Target, the same compiled graphs.

``--what scope``: one graph per step whose decoder layers are one compiled region (as shipped,
eagle/backends/cpu/regions.py) against each decoder layer compiled on its own (30
compiled calls per step from transformers' Python, each with inductor's C++ wrapper, guards
skipped once warm). Two Targets; the per-layer side binds its own copy of the layer's ``forward``
code, so dynamo keeps their graphs apart.

``--what asserts``: inductor's size, alignment and scalar checks left out of the step graph's
Python wrapper (as shipped, the CPU backend's ``_STEP_OPTIONS``) against inductor's defaults (a
``torch.compile`` backend of its own for that side, ``CpuBackend(step_backend=...)``, so dynamo keeps
the two graphs apart). Two Targets.

``--what mkl``: float32 buckets that ``linear_ways`` gives MKL's packed GEMM, run in compiled steps
on copies the extension holds (as shipped, ``held_mkl_linear``) against ``F.linear`` (what compiled
steps ran there before). Two Targets; the first's ways are the measured ones with MKL replaced.

``--what attention``: the CPU attention op that cuts the cache's empty slots off
(kernels/cpu_attention.py through ``eagle_cpu_sdpa``, eagle/backends/cpu/attention.py, as shipped)
against SDPA over the whole buffer (eagle/attention.py's folding without the op, ``eagle_gqa_sdpa``,
the eager backend's attention). Two Targets, both on the CPU backend.

``--what attention-way``: the attention op's float32 calls through its own tiled AVX-512 loop (as
shipped) against SDPA on the same cut keys (``cpu_attention.set_way``, switched between calls). One
Target, the same graphs. With ``--dtype bfloat16`` the same for bf16 calls where the machine chose
the loop for them (``cpu_attention.bf16_way()``; else both sides run SDPA).

``--what head``: a greedy step's argmax of the LM head through its bfloat16 screen
(kernels/cpu_argmax.py, ``runtime.greedy_head: screened``, as shipped) against every logit, then
argmax (``greedy_head: full``). Two Targets; for this one each step is timed to the argmax
(``TreeOutput.greedy``), for the others to the full logits.

``--what tiles``: the small-row kernel's tiles of 1, 2 and 3 blocks (``set_tile_blocks``, switched
between calls). One Target; only the buckets whose products take the kernel change.

    python experiments/perf/compiled_step_ab.py --what guards --sizes 1,4,8,16
    python experiments/perf/compiled_step_ab.py --what scope --sizes 1,4,8,16
    python experiments/perf/compiled_step_ab.py --what asserts --sizes 1,4,8,16
    python experiments/perf/compiled_step_ab.py --what mkl --sizes 16,32,64
    python experiments/perf/compiled_step_ab.py --what attention --sizes 1,4,8,16
    python experiments/perf/compiled_step_ab.py --what attention-way --sizes 1,4,8,16,32,61
    python experiments/perf/compiled_step_ab.py --what attention-way --dtype bfloat16 --sizes 1,8,16,64
    python experiments/perf/compiled_step_ab.py --what head --sizes 1,4,8,16,32,64
    python experiments/perf/compiled_step_ab.py --what tiles --sizes 1,4,8,16
    python experiments/perf/compiled_step_ab.py --what tiles --products --sizes 1,2,4,8,16

``--what plan``: the small-row kernel's default settings (``cpu_gemm.DEFAULT_PLAN``: 4 KB
of prefetch, turns for more than 8 rows) against the plan chosen on this machine at load
(``cpu_gemm.plan()``, switched between calls). One Target, the same graphs.

    python experiments/perf/compiled_step_ab.py --what plan --sizes 1,4,8,16,32

``--products``: with ``tiles``, SmolLM2's 211 products alone (random weights in its shapes, the
same packed copies for every width) instead of whole steps.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib.util
import sys
import types
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import Arm, interleave  # noqa: E402


def _cost_curve():
    spec = importlib.util.spec_from_file_location("cost_curve", Path(__file__).resolve().parent.parent / "cost_curve.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _fresh_forward(fn):
    """A copy of function ``fn`` with its own code object (dynamo caches graphs per code object)."""
    out = types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
    out.__kwdefaults__ = fn.__kwdefaults__
    return out


def _layerwise_target(model, runtime):
    """A Target whose compiled CPU steps compile each decoder layer on its own, the alternative
    to one graph per step: a parameter-sharing copy of the decoder per step whose layers' ``forward``
    is compiled (one graph for all layers: the layer index a symbolic integer), inductor's C++
    wrapper, dynamo's guards skipped after each step's first call."""
    import eagle.backends.cpu as cb
    from eagle.attention import sharing_copy
    from eagle.backends.cpu.packed import PackedLinear
    from eagle.backends.cpu.regions import layer_hooks_outside

    t = _target(model, runtime)
    code = _fresh_forward(type(model.get_decoder().layers[0]).forward)  # its own dynamo cache

    def compiled_step(size, layers=None):
        if (size, layers) not in t._steps:
            # the twin's decoder for buckets on the kernel or oneDNN (MKL's copies are held by whole-step graphs only)
            twin = t.backend.twin
            base = twin.get_decoder() if size in t.backend.stream_rows | t.backend.onednn_rows else t.base
            copy_ = sharing_copy(base, share=[m.packed for m in base.modules() if isinstance(m, PackedLinear)])
            for mod in copy_.modules():
                if isinstance(mod, PackedLinear):
                    mod.hold_copies()
            layer_hooks_outside(copy_)
            for layer in copy_.layers:
                layer.forward = torch.compile(types.MethodType(code, layer), dynamic=None,
                                              options={"cpp_wrapper": True})
            warm = []

            def step(tokens, positions, masks, slots, cache, **kernel):
                with torch._dynamo.config.patch(allow_unspec_int_on_nn_module=True, recompile_limit=256), \
                        cb._guards_of(bool(warm)):
                    out = t._run(tokens, positions, cache, masks, layers, base=copy_, cache_slots=slots, **kernel)
                warm.append(True)
                return out

            t._steps[(size, layers)] = step
        return t._steps[(size, layers)]

    t._compiled_step = compiled_step
    return t


def _target(model, runtime, **options):
    """A Target on the CPU backend with ``options`` (``CpuBackend``'s keyword arguments)."""
    import eagle
    from eagle.backends.cpu import CpuBackend

    return eagle.Target(model, "reference", runtime, backend=CpuBackend(**options))


def sides(what: str, model, dtype: str):
    """``{side name: (target, before_call)}``: ``before_call()`` puts the process in that side's state."""
    import eagle.backends.cpu as cb
    from eagle.runtime import RuntimeConfig

    runtime = lambda **kw: RuntimeConfig(compile=True, dtype=dtype, **kw)  # noqa: E731
    if what == "guards":
        t = _target(model, runtime())
        real = cb._guards_of  # looked up by the backend's compiled steps on every call

        def set_guards(fn):
            return lambda: setattr(cb, "_guards_of", fn)

        return {"all guards": (t, set_guards(lambda warm: contextlib.nullcontext())),
                "warm keys (shipped)": (t, set_guards(real))}
    if what == "scope":
        return {"each layer compiled": (_layerwise_target(model, runtime()), lambda: None),
                "one graph per step (shipped)": (_target(model, runtime()), lambda: None)}
    if what == "asserts":
        from torch._inductor.compile_fx import compile_fx

        def checked(gm, example_inputs):  # inductor with its default checks
            return compile_fx(gm, example_inputs)

        return {"with checks": (_target(model, runtime(), step_backend=checked), lambda: None),
                "without (shipped)": (_target(model, runtime()), lambda: None)}
    if what == "mkl":
        real = cb.linear_ways  # the name CpuBackend.prepare calls
        try:  # the same measured ways (measured once per process), with F.linear where MKL won
            cb.linear_ways = lambda m, rows, decide="measure": {
                r: "plain" if w == "packed" else w for r, w in real(m, rows, decide=decide).items()}
            plain = _target(model, runtime())
        finally:
            cb.linear_ways = real
        shipped = _target(model, runtime())
        print(f"# buckets on MKL's packed GEMM: {sorted(shipped.backend.packed_rows)}")
        return {"F.linear": (plain, lambda: None), "MKL, held copies (shipped)": (shipped, lambda: None)}
    if what == "attention":
        from eagle.attention import attention_view, register_gqa_sdpa

        # the CPU backend views an SDPA model with its op ("eagle_cpu_sdpa"); a view already on
        # "eagle_gqa_sdpa" (the eager backend's folding, no op) it runs as it is
        whole = attention_view(model, register_gqa_sdpa())
        return {"SDPA, whole buffer": (_target(whole, runtime()), lambda: None),
                "cut at the last seen key (shipped)": (_target(model, runtime()), lambda: None)}
    if what == "attention-way":
        from eagle_kernels import cpu_attention

        if not cpu_attention.available():
            raise SystemExit("the CPU attention op is not available here (no CPU extension)")
        t = _target(model, runtime())
        return {"SDPA": (t, lambda: cpu_attention.set_way("sdpa")),
                "tiled loop (shipped)": (t, lambda: cpu_attention.set_way("tiled"))}
    if what == "head":
        return {"every logit": (_target(model, runtime(greedy_head="full")), lambda: None),
                "bf16 screen (shipped)": (_target(model, runtime()), lambda: None)}
    if what == "tiles":
        from eagle_kernels import cpu_gemm

        ext = cpu_gemm._load()
        if ext is None:
            raise SystemExit(f"the small-row kernel is not available here: {cpu_gemm.unavailable_reason()}")
        t = _target(model, runtime())
        print(f"# buckets on the kernel: {sorted(t.backend.stream_rows)}; width chosen at load: {ext.tile_blocks()}")
        return {f"{nb} block{'s' if nb > 1 else ''}": (t, (lambda n=nb: ext.set_tile_blocks(n)))
                for nb in range(1, ext.MAX_TILE_BLOCKS + 1)}
    if what == "plan":
        from eagle_kernels import cpu_gemm

        if not cpu_gemm.available():
            raise SystemExit(f"the small-row kernel is not available here: {cpu_gemm.unavailable_reason()}")
        t = _target(model, runtime())
        chosen = cpu_gemm.plan()
        default = {**cpu_gemm.DEFAULT_PLAN, "width": chosen["width"]}  # the width has its own A/B (tiles)
        print(f"# buckets on the kernel: {sorted(t.backend.stream_rows)}; default {default}; chosen {chosen}")
        return {"default plan": (t, lambda: cpu_gemm.set_plan(**default)),
                "chosen plan (shipped)": (t, lambda: cpu_gemm.set_plan(**chosen))}
    raise SystemExit(f"--what must be guards, scope, asserts, mkl, attention, attention-way, head, tiles or plan, got '{what}'")


def step_rows(what, model, dtype, sizes, rounds, prefix) -> list[str]:
    import eagle

    cc = _cost_curve()
    named = sides(what, model, dtype)
    vocab = model.get_output_embeddings().weight.shape[0]
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (prefix,), generator=gen)
    caches = {}
    for name, (t, _) in named.items():
        if id(t) not in caches:
            caches[id(t)] = t.new_cache(prefix + max(sizes))
            t.prefill(ids, caches[id(t)])
    order = list(named)
    trees: dict[int, object] = {}

    def draw(_round: int) -> None:  # this round's tree per size, the same for every side
        trees.update({s: cc.random_tree(s, vocab, gen) for s in sizes})

    def arm(n: str, s: int) -> Arm:
        t, before = named[n]

        def run():
            out = t.tree_forward(trees[s], caches[id(t)])
            return out.greedy() if what == "head" else out.logits  # the LM head included
        return Arm(run, before=before, after=lambda _: eagle.Target.crop(caches[id(t)], prefix))

    with torch.no_grad():  # two warm-up rounds (the first compiles)
        timed = interleave({(n, s): arm(n, s) for s in sizes for n in order}, rounds, warmup=2, each_round=draw)
    named[order[-1]][1]()  # leave the shipped state
    base = order[0]
    lines = ["| tree tokens | " + " | ".join(f"{n}, ms" for n in order) + " |", "|---:|" + "---:|" * len(order)]
    for s in sizes:
        med = {n: timed.median((n, s), 1000) for n in order}
        lines.append(f"| {s} | " + " | ".join(
            f"{med[n]:.1f}" + ("" if n == base else f" ({med[n] / med[base]:.2f}x)") for n in order) + " |")
    return lines


def product_rows(sizes, rounds) -> list[str]:
    """The kernel's tile widths on a step's 211 products alone (kernels/bench_cpu_gemm.py's shapes)."""
    from eagle_kernels import bench_cpu_gemm, cpu_gemm

    ext = cpu_gemm._load()
    if ext is None:
        raise SystemExit(f"the small-row kernel is not available here: {cpu_gemm.unavailable_reason()}")
    chosen = ext.tile_blocks()
    gen = torch.Generator().manual_seed(0)
    packs = [(ext.pack(torch.randn(n, k, generator=gen) * 0.02), n) for n, k in bench_cpu_gemm.SHAPES]
    widths = list(range(1, ext.MAX_TILE_BLOCKS + 1))
    lines = ["| rows | " + " | ".join(f"{nb} block{'s' if nb > 1 else ''}, ms" for nb in widths) + " |",
             "|---:|" + "---:|" * len(widths)]
    with torch.no_grad():
        for r in sizes:
            xs = {k: torch.randn(r, k, generator=gen) for k in {p.shape[1] for p, _ in packs}}

            def run():
                for p, n in packs:
                    ext.packed_linear(xs[p.shape[1]], p, n, None)
            timed = interleave({nb: Arm(run, before=lambda nb=nb: ext.set_tile_blocks(nb)) for nb in widths}, rounds)
            med = {nb: timed.median(nb, 1000) for nb in widths}
            lines.append(f"| {r} | " + " | ".join(
                f"{med[nb]:.1f}" + ("" if nb == 1 else f" ({med[nb] / med[1]:.2f}x)") for nb in widths) + " |")
    ext.set_tile_blocks(chosen)
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--what", required=True, choices=["guards", "scope", "asserts", "mkl", "attention", "attention-way", "head",
                                                        "tiles", "plan"])
    ap.add_argument("--sizes", default="1,4,8,16", help="tree tokens (rows with --products)")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--prefix", type=int, default=300)
    ap.add_argument("--dtype", default="", choices=["", "float32", "bfloat16"], help="the target's precision")
    ap.add_argument("--products", action="store_true", help="with --what tiles: the products alone")
    ap.add_argument("--target", default="smollm2-135m")
    args = ap.parse_args(argv)
    from eagle_kernels.cliargs import positive_ints

    try:
        sizes = positive_ints(args.sizes, "--sizes")
    except ValueError as e:
        raise SystemExit(str(e))
    if args.products:
        if args.what != "tiles":
            raise SystemExit("--products goes with --what tiles")
        lines = product_rows(sizes, args.rounds)
    else:
        import eagle

        model, _ = eagle.load_target(args.target)
        lines = step_rows(args.what, model, args.dtype, sizes, args.rounds, args.prefix)
    print(f"# {args.what}, {torch.get_num_threads()} threads, median of {args.rounds}, sides alternating")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
