"""EAGLE-3 head layouts (eagle/heads/formats.py): official EAGLE-3 (SafeAILab/EAGLE, SGLang's
``LlamaForCausalLMEagle3``) and vLLM (``Eagle3LlamaForCausalLM``) folders load through ``load_head``;
``export_head`` / ``eagle export --format eagle3|vllm`` write them; round trips give identical weights
and identical drafts; every bad folder is a one-line error naming the field or tensor.

The official checkpoints here are synthetic: written by hand with the key names and shapes of
SafeAILab/EAGLE's ``eagle/model/cnets.py`` (``fc.weight`` [H, 3H] without bias, ``midlayer.*`` with
q/k/v over 2H, ``norm.weight``, ``lm_head.weight`` [draft_vocab, H], ``d2t`` int64 offsets, ``t2d``
bool) and the config of ``eagle/traineagle3/config.json`` (a one-layer Llama config plus
``draft_vocab_size``, no ``rope_theta``), not through the module under test.

The official code fuses target layers ``(2, L//2, L-3)``, three distinct layers only from L = 7 on,
so the targets here are tiny random 8-layer fp32 models (default layers (2, 4, 5)).
"""
from __future__ import annotations

import json
import random

import pytest
import torch
from safetensors.torch import load_file, save_file

from eagle import Target, TreeDecoder
from eagle.draft import TreeShape
from eagle.heads import HeadConfig, HeadError, HeadMismatchError, check_head, load_head, save_head
from eagle.heads.drafter import EagleDrafter
from eagle.heads.eagle3 import Eagle3Head, default_feature_layers
from eagle.heads.formats import LAYOUTS, LayerSpec, detect_layout, export_head

from conftest import TINY_HIDDEN, TINY_VOCAB, causal_mask, make_tiny_head_target, random_head, run_cli

H, V = TINY_HIDDEN, TINY_VOCAB
LAYERS = 8
DEFAULT = (2, 4, 5)  # default_feature_layers(8)
DRAFT = 40
# the official key names, in cnets.Model's order
OFFICIAL_KEYS = ["fc.weight", "midlayer.self_attn.q_proj.weight", "midlayer.self_attn.k_proj.weight",
                 "midlayer.self_attn.v_proj.weight", "midlayer.self_attn.o_proj.weight", "midlayer.mlp.gate_proj.weight",
                 "midlayer.mlp.up_proj.weight", "midlayer.mlp.down_proj.weight", "midlayer.hidden_norm.weight",
                 "midlayer.input_layernorm.weight", "midlayer.post_attention_layernorm.weight", "norm.weight",
                 "lm_head.weight", "d2t", "t2d"]

_TARGETS: dict = {}


def deep_target(arch: str = "llama", rope_theta: float = 10000.0, seed: int = 0):
    """A random 8-layer fp32 model (vocabulary 128, hidden 64, 4 query / 2 KV heads, MLP 128), embeddings
    x4, LM head x30 (peaked greedy margins), layers' output projections x2. Cached: do not modify."""
    key = (arch, rope_theta, seed)
    if key not in _TARGETS:
        import transformers as tf

        common = dict(vocab_size=V, hidden_size=H, intermediate_size=128, num_hidden_layers=LAYERS,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      tie_word_embeddings=False, bos_token_id=0, eos_token_id=None, pad_token_id=0,
                      rope_parameters={"rope_type": "default", "rope_theta": rope_theta})
        cfg = {"llama": tf.LlamaConfig, "qwen2": tf.Qwen2Config}.get(arch)
        cfg = cfg(**common) if cfg else tf.Qwen3Config(head_dim=16, **common)
        torch.manual_seed(seed)
        model = tf.AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa", dtype=torch.float32)
        with torch.no_grad():
            model.get_input_embeddings().weight.mul_(4.0)
            model.get_output_embeddings().weight.mul_(30.0)
            for layer in model.model.layers:
                layer.self_attn.o_proj.weight.mul_(2.0)
                layer.mlp.down_proj.weight.mul_(2.0)
        model.eval().requires_grad_(False)
        model.generation_config.eos_token_id = None
        model.generation_config.pad_token_id = 0
        model.generation_config.bos_token_id = 0
        _TARGETS[key] = model
    return _TARGETS[key]


def draft_ids(n: int = DRAFT, seed: int = 0) -> torch.Tensor:
    return torch.tensor(sorted(random.Random(seed).sample(range(V), n)))


def random_e3(model, seed: int = 1, ids=None, layers=DEFAULT, scale: float = 0.1) -> Eagle3Head:
    torch.manual_seed(seed)
    head = Eagle3Head.for_target(model, ids, layers)
    with torch.no_grad():
        for name, p in head.named_parameters():
            p.add_(torch.randn_like(p) * scale)
            if name.endswith("_proj.bias"):  # a Qwen2 target's layer: the official layer has no q/k/v bias
                p.zero_()
    return head.eval()


def official_config(model, draft: int = DRAFT, **over) -> dict:
    """A config.json like eagle/traineagle3/config.json (the published LLaMA-3.1 EAGLE-3 head's) for ``model``."""
    c = model.config
    cfg = {"architectures": ["LlamaForCausalLMEagle3"], "bos_token_id": 0, "eos_token_id": 2, "hidden_act": "silu",
           "hidden_size": c.hidden_size, "initializer_range": 0.02, "intermediate_size": c.intermediate_size,
           "max_position_embeddings": 2048, "model_type": "llama", "num_attention_heads": c.num_attention_heads,
           "num_key_value_heads": c.num_key_value_heads, "num_hidden_layers": 1, "pad_token_id": 0,
           "rms_norm_eps": c.rms_norm_eps, "tie_word_embeddings": False, "torch_dtype": "float16",
           "transformers_version": "4.28.1", "use_cache": True, "vocab_size": c.vocab_size, "draft_vocab_size": draft}
    cfg.update(over)
    return {k: v for k, v in cfg.items() if v is not None}


def official_state(head: Eagle3Head, prefix: str = "midlayer.", dtype=None) -> dict[str, torch.Tensor]:
    """``head``'s tensors under the official key names (listed here, not taken from the module under test)."""
    sd = head.state_dict()
    state = {k.replace("midlayer.", prefix): sd[k].detach().clone().contiguous() for k in OFFICIAL_KEYS}
    if dtype is not None:
        state = {k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()}
    return state


def write_folder(folder, config: dict, state: dict, fmt: str = "bin"):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    if fmt == "bin":
        torch.save(state, folder / "pytorch_model.bin")
    else:
        save_file(state, str(folder / "model.safetensors"))
    return folder


def native_config(model, layers=DEFAULT, with_target_config: bool = True, target: str = "tiny") -> HeadConfig:
    c = model.config.get_text_config(decoder=True)
    return HeadConfig(target=target, model_type=c.model_type, hidden_size=c.hidden_size, vocab_size=c.vocab_size,
                      target_config=c.to_dict() if with_target_config else {}, type="eagle3",
                      feature_layers=list(layers))


class Recording(EagleDrafter):
    def reset(self, prompt_ids):
        super().reset(prompt_ids)
        self.trees = []

    def propose(self, root, sampling):
        tree = super().propose(root, sampling)
        self.trees.append((tree.tokens.tolist(), tree.parents.tolist()))
        return tree


def drafts(model, head, seed: int = 0):
    """(generated tokens, every drafted tree) of a lossless EAGLE-2 decode with ``head``."""
    target = Target(model, "reference")
    dr = Recording(target, head, TreeShape(shape="dynamic", depth=4, top_k=3, total_tokens=12))
    prompt = torch.randint(0, V, (9,), generator=torch.Generator().manual_seed(seed))
    out = TreeDecoder(target, dr).generate(prompt, 12)
    return out.tokens, dr.trees


def assert_same_head(a: Eagle3Head, b: Eagle3Head) -> None:
    """Identical tensors (names, dtypes, values), layers, vocabulary maps and head outputs."""
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert sa[k].dtype == sb[k].dtype and torch.equal(sa[k], sb[k]), k
    assert a.feature_layers == b.feature_layers and torch.equal(a.draft_ids, b.draft_ids)
    g = torch.Generator().manual_seed(5)
    T = 7
    h, e, f = torch.randn(2, T, H, generator=g), torch.randn(2, T, H, generator=g), torch.randn(2, T, 3 * H, generator=g)
    pos = torch.arange(T)[None].expand(2, T)
    with torch.no_grad():
        assert torch.equal(a.enter(f), b.enter(f))
        oa, ob = a(h, e, pos, causal_mask(2, T)), b(h, e, pos, causal_mask(2, T))
        assert torch.equal(oa, ob)
        assert torch.equal(a.lm_head(a.norm(oa)), b.lm_head(b.norm(ob)))


def assert_same_drafts(a, b, model) -> None:
    assert_same_head(a, b)
    for seed in (0, 1):
        tokens, trees = drafts(model, a, seed)
        assert len(trees) > 2 and max(len(t[0]) for t in trees) > 4  # real trees were drafted
        assert drafts(model, b, seed) == (tokens, trees)


def one_line(err) -> str:
    msg = str(err.value)
    assert "\n" not in msg
    return msg


# ---- the feature layers ----------------------------------------------------------------------------------


def test_default_feature_layers_are_the_official_ones():
    """eagle/model/modeling_llama_kv.py collects the hidden state entering layers idx == 2, L//2, L-3
    (in layer order); vLLM's and SGLang's get_eagle3_aux_hidden_state_layers default to the same."""
    assert default_feature_layers(32) == (2, 16, 29)  # Llama-3.1-8B
    assert default_feature_layers(80) == (2, 40, 77)
    assert default_feature_layers(LAYERS) == DEFAULT
    assert default_feature_layers(6) == (2, 3, 3)  # not three distinct layers: refused below


def test_default_layers_must_be_three_distinct_layers(tmp_path):
    model = make_tiny_head_target("llama")  # 2 layers: (2, 1, -1)
    head = Eagle3Head.for_target(model, draft_ids(), (0, 1, 2))
    folder = write_folder(tmp_path / "off", official_config(model), official_state(head))
    with pytest.raises(HeadMismatchError, match=r"names no target layers, and the official default \(2, L//2, L-3\) = "
                                                r"\[2, 1, -1\] are not three increasing layers of this 2-layer target") as err:
        load_head(folder, model)
    one_line(err)


# ---- import of the official layout --------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["bin", "safetensors"])
def test_official_checkpoint_loads_onto_its_target(tmp_path, fmt):
    """A synthetic official EAGLE-3 head (exact key names, .bin or .safetensors) loads as the same head,
    fusing the default layers, with its d2t / t2d."""
    model = deep_target()
    ids = draft_ids()
    ref = random_e3(model, seed=3, ids=ids)
    folder = write_folder(tmp_path / "off", official_config(model), official_state(ref), fmt)
    assert detect_layout(folder) == "eagle3"
    loaded = load_head(folder, model)
    assert isinstance(loaded, Eagle3Head) and loaded.layout == "eagle3" and not loaded.training
    assert loaded.feature_layers == DEFAULT and loaded.config.feature_layers == list(DEFAULT)
    assert loaded.config.type == "eagle3" and loaded.config.model_type == "llama"
    assert torch.equal(loaded.draft_ids, ids)  # target id = draft id + d2t[draft id]
    assert loaded.d2t.dtype == torch.int64 and loaded.t2d.dtype == torch.bool
    assert torch.equal(loaded.t2d.nonzero().flatten(), ids)
    assert_same_drafts(ref, loaded, model)
    cfg = check_head(folder)  # the cheap pre-load check reads it too
    assert (cfg.type, cfg.hidden_size, cfg.feature_layers) == ("eagle3", H, [])


def test_official_fp16_checkpoint_loads_as_rounded_float32(tmp_path):
    model = deep_target()
    ref = random_e3(model, seed=4, ids=draft_ids())
    folder = write_folder(tmp_path / "off", official_config(model), official_state(ref, dtype=torch.float16))
    loaded = load_head(folder, model)
    for k, v in ref.state_dict().items():
        got = loaded.state_dict()[k]
        assert got.dtype == v.dtype, k
        assert torch.equal(got, v.half().float() if v.is_floating_point() else v), k


def test_full_vocabulary_head_without_d2t(tmp_path):
    """draft_vocab_size == vocab_size: the official loader drops d2t / t2d, so they may be absent."""
    model = deep_target()
    ref = random_e3(model, seed=5)
    state = official_state(ref)
    del state["d2t"], state["t2d"]
    loaded = load_head(write_folder(tmp_path / "off", official_config(model, draft=V), state), model)
    assert torch.equal(loaded.d2t, torch.zeros(V, dtype=torch.long)) and bool(loaded.t2d.all())
    assert_same_head(ref, loaded)


def test_vllm_folder_with_its_own_layer_names_and_layers(tmp_path):
    """vLLM: Eagle3LlamaForCausalLM, eagle_aux_hidden_state_layer_ids (the hidden states entering those
    layers, like ours), 'layers.0.*' for 'midlayer.*' (its loader maps one to the other), t2d unused."""
    model = deep_target()
    ref = random_e3(model, seed=6, ids=draft_ids(), layers=(1, 3, 6))
    state = official_state(ref, prefix="layers.0.")
    del state["t2d"]
    config = official_config(model, architectures=["Eagle3LlamaForCausalLM"], eagle_aux_hidden_state_layer_ids=[1, 3, 6])
    folder = write_folder(tmp_path / "vllm", config, state, "safetensors")
    assert detect_layout(folder) == "vllm-eagle3"
    loaded = load_head(folder, model)
    assert loaded.layout == "vllm-eagle3" and loaded.feature_layers == (1, 3, 6)
    assert torch.equal(loaded.t2d, ref.t2d)  # derived from d2t
    assert_same_drafts(ref, loaded, model)
    assert check_head(folder).feature_layers == [1, 3, 6]


def test_sglang_eagle_config_layers_are_layer_outputs(tmp_path):
    """SGLang reads eagle_config.eagle_aux_hidden_state_layer_ids as layer outputs (it captures before
    layer i + 1): hidden_states[i + 1]. Both keys must agree when both are given."""
    model = deep_target()
    ref = random_e3(model, seed=7, ids=draft_ids(), layers=(1, 3, 6))
    folder = write_folder(tmp_path / "sg", official_config(model, eagle_config={"eagle_aux_hidden_state_layer_ids":
                                                                                [0, 2, 5]}), official_state(ref))
    loaded = load_head(folder, model)
    assert loaded.feature_layers == (1, 3, 6)
    assert_same_head(ref, loaded)
    write_folder(tmp_path / "both", official_config(model, eagle_aux_hidden_state_layer_ids=[1, 3, 6],
                                                    eagle_config={"eagle_aux_hidden_state_layer_ids": [0, 2, 5]}),
                 official_state(ref))
    assert load_head(tmp_path / "both", model).feature_layers == (1, 3, 6)
    write_folder(tmp_path / "clash", official_config(model, eagle_aux_hidden_state_layer_ids=[1, 3, 6],
                                                     eagle_config={"eagle_aux_hidden_state_layer_ids": [1, 3, 6]}),
                 official_state(ref))
    with pytest.raises(HeadMismatchError, match=r"eagle_aux_hidden_state_layer_ids \[1, 3, 6\] \(vLLM: the inputs of "
                                                r"those layers\) and eagle_config\.eagle_aux_hidden_state_layer_ids "
                                                r"\[1, 3, 6\] \(SGLang: their outputs, i\.e\. inputs \[2, 4, 7\]\)") as err:
        load_head(tmp_path / "clash", model)
    one_line(err)


def test_the_head_keeps_its_own_rope(tmp_path):
    """The official LLaMA-3.1 EAGLE-3 config has no rope_theta (cnets: base 10000) while the target's is
    500000: every loader builds the draft layer from the draft config, so the imported head keeps base
    10000, through a native save, a vLLM export and an official export."""
    plain, wide = deep_target(), deep_target(rope_theta=500000.0)  # same weights, other RoPE base
    ref = random_e3(plain, seed=8, ids=draft_ids())  # built with base 10000
    folder = write_folder(tmp_path / "off", official_config(plain), official_state(ref))
    loaded = load_head(folder, wide)
    assert loaded.layer_config.rope_parameters["rope_theta"] == 10000.0
    assert wide.config.rope_parameters["rope_theta"] == 500000.0
    assert_same_head(ref, loaded)
    # native: HeadConfig.target_config carries the head's own layer
    save_head(loaded, tmp_path / "native", loaded.config)
    assert_same_drafts(loaded, load_head(tmp_path / "native", wide), wide)
    for fmt, arch in (("vllm", "Eagle3LlamaForCausalLM"), ("eagle3", "LlamaForCausalLMEagle3")):
        export_head(tmp_path / "native", fmt, tmp_path / fmt)
        written = json.loads((tmp_path / fmt / "config.json").read_text())
        assert written["architectures"] == [arch] and written["rope_theta"] == 10000.0
        assert_same_drafts(loaded, load_head(tmp_path / fmt, wide), wide)
    # a target-sized head read with the target's own RoPE would differ
    assert not torch.equal(Eagle3Head.for_target(wide, draft_ids(), DEFAULT).rotary.inv_freq, loaded.rotary.inv_freq)


def test_the_head_keeps_its_own_mlp_width(tmp_path):
    """intermediate_size (like heads and norm eps) is the head's own; its tensors must fit its config."""
    model = deep_target()
    other = deep_target(seed=1)
    import transformers as tf

    narrow_cfg = tf.LlamaConfig(**{**model.config.to_dict(), "intermediate_size": 96})
    narrow = tf.AutoModelForCausalLM.from_config(narrow_cfg, dtype=torch.float32).eval()
    ref = random_e3(narrow, seed=9, ids=draft_ids())
    assert ref.midlayer.mlp.up_proj.weight.shape == (96, H)
    folder = write_folder(tmp_path / "off", official_config(narrow), official_state(ref))
    loaded = load_head(folder, other)
    assert_same_head(ref, loaded)
    export_head(loaded, "vllm", tmp_path / "vllm")
    assert json.loads((tmp_path / "vllm" / "config.json").read_text())["intermediate_size"] == 96
    assert_same_drafts(loaded, load_head(tmp_path / "vllm", other), other)
    # a config that says 96 next to tensors of 128 rows
    write_folder(tmp_path / "bad", official_config(model, intermediate_size=96),
                 official_state(random_e3(model, ids=draft_ids())))
    with pytest.raises(HeadMismatchError, match=r"does not fit its config\.json: tensor 'midlayer\.mlp\.gate_proj\.weight' "
                                                r"has shape \[128, 64\], expected \[96, 64\]"):
        load_head(tmp_path / "bad", model)


def test_embedding_in_the_file_must_be_the_targets(tmp_path):
    model = deep_target()
    ref = random_e3(model, seed=10, ids=draft_ids())
    state = official_state(ref)
    state["embed_tokens.weight"] = model.get_input_embeddings().weight.detach().half()
    folder = write_folder(tmp_path / "off", official_config(model), state)
    assert_same_head(ref, load_head(folder, model))
    notes = export_head(folder, "eagle3", tmp_path / "again")
    assert notes == ["embed_tokens.weight is not written: every loader takes the target's embedding"]
    state["embed_tokens.weight"] = deep_target(seed=1).get_input_embeddings().weight.detach().clone()
    write_folder(tmp_path / "other", official_config(model), state)
    with pytest.raises(HeadMismatchError, match=r"embed_tokens\.weight differs from the target's input embedding"):
        load_head(tmp_path / "other", model)


class NotATensor:
    """Pickled into a .bin: torch.load(weights_only=True) must refuse to build it."""

    built = 0

    def __init__(self):
        NotATensor.built += 1

    def __reduce__(self):
        return (NotATensor, ())


def test_bin_with_a_pickled_object_is_refused_unbuilt(tmp_path):
    model = deep_target()
    state = official_state(random_e3(model, ids=draft_ids()))
    state["payload"] = NotATensor()
    built = NotATensor.built
    write_folder(tmp_path / "evil", official_config(model), state)
    assert detect_layout(tmp_path / "evil") == "eagle3"  # from config.json alone
    for call in (lambda: load_head(tmp_path / "evil", model), lambda: check_head(tmp_path / "evil"),
                 lambda: export_head(tmp_path / "evil", "vllm", tmp_path / "out")):
        with pytest.raises(HeadError, match=r"evil/pytorch_model\.bin: refused by torch\.load\(weights_only=True\): "
                                            r"it holds a pickled .*NotATensor \(") as err:
            call()
        one_line(err)
    assert NotATensor.built == built
    assert not (tmp_path / "out").exists()


# ---- mismatched folders: one line naming the field or tensor -------------------------------------------------


def _without(key):
    def edit(config, state):
        del state[key]
    return edit


def _tensor(key, value):
    def edit(config, state):
        state[key] = value() if callable(value) else value
    return edit


def _set(**over):
    def edit(config, state):
        config.update(over)
    return edit


def _flip_t2d(config, state):
    state["t2d"] = state["t2d"].clone()
    state["t2d"][int((~state["t2d"]).nonzero()[0])] = True


def _d2t_out_of_range(config, state):
    state["d2t"] = state["d2t"].clone()
    state["d2t"][-1] += V


def _d2t_duplicate(config, state):
    state["d2t"] = state["d2t"].clone()
    state["d2t"][1] = state["d2t"][0] - 1  # draft id 1 -> the target id of draft id 0


MISMATCHES = {
    "missing d2t": (_without("d2t"), r"tensor 'd2t' missing \(expected shape \[40\]\): a draft vocabulary of 40 of "
                                     r"128 tokens needs its draft-to-target map"),
    "fc of EAGLE-1/2": (_tensor("fc.weight", lambda: torch.zeros(H, 2 * H)),
                        r"does not fit its config\.json: tensor 'fc\.weight' has shape \[64, 128\], expected \[64, 192\]"),
    "draft_vocab_size vs lm_head": (_set(draft_vocab_size=32),
                                    r"config\.json has draft_vocab_size = 32, but lm_head\.weight has 40 rows"),
    "no draft_vocab_size": (lambda c, s: c.pop("draft_vocab_size") and c.update(architectures=["Eagle3LlamaForCausalLM"]),
                            r"config\.json has no draft_vocab_size \(= vocab_size 128\), but lm_head\.weight has 40 rows"),
    "t2d vs d2t": (_flip_t2d, r"t2d does not match d2t: t2d marks 41 target ids, d2t maps to 40 \(first difference: "
                              r"token \d+, marked by t2d\)"),
    "d2t out of range": (_d2t_out_of_range, r"d2t maps draft id 39 to target id \d+, outside the vocabulary \[0, 128\)"),
    "d2t duplicate": (_d2t_duplicate, r"d2t maps draft ids 0 and 1 to the same target id"),
    "d2t float": (lambda c, s: s.update(d2t=s["d2t"].float()), r"d2t has dtype float32; it holds integer offsets"),
    "t2d not bool": (lambda c, s: s.update(t2d=s["t2d"].long()), r"t2d has dtype int64, expected bool"),
    "missing layer tensor": (_without("midlayer.hidden_norm.weight"),
                             r"tensor 'midlayer\.hidden_norm\.weight' missing \(expected shape \[64\]\)"),
    "k_proj of a plain layer": (_tensor("midlayer.self_attn.k_proj.weight", lambda: torch.zeros(32, H)),
                                r"tensor 'midlayer\.self_attn\.k_proj\.weight' has shape \[32, 64\], expected \[32, 128\]"),
    "fc bias": (_tensor("fc.bias", lambda: torch.zeros(H)), r"unexpected tensor 'fc\.bias' \[64\]"),
    "an EAGLE-1 tensor": (_tensor("layers.1.mlp.up_proj.weight", lambda: torch.zeros(128, H)),
                          r"unexpected tensor 'layers\.1\.mlp\.up_proj\.weight' \[128, 64\] \(an EAGLE-3 head holds"),
    "wrong hidden size": (_set(hidden_size=32), r"does not fit the target: config\.json has hidden_size = 32, the "
                                                r"target has 64"),
    "wrong vocab": (_set(vocab_size=96), r"config\.json has vocab_size = 96, the target has 128"),
    "two layers": (_set(num_hidden_layers=2), r"num_hidden_layers is 2; the EAGLE-3 heads read here have one layer"),
    "fc bias config": (_set(bias=True), r"config\.json has \"bias\": true \(SGLang builds fc with it\)"),
    "attention bias": (_set(attention_bias=True), r"config\.json has \"attention_bias\": true"),
    "narrower draft": (_set(target_hidden_size=128), r"config\.json has target_hidden_size = 128 and hidden_size = 64; "
                                                     r"a draft narrower or wider than its target is not supported"),
    "layers beyond the target": (_set(eagle_aux_hidden_state_layer_ids=[2, 4, 8]),
                                 r"config\.json names target layers \[2, 4, 8\] are not three increasing layers of "
                                 r"this 8-layer target \(indices 0\.\.7"),
    "two layers listed": (_set(eagle_aux_hidden_state_layer_ids=[2, 4]), r"\[2, 4\] are not three increasing layers"),
    "layer ids not ints": (_set(eagle_aux_hidden_state_layer_ids="2,4,5"),
                           r"'eagle_aux_hidden_state_layer_ids' must be a list of layer indices"),
    "no aux states": (_set(eagle_config={"use_aux_hidden_state": False}), r"use_aux_hidden_state is false"),
    "no mlp width": (lambda c, s: c.pop("intermediate_size"), r"config\.json: no integer 'intermediate_size'"),
    "speculators": (_set(speculators_config={"algorithm": "eagle3"}), r"a speculators-format EAGLE-3 config"),
}


@pytest.mark.parametrize("case", list(MISMATCHES))
def test_mismatched_folder_is_one_line(tmp_path, case):
    model = deep_target()
    config, state = official_config(model), official_state(random_e3(model, ids=draft_ids()))
    edit, message = MISMATCHES[case]
    edit(config, state)
    folder = write_folder(tmp_path / "off", config, state, "safetensors")
    with pytest.raises(HeadError, match=message) as err:
        load_head(folder, model)
    assert str(folder) in one_line(err)


def test_eagle3_head_needs_a_llama_layer_target(tmp_path):
    model = deep_target()
    folder = write_folder(tmp_path / "off", official_config(model), official_state(random_e3(model, ids=draft_ids())))
    with pytest.raises(HeadMismatchError, match=r"\(eagle3 layout\) holds a Llama decoder layer; it loads onto llama, "
                                                r"mistral, qwen2 targets, whose layer is one, not a 'qwen3' target") as err:
        load_head(folder, deep_target("qwen3"))
    one_line(err)


def test_qwen2_target_gets_zero_qkv_biases(tmp_path):
    """A Qwen2 target's layer has q/k/v biases, the EAGLE-3 layer none: they load as zeros, export only as zeros."""
    model = deep_target("qwen2")
    ref = random_e3(model, seed=11, ids=draft_ids())  # biases zeroed
    loaded = load_head(write_folder(tmp_path / "off", official_config(model), official_state(ref)), model)
    assert_same_drafts(ref, loaded, model)
    notes = export_head(loaded, "eagle3", tmp_path / "again")
    assert notes == ["the q/k/v biases are all zeros and are not written (the EAGLE-3 layer has none)"]
    assert set(load_file(tmp_path / "again" / "model.safetensors")) == set(OFFICIAL_KEYS)
    assert_same_head(loaded, load_head(tmp_path / "again", model))
    with torch.no_grad():
        loaded.midlayer.self_attn.k_proj.bias.fill_(0.5)
    with pytest.raises(HeadError, match=r"has non-zero q/k/v biases \(max \|b\| = 0\.5\), which the EAGLE-3 layer of "
                                        r"the official code, vLLM and SGLang does not have") as err:
        export_head(loaded, "vllm", tmp_path / "vllm")
    one_line(err)


# ---- export and round trips ------------------------------------------------------------------------------------


def test_native_to_official_to_load(tmp_path):
    model = deep_target()
    head = random_e3(model, seed=12, ids=draft_ids())
    save_head(head, tmp_path / "native", native_config(model))
    assert export_head(tmp_path / "native", "eagle3", tmp_path / "off") == []
    assert sorted(p.name for p in (tmp_path / "off").iterdir()) == ["config.json", "model.safetensors"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["native", "off"]  # no temporary folder left
    cfg = json.loads((tmp_path / "off" / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["num_hidden_layers"] == 1
    assert (cfg["draft_vocab_size"], cfg["vocab_size"], cfg["hidden_size"], cfg["intermediate_size"]) == (DRAFT, V, H, 128)
    assert cfg["tie_word_embeddings"] is False  # SGLang would take the embedding as LM head
    for absent in ("bias", "target_hidden_size", "eagle_aux_hidden_state_layer_ids", "eagle_config", "head_dim", "qkv_bias"):
        assert absent not in cfg, absent
    written = load_file(tmp_path / "off" / "model.safetensors")
    assert {k: tuple(v.shape) for k, v in written.items()} == {k: tuple(v.shape) for k, v in official_state(head).items()}
    assert written["d2t"].dtype == torch.int64 and written["t2d"].dtype == torch.bool
    assert torch.equal(torch.arange(DRAFT) + written["d2t"], draft_ids())
    assert detect_layout(tmp_path / "off") == "eagle3"
    assert_same_drafts(load_head(tmp_path / "native", model), load_head(tmp_path / "off", model), model)


def test_native_to_vllm_to_load(tmp_path):
    model = deep_target()
    head = random_e3(model, seed=13, ids=draft_ids(), layers=(1, 3, 6))
    save_head(head, tmp_path / "native", native_config(model, layers=(1, 3, 6)))
    assert export_head(tmp_path / "native", "vllm", tmp_path / "vllm") == []
    cfg = json.loads((tmp_path / "vllm" / "config.json").read_text())
    assert cfg["architectures"] == ["Eagle3LlamaForCausalLM"] and cfg["draft_vocab_size"] == DRAFT
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [1, 3, 6] and cfg["norm_before_residual"] is False
    assert "bias" not in cfg and "target_hidden_size" not in cfg
    assert set(load_file(tmp_path / "vllm" / "model.safetensors")) == set(OFFICIAL_KEYS)
    assert detect_layout(tmp_path / "vllm") == "vllm-eagle3"
    loaded = load_head(tmp_path / "vllm", model)
    assert loaded.feature_layers == (1, 3, 6)
    assert_same_drafts(load_head(tmp_path / "native", model), loaded, model)
    # the official layout cannot state these layers
    with pytest.raises(HeadError, match=r"cannot be exported as eagle3: it reads target layers \[1, 3, 6\], but the "
                                        r"official EAGLE-3 code always reads \(2, L//2, L-3\) = \[2, 4, 5\] of this "
                                        r"8-layer target and has no field for others; export --format vllm") as err:
        export_head(tmp_path / "native", "eagle3", tmp_path / "off")
    one_line(err)
    assert not (tmp_path / "off").exists()


@pytest.mark.parametrize("fmt", ["bin", "safetensors"])
def test_official_to_load_to_export_to_load(tmp_path, fmt):
    """official -> load -> export (the loaded head, and the folder) -> load, both formats: the same drafts."""
    model = deep_target()
    ref = random_e3(model, seed=14, ids=draft_ids())
    folder = write_folder(tmp_path / "off", official_config(model), official_state(ref), fmt)
    loaded = load_head(folder, model)
    for out_fmt in ("eagle3", "vllm"):
        export_head(loaded, out_fmt, tmp_path / f"loaded-{out_fmt}")
        assert_same_drafts(loaded, load_head(tmp_path / f"loaded-{out_fmt}", model), model)
        export_head(folder, out_fmt, tmp_path / f"folder-{out_fmt}")  # no target: the layers stay implicit
        assert_same_head(loaded, load_head(tmp_path / f"folder-{out_fmt}", model))
    vllm_cfg = json.loads((tmp_path / "loaded-vllm" / "config.json").read_text())
    assert vllm_cfg["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5]
    assert "eagle_aux_hidden_state_layer_ids" not in json.loads((tmp_path / "folder-vllm" / "config.json").read_text())
    # the loaded head keeps its target's config: saved as ours, it exports the same files
    save_head(loaded, tmp_path / "native", loaded.config)
    export_head(tmp_path / "native", "eagle3", tmp_path / "via-native")
    a, b = (load_file(tmp_path / d / "model.safetensors") for d in ("loaded-eagle3", "via-native"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert (tmp_path / "via-native" / "config.json").read_text() == (tmp_path / "loaded-eagle3" / "config.json").read_text()


def test_vllm_to_official_needs_the_target(tmp_path):
    """A vLLM folder names its layers; whether they are the official default depends on the target."""
    model = deep_target()
    ref = random_e3(model, seed=15, ids=draft_ids())
    write_folder(tmp_path / "vllm", official_config(model, architectures=["Eagle3LlamaForCausalLM"],
                                                    eagle_aux_hidden_state_layer_ids=[2, 4, 5]), official_state(ref))
    with pytest.raises(HeadError, match=r"it reads target layers \[2, 4, 5\] and does not record its target's layer "
                                        r"count, so the official layers cannot be checked: load it onto its target"):
        export_head(tmp_path / "vllm", "eagle3", tmp_path / "off")
    export_head(load_head(tmp_path / "vllm", model), "eagle3", tmp_path / "off")
    assert_same_head(ref, load_head(tmp_path / "off", model))


def test_native_head_without_target_config_reads_its_target(tmp_path):
    """Trained heads store no target_config: export reads the layer and the layer count from the target."""
    model = deep_target()
    model.save_pretrained(tmp_path / "target")
    head = random_e3(model, seed=16, ids=draft_ids())
    save_head(head, tmp_path / "native", native_config(model, with_target_config=False, target=str(tmp_path / "target")),
              dtype=torch.float16)
    export_head(tmp_path / "native", "eagle3", tmp_path / "off")
    assert json.loads((tmp_path / "off" / "config.json").read_text())["torch_dtype"] == "float16"
    written = load_file(tmp_path / "off" / "model.safetensors")
    native = load_file(tmp_path / "native" / "model.safetensors")
    assert all(torch.equal(written[k], native[k]) and written[k].dtype == native[k].dtype for k in native)
    assert_same_drafts(load_head(tmp_path / "native", model), load_head(tmp_path / "off", model), model)


def test_export_refusals(tmp_path):
    model = deep_target()
    save_head(random_e3(model, ids=draft_ids()), tmp_path / "native", native_config(model))
    with pytest.raises(HeadError, match=r"head \S+native is an EAGLE-3 head; --format eagle writes EAGLE-1/2 heads "
                                        r"\(use --format eagle3 or vllm\)$"):
        export_head(tmp_path / "native", "eagle", tmp_path / "out")
    with pytest.raises(HeadError, match=r"this head is an EAGLE-3 head; --format eagle writes EAGLE-1/2 heads"):
        export_head(load_head(tmp_path / "native", model), "eagle", tmp_path / "out")
    # an EAGLE-1/2 head has no EAGLE-3 layout
    tiny = make_tiny_head_target("llama")
    with pytest.raises(HeadError, match=r"this head is an EAGLE-1/2 head; eagle3 export needs an EAGLE-3 head$"):
        export_head(random_head(tiny), "eagle3", tmp_path / "out")
    # layers vLLM cannot capture: the embeddings (0) and the final normed output (L)
    for layers, message in (((0, 3, 6), r"it reads target layer 0 \(the embeddings\), which vLLM's Llama cannot capture"),
                            ((2, 4, 8), r"its target layers \[2, 4, 8\] are not three increasing layers of this "
                                        r"8-layer target")):
        save_head(random_e3(model, layers=layers), tmp_path / "odd", native_config(model, layers=layers))
        with pytest.raises(HeadError, match=r"cannot be exported as vllm: " + message) as err:
            export_head(tmp_path / "odd", "vllm", tmp_path / "out")
        one_line(err)
    # a head built in code records no target: its layers cannot be checked
    with pytest.raises(HeadError, match=r"does not record its target's layer count"):
        export_head(random_e3(model), "vllm", tmp_path / "out")
    # a Qwen3 layer (q/k norms) has no place in these layouts
    qwen3 = deep_target("qwen3")
    save_head(random_e3(qwen3), tmp_path / "q3", native_config(qwen3))
    with pytest.raises(HeadError, match=r"trained for a 'qwen3' target, whose decoder layer is not a Llama layer") as err:
        export_head(tmp_path / "q3", "eagle3", tmp_path / "out")
    one_line(err)
    assert not (tmp_path / "out").exists()


def test_export_checks_the_weights(tmp_path):
    model = deep_target()
    save_head(random_e3(model, ids=draft_ids()), tmp_path / "native", native_config(model))
    sd = load_file(tmp_path / "native" / "model.safetensors")
    sd["t2d"] = sd["t2d"].clone()
    sd["t2d"][int((~sd["t2d"]).nonzero()[0])] = True
    save_file(sd, str(tmp_path / "native" / "model.safetensors"))
    with pytest.raises(HeadError, match=r"t2d does not match d2t"):
        export_head(tmp_path / "native", "eagle3", tmp_path / "out")
    sd["fc.bias"] = torch.zeros(H)
    save_file(sd, str(tmp_path / "native" / "model.safetensors"))
    with pytest.raises(HeadError, match=r"cannot be exported as eagle3: unexpected tensor 'fc\.bias' \[64\]"):
        export_head(tmp_path / "native", "eagle3", tmp_path / "out")


def test_layout_rows():
    """The EAGLE-3 rows: official names both ways ('layers.0.' read as 'midlayer.', never written)."""
    spec = LayerSpec.of_target(deep_target().config.to_dict())
    for name in ("eagle3", "vllm-eagle3"):
        lay = LAYOUTS[name]
        assert lay.kind == "eagle3"
        for ours in spec.eagle3_tensors(DRAFT):
            assert lay.to_file(ours) == ours and lay.from_file(ours) == ours
        assert lay.from_file("layers.0.mlp.up_proj.weight") == "midlayer.mlp.up_proj.weight"
        assert lay.from_file("embed_tokens.weight") is None
    assert set(spec.eagle3_tensors(DRAFT)) == set(OFFICIAL_KEYS)


# ---- the command line ------------------------------------------------------------------------------------------


def test_cli_export(tmp_path, capsys):
    model = deep_target()
    head = random_e3(model, seed=17, ids=draft_ids())
    save_head(head, tmp_path / "native", native_config(model))
    for fmt in ("eagle3", "vllm"):
        code, out, err = run_cli(["export", "--head", str(tmp_path / "native"), "--format", fmt,
                                  "--out", str(tmp_path / fmt)], capsys)
        assert code == 0 and err == ""
        assert out == f"wrote {tmp_path / fmt}: {fmt} layout (config.json + model.safetensors)\n"
        assert_same_head(load_head(tmp_path / "native", model), load_head(tmp_path / fmt, model))
    code, out, err = run_cli(["export", "--head", str(tmp_path / "eagle3"), "--format", "eagle",
                              "--out", str(tmp_path / "e1")], capsys)
    assert code == 2 and out == "" and err.count("\n") == 1
    assert err.startswith(f"eagle: error: head {tmp_path / 'eagle3'} is an EAGLE-3 head; --format eagle writes "
                          "EAGLE-1/2 heads")
    assert not (tmp_path / "e1").exists()
