"""Values derived from a weight tensor (a packed copy of it, the GEMM measured fastest for it), kept
while the weight lives and until it is updated in place.

The small-row kernel's packed copies (``kernels/cpu_gemm.py``) and the LM head's measured choice
(``eagle/backends/cpu/lmhead.py``) both need this: a copy made before ``weight.mul_(...)`` is stale (the
weight's version counter tells), and a freed weight's copy must go with it, also because a new
weight may be allocated at the same address.
"""
from __future__ import annotations

import weakref

import torch

__all__ = ["WeightMemo"]


class WeightMemo:
    """A map from (weight, ``extra`` key) to a value derived from the weight.

    Keyed by the weight's memory (data pointer, shape, strides) and ``extra`` (e.g. a row count):
    views of the same memory share a value, as they share the weight's version counter. A value is
    returned only while the weight it was made for lives and its version counter has not moved
    since; an entry is dropped when its weight is freed.
    """

    def __init__(self):
        self._entries: dict[tuple, tuple] = {}  # key -> (weak reference to the weight, its version, value)

    @staticmethod
    def _key(weight: torch.Tensor, extra: tuple) -> tuple:
        return (weight.data_ptr(), tuple(weight.shape), weight.stride(), *extra)

    def get(self, weight: torch.Tensor, extra: tuple = ()):
        """The value kept for ``weight`` and ``extra``, or ``None`` (never made, or made before an
        in-place update of the weight)."""
        entry = self._entries.get(self._key(weight, extra))
        if entry is not None and entry[0]() is not None and entry[1] == weight._version:
            return entry[2]
        return None

    def put(self, weight: torch.Tensor, value, extra: tuple = ()):
        """Keep ``value`` for ``weight`` (at its current version) and ``extra``; returns ``value``."""
        key = self._key(weight, extra)
        ref = weakref.ref(weight, lambda r, key=key: self._forget(key, r))
        self._entries[key] = (ref, weight._version, value)
        return value

    def _forget(self, key: tuple, ref) -> None:
        entry = self._entries.get(key)
        if entry is not None and entry[0] is ref:  # not a newer weight's entry at the same address
            del self._entries[key]

    def values(self) -> list:
        return [entry[2] for entry in self._entries.values()]

    def __len__(self) -> int:
        return len(self._entries)
