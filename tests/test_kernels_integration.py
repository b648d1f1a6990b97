"""The Triton tree-attention kernel plugged into the target's verify forward and the head's draft
levels (``attention: triton``), run on the CPU through the Triton interpreter."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # must precede the first triton import

import pytest
import torch

from eagle.decoder import TreeDecoder
from eagle.draft.base import Sampling
from eagle.heads.drafter import EagleDrafter
from eagle.draft.shape import TreeShape
from eagle.heads import DraftHead
from eagle.target import Target
from eagle.tree import Tree
from eagle_kernels.tree_attention import use_triton

from conftest import make_tiny_llama

pytestmark = pytest.mark.skipif(not use_triton("cpu"), reason="needs TRITON_INTERPRET=1 before triton is imported")


def random_tree(T, vocab, gen):
    parents = [-1] + [int(torch.randint(0, i, (1,), generator=gen)) for i in range(1, T)]
    return Tree.from_lists(torch.randint(0, vocab, (T,), generator=gen).tolist(), parents)


def test_verify_forward_kernel_matches_reference():
    ref_model, ker_model = make_tiny_llama(), make_tiny_llama()
    ref, ker = Target(ref_model, "reference"), Target(ker_model, "triton")
    assert ker.use_kernel and not ref.use_kernel
    gen = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, 96, (37,), generator=gen)
    caches = [ref.new_cache(), ker.new_cache()]
    ref.prefill(prompt, caches[0])
    ker.prefill(prompt, caches[1])
    for T in (1, 5, 19):
        tree = random_tree(T, 96, gen)
        a, b = ref.tree_forward(tree, caches[0]), ker.tree_forward(tree, caches[1])
        torch.testing.assert_close(b.logits, a.logits, atol=2e-4, rtol=1e-4)
        path = tree.path_to(T - 1)
        for t, c in zip((ref, ker), caches):
            t.commit(c, c.get_seq_length() - T, path)


def test_greedy_with_kernel_equals_plain_generate():
    model = make_tiny_llama()
    prompt = torch.randint(0, 96, (12,), generator=torch.Generator().manual_seed(2))
    expected = model.generate(prompt[None], max_new_tokens=14, do_sample=False, pad_token_id=0)[0, 12:].tolist()
    head = DraftHead.for_target(model)
    target = Target(model, "triton")
    drafter = EagleDrafter(target, head, TreeShape(shape="dynamic", depth=3, top_k=3, total_tokens=7))
    assert drafter.head.layer_config._attn_implementation == "eagle_tree"
    assert head.layer_config._attn_implementation == "sdpa"  # the caller's head is left as it was
    out = TreeDecoder(target, drafter).generate(prompt, 14)
    assert out.tokens == expected


def test_head_level_forward_kernel_matches_reference():
    """The head's draft levels (non-square tree masks) give the same tree through the kernel."""
    model = make_tiny_llama()
    head = DraftHead.for_target(model)
    torch.manual_seed(3)
    with torch.no_grad():
        for p in head.layer.parameters():
            p.add_(0.05 * torch.randn_like(p))
    prompt = torch.randint(0, 96, (20,), generator=torch.Generator().manual_seed(4))
    trees = []
    for attention in ("reference", "triton"):
        target = Target(model, attention)
        drafter = EagleDrafter(target, head, TreeShape(shape="dynamic", depth=4, top_k=3, total_tokens=10))
        out = target.prefill(prompt, target.new_cache())
        drafter.reset(prompt)
        root = int(out.logits[-1].argmax())
        drafter.extend(out.hidden, torch.cat([prompt[1:], torch.tensor([root])]))
        trees.append(drafter.propose(root, Sampling()))
        head.layer_config._attn_implementation = "sdpa"
    assert torch.equal(trees[0].tokens, trees[1].tokens) and torch.equal(trees[0].parents, trees[1].parents)
    torch.testing.assert_close(trees[1].scores, trees[0].scores, atol=1e-4, rtol=1e-4)
