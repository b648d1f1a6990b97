"""The runtime config (eagle/runtime.py): invalid values, unknown keys, bucket sizes."""
from __future__ import annotations

import pytest

from eagle.config import ConfigError, DecodeConfig, from_dict
from eagle.runtime import RuntimeConfig


@pytest.mark.parametrize("bad, msg", [({"cache": "paged"}, "runtime.cache"), ({"dtype": "int8"}, "runtime.dtype"),
                                      ({"buckets": [8, 4]}, "runtime.buckets"), ({"buckets": []}, "runtime.buckets"),
                                      ({"buckets": [0, 4]}, "runtime.buckets"),
                                      ({"cache": "dynamic", "compile": True}, "runtime.compile")])
def test_runtime_config_errors(bad, msg):
    cfg = from_dict(DecodeConfig, {"runtime": bad})
    with pytest.raises(ConfigError, match=msg):
        cfg.validate()


def test_runtime_unknown_key_and_buckets():
    with pytest.raises(ConfigError, match="runtime.graphs"):
        from_dict(DecodeConfig, {"runtime": {"graphs": 3}})
    rt = RuntimeConfig(buckets=[1, 4, 8])
    assert [rt.bucket(n) for n in (1, 2, 4, 5, 8, 9, 70)] == [1, 4, 4, 8, 8, 9, 70]
