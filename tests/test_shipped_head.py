"""The shipped EAGLE head on the real SmolLM2: lossless with every shipped head config."""
from pathlib import Path

import pytest

import eagle
from eagle.head import load_head
from eagle.prompts import encode_chat

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]
PROMPTS = ["Write a Python function that returns the largest of three numbers.",
           "Give me three tips for sleeping better.",
           "What is 12 times 17? Show your steps."]


@pytest.fixture(scope="module")
def smollm2():
    return eagle.load_target("smollm2-135m")


def test_head_matches_its_target(smollm2):
    model, _ = smollm2
    head = load_head(ROOT / "heads/smollm2-135m", model)
    assert head.config.target == "smollm2-135m" and head.config.hidden_size == 576
    assert head.draft_vocab.numel() == 8192


@pytest.mark.parametrize("config", ["eagle2-cpu", "eagle1-static", "eagle2-dynamic"])
def test_shipped_head_greedy_identical(smollm2, config):
    model, tok = smollm2
    dec = eagle.TreeDecoder.from_config(model, eagle.load_config(ROOT / f"experiments/configs/{config}.yaml"))
    plain = eagle.TreeDecoder(dec.target)
    taus = []
    for text in PROMPTS:
        ids = encode_chat(tok, text)
        out = dec.generate(ids, 40)
        assert out.tokens == plain.generate(ids, 40).tokens
        taus.append(out.stats.tau)
    assert sum(taus) / len(taus) > 1.2  # a trained head: drafts do get accepted
