"""A preallocated KV cache written by slot (gpt-fast style), as a transformers ``Cache``.

All layers' keys live in one ``(L, B, H_kv, capacity, D)`` buffer and their values in another,
allocated on the first write (when heads, head size, dtype and device are known) and reused for
the rest of the generation (the decoder makes one cache per ``generate`` call); each layer's
``(B, H_kv, capacity, D)`` buffers are views of them. One buffer, not one per layer, so that a
layer finds its entries by indexing a tensor with its ``layer_idx``: a compiled step
then runs every layer as one compiled region (``layer_idx`` a symbolic integer), where indexing a
Python list would specialize the graph to each layer. A forward writes its T new entries at the slots it names
(``cache_slots``, a ``(T,)`` tensor passed through the model's forward kwargs, which transformers
hands on to ``Cache.update``); nothing on the model changes. The attention then reads either

* the first ``cache_kv_len`` slots (a view; eager steps: cost grows with the real length), or
* the whole buffer when ``cache_kv_len`` is not given (fixed shapes for compiled steps; the
  attention mask hides the slots that hold nothing yet).

Decoding with a tree: the tree's T nodes go to slots ``prefix .. prefix+T``; :meth:`SlotCache.commit`
copies the accepted nodes' slots down in place (``prefix + path -> prefix + 0..a``) and moves the
length; rejected slots are simply overwritten by the next step. Sliding-window layers keep their
full history too: the window is enforced by the attention mask, so compaction is the same copy
on every layer.
"""
from __future__ import annotations

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

__all__ = ["SlotCache", "SlotLayer", "SlotWriter", "write_slots"]


def write_slots(keys: torch.Tensor, values: torch.Tensor, layer_idx, key_states: torch.Tensor,
                value_states: torch.Tensor, slots: torch.Tensor) -> None:
    """Write layer ``layer_idx``'s new ``key_states / value_states (B, H_kv, T, D)`` at ``slots (T,)``
    of the stacked ``(L, B, H_kv, C, D)`` buffers, in place: one scatter each (how compiled steps
    write; ``layer_idx`` may be symbolic). ``index_copy_`` on the layer's view made inductor copy
    the layer's whole buffer out and back, per layer."""
    layer = slots.new_full(slots.shape, layer_idx)  # (T,)
    keys[layer, :, :, slots] = key_states.permute(2, 0, 1, 3)  # the indexed part: (T, B, H_kv, D)
    values[layer, :, :, slots] = value_states.permute(2, 0, 1, 3)


class SlotWriter:
    """One layer's access to a :class:`SlotCache`'s stacked buffers inside a compiled step, as the
    decoder layer's ``cache`` argument: ``update`` writes its entries with :func:`write_slots` and
    returns the layer's whole buffers. What a compiled layer region takes instead of the cache
    object itself (eagle/target.py, ``_regions``): tensors and the layer index only."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, layer_idx):
        self.keys, self.values, self.layer_idx = keys, values, layer_idx  # (L, B, H_kv, C, D) x2

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx=None, *args, kwargs=None,
               **_) -> tuple[torch.Tensor, torch.Tensor]:
        """As :meth:`SlotCache.update` in a compiled step (whole buffers); the layer index is the
        writer's own (the argument, the module's constant, is ignored)."""
        write_slots(self.keys, self.values, self.layer_idx, key_states, value_states, kwargs["cache_slots"])
        return self.keys[self.layer_idx], self.values[self.layer_idx]  # (B, H_kv, C, D) each


class SlotLayer(CacheLayerMixin):
    """One layer's ``(B, H_kv, capacity, D)`` key/value buffers: views of its :class:`SlotCache`'s
    stacked buffers (written through :meth:`SlotCache.update`)."""

    is_compileable = True
    is_sliding = False

    def __init__(self, capacity: int):
        super().__init__()
        self.capacity = capacity

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        raise NotImplementedError("a SlotLayer's buffers are views that its SlotCache allocates")

    def update(self, *args, **kwargs):
        raise NotImplementedError("write through SlotCache.update(key_states, value_states, layer_idx, kwargs=...)")

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.capacity, 0

    def get_seq_length(self) -> int:
        raise NotImplementedError("SlotCache tracks its length itself (SlotCache.length)")

    def get_max_length(self) -> int:
        return self.capacity


class SlotCache(Cache):
    """Preallocated KV buffers for ``num_layers`` layers and ``capacity`` positions.

    ``length`` is the number of committed entries (slots ``0 .. length-1``). The cache never
    decides where a forward writes: the caller passes ``cache_slots`` (see the module docstring),
    then records what became final with :meth:`commit` (tree steps) or :meth:`advance` (prefill).
    ``keys`` / ``values``: the stacked ``(L, B, H_kv, capacity, D)`` buffers (``None`` before the
    first write); ``layers[i].keys`` is ``keys[i]``.
    """

    def __init__(self, num_layers: int, capacity: int):
        super().__init__(layers=[SlotLayer(capacity) for _ in range(num_layers)])
        self.length = 0
        self.keys: torch.Tensor | None = None  # (L, B, H_kv, capacity, D)
        self.values: torch.Tensor | None = None

    @property
    def capacity(self) -> int:
        return self.layers[0].capacity

    def _bind(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Make ``keys`` / ``values`` the buffers, each layer's views of them included."""
        self.keys, self.values = keys, values
        for i, layer in enumerate(self.layers):
            layer.keys, layer.values = keys[i], values[i]  # (B, H_kv, capacity, D)
            layer.capacity = keys.shape[3]
            layer.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, kwargs=None,
               **_) -> tuple[torch.Tensor, torch.Tensor]:
        """``key_states (B, H_kv, T, D)`` of layer ``layer_idx`` go to slots ``kwargs["cache_slots"] (T,)``;
        returns that layer's first ``kwargs["cache_kv_len"]`` slots, or its whole buffer when that
        is not given."""
        if kwargs is None or kwargs.get("cache_slots") is None:
            raise ValueError("SlotCache needs the slots to write: pass cache_slots=(T,) tensor to the forward")
        if self.keys is None:
            B, H, _, D = key_states.shape
            L, C = len(self.layers), self.capacity
            self._bind(key_states.new_zeros(L, B, H, C, D), value_states.new_zeros(L, B, H, C, value_states.shape[-1]))
        if torch.compiler.is_compiling():  # a tensor index: layer_idx may be symbolic
            keys, values = self.keys[layer_idx], self.values[layer_idx]
        else:  # eager: the views, no indexing op
            layer = self.layers[layer_idx]
            keys, values = layer.keys, layer.values
        if key_states.shape[1] != keys.shape[1] or key_states.shape[-1] != keys.shape[-1]:
            raise ValueError(f"SlotCache: layer {layer_idx} writes keys of {tuple(key_states.shape)}, the buffers "
                             f"hold {tuple(keys.shape)}: every layer must have the same KV heads and head size")
        slots = kwargs["cache_slots"]
        if torch.compiler.is_compiling():
            write_slots(self.keys, self.values, layer_idx, key_states, value_states, slots)
        else:
            keys.index_copy_(2, slots, key_states)
            values.index_copy_(2, slots, value_states)
        n = kwargs.get("cache_kv_len")
        if n is None:
            return keys, values
        return keys[:, :, :n], values[:, :, :n]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.length

    def get_mask_sizes(self, query_length: int, layer_idx: int) -> tuple[int, int]:
        return self.capacity, 0

    def reserve(self, capacity: int) -> None:
        """Make room for ``capacity`` positions (no-op when there is already enough); reallocates,
        keeping what is written (rare: only when a generation needs more room than any before it)."""
        if capacity <= self.capacity:
            return
        if self.keys is None:
            for layer in self.layers:
                layer.capacity = capacity
            return
        keys = self.keys.new_zeros(*self.keys.shape[:3], capacity, self.keys.shape[-1])
        values = self.values.new_zeros(*self.values.shape[:3], capacity, self.values.shape[-1])
        keys[:, :, :, : self.capacity] = self.keys
        values[:, :, :, : self.capacity] = self.values
        self._bind(keys, values)

    def select_rows(self, keep: torch.Tensor) -> None:
        """Keep batch rows ``keep (b',)`` of every layer, in that order (a batch that shrinks)."""
        if self.keys is not None:
            self._bind(self.keys[:, keep], self.values[:, keep])

    def reset(self) -> None:
        """Forget every entry (the buffers stay allocated and are overwritten)."""
        self.length = 0

    def advance(self, n: int) -> None:
        """The ``n`` slots after the committed ones (just written in order) become committed."""
        self.length += n

    def commit(self, prefix_len: int, keep: list[int]) -> None:
        """Keep the prefix plus tree nodes ``keep`` (node i was written at slot ``prefix_len + i``),
        moved down to slots ``prefix_len .. prefix_len + len(keep)`` in place (all layers at once)."""
        n = len(keep)
        if n and keep != list(range(n)) and self.keys is not None:  # a chain prefix is already in place
            src = prefix_len + torch.tensor(keep, device=self.keys.device)
            dst = torch.arange(prefix_len, prefix_len + n, device=self.keys.device)
            self.keys[:, :, :, dst] = self.keys[:, :, :, src]  # gathered first: the ranges may overlap
            self.values[:, :, :, dst] = self.values[:, :, :, src]
        self.length = prefix_len + n

    def crop(self, length: int) -> None:
        """Drop every entry at or after ``length`` (they are overwritten later)."""
        self.length = min(self.length, length)
