"""The experiment scripts' own logic (their real runs are the documented commands)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

from eagle.config import DecodeConfig, from_dict

ROOT = Path(__file__).resolve().parents[1]


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "experiments" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _bench_result(speedups: dict[str, float]) -> dict:
    return {"plain": {"tokens_per_s": 10.0}, "runs": [
        {"config": n, "alpha": 0.5, "mean_accepted": 1.5, "speedup": s, "tokens_per_s": 10 * s, "plain_steps": 3,
         "identical_to_plain": 4, "prompts": 4} for n, s in speedups.items()]}


def test_temperature_sweep_table_and_plot(tmp_path):
    ts = _script("temperature_sweep")
    cfg = from_dict(DecodeConfig, {"name": "ngram", "drafter": {"type": "ngram"}})
    fb = ts.with_fallback(cfg)
    assert fb.name == "ngram+fallback" and fb.fallback.enabled and not cfg.fallback.enabled
    sweep = {"settings": {"prompts": "p.jsonl", "limit": 4, "max_new_tokens": 16, "top_p": 1.0},
             "results": {"1.5": _bench_result({"ngram": 0.8, "ngram+fallback": 0.93}),
                         "0.0": _bench_result({"ngram": 1.1, "ngram+fallback": 1.05})}}
    rows = ts.rows_of(sweep)
    assert [r["temperature"] for r in rows] == [0.0, 0.0, 1.5, 1.5]  # sorted numerically
    assert rows[0]["identical"] == 4 and rows[2]["identical"] is None
    text = ts.table(sweep)
    assert "| 1.5 | ngram | 0.50 | 1.50 |" in text
    assert "worst speedup 0.93x (ngram+fallback at temperature 1.5)" in text and "NOT met" in text
    sweep["results"]["1.5"] = _bench_result({"ngram": 0.8, "ngram+fallback": 0.97})
    assert "floor 0.95x: met" in ts.table(sweep)
    ts.plot(sweep, tmp_path / "p.png")
    assert (tmp_path / "p.png").stat().st_size > 1000


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
    from eagle.packed import packed_gemm_available

    if not packed_gemm_available():
        return  # nothing to compare on a build without MKL's packed GEMM
    assert _script("packed_gemm").main(["--rows", "1,4", "--layers", "1", "--repeats", "1"]) == 0
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
