"""The shipped distilled draft model on the real SmolLM2: loads onto its target and is lossless."""
from pathlib import Path

import pytest

from eagle.draft_model import load_draft_model
from eagle.prompts import encode_chat

from conftest import SHIPPED_PROMPTS, shipped_config_mean_tau

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]
DRAFT = ROOT / "draft-models/smollm2-135m-3l"


def test_draft_model_shares_its_target_embedding(smollm2):
    model, _ = smollm2
    small = load_draft_model(DRAFT, model)
    assert small.config.num_hidden_layers == 3
    assert small.get_input_embeddings().weight is model.get_input_embeddings().weight
    stored = sum(p.numel() for n, p in small.named_parameters() if "embed_tokens" not in n and "lm_head" not in n)
    assert 5e6 < stored < 20e6  # the three layers + norm; the 28 M embedding is the target's


def test_chain_draft_model_greedy_identical(smollm2):
    _, tok = smollm2
    dec, tau = shipped_config_mean_tau(smollm2, ROOT / "experiments/configs/chain-draft-model.yaml")
    assert tau > 1.3  # a trained draft: its tokens do get accepted
    # sampling runs too (the exactness of the rule itself is tested on small models)
    out = dec.generate(encode_chat(tok, SHIPPED_PROMPTS[1]), 24, temperature=1.0, seed=0)
    assert len(out.tokens) == 24 or out.tokens[-1] in dec.eos
