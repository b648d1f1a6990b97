"""Shared fixtures and helpers: the tiny random-config models of every test file (the ``make_tiny_*``
builders), random trees, tiny EAGLE heads, plain greedy references, the training tests' data,
the command line, and the real default target of the slow tests."""
from __future__ import annotations

import json
import os
import random
from pathlib import Path
from typing import TYPE_CHECKING

# Triton kernels are tested on the CPU through the interpreter; it must be chosen before anything
# (transformers included) imports triton.
os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

from eagle.draft.base import Drafter
from eagle.tree import Tree

if TYPE_CHECKING:
    from eagle import DecodeStats
    from eagle.heads import DraftHead
    from eagle.train.trainer import TrainConfig

ARCHS = ("llama", "qwen2", "qwen3", "mistral", "gemma3")
TINY_VOCAB = 128
TINY_HIDDEN = 64
GEMMA_WINDOW = 8
MISTRAL_WINDOW = 12


def _tiny_config(arch: str, hidden: int = TINY_HIDDEN, vocab: int = TINY_VOCAB, layers: int = 2):
    """The config of every tiny model but :func:`make_tiny_llama`'s: 2 layers, 4 query / 2 KV heads,
    MLP width 128, no EOS token; ``hidden`` and ``vocab`` vary only in the head-mismatch tests,
    ``layers`` in the compiled-region tests (Gemma-3's alternate sliding and full)."""
    import transformers as tf

    common = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=128, num_hidden_layers=layers,
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
                                   layer_types=(["sliding_attention", "full_attention"] * layers)[:layers], **common)
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


class ByteTokenizer:
    """Just enough of a tokenizer for the data stage (no chat template): a token per UTF-8 byte,
    inside the tiny training vocabulary."""

    chat_template = None
    pad_token_id = 0

    def __call__(self, text: str) -> dict:
        return {"input_ids": [2 + b % (TINY_VOCAB - 2) for b in text.encode()]}


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


@pytest.fixture(autouse=True, scope="session")
def _packed_gemm_always():
    """The CPU backends the suite makes take MKL's packed GEMM for buckets >= 4 without timing it
    (``EAGLE_CPU_LINEAR=always``, the default of ``CpuBackend(linear=...)``): which GEMM wins is
    measured at run time otherwise, and tests must not depend on timings (tests/test_packed.py
    tests the measurement through explicit arguments)."""
    old = os.environ.get("EAGLE_CPU_LINEAR")
    os.environ["EAGLE_CPU_LINEAR"] = "always"
    yield
    if old is None:
        os.environ.pop("EAGLE_CPU_LINEAR", None)
    else:
        os.environ["EAGLE_CPU_LINEAR"] = old


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


# ---- tiny EAGLE heads (test_heads_eagle.py, test_draft_grow.py, test_heads_drafter.py) --------------


def random_parents_py(T: int, rng: random.Random) -> list[int]:
    """``parents`` of a random tree drawn with Python's ``random.Random``: parents[i] uniform in [0, i)."""
    return [-1] + [rng.randrange(i) for i in range(1, T)]


def causal_mask(B: int, T: int) -> torch.Tensor:
    """The plain causal mask ``(B, 1, T, T)`` (True = may attend) of the head's forward."""
    return torch.ones(T, T, dtype=torch.bool).tril()[None, None].expand(B, 1, T, T)


def random_head(model, seed: int = 1, draft_vocab=None) -> DraftHead:
    """``DraftHead.for_target`` with every weight randomized (not the identity-like init)."""
    from eagle.heads import DraftHead

    torch.manual_seed(seed)
    head = DraftHead.for_target(model, draft_vocab)
    with torch.no_grad():
        for p in head.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return head.eval()


def bigram_head(model, seed: int = 1) -> DraftHead:
    """A head whose output is mostly the embedding of its input token (plus a little of the feature and
    of its decoder layer): its drafts are the target's "bigram" guesses, often but not always right."""
    from eagle.heads import DraftHead

    torch.manual_seed(seed)
    head = DraftHead.for_target(model)
    h = head.hidden_size
    with torch.no_grad():
        head.fc.weight.zero_()
        head.fc.weight[:, :h] += torch.eye(h)  # token embedding half
        head.fc.weight[:, h:] += 0.01 * torch.eye(h)  # feature half: small, but it reaches the K/V
        head.fc.weight.add_(torch.randn_like(head.fc.weight) * 1e-3)
        head.layer.self_attn.o_proj.weight.mul_(0.1)
        head.layer.mlp.down_proj.weight.mul_(0.1)
    return head.eval()


# ---- decoding on the shared tiny Llama (test_decoder.py, test_draft_ngram.py) -------------------


@pytest.fixture(scope="module")
def llama(tiny_model):
    """``(model, Target)`` of the shared tiny Llama (``tiny_model("llama")``), attention "reference"."""
    from eagle import Target

    model = tiny_model("llama")
    return model, Target(model, "reference")


def prompt_ids(seed: int = 0, n: int = 12) -> torch.Tensor:
    """``n`` random token ids, a function of ``seed``."""
    return torch.randint(0, TINY_VOCAB, (n,), generator=torch.Generator().manual_seed(seed))


_PLAIN_GREEDY: dict = {}


def plain_greedy(model, prompt: torch.Tensor, n: int = 40, eos=None) -> list[int]:
    """The ``n`` new tokens of transformers' greedy ``model.generate`` (cached per model and prompt)."""
    key = (id(model), tuple(prompt.tolist()), n, eos)
    if key not in _PLAIN_GREEDY:
        with torch.no_grad():
            out = model.generate(prompt[None], attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                                 do_sample=False, max_new_tokens=n, eos_token_id=eos, pad_token_id=0)
        _PLAIN_GREEDY[key] = out[0, len(prompt):].tolist()
    return _PLAIN_GREEDY[key]


def check_stats(st: DecodeStats, tokens: list[int], trees: list | None = None):
    """The invariants of a run's ``DecodeStats`` (and, given the proposed ``trees``, their sizes and depths)."""
    assert st.new_tokens == len(tokens)
    assert sum(st.accepted_hist) == st.target_forwards
    # every step emits (accepted + 1) tokens, the last one possibly cut by EOS / the budget
    assert sum((a + 1) * h for a, h in enumerate(st.accepted_hist)) >= st.new_tokens - 1
    assert len(st.depth_tried) == len(st.depth_accepted)
    assert all(0.0 <= x <= 1.0 for x in st.per_depth_acceptance)
    assert all(a <= t for a, t in zip(st.depth_accepted, st.depth_tried))
    # depth_tried is non-increasing (a tree reaching depth d also reaches d - 1)
    assert all(x >= y for x, y in zip(st.depth_tried, st.depth_tried[1:]))
    # accepted at depth d == steps that accepted at least d tokens
    for d in range(len(st.depth_accepted)):
        assert st.depth_accepted[d] == sum(st.accepted_hist[d + 1:])
    if trees is not None:
        assert st.tree_nodes == sum(len(t) for t in trees)
        assert st.target_forwards == len(trees)
        assert len(st.depth_tried) == max([int(t.depth.max()) for t in trees] + [0])
        assert st.depth_tried[:1] == [sum(len(t) > 1 for t in trees)][: len(st.depth_tried)]
    d = st.as_dict()
    assert d["new_tokens"] == st.new_tokens and d["target_forwards"] == st.target_forwards
    assert d["tau"] == st.tau and d["accepted_hist"] == st.accepted_hist
    assert d["mean_tree_nodes"] == pytest.approx(st.tree_nodes / max(st.target_forwards, 1))
    assert set(d["time_s"]) == {"prefill", "draft", "verify", "bookkeeping"}
    assert all(v >= 0 for v in d["time_s"].values())


# ---- the training tests' data (test_train_*.py) -------------------------------------------------


N_SEQ = 40
PROMPT_LEN = 5


def sequences(n: int = N_SEQ, seed: int = 0) -> list[torch.Tensor]:
    """``n`` random token sequences of 20-60 tokens, a function of ``seed``."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, TINY_VOCAB, (int(torch.randint(20, 61, (), generator=g)),), generator=g) for _ in range(n)]


@torch.no_grad()
def features(model, ids: torch.Tensor) -> torch.Tensor:
    """The model's last hidden states over ``ids``: the features the head is trained on."""
    return model.get_decoder()(input_ids=ids[None]).last_hidden_state[0]  # (n, H) after the final norm


def make_data(root: Path, model, with_hidden: bool = True, manifest: dict | None = None) -> tuple[Path, Path]:
    """Shards (two of them) + a prompts file of N_SEQ prompts; returns ``(data_dir, prompts)``."""
    from eagle.train.data import load_manifest, write_shard

    data = root / ("data" if with_hidden else "data-online")
    seqs = sequences()
    m = load_manifest(data) if manifest is None else manifest
    half = N_SEQ // 2
    for lo, hi in ((0, half), (half, N_SEQ)):
        hid = [features(model, x) for x in seqs[lo:hi]] if with_hidden else None
        m = write_shard(data, m, seqs[lo:hi], hid, [PROMPT_LEN] * (hi - lo), prompts_done=hi)
    prompts = root / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"prompt {i}"}) + "\n" for i in range(N_SEQ)))
    return data, prompts


def train_config(root: Path, data: Path, prompts: Path, name: str, **over) -> TrainConfig:
    """A validated head-training config on ``data`` / ``prompts`` (8 steps of batch 4 on the tiny target),
    with its run folder and export under ``root / name``; ``over`` overrides any key."""
    from eagle.train.trainer import TrainConfig

    kw = dict(target="tiny-llama", prompts=str(prompts), num_prompts=N_SEQ, data_dir=str(data),
              draft_vocab_size=64, batch_size=4, max_seq_len=64, max_steps=8, lr=3e-3, warmup_steps=2,
              eval_every=1000, checkpoint_every=1000, heldout_fraction=0.1, seed=0,
              out_dir=str(root / name / "run"), export=str(root / name / "head"))
    kw.update(over)
    cfg = TrainConfig(**kw)
    cfg.validate()
    return cfg


def exported(cfg: TrainConfig) -> dict[str, torch.Tensor]:
    """The tensors of the head a training run exported."""
    from safetensors.torch import load_file

    return load_file(str(Path(cfg.export) / "model.safetensors"))


@pytest.fixture
def no_target_load(monkeypatch):
    """Fails a test that loads the target: prompt-file errors must come first."""
    import eagle.models

    monkeypatch.setattr(eagle.models, "load_target", lambda *a, **kw: pytest.fail("the target was loaded"))


# each case: (the prompts file's text, None for no file; the error it must give)
BAD_PROMPTS = {
    "missing": (None, r"prompts file not found: \S+prompts\.jsonl$"),
    "empty": ("", r"prompts\.jsonl: empty prompts file"),
    "blank lines": ("\n  \n", r"prompts\.jsonl: empty prompts file"),
    "bad json": ('{"prompt": "a"}\n\n{"prompt": "b"\n', r"prompts\.jsonl:3: not valid JSON \(Expecting"),
    "no prompt": ('{"prompt": "a"}\n{"text": "b"}\n', r"prompts\.jsonl:2: no prompt \(expected a JSON object"),
    "not an object": ('{"prompt": "a"}\n["b"]\n', r"prompts\.jsonl:2: no prompt"),
    "bad json list": ('[{"prompt": "a"},\n {"prompt": }]', r"prompts\.jsonl:2: not valid JSON"),
    "empty json list": ("[]", r"prompts\.jsonl: no prompts"),
}


def write_bad_prompts(path: Path, case: str) -> Path:
    """Writes the prompts file of a ``BAD_PROMPTS`` case at ``path`` (nothing for "missing")."""
    if BAD_PROMPTS[case][0] is not None:
        path.write_text(BAD_PROMPTS[case][0])
    return path


# ---- the command line (test_cli.py, test_bench.py) ----------------------------------------------


def write_prompt_lines(path, lines):
    """Writes ``lines`` (JSON lines) as a prompts file; returns its path as a string."""
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def run_cli(args, capsys):
    """``eagle`` with ``args`` in this process: ``(exit code, stdout, stderr)``."""
    from eagle.cli import main

    code = main(args)
    out = capsys.readouterr()
    return code, out.out, out.err


def save_tiny_llama_folder(folder, seed: int = 0):
    """A 1-layer random Llama (vocab 64, hidden 32) saved as a local HF folder, without a tokenizer."""
    import transformers as tf

    torch.manual_seed(seed)
    cfg = tf.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1)
    tf.LlamaForCausalLM(cfg).save_pretrained(folder)
    return folder


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
