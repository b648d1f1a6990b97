"""Training the EAGLE-3 head with the training-time test (``eagle train`` with ``head: eagle3``).

Per training position i the head drafts ``ttt_steps`` tokens ahead, as it will at decoding time:
step 0 reads the fused target layers of the true prefix (``fc``), step j > 0 reads the head's own
output of step j-1 at the same position. Step j at position i takes the token x_{i+1+j} and is
trained towards the target's distribution of the token after it (``p_{i+1+j}``, the target LM head
over the draft vocabulary applied to the stored final feature), weighted ``ttt_decay ** j``; there
is no feature regression.

One batched computation per step: the queries of step j (all positions at once, RoPE position
i + j) attend to the step-0 keys of positions <= i (the true prefix) and to the keys of steps
1..j at position i only (their own earlier drafts): keys ``[step 0 | step 1 | ... | step j]``,
mask ``[causal | diagonal | ... | diagonal]``. :func:`ttt_mask` builds it; a test checks the whole
against a step-by-step loop that feeds the head its own outputs. :func:`ttt_attention` computes
the same attention from that structure instead of a mask: the causal scores against step 0's
keys plus one dot product per later step (``T + j`` scores per query instead of ``(j + 1) T``).
"""
from __future__ import annotations

import torch
from torch import nn
from transformers import DynamicCache

from ..config import ConfigError
from ..heads import HeadConfig, save_head
from ..heads.eagle3 import Eagle3Head, default_feature_layers
from ..attention import register_attention
from .data import Sequence
from .recipe import Recipe, TrainConfig, draft_vocabulary

__all__ = ["Eagle3Recipe", "Eagle3TTT", "ttt_mask", "ttt_attention", "TTT_ATTENTION"]

TTT_ATTENTION = "eagle_ttt"  # the attention backend name the training module's head runs with


def ttt_mask(T: int, step: int, device=None) -> torch.Tensor:
    """``(T, (step + 1) * T)`` bool: row i (a query of step ``step`` at position i) sees step 0's
    positions <= i and, of every later step up to ``step``, position i alone."""
    causal = torch.ones(T, T, dtype=torch.bool, device=device).tril()
    eye = torch.eye(T, dtype=torch.bool, device=device)
    return torch.cat([causal] + [eye] * step, dim=1)


def ttt_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, ttt_blocks=None,
                  **kwargs):
    """The training-time test's attention without its mask (an attention backend for transformers'
    ``AttentionInterface``): ``query (B, Hq, T, D)`` of step ``j = ttt_blocks - 1``, ``key/value
    (B, Hkv, (j+1) T, D)`` = ``[step 0 | ... | step j]``. Query i sees step 0's keys 0..i and key
    i of every later step, exactly what :func:`ttt_mask` allows. Without ``ttt_blocks`` (any other
    call of the head) it is transformers' SDPA with the mask given. Returns ``(B, T, Hq, D)``."""
    if ttt_blocks is None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout,
                                      **kwargs)
    B, Hq, T, D = query.shape
    Hkv, j = key.shape[1], ttt_blocks - 1
    scale = scaling if scaling is not None else D ** -0.5
    q = query.reshape(B, Hkv, Hq // Hkv, T, D)  # (B, Hkv, G, T, D): grouped-query heads share a key head
    k0, v0 = key[:, :, :T], value[:, :, :T]  # (B, Hkv, T, D) step 0: the true prefix
    causal = torch.einsum("bhgtd,bhsd->bhgts", q, k0).float() * scale  # (B, Hkv, G, T, T)
    causal = causal.masked_fill(~torch.ones(T, T, dtype=torch.bool, device=q.device).tril(), float("-inf"))
    scores = [causal]
    if j:
        kd = key[:, :, T:].reshape(B, Hkv, j, T, D)  # (B, Hkv, j, T, D) steps 1..j, position by position
        vd = value[:, :, T:].reshape(B, Hkv, j, T, D)
        scores.append(torch.einsum("bhgtd,bhjtd->bhgtj", q, kd).float() * scale)  # (B, Hkv, G, T, j)
    p = torch.softmax(torch.cat(scores, dim=-1), dim=-1).to(value.dtype)  # (B, Hkv, G, T, T + j)
    out = torch.einsum("bhgts,bhsd->bhgtd", p[..., :T], v0)  # (B, Hkv, G, T, D)
    if j:
        out = out + torch.einsum("bhgtj,bhjtd->bhgtd", p[..., T:], vd)
    return out.reshape(B, Hq, T, D).transpose(1, 2).contiguous(), None


class Eagle3TTT(nn.Module):
    """The head plus its training-time-test loss, as one module (so that DDP sees one forward).

    ``structured``: the head's attention runs as :func:`ttt_attention` (from the TTT structure);
    False: SDPA under the explicit :func:`ttt_mask` (the reference; same results)."""

    def __init__(self, head: Eagle3Head, steps: int, decay: float, structured: bool = True):
        super().__init__()
        self.head, self.steps, self.decay, self.structured = head, steps, decay, structured
        if structured:  # falls back to SDPA for every call without ttt_blocks (drafting, evaluation loops)
            head.layer_config._attn_implementation = register_attention(TTT_ATTENTION, ttt_attention)

    def forward(self, fused: torch.Tensor, tok_emb: torch.Tensor, target_p: torch.Tensor, weight: torch.Tensor):
        """Summed loss and per-step top-1 hits of a padded batch.

        Args:
            fused: ``(B, T, k*H)`` target layers at positions 0..T-1 (the pairs' features).
            tok_emb: ``(B, T + steps, H)`` embeddings of x_1 .. x_{T+steps} (zeros past the end).
            target_p: ``(B, T + steps, Vd)`` p_{i+1} for i = 0.. (the target's draft-vocabulary
                distribution of the token after x_{i+1}); only rows with weight are ever read.
            weight: ``(B, T + steps)`` 1 where the target of that row counts, else 0.
        """
        B, T, _ = fused.shape
        dev = fused.device
        h = self.head.enter(fused)  # (B, T, H)
        cache = DynamicCache()
        total = h.new_zeros(())
        hits = []
        for j in range(self.steps):
            pos = (torch.arange(T, device=dev) + j)[None].expand(B, -1)  # (B, T) RoPE position i + j
            if self.structured:
                mask, extra = None, {"ttt_blocks": j + 1}
            else:
                mask, extra = ttt_mask(T, j, dev)[None, None].expand(B, 1, T, (j + 1) * T), {}
            out = self.head(h, tok_emb[:, j: j + T], pos, mask, cache=cache, **extra)  # (B, T, H)
            w = weight[:, j: j + T]  # (B, T)
            sel = w > 0
            logq = torch.log_softmax(self.head.lm_head(self.head.norm(out[sel])).float(), dim=-1)  # (N, Vd)
            tgt = target_p[:, j: j + T][sel]  # (N, Vd)
            ce = -(tgt * logq).sum(-1)  # (N,)
            total = total + (self.decay ** j) * (ce * w[sel]).sum()
            hits.append(((logq.argmax(-1) == tgt.argmax(-1)).float() * w[sel]).sum().detach())
            h = out  # the next step reads the head's own outputs
        return total, hits


class Eagle3Recipe(Recipe):
    """``eagle train`` with ``head: eagle3``: reads the fused layers and the final feature of the shards."""

    load_hidden = True
    load_layers = True

    def __init__(self, cfg: TrainConfig, model, train_set: list[Sequence], device):
        tcfg = model.config.get_text_config(decoder=True)
        self.cfg = cfg
        layers = tuple(cfg.feature_layers) or default_feature_layers(tcfg.num_hidden_layers)
        width = train_set[0].layers.shape[-1] if train_set and train_set[0].layers is not None else 0
        if width != len(layers) * tcfg.hidden_size:
            raise ConfigError(f"the data in {cfg.data_dir} holds {width // tcfg.hidden_size} fused layers per "
                              f"token, the head fuses {len(layers)} ({list(layers)}): make the data with these "
                              "feature_layers")
        vocab = model.get_output_embeddings().weight.shape[0]
        self.draft_ids = draft_vocabulary(cfg, train_set, vocab)
        if self.draft_ids is None:
            self.draft_ids = torch.arange(vocab)
        torch.manual_seed(cfg.seed)  # one config, one head (whatever ran before)
        head = Eagle3Head.for_target(model, self.draft_ids, layers).to(device).float()
        self.module = Eagle3TTT(head, cfg.ttt_steps, cfg.ttt_decay)
        self.embed = model.get_input_embeddings()
        self.target_w = model.get_output_embeddings().weight[self.draft_ids].detach().float().to(device)  # (Vd, H)
        self.in_draft = torch.zeros(vocab, dtype=torch.bool)
        self.in_draft[self.draft_ids] = True

    def batch(self, seqs, idx, step, device, train=True):
        """``(fused (B, T, k*H), tok_emb (B, T+s, H), target_p (B, T+s, Vd), weight (B, T+s))``:
        pair i = (layers at position i, token x_{i+1}) for i < n - 1 (n = sequence length, at most
        ``max_seq_len``); its step-0 target is p_{i+1}. A row counts when it predicts an answer token
        (or any token with ``train_on_prompt``) that is in the draft vocabulary."""
        cfg, s = self.cfg, self.cfg.ttt_steps
        lengths = [min(len(q.input_ids), cfg.max_seq_len) for q in seqs]
        T = max(lengths) - 1
        B, K = len(seqs), seqs[0].layers.shape[-1]
        fused = torch.zeros(B, T, K)
        ids = torch.zeros(B, T + s + 1, dtype=torch.long)  # x_0 .. x_{T+s}
        final = torch.zeros(B, T + s + 1, self.target_w.shape[1])  # f_0 .. f_{T+s}
        weight = torch.zeros(B, T + s)
        for b, (q, n) in enumerate(zip(seqs, lengths)):
            fused[b, : n - 1] = q.layers[: n - 1].float()
            ids[b, :n] = q.input_ids[:n]
            final[b, :n] = q.hidden[:n].float()
            # row i predicts x_{i+2} (from p_{i+1}): from the second answer token on, as when drafting
            # after the target's own first token; rows need x_{i+2} stored, i.e. i <= n - 3
            start = 0 if cfg.train_on_prompt else max(q.prompt_len - 1, 0)
            weight[b, start: n - 2] = 1.0
            # ... and a next token the draft vocabulary holds (the head cannot propose any other)
            weight[b, : n - 2] *= self.in_draft[ids[b, 2:n]].float()
        with torch.no_grad():
            tok_emb = self.embed(ids[:, 1:].to(self.embed.weight.device)).float()  # (B, T+s, H): x_1 ..
            target_p = torch.softmax(final[:, 1:] @ self.target_w.cpu().T, dim=-1)  # (B, T+s, Vd): p_1 ..
        return fused.to(device), tok_emb.to(device), target_p.to(device), weight.to(device)

    def loss(self, module, batch):
        total, hits = module(*batch)
        return total, batch[3][:, : batch[0].shape[1]].sum().detach(), hits

    def export(self, cfg, model) -> None:
        tcfg = model.config.get_text_config(decoder=True)
        head = self.module.head
        save_head(head, cfg.export, HeadConfig(
            target=cfg.target, model_type=tcfg.model_type, hidden_size=tcfg.hidden_size, vocab_size=tcfg.vocab_size,
            type="eagle3", feature_layers=list(head.feature_layers)), dtype=getattr(torch, cfg.export_dtype))
