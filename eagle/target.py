"""Running an unmodified transformers causal LM over ``[prefix KV | tree]``.

The tree is injected only through what transformers already accepts as forward arguments:
``position_ids`` (``prefix_len + depth``), a custom 4-D boolean attention mask (every node sees the
whole prefix and its own ancestors), and, on CUDA, an extra ``tree_mask`` keyword that reaches our
registered attention function (the Triton kernel) through transformers' kwargs plumbing. Nothing is
stored on the model: the cache, mask and positions are arguments of every call.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import DynamicCache

from .tree import Tree

__all__ = ["Target", "tree_attention_mask", "project"]

ATTENTION_CHOICES = ("auto", "triton", "reference")
_TREE_IMPL = "eagle_tree"


def project(hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``hidden (T, H) @ weight (V, H).T -> (T, V)``; for float32 on the CPU computed as
    ``(weight @ hidden.T).T``.

    Same product; but CPU BLAS (MKL here) runs the few-rows case 2-5x faster in this orientation
    (measured: T = 2..16 rows against a 49152 x 576 LM head, 17-25 ms -> 4-16 ms). The result is
    made row-major again: reductions along V (argmax, softmax) over a column-major (61, 49152)
    view took 12 ms against 3.6 ms for the copy plus 2.5 ms for the argmax. Other dtypes (bf16 /
    fp16 go through oneDNN, not MKL) take the plain orientation: 10 x 8192 rows in bf16, 0.57 ms
    transposed against 0.42 ms plain.
    """
    if weight.dtype != torch.float32 or weight.device.type != "cpu":
        return torch.nn.functional.linear(hidden, weight)  # (T, V)
    out = (weight @ hidden.T).T  # (T, V), a column-major view
    return out.contiguous() if out.shape[0] > 1 else out


def tree_attention_mask(ancestors: torch.Tensor, prefix_len: int, positions: torch.Tensor,
                        window: int | None = None) -> torch.Tensor:
    """Dense ``(1, 1, T, P + T)`` bool mask (True = attend) for a tree after a prefix.

    Args:
        ancestors: ``(T, T)`` bool ancestor mask (self included).
        prefix_len: ``P``, the number of committed tokens in the KV cache.
        positions: ``(T,)`` absolute positions of the tree nodes.
        window: sliding-window size of the layer, if any: a query at position i sees keys at
            positions in ``(i - window, i]`` only.
    """
    T = ancestors.shape[0]
    dev = ancestors.device
    mask = torch.cat([torch.ones(T, prefix_len, dtype=torch.bool, device=dev), ancestors], dim=1)  # (T, P+T)
    if window is not None:
        key_pos = torch.cat([torch.arange(prefix_len, device=dev), positions])  # (P+T,)
        mask &= (positions[:, None] - key_pos[None, :]) < window
    return mask[None, None]


def register_tree_attention() -> str:
    """Register (once) and return the ``eagle_tree`` attention backend: the tree-attention kernel
    for calls that carry a ``tree_mask`` (Triton on CUDA or under ``TRITON_INTERPRET=1``, its torch
    reference elsewhere), transformers' SDPA with its ordinary masks for everything else."""
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import sdpa_mask

    if _TREE_IMPL in AttentionInterface._global_mapping:
        return _TREE_IMPL

    def eagle_tree_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                             tree_mask=None, **kwargs):
        # query (B, Hq, T, D); key/value (B, Hkv, P+T, D)
        # tree_mask: (T, W) int32 bit-packed ancestors (target verify), or (n, S+n) bool for a draft
        # head level whose n new queries follow S earlier tree entries
        if tree_mask is None or getattr(module, "sliding_window", None) is not None:
            return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling,
                                          dropout=dropout, **kwargs)
        from kernels.tree_attention import tree_attention

        n, m = tree_mask.shape[-2], tree_mask.shape[-1]
        if tree_mask.dtype == torch.bool and m > n:
            # pad the queries with the S earlier tree entries (outputs discarded) so the mask is the
            # square ancestor table the kernel takes
            B, H, _, D = query.shape
            q_full = torch.cat([query.new_zeros(B, H, m - n, D), query], dim=2)  # (B, H, S+n, D)
            anc = torch.eye(m, dtype=torch.bool, device=query.device)
            anc[m - n:] = tree_mask
            out = tree_attention(q_full, key, value, anc, scale=scaling)[:, :, m - n:]
        else:
            out = tree_attention(query, key, value, tree_mask, scale=scaling)  # (B, Hq, T, D)
        return out.transpose(1, 2).contiguous(), None

    AttentionInterface.register(_TREE_IMPL, eagle_tree_attention)
    AttentionMaskInterface.register(_TREE_IMPL, sdpa_mask)
    return _TREE_IMPL


@dataclass
class TreeOutput:
    logits: torch.Tensor  # (T, V) float32
    hidden: torch.Tensor  # (T, H) last hidden state after the final norm


class Target:
    """A thin, stateless runner around a Hugging Face causal LM.

    Args:
        model: an unmodified ``*ForCausalLM`` (Llama, Qwen2/3, Mistral, Gemma-3, ...).
        attention: ``"reference"`` (SDPA with a dense mask, any device), ``"triton"`` (the Triton
            tree kernel; needs CUDA or ``TRITON_INTERPRET=1``), or ``"auto"`` (triton on CUDA).
    """

    def __init__(self, model, attention: str = "auto"):
        if attention not in ATTENTION_CHOICES:
            raise ValueError(f"attention must be one of {ATTENTION_CHOICES}, got '{attention}'")
        self.model = model
        self.config = model.config.get_text_config(decoder=True)
        self.base = model.get_decoder()
        self.lm_head = model.get_output_embeddings()
        self.softcap = getattr(self.config, "final_logit_softcapping", None)
        device = next(model.parameters()).device
        self.use_kernel = attention == "triton" or (attention == "auto" and device.type == "cuda")
        if self.use_kernel:
            model.set_attn_implementation(register_tree_attention())
        self.eager = model.config._attn_implementation == "eager"

    # ---- shapes of the model ------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        return self.lm_head.weight.device

    @property
    def max_positions(self) -> int:
        return int(getattr(self.config, "max_position_embeddings", 1 << 30))

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model.get_input_embeddings()(ids)

    def new_cache(self) -> DynamicCache:
        # No config: every layer keeps its full K/V, so the tree mask (not the cache) enforces
        # sliding windows and compaction is a plain gather on every layer.
        return DynamicCache()

    # ---- forwards -----------------------------------------------------------------------------
    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Target LM head (with Gemma-style final soft-capping when configured), float32."""
        logits = project(hidden, self.lm_head.weight)
        if getattr(self.lm_head, "bias", None) is not None:
            logits = logits + self.lm_head.bias
        logits = logits.float()
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits

    def _run(self, ids: torch.Tensor, positions: torch.Tensor, cache: DynamicCache, mask, **kwargs) -> torch.Tensor:
        out = self.base(input_ids=ids[None], position_ids=positions[None], attention_mask=mask,
                        cache=cache, use_cache=True, **kwargs)
        return out.last_hidden_state[0]  # (T, H)

    @torch.no_grad()
    def prefill(self, ids: torch.Tensor, cache: DynamicCache) -> TreeOutput:
        """Causal forward over ``ids (N,)`` appended to ``cache``; logits of the last position only."""
        start = cache.get_seq_length()
        pos = torch.arange(start, start + len(ids), device=ids.device)
        hidden = self._run(ids, pos, cache, None)  # (N, H)
        return TreeOutput(self.logits(hidden[-1:]), hidden)

    def _mask(self, tree: Tree, prefix_len: int, positions: torch.Tensor):
        anc = tree.ancestor_mask()  # (T, T)
        layer_types = getattr(self.config, "layer_types", None)
        window = getattr(self.config, "sliding_window", None)

        def build(w):
            m = tree_attention_mask(anc, prefix_len, positions, w)
            if self.eager:  # eager attention adds the mask to the scores
                m = torch.zeros(m.shape, dtype=self.lm_head.weight.dtype, device=m.device).masked_fill(
                    ~m, torch.finfo(self.lm_head.weight.dtype).min)
            return m

        if layer_types and "sliding_attention" in layer_types:
            return {t: build(window if t == "sliding_attention" else None) for t in set(layer_types)}
        if not layer_types and window is not None and getattr(self.config, "use_sliding_window", True):
            return build(window)  # e.g. Mistral: every layer slides
        return build(None)

    @torch.no_grad()
    def tree_forward(self, tree: Tree, cache: DynamicCache) -> TreeOutput:
        """ONE forward over all T tree nodes after the cached prefix; appends T entries to the cache.

        Node i is placed at position ``prefix_len + depth[i]`` and attends to the whole prefix plus
        its own ancestors (and itself), which makes its output identical to a plain causal forward
        over ``prefix + path_to(i)``.
        """
        prefix_len = cache.get_seq_length()
        tokens = tree.tokens.to(self.device)
        positions = tree.positions(prefix_len).to(self.device)  # (T,)
        extra = {"tree_mask": tree.packed_mask().to(self.device)} if self.use_kernel else {}
        hidden = self._run(tokens, positions, cache, self._mask(tree, prefix_len, positions), **extra)
        return TreeOutput(self.logits(hidden), hidden)

    @staticmethod
    def commit(cache: DynamicCache, prefix_len: int, keep: list[int]) -> None:
        """Keep the prefix plus tree nodes ``keep`` (in order) in every layer; drop other nodes."""
        n = prefix_len + len(keep)
        contiguous = keep == list(range(len(keep)))
        idx = None
        for layer in cache.layers:
            if not getattr(layer, "is_initialized", False):
                continue
            if contiguous:  # a chain prefix: a slice, no copy
                layer.keys, layer.values = layer.keys[..., :n, :], layer.values[..., :n, :]
            else:
                if idx is None:
                    tail = prefix_len + torch.tensor(keep, device=layer.keys.device)
                    idx = torch.cat([torch.arange(prefix_len, device=layer.keys.device), tail])
                layer.keys = layer.keys.index_select(-2, idx)
                layer.values = layer.values.index_select(-2, idx)

    @staticmethod
    def crop(cache: DynamicCache, length: int) -> None:
        """Drop every cache entry at or after ``length``."""
        Target.commit(cache, length, [])
