"""Strict YAML configs: the shipped files load; unknown keys, wrong types and bad values are errors."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from eagle.config import ConfigError, DecodeConfig, config_from_dict, from_dict, load_config
from eagle.draft import NgramDrafter, NoDrafter, SelfDrafter, TreeShape

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
    # the schema and values are checked before paths resolve: whatever files exist on this machine,
    # the only error can be the drafter's head folder, which exists only once trained/exported
    data = yaml.safe_load(path.read_text()) or {}
    drafter = data.get("drafter") or {}
    folder = drafter.get("head") or (drafter.get("model") if drafter.get("model") not in EMBEDDED else "")
    if folder and not _head_exists(folder, path):
        with pytest.raises(ConfigError, match=f"path not found: {folder}"):
            load_config(path)
        return
    cfg = load_config(path)
    assert isinstance(cfg, DecodeConfig)
    assert cfg.name == path.stem
    assert cfg.drafter.type == drafter.get("type", "none") and cfg.tree.shape == (data.get("tree") or {}).get("shape", "chain")
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
        if key in ("data_dir", "out_dir", "tokens_dir", "export", "init_from"):  # "~" is expanded
            value = os.path.expanduser(value)
        assert getattr(cfg, key) == value
    # a training config is not a decoding config: the strict loader names the first stray key
    with pytest.raises(ConfigError, match="unknown key"):
        load_config(path)


def test_train_config_paths_expand_home(tmp_path):
    """Every folder or file a training run writes or reads may start with "~" (runs kept outside
    the work tree): none of them is taken literally, which would create a folder named "~"."""
    from eagle.train.distill import load_distill_config
    from eagle.train.trainer import load_train_config

    home = os.path.expanduser("~")
    paths = {"data_dir": "~/d", "tokens_dir": "~/t", "out_dir": "~/o", "export": "~/e", "init_from": "~/i"}
    f = tmp_path / "train.yaml"
    f.write_text(yaml.safe_dump(paths))
    cfg = load_train_config(f)
    for key, value in paths.items():
        assert getattr(cfg, key) == home + value[1:]
    f = tmp_path / "distill.yaml"
    f.write_text(yaml.safe_dump({"out_dir": "~/o", "export": "~/e"}))
    d = load_distill_config(f)
    assert (d.out_dir, d.export) == (home + "/o", home + "/e")


def test_shipped_config_values():
    plain = load_config(CONFIGS / "plain.yaml")
    assert plain.drafter.type == "none"
    selfd = load_config(CONFIGS / "self-draft.yaml")
    assert selfd.drafter.type == "self" and selfd.tree.shape == "chain" and selfd.tree.depth == 4
    ng = load_config(CONFIGS / "ngram.yaml")
    assert ng.drafter.type == "ngram"
    o = ng.drafter.options
    assert isinstance(o, NgramDrafter.Options) and (o.max_ngram, o.min_ngram, o.branches) == (3, 1, 3)
    assert ng.tree.depth == 5


def test_build_drafter_types():
    assert isinstance(load_config(CONFIGS / "plain.yaml").build_drafter(None), NoDrafter)
    ng = load_config(CONFIGS / "ngram.yaml").build_drafter(None)
    assert isinstance(ng, NgramDrafter)
    assert (ng.max_ngram, ng.min_ngram, ng.depth, ng.branches) == (3, 1, 5, 3)
    sd = load_config(CONFIGS / "self-draft.yaml").build_drafter(object())
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
  choices: [[0], [1], [0, 0], [0, 1], [1, 0]]
"""))
    assert cfg.attention == "reference" and cfg.drafter.options.sample is True
    assert isinstance(cfg.tree, TreeShape) and cfg.tree.shape == "static"
    assert cfg.tree.options.choices == [[0], [1], [0, 0], [0, 1], [1, 0]]
    # the common interface every shape answers: 2 levels, at most 2 nodes of a level expand, 6 nodes
    assert (cfg.tree.depth, cfg.tree.top_k, cfg.tree.max_nodes) == (2, 2, 6)


# ---- unknown keys --------------------------------------------------------------------------------


@pytest.mark.parametrize("text, key", [
    ("drafter: {type: none}\nfoo: 1\n", "foo"),
    ("treee: {depth: 3}\n", "treee"),
    ("tree: {shape: chain, dept: 3}\n", "tree.dept"),
    ("drafter: {type: ngram, branch: 2}\n", "drafter.branch"),
    ("drafter: {tpye: self}\n", "drafter.tpye"),
    # each drafter and each shape takes its own keys only
    ("tree: {shape: static, choices: [[0]], depth: 2}\n", "tree.depth"),
    ("tree: {shape: chain, top_k: 2}\n", "tree.top_k"),
    ("drafter: {type: ngram, dtype: bfloat16}\n", "drafter.dtype"),
    ("drafter: {type: self, head: h}\n", "drafter.head"),
    ("drafter: {type: eagle3, head: h, prompt_vocab: true}\n", "drafter.prompt_vocab"),
    ("drafter: {type: medusa, head: h, model: m}\n", "drafter.model"),
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
    ("drafter: {type: eagle, head: h, dtype: int4}\n", "drafter.dtype"),
    ("drafter: {type: warp}\n", r"drafter.type must be one of the registered drafters \(eagle, eagle3, hybrid, lookahead, "
                                 r"medusa, model, ngram, none, self\), got 'warp'"),
    ("tree: {shape: pyramid}\n", r"tree.shape must be one of the registered tree shapes \(auto, chain, dynamic, static\)"),
    ("drafter: {type: model}\n", "drafter.type 'model' needs drafter.model"),
    ("drafter: {type: eagle3}\n", "drafter.type 'eagle3' needs drafter.head"),
    ("drafter: {type: ngram}\ntree: {shape: auto}\n", "tree.shape 'auto' needs a drafter that grows a tree"),
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
    assert from_dict(NgramDrafter.Options, {"branches": 2}) == NgramDrafter.Options(branches=2)
    with pytest.raises(ConfigError, match="'x.sample'"):
        from_dict(SelfDrafter.Options, {"sample": 1}, "x.")


def test_sampled_drafts_need_a_shape_that_samples(tmp_path):
    with pytest.raises(ConfigError, match="sample: true needs a tree shape that samples"):
        config_from_dict({"drafter": {"type": "self", "sample": True},
                          "tree": {"shape": "dynamic", "depth": 2, "top_k": 2, "total_tokens": 3}}, tmp_path / "c.yaml")
    cfg = config_from_dict({"drafter": {"type": "self", "sample": True}, "tree": {"shape": "chain", "depth": 2}},
                           tmp_path / "c.yaml")
    cfg.validate()
    cfg.tree = config_from_dict({"tree": {"shape": "dynamic"}}, tmp_path / "c.yaml").tree  # validate checks what it holds
    with pytest.raises(ConfigError, match="sample"):
        cfg.validate()


def test_from_config_takes_a_config_a_mapping_a_path_or_a_shipped_name(llama, tmp_path):
    import eagle
    from eagle.config import ConfigError, as_config

    model, _ = llama
    shipped = eagle.load_config(Path(__file__).resolve().parents[1] / "experiments/configs/ngram.yaml")
    by_name = as_config("ngram")
    assert by_name == shipped and by_name.name == "ngram"
    (tmp_path / "mine.yaml").write_text("drafter: {type: ngram, max_ngram: 2}\n")
    assert as_config(str(tmp_path / "mine.yaml")).drafter.options.max_ngram == 2
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


def test_shipped_names_are_found_without_importing_their_modules():
    """A config finds every shipped drafter and shape by name; the modules they register from are
    imported on the first lookup (a fresh interpreter: nothing of eagle.heads is loaded before)."""
    import subprocess
    import sys

    code = """
import sys
from eagle.config import SHIPPED_DRAFTERS, SHIPPED_SHAPES, drafter_class, tree_shape_class
assert "eagle.heads" not in sys.modules and "eagle.draft_model" not in sys.modules
for name in SHIPPED_DRAFTERS:
    assert drafter_class(name).name == name, name
for name in SHIPPED_SHAPES:
    assert tree_shape_class(name).name == name, name
assert "eagle.heads.medusa" in sys.modules and "eagle.draft_model" in sys.modules
print("ok")
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert proc.stdout.strip() == "ok", proc.stderr[-2000:]
