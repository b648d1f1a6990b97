"""eagle: lossless speculative decoding with EAGLE-style tree drafting.

Quick use::

    import eagle
    model, tok = eagle.load_target("smollm2-135m")
    dec = eagle.TreeDecoder.from_config(model, "ngram")  # a shipped config, a YAML path, a dict or a DecodeConfig
    out = dec.generate(ids, max_new_tokens=128)

The names below are imported on first use (PEP 562), so ``eagle --help`` and argument errors
answer without importing torch or transformers.
"""
from __future__ import annotations

import importlib
import sys
import types

__version__ = "0.1.0"

_EXPORTS = {
    "Tree": "tree", "Target": "target", "TreeDecoder": "decoder", "DecodeStats": "decoder",
    "GenerationResult": "decoder", "DecodeConfig": "config", "load_config": "config", "ConfigError": "config",
    "load_target": "models", "verify": "verify", "greedy_verify": "verify", "greedy_accept": "verify",
    "sample_verify": "verify", "probs_from_logits": "verify",
    "DraftHead": "heads", "load_head": "heads", "load_draft_model": "draft_model", "FallbackConfig": "fallback",
    "RuntimeConfig": "runtime",
    # extension points (docs/extending.md)
    "Drafter": "draft.base", "Sampling": "draft.base", "register_drafter": "draft.base",
    "TreeShape": "draft.shape", "register_tree_shape": "draft.shape",
}
__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
        globals()[name] = value  # later lookups skip this function
        return value
    raise AttributeError(f"module 'eagle' has no attribute '{name}'")


def __dir__():
    return sorted(list(globals()) + __all__)


class _Package(types.ModuleType):
    def __setattr__(self, name, value):
        # importing the submodule eagle.verify binds it on the package; the public name is the function
        if isinstance(value, types.ModuleType) and _EXPORTS.get(name) == name:
            value = getattr(value, name)
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
