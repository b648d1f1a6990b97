"""experiments/learning_curve.py: planning, resume and the writers, with fake train/eval/bench
(training and the bench are tested in their own files; the real curve is the documented command)."""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _script():
    spec = importlib.util.spec_from_file_location("learning_curve", ROOT / "experiments" / "learning_curve.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["learning_curve"] = mod  # its dataclasses look their module up while being built
    spec.loader.exec_module(mod)
    return mod


def _manifest(sizes):
    return {"shards": [{"file": f"shard-{i:05d}.safetensors", "tokens": n} for i, n in enumerate(sizes)],
            "tokens": sum(sizes)}


def test_budgets_parse():
    lc = _script()
    assert lc.parse_budgets("250000, 250k,0.5M,2M,all") == [250000, 250000, 500000, 2000000, "all"]
    for bad in ("lots", "0", "-3k", ""):
        with pytest.raises(lc.CurveError):
            lc.parse_budgets(bad)


def test_plan_skips_budgets_above_the_data_and_resolves_all(tmp_path):
    lc = _script()
    m = _manifest([100, 100, 100, 100])  # 400 tokens
    cells, notes = lc.plan_cells(["eagle", "eagle3"], [150, 400, 500, "all"], {"eagle": m, "eagle3": m}, tmp_path,
                                 "-steps2")
    assert [c.key for c in cells] == ["eagle-150", "eagle-400", "eagle3-150", "eagle3-400"]  # all == 400: one cell
    c = cells[0]
    assert (c.data_tokens, c.shards, c.label) == (200, 2, "150")  # whole shards, up to the one reaching 150
    assert cells[1].data_tokens == 400 and cells[1].shards == 4
    assert c.work == str(tmp_path / "eagle-150-steps2")
    assert len(notes) == 2 and all("500" in n and "400" in n for n in notes)
    # all alone: every token there is, labelled as asked
    cells, _ = lc.plan_cells(["eagle"], ["all"], {"eagle": m}, tmp_path)
    assert [(c.key, c.label, c.data_tokens) for c in cells] == [("eagle-400", "all", 400)]
    # no data: everything skipped, with a note each
    cells, notes = lc.plan_cells(["eagle"], [10, "all"], {"eagle": _manifest([])}, tmp_path)
    assert cells == [] and len(notes) == 2
    assert lc.work_suffix(None, None) == "" and lc.work_suffix(1.0, 5) == "-epochs1-steps5"


def _fakes(calls):
    def train(cell):
        calls.append(("train", cell.key))
        Path(cell.work, "head").mkdir(parents=True, exist_ok=True)
        return {"steps": cell.budget // 10, "train_tokens": cell.data_tokens}

    def evaluate(cell):
        calls.append(("eval", cell.key))
        g = cell.budget / 1000
        acc = [0.5 + 0.1 * g, 0.3 + 0.1 * g, 0.2 + 0.1 * g] + ([0.1] * 4 if cell.head == "eagle3" else [])
        return {"fixed": {"loss": 1.0, "acc": acc}, "split": {"loss": 1.1, "acc": [a + 0.01 for a in acc]}}

    def bench(cell):
        calls.append(("bench", cell.key))
        return {"tau": 2.0 + cell.budget / 1000 + (0.5 if cell.head == "eagle3" else 0.0), "tau_se": 0.02,
                "identical_to_plain": 2, "prompts": 2}

    return train, evaluate, bench


def _fps(cells, tag="a"):
    return {c.key: {s: f"{tag}-{s}" for s in ("train", "eval", "bench")} for c in cells}


def test_resume_skips_finished_cells_and_stages(tmp_path):
    lc = _script()
    m = _manifest([250] * 8)
    cells, _ = lc.plan_cells(["eagle", "eagle3"], [500, 1000, 2000], {"eagle": m, "eagle3": m}, tmp_path / "work")
    out = tmp_path / "out"
    calls, logs = [], []
    train, evaluate, bench = _fakes(calls)
    ready = lambda c: (Path(c.work) / "head").is_dir()  # noqa: E731

    def bench_dies_on_second(cell):  # an interruption in the bench of the second cell
        if cell.key == "eagle-1000":
            raise KeyboardInterrupt
        return bench(cell)

    state = lc.load_results(out)
    with pytest.raises(KeyboardInterrupt):
        lc.run_curve(cells, state, out, _fps(cells), train, evaluate, bench_dies_on_second, ready, logs.append)
    saved = lc.load_results(out)  # results.json is written after every stage
    assert saved["cells"]["eagle-500"]["done"] and saved["cells"]["eagle-500"]["bench"]["tau"] == 2.5
    assert "eval" in saved["cells"]["eagle-1000"] and "bench" not in saved["cells"]["eagle-1000"]

    calls.clear()
    lc.run_curve(cells, saved, out, _fps(cells), train, evaluate, bench, ready, logs.append)
    assert ("train", "eagle-500") not in calls and ("bench", "eagle-500") not in calls  # finished: skipped whole
    assert [c for c in calls if c[1] == "eagle-1000"] == [("bench", "eagle-1000")]  # only its missing stage
    assert ("train", "eagle3-2000") in calls
    assert any("eagle-500: done earlier, skipped" in line for line in logs)
    state = lc.load_results(out)
    assert all(r["done"] for r in state["cells"].values()) and len(state["cells"]) == 6

    # a third run does nothing
    calls.clear()
    lc.run_curve(cells, state, out, _fps(cells), train, evaluate, bench, ready, lambda line: None)
    assert calls == []

    # a changed bench setting reruns only the benches; a changed recipe reruns everything
    fps = {k: dict(v, bench="b-bench") for k, v in _fps(cells).items()}
    lc.run_curve(cells, state, out, fps, train, evaluate, bench, ready, lambda line: None)
    assert calls and {c[0] for c in calls} == {"bench"}
    calls.clear()
    fps = {k: {"train": "c", "eval": "c", "bench": "c"} for k in fps}
    lc.run_curve(cells[:1], state, out, fps, train, evaluate, bench, ready, lambda line: None)
    assert calls == [("train", "eagle-500"), ("eval", "eagle-500"), ("bench", "eagle-500")]

    # a head deleted from the work folder is trained again before its stages count
    calls.clear()
    (Path(cells[1].work) / "head").rmdir()
    current = {cells[1].key: {"train": "a-train", "eval": "a-eval", "bench": "b-bench"}}  # as last recorded
    lc.run_curve(cells[:2], state, out, fps | current, train, evaluate, bench, ready, lambda line: None)
    assert calls == [("train", "eagle-1000"), ("eval", "eagle-1000"), ("bench", "eagle-1000")]


def test_settings_of_another_curve_are_refused(tmp_path):
    lc = _script()
    state = {"cells": {}, "settings": {"max_steps": None, "prompts_limit": 8}}
    lc.check_settings(state, {"max_steps": None, "prompts_limit": 8}, tmp_path)
    lc.check_settings({"cells": {}}, {"max_steps": 2}, tmp_path)
    with pytest.raises(lc.CurveError, match="max_steps: None -> 2"):
        lc.check_settings(state, {"max_steps": 2, "prompts_limit": 8}, tmp_path)


def _finished_state(lc, tmp_path):
    m = _manifest([250] * 8)
    cells, _ = lc.plan_cells(["eagle", "eagle3"], [500, 1000, 2000], {"eagle": m, "eagle3": m}, tmp_path / "work")
    state = {"cells": {}, "command": "python experiments/learning_curve.py --budgets 500,1000,2000",
             "settings": {"heldout_prompts_file": "held.jsonl", "prompts_limit": 2, "max_new_tokens": 16},
             "heldout": {"prompts": 20, "answer_tokens": 4321}}
    lc.run_curve(cells, state, tmp_path / "out", _fps(cells), *_fakes([]), None, lambda line: None)
    return state


def test_table_plot_and_report_from_results(tmp_path):
    lc = _script()
    state = _finished_state(lc, tmp_path)
    state["cells"]["eagle3-9999"] = {"head": "eagle3", "done": False}  # unfinished: not in the outputs
    out, report = tmp_path / "out", tmp_path / "docs" / "learning_curve.md"
    written = lc.write_outputs(state, out, report)
    assert set(written) == {out / "table.md", out / "learning_curve.png", report}
    table = (out / "table.md").read_text()
    rows = [line for line in table.splitlines() if line.startswith("| EAGLE")]
    assert len(rows) == 6 and rows[0].startswith("| EAGLE-2 head | 500 | 500 (2) | 50 |")
    assert "0.550 0.350 0.250" in rows[0] and "0.560 0.360 0.260" in rows[0]  # fixed set, then the split
    assert "| 2.50 ± 0.02 | 2/2 |" in rows[0] and rows[3].startswith("| EAGLE-3 head | 500 |")
    assert (out / "learning_curve.png").read_bytes()[:4] == b"\x89PNG"
    doc = report.read_text()
    assert "python experiments/learning_curve.py --heads eagle,eagle3 --budgets 500,1000,2000" in doc
    assert "](../out/learning_curve.png)" in doc and rows[0] in doc
    assert "4,321 answer tokens" in doc and "20 held-out chat prompts" in doc
    # the reading is written from the numbers: the fakes gain 1.0 tau per doubling at the end
    assert "tau 2.50 -> 4.00" in doc and "+1.00" in doc
    assert "More data is still a lever" in doc
    assert "EAGLE-3 head leads the EAGLE-2 head by 0.50 tau" in doc


def test_report_command_covers_every_cell(tmp_path):
    """Cells added by runs of one head or budget at a time: the report's command makes them all."""
    lc = _script()
    state = {"command": "python experiments/learning_curve.py --heads eagle --budgets=250000 --report docs/lc.md",
             "cells": {"eagle3-all": {"head": "eagle3", "label": "all", "done": True},
                       "eagle-250000": {"head": "eagle", "label": "250000", "done": True},
                       "eagle-1000000": {"head": "eagle", "label": "1000000", "done": True},
                       "eagle3-5": {"head": "eagle3", "done": False}}}
    assert lc.reproduce_command(state) == ("python experiments/learning_curve.py --heads eagle,eagle3 "
                                           "--budgets 250000,1000000,all --report docs/lc.md")


def test_reading_says_when_data_stops_paying(tmp_path):
    lc = _script()
    state = _finished_state(lc, tmp_path)
    for r in state["cells"].values():  # flat curves: tau and top-1 the same at every budget
        r["bench"]["tau"] = 3.0 if r["head"] == "eagle3" else 2.7
        r["eval"]["fixed"]["acc"][0] = 0.6
    text = " ".join(lc.reading(state))
    assert "More data of this kind is not the lever" in text and "0.30 tau more" in text
    assert lc.reading({"cells": {}}) == ["No finished cells yet."]


def test_reading_trusts_held_out_top1_when_tau_is_noise(tmp_path):
    """tau flat within its noise but top-1 on the fixed held-out set still rising: data is a lever."""
    lc = _script()
    state = _finished_state(lc, tmp_path)
    for r in state["cells"].values():
        r["bench"]["tau"], r["bench"]["tau_se"] = 3.0 + 0.1 * (r["budget"] == 2000), 0.2  # +0.10 ± 0.28
    text = " ".join(lc.reading(state))
    assert "More data is still a lever, by the steadier signal" in text
    assert "depth-1 top-1 on the fixed held-out set by 10.0 points" in text and "not the lever" not in text


def test_decode_config_gets_the_trained_head(tmp_path):
    lc = _script()
    (tmp_path / "head").mkdir()
    for name, (_, path) in lc.HEADS.items():
        cfg = lc.load_decode_config(path, tmp_path / "head", f"{name}-1000")
        assert cfg.name == f"{name}-1000" and cfg.drafter.type == name and cfg.drafter.options.head == str(tmp_path / "head")
        assert (cfg.tree.shape, cfg.tree.depth, cfg.tree.top_k, cfg.tree.options.total_tokens) == ("dynamic", 6, 10, 60)


def test_cell_train_config(tmp_path):
    lc = _script()
    from eagle.train.trainer import load_train_config

    base = load_train_config(ROOT / lc.HEADS["eagle3"][0])
    cell = lc.Cell("eagle3", 250000, "250000", 260000, 13, str(tmp_path / "eagle3-250000"))
    cfg = lc.cell_train_config(base, cell, None, 3)
    assert cfg.data_tokens == 250000 and cfg.max_steps == 3 and cfg.epochs == base.epochs
    assert cfg.out_dir == str(tmp_path / "eagle3-250000" / "train")
    assert cfg.export == str(tmp_path / "eagle3-250000" / "head")
    assert cfg.head == "eagle3" and cfg.lr == base.lr and base.data_tokens == 0  # the base config is untouched


def test_a_cell_of_all_the_data_is_the_configs_own_run(tmp_path):
    """The cell reading every shard, at the recipe's own length, trains the training config's own
    run (its out_dir, its export: the shipped head), so `eagle train --config` resumes the same one;
    with a length override, or reading fewer shards, it stays in its own folder."""
    lc = _script()
    from eagle.train.trainer import load_train_config

    m = _manifest([100, 100, 100])
    cells, _ = lc.plan_cells(["eagle3"], [150, 300, "all"], {"eagle3": m}, tmp_path)
    assert [(c.key, c.whole) for c in cells] == [("eagle3-150", False), ("eagle3-300", True)]
    base = load_train_config(ROOT / lc.HEADS["eagle3"][0])
    own = lc.cell_train_config(base, cells[1], None, None)
    assert own.out_dir == base.out_dir and own.data_tokens == 0
    assert own.export == str(ROOT / "heads" / "smollm2-135m-eagle3")
    short = lc.cell_train_config(base, cells[1], None, 5)  # a quick curve never touches the shipped run
    assert short.out_dir == str(Path(cells[1].work) / "train") and short.data_tokens == 300
    part = lc.cell_train_config(base, cells[0], None, None)
    assert part.out_dir == str(Path(cells[0].work) / "train") and part.export == str(Path(cells[0].work) / "head")


def test_main_plan_and_errors(tmp_path, capsys, monkeypatch):
    lc = _script()
    data = tmp_path / "data"
    data.mkdir()
    (data / "manifest.json").write_text(json.dumps(_manifest([300, 300]) | {"prompts_done": 2}))
    cfg = tmp_path / "train.yaml"
    cfg.write_text(f"data_dir: {data}\nout_dir: {tmp_path / 'runs'}\n")
    monkeypatch.setitem(lc.HEADS, "eagle", (str(cfg), lc.HEADS["eagle"][1]))
    assert lc.main(["--heads", "eagle", "--budgets", "250,1k,all", "--plan", "--work", str(tmp_path / "w")]) == 0
    out = capsys.readouterr().out
    assert "note: skip eagle-1000: the data holds 600 tokens" in out
    assert "2 cells: eagle-250 (300 tokens, 1 shards), eagle-600 (600 tokens, 2 shards, the config's own run)" in out

    with pytest.raises(SystemExit) as e:
        lc.main(["--heads", "medusa2"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown head(s) medusa2" in err
    with pytest.raises(SystemExit):
        lc.main(["--budgets", "2X"])
    assert "bad budget '2X'" in capsys.readouterr().err
    # a broken results file: one line, status 1, no traceback
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "results.json").write_text("{")
    assert lc.main(["--heads", "eagle", "--out", str(tmp_path / "out"), "--plan"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("learning_curve: error:") and err.count("\n") == 1 and "Traceback" not in err
