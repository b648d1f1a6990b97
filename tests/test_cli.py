"""The command line: generate streaming, and one-line errors for bad input (the bench contract is in
test_bench.py)."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from eagle.cli import main

from conftest import run_cli, write_prompt_lines

ROOT = Path(__file__).resolve().parents[1]


def test_generate_streams_and_summarizes(tiny_target, capsys):
    code, out, err = run_cli(["generate", "--prompt", "Hi there", "--max-new-tokens", "6", "--target", tiny_target,
                              "--config", str(ROOT / "experiments/configs/self-draft.yaml"), "--compare"], capsys)
    assert code == 0, err
    assert "[self-draft] tokens:" in out and "tau:" in out and "tok/s:" in out and "speedup:" in out
    assert "identical to plain" in out


@pytest.mark.parametrize("case", ["missing", "empty", "malformed", "no-prompt-field"])
def test_bad_prompt_files(case, tiny_target, tmp_path, capsys):
    path = tmp_path / "p.jsonl"
    if case == "empty":
        path.write_text("\n\n")
    elif case == "malformed":
        path.write_text('{"prompt": "ok"}\n{"prompt": \n')
    elif case == "no-prompt-field":
        path.write_text('{"text": "hello"}\n')
    code, out, err = run_cli(["bench", "--prompts", str(path), "--config", str(ROOT / "experiments/configs/ngram.yaml"),
                              "--target", tiny_target, "--json", str(tmp_path / "o.json")], capsys)
    assert code == 2
    assert err.startswith("eagle: error:") and err.count("\n") == 1
    assert {"missing": "not found", "empty": "no prompts", "malformed": ":2: not valid JSON",
            "no-prompt-field": "needs a \"prompt\""}[case] in err


def test_unknown_config_key(tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("drafter:\n  type: ngram\n  max_ngramm: 3\n")
    code, out, err = run_cli(["generate", "--prompt", "x", "--config", str(cfg)], capsys)
    assert code == 2 and "unknown key 'drafter.max_ngramm'" in err and str(cfg) in err


@pytest.mark.parametrize("args, message", [
    (["--max-new-tokens", "0"], "--max-new-tokens: must be a positive integer"),
    (["--max-new-tokens", "-3"], "--max-new-tokens: must be a positive integer"),
    (["--temperature", "-0.5"], "--temperature: must be >= 0"),
    (["--top-p", "0"], "--top-p: must be in (0, 1]"),
    (["--top-p", "1.5"], "--top-p: must be in (0, 1]"),
])
def test_bad_numbers(args, message, capsys):
    with pytest.raises(SystemExit) as e:
        main(["generate", "--prompt", "x"] + args)
    err = capsys.readouterr().err
    assert e.value.code == 2 and message in err
    assert err.startswith("eagle: error:") and err.count("\n") == 1  # one line, no usage block


def test_missing_argument_is_one_line(capsys):
    with pytest.raises(SystemExit) as e:
        main(["bench", "--prompts", "p.jsonl"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith("eagle: error:") and "--config" in err and err.count("\n") == 1


@pytest.fixture(scope="module")
def broken_heads(tmp_path_factory):
    """A copy of the shipped head with its weights cut short, and a config that uses it."""
    import shutil

    root = tmp_path_factory.mktemp("heads")
    head = root / "truncated"
    shutil.copytree(ROOT / "heads/smollm2-135m", head)
    w = head / "model.safetensors"
    w.write_bytes(w.read_bytes()[: w.stat().st_size // 3])
    cfg = root / "broken.yaml"
    cfg.write_text(f"drafter: {{type: eagle, head: {head}}}\ntree: {{shape: chain, depth: 2}}\n")
    return head, cfg


@pytest.mark.parametrize("cmd", ["generate", "bench", "head-info"])
def test_truncated_head_weights_are_one_line(cmd, broken_heads, tmp_path, capsys):
    head, cfg = broken_heads
    prompts = write_prompt_lines(tmp_path / "p.jsonl", [json.dumps({"prompt": "Hi"})])
    args = {"generate": ["generate", "--prompt", "Hi", "--config", str(cfg)],
            "bench": ["bench", "--prompts", prompts, "--config", str(cfg), "--json", str(tmp_path / "o.json")],
            "head-info": ["head-info", "--head", str(head)]}[cmd]
    # checked before the target is loaded: an unknown target would be the other error
    code, out, err = run_cli(args + ["--target", "no-such-model"], capsys)
    assert code == 2 and err.count("\n") == 1 and "model.safetensors: truncated or corrupt" in err
    assert list(tmp_path.iterdir()) == [tmp_path / "p.jsonl"]  # nothing written


def test_truncated_draft_model_weights_are_one_line(tmp_path, capsys):
    import shutil

    folder = tmp_path / "draft"
    shutil.copytree(ROOT / "draft-models/smollm2-135m-3l", folder)
    w = folder / "model.safetensors"
    w.write_bytes(w.read_bytes()[:1000])
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"drafter: {{type: model, model: {folder}}}\ntree: {{shape: chain, depth: 2}}\n")
    code, out, err = run_cli(["generate", "--prompt", "Hi", "--config", str(cfg), "--target", "no-such-model"], capsys)
    assert code == 2 and err.count("\n") == 1 and "model.safetensors: truncated or corrupt" in err


def test_head_info_on_a_folder_that_is_not_a_head(capsys):
    code, out, err = run_cli(["head-info", "--head", str(ROOT / "draft-models/smollm2-135m-3l")], capsys)
    assert code == 2 and err.count("\n") == 1 and "not an EAGLE head" in err and "drafter type 'model'" in err


def test_json_naming_a_folder_fails_before_the_bench(tmp_path, capsys):
    prompts = write_prompt_lines(tmp_path / "p.jsonl", [json.dumps({"prompt": "Hi"})])
    (tmp_path / "out").mkdir()
    code, out, err = run_cli(["bench", "--prompts", prompts, "--config", str(ROOT / "experiments/configs/ngram.yaml"),
                              "--json", str(tmp_path / "out"), "--target", "no-such-model"], capsys)
    assert code == 2 and "is a folder" in err and err.count("\n") == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "p.jsonl"] and not any((tmp_path / "out").iterdir())


def test_target_folder_that_is_not_a_model(capsys):
    code, out, err = run_cli(["generate", "--prompt", "Hi", "--target", str(ROOT / "heads/smollm2-135m")], capsys)
    assert code == 2 and err.count("\n") == 1 and "heads/smollm2-135m" in err and "tokenizer" not in err.split(":")[1]


def test_unknown_target(capsys):
    code, out, err = run_cli(["generate", "--prompt", "x", "--target", "no-such-model"], capsys)
    assert code == 2 and "unknown target 'no-such-model'" in err


def test_prompt_longer_than_context(tiny_target, capsys):
    code, out, err = run_cli(["generate", "--prompt", "word " * 400, "--max-new-tokens", "4",
                              "--target", tiny_target], capsys)
    assert code == 2 and "exceeds the model's context of 160" in err


def test_no_traceback_from_the_real_entry_point(tmp_path):
    """The installed console script path: one line on stderr, exit status 2."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text("tree:\n  shape: spiral\n")
    proc = subprocess.run([sys.executable, "-m", "eagle.cli", "bench", "--prompts", str(tmp_path / "none.jsonl"),
                           "--config", str(cfg), "--json", str(tmp_path / "o.json")], capture_output=True, text=True)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and proc.stderr.strip().count("\n") == 0
    assert "tree.shape must be one of" in proc.stderr


def test_compare_interleaves_plain_and_drafted_runs(tiny_target, capsys, monkeypatch):
    import eagle.decoder as decoder

    calls, real = [], decoder.TreeDecoder.generate

    def logged(self, ids, n, **kw):
        calls.append(("plain" if self.drafter.__class__.__name__ == "NoDrafter" else "drafted", n))
        return real(self, ids, n, **kw)

    monkeypatch.setattr(decoder.TreeDecoder, "generate", logged)
    code, out, err = run_cli(["generate", "--prompt", "Hi there", "--max-new-tokens", "6", "--target", tiny_target,
                              "--config", str(ROOT / "experiments/configs/ngram.yaml"), "--compare", "--rounds", "3"],
                             capsys)
    assert code == 0, err
    timed = [who for who, n in calls if n == 6]
    assert timed == ["drafted", "plain", "plain", "drafted", "drafted", "plain"]  # ABBA: both see the same drift
    assert "over 3 interleaved rounds: plain tok/s" in out and "(per round: " in out and "(identical to plain)" in out


def test_help_and_argument_errors_do_not_import_torch():
    code = ("import sys\nfrom eagle.cli import main\n"
            "for argv in (['--help'], ['bench', '--help'], ['generate', '--max-new-tokens', '0']):\n"
            "    try:\n        main(argv)\n    except SystemExit:\n        pass\n"
            "print(sorted(m for m in ('torch', 'transformers', 'numpy') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "[]"
