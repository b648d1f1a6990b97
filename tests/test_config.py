"""Strict YAML configs: the shipped files load; unknown keys, wrong types and bad values are errors."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from eagle.config import ConfigError, DecodeConfig, DrafterConfig, from_dict, load_config
from eagle.draft import NgramDrafter, NoDrafter, SelfDrafter, build_drafter
from eagle.draft.shape import TreeShape

from eagle.models import EMBEDDED

REPO = Path(__file__).resolve().parent.parent
CONFIGS = REPO / "experiments" / "configs"
SHIPPED = sorted(CONFIGS.glob("*.yaml"))
# decoding configs (eagle.load_config) vs training configs (train-*.yaml, eagle.train's loader)
DECODE = [p for p in SHIPPED if not p.stem.startswith(("train", "distill"))]
TRAIN = [p for p in SHIPPED if p.stem.startswith("train")]
DISTILL = [p for p in SHIPPED if p.stem.startswith("distill")]


def write(tmp_path: Path, text: str, name: str = "cfg.yaml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def test_shipped_configs_exist():
    assert {p.stem for p in DECODE} >= {"plain", "self-draft", "ngram"}


def _head_exists(head: str, config_path: Path) -> bool:
    return any((base / head).exists() for base in (Path.cwd(), config_path.parent, REPO))


@pytest.mark.parametrize("path", DECODE, ids=[p.stem for p in DECODE])
def test_shipped_decode_config_loads(path):
    # the schema and values are valid whatever files exist on this machine ...
    data = yaml.safe_load(path.read_text()) or {}
    schema = from_dict(DecodeConfig, {"name": path.stem, **data})
    schema.validate()
    # ... and load_config resolves the drafter's head folder, which exists only once trained/exported
    folder = schema.drafter.head or (schema.drafter.model if schema.drafter.model not in EMBEDDED else "")
    if folder and not _head_exists(folder, path):
        with pytest.raises(ConfigError, match="path not found"):
            load_config(path)
        return
    cfg = load_config(path)
    assert isinstance(cfg, DecodeConfig)
    assert cfg.name == path.stem
    assert cfg.drafter.type == schema.drafter.type and cfg.tree == schema.tree
    cfg.validate()


@pytest.mark.parametrize("path", DISTILL, ids=[p.stem for p in DISTILL])
def test_shipped_distill_config_loads(path):
    from eagle.train.distill import load_distill_config
    from eagle.train.trainer import load_train_config

    cfg = load_distill_config(path)
    for key, value in yaml.safe_load(path.read_text()).items():
        assert getattr(cfg, key) == value
    load_train_config(REPO / cfg.data)  # the data it reuses is described by a valid training config


@pytest.mark.parametrize("path", TRAIN, ids=[p.stem for p in TRAIN])
def test_shipped_train_config_loads(path):
    from eagle.train.trainer import load_train_config

    cfg = load_train_config(path)
    data = yaml.safe_load(path.read_text())
    for key, value in data.items():
        if key in ("data_dir", "out_dir"):  # "~" is expanded
            value = os.path.expanduser(value)
        assert getattr(cfg, key) == value
    # a training config is not a decoding config: the strict loader names the first stray key
    with pytest.raises(ConfigError, match="unknown key"):
        load_config(path)


def test_shipped_config_values():
    plain = load_config(CONFIGS / "plain.yaml")
    assert plain.drafter.type == "none"
    selfd = load_config(CONFIGS / "self-draft.yaml")
    assert selfd.drafter.type == "self" and selfd.tree.shape == "chain" and selfd.tree.depth == 4
    ng = load_config(CONFIGS / "ngram.yaml")
    assert ng.drafter.type == "ngram"
    assert (ng.drafter.max_ngram, ng.drafter.min_ngram, ng.drafter.branches) == (3, 1, 3)
    assert ng.tree.depth == 5


def test_build_drafter_types():
    assert isinstance(build_drafter(load_config(CONFIGS / "plain.yaml"), None), NoDrafter)
    ng = build_drafter(load_config(CONFIGS / "ngram.yaml"), None)
    assert isinstance(ng, NgramDrafter)
    assert (ng.max_ngram, ng.min_ngram, ng.depth, ng.branches) == (3, 1, 5, 3)
    sd = build_drafter(load_config(CONFIGS / "self-draft.yaml"), object())
    assert isinstance(sd, SelfDrafter) and sd.shape.depth == 4 and sd.sample is False


def test_defaults_and_name(tmp_path):
    cfg = load_config(write(tmp_path, "", "empty-file.yaml"))
    assert cfg.name == "empty-file" and cfg.drafter.type == "none" and cfg.attention == "auto"
    cfg = load_config(write(tmp_path, "name: custom\ndrafter: {type: self}\n"))
    assert cfg.name == "custom" and cfg.drafter.type == "self"


def test_full_config(tmp_path):
    cfg = load_config(write(tmp_path, """
name: full
attention: reference
drafter: {type: self, sample: true}
tree:
  shape: static
  depth: 2
  choices: [[0], [1], [0, 0], [0, 1], [1, 0]]
"""))
    assert cfg.attention == "reference" and cfg.drafter.sample is True
    assert isinstance(cfg.tree, TreeShape) and cfg.tree.shape == "static"
    assert cfg.tree.choices == [[0], [1], [0, 0], [0, 1], [1, 0]]


# ---- unknown keys --------------------------------------------------------------------------------


@pytest.mark.parametrize("text, key", [
    ("drafter: {type: none}\nfoo: 1\n", "foo"),
    ("treee: {depth: 3}\n", "treee"),
    ("tree: {shape: chain, dept: 3}\n", "tree.dept"),
    ("drafter: {type: ngram, branch: 2}\n", "drafter.branch"),
    ("drafter: {tpye: self}\n", "drafter.tpye"),
])
def test_unknown_key_is_named(tmp_path, text, key):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as e:
        load_config(path)
    msg = str(e.value)
    assert f"'{key}'" in msg
    assert str(path) in msg  # the message names the file too


# ---- wrong types ---------------------------------------------------------------------------------


@pytest.mark.parametrize("text, key", [
    ("tree: {depth: four}\n", "tree.depth"),
    ("tree: {depth: 2.5}\n", "tree.depth"),
    ("tree: {depth: true}\n", "tree.depth"),  # a bool is not an int
    ("drafter: {type: self, sample: 'yes'}\n", "drafter.sample"),
    ("drafter: {type: 3}\n", "drafter.type"),
    ("drafter: {type: ngram, branches: [1]}\n", "drafter.branches"),
    ("tree: {shape: static, choices: 5}\n", "tree.choices"),
    ("tree: {shape: static, choices: [[0], 1]}\n", "tree.choices[1]"),
    ("tree: {shape: static, choices: [[0], [0, x]]}\n", "tree.choices[1][1]"),
    ("name: 7\n", "name"),
])
def test_wrong_type_is_named(tmp_path, text, key):
    with pytest.raises(ConfigError) as e:
        load_config(write(tmp_path, text))
    assert f"'{key}'" in str(e.value)


@pytest.mark.parametrize("text", ["drafter: self\n", "tree: [1, 2]\n", "- 1\n- 2\n", "just a string\n"])
def test_non_mapping_sections(tmp_path, text):
    with pytest.raises(ConfigError):
        load_config(write(tmp_path, text))


# ---- bad values ----------------------------------------------------------------------------------


@pytest.mark.parametrize("text, needle", [
    ("drafter: {type: medusa}\n", "drafter.type"),
    ("attention: cuda\n", "attention"),
    ("tree: {shape: static}\n", "choices"),
    ("tree: {shape: static, choices: []}\n", "choices"),
    ("tree: {shape: static, choices: [[0], [0, 1, 1]]}\n", "parent"),
    ("tree: {shape: static, choices: [[0], [0]]}\n", "duplicate"),
    ("tree: {shape: pyramid}\n", "tree.shape"),
    ("tree: {depth: 0}\n", "tree.depth"),
    ("tree: {shape: dynamic, top_k: 0}\n", "top_k"),
    ("drafter: {type: ngram, min_ngram: 3, max_ngram: 2}\n", "min_ngram"),
    ("drafter: {type: ngram, min_ngram: 0}\n", "min_ngram"),
    ("drafter: {type: ngram, branches: 0}\n", "branches"),
    ("drafter: {type: eagle, head: h, dtype: int8}\n", "drafter.dtype"),
    ("drafter: {type: ngram, dtype: bfloat16}\n", "drafters only"),
    ("drafter: {type: ngram, dtype: auto}\n", "drafters only"),
    ("drafter: {type: medusa, head: h, dtype: auto}\n", "eagle and eagle3 drafters only"),
])
def test_bad_values(tmp_path, text, needle):
    with pytest.raises(ConfigError, match=needle):
        load_config(write(tmp_path, text))


def test_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match="YAML"):
        load_config(write(tmp_path, "tree: {depth: [1, 2\n"))


def test_config_error_is_value_error():
    assert issubclass(ConfigError, ValueError)


def test_from_dict_direct():
    d = from_dict(DrafterConfig, {"type": "ngram", "branches": 2})
    assert d == DrafterConfig(type="ngram", branches=2)
    with pytest.raises(ConfigError, match="'x.sample'"):
        from_dict(DrafterConfig, {"sample": 1}, "x.")


def test_sampled_drafts_need_a_static_shape():
    cfg = from_dict(DecodeConfig, {"drafter": {"type": "self", "sample": True},
                                   "tree": {"shape": "dynamic", "depth": 2, "top_k": 2, "total_tokens": 3}})
    with pytest.raises(ConfigError, match="sample"):
        cfg.validate()
    from_dict(DecodeConfig, {"drafter": {"type": "self", "sample": True}, "tree": {"shape": "chain", "depth": 2}}).validate()


def test_from_config_takes_a_config_a_mapping_a_path_or_a_shipped_name(llama, tmp_path):
    import eagle
    from eagle.config import ConfigError, as_config

    model, _ = llama
    shipped = eagle.load_config(Path(__file__).resolve().parents[1] / "experiments/configs/ngram.yaml")
    by_name = as_config("ngram")
    assert by_name == shipped and by_name.name == "ngram"
    (tmp_path / "mine.yaml").write_text("drafter: {type: ngram, max_ngram: 2}\n")
    assert as_config(str(tmp_path / "mine.yaml")).drafter.max_ngram == 2
    assert as_config({"drafter": {"type": "ngram"}, "tree": {"depth": 2}}).tree.depth == 2
    with pytest.raises(ConfigError, match="'no-such-preset' is neither a config file nor a shipped config"):
        as_config("no-such-preset")
    with pytest.raises(ConfigError, match="unknown key 'drafter.nope'"):
        as_config({"drafter": {"nope": 1}})
    with pytest.raises(ConfigError, match="not int"):
        as_config(3)
    for cfg in ("ngram", {"drafter": {"type": "ngram"}}, by_name):
        dec = eagle.TreeDecoder.from_config(model, cfg)
        assert dec.drafter.__class__.__name__ == "NgramDrafter"
    assert eagle.Drafter and eagle.Sampling and eagle.TreeShape and eagle.ConfigError
