"""Training the EAGLE head by self-distillation: one process or ``torchrun`` (DDP; gloo on CPU,
nccl on GPU). Deterministic given the seed: the data order and the feature noise depend only on
(seed, step, sequence index), so 2 processes x B/2 sequences give the same update as 1 x B, and a
run resumed from a checkpoint continues exactly where an uninterrupted one would be.
"""
from __future__ import annotations

import copy
import sys
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

from ..config import ConfigError
from ..heads import DraftHead, HeadConfig, save_head
from .common import (Run, batch_order, causal_mask, cosine_lr, full_precision, heldout_split, load_resume_state,
                     save_checkpoint, step_precision)
from .data import Prompt, Sequence, ShardDataset, generate_shards, load_manifest, read_prompt_records
from .recipe import Recipe, TrainConfig, draft_vocabulary, load_train_config

__all__ = ["TrainConfig", "load_train_config", "train", "make_data", "head_loss", "training_prompts", "EagleRecipe",
           "recipe_for"]


# ---------------------------------------------------------------------------------------------
# loss


def head_loss(head: DraftHead, embed: torch.nn.Module, lm_w: torch.Tensor, feats: torch.Tensor,
              ids: torch.Tensor, weight: torch.Tensor, noise: torch.Tensor, lengths: list[int],
              cls_weight: float, unroll: int):
    """Summed (not averaged) EAGLE loss of a padded batch.

    Args:
        feats: ``(B, T, H)`` target features f_0..f_{T-1}; ids ``(B, T)`` tokens x_0..x_{T-1}.
        weight: ``(B, T-1)`` 1 where pair j (predicting f_{j+1}) counts, else 0.
        noise: ``(B, T-1, H)`` added to the head's input features.
    Returns: ``(loss_sum, stats)`` with per-unroll-step summed accuracy.
    """
    f_in, f_tgt = feats[:, :-1], feats[:, 1:]  # (B, T-1, H)
    tok = embed(ids[:, 1:])  # (B, T-1, H) embedding of x_{j+1}
    T1 = f_in.shape[1]
    pos = torch.arange(T1, device=feats.device)[None].expand(len(lengths), -1)
    mask = causal_mask([max(n - 1, 1) for n in lengths], T1, feats.device)
    sel = weight > 0  # (B, T-1): only these pairs pay for the (N, Vd) LM-head products
    with torch.no_grad(), full_precision(feats.device):  # the target's distribution, exact
        tgt_logp = torch.log_softmax(f_tgt[sel].float() @ lm_w.float().T, dim=-1)  # (N, Vd) target distribution
        tgt_p, tgt_top = tgt_logp.exp(), tgt_logp.argmax(-1)
    total = feats.new_zeros(())
    accs = []
    inp = f_in + noise
    for step in range(unroll):
        pred = head(inp, tok, pos, mask)  # (B, T-1, H)
        p_sel = pred[sel]  # (N, H)
        reg = F.smooth_l1_loss(p_sel.float(), f_tgt[sel], reduction="none").mean(-1)  # (N,)
        logq = torch.log_softmax((p_sel @ lm_w.T).float(), dim=-1)  # (N, Vd); float32 under autocast
        ce = -(tgt_p * logq).sum(-1)  # (N,)
        total = total + (reg + cls_weight * ce).sum() / unroll
        accs.append((logq.argmax(-1) == tgt_top).float().sum().detach())
        # training-time test: the next pass sees the head's own predictions as input features
        inp = torch.cat([f_in[:, :1], pred[:, :-1]], dim=1)
    return total, accs


# ---------------------------------------------------------------------------------------------
# training state


def _noise(shape, amount: float, seed: int, step: int, seq: int) -> torch.Tensor:
    g = torch.Generator().manual_seed((seed * 1_000_003 + step) * 1_000_003 + seq)
    return (torch.rand(shape, generator=g) * 2 - 1) * amount


def _collate(seqs: list[Sequence], idx: list[int], cfg: TrainConfig, step: int, device, features_fn):
    lengths = [min(len(s.input_ids), cfg.max_seq_len) for s in seqs]
    T = max(lengths)
    H = features_fn.hidden_size
    ids = torch.zeros(len(seqs), T, dtype=torch.long)
    weight = torch.zeros(len(seqs), T - 1)
    noise = torch.zeros(len(seqs), T - 1, H)
    for b, (s, n) in enumerate(zip(seqs, lengths)):
        ids[b, :n] = s.input_ids[:n]
        start = 0 if cfg.train_on_prompt else max(s.prompt_len - 1, 0)
        weight[b, start: n - 1] = 1.0
        noise[b, : n - 1] = _noise((n - 1, H), cfg.noise, cfg.seed, step, idx[b])
    feats = features_fn(seqs, ids, lengths).to(device)
    return feats, ids.to(device), weight.to(device), noise.to(device), lengths


class _Features:
    """Target features for a batch: from the shards (offline) or a no-grad target forward (online)."""

    def __init__(self, model, online: bool, hidden_size: int):
        self.model, self.online, self.hidden_size = model, online, hidden_size

    @torch.no_grad()
    def __call__(self, seqs, ids, lengths) -> torch.Tensor:
        T = ids.shape[1]
        if self.online:
            att = (torch.arange(T)[None] < torch.tensor(lengths)[:, None]).long()
            dev = next(self.model.parameters()).device
            return self.model.get_decoder()(input_ids=ids.to(dev), attention_mask=att.to(dev)).last_hidden_state.float()
        out = torch.zeros(len(seqs), T, self.hidden_size)
        for b, (s, n) in enumerate(zip(seqs, lengths)):
            out[b, :n] = s.hidden[:n].float()
        return out


def _evaluate(recipe: "Recipe", data, cfg, run) -> dict:
    """Held-out loss and per-step top-1 accuracy (no feature noise), per counted token."""
    recipe.module.eval()
    loss = torch.zeros(()); n = torch.zeros(()); accs = None
    with torch.no_grad():
        for i in range(0, len(data), cfg.batch_size):
            chunk = data[i: i + cfg.batch_size]
            batch = recipe.batch(chunk, list(range(i, i + len(chunk))), 0, run.device, train=False)
            with step_precision(cfg.train_dtype, run.device):
                l, cnt, a = recipe.loss(recipe.module, batch)
            loss += l.detach().cpu(); n += cnt.cpu()
            a = torch.stack(a).cpu()
            accs = a if accs is None else accs + a
    recipe.module.train()
    return {"loss": float(loss / n.clamp(min=1)), "acc": [float(x / n.clamp(min=1)) for x in accs]}


class EagleRecipe(Recipe):
    """The EAGLE-1/2 head: feature regression + cross-entropy, ``unroll`` passes on its own outputs."""

    def __init__(self, cfg: TrainConfig, model, train_set: list[Sequence], device):
        self.cfg = cfg
        self.load_hidden = cfg.extraction == "offline"
        vocab = model.get_output_embeddings().weight.shape[0]
        self.draft_vocab = draft_vocabulary(cfg, train_set, vocab)
        # the head's random init must not depend on what ran before it (data generated in this call or
        # an earlier one, a target loaded or passed in): one config, one head
        torch.manual_seed(cfg.seed)
        self.module = DraftHead.for_target(model, self.draft_vocab).to(device).float()
        self.embed = model.get_input_embeddings()
        self.lm_w = self.module.lm_weight(model.get_output_embeddings()).detach().float()
        self.features = _Features(model, cfg.extraction == "online", model.config.get_text_config(decoder=True).hidden_size)

    def batch(self, seqs, idx, step, device, train=True):
        feats, ids, w, noise, lengths = _collate(seqs, idx, self.cfg, step, device, self.features)
        return feats, ids, w, noise if train else torch.zeros_like(noise), lengths

    def loss(self, module, batch):
        feats, ids, w, noise, lengths = batch
        total, accs = head_loss(module, self.embed, self.lm_w, feats, ids, w, noise, lengths, self.cfg.cls_weight,
                                self.cfg.unroll)
        return total, w.sum().detach(), accs

    def export(self, cfg, model) -> None:
        tcfg = model.config.get_text_config(decoder=True)
        save_head(self.module, cfg.export, HeadConfig(
            target=cfg.target, model_type=tcfg.model_type, hidden_size=tcfg.hidden_size, vocab_size=tcfg.vocab_size,
            draft_vocab=[] if self.draft_vocab is None else self.draft_vocab.tolist()), dtype=getattr(torch, cfg.export_dtype))


def data_sources(cfg: TrainConfig) -> list[TrainConfig]:
    """The configs whose data a run trains on: ``cfg``, then its replayed config (if any)."""
    replay = replay_config(cfg)
    return [cfg] if replay is None else [cfg, replay]


def replay_config(cfg: TrainConfig) -> TrainConfig | None:
    """The training config whose data ``cfg`` replays (its ``data_tokens`` set to ``cfg.replay_tokens``),
    or None. It must hold the same kind of features."""
    if not cfg.replay_config:
        return None
    other = load_train_config(cfg.replay_config)
    if other.target != cfg.target:
        raise ConfigError(f"replay_config {cfg.replay_config} trains for target {other.target}, this run for {cfg.target}")
    if other.extraction != cfg.extraction:
        raise ConfigError(f"replay_config {cfg.replay_config} has extraction: {other.extraction}, this run "
                          f"{cfg.extraction}: the replayed data must hold the same features")
    other.data_tokens = cfg.replay_tokens
    return other


def init_weights(head: torch.nn.Module, folder: str, model) -> None:
    """Start ``head`` from the weights of the head in ``folder`` (all but the draft vocabulary, which
    the run chooses on its own data); a head of another shape is an error naming the folder."""
    from ..heads import HeadError, load_head

    src = load_head(folder, model)
    if type(src) is not type(head):
        raise HeadError(f"init_from {folder} holds a {type(src).__name__}, this run trains a {type(head).__name__}")
    state = {k: v for k, v in src.state_dict().items() if k != "draft_vocab"}
    missing, unexpected = head.load_state_dict(state, strict=False)
    missing = [k for k in missing if k != "draft_vocab"]
    if missing or unexpected:
        raise HeadError(f"init_from {folder}: weights do not fit this head (missing {missing}, unexpected {unexpected})")


def training_prompts(cfg: TrainConfig) -> list[Prompt]:
    """The prompts the data stage self-distills: ``cfg.prompts`` then ``cfg.extra_data``, the first
    ``num_prompts`` of them. A missing, empty or malformed file raises ``PromptFileError`` naming it."""
    prompts = read_prompt_records(cfg.prompts)
    for extra in cfg.extra_data:
        prompts += read_prompt_records(extra)
    return prompts[: cfg.num_prompts] if cfg.num_prompts else prompts


def data_layers(cfg, model) -> tuple[int, ...]:
    """The layers the data stage stores, checked against the target's depth."""
    L = model.config.get_text_config(decoder=True).num_hidden_layers
    bad = [i for i in cfg.feature_layers if i > L]
    if bad:
        raise ConfigError(f"feature_layers {bad} out of range: the target has {L} layers (indices 0..{L})")
    return tuple(cfg.feature_layers)


def prepare_data(cfg: TrainConfig, model, tok, run: Run, prompts: list[Prompt] | None = None) -> None:
    """Self-distill the prompt set (``prompts``, default :func:`training_prompts`) into
    ``cfg.data_dir`` (resumable), on the main process only; with ``cfg.tokens_dir``, first rebuild
    the shards the token store holds and ``data_dir`` lacks, and mirror every new shard into it."""
    if run.main:
        if prompts is None:
            prompts = training_prompts(cfg)
        layers = data_layers(cfg, model)
        store_hidden = cfg.extraction == "offline"
        sampler = sampling_model(model, cfg.gen_dtype)
        on_shard = None
        if cfg.tokens_dir:
            from .data import writer_lock
            from .tokens import mirror_shards, sampling_settings, sync_token_store

            settings = sampling_settings(cfg.target, cfg.gen_temperature, cfg.gen_max_new_tokens, cfg.shard_prompts,
                                         cfg.seed)
            with writer_lock(cfg.data_dir):
                sync_token_store(model, cfg.data_dir, cfg.tokens_dir, prompts, settings, store_hidden, layers,
                                 max_tokens=cfg.data_tokens)
            # provenance of each new shard: what decides its draws beyond the settings
            made = {"gen_dtype": str(sampler.dtype).removeprefix("torch."), "gen_batch_size": cfg.gen_batch_size}
            on_shard = partial(mirror_shards, cfg.data_dir, cfg.tokens_dir, prompts, settings, made)
        m = load_manifest(cfg.data_dir)
        enough = cfg.data_tokens and m["tokens"] >= cfg.data_tokens  # a data_tokens run needs no more
        if m["prompts_done"] < len(prompts) and not enough:
            generate_shards(sampler, tok, prompts, cfg.data_dir, batch_size=cfg.gen_batch_size,
                            max_new_tokens=cfg.gen_max_new_tokens, temperature=cfg.gen_temperature,
                            shard_prompts=cfg.shard_prompts, seed=cfg.seed, store_hidden=store_hidden,
                            feature_layers=layers, on_shard=on_shard)
    run.barrier()


def sampling_model(model, gen_dtype: str):
    """The model the data stage samples with: ``model`` itself, or a copy cast to ``gen_dtype``
    (``"auto"``: bfloat16 where it is native, see :func:`eagle.backends.native_bf16`)."""
    from ..backends import native_bf16

    w = model.get_output_embeddings().weight
    name = gen_dtype
    if name == "auto":
        name = "bfloat16" if native_bf16(w.device) else ""
    if not name or getattr(torch, name) == w.dtype:
        return model
    return copy.deepcopy(model).to(getattr(torch, name))


def make_data(cfg: TrainConfig, model=None, tok=None) -> dict:
    """Only the data stage of ``cfg`` and of the config it replays (``eagle train --data-only``):
    returns ``cfg``'s data manifest."""
    from ..models import load_target

    prompts = training_prompts(cfg)
    sources = data_sources(cfg)  # a bad replay config fails before the target loads
    if model is None:
        model, tok = load_target(cfg.target)
    for c in sources:
        prepare_data(c, model, tok, Run(), prompts if c is cfg else None)
    return load_manifest(cfg.data_dir)


def recipe_for(cfg: TrainConfig) -> type[Recipe]:
    """The training recipe of ``cfg.head``."""
    if cfg.head == "eagle3":
        from .eagle3 import Eagle3Recipe

        return Eagle3Recipe
    if cfg.head == "medusa":
        from .medusa import MedusaRecipe

        return MedusaRecipe
    return EagleRecipe


def train(cfg: TrainConfig, model=None, tok=None, progress: bool = True, on_step=None) -> dict:
    """Run data preparation (if needed), training with checkpoints/resume, evaluation and export.

    ``model``/``tok`` default to ``load_target(cfg.target)``; ``on_step(step)`` is called after every
    optimizer step (tests use it to simulate an interruption).
    Returns a summary dict (steps, final eval loss and per-step accuracy, tokens seen)."""
    from ..models import load_target

    run = Run()
    prompts = training_prompts(cfg)  # a bad prompts file fails now, not after the target has loaded
    sources = data_sources(cfg)  # and a bad replay config
    torch.manual_seed(cfg.seed)
    if model is None:
        model, tok = load_target(cfg.target, device=run.device)
    for c in sources:  # a replayed config's data stage rebuilds from its token store up to replay_tokens
        prepare_data(c, model, tok, run, prompts if c is cfg else None)
    recipe_cls = recipe_for(cfg)
    data = []
    for c in sources:
        data += ShardDataset(c.data_dir, load_hidden=recipe_cls.load_hidden and cfg.extraction == "offline",
                             load_layers=recipe_cls.load_layers, max_tokens=c.data_tokens).sequences
    train_set, eval_set = heldout_split(data, cfg.heldout_fraction, cfg.seed)
    if len(train_set) < cfg.batch_size:
        raise ValueError(f"only {len(train_set)} training sequences for a batch of {cfg.batch_size}")
    recipe = recipe_cls(cfg, model, train_set, run.device)
    head = recipe.module
    if cfg.init_from:
        init_weights(head, cfg.init_from, model)

    out_dir = Path(cfg.out_dir)
    ckpt = out_dir / "checkpoint"
    opt = torch.optim.AdamW([p for p in head.parameters() if p.requires_grad], lr=cfg.lr,
                            weight_decay=cfg.weight_decay, betas=(0.9, 0.95))
    step = 0
    resumed = load_resume_state(ckpt, cfg)
    if resumed is not None:  # resume: weights, optimizer, data position
        head.load_state_dict(resumed[0])
        opt.load_state_dict(resumed[1]["optimizer"])
        step = resumed[1]["step"]
        if run.main:
            tqdm.write(f"resuming at step {step} from the checkpoint in {ckpt}", file=sys.stderr)
    steps_per_epoch = len(train_set) // cfg.batch_size
    total = cfg.max_steps or max(1, int(cfg.epochs * steps_per_epoch))
    model_ddp = torch.nn.parallel.DistributedDataParallel(head) if run.world > 1 else head
    if cfg.batch_size % run.world:
        raise ValueError(f"batch_size {cfg.batch_size} is not divisible by {run.world} processes")

    bar = tqdm(total=total, initial=step, desc="train", disable=not (progress and run.main), dynamic_ncols=True)
    history = []
    head.train()
    lengths = [min(len(q.input_ids), cfg.max_seq_len) for q in train_set] if cfg.group_by_length else None
    order = {}  # epoch -> its batches
    while step < total:
        epoch, b = divmod(step, steps_per_epoch)
        if epoch not in order:
            order = {epoch: batch_order(len(train_set), cfg.batch_size, cfg.seed, epoch, lengths)}
        batch_idx = order[epoch][b]
        mine = batch_idx[run.rank:: run.world]  # this process's share of the global batch
        batch = recipe.batch([train_set[i] for i in mine], mine, step, run.device)
        with step_precision(cfg.train_dtype, run.device):  # backward runs in the forward's precisions
            loss_sum, count, accs = recipe.loss(model_ddp, batch)
        n_global = run.all_sum(count.cpu())
        # DDP averages gradients over processes: scale so the result is the global per-token mean
        loss = loss_sum * run.world / n_global.clamp(min=1).to(loss_sum.device)
        for group in opt.param_groups:
            group["lr"] = cosine_lr(step, total, cfg.warmup_steps, cfg.lr)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if cfg.grad_clip:
            torch.nn.utils.clip_grad_norm_(head.parameters(), cfg.grad_clip)
        opt.step()
        step += 1
        stats = run.all_sum(torch.stack([loss_sum.detach().cpu()] + [a.cpu() for a in accs]))
        denom = float(n_global.clamp(min=1))
        bar.set_postfix(loss=f"{float(stats[0]) / denom:.3f}", acc=f"{float(stats[1]) / denom:.3f}")
        bar.update(1)
        if on_step is not None:
            on_step(step)
        if step % cfg.checkpoint_every == 0 or step == total:
            if run.main:
                save_checkpoint(ckpt, head.state_dict(), opt, step, cfg)
            run.barrier()
        if run.main and (step % cfg.eval_every == 0 or step == total) and eval_set:
            ev = _evaluate(recipe, eval_set, cfg, run)
            ev["step"] = step
            history.append(ev)
            tqdm.write(f"step {step}: heldout loss {ev['loss']:.4f}  top-1 acc per step "
                       + " ".join(f"{a:.3f}" for a in ev["acc"]))
    bar.close()
    summary = {"steps": step, "train_sequences": len(train_set), "eval_sequences": len(eval_set),
               "tokens": sum(len(s.input_ids) for s in train_set), "eval": history}
    if run.main and cfg.export:
        recipe.export(cfg, model)
    run.barrier()
    return summary
