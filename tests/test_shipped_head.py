"""The shipped EAGLE head on the real SmolLM2: lossless with every shipped head config."""
from pathlib import Path

import pytest

from eagle.head import load_head

from conftest import shipped_config_mean_tau

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]


def test_head_matches_its_target(smollm2):
    model, _ = smollm2
    head = load_head(ROOT / "heads/smollm2-135m", model)
    assert head.config.target == "smollm2-135m" and head.config.hidden_size == 576
    assert head.draft_vocab.numel() == 8192


@pytest.mark.parametrize("config", ["eagle2-cpu", "eagle1-static", "eagle2-dynamic"])
def test_shipped_head_greedy_identical(smollm2, config):
    _, tau = shipped_config_mean_tau(smollm2, ROOT / f"experiments/configs/{config}.yaml")
    assert tau > 1.2  # a trained head: drafts do get accepted
