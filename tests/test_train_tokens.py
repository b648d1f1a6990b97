"""The token store (eagle/train/tokens.py): a new machine rebuilds the feature shards from the stored
tokens (equal to the sampled ones up to rounding), sampling resumes where the store ends and gives the
tokens an uninterrupted run gives, data made before the store is mirrored into it, and a store that
does not fit the run is refused with a message naming why."""
from __future__ import annotations

import json

import pytest
import torch

from eagle.train.data import ShardDataset, load_manifest
from eagle.train.tokens import TokenStoreError, featurize, load_token_manifest
from eagle.train.trainer import make_data

from conftest import TINY_VOCAB, ByteTokenizer, make_tiny_train_model, train_config

V = TINY_VOCAB
LAYERS = [1, 2]


class NoSampling(ByteTokenizer):
    """Fails the test if the data stage samples (it encodes the prompts first)."""

    def __call__(self, text: str) -> dict:
        raise AssertionError("the data stage sampled although the token store held every shard")


@pytest.fixture(scope="module")
def model():
    m = make_tiny_train_model()
    m.generation_config.eos_token_id = 1
    return m


def _prompts(tmp_path, n=12):
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"question {i} " * (1 + i % 3)}) + "\n" for i in range(n)))
    return path


def _cfg(tmp_path, data, prompts, n=12, tokens="tokens", **over):
    kw = dict(num_prompts=n, gen_batch_size=4, gen_max_new_tokens=10, gen_temperature=0.6, shard_prompts=3,
              feature_layers=LAYERS, tokens_dir=str(tmp_path / tokens) if tokens else "")
    kw.update(over)
    return train_config(tmp_path, tmp_path / data, prompts, data, **kw)


def _same_data(a, b, features=True):
    da, db = ShardDataset(a, load_layers=features, load_hidden=features), \
        ShardDataset(b, load_layers=features, load_hidden=features)
    assert len(da) == len(db)
    for x, y in zip(da, db):
        assert torch.equal(x.input_ids, y.input_ids) and x.prompt_len == y.prompt_len
        if features:  # float16 storage of float32 features computed two ways
            torch.testing.assert_close(x.hidden.float(), y.hidden.float(), atol=4e-3, rtol=2e-3)
            torch.testing.assert_close(x.layers.float(), y.layers.float(), atol=4e-3, rtol=2e-3)
    ma, mb = load_manifest(a), load_manifest(b)
    keys = ("shards", "prompts_done", "tokens") + (("feature_layers", "has_hidden", "has_layers", "hidden_size")
                                                   if features else ())
    for k in keys:
        assert ma[k] == mb[k], k


def test_featurize_equals_a_forward_per_sequence(model):
    """Batched, right-padded, several batches: each sequence's features equal its own forward."""
    torch.manual_seed(0)
    seqs = [torch.randint(2, V, (n,)) for n in (3, 17, 9, 30, 1, 12)]
    out = featurize(model, seqs, (1, 2), max_tokens=40)  # forces several batches
    for s, (h, f) in zip(seqs, out):
        with torch.no_grad():
            hs = model.model(s[None], output_hidden_states=True).hidden_states
        torch.testing.assert_close(h.float(), hs[-1][0], atol=2e-3, rtol=1e-3)
        torch.testing.assert_close(f.float(), torch.cat([hs[1][0], hs[2][0]], -1), atol=2e-3, rtol=1e-3)
    assert featurize(model, seqs[:2])[0][1] is None


def test_a_new_machine_rebuilds_the_features_without_sampling(tmp_path, model):
    prompts = _prompts(tmp_path)
    make_data(_cfg(tmp_path, "sampled", prompts), model, ByteTokenizer())
    store = load_token_manifest(tmp_path / "tokens")
    assert store["prompts_done"] == 12 and [s["sequences"] for s in store["shards"]] == [3, 3, 3, 3]
    assert store["settings"]["temperature"] == 0.6 and len(store["prompts_sha256"]) == 64
    assert not any(p.name.endswith(".tmp") for p in (tmp_path / "tokens").iterdir())
    make_data(_cfg(tmp_path, "rebuilt", prompts), model, NoSampling())  # data_dir empty, store full
    _same_data(tmp_path / "sampled", tmp_path / "rebuilt")


def test_sampling_resumes_after_the_store_as_one_run_would(tmp_path, model):
    """Half the prompts on one machine, the rest on another (its data_dir empty): the same tokens as
    one uninterrupted run, and the store then holds all of them."""
    prompts = _prompts(tmp_path)
    make_data(_cfg(tmp_path, "first", prompts, n=6), model, ByteTokenizer())
    make_data(_cfg(tmp_path, "second", prompts, n=12), model, ByteTokenizer())
    make_data(_cfg(tmp_path, "whole", prompts, n=12, tokens=""), model, ByteTokenizer())
    _same_data(tmp_path / "second", tmp_path / "whole")
    assert load_token_manifest(tmp_path / "tokens")["tokens"] == load_manifest(tmp_path / "whole")["tokens"]


def test_data_made_before_the_store_is_mirrored(tmp_path, model):
    prompts = _prompts(tmp_path)
    make_data(_cfg(tmp_path, "old", prompts, n=6, tokens=""), model, ByteTokenizer())
    make_data(_cfg(tmp_path, "old", prompts, n=6), model, NoSampling())  # nothing to sample: mirrors only
    store = load_token_manifest(tmp_path / "tokens")
    assert store["tokens"] == load_manifest(tmp_path / "old")["tokens"] and len(store["shards"]) == 2
    make_data(_cfg(tmp_path, "copy", prompts, n=6), model, NoSampling())
    _same_data(tmp_path / "old", tmp_path / "copy")


def test_data_tokens_rebuilds_only_what_the_run_reads(tmp_path, model):
    prompts = _prompts(tmp_path)
    make_data(_cfg(tmp_path, "sampled", prompts), model, ByteTokenizer())
    first = load_token_manifest(tmp_path / "tokens")["shards"][0]["tokens"]
    make_data(_cfg(tmp_path, "part", prompts, data_tokens=first + 1), model, NoSampling())
    assert len(load_manifest(tmp_path / "part")["shards"]) == 2


def test_online_extraction_copies_tokens_only(tmp_path, model):
    prompts = _prompts(tmp_path)
    make_data(_cfg(tmp_path, "sampled", prompts, n=6), model, ByteTokenizer())
    make_data(_cfg(tmp_path, "online", prompts, n=6, extraction="online", feature_layers=[]), model, NoSampling())
    m = load_manifest(tmp_path / "online")
    assert m["has_hidden"] is False and m["tokens"] == load_manifest(tmp_path / "sampled")["tokens"]
    _same_data(tmp_path / "sampled", tmp_path / "online", features=False)


@pytest.mark.parametrize("change, message", [
    (dict(gen_temperature=0.9), r"other settings \(temperature: 0\.6 there, 0\.9 here\)"),
    (dict(shard_prompts=4), r"shard_prompts: 3 there, 4 here"),
    (dict(prompts="other"), r"answers other prompts than the first 6"),
])
def test_a_store_of_other_data_is_refused(tmp_path, model, change, message):
    prompts = _prompts(tmp_path)
    make_data(_cfg(tmp_path, "sampled", prompts, n=6), model, ByteTokenizer())
    if change.get("prompts") == "other":
        other = tmp_path / "other.jsonl"
        other.write_text("".join(json.dumps({"prompt": f"other {i}"}) + "\n" for i in range(12)))
        prompts, change = other, {}
    with pytest.raises(TokenStoreError, match=message):
        make_data(_cfg(tmp_path, "fresh", prompts, **change), model, NoSampling())


def test_a_data_dir_that_disagrees_with_the_store_is_refused(tmp_path, model):
    prompts = _prompts(tmp_path)
    make_data(_cfg(tmp_path, "a", prompts, n=6), model, ByteTokenizer())
    make_data(_cfg(tmp_path, "b", prompts, n=3, tokens="", seed=5), model, ByteTokenizer())  # other draws
    with pytest.raises(TokenStoreError, match=r"differ at shard 0 .*different data; use a fresh data_dir"):
        make_data(_cfg(tmp_path, "b", prompts, n=6), model, NoSampling())


def test_a_foreign_manifest_is_refused(tmp_path):
    (tmp_path / "manifest.json").write_text('{"shards": []}')
    with pytest.raises(TokenStoreError, match="not a token store manifest"):
        load_token_manifest(tmp_path)


def test_sampling_precision_is_recorded_per_shard(tmp_path, model):
    """gen_dtype bfloat16: the data stage samples with a bf16 copy (the model is untouched), the
    features are stored as usual, and each new shard in the store records how it was sampled."""
    prompts = _prompts(tmp_path)
    make_data(_cfg(tmp_path, "bf16", prompts, n=6, gen_dtype="bfloat16"), model, ByteTokenizer())
    assert model.get_output_embeddings().weight.dtype == torch.float32
    store = load_token_manifest(tmp_path / "tokens")
    assert [(s["gen_dtype"], s["gen_batch_size"]) for s in store["shards"]] == [("bfloat16", 4)] * 2
    data = ShardDataset(tmp_path / "bf16", load_layers=True)
    assert len(data) == 6 and all(s.hidden.dtype == torch.float16 and s.layers is not None for s in data)


def test_gen_dtype_choices(tmp_path, model, monkeypatch):
    from eagle.config import ConfigError
    from eagle.train import trainer

    with pytest.raises(ConfigError, match=r"gen_dtype must be one of '', 'auto', 'float32', 'bfloat16', 'float16', got 'bf16'"):
        _cfg(tmp_path, "x", _prompts(tmp_path), gen_dtype="bf16")
    assert trainer.sampling_model(model, "") is model and trainer.sampling_model(model, "float32") is model
    monkeypatch.setattr("eagle.backends.native_bf16", lambda device="cpu": False)
    assert trainer.sampling_model(model, "auto") is model
    monkeypatch.setattr("eagle.backends.native_bf16", lambda device="cpu": True)
    low = trainer.sampling_model(model, "auto")
    assert low is not model and low.get_output_embeddings().weight.dtype == torch.bfloat16


def test_featurize_through_the_small_row_kernel(model, monkeypatch):
    """Where the kernel is chosen, the rebuild runs on a weight-sharing copy in batches of at most
    STREAM_TOKENS positions and gives the same features (up to fp16 rounding). featurize asks the
    given CPU backend's ``linear`` way (never / stream)."""
    import eagle.backends.cpu.packed as pk
    import eagle.train.tokens as tk
    from eagle_kernels import cpu_gemm

    if not cpu_gemm.available():
        pytest.skip(f"small-row kernel: {cpu_gemm.unavailable_reason()}")
    gen = torch.Generator().manual_seed(1)
    seqs = [torch.randint(2, V, (int(n),), generator=gen) for n in (5, 17, 9, 30, 12)]
    from eagle.backends.cpu import CpuBackend

    monkeypatch.setattr(tk, "_RUNNERS", tk.weakref.WeakKeyDictionary())
    ref = featurize(model, seqs, (1, 2), backend=CpuBackend(linear="never"))
    assert tk._RUNNERS[model] == (model, tk.FEATURIZE_TOKENS)  # the kernel not chosen: the model itself
    monkeypatch.setattr(tk, "_RUNNERS", tk.weakref.WeakKeyDictionary())
    monkeypatch.setattr(tk, "STREAM_TOKENS", 32)  # several batches
    out = featurize(model, seqs, (1, 2), backend=CpuBackend(linear="stream"))
    runner, limit = tk._RUNNERS[model]
    assert runner is not model and limit == 32
    assert any(isinstance(m, pk.PackedLinear) for m in runner.modules())
    for (h, f), (hr, fr) in zip(out, ref):
        torch.testing.assert_close(h.float(), hr.float(), atol=2e-3, rtol=1e-3)
        torch.testing.assert_close(f.float(), fr.float(), atol=2e-3, rtol=1e-3)
