"""Running an unmodified transformers causal LM over ``[prefix KV | tree]``.

The tree is injected only through what transformers already accepts as forward arguments:
``position_ids`` (``prefix_len + depth``), a custom 4-D boolean attention mask (every node sees the
whole prefix and its own ancestors), and, on CUDA, an extra ``tree_mask`` keyword that reaches our
registered attention function (the Triton kernel) through transformers' kwargs plumbing. The cache,
mask and positions are arguments of every call, never attributes of the model. The one change a
Target makes to the model it is given: with the Triton kernel it selects that registered attention
implementation (``model.set_attn_implementation``), once, in its constructor. A grouped-query SDPA
model otherwise runs on a parameter-sharing view with the ``eagle_gqa_sdpa`` backend
(eagle/attention.py: no K/V copies for trees), and a ``runtime.dtype`` other than the model's runs
a cast copy; both leave the given model untouched.
"""
from __future__ import annotations

import contextlib
import copy
import os
import time
import warnings

import torch
from transformers import DynamicCache

from eagle_kernels import cpu_argmax, cpu_gemm

from .attention import attention_view, folds_gqa, register_attention, register_gqa_sdpa, sharing_copy
from .kv import SlotCache
from .lmhead import project
from .packed import PackedLinear, linear_ways, onednn_row_counts, packed_row_counts, packed_twin, stream_row_counts
from .regions import regional_copy
from .runtime import RuntimeConfig
from .tree import Tree, pack_bits

__all__ = ["Target", "pad_tree"]

ATTENTION_CHOICES = ("auto", "triton", "reference")
_TREE_IMPL = "eagle_tree"
_RECOMPILE_LIMIT = 256  # graphs of the compiled step's code (one per bucket, layer set and cache capacity)
_STEP_BACKEND = "inductor"  # torch.compile backend of CPU compiled steps (tests of dynamo's side: "eager")
# inductor's options for them: no size, alignment or scalar checks in the graph's Python wrapper
# (~10 calls per layer region, 30 regions a step; the extension's ops return what their
# registered shapes say, which the tests compare with eager steps); ~0.97x a step on the Intel
# Xeon with AMX (docs/results.md, "One graph per step")
_STEP_OPTIONS = {"size_asserts": False, "alignment_asserts": False, "scalar_asserts": False}
# the decoder layers' index attribute, traced as a symbolic integer (a graph input) rather than a
# constant, so that every layer of a compiled step runs one traced and compiled region (_regions)
_LAYER_INDEX_SOURCES = r".*\.layer_idx$"


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


def register_tree_attention() -> str:
    """Register (once) and return the ``eagle_tree`` attention backend: the tree-attention kernel
    for calls that carry a ``tree_mask`` (Triton on CUDA or under ``TRITON_INTERPRET=1``, its torch
    reference elsewhere), transformers' SDPA with its ordinary masks for everything else."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if _TREE_IMPL in AttentionInterface._global_mapping:
        return _TREE_IMPL

    from eagle_kernels.tree_attention import tree_attention  # also registers torch.ops.eagle.tree_attention

    def eagle_tree_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                             tree_mask=None, tree_prefix=None, **kwargs):
        # query (B, Hq, T, D); key/value (B, Hkv, P+T, D), or the whole slot buffer (B, Hkv, C, D)
        # of a compiled step, whose prefix length is then tree_prefix (1,) int32 on the device
        # tree_mask: (T, W) int32 bit-packed ancestors (target verify), or (n, S+n) bool for a draft
        # head level whose n new queries follow S earlier tree entries
        if tree_mask is None or getattr(module, "sliding_window", None) is not None:
            return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling,
                                          dropout=dropout, **kwargs)
        if tree_prefix is not None:  # one opaque op in the compiled graph (no host sync, fixed shapes)
            scale = float(scaling) if scaling is not None else query.shape[-1] ** -0.5
            out = torch.ops.eagle.tree_attention(query, key, value, tree_mask, tree_prefix, scale)
            return out.transpose(1, 2).contiguous(), None

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

    return register_attention(_TREE_IMPL, eagle_tree_attention)


def _warm_key(cache, tokens: torch.Tensor, kernel: dict) -> tuple:
    """What one compiled CPU step's (one bucket's and layer set's) graph depends on beyond tensor
    values: the cache's capacity and precision, the token device, grad mode and the kernel
    arguments given. A step whose key was run once with every guard evaluated has the graph it
    needs compiled and in dynamo's cache (see _guards_of)."""
    kv = getattr(cache, "keys", None)
    return (cache.capacity, None if kv is None else (kv.dtype, kv.device), tokens.device,
            torch.is_grad_enabled(), tuple(sorted(kernel)))


def _guards_of(warm: bool):
    """Dynamo's guards for one compiled CPU step: all of them (the default) the first time a step
    of its :func:`_warm_key` runs, which compiles what is missing; after that only the guards that
    tell dynamo's cached step graphs apart (``skip_guard_eval_unsafe``). Evaluating every guard of
    a whole-step graph (every parameter of 30 layers) cost ~1.3 ms of a ~35 ms float32 step on
    SmolLM2-135M (docs/results.md, "One graph per step"). Unsafe only where an input changes in a
    way no cached graph was compiled for; the warm key covers each such change, so that first call
    evaluates every guard again."""
    return torch.compiler.set_stance("default", skip_guard_eval_unsafe=True) if warm else contextlib.nullcontext()


class TreeOutput:
    """What a target forward gives: ``hidden (T, H)``, the last hidden state after the final norm;
    ``layers (T, k*H)``, the hidden states entering the requested layers (``layers=``),
    concatenated in the order asked (EAGLE-3 reads layers 2, L//2 and L-3), None when none were
    asked for; ``logits (T, V)`` float32 and :meth:`greedy`, the LM head's, computed on first use
    (a greedy step asks only for the argmax, which the target may get without every logit)."""

    def __init__(self, hidden: torch.Tensor, layers: torch.Tensor | None, head, argmax=None):
        self.hidden = hidden
        self.layers = layers
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


def _inductor_cache_dir() -> None:
    """Compiled graphs go under ``$EAGLE_CACHE/inductor`` (unless the user chose another folder
    than inductor's default), so a second process loads them from disk instead of compiling."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    from .models import cache_dir

    chosen = os.environ.get("TORCHINDUCTOR_CACHE_DIR")  # inductor itself fills in its default on first use
    if chosen is None or os.path.abspath(chosen) == os.path.abspath(default_cache_dir()):
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache_dir() / "inductor")


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

    def __init__(self, model, attention: str = "auto", runtime: RuntimeConfig | None = None):
        if attention not in ATTENTION_CHOICES:
            raise ValueError(f"attention must be one of {ATTENTION_CHOICES}, got '{attention}'")
        self.runtime = runtime or RuntimeConfig()
        self.runtime.validate()
        if self.runtime.dtype and getattr(torch, self.runtime.dtype) != model.get_output_embeddings().weight.dtype:
            model = copy.deepcopy(model).to(getattr(torch, self.runtime.dtype))  # the caller's model is untouched
        device = next(model.parameters()).device
        self.use_kernel = attention == "triton" or (attention == "auto" and device.type == "cuda")
        if self.use_kernel:
            model.set_attn_implementation(register_tree_attention())
        elif folds_gqa(model.config.get_text_config(decoder=True)):
            # SDPA without copying K/V to every query head for trees (eagle/attention.py), on a
            # parameter-sharing view: the given model keeps its own attention
            model = attention_view(model, register_gqa_sdpa())
        self.model = model
        self.config = model.config.get_text_config(decoder=True)
        self.base = model.get_decoder()
        self.lm_head = model.get_output_embeddings()
        self.softcap = getattr(self.config, "final_logit_softcapping", None)
        self.eager = model.config._attn_implementation == "eager"
        self.static = self.runtime.cache == "static"
        # compiled steps read the whole cache buffer (fixed shapes): SDPA with the dense mask, or the
        # tree kernel as the op torch.ops.eagle.tree_attention, given the prefix length as a tensor
        self.compiled = self.runtime.compile
        self._steps: dict = {}  # bucket -> compiled step function
        self._regional: dict = {}  # id(decoder) -> its copy whose layers are compile regions (CPU, _regions)
        # CPU static steps: per bucket, the fastest of F.linear, MKL's packed GEMM and the small-row
        # kernel (kernels/cpu_gemm.py) for float32, of F.linear and oneDNN's GEMM on packed weights
        # for bfloat16, measured once per process (eagle/packed.py). Compiled steps take the kernel
        # and oneDNN as the extension's C++ dispatcher ops on copies the twin holds (packed_op,
        # held_op), and MKL's packed copies through the extension's table too (held_mkl_op): without
        # the extension, compiled steps take F.linear where MKL would (a graph cannot make the copies)
        use_twin = self.static and self.runtime.packed_linear
        ways = linear_ways(model, self.runtime.buckets) if use_twin else {}
        packed = {r for r, w in ways.items() if w == "packed" and (not self.compiled or cpu_gemm.available())}
        stream = {r for r, w in ways.items() if w == "stream"}
        onednn = {r for r, w in ways.items() if w == "onednn"}
        self.packed = packed_twin(model, packed, stream, onednn) if packed or stream or onednn else None  # the model's twin
        self.packed_rows = packed_row_counts(self.packed)  # buckets whose steps take MKL's packed GEMM
        self.stream_rows = stream_row_counts(self.packed)  # buckets whose products take the small-row kernel
        self.onednn_rows = onednn_row_counts(self.packed)  # buckets whose bf16 products take oneDNN, packed
        self.twin_rows = self.packed_rows | self.stream_rows | self.onednn_rows  # buckets whose steps run on the twin
        self._packed_base = self.packed.get_decoder() if self.packed is not None else None
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
        logits = project(hidden, self.lm_head.weight)  # (T, V) the fastest way measured (eagle/lmhead.py)
        if getattr(self.lm_head, "bias", None) is not None:
            logits = logits + self.lm_head.bias
        logits = logits.float()
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits

    def _screened_argmax(self, hidden: torch.Tensor) -> torch.Tensor | None:
        """``(T,)`` int64, the argmax of ``self.logits(hidden)`` per row without computing them, or
        ``None`` where this does not apply. With ``runtime.greedy_head: screened``, a float32 head
        without bias or soft-capping on the CPU: the argmax of the exact logits through a bfloat16
        screen of the head (kernels/cpu_argmax.py; half the bytes read), the same as the float32
        product's unless two logits lie within its rounding of each other."""
        weight = self.lm_head.weight
        if (self.runtime.greedy_head == "screened" and not self.softcap
                and getattr(self.lm_head, "bias", None) is None and cpu_argmax.applies(hidden, weight)):
            return cpu_argmax.screened_argmax(hidden, weight)
        return None

    def _output(self, hidden: torch.Tensor, fused: torch.Tensor | None, head_in: torch.Tensor,
                keep: int | None = None) -> TreeOutput:
        """The :class:`TreeOutput` of features ``hidden`` and ``fused``, whose LM head runs over the
        rows ``head_in`` and keeps the first ``keep`` (default: all) of their logits: a prefill's last
        position, or a padded bucket of which the tree's T rows are kept (MKL packs for the bucket)."""
        keep = head_in.shape[0] if keep is None else keep
        return TreeOutput(hidden, fused, lambda: self.logits(head_in)[:keep],
                          lambda: self._screened_argmax(head_in[:keep]))

    def _run(self, ids: torch.Tensor, positions: torch.Tensor, cache, mask, layers: tuple[int, ...] | None = None,
             base=None, **kwargs) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(hidden (T, H), fused (T, k*H) or None)``: the final feature and, when ``layers`` are
        given, the hidden states entering those layers (transformers' ``hidden_states[i]``: the
        model records them in the same forward; we only concatenate the ones asked for). ``base``:
        the decoder to run (default: the model's own; the packed twin's for packed buckets)."""
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
        """
        layers = self.check_layers(layers)
        if isinstance(cache, SlotCache):
            return self._tree_forward_static(tree, cache, layers)
        prefix_len = cache.get_seq_length()
        tokens = tree.tokens.to(self.device)
        positions = tree.positions(prefix_len).to(self.device)  # (T,)
        extra = {"tree_mask": tree.packed_mask().to(self.device)} if self.use_kernel else {}
        mask = self._tree_masks(tree.ancestor_mask().to(self.device), prefix_len, positions)
        hidden, fused = self._run(tokens, positions, cache, mask, layers, **extra)
        return self._output(hidden, fused, hidden)

    def _tree_forward_static(self, tree: Tree, cache: SlotCache, layers: tuple[int, ...] | None) -> TreeOutput:
        P, T, dev = cache.length, len(tree), self.device
        size = self.runtime.bucket(T)
        tokens, depth, anc = pad_tree(tree.tokens.to(dev), tree.depth.to(dev), tree.ancestor_mask().to(dev), size)
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
            base = self._packed_base if size in self.twin_rows else None  # same results, a faster GEMM
            hidden, fused = self._run(tokens, positions, cache, self._tree_masks(anc, P, positions), layers,
                                      base=base, cache_slots=slots, cache_kv_len=P + size, **extra)
        cache.length = P + T  # as a DynamicCache would have it: the nodes are in, until commit/crop
        # with MKL's packed GEMM, the LM head runs over the whole bucket: a fixed row count it packs
        # for (8 rows ~10 ms, against ~20 ms for 5 rows unpacked); the padding rows are dropped after
        return self._output(hidden[:T], None if fused is None else fused[:T],  # padding rows dropped
                            hidden if size in self.packed_rows else hidden[:T], T)

    def _compiled_step(self, size: int, layers: tuple[int, ...] | None = None):
        """The compiled forward of a ``size``-node step (compiled on its first call, then reused;
        the first call's time is recorded in ``compile_s``)."""
        if (size, layers) in self._steps:
            return self._steps[(size, layers)]
        _inductor_cache_dir()
        # the extension's ops inside (the small-row kernel, oneDNN or MKL on held copies)
        base = self._packed_base if size in self.twin_rows else None

        def step(tokens, positions, masks, slots, cache, decoder=None, **kernel):  # kernel: tree_mask, tree_prefix
            return self._run(tokens, positions, cache, masks, layers, base=decoder or base, cache_slots=slots, **kernel)

        if self.device.type == "cuda":  # the whole step, as CUDA graphs
            compiled = torch.compile(step, dynamic=False, mode="reduce-overhead")
        else:  # CPU: the whole step, one graph; each decoder layer one region compiled once (_regions)
            regional = self._regions(self.base if base is None else base, size)
            graph = torch.compile(lambda *args, **kw: step(*args, decoder=regional, **kw), dynamic=False,
                                  backend=_STEP_BACKEND, options=_STEP_OPTIONS if _STEP_BACKEND == "inductor" else None)

            warmed: set = set()  # _warm_key of this step's calls already run once with all guards

            def compiled(tokens, positions, masks, slots, cache, **kernel):
                # every bucket, layer set and cache capacity adds a graph of the one step code: more
                # than dynamo's default limit of 8, past which it would run the step eagerly
                warm = _warm_key(cache, tokens, kernel)
                with torch._dynamo.config.patch(recompile_limit=_RECOMPILE_LIMIT), \
                        torch.compiler.config.patch(dynamic_sources=_LAYER_INDEX_SOURCES), _guards_of(warm in warmed):
                    out = graph(tokens, positions, masks, slots, cache, **kernel)
                warmed.add(warm)
                return out

        def first_call(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                out = compiled(*args, **kwargs)
            except Exception as e:  # e.g. no C++ compiler for inductor: the same step, eagerly
                if self.device.type == "cuda":
                    raise
                warnings.warn(f"eagle: compiling the {size}-node step failed ({type(e).__name__}: "
                              f"{str(e).strip().splitlines()[0][:200] if str(e).strip() else ''}); it runs eagerly",
                              RuntimeWarning, stacklevel=2)
                self._steps[(size, layers)] = step  # the uncompiled step (slots are explicit: a rerun rewrites them)
                return step(*args, **kwargs)
            self.compile_s[size] = time.perf_counter() - t0
            self._steps[(size, layers)] = compiled
            return out

        return first_call

    def _regions(self, base, size: int):
        """A parameter-sharing copy of the decoder ``base`` whose layers run as nested compile
        regions (eagle/regions.py), kept per ``base``. Why: the whole 30-layer step as one graph
        took 44-110 s to compile per bucket on the 2-core machines (inductor built every layer),
        and compiling each layer on its own left ~4 ms per float32 step to dynamo's and
        transformers' Python between the layers; here the step is one graph (one guard check) and
        every layer runs one compiled subgraph. The small-row kernel and oneDNN run in it as the
        extension's C++ dispatcher ops on copies the twin holds; MKL's copies for a ``size``-row
        bucket that takes MKL's packed GEMM are held when that bucket compiles (each is as large as
        the weights)."""
        if id(base) not in self._regional:
            # shares parameters and buffers (the kernel's packed copies too), and the twin's MKL
            # packed copies (opaque tensors, which cannot be deep-copied)
            copy_ = regional_copy(base, share=[m.packed for m in base.modules() if isinstance(m, PackedLinear)])
            for mod in copy_.modules():
                if isinstance(mod, PackedLinear):
                    mod.hold_copies()
            self._regional[id(base)] = copy_
        if size in self.packed_rows:
            for mod in self._regional[id(base)].modules():
                if isinstance(mod, PackedLinear):
                    mod.hold_mkl_copy(size)
        return self._regional[id(base)]

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
