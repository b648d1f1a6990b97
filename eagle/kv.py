"""A preallocated KV cache written by slot (gpt-fast style), as a transformers ``Cache``.

Every layer owns one ``(B, H_kv, capacity, D)`` key and value buffer, allocated on the first write
(when heads, head size, dtype and device are known) and reused for the rest of the generation
(the decoder makes one cache per ``generate`` call). A forward writes its T new entries at the slots it names
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

__all__ = ["SlotCache", "SlotLayer"]


class SlotLayer(CacheLayerMixin):
    """One layer's ``(B, H_kv, capacity, D)`` key/value buffers, written at explicit slots."""

    is_compileable = True
    is_sliding = False

    def __init__(self, capacity: int):
        super().__init__()
        self.capacity = capacity

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        B, H, _, Dk = key_states.shape
        self.keys = key_states.new_zeros(B, H, self.capacity, Dk)  # (B, H_kv, capacity, D)
        self.values = value_states.new_zeros(B, H, self.capacity, value_states.shape[-1])
        self.is_initialized = True

    def grow(self, capacity: int) -> None:
        """Reallocate to ``capacity`` slots, keeping what is written (rare: only when a generation
        needs more room than any before it)."""
        if capacity <= self.capacity:
            return
        if self.is_initialized:
            keys = self.keys.new_zeros(*self.keys.shape[:2], capacity, self.keys.shape[-1])
            values = self.values.new_zeros(*self.values.shape[:2], capacity, self.values.shape[-1])
            keys[:, :, : self.capacity] = self.keys
            values[:, :, : self.capacity] = self.values
            self.keys, self.values = keys, values
        self.capacity = capacity

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, kwargs=None, **_):
        """``key_states (B, H_kv, T, D)`` go to slots ``kwargs["cache_slots"] (T,)``; returns the
        first ``kwargs["cache_kv_len"]`` slots, or the whole buffer when that is not given."""
        if kwargs is None or kwargs.get("cache_slots") is None:
            raise ValueError("SlotCache needs the slots to write: pass cache_slots=(T,) tensor to the forward")
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        slots = kwargs["cache_slots"]
        self.keys.index_copy_(2, slots, key_states)
        self.values.index_copy_(2, slots, value_states)
        n = kwargs.get("cache_kv_len")
        if n is None:
            return self.keys, self.values
        return self.keys[:, :, :n], self.values[:, :, :n]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.capacity, 0

    def get_seq_length(self) -> int:
        raise NotImplementedError("SlotCache tracks its length itself (SlotCache.length)")

    def get_max_length(self) -> int:
        return self.capacity

    def move(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Copy slots ``src (n,)`` to ``dst (n,)`` in place (gather first: ranges may overlap)."""
        if self.is_initialized:
            self.keys[:, :, dst] = self.keys[:, :, src]
            self.values[:, :, dst] = self.values[:, :, src]


class SlotCache(Cache):
    """Preallocated per-layer KV buffers for ``num_layers`` layers and ``capacity`` positions.

    ``length`` is the number of committed entries (slots ``0 .. length-1``). The cache never
    decides where a forward writes: the caller passes ``cache_slots`` (see the module docstring),
    then records what became final with :meth:`commit` (tree steps) or :meth:`advance` (prefill).
    """

    def __init__(self, num_layers: int, capacity: int):
        super().__init__(layers=[SlotLayer(capacity) for _ in range(num_layers)])
        self.length = 0

    @property
    def capacity(self) -> int:
        return self.layers[0].capacity

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.length

    def get_mask_sizes(self, query_length: int, layer_idx: int) -> tuple[int, int]:
        return self.capacity, 0

    def reserve(self, capacity: int) -> None:
        """Make room for ``capacity`` positions (no-op when there is already enough)."""
        for layer in self.layers:
            layer.grow(capacity)

    def reset(self) -> None:
        """Forget every entry (the buffers stay allocated and are overwritten)."""
        self.length = 0

    def advance(self, n: int) -> None:
        """The ``n`` slots after the committed ones (just written in order) become committed."""
        self.length += n

    def commit(self, prefix_len: int, keep: list[int]) -> None:
        """Keep the prefix plus tree nodes ``keep`` (node i was written at slot ``prefix_len + i``),
        moved down to slots ``prefix_len .. prefix_len + len(keep)`` in place."""
        n = len(keep)
        if n and keep != list(range(n)):  # a chain prefix is already in place
            dev = self.layers[0].keys.device if self.layers[0].is_initialized else "cpu"
            src = prefix_len + torch.tensor(keep, device=dev)
            dst = torch.arange(prefix_len, prefix_len + n, device=dev)
            for layer in self.layers:
                layer.move(src, dst)
        self.length = prefix_len + n

    def crop(self, length: int) -> None:
        """Drop every entry at or after ``length`` (they are overwritten later)."""
        self.length = min(self.length, length)
