"""EAGLE-3 training step, two ways, on the same real batches in one process (rounds alternate the
order): SDPA under the explicit TTT mask (the reference) against the structured TTT attention
(eagle.train.eagle3.ttt_attention: causal scores against step 0 plus one dot product per later
step); with the first batch's loss of each.

    python experiments/perf/ttt_step_ab.py --data-tokens 60000 --rounds 4 --steps 2
"""
from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import Arm, interleave  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(ROOT / "experiments/configs/train-smollm2-eagle3.yaml"))
    ap.add_argument("--data-tokens", type=int, default=60000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=2, help="optimizer steps per timed round")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=str(ROOT / "experiments/results/ttt_step_ab.json"))
    args = ap.parse_args(argv)

    import torch

    import eagle.train.eagle3 as e3
    from eagle.models import load_target
    from eagle.train.common import batch_order, step_precision
    from eagle.train.data import ShardDataset
    from eagle.train.trainer import load_train_config

    cfg = load_train_config(args.config)
    if cfg.head != "eagle3":
        print(f"error: {args.config} does not train an eagle3 head", file=sys.stderr)
        return 2
    if not (Path(cfg.data_dir) / "manifest.json").is_file():
        print(f"error: no data in {cfg.data_dir}", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    model, _ = load_target(cfg.target)
    seqs = ShardDataset(cfg.data_dir, load_hidden=True, load_layers=True, max_tokens=args.data_tokens).sequences
    recipe = e3.Eagle3Recipe(cfg, model, seqs, "cpu")
    lengths = [min(len(q.input_ids), cfg.max_seq_len) for q in seqs]
    order = batch_order(len(seqs), cfg.batch_size, cfg.seed, 0, lengths)[: args.steps + 1]
    batches = [recipe.batch([seqs[i] for i in b], b, k, "cpu") for k, b in enumerate(order)]
    init = copy.deepcopy(recipe.module.head.state_dict())
    ways = {"SDPA under the TTT mask": False, "structured TTT attention (shipped)": True}

    def run(name, batch_list):
        structured = ways[name]
        head = copy.deepcopy(recipe.module.head)
        head.load_state_dict(init)
        module = e3.Eagle3TTT(head, cfg.ttt_steps, cfg.ttt_decay, structured=structured)
        opt = torch.optim.AdamW(module.parameters(), lr=cfg.lr)
        losses = []
        for b in batch_list:
            with step_precision(cfg.train_dtype, "cpu"):
                total, count, _ = recipe.loss(module, b)
            loss = total / count
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
        return losses

    first = {}
    names = list(ways)

    def arm(name) -> Arm:
        def warm():  # the first batch, untimed: the warm-up, and its loss for the comparison
            first.setdefault(name, run(name, batches[:1])[0])
        return Arm(lambda: run(name, batches[1: args.steps + 1]), before=warm)

    timed = interleave({n: arm(n) for n in names}, args.rounds, warmup=0, order="rotate",
                       progress=lambda r, n, s: print(f"round {r}: {n}: {s / args.steps:.2f} s/step", flush=True))
    times = {n: [s / args.steps for s in v] for n, v in timed.times.items()}
    med = {n: timed.median(n, 1 / args.steps) for n in names}
    base = med[names[0]]
    for n in names:
        print(f"{n}: median {med[n]:.2f} s/step ({base / med[n]:.2f}x the masked step); first-batch loss {first[n]:.5f}")
    result = {"command": "python experiments/perf/ttt_step_ab.py " + " ".join(argv if argv is not None else sys.argv[1:]),
              "train_dtype": cfg.train_dtype, "seconds_per_step": times, "median": med,
              "speedup_vs_masked": {n: base / med[n] for n in names}, "first_batch_loss": first}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
