"""``eagle sweep``: grid parsing and expansion, outputs, resuming, and the shipped ablation files."""
import csv
import json
from pathlib import Path

import pytest

import eagle.sweep as sweep
from eagle.cli import main
from eagle.config import ConfigError

ROOT = Path(__file__).resolve().parents[1]
NGRAM = str(ROOT / "experiments/configs/ngram.yaml")


def test_parse_axis_reads_yaml_values():
    assert sweep.parse_axis("tree.total_tokens=4, 8,16").values == [4, 8, 16]
    assert sweep.parse_axis("drafter.sample=true,false").values == [True, False]
    a = sweep.parse_axis("tree.choices=[[0]],[[0], [1], [0, 0]]")
    assert a.key == "tree.choices" and a.values == [[[0]], [[0], [1], [0, 0]]]
    for bad in ("tree.depth", "=1,2", "tree.depth=", "tree.depth=[1,"):
        with pytest.raises(ConfigError, match="--grid"):
            sweep.parse_axis(bad)


def test_expand_is_the_product_with_named_cells():
    cells = sweep.expand(NGRAM, [sweep.parse_axis("tree.depth=2,3"), sweep.parse_axis("drafter.branches=1,2,3")])
    assert len(cells) == 6
    assert cells[0].name == "ngram[tree.depth=2 drafter.branches=1]"
    assert [(c.config.tree.depth, c.config.drafter.options.branches) for c in cells] == [(d, b) for d in (2, 3) for b in (1, 2, 3)]
    assert all(c.config.drafter.options.max_ngram == 3 for c in cells)  # the rest comes from the base
    assert cells[4].values == {"tree.depth": 3, "drafter.branches": 2}


def test_expand_config_variants_mappings_and_temperature():
    axes = [sweep.Axis("config", [{"name": "chain3", "tree": {"depth": 3}},
                                  {"name": "static", "tree": {"shape": "static", "choices": [[0], [1], [0, 0]]}}]),
            sweep.Axis("temperature", [0, 1.0])]
    cells = sweep.expand(NGRAM, axes)
    assert [c.name for c in cells] == ["chain3[temperature=0]", "chain3[temperature=1.0]",
                                       "static[temperature=0]", "static[temperature=1.0]"]
    assert [c.temperature for c in cells] == [0.0, 1.0, 0.0, 1.0]
    assert cells[2].config.tree.shape == "static" and cells[2].config.drafter.type == "ngram"
    # config files as variants, named by their stem, merged onto the base
    plain = ROOT / "experiments/configs/plain.yaml"
    cells = sweep.expand(plain, [sweep.parse_axis(f"config={NGRAM},experiments/configs/self-draft.yaml")])
    assert [c.name for c in cells] == ["ngram", "self-draft"]
    assert [c.config.drafter.type for c in cells] == ["ngram", "self"]
    # a mapping at a key is merged into what the base has there
    (c,) = sweep.expand(NGRAM, [sweep.Axis("drafter", [{"branches": 2}])])
    assert c.config.drafter.options.branches == 2 and c.config.drafter.options.max_ngram == 3


@pytest.mark.parametrize("axis, message", [
    ("tree.top_k=2,0", r"sweep cell tree.top_k=0"),  # an invalid cell is an error before anything runs
    ("tree.totl_tokens=4", "unknown key 'tree.totl_tokens'"),
    ("drafter.type=eagle,warp", "drafter.type must be one of"),
    ("temperature=0,-1", "temperature"),
    ("config=1,2", "takes mappings"),
])
def test_invalid_cells_are_errors(axis, message):
    base = ROOT / "experiments/configs/eagle2-dynamic.yaml"
    with pytest.raises(ConfigError, match=message):
        sweep.expand(base, [sweep.parse_axis(axis)])


def test_duplicate_axis_is_an_error():
    with pytest.raises(ConfigError, match="twice"):
        sweep.expand(NGRAM, [sweep.parse_axis("tree.depth=2"), sweep.parse_axis("tree.depth=3")])


def _prompts(tmp_path):
    p = tmp_path / "p.jsonl"
    p.write_text("\n".join(json.dumps({"prompt": t}) for t in ("Say hello.", "Count to three.", "Name a color.")))
    return str(p)


def _sweep_args(tiny_target, prompts, out, *extra):
    return ["sweep", "--base", NGRAM, "--grid", "tree.depth=1,3", "--grid", "drafter.branches=1,2",
            "--prompts", prompts, "--limit", "2", "--max-new-tokens", "10", "--target", tiny_target, "--out", str(out),
            *extra]


def test_sweep_writes_results_csv_table_and_plots(tiny_target, tmp_path, capsys):
    out = tmp_path / "sw"
    assert main(_sweep_args(tiny_target, _prompts(tmp_path), out)) == 0, capsys.readouterr().err
    r = json.loads((out / "results.json").read_text())
    assert r["command"].startswith("eagle sweep --base")
    assert set(r["baselines"]) == {"0.0"} and r["baselines"]["0.0"]["tokens_per_s"] > 0
    assert [c["grid"] for c in r["cells"]] == [{"tree.depth": d, "drafter.branches": b} for d in (1, 3) for b in (1, 2)]
    for c in r["cells"]:
        assert set(c) >= {"cell", "config", "tau", "alpha", "tokens_per_s", "speedup", "per_depth_acceptance",
                          "accepted_hist", "step_ms", "identical_to_plain", "prompts", "temperature"}
        assert c["identical_to_plain"] == 2 == c["prompts"]  # greedy: lossless
        assert c["config"]["tree"]["depth"] == c["grid"]["tree.depth"]
        assert len(c["per_depth_acceptance"]) <= c["grid"]["tree.depth"]
        assert sum(c["accepted_hist"]) > 0 and set(c["step_ms"]) == {"draft", "verify", "bookkeeping"}
    rows = list(csv.DictReader(open(out / "results.csv")))
    assert [row["cell"] for row in rows] == [c["cell"] for c in r["cells"]]
    assert rows[0]["tree.depth"] == "1" and float(rows[0]["tau"]) == pytest.approx(r["cells"][0]["tau"])
    table = (out / "table.md").read_text()
    assert "| tree.depth | drafter.branches |" in table and table.count("| ngram[") == 4
    for png in ("tau_speedup.png", "acceptance.png"):
        assert (out / png).read_bytes()[:4] == b"\x89PNG"


def test_interrupted_sweep_resumes_and_skips_finished_runs(tiny_target, tmp_path, capsys, monkeypatch):
    out = tmp_path / "sw"
    args = _sweep_args(tiny_target, _prompts(tmp_path), out)
    real_write, writes = sweep.write_json, []

    def interrupting_write(obj, path, **kw):  # stop right after the 7th recorded run is saved
        real_write(obj, path, **kw)
        writes.append(1)
        if len(writes) == 7:
            raise KeyboardInterrupt

    monkeypatch.setattr(sweep, "write_json", interrupting_write)
    assert main(args) == 130
    assert "resume" in capsys.readouterr().err
    first = json.loads((out / "state.json").read_text())["records"]["0.0"]
    assert sum(len(v) for v in first.values()) == 7 and not (out / "results.json").exists()

    monkeypatch.setattr(sweep, "write_json", real_write)
    ran = []
    import eagle.bench as bench

    real_generate = bench.TreeDecoder.generate
    monkeypatch.setattr(bench.TreeDecoder, "generate",
                        lambda self, ids, n, **kw: ran.append(n) or real_generate(self, ids, n, **kw))
    assert main(args) == 0
    state = json.loads((out / "state.json").read_text())["records"]["0.0"]
    # 6 methods (plain, hf generate, 4 cells) x 2 prompts = 12 runs; 7 were kept, 5 ran again
    assert sum(len(v) for v in state.values()) == 12
    for method, recs in first.items():
        assert all(state[method][i] == rec for i, rec in recs.items())
    timed = [n for n in ran if n == 10]  # warm-ups generate 8
    assert len(timed) == 12 - 7 - 1  # the one remaining "hf generate" run does not go through TreeDecoder
    # a third run finds every cell done and runs nothing but the plain warm-up
    capsys.readouterr()
    ran.clear()
    assert main(args) == 0
    assert "4 of 4 cells already done" in capsys.readouterr().err and ran == [8]


def test_sweep_with_other_settings_in_the_same_folder_is_refused(tiny_target, tmp_path, capsys):
    out = tmp_path / "sw"
    prompts = _prompts(tmp_path)
    assert main(_sweep_args(tiny_target, prompts, out)) == 0
    capsys.readouterr()
    code = main(_sweep_args(tiny_target, prompts, out)[:-2] + ["--max-new-tokens", "6", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "other settings" in err and "max_new_tokens 10 -> 6" in err


def test_temperature_axis_runs_one_bench_per_temperature(tiny_target, tmp_path, capsys):
    out = tmp_path / "sw"
    args = ["sweep", "--base", NGRAM, "--grid", "temperature=0,1.0", "--grid", "drafter.branches=1,2",
            "--prompts", _prompts(tmp_path), "--limit", "2", "--max-new-tokens", "6", "--target", tiny_target,
            "--x", "temperature", "--out", str(out)]
    assert main(args) == 0, capsys.readouterr().err
    r = json.loads((out / "results.json").read_text())
    assert set(r["baselines"]) == {"0.0", "1.0"}
    assert [c["temperature"] for c in r["cells"]] == [0.0, 0.0, 1.0, 1.0]
    rows = [line for line in (out / "table.md").read_text().splitlines() if line.startswith("| ngram[")]
    assert ["2/2" in row for row in rows] == [True, True, False, False]  # identity is a greedy notion
    assert all("| n/a |" in row for row in rows[2:])


def test_plot_lines_never_mix_grid_values():
    axes = ["tree.total_tokens", "tree.depth", "drafter.sample"]
    assert sweep.default_lines(axes, "nodes") == ["tree.depth", "drafter.sample"]  # the first key sets the nodes
    assert sweep.default_lines(axes, "tree.depth") == ["tree.total_tokens", "drafter.sample"]
    assert sweep.default_lines(axes, "nodes", ["drafter.sample"]) == ["drafter.sample", "tree.depth"]
    assert sweep.default_lines(["config"], "nodes", ["tree.shape"]) == ["tree.shape"]


@pytest.mark.parametrize("args, message", [
    (["--grid", "tree.depth=1,2"], "needs --base"),
    (["--base", NGRAM, "--grid", "tree.depth=0,2", "--prompts", "p.jsonl"], "sweep cell tree.depth=0"),
    (["--base", NGRAM, "--grid", "tree.depth=1", "--prompts", "p.jsonl", "--x", "tree.nothing"], "plot key"),
    (["--base", NGRAM, "--grid", "temperature=0,1", "--temperature", "0.5", "--prompts", "p.jsonl"], "both given"),
    (["--base", NGRAM, "--grid", "missing.yaml", "--prompts", "p.jsonl"], "config file not found: missing.yaml"),
])
def test_bad_sweeps_fail_before_loading_a_model(args, message, tmp_path, capsys):
    code = main(["sweep", *args, "--target", "no-such-model", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert code == 2 and message in err and err.count("\n") == 1
    assert not (tmp_path / "o").exists()


ABLATIONS = sorted((ROOT / "experiments/ablations").glob("*.yaml"))


@pytest.mark.parametrize("path", ABLATIONS, ids=[p.stem for p in ABLATIONS])
def test_shipped_ablations_expand_to_valid_cells(path):
    spec = sweep.load_ablation(path)
    _, axes = sweep.SweepSpec().updated(spec)
    cells = sweep.expand(spec.base, axes, spec.temperature, spec.set)
    keys = [a.key for a in axes]
    sweep.check_plot_keys(cells, keys, spec.x, sweep.default_lines(keys, spec.x, spec.lines))
    assert len(cells) >= 2 and spec.description
    if spec.prompts.startswith("../shared/") and not Path(spec.prompts).is_file():
        pytest.skip(f"{spec.prompts} (Spec-Bench, not shipped) is absent on this machine")
    assert Path(spec.prompts).is_file()


def test_the_ablation_set_covers_the_standard_questions():
    assert {p.stem for p in ABLATIONS} >= {"tree-budget", "depth-topk", "static-vs-dynamic", "temperature", "drafters"}


def _documented_sweeps() -> list[tuple[str, str]]:
    """Every ``eagle sweep`` command in a code block of README.md and docs/*.md."""
    import re

    found = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        blocks, inside = [], False
        for line in doc.read_text().splitlines():
            if line.startswith("```"):
                inside = not inside
                blocks.append("")
            elif inside:
                blocks[-1] += line + "\n"
        for block in blocks:
            text = block.replace("\\\n", " ")
            for cmd in re.findall(r"eagle sweep (?:[^'\n]|'[^']*')*", text):
                found.append((doc.name, cmd))
    return found


@pytest.mark.parametrize("doc, cmd", _documented_sweeps())
def test_documented_sweep_commands_expand(doc, cmd, tmp_path, capsys, monkeypatch):
    """The docs' sweep commands are valid as written: they get as far as loading the target."""
    import shlex

    monkeypatch.chdir(ROOT)
    argv = shlex.split(cmd)[1:]
    argv[argv.index("--out") + 1] = str(tmp_path / "out")
    code = main(argv + ["--target", "no-such-model"])
    err = capsys.readouterr().err
    assert code == 2 and "unknown target 'no-such-model'" in err, err


def test_docs_have_sweep_commands():
    assert len(_documented_sweeps()) >= 5


def test_side_rows_get_a_column_only_where_a_cell_runs_them(tiny_target, tmp_path, capsys):
    """A lookahead window's rows (run beside the tree, not verified) are counted per step in the
    results and get a table column; a sweep of tree drafters alone has no such column."""
    out = tmp_path / "sw"
    args = ["sweep", "--base", NGRAM, "--grid", "config={name: la, drafter: {type: lookahead, level: 3, window: 2, "
            "guesses: 1}},{name: ng, drafter: {type: ngram}}",
            "--prompts", _prompts(tmp_path), "--limit", "1", "--max-new-tokens", "8", "--target", tiny_target,
            "--out", str(out)]
    assert main(args) == 0, capsys.readouterr().err
    cells = {c["cell"]: c for c in json.loads((out / "results.json").read_text())["cells"]}
    assert 0 < cells["la"]["mean_side_rows"] <= 2 * 2 and cells["ng"]["mean_side_rows"] == 0
    table = (out / "table.md").read_text()
    assert "| nodes/step | side rows/step |" in table
    assert all(r.count("|") == table.splitlines()[-1].count("|") for r in table.splitlines() if r.startswith("| "))
    out2 = tmp_path / "sw2"
    assert main(_sweep_args(tiny_target, _prompts(tmp_path), out2)) == 0
    assert "side rows" not in (out2 / "table.md").read_text()
