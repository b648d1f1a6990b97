"""The second embedded architecture, for real: Gemma-3-270M (sliding-window layers, 262k vocab)."""
import pytest
import torch

import eagle
from eagle.prompts import encode_chat

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def gemma():
    return eagle.load_target("gemma3-270m")


@pytest.mark.parametrize("config", ["plain", "self-draft", "ngram"])
def test_gemma_greedy_identical_to_generate(gemma, config):
    model, tok = gemma
    dec = eagle.TreeDecoder.from_config(model, eagle.load_config(f"experiments/configs/{config}.yaml"))
    for text in ["The capital of France is", "def fibonacci(n):\n    \"\"\""]:
        ids = encode_chat(tok, text)
        ref = model.generate(ids[None], max_new_tokens=16, do_sample=False)[0, len(ids):].tolist()
        assert dec.generate(ids, 16).tokens == ref


def test_gemma_second_load_uses_the_cached_copy(gemma, monkeypatch):
    import eagle.models as models

    def no_conversion(*a, **k):
        raise AssertionError("the GGUF was converted again instead of loading the cached copy")

    monkeypatch.setattr(models, "_convert_gguf", no_conversion)
    model, _ = eagle.load_target("gemma3-270m")
    assert model.config.get_text_config().vocab_size == 262144
