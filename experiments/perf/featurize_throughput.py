"""Feature rebuild throughput (eagle.train.tokens.featurize): MKL's GEMM over batches of <= 4,096
positions against the small-row kernel on a weight-sharing streaming copy over
batches of <= 256 positions (what featurize takes where it measures faster), on the same sequences
of one committed token-store shard, alternating A/B rounds in one process; also the largest
difference between the two ways' fp16 features.

    python experiments/perf/featurize_throughput.py --sequences 24 --rounds 2
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import interleave  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shard", default=str(ROOT / "experiments/data/selfdistill/smollm2-135m/shard-00010.safetensors"))
    ap.add_argument("--sequences", type=int, default=24)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    if not Path(args.shard).is_file():
        print(f"error: no token shard at {args.shard}", file=sys.stderr)
        return 2

    import torch
    from safetensors.torch import load_file

    import eagle
    from eagle.backends.cpu import CpuBackend
    from eagle.train.tokens import FEATURIZE_TOKENS, STREAM_TOKENS, featurize
    from eagle_kernels import cpu_gemm

    if not cpu_gemm.available():
        print(f"error: the small-row kernel is not available here: {cpu_gemm.unavailable_reason()}", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    model, _ = eagle.load_target("smollm2-135m")
    shard = load_file(args.shard)
    off, ids = shard["offsets"], shard["input_ids"].long()
    seqs = [ids[off[i]:off[i + 1]] for i in range(min(args.sequences, len(off) - 1))]
    n = sum(len(s) for s in seqs)
    twin = CpuBackend(linear="stream").fast_linears(model, STREAM_TOKENS, upto=STREAM_TOKENS)  # the copy without timing
    layers = (2, 15, 27)
    ways = {f"MKL, <= {FEATURIZE_TOKENS} positions": (model, FEATURIZE_TOKENS),
            f"kernel, <= {STREAM_TOKENS} positions": (twin, STREAM_TOKENS)}

    never = CpuBackend(linear="never")  # the model itself stays on MKL: featurize makes no copy of its own

    def run(name):
        runner, limit = ways[name]
        return featurize(runner, seqs, layers, max_tokens=limit, backend=never)

    def report(rnd, name, seconds):
        print(f"round {rnd + 1}: {name}: {n / seconds:.0f} tok/s", flush=True)

    with torch.no_grad():
        t = interleave({name: (lambda name=name: run(name)) for name in ways}, args.rounds, warmup=0, progress=report)
    a, b = (t.results[name] for name in ways)
    diff = max(max((x[0].float() - y[0].float()).abs().max().item(), (x[1].float() - y[1].float()).abs().max().item())
               for x, y in zip(a, b))
    top = max(max(x[0].float().abs().max().item(), x[1].float().abs().max().item()) for x in a)
    print(f"{len(seqs)} sequences, {n} tokens; largest feature difference between the ways: {diff:.4g} "
          f"(fp16 features; largest feature magnitude {top:.4g})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
