"""End to end on the real default target (SmolLM2-135M-Instruct): greedy speculative decoding with
every shipped CPU drafter gives exactly ``model.generate(do_sample=False)``'s tokens."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

import eagle
from eagle import Target, TreeDecoder, load_config
from eagle.draft import SelfDrafter, TreeShape
from eagle.tree import Tree

from conftest import random_parents

pytestmark = pytest.mark.slow

CONFIGS = Path(__file__).resolve().parent.parent / "experiments" / "configs"
N_NEW = 48
PROMPTS = [
    "Write a short story about a robot who learns to paint.",
    "Explain how photosynthesis works, step by step.",
    "Write a Python function that checks whether a number is prime, and explain it.",
    "List five tips for staying productive when working from home.",
    "What is the capital of Australia, and why is it not Sydney?",
    "Translate 'Good morning, how are you today?' into French, Spanish and German.",
]


@pytest.fixture(scope="module")
def smol():
    model, tok = eagle.load_target("smollm2-135m")
    return model, tok, Target(model, "reference")


@pytest.fixture(scope="module")
def prompts(smol):
    _, tok, _ = smol
    out = []
    for text in PROMPTS:
        ids = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                      return_dict=False)
        assert isinstance(ids, list) and all(isinstance(i, int) for i in ids)  # transformers 5.x: a list
        out.append(torch.tensor(ids))
    return out


def _trim_at_eos(tokens: list[int], eos: set[int]) -> list[int]:
    for i, t in enumerate(tokens):
        if t in eos:
            return tokens[: i + 1]
    return tokens


@pytest.fixture(scope="module")
def expected(smol, prompts):
    model, _, _ = smol
    eos = model.generation_config.eos_token_id
    eos = set(eos if isinstance(eos, list) else [eos])
    refs = []
    with torch.no_grad():
        for ids in prompts:
            out = model.generate(ids[None], attention_mask=torch.ones_like(ids)[None], do_sample=False,
                                 max_new_tokens=N_NEW)
            refs.append(_trim_at_eos(out[0, len(ids):].tolist(), eos))
    # most answers use the whole budget, and some stop at EOS (both endings are exercised)
    assert sum(len(r) == N_NEW for r in refs) >= 3
    assert any(len(r) < N_NEW and r[-1] in eos for r in refs)
    return refs


@pytest.mark.parametrize("config", ["plain", "plain-dynamic-cache", "self-draft", "ngram"])
def test_greedy_matches_generate(config, smol, prompts, expected):
    model, _, _ = smol
    cfg = load_config(CONFIGS / f"{config}.yaml")
    dec = TreeDecoder.from_config(model, cfg)  # the config's runtime (cache kind, buckets) applies
    assert dec.target.runtime.cache == ("dynamic" if config == "plain-dynamic-cache" else "static")
    total_fw = total_new = 0
    for ids, ref in zip(prompts, expected):
        out = dec.generate(ids, max_new_tokens=N_NEW)
        assert out.tokens == ref
        st = out.stats
        assert sum(st.accepted_hist) == st.target_forwards
        total_fw += st.target_forwards
        total_new += st.new_tokens - 1
        if config.startswith("plain"):  # the static slot cache (default) and the DynamicCache path
            assert st.target_forwards == len(ref) - 1
        if config == "self-draft":  # the oracle's chain of K = 4 is (up to fp near-ties) always accepted
            K = cfg.tree.depth
            assert st.accepted_hist[K] >= 0.9 * st.target_forwards
    if config == "ngram":
        assert total_new / total_fw > 1.05  # prompt lookup hits now and then (summary/translation)


def random_choices(n: int, seed: int) -> list[list[int]]:
    """The choice list of a random non-uniform tree with ``n`` drafted nodes."""
    gen = torch.Generator().manual_seed(seed)
    parents = random_parents(n + 1, gen)
    tree = Tree.from_lists([0] * (n + 1), parents)
    children = tree.children()
    rank = {c: r for ch in children for r, c in enumerate(ch)}
    return [[rank[j] for j in tree.path_to(i)[1:]] for i in range(1, n + 1)]


def test_self_drafter_random_static_tree(smol, prompts, expected):
    _, _, target = smol
    choices = random_choices(12, seed=3)
    shape = TreeShape("static", choices=choices)
    shape.validate()
    depths = [len(c) for c in choices]
    assert max(depths) >= 3 and sum(d == 1 for d in depths) >= 2  # deep and branching
    spine = max(k for k in range(1, max(depths) + 1) if [0] * k in choices)  # the all-best branch
    for k in (0, 2, 4, 5):  # two answers that use the whole budget, two that stop at EOS
        ids, ref = prompts[k], expected[k]
        out = TreeDecoder(target, SelfDrafter(target, shape)).generate(ids, max_new_tokens=N_NEW)
        assert out.tokens == ref
        st = out.stats
        assert st.tree_nodes == st.target_forwards * (len(choices) + 1)
        assert sum(st.accepted_hist[spine:]) >= 0.9 * st.target_forwards


@pytest.mark.parametrize("config", ["plain", "eagle2-cpu"])
def test_greedy_matches_generate_through_the_small_row_kernel(config, smol, prompts, expected):
    """Every bucket's layer products (one-token steps included) through kernels/cpu_gemm.py, as the
    measurement picks it on AVX-512 machines (``CpuBackend(linear="stream")``): still exactly
    ``generate``'s tokens (float32)."""
    from eagle.backends.cpu import CpuBackend
    from eagle.backends.cpu.packed import stream_row_counts
    from eagle_kernels import cpu_gemm

    if not cpu_gemm.available():
        pytest.skip(f"small-row kernel: {cpu_gemm.unavailable_reason()}")
    model, _, _ = smol
    cfg = load_config(CONFIGS / f"{config}.yaml")
    # the target from_config would make (buckets cut at the config's largest tree; float32: any row
    # count), with the small-row kernel chosen for every bucket
    target = Target(model, cfg.attention, cfg.runtime.fitted(cfg.max_tree_nodes()), backend=CpuBackend(linear="stream"))
    dec = TreeDecoder.from_config(target, cfg)
    assert dec.target is target
    buckets = set(dec.target.runtime.buckets)  # plain: one-token steps only
    assert buckets == ({1} if config == "plain" else {1, 4, 8})
    assert buckets <= stream_row_counts(target.backend.twin) == target.backend.stream_rows
    for ids, ref in zip(prompts, expected):
        assert dec.generate(ids, max_new_tokens=N_NEW).tokens == ref
