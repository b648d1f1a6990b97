"""The experiment scripts' own logic (their real runs are the documented commands; a slow test runs one tiny real run)."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from eagle.config import DecodeConfig, from_dict

ROOT = Path(__file__).resolve().parents[1]


def _script(name: str):
    """experiments/<name>.py as a module (``name`` may name a subfolder: ``perf/packed_gemm``)."""
    spec = importlib.util.spec_from_file_location(Path(name).name, ROOT / "experiments" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def test_cost_curve_paths():
    cc = _script("cost_curve")
    rt = cc.parse_path("static-unpacked")
    assert rt.cache == "static" and not rt.packed_linear and not rt.compile and rt.dtype == ""
    rt = cc.parse_path("static-bf16-compiled")
    assert rt.dtype == "bfloat16" and rt.compile and rt.packed_linear
    assert cc.parse_path("dynamic").cache == "dynamic"
    import pytest

    with pytest.raises(SystemExit, match="unknown path"):
        cc.parse_path("paged")
    assert cc.weight_bytes(torch.nn.Linear(4, 3)) == (12 + 3) * 4


def test_packed_gemm_script_runs(capsys):
    from eagle_kernels.onednn import packed_gemm_available

    if not packed_gemm_available():
        return  # nothing to compare on a build without MKL's packed GEMM
    assert _script("perf/packed_gemm").main(["--rows", "1,4", "--layers", "1", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    assert "| 1 |" in out and "| 4 |" in out


def test_ablations_report_collects_tables_plots_and_commands(tmp_path):
    rep = _script("ablations_report")
    abl = tmp_path / "ablations"
    abl.mkdir()
    (abl / "alpha.yaml").write_text("description: >-\n  First\n  question.\ngrid: {tree.depth: [1, 2]}\n")
    (abl / "beta.yaml").write_text("description: Second.\ngrid: {tree.depth: [1]}\n")
    res = tmp_path / "results"
    (res / "alpha").mkdir(parents=True)
    (res / "alpha" / "results.json").write_text('{"command": "eagle sweep --grid alpha.yaml --out x"}')
    (res / "alpha" / "table.md").write_text("| cell | tau |\n|---|---:|\n| a | 1.50 |\n")
    (res / "alpha" / "tau_speedup.png").write_bytes(b"\x89PNG")
    rep.ROOT = tmp_path  # commands are shown relative to the repository root
    doc = rep.render(sorted(abl.glob("*.yaml")), res, tmp_path / "docs")
    assert "## alpha" in doc and "First question." in doc and "eagle sweep --grid alpha.yaml --out x" in doc
    assert "| a | 1.50 |" in doc and "](../results/alpha/tau_speedup.png)" in doc
    assert "acceptance.png" not in doc  # only plots that exist are linked
    assert "## beta" in doc and "Not run yet: `eagle sweep --grid ablations/beta.yaml --out results/beta`" in doc


def test_ablations_report_redraws_tables_and_plots_from_results(tmp_path):
    rep = _script("ablations_report")
    abl = tmp_path / "ablations"
    abl.mkdir()
    (abl / "budget.yaml").write_text("description: Budget.\ngrid: {tree.total_tokens: [4, 8]}\nx: tree.total_tokens\n")
    cell = lambda n, tau: {"cell": f"c[tree.total_tokens={n}]", "grid": {"tree.total_tokens": n}, "temperature": 0.0,  # noqa: E731
                           "config": {"tree": {"total_tokens": n}}, "tau": tau, "alpha": 0.5, "tokens_per_s": 10.0,
                           "speedup": 1.1, "speedup_vs_hf": 1.0, "identical_to_plain": 3, "prompts": 3,
                           "mean_tree_nodes": n + 1.0, "plain_steps": 0, "per_depth_acceptance": [0.7, 0.4],
                           "accepted_hist": [2, 3, 1], "step_ms": {"draft": 1.0, "verify": 2.0, "bookkeeping": 0.5}}
    summary = {"settings": {"target": "t", "max_new_tokens": 8, "top_p": 1.0}, "command": "eagle sweep ...",
               "baselines": {"0.0": {"tokens_per_s": 9.0, "hf_tokens_per_s": 9.5}}, "cells": [cell(4, 1.9), cell(8, 2.3)]}
    summary["cells"][1]["config"]["drafter"] = {"type": "eagle", "head": "heads/h2"}
    summary["cells"][0]["config"]["drafter"] = {"type": "eagle", "head": "heads/h1"}
    out = tmp_path / "results" / "budget"
    out.mkdir(parents=True)
    (out / "results.json").write_text(__import__("json").dumps(summary))
    rep.ROOT = tmp_path
    doc = rep.render([abl / "budget.yaml"], tmp_path / "results", tmp_path / "docs")
    assert "| c[tree.total_tokens=8] | 8 | 2.30 |" in doc and "3/3" in doc
    assert "Heads the cells drafted with: `heads/h1`, `heads/h2`." in doc  # what was measured, not what a config names now
    assert (out / "tau_speedup.png").exists() and (out / "acceptance.png").exists() and (out / "results.csv").exists()


def test_draft_vocab_coverage_counts_targets_inside_the_top_n():
    dvc = _script("draft_vocab_coverage")
    gen = torch.Generator().manual_seed(0)
    counts = torch.randperm(50, generator=gen) * 3  # distinct frequencies: no ties
    targets = torch.randint(0, 50, (400,), generator=gen)
    sizes = [1, 5, 17, 50]
    got = dvc.coverage(counts, targets, sizes)
    for n in sizes:  # the obvious way: the set of the n most frequent ids
        top = set(sorted(range(50), key=lambda i: -int(counts[i]))[:n])
        assert got[n] == sum(int(t) in top for t in targets) / len(targets)
    assert got[50] == 1.0


def test_draft_vocab_coverage_reads_answer_positions_only():
    from eagle.train.data import Sequence

    dvc = _script("draft_vocab_coverage")
    weight = torch.eye(4)  # (V=4, H=4): the argmax of a one-hot feature is its index
    hidden = torch.eye(4)[[0, 1, 2, 3, 1, 2]].half()  # (6, 4)
    seq = Sequence(torch.arange(6), hidden, prompt_len=3)
    # the positions predicting the answer tokens 3..5 are 2, 3, 4; the last one (5) predicts nothing
    assert dvc.answer_argmax([seq], weight).tolist() == [2, 3, 1]


def test_forward_profile_growth_table_sums_to_the_totals():
    fp = _script("perf/forward_profile")
    per = {1: {"a": 1.0, "b": 2.0, "c": 0.5}, 16: {"a": 4.0, "b": 2.5, "d": 0.25}}
    rows = fp.growth_table(per, top=2)
    assert rows[2].startswith("| `a` | 1.00 | 4.00 | +3.00")  # largest growth first
    assert rows[3].startswith("| `b` | 2.00 | 2.50 | +0.50")
    assert rows[4] == "| (all others) | 0.50 | 0.25 | -0.25 |"  # c (gone) and d (new)
    assert rows[5] == "| **total** | 3.50 | 6.75 | +3.25 |"

    class Ev:
        def __init__(self, key, us):
            self.key, self.self_cpu_time_total = key, us

    assert fp.self_ms_per_call([Ev("x", 3000.0), Ev("y", 500.0)], repeats=2) == {"x": 1.5, "y": 0.25}


@pytest.mark.slow
def test_gqa_fold_ab_runs_on_the_real_target(capsys):
    from eagle import attention

    ab = _script("perf/gqa_fold_ab")
    fold_below = attention.FOLD_BELOW
    try:
        assert ab.main(["--prefix", "12", "--sizes", "1,4", "--rounds", "1", "--per-round", "1"]) == 0
    finally:
        attention.FOLD_BELOW = fold_below
    rows = [r for r in capsys.readouterr().out.splitlines() if r.startswith("| 1 |") or r.startswith("| 4 |")]
    assert len(rows) == 2 and all(float(r.split("|")[4]) > 0 for r in rows)


def test_compiled_step_ab_checks_its_arguments():
    ab = _script("perf/compiled_step_ab")
    with pytest.raises(SystemExit, match="--products goes with --what tiles"):
        ab.main(["--what", "guards", "--products"])
    with pytest.raises(SystemExit, match="--sizes must be positive integers"):
        ab.main(["--what", "tiles", "--sizes", "1,x"])
    with pytest.raises(SystemExit, match="--what must be guards, scope, asserts, mkl, attention, attention-way, head, tiles or plan"):
        ab.sides("cache", None, "")


def test_compiled_step_ab_attention_sides_differ_only_in_the_cpu_op(monkeypatch):
    """--what attention: both sides on the CPU backend; the baseline runs eagle/attention.py's
    folding without the CPU op ("eagle_gqa_sdpa"), the shipped side the backend's op
    ("eagle_cpu_sdpa"); a step of each gives the same logits."""
    from conftest import make_random_tree, make_tiny_model

    from eagle_kernels import cpu_attention

    ab = _script("perf/compiled_step_ab")
    model = make_tiny_model("llama")
    (whole, _), (shipped, _) = ab.sides("attention", model, "").values()
    assert whole.backend.name == shipped.backend.name == "cpu"
    assert whole.model.config._attn_implementation == "eagle_gqa_sdpa"
    assert shipped.model.config._attn_implementation == "eagle_cpu_sdpa"
    taken = []
    original = cpu_attention.masked_attention
    monkeypatch.setattr(cpu_attention, "masked_attention", lambda *a, **kw: taken.append(1) or original(*a, **kw))
    gen = torch.Generator().manual_seed(0)
    ids, tree = torch.randint(0, 128, (9,), generator=gen), make_random_tree(5, 128, gen)
    logits = []
    for t in (whole, shipped):
        t.runtime.compile = t.compiled = False  # eager steps: the same attention functions, no compiling
        cache = t.new_cache(32)
        t.prefill(ids, cache)
        taken.clear()
        logits.append(t.tree_forward(tree, cache).logits)
        if cpu_attention.available():
            assert bool(taken) == (t is shipped)
    torch.testing.assert_close(logits[0], logits[1], atol=1e-5, rtol=1e-5)


def test_compiled_step_ab_attention_way_sides_switch_the_op():
    """--what attention-way: one Target; each side's call sets the op's way, and the shipped way is
    what is left set."""
    from conftest import make_tiny_model

    from eagle_kernels import cpu_attention

    if not cpu_attention.available():
        return  # the script refuses this A/B without the extension
    ab = _script("perf/compiled_step_ab")
    named = ab.sides("attention-way", make_tiny_model("llama"), "")
    assert list(named) == ["SDPA", "tiled loop (shipped)"]
    (t1, sdpa), (t2, tiled) = named.values()
    assert t1 is t2
    try:
        sdpa()
        assert cpu_attention.way() == "sdpa"
    finally:
        tiled()
    assert cpu_attention.way() == "tiled"


def test_compiled_step_ab_backend_sides_differ_in_one_choice_each():
    """--what guards / asserts / mkl: every side on its own CPU backend object; guards switches the
    backend's guard context between calls (the shipped one left set), asserts gives one side a
    torch.compile backend of its own, mkl's baseline has MKL's buckets on F.linear (the
    ``linear_ways`` patch undone after it is built)."""
    from conftest import make_tiny_model

    import eagle.backends.cpu as cb
    from eagle_kernels.onednn import packed_gemm_available

    ab = _script("perf/compiled_step_ab")
    model = make_tiny_model("llama")
    shipped_guards, ways = cb._guards_of, cb.linear_ways
    (t1, every), (t2, warm) = ab.sides("guards", model, "").values()
    assert t1 is t2 and t1.backend.name == "cpu"
    try:
        every()
        assert cb._guards_of is not shipped_guards
    finally:
        warm()
    assert cb._guards_of is shipped_guards
    (checked, _), (plain_asserts, _) = ab.sides("asserts", model, "").values()
    assert callable(checked.backend.step_backend) and plain_asserts.backend.step_backend == "inductor"
    (plain, _), (mkl, _) = ab.sides("mkl", model, "").values()
    assert cb.linear_ways is ways and not plain.backend.packed_rows
    if packed_gemm_available():  # EAGLE_CPU_LINEAR=always (conftest): MKL from 4 rows on
        assert mkl.backend.packed_rows == {b for b in mkl.runtime.buckets if b >= 4}


def test_compiled_step_ab_head_sides_differ_only_in_the_greedy_head():
    ab = _script("perf/compiled_step_ab")
    from conftest import make_tiny_model

    (full, _), (screened, _) = ab.sides("head", make_tiny_model("llama"), "").values()
    assert (full.runtime.greedy_head, screened.runtime.greedy_head) == ("full", "screened")
    assert full.runtime.compile and screened.runtime.compile


def test_cost_curve_buckets():
    """`--buckets` sets the static paths' buckets (default: the runtime's); bad buckets stop the
    script before any model is loaded, with a message naming the flag or the rule."""
    from eagle.runtime import DEFAULT_BUCKETS

    cc = _script("cost_curve")
    assert cc.parse_path("static-compiled").buckets == DEFAULT_BUCKETS
    assert cc.parse_path("static-compiled", [1, 26, 61]).buckets == [1, 26, 61]
    assert cc.parse_path("static-compiled", [1, 26, 61]).bucket(30) == 61
    with pytest.raises(SystemExit, match="--buckets must be positive integers"):
        cc.main(["--buckets", "1,x", "--target", "no-such-model"])
    with pytest.raises(SystemExit, match="runtime.buckets must be increasing"):
        cc.main(["--buckets", "8,4", "--target", "no-such-model"])
    with pytest.raises(SystemExit, match="--sizes must be positive integers"):
        cc.main(["--sizes", "0,4", "--target", "no-such-model"])


def test_cost_curve_fullhead_paths():
    cc = _script("cost_curve")
    assert cc.parse_path("static-compiled-fullhead").greedy_head == "full"
    assert cc.parse_path("static-compiled").greedy_head == "screened"


@pytest.mark.parametrize("bad", ["", "1,x", "0,4", "4,", "-1"])
def test_positive_ints_name_the_flag(bad):
    from eagle_kernels.cliargs import positive_ints

    assert positive_ints("1,4,16", "--rows") == [1, 4, 16]
    with pytest.raises(ValueError, match=f"--sizes must be positive integers separated by commas, got '{bad}'"):
        positive_ints(bad, "--sizes")


def test_bench_cpu_gemm_rejects_bad_rows(capsys):
    from eagle_kernels import bench_cpu_gemm

    assert bench_cpu_gemm.main(["--rows", "1,x"]) == 2
    assert "--rows must be positive integers separated by commas, got '1,x'" in capsys.readouterr().err


def test_greedy_head_screen_counts_what_the_bound_keeps():
    """The script's candidate rule is the op's, for each screen: the exact argmax is always among the
    candidates, and a head of near-copies of one row leaves several where a spread-out head leaves few."""
    from eagle_kernels import cpu_argmax

    if not cpu_argmax.available():
        pytest.skip("no CPU extension")
    gs = _script("perf/greedy_head_screen")
    gen = torch.Generator().manual_seed(1)
    hidden = torch.randn(6, 64, generator=gen)
    spread = torch.randn(500, 64, generator=gen)
    near = torch.randn(64, generator=gen) + 1e-4 * torch.randn(500, 64, generator=gen)
    for way in cpu_argmax._ways(1):  # every screen this machine has
        counts = gs.candidate_counts(hidden, spread, way)
        assert all(c >= 1 for c in counts) and min(gs.candidate_counts(hidden, near, way)) > max(counts), way
    with pytest.raises(SystemExit, match="--rows must be positive integers"):
        gs.main(["--rows", "0"])


def test_compiled_step_ab_code_copies_keep_separate_dynamo_caches():
    """The scope A/B's premise: a copy of a function with its own code object computes the same
    and is not the original's code (dynamo keys its graphs on the code object)."""
    ab = _script("perf/compiled_step_ab")

    def f(x, y=2, *, z=3):
        return x * y + z

    g = ab._fresh_forward(f)
    assert g(4) == f(4) == 11 and g(1, y=5, z=0) == 5 and g.__code__ is not f.__code__


def test_specbench_page_is_rendered_from_the_committed_json(tmp_path):
    """`make results` renders docs/specbench.md from experiments/results/specbench.json (and the
    acceptance JSON beside it) without a model: on a clean checkout it changes nothing."""
    rep = _script("specbench_report")
    out = tmp_path / "specbench.md"
    assert rep.main(["--out", str(out)]) == 0
    text = out.read_text()
    assert text == (ROOT / "docs/specbench.md").read_text()
    for section in ("## mt_bench", "## summarization", "## rag", "## pooled", "## Where a step's time goes",
                    "## Why acceptance falls per subtask"):
        assert section in text
    assert "| eagle2-auto |" in text and "| plain-compiled | 1.00 |" in text
    assert rep.main(["--json", str(tmp_path / "none.json"), "--out", str(out)]) == 2


def test_specbench_report_refuses_a_missing_baseline(tmp_path):
    rep = _script("specbench_report")
    with pytest.raises(SystemExit, match="has no run named 'nope'"):
        rep.main(["--baseline", "nope", "--out", str(tmp_path / "x.md")])


def test_tree_policy_trace_runs_on_a_tiny_target(tiny_target, tmp_path):
    import json

    (tmp_path / "self-auto.yaml").write_text("drafter: {type: self}\ntree: {shape: auto, depth: 3, top_k: 2, "
                                             "total_tokens: 6}\n")
    rows = [{"category": "writing", "turns": ["Write a line."]}, {"category": "rag", "turns": ["Answer this."]}]
    (tmp_path / "q.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    trace = _script("tree_policy_trace")
    assert trace.main(["--config", str(tmp_path / "self-auto.yaml"), "--prompts", str(tmp_path / "q.jsonl"),
                       "--subtasks", "mt_bench,rag", "--max-new-tokens", "8", "--target", tiny_target,
                       "--out", str(tmp_path / "trace")]) == 0
    t = json.loads((tmp_path / "trace.json").read_text())
    assert [r["subtask"] for r in t["runs"]] == ["mt_bench", "rag"] and t["runs"][-1]["steps"][1] == len(t["steps"])
    assert all(1 <= s["nodes"] <= 7 for s in t["steps"]) and (tmp_path / "trace.png").is_file()
    grown = [s for s in t["steps"] if s["nodes"] > 1]
    assert grown and all(0 < s["expected"] <= s["nodes"] - 1 for s in grown)
    assert t["runs"][0]["expected_per_step"] == pytest.approx(
        sum(s["expected"] for s in t["steps"][: t["runs"][0]["steps"][1]]) / t["runs"][0]["steps"][1])
    # the objective's time of a grown step: its measured parts, so positive once the warm-up measured them
    assert all(s["predicted_ms"] > 0 and s["step_ms"] >= s["verify_ms"] for s in grown)
    # the objective's rates of stopping after 1..depth levels: one per drafted level, the last one the
    # verified tree's (as grown, its nodes no more than the drafted tree holds)
    assert all([a["levels"] for a in s["shallower"]] == list(range(1, len(s["shallower"]) + 1)) for s in grown)
    assert all(len(s["shallower"]) >= s["depth"] and s["shallower"][-1]["nodes"] <= 6 for s in grown)
    assert all(0.0 <= r["shallower_better"] <= 1.0 for r in t["runs"])
    assert trace.main(["--config", str(ROOT / "experiments/configs/eagle2-cpu.yaml"), "--prompts",
                       str(tmp_path / "q.jsonl")]) == 2  # not an auto tree
    # --children: full trees; the self drafter's children always hold the next token, at every depth
    assert trace.main(["--config", str(tmp_path / "self-auto.yaml"), "--prompts", str(tmp_path / "q.jsonl"),
                       "--subtasks", "mt_bench,rag", "--max-new-tokens", "12", "--target", tiny_target,
                       "--out", str(tmp_path / "trace"), "--children"]) == 0
    c = json.loads((tmp_path / "trace.children.json").read_text())
    assert {"0", "1"} <= set(c["by_depth"]) and set(c["by_subtask"]) == {"mt_bench", "rag"}
    assert all(v["rate"] == 1.0 for v in c["by_depth"].values()) and c["nodes"] == sum(v["nodes"] for v in c["by_depth"].values())


def _fake_clock_arms(durations: dict[str, list[float]], log: list):
    """Arms whose runs advance a fake clock by their next duration (and log their name); a ``before``
    hook that advances the clock too, by much more, so timing it would show."""
    from collections import deque

    timing = _script("perf/timing")
    now = [0.0]
    left = {k: deque(v) for k, v in durations.items()}

    def run(k):
        log.append(k)
        now[0] += left[k].popleft()
        return f"{k}{len(log)}"

    def slow_hook(*_):
        now[0] += 1000.0

    arms = {k: timing.Arm(lambda k=k: run(k), before=slow_hook, after=slow_hook) for k in durations}
    return timing, arms, (lambda: now[0])


def test_perf_timing_interleaves_rounds_and_drops_the_warmup():
    log = []
    timing, arms, clock = _fake_clock_arms({"A": [100.0, 1.0, 3.0, 2.0], "B": [100.0, 10.0, 40.0, 20.0]}, log)
    rounds, seen = [], []
    t = timing.interleave(arms, 3, warmup=1, clock=clock, each_round=rounds.append,
                          progress=lambda r, k, s: seen.append((r, k, s)))
    assert log == ["A", "B", "B", "A", "A", "B", "B", "A"]  # the order reversed every round
    assert rounds == [0, 1, 2, 3]  # warm-up round included
    assert t.times == {"A": [1.0, 3.0, 2.0], "B": [10.0, 40.0, 20.0]}  # the hooks and the warm-up not counted
    assert seen == [(0, "B", 10.0), (0, "A", 1.0), (1, "A", 3.0), (1, "B", 40.0), (2, "B", 20.0), (2, "A", 2.0)]
    assert t.median("A") == 2.0 and t.median("B", scale=1000) == 20000.0 and t.best("B") == 10.0
    assert t.ratios("A", "B") == [0.1, 0.075, 0.1] and t.median_ratio("A", "B") == 0.1
    assert t.results == {"A": "A8", "B": "B7"}  # each arm's last result


def test_perf_timing_orders_and_bad_arguments():
    timing = _script("perf/timing")
    names = ["A", "B", "C"]
    assert [timing.round_order(names, r, "rotate") for r in range(4)] == [
        ["A", "B", "C"], ["B", "C", "A"], ["C", "A", "B"], ["A", "B", "C"]]
    assert [timing.round_order(names, r, "alternate") for r in range(2)] == [["A", "B", "C"], ["C", "B", "A"]]
    assert timing.round_order(names, 1, "fixed") == names
    ran = []
    arms = {"A": lambda: ran.append(1)}
    with pytest.raises(ValueError, match="order must be one of alternate, rotate, fixed, got 'random'"):
        timing.interleave(arms, 2, order="random")
    with pytest.raises(ValueError, match="need rounds >= 1 and warmup >= 0"):
        timing.interleave(arms, 0)
    with pytest.raises(ValueError, match="no arms"):
        timing.interleave({}, 2)
    assert ran == []  # every refusal comes before any arm runs
    t = timing.interleave(arms, 2, warmup=0)  # a bare callable is an arm without hooks
    assert len(ran) == 2 and len(t.times["A"]) == 2
