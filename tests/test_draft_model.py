"""Separate draft models (eagle/draft_model.py): a student built from target layers shares the target's
embedding and LM head, mismatched targets are a clear error, and greedy decoding with the `model`
drafter (another small LM, or a distilled checkpoint) is lossless."""
from __future__ import annotations

import pytest
import torch

from eagle import TreeDecoder
from eagle.config import config_from_dict
from eagle.draft_model import DraftModelMismatchError, build_draft_model, load_draft_model, save_draft_model

from conftest import make_tiny_train_model


@pytest.fixture(scope="module")
def model():
    return make_tiny_train_model()


def test_separate_draft_model_drafter_is_lossless(tiny_model, tmp_path):
    """drafter.type 'model': a different small LM drafts a chain; output stays plain greedy."""
    from eagle.config import load_config

    target, draft = tiny_model("llama", seed=0), tiny_model("llama", seed=1)
    draft.save_pretrained(tmp_path / "draft")
    (tmp_path / "c.yaml").write_text(f"drafter:\n  type: model\n  model: {tmp_path / 'draft'}\ntree:\n  shape: chain\n  depth: 3\n")
    prompt = torch.randint(1, 128, (9,), generator=torch.Generator().manual_seed(5))
    expected = TreeDecoder(target).generate(prompt, 20).tokens
    dec = TreeDecoder.from_config(target, load_config(tmp_path / "c.yaml"))
    out = dec.generate(prompt, 20)
    assert out.tokens == expected
    assert out.stats.tree_nodes == 4 * out.stats.target_forwards  # root + a chain of 3 every step


def test_student_with_all_layers_is_the_target(model):
    ids = torch.randint(0, 128, (1, 30), generator=torch.Generator().manual_seed(1))
    student = build_draft_model(model, [0, 1])
    torch.testing.assert_close(student(ids).logits, model(ids).logits, atol=1e-5, rtol=0)
    one = build_draft_model(model, [1])
    assert one.config.num_hidden_layers == 1
    for (n, p), (_, q) in zip(one.model.layers[0].named_parameters(), model.model.layers[1].named_parameters()):
        assert torch.equal(p, q), n
    # embedding and LM head are the target's own tensors (shared, not copies)
    assert one.get_input_embeddings().weight is model.get_input_embeddings().weight
    assert one.get_output_embeddings().weight is model.get_output_embeddings().weight
    with pytest.raises(ValueError, match="init layers"):
        build_draft_model(model, [2])


def test_mismatched_target_is_a_clear_error(model, tmp_path):
    student = build_draft_model(model, [0])
    save_draft_model(student, tmp_path / "d", "tiny-llama")
    from transformers import AutoModelForCausalLM, LlamaConfig

    other = AutoModelForCausalLM.from_config(LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64,
                                                         num_hidden_layers=1, num_attention_heads=4,
                                                         num_key_value_heads=2))
    with pytest.raises(DraftModelMismatchError, match="hidden_size"):
        load_draft_model(tmp_path / "d", other)
    with pytest.raises(FileNotFoundError):
        load_draft_model(tmp_path / "nothing", model)


def test_model_drafter_from_a_distilled_checkpoint_is_lossless(model, tmp_path):
    student = build_draft_model(model, [1])
    with torch.no_grad():  # a poor draft on purpose: acceptance must not matter for the output
        for p in student.model.layers.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    save_draft_model(student, tmp_path / "d", "tiny-llama")
    prompt = torch.randint(0, 128, (12,), generator=torch.Generator().manual_seed(5))
    plain = TreeDecoder(model, None, attention="reference").generate(prompt, 40)
    cfg = config_from_dict({"drafter": {"type": "model", "model": str(tmp_path / "d")},
                            "tree": {"shape": "chain", "depth": 4}, "attention": "reference"}, tmp_path / "c.yaml")
    out = TreeDecoder.from_config(model, cfg).generate(prompt, 40)
    assert out.tokens == plain.tokens
    assert out.stats.target_forwards < plain.stats.target_forwards  # the draft model is mostly right
