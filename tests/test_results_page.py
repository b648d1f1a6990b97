"""docs/results.md is rendered from the committed results (experiments/results_report.py, `make results`)."""
from __future__ import annotations

import importlib.util
import json
import re
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "experiments" / "results"


def _report():
    spec = importlib.util.spec_from_file_location("results_report", ROOT / "experiments" / "results_report.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_results_page_is_rendered_from_the_committed_results(tmp_path):
    """On a clean checkout `make results` changes nothing: the committed page is the render."""
    out = tmp_path / "results.md"
    assert _report().main(["--out", str(out)]) == 0
    assert out.read_text() == (ROOT / "docs" / "results.md").read_text()


def test_results_page_states_what_it_promises(tmp_path):
    out = tmp_path / "results.md"
    assert _report().main(["--out", str(out)]) == 0
    text = out.read_text()
    assert len(text.encode()) <= 40_000
    for section in ("## Machine", "## Bench", "## Cost of a verification forward", "## Beside the official EAGLE code",
                    "## Learning curve of the heads"):
        assert section in text
    bench = json.loads((RESULTS / "bench-smollm2.json").read_text())
    assert bench["device"] in text
    for run in bench["runs"]:  # every shipped config of `make bench`, with its tau, tok/s and speedup
        assert f"| {run['config']} | {run['mean_accepted']:.2f} |" in text
        assert f"{run['tokens_per_s']:.2f} | {run['speedup']:.2f}x |" in text
    assert f"{bench['plain']['hf_tokens_per_s']:.2f}" in text
    bw = re.search(r"read bandwidth ([\d.]+) GB/s", (RESULTS / "cost_curve.md").read_text()).group(1)
    assert f"| {bw} GB/s |" in text
    # a reference, not a diary
    assert not re.search(r"\bsession\b|\b20\d\d-\d\d-\d\d\b", text, re.IGNORECASE)


def test_results_page_follows_the_bench_json(tmp_path):
    """A rerun of `make bench` changes the table, nothing else needs editing."""
    results = tmp_path / "results"
    shutil.copytree(RESULTS, results, ignore=shutil.ignore_patterns("*.png", "ablations", "specbench*", "sweep*"))
    bench = json.loads((results / "bench-smollm2.json").read_text())
    bench["device"] = "cpu (Some CPU, family 1 model 2, avx2 fma, 2 threads)"
    bench["runs"][0]["tokens_per_s"] = 12345.678
    (results / "bench-smollm2.json").write_text(json.dumps(bench))
    out = tmp_path / "results.md"
    assert _report().main(["--results", str(results), "--out", str(out)]) == 0
    text = out.read_text()
    assert "| bench (`make bench`) | cpu (Some CPU, family 1 model 2, avx2 fma, 2 threads) |" in text
    assert f"| {bench['runs'][0]['config']} |" in text and "12345.68" in text


def test_results_page_names_a_missing_or_broken_file(tmp_path, capsys):
    results = tmp_path / "results"
    shutil.copytree(RESULTS, results, ignore=shutil.ignore_patterns("*.png", "ablations", "specbench*", "sweep*"))
    rep = _report()
    (results / "bench-smollm2.json").unlink()
    assert rep.main(["--results", str(results), "--out", str(tmp_path / "x.md")]) == 2
    assert "bench-smollm2.json not found" in capsys.readouterr().err
    (results / "bench-smollm2.json").write_text("{not json")
    assert rep.main(["--results", str(results), "--out", str(tmp_path / "x.md")]) == 2
    assert "bench-smollm2.json is not JSON" in capsys.readouterr().err
    (results / "bench-smollm2.json").write_text(json.dumps({"device": "cpu"}))
    assert rep.main(["--results", str(results), "--out", str(tmp_path / "x.md")]) == 2
    assert "missing field" in capsys.readouterr().err
    assert not (tmp_path / "x.md").exists()


@pytest.mark.parametrize("name", ["cost_curve.csv", "peer_official_eagle.json", "learning_curve/results.json"])
def test_results_page_refuses_without_each_source(tmp_path, name, capsys):
    results = tmp_path / "results"
    shutil.copytree(RESULTS, results, ignore=shutil.ignore_patterns("*.png", "ablations", "specbench*", "sweep*"))
    (results / name).unlink()
    assert _report().main(["--results", str(results), "--out", str(tmp_path / "x.md")]) == 2
    assert "not found" in capsys.readouterr().err
