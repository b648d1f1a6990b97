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
    from eagle.runtime import native_bf16

    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16 avx512_vnni\n")
    assert native_bf16("cpu", str(info))
    info.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_vnni\n")
    assert not native_bf16("cpu", str(info))
    info.write_text("flags\t\t: fpu amx_bf16 amx_tile\n")
    assert native_bf16("cpu", str(info))
    assert not native_bf16("cpu", str(tmp_path / "missing"))
    assert native_bf16("cuda")
