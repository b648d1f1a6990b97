"""The shipped EAGLE-3 head (heads/smollm2-135m-eagle3) on the real SmolLM2: what it is, lossless
with both EAGLE-3 configs, and its official EAGLE-3 / vLLM exports load back to the same weights."""
from pathlib import Path

import pytest
import torch

from eagle.heads import load_head
from eagle.heads.eagle3 import Eagle3Head
from eagle.heads.formats import export_head

from conftest import shipped_config_mean_tau

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]
HEAD = ROOT / "heads/smollm2-135m-eagle3"


def test_head_is_the_eagle3_head_of_its_target(smollm2):
    model, _ = smollm2
    head = load_head(HEAD, model)
    assert isinstance(head, Eagle3Head) and head.feature_layers == (2, 15, 27)  # hidden_states[2], [L//2], [L-3]
    assert head.config.target == "smollm2-135m" and head.lm_head.weight.shape == (8192, 576)
    assert head.fc.weight.shape == (576, 3 * 576)


@pytest.mark.parametrize("config", ["eagle3-cpu", "eagle3-dynamic"])
def test_shipped_eagle3_configs_greedy_identical(smollm2, config):
    _, tau = shipped_config_mean_tau(smollm2, ROOT / f"experiments/configs/{config}.yaml")
    assert tau > 1.2  # a trained head: drafts do get accepted


@pytest.mark.parametrize("fmt", ["eagle3", "vllm"])
def test_exports_load_back_to_the_same_weights(smollm2, tmp_path, fmt):
    model, _ = smollm2
    head = load_head(HEAD, model)
    export_head(HEAD, fmt, tmp_path / fmt)
    back = load_head(tmp_path / fmt, model)
    assert isinstance(back, Eagle3Head) and back.feature_layers == head.feature_layers
    assert torch.equal(back.draft_ids, head.draft_ids)
    mine, theirs = head.state_dict(), back.state_dict()
    assert mine.keys() == theirs.keys()
    for name, t in mine.items():
        assert torch.equal(t.float(), theirs[name].float()), name
