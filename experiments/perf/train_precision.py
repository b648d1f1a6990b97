"""Training in bfloat16 against float32 (``train_dtype`` of ``eagle train``): step time, how far the
loss and the gradient of one batch move, and the held-out loss / top-1 after a short training of
two copies of the same initial head on the same batches, one per precision. One process, the
precisions alternating round by round, on the first shards of a training config's data folder.

    python experiments/perf/train_precision.py --config experiments/configs/train-smollm2-eagle3.yaml \
        --data-tokens 60000 --rounds 2 --train-steps 30
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

PRECISIONS = ("float32", "bfloat16")


def _step(recipe, module, opt, batch, dtype, device):
    """One optimizer step of ``module`` on ``batch`` in ``dtype``; returns the mean loss per token."""
    from eagle.train.common import step_precision

    with step_precision(dtype, device):
        loss_sum, count, _ = recipe.loss(module, batch)
    loss = loss_sum / count.clamp(min=1)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return float(loss)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(ROOT / "experiments/configs/train-smollm2-eagle3.yaml"))
    ap.add_argument("--data-tokens", type=int, default=60000, help="the first shards up to this many tokens")
    ap.add_argument("--rounds", type=int, default=2, help="timed rounds per precision (alternating)")
    ap.add_argument("--steps", type=int, default=2, help="optimizer steps per timed round")
    ap.add_argument("--train-steps", type=int, default=30, help="steps of the short training per precision (0: none)")
    ap.add_argument("--eval-sequences", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=str(ROOT / "experiments/results/train_precision.json"))
    args = ap.parse_args(argv)

    import torch

    from eagle.config import ConfigError
    from eagle.models import load_target
    from eagle.backends import native_bf16
    from eagle.train.common import batch_order, heldout_split, step_precision
    from eagle.train.data import ShardDataset
    from eagle.train.trainer import load_train_config, recipe_for

    try:
        cfg = load_train_config(args.config)
    except (ConfigError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not (Path(cfg.data_dir) / "manifest.json").is_file():
        print(f"error: no data in {cfg.data_dir}: run `eagle train --config {args.config} --data-only` first",
              file=sys.stderr)
        return 2
    if not native_bf16():
        print("note: this CPU has no native bf16 products (AVX512-BF16 / AMX): bf16 will be slow here", file=sys.stderr)
    torch.set_num_threads(args.threads)
    device = torch.device("cpu")
    model, _ = load_target(cfg.target)
    cls = recipe_for(cfg)
    data = ShardDataset(cfg.data_dir, load_hidden=cls.load_hidden, load_layers=cls.load_layers,
                        max_tokens=args.data_tokens).sequences
    train_set, eval_set = heldout_split(data, 0.1, cfg.seed)
    eval_set = eval_set[: args.eval_sequences]
    recipe = cls(cfg, model, train_set, device)
    init = copy.deepcopy(recipe.module.state_dict())
    lengths = [min(len(q.input_ids), cfg.max_seq_len) for q in train_set]
    order = batch_order(len(train_set), cfg.batch_size, cfg.seed, 0, lengths)
    batches = [recipe.batch([train_set[i] for i in b], b, k, device) for k, b in enumerate(order[: max(args.train_steps, args.steps)])]
    positions = [float(b[3].sum()) if isinstance(b, tuple) and len(b) == 4 else None for b in batches]

    def fresh():
        m = copy.deepcopy(recipe.module)
        m.load_state_dict(init)
        return m, torch.optim.AdamW(m.parameters(), lr=cfg.lr, betas=(0.9, 0.95))

    # 1) one batch, same weights: how far bf16 moves the loss and the gradient
    grads, losses = {}, {}
    for dt in PRECISIONS:
        m, _ = fresh()
        with step_precision(dt, device):
            loss_sum, count, _ = recipe.loss(m, batches[0])
        loss = loss_sum / count.clamp(min=1)
        loss.backward()
        losses[dt] = float(loss.detach())
        grads[dt] = torch.cat([p.grad.flatten() for p in m.parameters() if p.grad is not None])
    cos = float(torch.nn.functional.cosine_similarity(grads["float32"].double(), grads["bfloat16"].double(), dim=0))
    agree = {"loss_float32": losses["float32"], "loss_bfloat16": losses["bfloat16"],
             "loss_rel_diff": abs(losses["bfloat16"] - losses["float32"]) / abs(losses["float32"]),
             "grad_cosine": cos, "grad_norm_ratio": float(grads["bfloat16"].norm() / grads["float32"].norm())}
    print(f"one batch: loss {losses['float32']:.4f} (fp32) vs {losses['bfloat16']:.4f} (bf16); "
          f"gradient cosine {cos:.5f}, norm ratio {agree['grad_norm_ratio']:.4f}")

    # 2) step time, alternating precisions; each round starts from a fresh copy after one untimed step
    state: dict = {}

    def arm(dt) -> Arm:
        def fresh_and_warm():
            state["m"], state["opt"] = fresh()
            _step(recipe, state["m"], state["opt"], batches[0], dt, device)

        def run():
            for k in range(args.steps):
                _step(recipe, state["m"], state["opt"], batches[k % len(batches)], dt, device)
        return Arm(run, before=fresh_and_warm)

    timed = interleave({dt: arm(dt) for dt in PRECISIONS}, args.rounds, warmup=0,
                       progress=lambda r, dt, s: print(f"round {r}: {dt} {s / args.steps:.2f} s/step", flush=True))
    times = {dt: [s / args.steps for s in v] for dt, v in timed.times.items()}

    # 3) a short training per precision from the same init, then held-out loss and top-1 per step
    from eagle.train.trainer import _evaluate

    class _Run:
        device = torch.device("cpu")

    trained = {}
    for dt in PRECISIONS[: 2 if args.train_steps else 0]:
        m, opt = fresh()
        curve = [_step(recipe, m, opt, b, dt, device) for b in batches[: args.train_steps]]
        saved, recipe.module = recipe.module, m
        ev_cfg = copy.copy(cfg)
        ev_cfg.train_dtype = "float32"  # both evaluated the same way
        ev = _evaluate(recipe, eval_set, ev_cfg, _Run())
        recipe.module = saved
        trained[dt] = {"train_loss_last5": sum(curve[-5:]) / len(curve[-5:]), "heldout": ev}
        print(f"{dt}: {args.train_steps} steps, held-out loss {ev['loss']:.4f}, top-1 per step "
              + " ".join(f"{a:.3f}" for a in ev["acc"]), flush=True)

    med = {dt: timed.median(dt, 1 / args.steps) for dt in PRECISIONS}
    result = {"command": "python experiments/perf/train_precision.py " + " ".join(argv if argv is not None else sys.argv[1:]),
              "config": args.config, "head": cfg.head, "batch_size": cfg.batch_size,
              "train_sequences": len(train_set), "eval_sequences": len(eval_set),
              "counted_positions_first_batch": positions[0], "one_batch": agree,
              "seconds_per_step": times, "median_s_per_step": med,
              "speedup_bf16": med["float32"] / med["bfloat16"], "short_training": trained}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"bf16 {result['speedup_bf16']:.2f}x float32 per step ({med['float32']:.2f} -> {med['bfloat16']:.2f} s); "
          f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
