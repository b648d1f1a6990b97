"""Extension points (docs/extending.md): the doc's drafter and tree shape run as written, from their
YAML files, and decode exactly; the registries check what they are given; the top-level API."""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

import eagle
from eagle.config import ConfigError, config_from_dict

from conftest import plain_greedy, prompt_ids

DOC = Path(__file__).resolve().parents[1] / "docs" / "extending.md"
BLOCK = re.compile(r"```(python|yaml)\n(.*?)```", re.S)


def doc_blocks() -> list[tuple[str, str]]:
    return BLOCK.findall(DOC.read_text())


@pytest.fixture
def doc_run(llama, tmp_path, monkeypatch):
    """The doc's blocks in order, in ``tmp_path``: YAML blocks written to the file their first line
    names, Python blocks run in one namespace holding ``model`` and ``ids``."""
    model, _ = llama
    monkeypatch.chdir(tmp_path)
    ns = {"__name__": "docs_extending", "model": model, "ids": prompt_ids(3, n=16)}
    for kind, code in doc_blocks():
        if kind == "yaml":
            name = code.splitlines()[0].removeprefix("# ").strip()
            assert name.endswith(".yaml"), f"a YAML block of {DOC.name} starts with '# its-file.yaml'"
            (tmp_path / name).write_text(code)
        else:
            exec(compile(code, str(DOC), "exec", dont_inherit=True), ns)
    return ns


def test_the_doc_has_a_short_drafter_and_a_shape_each_with_its_config():
    blocks = doc_blocks()
    drafter = next(code for kind, code in blocks if "register_drafter" in code)
    assert len(drafter.strip().splitlines()) <= 30
    assert any("register_tree_shape" in code for _, code in blocks)
    assert [code.splitlines()[0] for kind, code in blocks if kind == "yaml"] == ["# bigram.yaml", "# self-fan.yaml"]


def test_the_docs_drafter_and_shape_decode_exactly_from_their_yaml_files(doc_run, llama):
    model, _ = llama
    ids = doc_run["ids"]
    plain = plain_greedy(model, ids, 40)
    bigram = eagle.TreeDecoder.from_config(model, "bigram.yaml")
    assert type(bigram.drafter) is doc_run["BigramDrafter"] and bigram.drafter.options.window == 512
    out = bigram.generate(ids, 40)
    assert out.tokens == plain
    assert out.stats.target_forwards < 39  # some drafts were accepted: the tiny model repeats itself
    assert max(len(out.stats.nodes_hist) - 1, 1) <= 5  # chains of at most tree.depth = 4
    fan = doc_run["dec"]  # the doc's last decoder: self-drafting the fan
    assert type(fan.drafter.shape) is doc_run["FanShape"]
    assert doc_run["out"].tokens == plain
    assert len(doc_run["out"].stats.nodes_hist) - 1 == 7  # the whole fan: 1 + 2 * 3 nodes
    assert fan.target.runtime.buckets[-1] == 7  # the target's steps cut at the largest fan
    assert eagle.TreeShape("fan", width=2, depth=3) == fan.drafter.shape


def test_the_docs_options_are_strict(doc_run, tmp_path):
    def load(data):
        return config_from_dict(data, tmp_path / "c.yaml")

    with pytest.raises(ConfigError, match=r"drafter 'bigram': unknown key 'drafter.windw' \(allowed: window\)"):
        load({"drafter": {"type": "bigram", "windw": 3}})
    with pytest.raises(ConfigError, match="'drafter.window' must be int"):
        load({"drafter": {"type": "bigram", "window": "all"}})
    with pytest.raises(ConfigError, match="drafter.window must be >= 2"):
        load({"drafter": {"type": "bigram", "window": 1}})
    with pytest.raises(ConfigError, match="tree.width and tree.depth must be >= 1"):
        load({"drafter": {"type": "self"}, "tree": {"shape": "fan", "width": 0}})
    with pytest.raises(ConfigError, match=r"tree shape 'fan': unknown key 'tree.top_k'"):
        load({"drafter": {"type": "self"}, "tree": {"shape": "fan", "top_k": 3}})
    # unknown names list every registered one, the doc's included
    with pytest.raises(ConfigError, match=r"registered drafters \(bigram, eagle, .*\), got 'bigrams'"):
        load({"drafter": {"type": "bigrams"}})
    with pytest.raises(ConfigError, match=r"registered tree shapes \(auto, chain, dynamic, fan, static\), got 'fans'"):
        load({"tree": {"shape": "fans"}})


def test_registries_check_what_they_register():
    @dataclass
    class Opts:
        pass

    class NotADrafter:
        Options = Opts

    with pytest.raises(TypeError, match="not a subclass of Drafter"):
        eagle.register_drafter("odd")(NotADrafter)

    class NoOptions(eagle.Drafter):
        Options = dict

        def propose(self, root, sampling):
            return eagle.Tree.chain([root])

    with pytest.raises(TypeError, match="NoOptions.Options must be a dataclass"):
        eagle.register_drafter("no-options")(NoOptions)

    class AnotherNgram(eagle.Drafter):
        def propose(self, root, sampling):
            return eagle.Tree.chain([root])

    with pytest.raises(ValueError, match="drafter 'ngram' is already registered"):
        eagle.register_drafter("ngram")(AnotherNgram)
    with pytest.raises(ValueError, match="tree shape 'chain' is already registered"):
        eagle.register_tree_shape("chain")(eagle.draft.DynamicShape)
    from eagle.config import drafter_class

    assert drafter_class("ngram") is eagle.draft.NgramDrafter  # still the shipped one


def test_a_drafter_built_in_python_takes_a_shape_by_name(llama):
    from eagle.draft import SelfDrafter

    model, target = llama
    shape = eagle.TreeShape("dynamic", depth=3, top_k=2, total_tokens=5)
    assert (shape.shape, shape.depth, shape.top_k, shape.max_nodes) == ("dynamic", 3, 2, 6)
    p = prompt_ids(4)
    assert eagle.TreeDecoder(target, SelfDrafter(target, shape)).generate(p, 20).tokens == plain_greedy(model, p, 20)
    with pytest.raises(ValueError, match=r"registered tree shapes \(.*\), got 'pyramid'"):
        eagle.TreeShape("pyramid")
    with pytest.raises(ValueError, match="tree.top_k must be >= 1"):
        eagle.TreeShape("dynamic", top_k=0)


def test_the_top_level_api():
    for name in ("Drafter", "Sampling", "Tree", "TreeShape", "register_drafter", "register_tree_shape", "TreeDecoder",
                 "DecodeConfig", "load_config", "ConfigError", "Target"):
        assert name in eagle.__all__ and getattr(eagle, name) is not None
    assert "SlotCache" not in eagle.__all__ and not hasattr(eagle, "SlotCache")
    from eagle.kv import SlotCache

    assert SlotCache is not None
    assert isinstance(eagle.TreeShape("chain", depth=2), eagle.TreeShape)
    assert torch.is_tensor(eagle.Tree.chain([1, 2]).tokens)
