"""Training Medusa-1 heads (eagle/heads/medusa.py) on the self-distilled shards, in the shared loop of
:func:`eagle.train.trainer.train` (``head: medusa``).

Labels are self-distilled, like the EAGLE head's: head k at position t learns the target's own
distribution at position t + k (the target LM head on the stored final feature ``f_{t+k}``, which
predicts ``x_{t+k+1}`` given the data's tokens up to it), restricted to the draft vocabulary when
there is one. The loss of a position is ``sum_k w_k * CE(target_{t+k}, head_k(f_t))`` with
``w_k = medusa_decay ** (k - 1)``; every head is counted on the same positions (answer positions t
with t + K inside the sequence), so a batch's per-head accuracies share one denominator. No feature
noise and no unrolling: Medusa heads read only the true target feature, at training and at drafting
time alike (``noise``, ``cls_weight`` and ``unroll`` do not apply).

Accuracy: during training (the progress bar) a hit is the head's top-1 == the target's top-1 over
the draft vocabulary; on the held-out set it is the head's top-1 (a target id) == the target's top-1
over the FULL vocabulary, what greedy verification checks (a token outside the draft vocabulary is
always a miss).
"""
from __future__ import annotations

import torch

from ..heads.medusa import MedusaConfig, MedusaHeads, save_medusa
from .common import full_precision
from .data import Sequence
from .recipe import Recipe, draft_vocabulary

__all__ = ["MedusaRecipe", "medusa_batch", "medusa_loss"]


def medusa_batch(seqs: list[Sequence], K: int, max_seq_len: int, train_on_prompt: bool) -> dict:
    """Flat indices of a batch (no padding is ever computed on).

    Returns a dict with ``feats (B*T, H)`` float32 features, ``src (N,)`` the counted positions (flat
    indices), ``tgt (M,)`` the positions whose target distribution is needed (flat indices) and
    ``rows (N, K)``: for counted position t and head k (column k - 1), the row of ``tgt`` holding
    position t + k.
    """
    lengths = [min(len(s.input_ids), max_seq_len) for s in seqs]
    T, H = max(lengths), seqs[0].hidden.shape[1]
    feats = torch.zeros(len(seqs), T, H)
    src, tgt = [], []
    for b, (s, n) in enumerate(zip(seqs, lengths)):
        feats[b, :n] = s.hidden[:n].float()
        start = 0 if train_on_prompt else max(s.prompt_len - 1, 0)
        src.append(b * T + torch.arange(start, max(n - K, start)))  # t + K <= n - 1
        tgt.append(b * T + torch.arange(start + 1, n))
    src, tgt = torch.cat(src), torch.cat(tgt)
    row_of = torch.full((len(seqs) * T,), -1, dtype=torch.long)
    row_of[tgt] = torch.arange(len(tgt))
    rows = row_of[src[:, None] + torch.arange(1, K + 1)]  # (N, K)
    assert bool((rows >= 0).all())
    return {"feats": feats.flatten(0, 1), "src": src, "tgt": tgt, "rows": rows}


def medusa_loss(module, lm_w: torch.Tensor, feats: torch.Tensor, src: torch.Tensor, tgt: torch.Tensor,
                rows: torch.Tensor, weights: list[float], shared: bool, full_top: torch.Tensor | None = None,
                draft_vocab: torch.Tensor | None = None):
    """``(summed loss, [summed top-1 hits per head])`` of one batch (see :func:`medusa_batch`).

    ``lm_w (Vd, H)``: the target LM head's draft-vocabulary rows (the labels, and the heads' LM head
    when ``shared``). ``full_top (M,)``: the target's full-vocabulary top-1 at the ``tgt`` positions;
    when given, hits are counted against it (``draft_vocab`` maps draft ids to target ids)."""
    with torch.no_grad(), full_precision(feats.device):  # the target's distribution, exact under autocast
        tgt_logp = torch.log_softmax(feats[tgt] @ lm_w.T, dim=-1)  # (M, Vd)
        tgt_p, tgt_top = tgt_logp.exp(), tgt_logp.argmax(-1)
    logits = module(feats[src], lm_w if shared else None)  # (N, K, Vd)
    total = feats.new_zeros(())
    hits = []
    for j, w in enumerate(weights):
        logq = torch.log_softmax(logits[:, j].float(), dim=-1)  # (N, Vd)
        ce = -(tgt_p[rows[:, j]] * logq).sum(-1)  # (N,)
        total = total + w * ce.sum()
        top = logq.argmax(-1).detach()
        if full_top is None:
            hits.append((top == tgt_top[rows[:, j]]).float().sum())
        else:
            ids = top if draft_vocab is None else draft_vocab[top]
            hits.append((ids == full_top[rows[:, j]]).float().sum())
    return total, hits


class MedusaRecipe(Recipe):
    """K Medusa-1 heads trained on the target's own next-next-... token distributions."""

    load_hidden = True

    def __init__(self, cfg, model, train_set: list[Sequence], device):
        self.cfg, self.device = cfg, device
        vocab = model.get_output_embeddings().weight.shape[0]
        self.draft_vocab = draft_vocabulary(cfg, train_set, vocab)
        torch.manual_seed(cfg.seed)  # one config, one initial head (whatever ran before)
        self.module = MedusaHeads.for_target(model, cfg.medusa_heads, self.draft_vocab, cfg.medusa_lm_head).to(device)
        self.full_w = model.get_output_embeddings().weight.detach().float().to(device)  # (V, H)
        self.lm_w = self.module.lm_weight(model.get_output_embeddings()).detach().float().to(device)  # (Vd, H)
        self.weights = [cfg.medusa_decay ** k for k in range(cfg.medusa_heads)]
        self.dv = None if self.draft_vocab is None else self.draft_vocab.to(device)
        self._full_top: dict[int, torch.Tensor] = {}  # held-out sequences: full-vocabulary top-1 per position

    @torch.no_grad()
    def _target_top(self, seqs: list[Sequence], batch: dict) -> torch.Tensor:
        """The target's full-vocabulary top-1 at the batch's ``tgt`` positions (cached per sequence)."""
        T = len(batch["feats"]) // len(seqs)
        out = torch.empty(len(batch["tgt"]), dtype=torch.long)
        for b, s in enumerate(seqs):
            if id(s) not in self._full_top:
                h = s.hidden.float().to(self.device)
                self._full_top[id(s)] = torch.cat([(h[i: i + 1024] @ self.full_w.T).argmax(-1).cpu()
                                                   for i in range(0, len(h), 1024)])
            sel = (batch["tgt"] >= b * T) & (batch["tgt"] < (b + 1) * T)
            out[sel] = self._full_top[id(s)][batch["tgt"][sel] - b * T]
        return out

    def batch(self, seqs, idx, step, device, train=True):
        b = medusa_batch(seqs, self.cfg.medusa_heads, self.cfg.max_seq_len, self.cfg.train_on_prompt)
        b["full_top"] = None if train else self._target_top(seqs, b).to(device)
        return {k: v if v is None else v.to(device) for k, v in b.items()}

    def loss(self, module, batch):
        total, hits = medusa_loss(module, self.lm_w, batch["feats"], batch["src"], batch["tgt"], batch["rows"],
                                  self.weights, self.cfg.medusa_lm_head == "shared", batch["full_top"], self.dv)
        return total, torch.tensor(float(len(batch["src"])), device=total.device), hits

    def export(self, cfg, model) -> None:
        tcfg = model.config.get_text_config(decoder=True)
        save_medusa(self.module, cfg.export, MedusaConfig(
            target=cfg.target, model_type=tcfg.model_type, hidden_size=tcfg.hidden_size, vocab_size=tcfg.vocab_size,
            num_heads=cfg.medusa_heads, lm_head=cfg.medusa_lm_head,
            draft_vocab=[] if self.draft_vocab is None else self.draft_vocab.tolist()),
            dtype=getattr(torch, cfg.export_dtype))
