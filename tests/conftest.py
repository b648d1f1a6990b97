"""Shared fixtures: tiny random-config causal LMs of several architectures, random trees."""
from __future__ import annotations

import os

# Triton kernels are tested on the CPU through the interpreter; it must be chosen before anything
# (transformers included) imports triton.
os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

from eagle.draft.base import Drafter
from eagle.tree import Tree

ARCHS = ("llama", "qwen2", "qwen3", "mistral", "gemma3")
TINY_VOCAB = 128
TINY_HIDDEN = 64
GEMMA_WINDOW = 8
MISTRAL_WINDOW = 12


def _tiny_config(arch: str, hidden: int = TINY_HIDDEN, vocab: int = TINY_VOCAB):
    """The config of every tiny model but :func:`make_tiny_llama`'s: 2 layers, 4 query / 2 KV heads,
    MLP width 128, no EOS token; ``hidden`` and ``vocab`` vary only in the head-mismatch tests."""
    import transformers as tf

    common = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                  tie_word_embeddings=False, bos_token_id=0, eos_token_id=None, pad_token_id=0)
    if arch == "llama":
        return tf.LlamaConfig(**common)
    if arch == "qwen2":
        return tf.Qwen2Config(**common)
    if arch == "qwen3":
        return tf.Qwen3Config(head_dim=hidden // 4, **common)  # 16 at the default hidden size
    if arch == "mistral":
        # every layer slides, with a window smaller than the prompts used in the tests
        return tf.MistralConfig(sliding_window=MISTRAL_WINDOW, **common)
    if arch == "gemma3":
        return tf.Gemma3TextConfig(head_dim=16, query_pre_attn_scalar=16, sliding_window=GEMMA_WINDOW,
                                   layer_types=["sliding_attention", "full_attention"], **common)
    # variants beyond the main five
    if arch == "gemma3-softcap":  # final-logit and attention-logit soft-capping
        return tf.Gemma3TextConfig(head_dim=16, query_pre_attn_scalar=16, sliding_window=GEMMA_WINDOW,
                                   layer_types=["full_attention", "sliding_attention"],
                                   final_logit_softcapping=5.0, attn_logit_softcapping=20.0, **common)
    if arch == "qwen2-sliding":  # Qwen2's own switch: the layers above max_window_layers slide
        return tf.Qwen2Config(use_sliding_window=True, sliding_window=GEMMA_WINDOW, max_window_layers=1, **common)
    raise ValueError(arch)


def make_tiny_model(arch: str, seed: int = 0, logit_scale: float = 30.0, attn: str = "sdpa",
                    embed_scale: float = 1.0, layer_scale: float = 1.0, hidden: int = TINY_HIDDEN,
                    vocab: int = TINY_VOCAB):
    """A 2-layer random model in fp32 with SDPA attention and peaked (well separated) logits.

    The LM head is multiplied by ``logit_scale`` so greedy argmax margins are large compared to the
    fp32 noise of different (but mathematically equal) attention layouts. No EOS token is set on the
    model (generation runs to ``max_new_tokens`` unless a test passes one explicitly).
    ``embed_scale`` multiplies the input embeddings and ``layer_scale`` every layer's output
    projections (attention ``o_proj`` and MLP ``down_proj``); see :func:`make_tiny_head_target`.
    A new model on every call (the ``tiny_model`` fixture shares them).
    """
    from transformers import AutoModelForCausalLM

    config = _tiny_config(arch, hidden, vocab)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, attn_implementation=attn, dtype=torch.float32)
    with torch.no_grad():
        if embed_scale != 1.0:
            model.get_input_embeddings().weight.mul_(embed_scale)
        model.get_output_embeddings().weight.mul_(logit_scale)
        if layer_scale != 1.0:
            for layer in model.model.layers:
                layer.self_attn.o_proj.weight.mul_(layer_scale)
                layer.mlp.down_proj.weight.mul_(layer_scale)
    model.eval()
    model.requires_grad_(False)
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    model.generation_config.bos_token_id = 0
    return model


_HEAD_TARGETS: dict = {}


def make_tiny_head_target(arch: str = "llama", hidden: int = TINY_HIDDEN, vocab: int = TINY_VOCAB,
                          layer_scale: float = 3.0, seed: int = 0):
    """The target of the EAGLE head tests: :func:`make_tiny_model` with embeddings x4, LM head x30.

    ``layer_scale`` multiplies the layers' output projections: the residual stream then mixes the
    current token's embedding with context, so a "bigram" head (see :func:`bigram_head`) guesses
    some, but not all, of the target's tokens. Models are cached: tests must not modify them.
    """
    key = (arch, hidden, vocab, layer_scale, seed)
    if key not in _HEAD_TARGETS:
        _HEAD_TARGETS[key] = make_tiny_model(arch, seed, logit_scale=30.0, embed_scale=4.0, layer_scale=layer_scale,
                                             hidden=hidden, vocab=vocab)
    return _HEAD_TARGETS[key]


def make_tiny_train_model(seed: int = 0):
    """The target of the training tests (head trainer, distillation, draft models): a tiny Llama with
    embeddings x4 and LM head x30. A new model on every call (tests may edit its generation config)."""
    return make_tiny_model("llama", seed, logit_scale=30.0, embed_scale=4.0)


def make_tiny_llama(seed: int = 0):
    """The target of the Triton kernel integration tests: ``LlamaForCausalLM`` of its own config
    (vocabulary 96, 256 positions, transformers' default attention and BOS), embeddings x4."""
    import transformers as tf

    torch.manual_seed(seed)
    cfg = tf.LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         eos_token_id=None, pad_token_id=0)
    model = tf.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(4)  # peaked outputs: greedy margins well above rounding
    return model


@pytest.fixture(autouse=True, scope="session")
def _one_thread():
    """One intra-op thread for the whole suite: tiny ops on a shared 2-core machine are much slower
    with two threads fighting (and results do not depend on it)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


_MODEL_CACHE: dict = {}


@pytest.fixture(scope="session")
def tiny_model():
    """Factory ``tiny_model(arch, seed=0, attn="sdpa")``; models are built once per session and
    shared, so tests must not modify them."""

    def get(arch: str, seed: int = 0, attn: str = "sdpa"):
        key = (arch, seed, attn)
        if key not in _MODEL_CACHE:
            _MODEL_CACHE[key] = make_tiny_model(arch, seed, attn=attn)
        return _MODEL_CACHE[key]

    return get


def random_parents(n: int, gen: torch.Generator, max_children: int | None = None) -> list[int]:
    """``parents`` of a random tree with ``n`` nodes: parents[0] = -1, parents[i] uniform in [0, i)."""
    parents = [-1]
    counts = [0] * n
    for i in range(1, n):
        while True:
            p = int(torch.randint(0, i, (), generator=gen))
            if max_children is None or counts[p] < max_children:
                break
        counts[p] += 1
        parents.append(p)
    return parents


def make_random_tree(n: int, vocab: int, gen: torch.Generator, root: int | None = None,
                     distinct_siblings: bool = True, max_children: int | None = None) -> Tree:
    """A random non-uniform tree of ``n`` nodes with random tokens in ``[0, vocab)``."""
    parents = random_parents(n, gen, max_children)
    tokens = [int(torch.randint(0, vocab, (), generator=gen)) if root is None else int(root)]
    used: dict[int, set[int]] = {}
    for i in range(1, n):
        while True:
            t = int(torch.randint(0, vocab, (), generator=gen))
            if not distinct_siblings or t not in used.setdefault(parents[i], set()):
                break
        used.setdefault(parents[i], set()).add(t)
        tokens.append(t)
    return Tree.from_lists(tokens, parents)


@pytest.fixture
def random_tree():
    """Factory ``random_tree(n, vocab, seed=0, root=None, ...)``."""

    def make(n: int, vocab: int, seed: int = 0, **kw) -> Tree:
        gen = torch.Generator().manual_seed(seed)
        return make_random_tree(n, vocab, gen, **kw)

    return make


class RandomTreeDrafter(Drafter):
    """Proposes random non-uniform trees of random tokens: almost every draft is wrong."""

    def __init__(self, vocab: int, seed: int = 0, max_nodes: int = 10):
        self.vocab, self.max_nodes = vocab, max_nodes
        self.gen = torch.Generator().manual_seed(seed)
        self.proposed: list[Tree] = []

    def propose(self, root, sampling):
        n = int(torch.randint(1, self.max_nodes + 1, (), generator=self.gen))
        tree = make_random_tree(n, self.vocab, self.gen, root=root)
        self.proposed.append(tree)
        return tree


@pytest.fixture(scope="session")
def tiny_target(tmp_path_factory):
    """A tiny random Llama with SmolLM2's tokenizer (and chat template), saved as a local HF folder."""
    import transformers as tf

    from eagle.models import resolve_target

    folder = tmp_path_factory.mktemp("tiny-target")
    tok = tf.AutoTokenizer.from_pretrained(resolve_target("smollm2-135m"))
    torch.manual_seed(0)
    cfg = tf.LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=160,
                         eos_token_id=tok.eos_token_id, pad_token_id=tok.eos_token_id, bos_token_id=1)
    tf.LlamaForCausalLM(cfg).save_pretrained(folder)
    tok.save_pretrained(folder)
    return str(folder)


# ---- the real default target (slow tests) ---------------------------------------------------------

SHIPPED_PROMPTS = ["Write a Python function that returns the largest of three numbers.",
                   "Give me three tips for sleeping better.",
                   "What is 12 times 17? Show your steps."]


@pytest.fixture(scope="session")
def smollm2():
    """``(model, tokenizer)`` of the real SmolLM2-135M-Instruct, loaded once per test session."""
    import eagle

    return eagle.load_target("smollm2-135m")


def shipped_config_mean_tau(smollm2, config_path, max_new_tokens: int = 40):
    """Decode SHIPPED_PROMPTS greedily with a shipped config; every output must equal plain
    decoding. Returns ``(decoder, mean tau)``."""
    import eagle
    from eagle.prompts import encode_chat

    model, tok = smollm2
    dec = eagle.TreeDecoder.from_config(model, eagle.load_config(config_path))
    plain = eagle.TreeDecoder(dec.target)
    taus = []
    for text in SHIPPED_PROMPTS:
        ids = encode_chat(tok, text)
        out = dec.generate(ids, max_new_tokens)
        assert out.tokens == plain.generate(ids, max_new_tokens).tokens, text
        taus.append(out.stats.tau)
    return dec, sum(taus) / len(taus)
