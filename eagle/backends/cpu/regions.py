"""A decoder whose layers are compiled once and stamped out: how a CPU step compiles as one graph.

A compiled CPU step (``Target._compiled_step``) is one ``torch.compile`` graph over the whole
forward. Left alone, dynamo would trace the 30 decoder layers of SmolLM2 as 30 copies and inductor
would generate and build code for each, several times the compile time per bucket. Here each
decoder layer's ``forward`` runs as a ``torch.compiler.nested_compile_region``: dynamo traces the
first layer of each structure once, and every other layer with the same structure reuses that
subgraph with its own parameters, key/value buffers and layer index as inputs; inductor compiles
it once and calls it per layer (docs/cpu-backend.md, compile-one-graph).

Two things make the layers one subgraph:

* the layer index, a Python ``int`` on every attention module, is traced as a symbolic integer
  (``torch.compiler.config.dynamic_sources``, set around the compiled call by the Target), and
* a layer region takes no cache object (dynamo cannot reuse a subgraph with one among its inputs):
  it gets the :class:`~eagle.kv.SlotCache`'s stacked buffers and builds an :class:`~eagle.kv.SlotWriter`
  inside, which writes through the same :func:`~eagle.kv.write_slots`.

Reuse is decided by :func:`region_key`, a fingerprint of the layer's structure (module classes,
their plain attributes but the layer index, parameter shapes and dtypes): dynamo's own check refuses
these layers (transformers' hub-kernel wrappers record a side effect), and the key says exactly
what makes two layers trace the same. Gemma-3's sliding and full layers get two keys, hence two
subgraphs. The model's own modules are untouched: only a parameter-sharing copy's layers change
class (:func:`regional_copy`).
"""
from __future__ import annotations

import hashlib

import torch
from torch import nn

from ...attention import sharing_copy
from ...kv import SlotCache, SlotWriter

__all__ = ["region_key", "regional_copy", "layer_hooks_outside"]

_PLAIN = (bool, int, float, str, type(None), tuple, frozenset)
_CACHE_KWARGS = ("cache", "past_key_values")  # the decoder layer's cache argument, new name and old


def region_key(layer: nn.Module) -> int:
    """A fingerprint of what makes ``layer`` trace to a given graph: for each submodule its name,
    class and plain attributes (the layer index excepted), and each parameter's and buffer's
    shape and dtype. Layers with the same key run one compiled subgraph."""
    parts = []
    for name, mod in layer.named_modules():
        attrs = sorted((k, repr(v)) for k, v in vars(mod).items()
                       if not k.startswith("_") and k != "layer_idx" and isinstance(v, _PLAIN))
        parts.append((name, type(mod).__module__, type(mod).__qualname__, attrs))
    for name, t in list(layer.named_parameters()) + list(layer.named_buffers()):
        parts.append((name, tuple(t.shape), str(t.dtype)))
    return int(hashlib.sha256(repr(parts).encode()).hexdigest()[:15], 16)


def _region_hash(layer, *args, **kwargs) -> int:
    return layer._eagle_region_key  # a plain int attribute: a constant while dynamo traces


@torch.compiler.nested_compile_region(reuse_hash_fn=_region_hash)
def _layer_region(layer, keys, values, layer_idx, cache_name: str, args: tuple, kwargs: dict):
    """One decoder layer's forward, writing its keys and values into the stacked buffers
    ``keys / values (L, B, H_kv, C, D)`` at layer ``layer_idx``."""
    return layer._eagle_layer_forward(*args, **{**kwargs, cache_name: SlotWriter(keys, values, layer_idx)})


def _regional_forward(self, *args, **kwargs):
    """The forward of a :func:`regional_copy`'s layers: the layer's own forward as a nested compile
    region when it writes a :class:`SlotCache` (compiled steps), the plain forward otherwise."""
    name = next((k for k in _CACHE_KWARGS if isinstance(kwargs.get(k), SlotCache)), None)
    if name is None or not torch.compiler.is_compiling():
        return self._eagle_layer_forward(*args, **kwargs)
    cache = kwargs.pop(name)
    return _layer_region(self, cache.keys, cache.values, self.self_attn.layer_idx, name, args, kwargs)


_SUBCLASSES: dict[type, type] = {}


def _regional_class(cls: type) -> type:
    """``cls`` with :func:`_regional_forward` as its forward (one subclass per layer class)."""
    if cls not in _SUBCLASSES:
        _SUBCLASSES[cls] = type(f"Regional{cls.__name__}", (cls,),
                                {"forward": _regional_forward, "_eagle_layer_forward": cls.forward})
    return _SUBCLASSES[cls]


def layer_hooks_outside(decoder) -> None:
    """Leave no transformers output-capturing hook on a decoder layer's submodules in ``decoder``
    (a copy of ours): they read a ContextVar and record attention weights, never asked for here.
    The hooks are installed now (transformers would add them on the first forward that asks for
    outputs) and those below the layers removed; the layers' own hooks (their hidden states, e.g.
    EAGLE-3's features) stay, and run in the compiled step around each layer region."""
    try:
        from transformers.utils.output_capturing import maybe_install_capturing_hooks
    except ImportError:  # a transformers without output capturing: nothing to move
        return
    try:
        maybe_install_capturing_hooks(decoder)
    except Exception:  # a model that records nothing
        return
    for layer in getattr(decoder, "layers", ()):
        for sub in layer.modules():
            if sub is layer:
                continue
            for key, hook in list(sub._forward_hooks.items()):
                if getattr(hook, "__name__", "") == "output_capturing_hook":
                    del sub._forward_hooks[key]


def regional_copy(base: nn.Module, share=()) -> nn.Module:
    """A parameter-sharing copy of the decoder ``base`` whose layers run as nested compile regions
    inside a compiled step (and exactly as ``base``'s outside one). ``share``: objects its modules
    hold that must be shared rather than copied (see :func:`eagle.attention.sharing_copy`)."""
    copy_ = sharing_copy(base, share=share)
    layer_hooks_outside(copy_)
    for layer in getattr(copy_, "layers", ()):
        if getattr(getattr(layer, "self_attn", None), "layer_idx", None) is None:
            continue  # not a cached attention layer: it is traced inline
        layer._eagle_region_key = region_key(layer)
        layer.__class__ = _regional_class(type(layer))
    return copy_
