"""Distilling a small separate draft model from the target (``eagle distill``).

Data: the EAGLE head's self-distilled shards (the target wrote the answers and we kept its last
hidden state at every position). The target's next-token distribution at a position is its LM head
applied to that stored feature, so the distributions come from the shards without another target
forward. They are cached once as the top-k (ids, log-probs) per position next to each shard
(``shard-NNNNN.topK.safetensors``, resumable shard by shard).

Loss: KL(p_target || q_student) per position, with p the target's top-k probabilities renormalised
(k = 64 keeps > 0.97 of the mass on this data; the dropped tail is the same for every student).
Student: :func:`eagle.draft_model.build_draft_model` (a few of the target's layers, its embedding
and LM head shared and frozen). One process; checkpoints are atomic and a rerun resumes exactly.
"""
from __future__ import annotations

import os
import sys
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from tqdm import tqdm

from ..config import ConfigError
from ..draft_model import build_draft_model, save_draft_model, shared_weight_names
from .data import ShardDataset, load_manifest, read_tensors
from .common import (Run, batch_order, check_optimization, cosine_lr, heldout_split, load_resume_state, load_yaml_config,
                     save_checkpoint)
from .trainer import load_train_config, prepare_data, training_prompts

__all__ = ["DistillConfig", "load_distill_config", "distill", "cache_target_topk", "distill_loss"]


@dataclass
class DistillConfig:
    """Everything ``eagle distill`` does: data (shared with the head), target top-k cache, training, export."""

    target: str = "smollm2-135m"
    data: str = "experiments/configs/train-smollm2.yaml"  # the head's training config: its prompts and shards
    num_prompts: int = 0  # train on the sequences of the first N self-distilled prompts (0 = all there are)
    init_layers: list[int] = field(default_factory=lambda: [0, 1, 29])  # target layers the student starts from
    top_k: int = 64  # cached target probabilities per position
    train_on_prompt: bool = True  # the target's distributions over the prompt tokens are training signal too
    epochs: float = 1.0
    batch_size: int = 8
    max_seq_len: int = 320
    lr: float = 5e-4
    warmup_steps: int = 30
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    heldout_fraction: float = 0.03
    eval_every: int = 200
    checkpoint_every: int = 50
    max_steps: int = 0  # 0 = derived from epochs
    seed: int = 0
    out_dir: str = "runs/smollm2-draft"
    export: str = "draft-models/smollm2-135m-3l"
    export_dtype: str = "float16"

    def validate(self) -> None:
        for name in ("out_dir", "export"):  # "~/...": as the head's training config does
            setattr(self, name, os.path.expanduser(getattr(self, name)))
        if self.num_prompts < 0:
            raise ConfigError("num_prompts must be >= 0 (0 = all)")
        if not self.init_layers:
            raise ConfigError("init_layers must name at least one target layer")
        check_optimization(self, ("top_k", "batch_size", "max_seq_len", "checkpoint_every", "eval_every"))


def load_distill_config(path: str | Path) -> DistillConfig:
    return load_yaml_config(DistillConfig, path)


# ---------------------------------------------------------------------------------------------
# the target's distributions, cached from the stored features


def _topk_name(shard: str, k: int) -> str:
    return shard.replace(".safetensors", f".top{k}.safetensors")


@torch.no_grad()
def cache_target_topk(data_dir: str | Path, model, k: int, chunk: int = 1024, progress: bool = True,
                      manifest: dict | None = None) -> None:
    """Write ``shard-NNNNN.top{k}.safetensors`` (``ids (N, k) int32``, ``logp (N, k) float32``, the
    target's log-probabilities, largest first) for every shard (of ``manifest``) that lacks one."""
    from ..target import Target

    data_dir = Path(data_dir)
    target = Target(model, "reference")
    todo = [s for s in (manifest or load_manifest(data_dir))["shards"] if not (data_dir / _topk_name(s["file"], k)).exists()]
    for s in tqdm(todo, desc=f"target top-{k}", unit="shard", disable=not progress or not todo, dynamic_ncols=True):
        hidden = read_tensors(data_dir / s["file"], ("hidden",))["hidden"]  # (N, H) fp16
        ids, logp = [], []
        for i in range(0, hidden.shape[0], chunk):
            lp = torch.log_softmax(target.logits(hidden[i: i + chunk].to(target.device, model.dtype)), dim=-1)
            top = lp.topk(k, dim=-1)  # (n, k), sorted
            ids.append(top.indices.to(torch.int32).cpu())
            logp.append(top.values.cpu())
        out = data_dir / _topk_name(s["file"], k)
        save_file({"ids": torch.cat(ids), "logp": torch.cat(logp)}, str(out) + ".tmp")
        os.replace(str(out) + ".tmp", out)


def load_topk(data_dir: str | Path, k: int, manifest: dict | None = None) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per sequence (in :class:`ShardDataset` order): ``(ids (n, k) long, logp (n, k) float)``, for
    the shards of ``manifest`` (default: the folder's current one)."""
    data_dir = Path(data_dir)
    out = []
    for s in (manifest or load_manifest(data_dir))["shards"]:
        t = load_file(str(data_dir / _topk_name(s["file"], k)))
        off = read_tensors(data_dir / s["file"], ("offsets",))["offsets"].tolist()
        for i in range(len(off) - 1):
            out.append((t["ids"][off[i]:off[i + 1]].long(), t["logp"][off[i]:off[i + 1]].float()))
    return out


# ---------------------------------------------------------------------------------------------
# loss


def distill_loss(student, ids: torch.Tensor, lengths: list[int], weight: torch.Tensor, t_ids: torch.Tensor,
                 t_logp: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed KL(p_target top-k renormalised || q_student) and summed top-1 agreement over the
    positions with ``weight`` 1.

    ids (B, T) right-padded; weight (B, T); t_ids / t_logp (B, T, k): the target's top-k at each
    position (the distribution of the token after it)."""
    T = ids.shape[1]
    att = (torch.arange(T, device=ids.device)[None] < torch.tensor(lengths, device=ids.device)[:, None]).long()
    hidden = student.get_decoder()(input_ids=ids, attention_mask=att).last_hidden_state  # (B, T, H)
    sel = weight > 0
    h = hidden[sel]  # (N, H): only the positions that count go through the big LM head
    logq = torch.log_softmax(F.linear(h, student.get_output_embeddings().weight).float(), dim=-1)  # (N, V)
    p_logp = torch.log_softmax(t_logp[sel], dim=-1)  # (N, k): top-k renormalised
    kl = (p_logp.exp() * (p_logp - logq.gather(1, t_ids[sel]))).sum()
    agree = (logq.argmax(-1) == t_ids[sel][:, 0]).sum()
    return kl, agree


def _collate(seqs, topk, idx: list[int], cfg: DistillConfig, device):
    lengths = [min(len(seqs[i].input_ids), cfg.max_seq_len) for i in idx]
    T, k = max(lengths), cfg.top_k
    ids = torch.zeros(len(idx), T, dtype=torch.long)
    weight = torch.zeros(len(idx), T)
    t_ids = torch.zeros(len(idx), T, k, dtype=torch.long)
    t_logp = torch.zeros(len(idx), T, k)
    for b, (i, n) in enumerate(zip(idx, lengths)):
        ids[b, :n] = seqs[i].input_ids[:n]
        start = 0 if cfg.train_on_prompt else max(seqs[i].prompt_len - 1, 0)
        weight[b, start:n] = 1.0
        t_ids[b, :n], t_logp[b, :n] = topk[i][0][:n], topk[i][1][:n]
    return ids.to(device), lengths, weight.to(device), t_ids.to(device), t_logp.to(device)


def _evaluate(student, seqs, topk, cfg, device) -> dict:
    """Held-out KL and top-1 agreement over the trained positions, and both over the answer alone
    (the positions a draft model is used on; the prompt's fixed chat template is easy to predict)."""
    student.eval()
    out = {}
    with torch.no_grad():
        for key, c in (("", cfg), ("answer_", replace(cfg, train_on_prompt=False))):
            kl = agree = n = 0.0
            for i in range(0, len(seqs), c.batch_size):
                ids, lengths, w, t_ids, t_logp = _collate(seqs, topk, list(range(i, min(i + c.batch_size, len(seqs)))),
                                                          c, device)
                a, b = distill_loss(student, ids, lengths, w, t_ids, t_logp)
                kl += float(a); agree += float(b); n += float(w.sum())
            out.update({key + "kl": kl / max(n, 1), key + "top1_agreement": agree / max(n, 1)})
    student.train()
    return out


def distill(cfg: DistillConfig, model=None, tok=None, progress: bool = True, on_step=None) -> dict:
    """Data (the head's shards, generated if missing), target top-k cache, KL training with
    checkpoints/resume, held-out evaluation and export. Returns a summary dict."""
    from ..models import load_target

    run = Run()
    if run.world > 1:
        raise ValueError("eagle distill runs on one process (the student is small); start it without torchrun")
    # the data config and its prompts are checked before the (slow) target load
    data_cfg = load_train_config(cfg.data)
    if data_cfg.extraction != "offline":
        raise ConfigError(f"{cfg.data}: the draft model needs stored features (extraction: offline)")
    if cfg.num_prompts:  # self-distil only as many prompts as this run uses (the shards resume in order)
        data_cfg.num_prompts = cfg.num_prompts
    prompts = training_prompts(data_cfg)
    torch.manual_seed(cfg.seed)
    if model is None:
        model, tok = load_target(cfg.target, device=run.device)
    prepare_data(data_cfg, model, tok, run, prompts)
    manifest = load_manifest(data_cfg.data_dir)  # one snapshot: another run may be appending shards
    cache_target_topk(data_cfg.data_dir, model, cfg.top_k, progress=progress, manifest=manifest)
    n_seq = sum(s["sequences"] for s in manifest["shards"])
    pairs = list(zip(ShardDataset(data_cfg.data_dir, load_hidden=False).sequences[:n_seq],
                     load_topk(data_cfg.data_dir, cfg.top_k, manifest)))
    if cfg.num_prompts:  # one sequence per prompt; shards follow the prompt order (shard_prompts a shard)
        if cfg.num_prompts > len(pairs):
            raise ValueError(f"num_prompts {cfg.num_prompts} but {data_cfg.data_dir} holds {len(pairs)} sequences "
                             f"(raise num_prompts in {cfg.data})")
        pairs = pairs[: cfg.num_prompts]
    train_pairs, eval_pairs = heldout_split(pairs, cfg.heldout_fraction, cfg.seed)
    train_seqs, train_topk = [p[0] for p in train_pairs], [p[1] for p in train_pairs]
    eval_seqs, eval_topk = [p[0] for p in eval_pairs], [p[1] for p in eval_pairs]
    if len(train_seqs) < cfg.batch_size:
        raise ValueError(f"only {len(train_seqs)} training sequences for a batch of {cfg.batch_size}")

    student = build_draft_model(model, cfg.init_layers)
    shared = set(shared_weight_names(student))
    trainable = {n: p for n, p in student.named_parameters() if n not in shared}
    for n, p in student.named_parameters():
        p.requires_grad_(n in trainable)
    opt = torch.optim.AdamW(list(trainable.values()), lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.95))

    ckpt = Path(cfg.out_dir) / "checkpoint"
    step = 0
    resumed = load_resume_state(ckpt, cfg, weights="student.safetensors")
    if resumed is not None:  # resume: weights, optimizer, data position
        student.load_state_dict(resumed[0], strict=False)
        opt.load_state_dict(resumed[1]["optimizer"])
        step = resumed[1]["step"]
        tqdm.write(f"resuming at step {step} from the checkpoint in {ckpt}", file=sys.stderr)
    steps_per_epoch = len(train_seqs) // cfg.batch_size
    total = cfg.max_steps or max(1, int(cfg.epochs * steps_per_epoch))

    def trainable_state() -> dict:
        return {n: p for n, p in student.state_dict().items() if n not in shared}

    bar = tqdm(total=total, initial=step, desc="distill", disable=not progress, dynamic_ncols=True)
    history = []
    student.train()
    while step < total:
        epoch, b = divmod(step, steps_per_epoch)
        idx = batch_order(len(train_seqs), cfg.batch_size, cfg.seed, epoch)[b]
        ids, lengths, w, t_ids, t_logp = _collate(train_seqs, train_topk, idx, cfg, run.device)
        kl, agree = distill_loss(student, ids, lengths, w, t_ids, t_logp)
        n = w.sum().clamp(min=1)
        for group in opt.param_groups:
            group["lr"] = cosine_lr(step, total, cfg.warmup_steps, cfg.lr)
        opt.zero_grad(set_to_none=True)
        (kl / n).backward()
        if cfg.grad_clip:
            torch.nn.utils.clip_grad_norm_(list(trainable.values()), cfg.grad_clip)
        opt.step()
        step += 1
        bar.set_postfix(kl=f"{float(kl.detach() / n):.3f}", top1=f"{float(agree / n):.3f}")
        bar.update(1)
        if on_step is not None:
            on_step(step)
        if step % cfg.checkpoint_every == 0 or step == total:
            save_checkpoint(ckpt, trainable_state(), opt, step, cfg, weights="student.safetensors")
        if (step % cfg.eval_every == 0 or step == total) and eval_seqs:
            ev = _evaluate(student, eval_seqs, eval_topk, cfg, run.device)
            ev["step"] = step
            history.append(ev)
            tqdm.write(f"step {step}: heldout KL {ev['kl']:.4f}  top-1 agreement {ev['top1_agreement']:.3f}  "
                       f"(answer only: KL {ev['answer_kl']:.4f}, top-1 {ev['answer_top1_agreement']:.3f})")
    bar.close()
    summary = {"steps": step, "train_sequences": len(train_seqs), "eval_sequences": len(eval_seqs),
               "tokens": sum(len(s.input_ids) for s in train_seqs), "eval": history}
    if cfg.export:
        save_draft_model(student, cfg.export, cfg.target, dtype=getattr(torch, cfg.export_dtype),
                         extra={"distill": {"config": asdict(cfg), "steps": step, "eval": history[-1:] or None}})
    return summary
