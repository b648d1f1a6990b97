"""The automatic fallback: drafting stops while it measures slower than plain decoding."""
import pytest
import torch

from eagle.config import ConfigError, from_dict, DecodeConfig
from eagle.decoder import TreeDecoder
from eagle.fallback import FallbackConfig, FallbackPolicy


def drive(policy, steps, draft_rate, plain_rate, draft_tokens=3):
    """Run the policy over ``steps`` steps with fixed rates; returns the drafting decisions."""
    decisions = []
    for _ in range(steps):
        d = policy.use_draft()
        decisions.append(d)
        tokens = draft_tokens if d else 1
        policy.record(d, tokens, tokens / (draft_rate if d else plain_rate))
    return decisions


def test_disabled_always_drafts():
    assert all(drive(FallbackPolicy(FallbackConfig(enabled=False)), 50, 1.0, 100.0))


def test_calibrates_then_keeps_drafting_when_it_pays():
    d = drive(FallbackPolicy(FallbackConfig(enabled=True, calibrate=2)), 100, draft_rate=30.0, plain_rate=20.0)
    assert d[:2] == [False, False] and all(d[2:])


def test_falls_back_and_backs_off_when_drafting_loses():
    cfg = FallbackConfig(enabled=True, window=4, calibrate=2, backoff=8, max_backoff=32)
    d = drive(FallbackPolicy(cfg), 200, draft_rate=10.0, plain_rate=20.0)
    assert d[:2] == [False, False] and d[2:6] == [True] * 4  # calibration, then one window of drafting
    assert d[6:14] == [False] * 8  # first back-off
    runs, cur = [], 0
    for x in d[6:]:
        if not x:
            cur += 1
        elif cur:
            runs.append(cur)
            cur = 0
    assert runs[:3] == [8, 16, 32] and all(r == 32 for r in runs[3:])  # doubling, capped
    assert sum(d) / len(d) < 0.2  # a losing drafter costs only the probes


def test_recovers_when_drafting_starts_paying():
    cfg = FallbackConfig(enabled=True, window=4, calibrate=2, backoff=8)
    policy = FallbackPolicy(cfg)
    drive(policy, 30, draft_rate=10.0, plain_rate=20.0)
    later = drive(policy, 100, draft_rate=40.0, plain_rate=20.0)
    assert all(later[-50:])


def test_fallback_config_validation():
    with pytest.raises(ConfigError, match="unknown key 'fallback.windw'"):
        from_dict(DecodeConfig, {"fallback": {"windw": 3}})
    cfg = from_dict(DecodeConfig, {"fallback": {"enabled": True, "margin": 0}})
    with pytest.raises(ConfigError, match="margin"):
        cfg.validate()


def test_decoder_with_fallback_is_still_lossless(tiny_model):
    from conftest import RandomTreeDrafter

    model = tiny_model("llama")
    prompt = torch.randint(1, 128, (10,), generator=torch.Generator().manual_seed(0))
    expected = TreeDecoder(model).generate(prompt, 40).tokens
    dec = TreeDecoder(model, RandomTreeDrafter(128, seed=1), fallback=FallbackConfig(enabled=True, window=3, calibrate=2))
    out = dec.generate(prompt, 40)
    assert out.tokens == expected
    assert out.stats.plain_steps >= 2  # the calibration steps ran without drafting
