"""eagle: lossless speculative decoding with EAGLE-style tree drafting.

Quick use::

    import eagle
    model, tok = eagle.load_target("smollm2-135m")
    dec = eagle.TreeDecoder.from_config(model, eagle.load_config("experiments/configs/ngram.yaml"))
    out = dec.generate(ids, max_new_tokens=128)
"""
from .config import DecodeConfig, load_config
from .decoder import DecodeStats, GenerationResult, TreeDecoder
from .draft_model import load_draft_model
from .fallback import FallbackConfig
from .head import DraftHead, load_head
from .kv import SlotCache
from .models import load_target
from .runtime import RuntimeConfig
from .target import Target
from .tree import Tree
from .verify import greedy_verify, probs_from_logits, sample_verify, verify

__version__ = "0.1.0"
__all__ = ["Tree", "Target", "TreeDecoder", "DecodeStats", "GenerationResult", "DecodeConfig", "load_config",
           "load_target", "verify", "greedy_verify", "sample_verify", "probs_from_logits", "DraftHead", "load_head",
           "load_draft_model", "FallbackConfig", "RuntimeConfig", "SlotCache"]
