"""`eagle bench` (eagle/bench.py) through the command line: the JSON contract, and a lower-precision run
compared with its plain twin."""
import dataclasses
import json
from pathlib import Path

from conftest import run_cli, write_prompt_lines

ROOT = Path(__file__).resolve().parents[1]


def test_bench_json_contract(tiny_target, tmp_path, capsys):
    prompts = write_prompt_lines(tmp_path / "p.jsonl", [json.dumps({"prompt": "Say hello."}),
                                                   json.dumps({"turns": ["Name a color.", "And another?"]}),
                                                   json.dumps({"prompt": "Count to three."})])
    out_json = tmp_path / "out.json"
    code, out, err = run_cli(["bench", "--prompts", prompts, "--config", str(ROOT / "experiments/configs/ngram.yaml"),
                              "--config", str(ROOT / "experiments/configs/self-draft.yaml"), "--limit", "2",
                              "--max-new-tokens", "12", "--target", tiny_target, "--json", str(out_json)], capsys)
    assert code == 0, err
    r = json.loads(out_json.read_text())
    assert isinstance(r["target"], str) and isinstance(r["device"], str)
    assert set(r["plain"]) >= {"tokens_per_s", "hf_tokens_per_s", "speedup_vs_hf"}
    assert r["plain"]["tokens_per_s"] > 0 and r["plain"]["hf_tokens_per_s"] > 0
    assert r["plain"]["speedup_vs_hf"] == r["plain"]["tokens_per_s"] / r["plain"]["hf_tokens_per_s"]
    assert r["plain"]["identical_to_hf"] == 3  # our plain loop == transformers' greedy generate, every turn
    assert r["plain"]["prompts"] == 2 and r["plain"]["turns"] == 3  # the second row has two turns
    assert [x["config"] for x in r["runs"]] == ["ngram", "self-draft"]
    assert r["draft_dtype_auto"] == {}  # no config asked for drafter.dtype: auto
    for run in r["runs"]:
        assert set(run) >= {"config", "mean_accepted", "tokens_per_s", "speedup", "speedup_vs_hf", "identical_to_plain",
                            "prompts"}
        assert run["speedup_vs_hf"] == run["tokens_per_s"] / r["plain"]["hf_tokens_per_s"]
        assert run["prompts"] == 2 and run["turns"] == 3 and run["identical_to_plain"] == 3 and run["mismatches"] == []
        assert isinstance(run["mean_accepted"], float) and run["speedup"] > 0
    assert r["runs"][1]["mean_accepted"] > 2  # the oracle drafter accepts (nearly) everything
    assert "| ngram" in out and "speedup" in out and "vs hf" in out and "plain / generate:" in out


def test_bench_lower_precision_against_its_plain_twin(tiny_target, tmp_path, capsys):
    """A bfloat16 run is compared with plain decoding in bfloat16 (its twin) as well as with the
    float32 plain loop; mismatches carry the position and the logit margin there."""
    prompts = write_prompt_lines(tmp_path / "p.jsonl", [json.dumps({"prompt": "Say hello."}),
                                                   json.dumps({"prompt": "Count to three."})])
    (tmp_path / "plain-bf16.yaml").write_text("runtime: {dtype: bfloat16}\n")
    (tmp_path / "ngram-bf16.yaml").write_text("drafter: {type: ngram}\nruntime: {dtype: bfloat16}\n")
    out_json = tmp_path / "out.json"
    code, out, err = run_cli(["bench", "--prompts", prompts, "--config", str(tmp_path / "plain-bf16.yaml"),
                              "--config", str(tmp_path / "ngram-bf16.yaml"), "--max-new-tokens", "10",
                              "--target", tiny_target, "--json", str(out_json)], capsys)
    assert code == 0, err
    plain_bf16, ngram_bf16 = json.loads(out_json.read_text())["runs"]
    assert "plain_twin" not in plain_bf16  # a plain config is nobody's twin but its own
    assert ngram_bf16["plain_twin"] == "plain-bf16" and 0 <= ngram_bf16["identical_to_plain_twin"] <= 2
    assert len(ngram_bf16["mismatches_vs_twin"]) == 2 - ngram_bf16["identical_to_plain_twin"]
    for run in (plain_bf16, ngram_bf16):
        assert len(run["mismatches"]) == 2 - run["identical_to_plain"]
        for m in run["mismatches"] + run.get("mismatches_vs_twin", []):
            assert m["position"] >= 0 and m["logit_margin"] >= 0
    assert "identical to plain-bf16 (plain, same precision)" in out


def test_pooled_tau_leaves_out_one_prefill_token_per_generation():
    """Merged stats of several generations: tau = (sum of tokens - one per generation) / forwards,
    the pooled value of the per-prompt definition (not one token left out for the whole bench)."""
    from eagle.bench import _Run
    from eagle.decoder import DecodeStats

    a = DecodeStats(new_tokens=7, target_forwards=3, generations=1)  # (7 - 1) / 3 = 2
    b = DecodeStats(new_tokens=9, target_forwards=2, generations=1)  # (9 - 1) / 2 = 4
    total = DecodeStats()
    total.merge(a)
    total.merge(b)
    assert total.generations == 2 and total.tau == (6 + 8) / 5
    run = _Run()  # records saved before the field existed count one generation each
    for st in (a, b):
        old = dataclasses.asdict(st)
        del old["generations"]
        run.add({"tokens": [0] * st.new_tokens, "seconds": 1.0, "stats": old})
    assert run.stats.tau == (6 + 8) / 5


def test_the_precision_auto_took_is_reported():
    """``drafter.dtype: auto``: the bench JSON and table name the precision each such config's
    drafter took; configs with a fixed precision are not listed."""
    from types import SimpleNamespace

    import torch

    from eagle.bench import draft_precisions, format_table

    configs = [SimpleNamespace(name="a", drafter=SimpleNamespace(options=SimpleNamespace(dtype="auto"))),
               SimpleNamespace(name="b", drafter=SimpleNamespace(options=SimpleNamespace(dtype="float32")))]
    decoders = {"a": SimpleNamespace(drafter=SimpleNamespace(dtype=torch.bfloat16)),
                "b": SimpleNamespace(drafter=SimpleNamespace(dtype=torch.float32))}
    assert draft_precisions(decoders, configs) == {"a": "bfloat16"}
    result = {"target": "t", "device": "cpu", "max_new_tokens": 4, "temperature": 0.0, "runs": [],
              "plain": {"tokens_per_s": 1.0, "hf_tokens_per_s": 1.0, "identical_to_hf": 1, "prompts": 1},
              "draft_dtype_auto": {"a": "bfloat16"}}
    assert "drafter.dtype auto took: a bfloat16" in format_table(result)
    assert "auto took" not in format_table(result | {"draft_dtype_auto": {}})


def test_the_warm_up_meets_every_cache_capacity_the_prompts_need(tiny_model, monkeypatch):
    """A compiled step is one graph per cache capacity: the bench warms each decoder up once per
    capacity its timed generations will allocate (a longer prompt would otherwise compile inside
    its timed run), and ``generate(cache_room=...)`` allocates that capacity."""
    import torch

    from eagle import Target, TreeDecoder
    from eagle.bench import warm_ups
    from eagle.runtime import RuntimeConfig

    dec = TreeDecoder(Target(tiny_model("llama"), "reference", RuntimeConfig(buckets=[1, 8])))
    prompts = [torch.arange(n) % 50 + 1 for n in (10, 20, 150, 200, 300)]  # rooms n + 64 + 8
    plan = warm_ups(dec, prompts, 64)
    caps = [dec.target.cache_capacity(room) for _, room in plan]
    assert caps == [256, 512] and [len(ids) for ids, _ in plan] == [10, 200]  # the first prompt of each
    seen = []
    new_cache = dec.target.new_cache
    monkeypatch.setattr(dec.target, "new_cache", lambda n: seen.append(n) or new_cache(n))
    for ids, room in plan:
        short = dec.generate(ids, 4, cache_room=room)
        assert short.tokens == dec.generate(ids, 4).tokens  # the room changes shapes, never tokens
    assert [dec.target.cache_capacity(n) for n in seen[::2]] == [256, 512]
    assert [dec.target.cache_capacity(n) for n in seen[1::2]] == [256, 256]  # without it: the short run's own


def test_timed_runs_leave_the_live_objects_out_of_garbage_collection(tiny_target, tmp_path, capsys, monkeypatch):
    """A full collection walks every live object (seconds with many configs' compiled graphs), so
    the bench sets aside what lives after the warm-ups for its timed runs, and only for them."""
    import gc

    from eagle.decoder import TreeDecoder

    frozen = []
    generate = TreeDecoder.generate
    monkeypatch.setattr(TreeDecoder, "generate", lambda self, *a, **kw: frozen.append(gc.get_freeze_count()) or
                        generate(self, *a, **kw))
    prompts = write_prompt_lines(tmp_path / "p.jsonl", [json.dumps({"prompt": "Say hello."})])
    code, _, err = run_cli(["bench", "--prompts", prompts, "--config", str(ROOT / "experiments/configs/ngram.yaml"),
                            "--max-new-tokens", "6", "--target", tiny_target, "--json", str(tmp_path / "o.json")], capsys)
    assert code == 0, err
    warm, timed = frozen[:-2], frozen[-2:]  # plain and ngram: one timed run each, after the warm-ups
    assert warm and all(n == 0 for n in warm) and all(n > 0 for n in timed)
    assert gc.get_freeze_count() == 0
