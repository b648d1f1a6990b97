"""The shipped EAGLE head on the real SmolLM2: lossless with every shipped head config."""
from pathlib import Path

import pytest

from eagle.heads import load_head

from conftest import shipped_config_mean_tau

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]


def test_head_matches_its_target(smollm2):
    model, _ = smollm2
    head = load_head(ROOT / "heads/smollm2-135m-subtasks", model)
    assert head.config.target == "smollm2-135m" and head.config.hidden_size == 576
    assert head.draft_vocab.numel() == 8192


@pytest.mark.parametrize("config", ["eagle2-cpu", "eagle1-static", "eagle2-dynamic"])
def test_shipped_head_greedy_identical(smollm2, config):
    _, tau = shipped_config_mean_tau(smollm2, ROOT / f"experiments/configs/{config}.yaml")
    assert tau > 1.2  # a trained head: drafts do get accepted


def test_drafter_time_script_restores_the_drafter_state(smollm2):
    """experiments/drafter_time.py times repeated ``propose`` calls from one decoding state: every
    repeat must draft the same full tree, in float32 and in bf16."""
    import dataclasses
    import importlib.util

    import torch

    from eagle.config import load_config

    spec = importlib.util.spec_from_file_location("drafter_time", ROOT / "experiments/drafter_time.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    config = load_config(ROOT / "experiments/configs/eagle2-dynamic.yaml")
    for dtype in ("float32", "bfloat16"):
        options = dataclasses.replace(config.drafter.options, dtype=dtype)
        cfg = dataclasses.replace(config, drafter=dataclasses.replace(config.drafter, options=options))
        times, trees, compile_s = mod.propose_times(*smollm2, cfg, "Name three primary colors.", step=3, repeats=2)
        assert len(times) == 2 and min(times) > 0 and len(trees) == 3 and compile_s == 0
        assert len(trees[0]) == config.tree.options.total_tokens + 1
        for t in trees[1:]:
            assert torch.equal(t.tokens, trees[0].tokens) and torch.equal(t.parents, trees[0].parents)
        if dtype == "float32":  # --compiled-levels: the compiled tree levels draft the same tree
            _, ctrees, compile_s = mod.propose_times(*smollm2, cfg, "Name three primary colors.", step=3, repeats=1,
                                                     compiled=True)
            assert compile_s > 0
            assert torch.equal(ctrees[-1].tokens, trees[0].tokens) and torch.equal(ctrees[-1].parents, trees[0].parents)


def test_drafter_time_in_loop_times_each_propose_three_ways(smollm2):
    """experiments/drafter_time.py --in-loop: every decoding step's ``propose`` timed as decoding
    runs it, repeated at once and after a cache flush, each repeat drafting the same tree (the
    function asserts it) from the restored state."""
    import dataclasses
    import importlib.util

    from eagle.config import load_config

    spec = importlib.util.spec_from_file_location("drafter_time", ROOT / "experiments/drafter_time.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    config = load_config(ROOT / "experiments/configs/eagle2-cpu.yaml")
    config = dataclasses.replace(config, runtime=dataclasses.replace(config.runtime, compile=False))
    times = mod.in_loop_times(*smollm2, config, ["Name three primary colors."], max_new_tokens=12)
    assert set(times) == {"after_verify", "repeated", "after_flush"}
    steps = len(times["after_verify"])
    assert steps >= 3 and all(len(v) == steps and min(v) > 0 for v in times.values())
