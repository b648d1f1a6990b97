"""The automatic fallback: drafting stops while it measures slower than plain decoding."""
import pytest
import torch

from eagle.config import ConfigError, from_dict, DecodeConfig
from eagle.decoder import TreeDecoder
from eagle.fallback import FallbackConfig, FallbackPolicy


def drive(policy, steps, draft_rate, plain_rate, draft_tokens=3, jitter=None):
    """Run the policy over ``steps`` steps with fixed rates (``jitter(step)`` -> tokens of a drafting
    step, to model acceptance noise); returns the drafting decisions."""
    decisions = []
    for i in range(steps):
        d = policy.use_draft()
        decisions.append(d)
        tokens = (jitter(i) if jitter else draft_tokens) if d else 1
        policy.record(d, tokens, (draft_tokens if d else 1) / (draft_rate if d else plain_rate))
    return decisions


def runs_of_plain(decisions):
    runs, cur = [], 0
    for x in decisions:
        if not x:
            cur += 1
        elif cur:
            runs.append(cur)
            cur = 0
    return runs


def test_disabled_always_drafts():
    assert all(drive(FallbackPolicy(FallbackConfig(enabled=False)), 50, 1.0, 100.0))


def test_calibrates_then_keeps_drafting_when_it_pays():
    d = drive(FallbackPolicy(FallbackConfig(enabled=True, calibrate=2)), 100, draft_rate=30.0, plain_rate=20.0)
    assert d[:2] == [False, False] and all(d[2:])


def test_falls_back_and_backs_off_when_drafting_loses():
    cfg = FallbackConfig(enabled=True, min_steps=6, probe=4, calibrate=2, backoff=8, max_backoff=32)
    d = drive(FallbackPolicy(cfg), 300, draft_rate=10.0, plain_rate=20.0)
    assert d[:2] == [False, False] and d[2:8] == [True] * 6  # calibration, then min_steps of drafting
    assert d[8:16] == [False] * 8  # first back-off
    assert d[16:20] == [True] * 4  # a probe of 4 steps on a fresh estimate
    runs = runs_of_plain(d[2:])
    assert runs[:3] == [8, 16, 32] and all(r == 32 for r in runs[3:])  # doubling, capped
    assert sum(d) / len(d) < 0.2  # a losing drafter costs only the probes


def test_noisy_acceptance_of_a_winning_drafter_does_not_trigger_it():
    # 1.3x on average, tokens per step 1..5 at random: the decayed estimate rides out unlucky runs
    g = torch.Generator().manual_seed(0)
    toks = torch.randint(1, 6, (400,), generator=g).tolist()  # mean 3 tokens per drafting step
    d = drive(FallbackPolicy(FallbackConfig(enabled=True)), 400, draft_rate=26.0, plain_rate=20.0,
              jitter=lambda i: toks[i])
    assert sum(d) / len(d) > 0.9


def test_recovers_when_drafting_starts_paying():
    cfg = FallbackConfig(enabled=True, min_steps=4, probe=4, calibrate=2, backoff=8, max_backoff=32)
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
    cfg = from_dict(DecodeConfig, {"fallback": {"enabled": True, "probe": 0}})
    with pytest.raises(ConfigError, match="probe"):
        cfg.validate()


def test_decoder_with_fallback_is_still_lossless_and_remembers(tiny_model, monkeypatch):
    """The decoder's clock is a fake one in which every drafting step costs a second more than a
    plain step, so "drafting does not pay" holds whatever the machine's speed (a real clock made
    this test depend on timings: on a loaded 2-core machine the tiny random drafter sometimes won)."""
    from conftest import RandomTreeDrafter

    clock = [0.0]

    class FakeTime:
        @staticmethod
        def perf_counter():
            clock[0] += 1e-3
            return clock[0]

    class SlowDrafter(RandomTreeDrafter):
        def propose(self, root, sampling):
            clock[0] += 1.0
            return super().propose(root, sampling)

    monkeypatch.setattr("eagle.decoder.time", FakeTime)
    model = tiny_model("llama")
    prompt = torch.randint(1, 128, (10,), generator=torch.Generator().manual_seed(0))
    expected = TreeDecoder(model).generate(prompt, 40).tokens
    dec = TreeDecoder(model, SlowDrafter(128, seed=1), fallback=FallbackConfig(enabled=True, min_steps=3, calibrate=2))
    out = dec.generate(prompt, 40)
    assert out.tokens == expected
    assert out.stats.plain_steps >= 2  # the calibration steps ran without drafting
    again = dec.generate(prompt, 40)
    assert again.tokens == expected
    # the policy's measurements carried over: no second calibration, and (a random drafter never
    # pays) the second call starts inside a back-off
    assert dec.policy.plain.steps >= out.stats.plain_steps and again.stats.plain_steps >= 1
