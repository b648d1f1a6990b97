"""Running an unmodified transformers causal LM over ``[prefix KV | tree]``.

The tree is injected only through what transformers already accepts as forward arguments:
``position_ids`` (``prefix_len + depth``), a custom 4-D boolean attention mask (every node sees the
whole prefix and its own ancestors), and, on CUDA, an extra ``tree_mask`` keyword that reaches our
registered attention function (the Triton kernel) through transformers' kwargs plumbing. The cache,
mask and positions are arguments of every call, never attributes of the model. The one change a
Target makes to the model it is given: with the Triton kernel it selects that registered attention
implementation (``model.set_attn_implementation``), once, in its constructor. A grouped-query SDPA
model otherwise runs on a parameter-sharing view (eagle/attention.py: no K/V copies for trees),
and a ``runtime.dtype`` other than the model's runs a cast copy; both leave the given model
untouched. How a forward runs fast on this machine is the backend's business (eagle/backends).
"""
from __future__ import annotations

import copy
import functools
import time
import warnings

import torch
from transformers import DynamicCache

from .backends import make_backend
from .backends.tree_kernel import register_tree_attention
from .kv import SlotCache
from .runtime import RuntimeConfig
from .tree import Tree, pack_bits

__all__ = ["Target", "pad_tree", "register_tree_attention"]

ATTENTION_CHOICES = ("auto", "triton", "reference")


def pad_tree(tokens: torch.Tensor, depth: torch.Tensor, ancestors: torch.Tensor, size: int):
    """Pad a tree of T nodes to ``size`` nodes (a bucket): padding nodes carry token 0 at depth 0
    and see only themselves, and no real node sees them, so the real nodes' outputs are those of
    the unpadded tree. Returns ``(tokens (size,), depth (size,), ancestors (size, size))``."""
    T = tokens.shape[0]
    if size == T:
        return tokens, depth, ancestors
    tok = tokens.new_zeros(size)
    tok[:T] = tokens
    dep = depth.new_zeros(size)
    dep[:T] = depth
    anc = torch.eye(size, dtype=torch.bool, device=ancestors.device)  # (size, size)
    anc[:T, :T] = ancestors
    return tok, dep, anc


class TreeOutput:
    """What a target forward gives: ``hidden (T, H)``, the last hidden state after the final norm;
    ``layers (T, k*H)``, the hidden states entering the requested layers (``layers=``),
    concatenated in the order asked (EAGLE-3 reads layers 2, L//2 and L-3), None when none were
    asked for; ``logits (T, V)`` float32 and :meth:`greedy`, the LM head's, computed on first use
    (a greedy step asks only for the argmax, which the target may get without every logit)."""

    def __init__(self, hidden: torch.Tensor, layers: torch.Tensor | None, head, argmax=None,
                 side: "TreeOutput | None" = None):
        self.hidden = hidden
        self.layers = layers
        self.side = side  # the tree's side rows' own output (eagle.tree.SideRows), or None
        self._head = head  # () -> (T, V) logits
        self._argmax = argmax  # () -> (T,) argmax of the logits without them, or None: it does not apply
        self._logits: torch.Tensor | None = None

    @property
    def logits(self) -> torch.Tensor:
        """``(T, V)`` float32 logits (the LM head runs on the first access)."""
        if self._logits is None:
            with torch.no_grad():
                self._logits = self._head()
        return self._logits

    def greedy(self) -> torch.Tensor:
        """``(T,)`` int64: each row's argmax of :attr:`logits` (lowest index on a tie), without
        computing every logit where the target can (``runtime.greedy_head``)."""
        if self._logits is None and self._argmax is not None:
            with torch.no_grad():
                best = self._argmax()
            if best is not None:
                return best
        return self.logits.argmax(dim=-1)

    @property
    def features(self) -> torch.Tensor:
        """What a drafter reads: the requested layers when there are any, else the final feature."""
        return self.hidden if self.layers is None else self.layers


class Target:
    """A thin runner around a Hugging Face causal LM; its weights and modules are never modified (the
    one setting it may change, the attention implementation, is described in the module docstring).

    Args:
        model: an unmodified ``*ForCausalLM`` (Llama, Qwen2/3, Mistral, Gemma-3, ...).
        attention: ``"reference"`` (SDPA with a dense mask, any device), ``"triton"`` (the Triton
            tree kernel; needs CUDA or ``TRITON_INTERPRET=1``), or ``"auto"`` (triton on CUDA).
        runtime: :class:`eagle.runtime.RuntimeConfig`: cache kind (``static`` slot cache with trees
            padded to node-count buckets, or transformers' ``dynamic`` cache), precision (a cast
            copy of the model is used when it differs from the model's), and compilation.
    """

    def __init__(self, model, attention: str = "auto", runtime: RuntimeConfig | None = None, backend=None):
        if attention not in ATTENTION_CHOICES:
            raise ValueError(f"attention must be one of {ATTENTION_CHOICES}, got '{attention}'")
        self.runtime = runtime or RuntimeConfig()
        self.runtime.validate()
        if self.runtime.dtype and getattr(torch, self.runtime.dtype) != model.get_output_embeddings().weight.dtype:
            model = copy.deepcopy(model).to(getattr(torch, self.runtime.dtype))  # the caller's model is untouched
        device = next(model.parameters()).device
        # how forwards run fast on this machine (eagle/backends): runtime.backend, or one given
        self.backend = backend if backend is not None else make_backend(self.runtime.backend, device)
        self.use_kernel = attention == "triton" or (attention == "auto" and self.backend.tree_kernel_default)
        self.model = model = self.backend.prepare(model, self.runtime, self.use_kernel)
        self.config = model.config.get_text_config(decoder=True)
        self.base = model.get_decoder()
        self.lm_head = model.get_output_embeddings()
        self.softcap = getattr(self.config, "final_logit_softcapping", None)
        self.eager = model.config._attn_implementation == "eager"
        self.static = self.runtime.cache == "static"
        # compiled steps read the whole cache buffer (fixed shapes): SDPA with the dense mask, or the
        # tree kernel as the op torch.ops.eagle.tree_attention, given the prefix length as a tensor
        self.compiled = self.runtime.compile
        self._steps: dict = {}  # (bucket, layers) -> compiled step function
        self.compile_s: dict[int, float] = {}  # bucket -> seconds of its first (compiling) call

    # ---- shapes of the model ------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        return self.lm_head.weight.device

    @property
    def max_positions(self) -> int:
        return int(getattr(self.config, "max_position_embeddings", 1 << 30))

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model.get_input_embeddings()(ids)

    def new_cache(self, capacity: int = 256):
        """An empty cache: a :class:`eagle.kv.SlotCache` of ``capacity`` positions (static runtime;
        it grows if a generation needs more, which changes compiled shapes) or a ``DynamicCache``.

        The dynamic cache gets no config: every layer keeps its full K/V, so the tree mask (not the
        cache) enforces sliding windows and compaction is a plain gather on every layer."""
        if not self.static:
            return DynamicCache()
        return SlotCache(self.config.num_hidden_layers, self.cache_capacity(capacity))

    def cache_capacity(self, positions: int) -> int:
        """The slots :meth:`new_cache` allocates for ``positions``: rounded up to a multiple of 256,
        so that generations of similar length share compiled shapes (a compiled step attends over
        the whole buffer: another capacity is another graph)."""
        return -(-positions // 256) * 256

    # ---- forwards -----------------------------------------------------------------------------
    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Target LM head (with Gemma-style final soft-capping when configured), float32."""
        logits = self.backend.project(hidden, self.lm_head.weight)  # (T, V)
        if getattr(self.lm_head, "bias", None) is not None:
            logits = logits + self.lm_head.bias
        logits = logits.float()
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits

    def _greedy_argmax(self, hidden: torch.Tensor) -> torch.Tensor | None:
        """``(T,)`` int64, the argmax of ``self.logits(hidden)`` per row without computing them, or
        ``None`` where this does not apply: ``runtime.greedy_head: screened``, a head without bias
        or soft-capping, and a backend with such a way (the CPU backend's bfloat16 screen gives
        the exact argmax)."""
        if self.runtime.greedy_head != "screened" or self.softcap or getattr(self.lm_head, "bias", None) is not None:
            return None
        return self.backend.greedy_argmax(hidden, self.lm_head.weight)

    def _output(self, hidden: torch.Tensor, fused: torch.Tensor | None, head_in: torch.Tensor,
                keep: int | None = None, side: TreeOutput | None = None) -> TreeOutput:
        """The :class:`TreeOutput` of features ``hidden`` and ``fused``, whose LM head runs over the
        rows ``head_in`` and keeps the first ``keep`` (default: all) of their logits: a prefill's last
        position, or a padded bucket of which the tree's T rows are kept (MKL packs for the bucket)."""
        keep = head_in.shape[0] if keep is None else keep
        return TreeOutput(hidden, fused, lambda: self.logits(head_in)[:keep],
                          lambda: self._greedy_argmax(head_in[:keep]), side)

    def _side_output(self, hidden: torch.Tensor, T: int, N: int) -> TreeOutput | None:
        """The output of rows ``T..N`` of a forward's ``hidden``: a tree's side rows (None if none)."""
        return None if N == T else self._output(hidden[T:N], None, hidden[T:N])

    def _run(self, ids: torch.Tensor, positions: torch.Tensor, cache, mask, layers: tuple[int, ...] | None = None,
             base=None, **kwargs) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(hidden (T, H), fused (T, k*H) or None)``: the final feature and, when ``layers`` are
        given, the hidden states entering those layers (transformers' ``hidden_states[i]``: the
        model records them in the same forward; we only concatenate the ones asked for). ``base``:
        the decoder to run (default: the model's own; the backend's for some buckets)."""
        out = (self.base if base is None else base)(input_ids=ids[None], position_ids=positions[None], attention_mask=mask,
                        cache=cache, use_cache=True, output_hidden_states=bool(layers), **kwargs)
        fused = torch.cat([out.hidden_states[i][0] for i in layers], dim=-1) if layers else None
        return out.last_hidden_state[0], fused  # (T, H), (T, k*H)

    def check_layers(self, layers) -> tuple[int, ...] | None:
        """``layers`` as a tuple of valid ``hidden_states`` indices (0 = embeddings ... L = final)."""
        if not layers:
            return None
        L = self.config.num_hidden_layers
        bad = [i for i in layers if not 0 <= int(i) <= L]
        if bad:
            raise ValueError(f"feature layers {bad} out of range: this target has {L} layers (indices 0..{L})")
        return tuple(int(i) for i in layers)

    def _masks(self, allowed: torch.Tensor, q_pos: torch.Tensor, key_pos: torch.Tensor):
        """The 4-D mask(s) of a forward: ``allowed (T, K)`` bool (True = attend) restricted to each
        layer's sliding window by positions (``q_pos (T,)``, ``key_pos (K,)``); one mask, or one per
        layer type for models that mix full and sliding layers (Gemma-3)."""
        layer_types = getattr(self.config, "layer_types", None)
        window = getattr(self.config, "sliding_window", None)
        dtype = self.lm_head.weight.dtype

        def build(w):
            m = allowed if w is None else allowed & ((q_pos[:, None] - key_pos[None, :]) < w)
            m = m[None, None]  # (1, 1, T, K)
            if self.eager:  # eager attention adds the mask to the scores
                m = torch.zeros(m.shape, dtype=dtype, device=m.device).masked_fill(~m, torch.finfo(dtype).min)
            return m

        if layer_types and "sliding_attention" in layer_types:
            return {t: build(window if t == "sliding_attention" else None) for t in set(layer_types)}
        if not layer_types and window is not None and getattr(self.config, "use_sliding_window", True):
            return build(window)  # e.g. Mistral: every layer slides
        return build(None)

    def _tree_masks(self, anc: torch.Tensor, prefix_len: int, positions: torch.Tensor):
        """The mask(s) of a tree after ``prefix_len`` cached tokens: node i (``anc (T, T)``,
        ``positions (T,)``) sees the whole prefix and its own ancestors; keys are ``[prefix | tree]``."""
        dev = anc.device
        allowed = torch.cat([torch.ones(anc.shape[0], prefix_len, dtype=torch.bool, device=dev), anc], dim=1)  # (T, P+T)
        key_pos = torch.cat([torch.arange(prefix_len, device=dev), positions])  # (P+T,)
        return self._masks(allowed, positions, key_pos)

    @torch.no_grad()
    def prefill(self, ids: torch.Tensor, cache, layers: tuple[int, ...] | None = None) -> TreeOutput:
        """Causal forward over ``ids (N,)`` appended to ``cache``; logits of the last position only;
        ``layers``: also return the hidden states entering these layers (see :class:`TreeOutput`)."""
        layers = self.check_layers(layers)
        if not isinstance(cache, SlotCache):
            start = cache.get_seq_length()
            pos = torch.arange(start, start + len(ids), device=ids.device)
            hidden, fused = self._run(ids, pos, cache, None, layers)  # (N, H), (N, k*H)
            return self._output(hidden, fused, hidden[-1:])  # the LM head of the last position only
        start, N = cache.length, len(ids)
        cache.reserve(start + N)
        pos = torch.arange(start, start + N, device=ids.device)  # (N,)
        key_pos = torch.arange(start + N, device=ids.device)  # (P + N,)
        allowed = key_pos[None, :] <= pos[:, None]  # (N, P + N) causal
        hidden, fused = self._run(ids, pos, cache, self._masks(allowed, pos, key_pos), layers, cache_slots=pos,
                                  cache_kv_len=start + N)
        cache.advance(N)
        return self._output(hidden, fused, hidden[-1:])

    @torch.no_grad()
    def tree_forward(self, tree: Tree, cache, layers: tuple[int, ...] | None = None) -> TreeOutput:
        """ONE forward over all T tree nodes after the cached prefix.

        Node i is placed at position ``prefix_len + depth[i]`` and attends to the whole prefix plus
        its own ancestors (and itself), which makes its output identical to a plain causal forward
        over ``prefix + path_to(i)``. A ``DynamicCache`` gets T entries appended; a
        :class:`~eagle.kv.SlotCache` gets them written at slots ``prefix_len + i`` (its committed
        length does not move until :meth:`commit`), with the tree padded to its bucket. ``layers``:
        also return the hidden states entering these layers, from the same forward.

        A tree with side rows (:class:`eagle.tree.SideRows`) runs them in the same forward after
        its nodes, at their own positions under their own mask (they see the prefix and the side
        rows they are given, the nodes never see them); their output is ``TreeOutput.side``, and
        :meth:`commit` drops their cache entries with every node off the accepted path.
        """
        layers = self.check_layers(layers)
        if isinstance(cache, SlotCache):
            return self._tree_forward_static(tree, cache, layers)
        prefix_len, T = cache.get_seq_length(), len(tree)
        tokens, offsets, sees = (t.to(self.device) for t in tree.forward_rows())  # (N,), (N,), (N, N)
        positions = prefix_len + offsets  # (N,)
        extra = {"tree_mask": pack_bits(sees)} if self.use_kernel else {}
        mask = self._tree_masks(sees, prefix_len, positions)
        hidden, fused = self._run(tokens, positions, cache, mask, layers, **extra)
        N = len(tokens)
        return self._output(hidden[:T], None if fused is None else fused[:T], hidden[:T],
                            side=self._side_output(hidden, T, N))

    def _tree_forward_static(self, tree: Tree, cache: SlotCache, layers: tuple[int, ...] | None) -> TreeOutput:
        P, T, dev = cache.length, len(tree), self.device
        tokens, offsets, sees = tree.forward_rows()  # (N,) nodes then side rows
        N = len(tokens)
        size = self.runtime.bucket(N)
        tokens, depth, anc = pad_tree(tokens.to(dev), offsets.to(dev), sees.to(dev), size)
        positions = P + depth  # (Tb,)
        slots = torch.arange(P, P + size, device=dev)  # (Tb,) node i -> slot P + i
        cache.reserve(P + size)
        if self.compiled:  # fixed shapes: attend over the whole buffer, the mask hides empty slots
            C = cache.capacity
            col = torch.arange(C, device=dev)  # (C,)
            rel = (col - P).clamp(0, size - 1)
            in_tree = (col >= P) & (col < P + size)
            allowed = (col < P)[None, :] | (in_tree[None, :] & anc[:, rel])  # (Tb, C)
            key_pos = torch.where(col < P, col, P + depth[rel])  # (C,)
            extra = {"tree_mask": pack_bits(anc), "tree_prefix": torch.tensor([P], dtype=torch.int32, device=dev)} \
                if self.use_kernel else {}
            hidden, fused = self._compiled_step(size, layers)(tokens, positions, self._masks(allowed, positions, key_pos),
                                                              slots, cache, **extra)
        else:
            extra = {"tree_mask": pack_bits(anc)} if self.use_kernel else {}
            base = self.backend.decoder(size)  # same results, maybe a faster GEMM
            hidden, fused = self._run(tokens, positions, cache, self._tree_masks(anc, P, positions), layers,
                                      base=base, cache_slots=slots, cache_kv_len=P + size, **extra)
        cache.length = P + T  # as a DynamicCache would have it: the nodes are in, until commit/crop
        # the backend may run the LM head over the whole bucket (a fixed row count it is fast for);
        # the padding rows are dropped after
        return self._output(hidden[:T], None if fused is None else fused[:T],  # padding rows dropped
                            hidden[:T] if N > T else hidden[:self.backend.head_rows(size, T)], T,
                            side=self._side_output(hidden, T, N))

    def _compiled_step(self, size: int, layers: tuple[int, ...] | None = None):
        """The compiled forward of a ``size``-node step (compiled by the backend on its first call,
        then reused; the first call's time is recorded in ``compile_s``)."""
        if (size, layers) in self._steps:
            return self._steps[(size, layers)]

        def step(tokens, positions, masks, slots, cache, decoder=None, **kernel):  # kernel: tree_mask, tree_prefix
            return self._run(tokens, positions, cache, masks, layers, base=decoder, cache_slots=slots, **kernel)

        decoder = self.backend.decoder(size) or self.base
        compiled = self.backend.compile_step(step, size, decoder)

        def first_call(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                out = compiled(*args, **kwargs)
            except Exception as e:  # e.g. no C++ compiler for inductor: the same step, eagerly
                if not self.backend.compile_fallback:
                    raise
                warnings.warn(f"eagle: compiling the {size}-node step failed ({type(e).__name__}: "
                              f"{str(e).strip().splitlines()[0][:200] if str(e).strip() else ''}); it runs eagerly",
                              RuntimeWarning, stacklevel=2)
                eager = functools.partial(step, decoder=decoder)  # slots are explicit: a rerun rewrites them
                self._steps[(size, layers)] = eager
                return eager(*args, **kwargs)
            self.compile_s[size] = time.perf_counter() - t0
            self._steps[(size, layers)] = compiled
            return out

        return first_call

    @staticmethod
    def commit(cache, prefix_len: int, keep: list[int]) -> None:
        """Keep the prefix plus tree nodes ``keep`` (in order) in every layer; drop other nodes."""
        if isinstance(cache, SlotCache):
            cache.commit(prefix_len, keep)
            return
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
    def crop(cache, length: int) -> None:
        """Drop every cache entry at or after ``length``."""
        if isinstance(cache, SlotCache):
            cache.crop(length)
            return
        Target.commit(cache, length, [])
