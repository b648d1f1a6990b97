"""Side by side with the official EAGLE code (SafeAILab/EAGLE): the same exported head, the same
EAGLE-2 tree budget, the same prompts, greedy, 128 new tokens; tau, tok/s, identical-to-plain and
the draft / verify split for both implementations (docs/peer_official_eagle.md).

    git clone https://github.com/SafeAILab/EAGLE ~/.cache/eagle/peer/EAGLE
    .venv/bin/python experiments/peer_official_eagle.py --setup          # venv, target folder, head
    .venv/bin/python experiments/peer_official_eagle.py --limit 8 --threads 1 --pause-data-job

The official code needs transformers 4.53.x, so it runs in its own virtualenv (``--venv``) as a
child process of this script (the same file, ``--serve``), which answers one JSON line per
generation. The official files are never edited: its functions are wrapped with timers from the
outside (``eagle.model.ea_model``'s module globals and the head's ``topK_genrate``).
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CACHE = Path(os.environ.get("EAGLE_CACHE", Path.home() / ".cache" / "eagle"))
OFFICIAL_URL = "https://github.com/SafeAILab/EAGLE"
DEFAULT_CONFIGS = ["experiments/configs/eagle2-dynamic.yaml", "experiments/configs/eagle2-cpu.yaml"]
DEFAULT_EXTRA = "experiments/configs/eagle2-cpu.yaml"
# torch first, alone: the CPU wheel on local disk; then nothing can make pip pull a CUDA torch
PEER_TORCH = "torch==2.13.0"
PEER_PACKAGES = ["transformers==4.53.*", "accelerate", "safetensors"]
DATA_JOB = "eagle train.*--data-only"


# ---- pure logic (tests/test_peer_official_eagle.py) -----------------------------------------------

def official_budget(depth: int, top_k: int, total_tokens: int) -> dict:
    """Our TreeShape (``depth`` drafted levels, ``top_k``, ``total_tokens`` drafted nodes) as the
    official EAGLE-2 arguments. The official ``depth`` counts the expansions after the first top-k
    (its drafted levels are depth + 1) and its ``total_token`` counts the root (drafted nodes are
    total_token - 1), so: depth - 1, top_k, total_tokens + 1."""
    for name, v in (("depth", depth), ("top_k", top_k), ("total_tokens", total_tokens)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"tree.{name} must be a positive integer, got {v!r}")
    pool = top_k + (depth - 1) * top_k * top_k  # the official pool: top_k, then top_k^2 per expansion
    if total_tokens > pool:
        raise ValueError(f"tree.total_tokens {total_tokens} exceeds the {pool} candidates the official code drafts "
                         f"at depth {depth}, top_k {top_k} (its torch.topk over them would fail)")
    return {"depth": depth - 1, "top_k": top_k, "total_token": total_tokens + 1}


def our_budget(depth: int, top_k: int, total_token: int) -> dict:
    """The inverse of :func:`official_budget`: official arguments -> our TreeShape fields."""
    if depth < 0 or top_k < 1 or total_token < 2:
        raise ValueError(f"official depth >= 0, top_k >= 1, total_token >= 2 expected, got {depth}, {top_k}, {total_token}")
    return {"depth": depth + 1, "top_k": top_k, "total_tokens": total_token - 1}


def stop_length(tokens: list[int], budget: int, eos) -> int:
    """How many of ``tokens`` a generation that stops exactly at EOS (kept) or at ``budget`` emits."""
    eos = set(eos)
    for i, t in enumerate(tokens[:budget]):
        if t in eos:
            return i + 1
    return min(len(tokens), budget)


def count_official(accepted: list[int], tokens: list[int], budget: int, eos) -> dict:
    """Count an official EAGLE-2 generation the way ours is counted.

    ``tokens``: its new tokens (the first one comes from the prefill and is the first tree's root);
    ``accepted[k]``: drafted tokens accepted by tree forward k, which emits ``accepted[k] + 1``
    tokens (the accepted ones and the bonus token). The official loop stops only after the step in
    which EOS appears or ``new_token > max_new_tokens``, so it may run past both; here the output
    is cut where ours stops (at the first EOS, kept, or at ``budget`` tokens) and only the forwards
    needed to emit those tokens are counted. Returns ``tokens`` (kept), ``forwards`` and
    ``tau`` = (tokens - 1) / forwards, as in ``DecodeStats.tau``.
    """
    n_tokens = stop_length(tokens, budget, eos)
    emitted, forwards = 1, 0
    while emitted < n_tokens:
        if forwards >= len(accepted):
            raise ValueError(f"{len(accepted)} steps emit {emitted} tokens, fewer than the {n_tokens} kept")
        emitted += accepted[forwards] + 1
        forwards += 1
    return {"tokens": n_tokens, "forwards": forwards, "tau": (n_tokens - 1) / forwards if forwards else 1.0}


def official_timing(rec: dict, forwards: int) -> dict:
    """Seconds of an official generation up to the end of tree forward ``forwards``'s commit (the
    point where its tokens are known; the draft that follows is never used by a counted step), and
    that span split into prefill, draft (the ``topK_genrate`` calls that built the counted trees),
    verify (``tree_decoding``: the target's tree forward) and other (the rest: acceptance,
    KV copy, the loop's own work)."""
    steps = rec["steps"][:forwards]
    if len(steps) < forwards:
        raise ValueError(f"{forwards} forwards counted but {len(rec['steps'])} recorded")
    total = steps[-1]["t_end"] if steps else rec["prefill_s"]
    draft = sum(s["draft_s"] for s in steps)
    verify = sum(s["verify_s"] for s in steps)
    return {"seconds": total, "prefill_s": rec["prefill_s"], "draft_s": draft, "verify_s": verify,
            "other_s": total - rec["prefill_s"] - draft - verify}


def plain_seconds(forward_ends: list[float], n_tokens: int) -> float:
    """Seconds until plain decoding knew its first ``n_tokens`` tokens: token j is the argmax after
    forward j (forward 0 is the prefill)."""
    if n_tokens < 1 or n_tokens > len(forward_ends):
        raise ValueError(f"{n_tokens} tokens but {len(forward_ends)} forwards recorded")
    return forward_ends[n_tokens - 1]


def summarize_official(records: list[dict], plain: list[dict], our_plain: list[list[int]], budget: int, eos) -> dict:
    """Pool one tree's official generations (``records``, one per prompt) into the bench's fields;
    ``plain``: the official plain-greedy records of the same prompts; ``our_plain``: our plain tokens."""
    toks = secs = tau_num = fwd = 0
    split = {"prefill_s": 0.0, "draft_s": 0.0, "verify_s": 0.0, "other_s": 0.0}
    identical = identical_ours = 0
    full_s = full_tokens = 0.0
    nodes = 0
    hist: list[int] = []
    for rec, pl, ours in zip(records, plain, our_plain):
        c = count_official(rec["accepted"], rec["tokens"], budget, eos)
        t = official_timing(rec, c["forwards"])
        out = rec["tokens"][: c["tokens"]]
        pl_out = pl["tokens"][: stop_length(pl["tokens"], budget, eos)]
        identical += out == pl_out
        identical_ours += out == ours
        toks += c["tokens"]
        tau_num += c["tokens"] - 1
        fwd += c["forwards"]
        secs += t["seconds"]
        for k in split:
            split[k] += t[k]
        full_s += rec["full_s"]
        full_tokens += len(rec["tokens"])
        nodes += sum(rec["tree_nodes"][: c["forwards"]])
        for a in rec["accepted"][: c["forwards"]]:
            hist.extend([0] * (a + 1 - len(hist)))
            hist[a] += 1
    return {"tau": tau_num / fwd if fwd else 1.0, "tokens": toks, "forwards": fwd,
            "tokens_per_s": toks / secs if secs else 0.0, "identical_to_plain": identical,
            "identical_to_our_plain": identical_ours, "prompts": len(records),
            "mean_tree_nodes": nodes / max(fwd, 1), "accepted_hist": hist,
            "step_ms": {"draft": 1000 * split["draft_s"] / max(fwd, 1), "verify": 1000 * split["verify_s"] / max(fwd, 1),
                        "other": 1000 * split["other_s"] / max(fwd, 1)},
            "prefill_s": split["prefill_s"],
            "full_call": {"seconds": full_s, "tokens": int(full_tokens),
                          "tokens_per_s": full_tokens / full_s if full_s else 0.0}}


def summarize_official_plain(plain: list[dict], our_plain: list[list[int]], budget: int, eos) -> dict:
    toks = secs = 0.0
    identical_ours = 0
    for pl, ours in zip(plain, our_plain):
        n = stop_length(pl["tokens"], budget, eos)
        toks += n
        secs += plain_seconds(pl["forward_ends"], n)
        identical_ours += pl["tokens"][:n] == ours
    return {"tokens_per_s": toks / secs if secs else 0.0, "identical_to_our_plain": int(identical_ours),
            "prompts": len(plain)}


def pooled_tau(stats: list[dict]) -> float:
    """tau over several generations: each one's first token comes from its own prefill, so
    (sum of (new_tokens - 1)) / (sum of decode forwards). (Summing the counters first and then
    subtracting one, as merged DecodeStats do, counts n - 1 prefill tokens as decoded.)"""
    fwd = sum(s["target_forwards"] for s in stats)
    return sum(s["new_tokens"] - 1 for s in stats) / fwd if fwd else 1.0


def tree_of(cfg: dict, where: str) -> dict:
    """The dynamic tree of a decoding config (the YAML mapping): our depth/top_k/total_tokens."""
    drafter, tree = cfg.get("drafter") or {}, cfg.get("tree") or {}
    if drafter.get("type") != "eagle":
        raise ValueError(f"{where}: drafter.type must be 'eagle' (an EAGLE-1/2 head), got {drafter.get('type')!r}")
    if tree.get("shape") != "dynamic":
        raise ValueError(f"{where}: tree.shape must be 'dynamic' (EAGLE-2), got {tree.get('shape')!r}")
    return {k: tree.get(k, d) for k, d in (("depth", 4), ("top_k", 10), ("total_tokens", 60))}


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--setup", action="store_true", help="create the peer venv, target folder and exported head; then stop")
    ap.add_argument("--official", default=str(CACHE / "peer" / "EAGLE"),
                    help=f"a checkout of {OFFICIAL_URL} (git clone it there)")
    ap.add_argument("--venv", default=str(CACHE / "peer-venv"), help="the official code's virtualenv (transformers 4.53)")
    ap.add_argument("--workdir", default=str(CACHE / "peer"), help="where the target folder and the exported head go")
    ap.add_argument("--prompts", default="experiments/data/prompts/heldout.jsonl")
    ap.add_argument("--limit", type=int, default=8, help="the first N prompts")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--config", action="append", default=None,
                    help="a decoding config whose dynamic tree both implementations run with the exported head "
                         f"(repeatable; default: {', '.join(DEFAULT_CONFIGS)})")
    ap.add_argument("--extra", default=DEFAULT_EXTRA,
                    help="a config of ours run as it is (shipped head), as an extra row; '' for none")
    ap.add_argument("--head", default="heads/smollm2-135m", help="our head, exported with --full-vocab")
    ap.add_argument("--head-dtype", default="float32", choices=["float32", "bfloat16"],
                    help="precision of our side's exported head (the official code drafts in the target's, float32)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads in both processes (0: the CPU count)")
    ap.add_argument("--pause-data-job", action="store_true",
                    help=f"SIGSTOP the processes matching '{DATA_JOB}' during the timed runs (SIGCONT on any exit)")
    ap.add_argument("--json", default="experiments/results/peer_official_eagle.json")
    ap.add_argument("--md", default="experiments/results/peer_official_eagle.md")
    ap.add_argument("--report-only", default="", metavar="RESULTS_JSON",
                    help="rebuild --json/--md from the raw measurements kept in an earlier results file")
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)  # the child, in the peer venv
    ap.add_argument("--target-dir", default="", help=argparse.SUPPRESS)
    ap.add_argument("--head-dir", default="", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    for name in ("limit", "max_new_tokens"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.threads < 0:
        ap.error(f"--threads must be >= 0, got {args.threads}")
    args.config = args.config or list(DEFAULT_CONFIGS)
    if not args.serve:
        for c in args.config + ([args.extra] if args.extra else []):
            if not (ROOT / c).is_file() and not Path(c).is_file():
                ap.error(f"config file not found: {c}")
    return args


def _path(p: str) -> Path:
    q = Path(p).expanduser()
    return q if q.is_absolute() or q.exists() else ROOT / q


# ---- setup (our venv) ---------------------------------------------------------------------------

def _run(cmd: list[str], **kw) -> None:
    print("+", " ".join(map(str, cmd)), flush=True)
    subprocess.run([str(c) for c in cmd], check=True, **kw)


def setup_venv(venv: Path) -> Path:
    py = venv / "bin" / "python"
    stamp = venv / ".peer-installed"
    if stamp.is_file():
        return py
    if not py.exists():
        _run([sys.executable, "-m", "venv", venv])  # a venv made from inside one is based on the base interpreter
    _run([py, "-m", "pip", "install", "-q", PEER_TORCH])
    _run([py, "-m", "pip", "install", "-q", *PEER_PACKAGES])
    stamp.write_text(" ".join([PEER_TORCH, *PEER_PACKAGES]) + "\n")
    return py


def check_official(src: Path) -> None:
    if not (src / "eagle" / "model" / "ea_model.py").is_file():
        sys.exit(f"peer_official_eagle: no official EAGLE checkout at {src} (eagle/model/ea_model.py); "
                 f"fix: git clone {OFFICIAL_URL} {src}")


def make_target_folder(out: Path) -> Path:
    """The embedded SmolLM2 as a folder the official code and transformers 4.x read: sharded
    safetensors with an index (the head's embedding is read through it), ``rope_theta`` at the top
    of config.json (transformers 5 writes ``rope_parameters`` only, which 4.x ignores for the
    default 10000), and a tokenizer config naming a class 4.x knows."""
    if (out / "model.safetensors.index.json").is_file() and (out / ".complete").is_file():
        return out
    import shutil

    import eagle

    model, tok = eagle.load_target("smollm2-135m")
    model.hf_quantizer = None  # a GGUF-loaded model refuses save_pretrained (DESIGN.md)
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    model.save_pretrained(out, max_shard_size="200MB")
    tok.save_pretrained(out)
    cfg = json.loads((out / "config.json").read_text())
    rope = cfg.get("rope_parameters") or {}
    cfg["rope_theta"] = float(rope.get("rope_theta", cfg.get("rope_theta", 10000.0)))
    if rope.get("rope_type", "default") != "default":
        raise SystemExit(f"peer_official_eagle: rope type {rope['rope_type']} is not plain RoPE")
    cfg["torch_dtype"] = "float32"
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    tcfg = json.loads((out / "tokenizer_config.json").read_text())
    tcfg["tokenizer_class"] = "PreTrainedTokenizerFast"  # transformers 5's TokenizersBackend is unknown to 4.x
    (out / "tokenizer_config.json").write_text(json.dumps(tcfg, indent=2))
    if not (out / "model.safetensors.index.json").is_file():
        raise SystemExit(f"peer_official_eagle: save_pretrained wrote no shard index in {out}")
    (out / ".complete").write_text("ok\n")
    return out


def export_head(head: Path, out: Path) -> Path:
    if (out / "config.json").is_file() and (out / "model.safetensors").is_file():
        return out
    _run([Path(sys.executable).parent / "eagle", "export", "--head", head, "--format", "eagle", "--out", out, "--full-vocab"])
    return out


# ---- the timed runs ------------------------------------------------------------------------------

class DataJobPause:
    """SIGSTOP the background data job while timing; SIGCONT on exit, however it happens."""

    def __init__(self, enabled: bool):
        self.enabled, self.pids = enabled, []

    def __enter__(self):
        if not self.enabled:
            return self
        found = subprocess.run(["pgrep", "-f", DATA_JOB], capture_output=True, text=True).stdout.split()
        self.pids = [int(p) for p in found if int(p) != os.getpid()]
        self._old = {s: signal.signal(s, self._exit) for s in (signal.SIGTERM, signal.SIGHUP)}
        if self.pids:  # resumes the job even if this process is killed with SIGKILL
            pids = " ".join(map(str, self.pids))
            self.watchdog = subprocess.Popen(["sh", "-c", f"while kill -0 {os.getpid()} 2>/dev/null; do sleep 2; done; "
                                              f"kill -CONT {pids}"], start_new_session=True)
        for pid in self.pids:
            os.kill(pid, signal.SIGSTOP)
        print(f"paused the data job: {self.pids or 'none running'}", flush=True)
        return self

    @staticmethod
    def _exit(signum, frame):
        raise SystemExit(128 + signum)  # unwinds through __exit__

    def __exit__(self, *exc):
        if not self.enabled:
            return False
        for pid in self.pids:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        for s, h in self._old.items():
            signal.signal(s, h)
        if self.pids:
            self.watchdog.kill()
            self.watchdog.wait()
        print(f"resumed the data job: {self.pids or 'none'}", flush=True)
        return False


class Peer:
    """The official code in its own venv: one JSON request line in, one JSON answer line out."""

    def __init__(self, py: Path, args, target: Path, head: Path, trees: list[dict], warm_ids: list[int]):
        env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONPATH="")
        cmd = [str(py), str(Path(__file__).resolve()), "--serve", "--official", str(Path(args.official).expanduser()),
               "--target-dir", str(target), "--head-dir", str(head), "--threads", str(args.threads)]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
                                     cwd=str(Path(args.official).expanduser()))
        self.info = self.ask({"op": "load", **trees[0], "trees": trees, "warm_ids": warm_ids})

    def ask(self, req: dict) -> dict:
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit(f"peer_official_eagle: the official runner exited (status {self.proc.wait()}); see its stderr above")
        ans = json.loads(line)
        if "error" in ans:
            raise SystemExit(f"peer_official_eagle: the official runner failed: {ans['error']}")
        return ans

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write(json.dumps({"op": "quit"}) + "\n")
                self.proc.stdin.flush()
                self.proc.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()


def machine_load() -> list[str]:
    try:
        return subprocess.run(["top", "-bn1"], capture_output=True, text=True, timeout=30).stdout.splitlines()[:15]
    except (OSError, subprocess.TimeoutExpired):
        return []


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.serve:
        return serve(args)
    if args.report_only:  # redraw the summary and table from a results file's raw measurements
        return write_report(json.loads(_path(args.report_only).read_text())["raw"], args)
    workdir = Path(args.workdir).expanduser()
    src = Path(args.official).expanduser()
    check_official(src)
    py = setup_venv(Path(args.venv).expanduser())
    target = make_target_folder(workdir / "smollm2-135m-hf")
    head = export_head(_path(args.head), workdir / "smollm2-135m-eagle")
    print(f"peer venv: {py}\nofficial code: {src}\ntarget folder: {target}\nexported head: {head}", flush=True)
    if args.setup:
        return 0

    import torch
    import yaml

    import eagle
    from eagle.bench import run_bench
    from eagle.config import config_from_dict, load_config
    from eagle.prompts import encode_chat, load_prompts

    if args.threads:
        torch.set_num_threads(args.threads)
    args.threads = torch.get_num_threads()
    prompts = load_prompts(_path(args.prompts), args.limit)
    model, tok = eagle.load_target("smollm2-135m")
    encoded = [encode_chat(tok, p).tolist() for p in prompts]
    eos = {int(tok.eos_token_id)}

    trees, configs = [], []
    for c in args.config:
        path = _path(c)
        data = yaml.safe_load(path.read_text())
        shape = tree_of(data, str(c))
        off = official_budget(**shape)
        name = f"{path.stem}/exported"
        data = {**data, "name": name, "drafter": {**data["drafter"], "head": str(head),
                                                  "dtype": "" if args.head_dtype == "float32" else args.head_dtype}}
        configs.append(config_from_dict(data, path))
        trees.append({"config": str(c), "name": path.stem, "ours": shape, "official": off, "our_row": name})
    if args.extra:
        extra = load_config(_path(args.extra))
        extra.name = f"{extra.name}/shipped"
        configs.append(extra)

    load_before = machine_load()
    records: dict = {}
    ours_result: dict = {}
    off_eagle: dict = {t["name"]: [] for t in trees}
    off_plain: list[dict] = []
    order_log = []
    peer = Peer(py, args, target, head, [t["official"] for t in trees], encoded[0])
    print(f"official runner: {peer.info}", flush=True)
    try:
        with DataJobPause(args.pause_data_job):
            load_paused = machine_load()
            for i in range(len(encoded)):
                def ours():
                    nonlocal ours_result
                    ours_result = run_bench(model, tok, prompts[: i + 1], configs, args.max_new_tokens,
                                            target_name="smollm2-135m", records=records,
                                            on_record=lambda m, j, r: records.setdefault(m, {}).__setitem__(j, r))

                def official():
                    off_plain.append(peer.ask({"op": "plain", "ids": encoded[i], "max_new_tokens": args.max_new_tokens}))
                    for t in trees:
                        off_eagle[t["name"]].append(peer.ask({"op": "eagle", "ids": encoded[i],
                                                              "max_new_tokens": args.max_new_tokens, **t["official"]}))

                order = (ours, official) if i % 2 == 0 else (official, ours)  # A/B, B/A: drift hits both
                order_log.append([f.__name__ for f in order])
                for f in order:
                    t0 = time.perf_counter()
                    f()
                    print(f"prompt {i + 1}/{len(encoded)}: {f.__name__} {time.perf_counter() - t0:.0f} s", flush=True)
    finally:
        peer.close()

    raw = {"args": {k: v for k, v in vars(args).items()}, "command": "python experiments/peer_official_eagle.py "
           + " ".join(sys.argv[1:]), "trees": trees, "eos": sorted(eos), "ours": ours_result, "official_info": peer.info,
           "official_eagle": off_eagle, "official_plain": off_plain, "our_plain": [r["tokens"] for _, r in
                                                                                  sorted(records["plain"].items())],
           "order": order_log, "machine_load": {"before": load_before, "during": load_paused},
           "our_records": records,
           "data_job_paused": args.pause_data_job, "date": time.strftime("%Y-%m-%d %H:%M")}
    out = _path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"raw": raw}) + "\n")  # everything measured, before any summary
    return write_report(raw, args)


def write_report(raw: dict, args) -> int:
    """Summarize the raw measurements into ``--json`` and ``--md`` (also: ``--report-only RAW``)."""
    result = report(raw)
    out = _path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({**result, "raw": raw}, indent=1) + "\n")
    md = format_markdown(result)
    if args.md:
        _path(args.md).write_text(md + "\n")
    print(md)
    return 0


def report(raw: dict) -> dict:
    a = raw["args"]
    budget, eos, ours, our_plain = a["max_new_tokens"], set(raw["eos"]), raw["ours"], raw["our_plain"]
    off_eagle, off_plain = raw["official_eagle"], raw["official_plain"]
    trees = raw["trees"]
    runs = {r["config"]: r for r in ours["runs"]}
    rows = []
    offp = summarize_official_plain(off_plain, our_plain, budget, eos)
    for t in trees:
        o = runs[t["our_row"]]
        o_tau = pooled_tau([r["stats"] for r in raw["our_records"][t["our_row"]].values()])
        f = summarize_official(off_eagle[t["name"]], off_plain, our_plain, budget, eos)
        rows.append({"tree": t["name"], "ours_shape": t["ours"], "official_args": t["official"],
                     "ours": {"tau": o_tau, "bench_mean_accepted": o["mean_accepted"], "tokens_per_s": o["tokens_per_s"], "speedup": o["speedup"],
                              "identical_to_plain": o["identical_to_plain"], "prompts": o["prompts"],
                              "mean_tree_nodes": o["mean_tree_nodes"], "step_ms": o["step_ms"],
                              "accepted_hist": o["accepted_hist"]},
                     "official": {**f, "speedup_vs_own_plain": f["tokens_per_s"] / offp["tokens_per_s"]
                                  if offp["tokens_per_s"] else 0.0},
                     "tau_diff_pct": 100 * (o_tau - f["tau"]) / f["tau"] if f["tau"] else 0.0,
                     "tok_s_ratio": o["tokens_per_s"] / f["tokens_per_s"] if f["tokens_per_s"] else 0.0})
    extra = [r for r in ours["runs"] if r["config"].endswith("/shipped")]
    return {"command": raw["command"], "date": raw["date"], "device": ours["device"],
            "threads": raw["official_info"]["threads"], "prompts": a["prompts"], "limit": a["limit"],
            "max_new_tokens": budget, "eos": sorted(eos), "head_dtype_ours": a["head_dtype"],
            "official_runner": raw["official_info"], "order": raw["order"], "machine_load": raw["machine_load"],
            "data_job_paused": raw["data_job_paused"],
            "plain": {"ours": ours["plain"], "official": offp}, "trees": rows,
            "extra": [{"config": r["config"], "tau": pooled_tau([x["stats"] for x in raw["our_records"][r["config"]].values()]),
                       "bench_mean_accepted": r["mean_accepted"], "tokens_per_s": r["tokens_per_s"],
                       "speedup": r["speedup"], "identical_to_plain": r["identical_to_plain"], "prompts": r["prompts"],
                       "mean_tree_nodes": r["mean_tree_nodes"], "step_ms": r["step_ms"]} for r in extra],
            "ours_bench": ours}


def format_markdown(res: dict) -> str:
    p = res["plain"]
    lines = [f"`{res['command']}` ({res['date']}, {res['device']}; {res['limit']} prompts of {res['prompts']}, "
             f"greedy, {res['max_new_tokens']} new tokens)", "",
             f"Plain greedy: ours {p['ours']['tokens_per_s']:.2f} tok/s (transformers generate "
             f"{p['ours']['hf_tokens_per_s']:.2f}), official `naivegenerate` {p['official']['tokens_per_s']:.2f} tok/s; "
             f"official plain == our plain on {p['official']['identical_to_our_plain']}/{p['official']['prompts']} prompts.", "",
             "| tree (ours: depth/top_k/total_tokens; official: depth/top_k/total_token) | impl | tau | tok/s | "
             "vs own plain | identical to plain | nodes | draft ms/step | verify ms/step | other ms/step |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in res["trees"]:
        s, a = r["ours_shape"], r["official_args"]
        label = f"{r['tree']} ({s['depth']}/{s['top_k']}/{s['total_tokens']}; {a['depth']}/{a['top_k']}/{a['total_token']})"
        o, f = r["ours"], r["official"]
        lines.append(f"| {label} | ours | {o['tau']:.2f} | {o['tokens_per_s']:.2f} | {o['speedup']:.2f}x | "
                     f"{o['identical_to_plain']}/{o['prompts']} | {o['mean_tree_nodes']:.1f} | {o['step_ms']['draft']:.1f} | "
                     f"{o['step_ms']['verify']:.1f} | {o['step_ms']['bookkeeping']:.1f} |")
        lines.append(f"| | official | {f['tau']:.2f} | {f['tokens_per_s']:.2f} | {f['speedup_vs_own_plain']:.2f}x | "
                     f"{f['identical_to_plain']}/{f['prompts']} | {f['mean_tree_nodes']:.1f} | {f['step_ms']['draft']:.1f} | "
                     f"{f['step_ms']['verify']:.1f} | {f['step_ms']['other']:.1f} |")
    for e in res["extra"]:
        lines.append(f"| {e['config']} (ours only) | ours | {e['tau']:.2f} | {e['tokens_per_s']:.2f} | {e['speedup']:.2f}x | "
                     f"{e['identical_to_plain']}/{e['prompts']} | {e['mean_tree_nodes']:.1f} | {e['step_ms']['draft']:.1f} | "
                     f"{e['step_ms']['verify']:.1f} | {e['step_ms']['bookkeeping']:.1f} |")
    lines += ["", "| tree | tau ours / official | tau difference | tok/s ours / official | official identical to our plain |",
              "|---|---:|---:|---:|---:|"]
    for r in res["trees"]:
        lines.append(f"| {r['tree']} | {r['ours']['tau']:.3f} / {r['official']['tau']:.3f} | {r['tau_diff_pct']:+.1f}% | "
                     f"{r['tok_s_ratio']:.2f}x | {r['official']['identical_to_our_plain']}/{r['official']['prompts']} |")
    return "\n".join(lines)


# ---- the official side (runs in the peer venv) ------------------------------------------------------

def serve(args) -> int:
    """Answer JSON lines on stdin with the official code: load, plain, eagle, quit."""
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    sys.stdout = sys.stderr  # anything the official code prints stays off the protocol
    src = str(Path(args.official).expanduser())
    sys.path.insert(0, src)
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    from eagle.model import ea_model as em  # the official package (its own top-level name 'eagle')

    clock = time.perf_counter
    state: dict = {}

    def timed_draft(fn):
        def wrapper(*a, **k):
            t0 = clock()
            out = fn(*a, **k)
            state["draft"] = (t0, clock())
            state["nodes"] = int(out[0].shape[-1])  # the tree's tokens, root included
            return out
        return wrapper

    def timed_init(fn):
        def wrapper(*a, **k):
            t0 = clock()
            out = fn(*a, **k)
            d0, d1 = state.pop("draft")
            state["rec"]["prefill_s"] = (clock() - t0) - (d1 - d0)
            state["pending"] = (d1 - d0, state["nodes"])
            return out
        return wrapper

    def timed_tree(fn):
        def wrapper(*a, **k):
            t0 = clock()
            out = fn(*a, **k)
            draft_s, nodes = state.pop("pending")
            state["step"] = {"draft_s": draft_s, "verify_s": clock() - t0}
            state["rec"]["tree_nodes"].append(nodes)
            return out
        return wrapper

    def timed_posterior(fn):
        def wrapper(*a, **k):
            out = fn(*a, **k)
            state["step"]["accepted"] = int(out[1])
            return out
        return wrapper

    def timed_update(fn):
        def wrapper(*a, **k):
            out = fn(*a, **k)
            d0, d1 = state.pop("draft")
            step = state.pop("step")
            step["t_end"] = d0 - state["start"]  # the commit is done; the next tree's draft starts
            state["rec"]["steps"].append(step)
            state["rec"]["accepted"].append(step.pop("accepted"))
            state["pending"] = (d1 - d0, state["nodes"])
            return out
        return wrapper

    # wrap the module globals eagenerate looks up (it imported them with `from .utils import *`)
    em.initialize_tree = timed_init(em.initialize_tree)
    em.tree_decoding = timed_tree(em.tree_decoding)
    em.evaluate_posterior = timed_posterior(em.evaluate_posterior)
    em.update_inference_inputs = timed_update(em.update_inference_inputs)
    model = None

    def configure(req):
        layer = model.ea_layer
        layer.depth, layer.top_k, layer.total_tokens = req["depth"], req["top_k"], req["total_token"] - 1
        layer.init_tree()

    def eagle_gen(req):
        configure(req)
        ids = torch.tensor([req["ids"]], dtype=torch.long)
        state.clear()
        state["rec"] = {"steps": [], "accepted": [], "tree_nodes": []}
        state["start"] = clock()
        out = model.eagenerate(ids, temperature=0.0, max_new_tokens=req["max_new_tokens"])
        rec = state["rec"]
        rec["full_s"] = clock() - state["start"]
        rec["trailing_draft_s"] = state["pending"][0]
        rec["tokens"] = out[0, ids.shape[1]:].tolist()
        return rec

    def plain_gen(req):
        ids = torch.tensor([req["ids"]], dtype=torch.long)
        ends: list[float] = []
        base = model.base_model
        orig = base.forward

        def forward(*a, **k):
            out = orig(*a, **k)
            ends.append(clock() - start)
            return out

        base.forward = forward  # instance attribute: nn.Module.__call__ finds it first
        try:
            start = clock()
            out = model.naivegenerate(ids, temperature=0.0, max_new_tokens=req["max_new_tokens"])
            full = clock() - start
        finally:
            del base.forward
        return {"tokens": out[0, ids.shape[1]:].tolist(), "forward_ends": ends, "full_s": full}

    for line in sys.stdin:
        req = json.loads(line)
        try:
            if req["op"] == "quit":
                break
            if req["op"] == "load":
                model = em.EaModel.from_pretrained(use_eagle3=False, base_model_path=args.target_dir,
                                                   ea_model_path=args.head_dir, total_token=req["total_token"],
                                                   depth=req["depth"], top_k=req["top_k"], torch_dtype=torch.float32)
                model.eval()
                model.ea_layer.topK_genrate = timed_draft(model.ea_layer.topK_genrate)
                warm = req.get("warm_ids") or [1, 2, 3]  # no method pays first-call costs inside the timing
                plain_gen({"ids": warm, "max_new_tokens": 8})
                for tree in req.get("trees") or [req]:
                    eagle_gen({**tree, "ids": warm, "max_new_tokens": 8})
                import transformers

                ans = {"transformers": transformers.__version__, "torch": torch.__version__,
                       "threads": torch.get_num_threads(), "eos_token_id": model.tokenizer.eos_token_id,
                       "dtype": str(model.base_model.dtype)}
            elif req["op"] == "eagle":
                ans = eagle_gen(req)
            elif req["op"] == "plain":
                ans = plain_gen(req)
            else:
                ans = {"error": f"unknown op {req['op']!r}"}
        except Exception as e:  # one line back to the parent, which stops with it
            import traceback

            traceback.print_exc()
            ans = {"error": f"{type(e).__name__}: {e}"}
        proto.write(json.dumps(ans) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
