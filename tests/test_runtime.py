"""The runtime config (eagle/runtime.py): invalid values, unknown keys, bucket sizes."""
from __future__ import annotations

import pytest

from eagle.config import ConfigError, DecodeConfig, from_dict
from eagle.runtime import RuntimeConfig


@pytest.mark.parametrize("bad, msg", [({"cache": "paged"}, "runtime.cache"), ({"dtype": "int8"}, "runtime.dtype"),
                                      ({"buckets": [8, 4]}, "runtime.buckets"), ({"buckets": []}, "runtime.buckets"),
                                      ({"buckets": [0, 4]}, "runtime.buckets"),
                                      ({"cache": "dynamic", "compile": True}, "runtime.compile"),
                                      ({"greedy_head": "bf16"}, "runtime.greedy_head")])
def test_runtime_config_errors(bad, msg):
    cfg = from_dict(DecodeConfig, {"runtime": bad})
    with pytest.raises(ConfigError, match=msg):
        cfg.validate()


def test_runtime_unknown_key_and_buckets():
    with pytest.raises(ConfigError, match="runtime.graphs"):
        from_dict(DecodeConfig, {"runtime": {"graphs": 3}})
    rt = RuntimeConfig(buckets=[1, 4, 8])
    assert [rt.bucket(n) for n in (1, 2, 4, 5, 8, 9, 70)] == [1, 4, 4, 8, 8, 9, 70]


def test_native_bf16_reads_the_cpu_flags(tmp_path):
    from eagle.backends import native_bf16

    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16 avx512_vnni\n")
    assert native_bf16("cpu", str(info))
    info.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_vnni\n")
    assert not native_bf16("cpu", str(info))
    info.write_text("flags\t\t: fpu amx_bf16 amx_tile\n")
    assert native_bf16("cpu", str(info))
    assert not native_bf16("cpu", str(tmp_path / "missing"))
    assert native_bf16("cuda")


def test_fitted_cuts_the_buckets_at_the_largest_tree():
    rt = RuntimeConfig(buckets=[1, 4, 8, 16, 32, 64])
    assert rt.fitted(61).buckets == [1, 4, 8, 16, 32, 61]
    assert rt.fitted(8).buckets == [1, 4, 8]
    assert rt.fitted(5).buckets == [1, 4, 5]
    assert rt.fitted(1).buckets == [1]
    assert rt.fitted(65) is rt  # every bucket smaller: larger trees already run at their own size
    assert rt.buckets == [1, 4, 8, 16, 32, 64]  # a copy
    fit = rt.fitted(61)
    fit.validate()
    assert [fit.bucket(n) for n in (1, 3, 33, 60, 61)] == [1, 4, 61, 61, 61]
    # 16-bit steps: a multiple of 16 rows, never past the bucket that held the tree
    assert rt.fitted(61, 16).buckets == [1, 4, 8, 16, 32, 64]
    assert rt.fitted(26, 16).buckets == [1, 4, 8, 16, 32]
    assert rt.fitted(8, 16).buckets == [1, 4, 8]
    assert rt.fitted(18, 16).buckets == [1, 4, 8, 16, 32]
    with pytest.raises(ValueError, match="max_nodes"):
        rt.fitted(0)
    with pytest.raises(ValueError, match="multiple"):
        rt.fitted(8, 0)


@pytest.mark.parametrize("tree", [{"shape": "chain", "depth": 5},
                                  {"shape": "static", "choices": [[0], [1], [0, 0], [0, 1], [0, 0, 0]]},
                                  {"shape": "dynamic", "depth": 6, "top_k": 10, "total_tokens": 60},
                                  {"shape": "dynamic", "depth": 4, "top_k": 3, "total_tokens": 7},
                                  {"shape": "dynamic", "depth": 2, "top_k": 2, "total_tokens": 50}])  # pool of 6
def test_max_nodes_is_the_largest_tree_a_shape_grows(tree):
    """Trees grown from random draft logits reach the shape's ``max_nodes`` and never pass it."""
    import torch

    from eagle.draft import Sampling, TreeShape

    shape = TreeShape(**tree)
    gen = torch.Generator().manual_seed(0)
    sizes = [len(shape.grow(5, lambda t, nodes: torch.randn(len(nodes), 50, generator=gen), Sampling()))
             for _ in range(5)]
    assert max(sizes) == shape.max_nodes


def test_decoders_fit_their_targets_buckets_to_their_trees(tiny_model):
    from eagle.config import config_from_dict
    from eagle.decoder import TreeDecoder

    model = tiny_model("llama")
    cases = [({"drafter": {"type": "none"}}, [1]),
             ({"drafter": {"type": "ngram", "branches": 2}, "tree": {"depth": 5}}, [1, 4, 8, 11]),
             ({"drafter": {"type": "self"}, "tree": {"shape": "dynamic", "depth": 3, "top_k": 4, "total_tokens": 12}},
              [1, 4, 8, 13]),
             ({"drafter": {"type": "self"}, "tree": {"shape": "dynamic", "depth": 3, "top_k": 4, "total_tokens": 12},
               "runtime": {"buckets": [2, 6]}}, [2, 6]),
             ({"drafter": {"type": "self"}, "tree": {"shape": "dynamic", "depth": 3, "top_k": 4, "total_tokens": 12},
               "runtime": {"dtype": "bfloat16"}}, [1, 4, 8, 16])]  # 16-bit steps: whole 16-row tiles
    for data, buckets in cases:
        cfg = config_from_dict(data, "test.yaml")
        dec = TreeDecoder.from_config(model, cfg)
        assert dec.target.runtime.buckets == buckets, data
        assert cfg.runtime.buckets == (data.get("runtime", {}).get("buckets") or [1, 4, 8, 16, 32, 64])  # untouched
