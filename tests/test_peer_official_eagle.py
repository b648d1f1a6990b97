"""experiments/peer_official_eagle.py: its pure logic only (the tree-budget mapping, counting an
official generation up to EOS / the token budget, argument errors). The real side-by-side run needs
the peer venv and is the documented command (docs/peer_official_eagle.md)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def peer():
    spec = importlib.util.spec_from_file_location("peer_official_eagle", ROOT / "experiments" / "peer_official_eagle.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_tree_budget_mapping(peer):
    # eagle2-dynamic: 6 drafted levels, top 10, 60 drafted nodes == official depth 5, top_k 10, total_token 61
    assert peer.official_budget(6, 10, 60) == {"depth": 5, "top_k": 10, "total_token": 61}
    # the former eagle2-cpu (of the peer run): 3 levels, top 2, 4 nodes == official depth 2, top_k 2, total_token 5
    assert peer.official_budget(3, 2, 4) == {"depth": 2, "top_k": 2, "total_token": 5}
    for shape in [(6, 10, 60), (3, 2, 4), (1, 4, 4), (2, 1, 2)]:
        off = peer.official_budget(*shape)
        assert peer.our_budget(off["depth"], off["top_k"], off["total_token"]) == dict(
            zip(("depth", "top_k", "total_tokens"), shape))


def test_tree_budget_errors(peer):
    with pytest.raises(ValueError, match="tree.depth must be a positive integer"):
        peer.official_budget(0, 2, 4)
    with pytest.raises(ValueError, match="tree.top_k"):
        peer.official_budget(3, True, 4)
    # one level of top 2 holds 2 candidates; the official torch.topk over them cannot pick 3
    with pytest.raises(ValueError, match="exceeds the 2 candidates"):
        peer.official_budget(1, 2, 3)
    assert peer.official_budget(2, 2, 6)["total_token"] == 7  # 2 + 4 candidates: exactly enough
    with pytest.raises(ValueError):
        peer.our_budget(2, 2, 1)


def test_stop_length(peer):
    assert peer.stop_length([5, 6, 7, 8], 3, {2}) == 3  # the budget
    assert peer.stop_length([5, 2, 7, 8], 3, {2}) == 2  # EOS, kept
    assert peer.stop_length([5, 6, 7, 2], 3, {2}) == 3  # EOS past the budget does not count
    assert peer.stop_length([5, 6], 8, {2}) == 2


def test_count_official_cuts_at_budget(peer):
    # root from the prefill, then steps emitting 2, 2, 4, 3 tokens: 1 + 11 = 12 tokens in all
    accepted, tokens = [1, 1, 3, 2], list(range(10, 22))
    full = peer.count_official(accepted, tokens, 100, {2})
    assert full == {"tokens": 12, "forwards": 4, "tau": 11 / 4}
    # a budget of 7 tokens is reached inside step 3 (1 + 2 + 2 = 5 < 7 <= 9): 3 forwards, the rest ignored
    assert peer.count_official(accepted, tokens, 7, {2}) == {"tokens": 7, "forwards": 3, "tau": 6 / 3}
    assert peer.count_official(accepted, tokens, 5, {2}) == {"tokens": 5, "forwards": 2, "tau": 2.0}


def test_count_official_cuts_at_eos(peer):
    accepted = [1, 1, 3, 2]
    tokens = [10, 11, 12, 13, 2, 15, 16, 17, 18]  # EOS is token 5 (emitted by step 2), the loop ran on
    assert peer.count_official(accepted, tokens, 128, {2}) == {"tokens": 5, "forwards": 2, "tau": 2.0}
    # EOS as the prefill's token: no decode forward, tau 1 as in DecodeStats
    assert peer.count_official([3], [2, 5, 6, 7], 128, {2}) == {"tokens": 1, "forwards": 0, "tau": 1.0}
    with pytest.raises(ValueError, match="fewer than the"):
        peer.count_official([1], list(range(10, 20)), 128, {2})


def _record():
    # prefill 1.0 s; three steps, each: draft, verify and (to t_end) the rest
    steps = [{"draft_s": 0.2, "verify_s": 0.5, "t_end": 2.0}, {"draft_s": 0.1, "verify_s": 0.4, "t_end": 2.7},
             {"draft_s": 0.1, "verify_s": 0.4, "t_end": 3.4}]
    return {"prefill_s": 1.0, "steps": steps, "accepted": [1, 0, 2], "tree_nodes": [5, 5, 5],
            "tokens": [10, 11, 12, 13, 14, 15, 16, 17], "full_s": 4.0}


def test_official_timing_counts_only_the_kept_steps(peer):
    t = peer.official_timing(_record(), 2)
    assert t["seconds"] == 2.7 and t["prefill_s"] == 1.0
    assert t["draft_s"] == pytest.approx(0.3) and t["verify_s"] == pytest.approx(0.9)
    assert t["other_s"] == pytest.approx(2.7 - 1.0 - 0.3 - 0.9)
    assert peer.official_timing(_record(), 0)["seconds"] == 1.0
    with pytest.raises(ValueError, match="recorded"):
        peer.official_timing(_record(), 4)


def test_plain_seconds(peer):
    assert peer.plain_seconds([0.5, 0.6, 0.7], 2) == 0.6
    with pytest.raises(ValueError):
        peer.plain_seconds([0.5], 2)


def test_summarize_official(peer):
    rec = _record()
    plain = {"tokens": [10, 11, 12, 13, 14, 99, 98], "forward_ends": [0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1], "full_s": 1.1}
    # budget 5: steps 1-2 emit 1 + 2 + 1 = 4 < 5, step 3 reaches it: 3 forwards, 3.4 s
    s = peer.summarize_official([rec], [plain], [[10, 11, 12, 13, 14]], 5, {2})
    assert s["tau"] == 4 / 3 and s["tokens"] == 5 and s["forwards"] == 3
    assert s["tokens_per_s"] == pytest.approx(5 / 3.4)
    assert s["identical_to_plain"] == 1 and s["identical_to_our_plain"] == 1
    assert s["accepted_hist"] == [1, 1, 1] and s["mean_tree_nodes"] == 5
    assert s["step_ms"]["draft"] == pytest.approx(1000 * 0.4 / 3)
    assert s["full_call"] == {"seconds": 4.0, "tokens": 8, "tokens_per_s": 2.0}
    p = peer.summarize_official_plain([plain], [[10, 11, 12, 13, 15]], 5, {2})
    assert p["tokens_per_s"] == pytest.approx(5 / 0.9) and p["identical_to_our_plain"] == 0


def test_tree_of_config(peer):
    cfg = {"drafter": {"type": "eagle", "head": "h"}, "tree": {"shape": "dynamic", "depth": 3, "top_k": 2, "total_tokens": 4}}
    assert peer.tree_of(cfg, "c.yaml") == {"depth": 3, "top_k": 2, "total_tokens": 4}
    with pytest.raises(ValueError, match="c.yaml: tree.shape must be 'dynamic'"):
        peer.tree_of({**cfg, "tree": {"shape": "static", "choices": [[0]]}}, "c.yaml")
    with pytest.raises(ValueError, match="drafter.type must be 'eagle'"):
        peer.tree_of({**cfg, "drafter": {"type": "ngram"}}, "c.yaml")


@pytest.mark.parametrize("argv, message", [
    (["--limit", "0"], "--limit must be >= 1"),
    (["--max-new-tokens", "0"], "--max-new-tokens must be >= 1"),
    (["--threads", "-1"], "--threads must be >= 0"),
    (["--config", "no/such.yaml"], "config file not found: no/such.yaml"),
    (["--head-dtype", "float16"], "invalid choice"),
])
def test_argument_errors(peer, argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        peer.parse_args(argv)
    assert e.value.code == 2
    assert message in capsys.readouterr().err


def test_defaults(peer):
    args = peer.parse_args([])
    assert args.config == peer.DEFAULT_CONFIGS and args.max_new_tokens == 128 and args.extra.endswith("eagle2-cpu.yaml")
    assert peer.PEER_TORCH == "torch==2.13.0"  # installed first and alone: never a CUDA torch


def test_pooled_tau_subtracts_every_prefill_token(peer):
    stats = [{"new_tokens": 12, "target_forwards": 5}, {"new_tokens": 12, "target_forwards": 4}]
    assert peer.pooled_tau(stats) == 22 / 9  # not (24 - 1) / 9
    assert peer.pooled_tau([{"new_tokens": 1, "target_forwards": 0}]) == 1.0


def test_report_and_table_from_raw(peer):
    rec = _record()
    plain = {"tokens": [10, 11, 12, 13, 14, 99], "forward_ends": [0.5, 0.6, 0.7, 0.8, 0.9, 1.0], "full_s": 1.0}
    step_ms = {"draft": 1.0, "verify": 2.0, "bookkeeping": 0.5}
    run = lambda name: {"config": name, "mean_accepted": 9.9, "tokens_per_s": 3.0, "speedup": 1.2,  # noqa: E731
                        "identical_to_plain": 1, "prompts": 1, "mean_tree_nodes": 5.0, "step_ms": step_ms,
                        "accepted_hist": [1, 1, 1]}
    raw = {"args": {"max_new_tokens": 5, "prompts": "p.jsonl", "limit": 1, "head_dtype": "float32"},
           "command": "python experiments/peer_official_eagle.py", "date": "d", "eos": [2],
           "trees": [{"name": "t", "ours": {"depth": 3, "top_k": 2, "total_tokens": 4},
                      "official": {"depth": 2, "top_k": 2, "total_token": 5}, "our_row": "t/exported"}],
           "ours": {"device": "cpu", "plain": {"tokens_per_s": 2.0, "hf_tokens_per_s": 2.1}, "runs": [run("t/exported"), run("x/shipped")]},
           "our_records": {"t/exported": {"0": {"stats": {"new_tokens": 5, "target_forwards": 3}}},
                           "x/shipped": {"0": {"stats": {"new_tokens": 5, "target_forwards": 2}}}},
           "official_info": {"threads": 2}, "official_eagle": {"t": [rec]}, "official_plain": [plain],
           "our_plain": [[10, 11, 12, 13, 14]], "order": [["ours", "official"]], "machine_load": {}, "data_job_paused": False}
    res = peer.report(raw)
    row = res["trees"][0]
    assert row["ours"]["tau"] == 4 / 3 and row["official"]["tau"] == 4 / 3 and row["tau_diff_pct"] == 0.0
    assert row["tok_s_ratio"] == pytest.approx(3.0 / (5 / 3.4))
    assert res["extra"][0]["tau"] == 2.0 and res["plain"]["official"]["tokens_per_s"] == pytest.approx(5 / 0.9)
    table = peer.format_markdown(res)
    assert "| t (3/2/4; 2/2/5) | ours | 1.33 |" in table and "| x/shipped (ours only) | ours | 2.00 |" in table
