"""Head checkpoint layouts (eagle/heads/formats.py): official EAGLE-1/2 and vLLM folders load through
``load_head``; ``export_head`` / ``eagle export`` write them; round trips draft exactly alike; every bad
folder is a one-line error naming the field or tensor.

The official checkpoints here are synthetic: written by hand with the key names and shapes of
SafeAILab/EAGLE's ``eagle/model/cnets1.py`` (``fc.*``, ``layers.0.*``, ``embed_tokens.weight``) and its
published configs (a one-layer ``LlamaForCausalLM`` config; ``"bias"`` absent = fc has a bias), not
through the module under test. Every model is a tiny random fp32 model (conftest.py).
"""
from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from eagle import Target
from eagle.draft import TreeShape
from eagle.draft.base import Sampling
from eagle.heads import DraftHead, HeadConfig, HeadError, HeadMismatchError, check_head, load_head, save_head
from eagle.heads.drafter import EagleDrafter
from eagle.heads.formats import LAYOUTS, LayerSpec, detect_layout, export_head

from conftest import TINY_HIDDEN, TINY_VOCAB, causal_mask, make_tiny_head_target, random_head, run_cli

H, V = TINY_HIDDEN, TINY_VOCAB
LAYER_KEYS = ["self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.o_proj.weight",
              "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight", "post_attention_layernorm.weight"]
QKV_BIAS = ["self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias"]


# ---- helpers ---------------------------------------------------------------------------------------


def official_config(model, **over) -> dict:
    """A config.json like the published EAGLE-1/2 ones (vicuna_7B_config.json), for ``model``'s layer."""
    c = model.config
    cfg = {"architectures": ["LlamaForCausalLM"], "bos_token_id": 0, "eos_token_id": 2, "hidden_act": "silu",
           "hidden_size": c.hidden_size, "initializer_range": 0.02, "intermediate_size": c.intermediate_size,
           "max_position_embeddings": 2048, "model_type": "llama", "num_attention_heads": c.num_attention_heads,
           "num_key_value_heads": c.num_key_value_heads, "num_hidden_layers": 1, "pad_token_id": 0,
           "rms_norm_eps": c.rms_norm_eps, "tie_word_embeddings": False, "torch_dtype": "float16",
           "transformers_version": "4.28.1", "use_cache": True, "vocab_size": c.vocab_size, "rope_theta": 10000.0}
    if c.model_type == "qwen2":
        cfg["qkv_bias"] = True
    cfg.update(over)
    return {k: v for k, v in cfg.items() if v is not None}


def official_state(head: DraftHead, model=None, embed_dtype=torch.float16) -> dict[str, torch.Tensor]:
    """``head``'s tensors under the official key names (written out here, not by the module under test),
    plus ``embed_tokens.weight`` (the target's, stored in ``embed_dtype``) when ``model`` is given."""
    sd = head.state_dict()
    keys = LAYER_KEYS + (QKV_BIAS if "layer.self_attn.q_proj.bias" in sd else [])
    state = {"fc.weight": sd["fc.weight"], "fc.bias": sd["fc.bias"]}
    state.update({f"layers.0.{k}": sd[f"layer.{k}"] for k in keys})
    if model is not None:
        state["embed_tokens.weight"] = model.get_input_embeddings().weight.detach().to(embed_dtype)
    return {k: v.clone().contiguous() for k, v in state.items()}


def write_official(folder: Path, config: dict, state: dict, fmt: str = "bin") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    if fmt == "bin":
        torch.save(state, folder / "pytorch_model.bin")
    else:
        save_file(state, str(folder / "model.safetensors"))
    return folder


def native_config(model, draft_vocab=(), with_target_config=True, target="tiny") -> HeadConfig:
    c = model.config.get_text_config(decoder=True)
    return HeadConfig(target=target, model_type=c.model_type, hidden_size=c.hidden_size, vocab_size=c.vocab_size,
                      draft_vocab=list(draft_vocab), target_config=c.to_dict() if with_target_config else {})


def assert_same_head(a: DraftHead, b: DraftHead, model) -> None:
    """Identical tensors, identical fc/layer outputs and identical draft top-k on random inputs."""
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert sa[k].dtype == sb[k].dtype and torch.equal(sa[k], sb[k]), k
    g = torch.Generator().manual_seed(5)
    T = 7
    f, e = torch.randn(2, T, H, generator=g), torch.randn(2, T, H, generator=g)
    pos = torch.arange(T)[None].expand(2, T)
    with torch.no_grad():
        assert torch.equal(a.fc(torch.cat([e, f], -1)), b.fc(torch.cat([e, f], -1)))
        oa, ob = a(f, e, pos, causal_mask(2, T)), b(f, e, pos, causal_mask(2, T))
    assert torch.equal(oa, ob)
    lm = model.get_output_embeddings()
    ta, tb = (oa @ a.lm_weight(lm).T).topk(5), (ob @ b.lm_weight(lm).T).topk(5)
    assert torch.equal(ta.indices, tb.indices) and torch.equal(ta.values, tb.values)


def drafted_tree(model, head, seed=0):
    """The dynamic EAGLE-2 tree ``EagleDrafter`` grows after a random prompt: (tokens, parents)."""
    target = Target(model, "reference")
    drafter = EagleDrafter(target, head, TreeShape(shape="dynamic", depth=4, top_k=3, total_tokens=12))
    prompt = torch.randint(0, V, (9,), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        feats = target.base(input_ids=prompt[None]).last_hidden_state[0]
    root = int(prompt[-1])
    drafter.reset(prompt)
    drafter.extend(feats, torch.cat([prompt[1:], prompt.new_tensor([root])]))
    tree = drafter.propose(root, Sampling())
    return tree.tokens.tolist(), tree.parents.tolist()


def assert_same_drafts(a, b, model) -> None:
    assert_same_head(a, b, model)
    for seed in (0, 1):
        ta = drafted_tree(model, a, seed)
        assert len(ta[0]) > 4  # a real tree was drafted
        assert drafted_tree(model, b, seed) == ta


def one_line(err) -> str:
    msg = str(err.value)
    assert "\n" not in msg
    return msg


# ---- import of the official layout ------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["bin", "safetensors"])
@pytest.mark.parametrize("arch", ["llama", "qwen2", "mistral"])
def test_official_checkpoint_loads_onto_its_target(tmp_path, arch, fmt):
    """A synthetic official head (exact key names, fp16 embedding) loads as the same head."""
    model = make_tiny_head_target(arch)
    ref = random_head(model, seed=3)
    folder = write_official(tmp_path / "off", official_config(model), official_state(ref, model), fmt)
    assert detect_layout(folder) == "eagle"
    loaded = load_head(folder, model)
    assert loaded.layout == "eagle" and not loaded.training
    assert loaded.draft_vocab.numel() == 0
    assert loaded.config.model_type == arch and loaded.config.hidden_size == H
    assert_same_head(ref, loaded, model)
    assert check_head(folder).hidden_size == H  # the cheap pre-load check reads it too


def test_official_fp16_checkpoint_loads_as_rounded_float32(tmp_path):
    model = make_tiny_head_target("llama")
    ref = random_head(model, seed=4)
    state = {k: v.half() for k, v in official_state(ref, model).items()}
    loaded = load_head(write_official(tmp_path / "off", official_config(model), state), model)
    for k, v in ref.state_dict().items():
        if k != "draft_vocab":
            assert loaded.state_dict()[k].dtype == torch.float32
            assert torch.equal(loaded.state_dict()[k], v.half().float()), k


def test_official_bias_false_means_a_zero_fc_bias(tmp_path):
    """cnets1 builds fc without a bias when config.json says "bias": false (the LLaMA3 heads)."""
    model = make_tiny_head_target("llama")
    ref = random_head(model, seed=5)
    with torch.no_grad():
        ref.fc.bias.zero_()
    state = official_state(ref)
    del state["fc.bias"]
    loaded = load_head(write_official(tmp_path / "nobias", official_config(model, bias=False), state), model)
    assert_same_head(ref, loaded, model)

    # "bias": false next to an fc.bias, or no "bias" key (= true) without one: ambiguous, refused
    write_official(tmp_path / "both", official_config(model, bias=False), official_state(ref))
    with pytest.raises(HeadMismatchError, match=r"says \"bias\": false but the weights hold fc\.bias") as err:
        load_head(tmp_path / "both", model)
    one_line(err)
    write_official(tmp_path / "none", official_config(model), state)
    with pytest.raises(HeadMismatchError, match=r"tensor 'fc\.bias' missing \(expected shape \[64\]\)") as err:
        load_head(tmp_path / "none", model)
    one_line(err)


def test_official_embedding_must_be_the_targets(tmp_path):
    """embed_tokens.weight is checked against the target's embedding (up to 16-bit rounding), never used."""
    model = make_tiny_head_target("llama")
    ref = random_head(model, seed=6)
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        folder = write_official(tmp_path / str(dtype), official_config(model), official_state(ref, model, dtype))
        assert_same_head(ref, load_head(folder, model), model)

    state = official_state(ref, model)
    state["embed_tokens.weight"][[3, 9]] = state["embed_tokens.weight"][[9, 3]]  # two ids swapped
    write_official(tmp_path / "swapped", official_config(model), state)
    with pytest.raises(HeadMismatchError, match=r"embed_tokens\.weight differs from the target's input embedding in "
                                                r"2 of 128 rows \(first: token 3\)") as err:
        load_head(tmp_path / "swapped", model)
    one_line(err)

    state["embed_tokens.weight"] = torch.zeros(V + 8, H)
    write_official(tmp_path / "bigger", official_config(model), state)
    with pytest.raises(HeadMismatchError, match=r"embed_tokens\.weight has shape \[136, 64\], the target's embedding "
                                                r"\[128, 64\]"):
        load_head(tmp_path / "bigger", model)


# ---- detection --------------------------------------------------------------------------------------


def test_detect_layout(tmp_path):
    model = make_tiny_head_target("llama")
    head = random_head(model)
    save_head(head, tmp_path / "native", native_config(model))
    assert detect_layout(tmp_path / "native") == "native"
    write_official(tmp_path / "bin", official_config(model), official_state(head), "bin")
    write_official(tmp_path / "st", official_config(model), official_state(head), "safetensors")
    assert detect_layout(tmp_path / "bin") == detect_layout(tmp_path / "st") == "eagle"
    state = official_state(head)
    del state["fc.bias"]
    write_official(tmp_path / "vllm", official_config(model, architectures=["EagleLlamaForCausalLM"]), state)
    assert detect_layout(tmp_path / "vllm") == "vllm"
    # an official EAGLE-3 head: by its architecture name or by its tensors
    write_official(tmp_path / "e3a", official_config(model, architectures=["LlamaForCausalLMEagle3"],
                                                     draft_vocab_size=32), {"fc.weight": torch.zeros(H, 3 * H)})
    write_official(tmp_path / "e3b", official_config(model), {"midlayer.mlp.up_proj.weight": torch.zeros(2, 2),
                                                              "d2t": torch.zeros(2, dtype=torch.long)})
    write_official(tmp_path / "e3c", official_config(model, architectures=["Eagle3LlamaForCausalLM"]),
                   {"fc.weight": torch.zeros(H, 3 * H)})
    assert detect_layout(tmp_path / "e3a") == detect_layout(tmp_path / "e3b") == "eagle3"
    assert detect_layout(tmp_path / "e3c") == "vllm-eagle3"
    # read by the EAGLE-3 reader (tests/test_heads_formats_eagle3.py), not as an EAGLE-1/2 head
    with pytest.raises(HeadError, match=r"e3a: tensor 'd2t' missing \(expected shape \[32\]\)") as err:
        load_head(tmp_path / "e3a", model)
    one_line(err)
    # not heads at all: the native reader's errors (a causal LM's keys sit under model.*)
    model.save_pretrained(tmp_path / "lm")
    assert detect_layout(tmp_path / "lm") == "native"
    assert detect_layout(tmp_path / "nowhere") == "native"
    with pytest.raises(HeadError, match=r"lm: not an EAGLE head .*causal LM folder"):
        load_head(tmp_path / "lm", model)
    # an official config whose weights file is missing
    (tmp_path / "noweights").mkdir()
    (tmp_path / "noweights" / "config.json").write_text(json.dumps(official_config(model)))
    assert detect_layout(tmp_path / "noweights") == "eagle"
    with pytest.raises(HeadError, match=r"noweights: no model\.safetensors or pytorch_model\.bin"):
        load_head(tmp_path / "noweights", model)


class NotATensor:
    """Pickled into a .bin: torch.load(weights_only=True) must refuse to build it."""

    built = 0

    def __init__(self):
        NotATensor.built += 1

    def __reduce__(self):  # unpickling would call NotATensor() again
        return (NotATensor, ())


def test_bin_with_a_pickled_object_is_refused_unbuilt(tmp_path):
    model = make_tiny_head_target("llama")
    state = official_state(random_head(model))
    state["payload"] = NotATensor()
    built = NotATensor.built
    write_official(tmp_path / "evil", official_config(model), state)
    for call in (lambda: load_head(tmp_path / "evil", model), lambda: detect_layout(tmp_path / "evil"),
                 lambda: check_head(tmp_path / "evil")):
        with pytest.raises(HeadError, match=r"evil/pytorch_model\.bin: refused by torch\.load\(weights_only=True\): "
                                            r"it holds a pickled .*NotATensor \(") as err:
            call()
        one_line(err)
    assert NotATensor.built == built  # never constructed by the load


@pytest.mark.parametrize("case", ["truncated", "a list", "not tensors"])
def test_bin_that_is_not_a_dict_of_tensors(tmp_path, case):
    model = make_tiny_head_target("llama")
    folder = write_official(tmp_path / "off", official_config(model), official_state(random_head(model)))
    path = folder / "pytorch_model.bin"
    if case == "truncated":
        path.write_bytes(path.read_bytes()[:200])
        message = r"pytorch_model\.bin: truncated or corrupt, not a readable PyTorch checkpoint \(RuntimeError"
    elif case == "a list":
        torch.save([torch.zeros(2)], path)
        message = r"pytorch_model\.bin: expected a dict of named tensors, got a list"
    else:
        torch.save({"fc.weight": torch.zeros(2), "step": 3}, path)
        message = r"pytorch_model\.bin: expected a dict of named tensors, got a dict holding other values"
    with pytest.raises(HeadError, match=message) as err:
        load_head(folder, model)
    one_line(err)


# ---- mismatched official folders: one line naming the field or tensor ----------------------------------


def _without(key):
    def edit(config, state):
        del state[key]
    return edit


def _reshape(key, shape):
    def edit(config, state):
        state[key] = torch.zeros(shape)
    return edit


def _add(key, shape):
    def edit(config, state):
        state[key] = torch.zeros(shape)
    return edit


def _set(**over):
    def edit(config, state):
        config.update(over)
    return edit


MISMATCHES = {
    "missing fc.weight": (_without("fc.weight"), r"tensor 'fc\.weight' missing \(expected shape \[64, 128\]\)"),
    "missing layer tensor": (_without("layers.0.mlp.up_proj.weight"),
                             r"tensor 'layers\.0\.mlp\.up_proj\.weight' missing \(expected shape \[128, 64\]\)"),
    "wrong fc shape": (_reshape("fc.weight", (H, 96)),
                       r"tensor 'fc\.weight' has shape \[64, 96\], expected \[64, 128\]"),
    "wrong layer shape": (_reshape("layers.0.self_attn.k_proj.weight", (H, H)),
                          r"tensor 'layers\.0\.self_attn\.k_proj\.weight' has shape \[64, 64\], expected \[32, 64\]"),
    "extra tensor": (_add("layers.0.input_layernorm.weight", (H,)),
                     r"unexpected tensor 'layers\.0\.input_layernorm\.weight' \[64\]"),
    "unknown tensor": (_add("lm_head.weight", (V, H)),
                       r"unexpected tensor 'lm_head\.weight' \[128, 64\] \(an EAGLE-1/2 head holds fc\.\*, layers\.0\.\*"),
    "second layer": (_add("layers.1.mlp.up_proj.weight", (128, H)),
                     r"unexpected tensor 'layers\.1\.mlp\.up_proj\.weight' \[128, 64\]"),
    "wrong hidden size": (_set(hidden_size=32), r"config\.json has hidden_size = 32, the target's layer has 64"),
    "wrong mlp width": (_set(intermediate_size=256), r"config\.json has intermediate_size = 256, the target's layer has 128"),
    "wrong kv heads": (_set(num_key_value_heads=4), r"num_key_value_heads = 4, the target's layer has 2"),
    "wrong eps": (_set(rms_norm_eps=1e-5), r"rms_norm_eps = 1e-05, the target's layer has 1e-06"),
    "wrong rope": (_set(rope_theta=500000.0), r"rope_theta = 500000\.0, the target's layer has 10000\.0"),
    "rope scaling": (_set(rope_scaling={"type": "linear", "factor": 2.0}),
                     r"rope_scaling = \{'rope_type': 'linear', 'factor': 2\.0\}, the target's layer has None"),
    "wrong vocab": (_set(vocab_size=96), r"vocab_size = 96, the target's layer has 128"),
    "qkv bias": (_set(qkv_bias=True), r"qkv_bias = True, the target's layer has False"),
    "two layers": (_set(num_hidden_layers=2), r"num_hidden_layers is 2; EAGLE-1/2 heads have one layer"),
    "no mlp width": (lambda c, s: c.pop("intermediate_size"), r"config\.json: no integer 'intermediate_size'"),
}


@pytest.mark.parametrize("case", list(MISMATCHES))
def test_mismatched_official_folder_is_one_line(tmp_path, case):
    model = make_tiny_head_target("llama")
    config, state = official_config(model), official_state(random_head(model))
    edit, message = MISMATCHES[case]
    edit(config, state)
    folder = write_official(tmp_path / "off", config, state, "safetensors")
    with pytest.raises(HeadError, match=message) as err:
        load_head(folder, model)
    msg = one_line(err)
    assert str(folder) in msg


def test_official_head_needs_a_llama_layer_target(tmp_path):
    """Qwen3's layer has q/k norms (and Gemma 3's differs more): an official Llama-layer head is refused."""
    llama = make_tiny_head_target("llama")
    folder = write_official(tmp_path / "off", official_config(llama), official_state(random_head(llama)))
    with pytest.raises(HeadMismatchError, match=r"holds a Llama decoder layer; it loads onto llama, mistral, qwen2 "
                                                r"targets, whose layer is one, not a 'qwen3' target") as err:
        load_head(folder, make_tiny_head_target("qwen3"))
    one_line(err)


# ---- export and round trips -----------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_native_to_official_to_load_drafts_identically(tmp_path, arch):
    model = make_tiny_head_target(arch)
    head = random_head(model, seed=8)
    save_head(head, tmp_path / "native", native_config(model))
    assert export_head(tmp_path / "native", "eagle", tmp_path / "off") == []
    assert sorted(p.name for p in (tmp_path / "off").iterdir()) == ["config.json", "model.safetensors"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["native", "off"]  # no temporary folder left
    cfg = json.loads((tmp_path / "off" / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["num_hidden_layers"] == 1
    assert "bias" not in cfg  # cnets1 defaults it to true; vLLM/SGLang would read it as attention bias
    assert cfg.get("qkv_bias", False) == (arch == "qwen2")
    assert (cfg["hidden_size"], cfg["intermediate_size"], cfg["num_key_value_heads"]) == (H, 128, 2)
    # the official key names and shapes, exactly
    assert {k: tuple(v.shape) for k, v in load_file(tmp_path / "off" / "model.safetensors").items()} == \
        {k: tuple(v.shape) for k, v in official_state(head).items()}
    loaded = load_head(tmp_path / "off", model)
    assert_same_drafts(load_head(tmp_path / "native", model), loaded, model)


def test_native_to_vllm_to_load_drafts_identically(tmp_path):
    model = make_tiny_head_target("llama")
    head = random_head(model, seed=9)
    with torch.no_grad():
        head.fc.bias.zero_()
    save_head(head, tmp_path / "native", native_config(model))
    notes = export_head(tmp_path / "native", "vllm", tmp_path / "vllm")
    assert notes == ["fc.bias is all zeros and is not written (vLLM's EAGLE-1 fc has no bias)"]
    cfg = json.loads((tmp_path / "vllm" / "config.json").read_text())
    assert cfg["architectures"] == ["EagleLlamaForCausalLM"] and "bias" not in cfg
    assert "fc.bias" not in load_file(tmp_path / "vllm" / "model.safetensors")
    assert detect_layout(tmp_path / "vllm") == "vllm"
    assert_same_drafts(head, load_head(tmp_path / "vllm", model), model)


def test_vllm_refuses_a_non_zero_fc_bias(tmp_path):
    """vLLM's EagleLlamaForCausalLM has fc without bias; a trained bias cannot be folded away."""
    model = make_tiny_head_target("llama")
    save_head(random_head(model), tmp_path / "native", native_config(model))
    with pytest.raises(HeadError, match=r"has a non-zero fc\.bias \(max \|b\| = .*\), which vLLM's "
                                        r"EagleLlamaForCausalLM cannot hold .*export --format eagle instead") as err:
        export_head(tmp_path / "native", "vllm", tmp_path / "vllm")
    one_line(err)
    assert not (tmp_path / "vllm").exists()


@pytest.mark.parametrize("fmt", ["bin", "safetensors"])
def test_official_to_load_to_export_to_load(tmp_path, fmt):
    """official -> load -> export (from the loaded head, and from the folder) -> load: the same drafts."""
    model = make_tiny_head_target("qwen2")
    ref = random_head(model, seed=10)
    folder = write_official(tmp_path / "off", official_config(model), official_state(ref, model), fmt)
    loaded = load_head(folder, model)
    export_head(loaded, "eagle", tmp_path / "again")
    assert_same_drafts(loaded, load_head(tmp_path / "again", model), model)
    notes = export_head(folder, "eagle", tmp_path / "from-folder")
    assert notes == ["embed_tokens.weight is not written: every loader takes the target's embedding"]
    assert_same_drafts(loaded, load_head(tmp_path / "from-folder", model), model)
    # the loaded head keeps the target's config, so it can be saved and exported as ours too
    save_head(loaded, tmp_path / "native", loaded.config)
    export_head(tmp_path / "native", "eagle", tmp_path / "via-native")
    assert load_file(tmp_path / "via-native" / "model.safetensors").keys() == \
        load_file(tmp_path / "again" / "model.safetensors").keys()
    assert_same_drafts(loaded, load_head(tmp_path / "via-native", model), model)


def test_export_keeps_the_stored_precision(tmp_path):
    model = make_tiny_head_target("llama")
    ref = random_head(model, seed=11)
    state = {k: v.half() for k, v in official_state(ref).items()}
    folder = write_official(tmp_path / "off", official_config(model), state)
    export_head(folder, "eagle", tmp_path / "out")
    assert json.loads((tmp_path / "out" / "config.json").read_text())["torch_dtype"] == "float16"
    written = load_file(tmp_path / "out" / "model.safetensors")
    assert all(v.dtype == torch.float16 and torch.equal(v, state[k]) for k, v in written.items())


def test_reduced_draft_vocabulary_needs_full_vocab(tmp_path):
    """The layouts cannot store HeadConfig.draft_vocab: export refuses unless told to drop it, and the
    exported head then drafts over the full vocabulary (the native head without its restriction)."""
    model = make_tiny_head_target("llama")
    dv = torch.tensor(sorted(random.Random(0).sample(range(V), 40)))
    head = random_head(model, seed=12, draft_vocab=dv)
    save_head(head, tmp_path / "native", native_config(model, dv.tolist()))
    with pytest.raises(HeadError, match=r"drafts over a reduced vocabulary \(40 of 128 tokens\) that the eagle layout "
                                        r"cannot store; add --full-vocab to export it drafting over all 128 tokens") as err:
        export_head(tmp_path / "native", "eagle", tmp_path / "off")
    one_line(err)
    notes = export_head(tmp_path / "native", "eagle", tmp_path / "off", full_vocab=True)
    assert notes == ["the draft vocabulary (40 of 128 tokens) is not exported: the exported head drafts over all "
                     "128 tokens"]
    loaded = load_head(tmp_path / "off", model)
    assert loaded.draft_vocab.numel() == 0
    unrestricted = load_head(tmp_path / "native", model)
    unrestricted.draft_vocab = torch.arange(0)
    assert_same_drafts(unrestricted, loaded, model)


def test_export_refusals(tmp_path):
    model = make_tiny_head_target("llama")
    save_head(random_head(model), tmp_path / "native", native_config(model))
    with pytest.raises(HeadError, match=r"head \S+native is an EAGLE-1/2 head; eagle3 export needs an EAGLE-3 head$"):
        export_head(tmp_path / "native", "eagle3", tmp_path / "e3")
    with pytest.raises(HeadError, match=r"--out \S+native is the head folder itself"):
        export_head(tmp_path / "native", "eagle", tmp_path / "native")
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    with pytest.raises(HeadError, match=r"--out \S+busy exists and holds other files \(notes\.txt\)"):
        export_head(tmp_path / "native", "eagle", tmp_path / "busy")
    (tmp_path / "file").write_text("x")
    with pytest.raises(HeadError, match=r"--out \S+file exists and is not a folder"):
        export_head(tmp_path / "native", "eagle", tmp_path / "file")
    # a previous export (or an empty folder) is replaced
    (tmp_path / "empty").mkdir()
    export_head(tmp_path / "native", "eagle", tmp_path / "empty")
    export_head(tmp_path / "native", "eagle", tmp_path / "empty")
    assert sorted(p.name for p in (tmp_path / "empty").iterdir()) == ["config.json", "model.safetensors"]

    # a layer that is not a Llama layer (Qwen3: q/k norms) has no place in these layouts
    qwen3 = make_tiny_head_target("qwen3")
    save_head(random_head(qwen3), tmp_path / "q3", native_config(qwen3))
    with pytest.raises(HeadError, match=r"trained for a 'qwen3' target, whose decoder layer is not a Llama layer") as err:
        export_head(tmp_path / "q3", "eagle", tmp_path / "q3-out")
    one_line(err)


def test_export_checks_the_weights_against_the_layer(tmp_path):
    """Weights that do not fit the stored target config are refused by tensor name."""
    model = make_tiny_head_target("llama")
    save_head(random_head(model), tmp_path / "native", native_config(model))
    sd = load_file(tmp_path / "native" / "model.safetensors")
    sd["layer.self_attn.o_proj.bias"] = torch.zeros(H)
    save_file(sd, str(tmp_path / "native" / "model.safetensors"))
    with pytest.raises(HeadError, match=r"cannot be exported as eagle: unexpected tensor "
                                        r"'layer\.self_attn\.o_proj\.bias' \[64\]"):
        export_head(tmp_path / "native", "eagle", tmp_path / "out")


def test_official_config_cannot_state_every_rope(tmp_path):
    """cnets1 knows linear and dynamic RoPE scaling only; vLLM takes the others."""
    import transformers as tf

    torch.manual_seed(0)
    cfg = tf.LlamaConfig(vocab_size=V, hidden_size=H, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
                         num_key_value_heads=2, rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0,
                                                                 "original_max_position_embeddings": 256})
    model = tf.LlamaForCausalLM(cfg).eval()
    head = random_head(model)
    with torch.no_grad():
        head.fc.bias.zero_()
    save_head(head, tmp_path / "native", native_config(model))
    with pytest.raises(HeadError, match=r"cannot be exported as eagle: the official code knows RoPE scaling linear "
                                        r"and dynamic"):
        export_head(tmp_path / "native", "eagle", tmp_path / "off")
    export_head(tmp_path / "native", "vllm", tmp_path / "vllm")
    written = json.loads((tmp_path / "vllm" / "config.json").read_text())
    assert written["rope_scaling"]["rope_type"] == "yarn" and written["rope_scaling"]["factor"] == 4.0
    assert_same_head(head, load_head(tmp_path / "vllm", model), model)


def test_native_head_without_target_config_reads_its_target(tmp_path):
    """Heads trained so far store no target_config: export reads the layer's config from the target."""
    model = make_tiny_head_target("llama")
    model.save_pretrained(tmp_path / "target")
    head = random_head(model, seed=13)
    save_head(head, tmp_path / "native", native_config(model, with_target_config=False, target=str(tmp_path / "target")))
    export_head(tmp_path / "native", "eagle", tmp_path / "off")
    assert_same_head(head, load_head(tmp_path / "off", model), model)

    save_head(head, tmp_path / "lost", native_config(model, with_target_config=False, target="no-such-target"))
    with pytest.raises(HeadError, match=r"stores no target_config, and its target cannot be read .*unknown target "
                                        r"'no-such-target'") as err:
        export_head(tmp_path / "lost", "eagle", tmp_path / "lost-out")
    one_line(err)


def test_layout_table():
    """A layout is a row: renames both ways, and a config builder (the EAGLE-3 rows: test_heads_formats_eagle3.py)."""
    spec = LayerSpec.of_target(make_tiny_head_target("qwen2").config.to_dict())
    for lay in (LAYOUTS["eagle"], LAYOUTS["vllm"]):
        assert lay.kind == "eagle"
        for ours in spec.tensors():
            assert lay.from_file(lay.to_file(ours)) == ours
        assert lay.build_config(spec, "float32", None)["architectures"] == [lay.architecture]
    assert LAYOUTS["eagle"].to_file("layer.mlp.up_proj.weight") == "layers.0.mlp.up_proj.weight"
    assert LAYOUTS["eagle"].from_file("embed_tokens.weight") is None


# ---- the command line -----------------------------------------------------------------------------------


def test_cli_export(tmp_path, capsys):
    model = make_tiny_head_target("llama")
    head = random_head(model, seed=14)
    save_head(head, tmp_path / "native", native_config(model))
    code, out, err = run_cli(["export", "--head", str(tmp_path / "native"), "--format", "eagle",
                              "--out", str(tmp_path / "off")], capsys)
    assert code == 0 and err == ""
    assert out == f"wrote {tmp_path / 'off'}: eagle layout (config.json + model.safetensors)\n"
    assert_same_drafts(head, load_head(tmp_path / "off", model), model)
    # and back from the official layout to vLLM's (refused: the trained fc.bias is not zero)
    code, out, err = run_cli(["export", "--head", str(tmp_path / "off"), "--format", "vllm",
                              "--out", str(tmp_path / "vllm")], capsys)
    assert code == 2 and out == "" and err.count("\n") == 1
    assert err.startswith(f"eagle: error: head {tmp_path / 'off'} has a non-zero fc.bias")


def test_cli_export_full_vocab_note(tmp_path, capsys):
    model = make_tiny_head_target("llama")
    save_head(random_head(model, draft_vocab=torch.arange(0, V, 2)), tmp_path / "native",
              native_config(model, list(range(0, V, 2))))
    args = ["export", "--head", str(tmp_path / "native"), "--format", "eagle", "--out", str(tmp_path / "off")]
    code, out, err = run_cli(args, capsys)
    assert code == 2 and out == "" and err.count("\n") == 1 and "add --full-vocab" in err
    code, out, err = run_cli(args + ["--full-vocab"], capsys)
    assert code == 0 and out.splitlines()[0] == ("note: the draft vocabulary (64 of 128 tokens) is not exported: "
                                                 "the exported head drafts over all 128 tokens")


@pytest.mark.parametrize("case", ["eagle3", "no head", "not a head", "bad format", "no out"])
def test_cli_export_errors_are_one_line(tmp_path, capsys, case):
    model = make_tiny_head_target("llama")
    save_head(random_head(model), tmp_path / "native", native_config(model))
    (tmp_path / "junk").mkdir()
    head = {"no head": tmp_path / "missing", "not a head": tmp_path / "junk"}.get(case, tmp_path / "native")
    args = ["export", "--head", str(head), "--format", {"eagle3": "eagle3", "bad format": "onnx"}.get(case, "eagle")]
    if case != "no out":
        args += ["--out", str(tmp_path / "out")]
    try:
        code, out, err = run_cli(args, capsys)
    except SystemExit as e:  # argument errors exit from the parser
        code, (out, err) = e.code, capsys.readouterr()
    assert code == 2 and out == "" and err.count("\n") == 1 and err.startswith("eagle: error: ")
    assert {"eagle3": f"head {head} is an EAGLE-1/2 head; eagle3 export needs an EAGLE-3 head",
            "no head": "no head checkpoint at", "not a head": "not an EAGLE head (no config.json",
            "bad format": "argument --format: invalid choice: 'onnx'",
            "no out": "the following arguments are required: --out"}[case] in err
    assert not (tmp_path / "out").exists()
