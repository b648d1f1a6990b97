"""The token store: what a self-distillation run sampled, small enough to keep in the repository.

Sampling the target's answers is the slow part of the data stage (one token per forward), while
the features it keeps (~4.6 KB per token with the EAGLE-3 layers) are cheap to recompute from the
tokens with one batched forward. A machine that starts empty (a new checkout, a CI runner, a
cleared cache) would otherwise sample everything again. So beside the feature shards
of ``data_dir`` the data stage mirrors each shard's tokens into ``tokens_dir`` (4 bytes per token:
``input_ids (N,) int32``, ``offsets (S+1,) int64``, ``prompt_lens (S,) int32``, one file per shard,
same name) with a ``manifest.json`` that records the sampling settings and a hash of the prompts
answered. :func:`sync_token_store` brings the two folders level before sampling more:

- shards in ``data_dir`` that ``tokens_dir`` lacks are copied into it (tokens only);
- shards in ``tokens_dir`` that ``data_dir`` lacks are rebuilt there: the features come from one
  teacher-forced forward over the stored tokens (:func:`featurize`), equal to the ones the sampling
  pass kept up to float rounding (the same positions, the same unmodified model).

Sampling then resumes after the last shard, with the same per-shard seeds, so the data a run ends
with does not depend on how many machines it took.
"""
from __future__ import annotations

import hashlib
import json
import weakref
from pathlib import Path

import torch
from safetensors.torch import save_file
from tqdm import tqdm

from ..io import write_json
from .data import load_manifest, read_tensors, write_shard

__all__ = ["TokenStoreError", "load_token_manifest", "sampling_settings", "sync_token_store", "write_token_shard",
           "featurize", "prompts_hash", "mirror_shards"]

TOKENS_FORMAT = "eagle-selfdistill-tokens/1"
# the features of a rebuilt shard: one forward over at most this many (padded) positions at a time
FEATURIZE_TOKENS = 4096
# ... or over at most this many, when the small-row CPU GEMM (kernels/cpu_gemm.py) runs them faster
# than MKL runs 4,096 (same features up to fp16 rounding; the kernel's advantage fades with more
# rows; docs/cpu-backend.md, featurize-kernel)
STREAM_TOKENS = 256
_RUNNERS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # model -> (runner, max_tokens)


class TokenStoreError(ValueError):
    """A token store that does not fit the run (other settings, other prompts, other data)."""


def prompts_hash(prompts: list) -> str:
    """sha256 over the prompts, in order (each one's length first, so boundaries count; a
    conversation as a marker byte and its JSON)."""
    h = hashlib.sha256()
    for p in prompts:
        b = p.encode() if isinstance(p, str) else b"\xff" + json.dumps(list(p)).encode()
        h.update(len(b).to_bytes(8, "little"))
        h.update(b)
    return h.hexdigest()


def sampling_settings(target: str, temperature: float, max_new_tokens: int, shard_prompts: int, seed: int) -> dict:
    """What decides which tokens a shard holds (the batch size only changes which draws fall where)."""
    return {"target": target, "temperature": float(temperature), "max_new_tokens": int(max_new_tokens),
            "shard_prompts": int(shard_prompts), "seed": int(seed)}


def load_token_manifest(folder: str | Path) -> dict:
    path = Path(folder) / "manifest.json"
    if not path.exists():
        return {"format": TOKENS_FORMAT, "shards": [], "prompts_done": 0, "tokens": 0}
    m = json.loads(path.read_text())
    if m.get("format") != TOKENS_FORMAT:
        raise TokenStoreError(f"{path} is not a token store manifest (format {m.get('format')!r}, "
                              f"expected {TOKENS_FORMAT!r})")
    return m


def write_token_shard(folder: str | Path, manifest: dict, name: str, tensors: dict[str, torch.Tensor],
                      settings: dict, prompts: list, made: dict | None = None) -> dict:
    """Add one shard's tokens (``input_ids``, ``offsets``, ``prompt_lens``) under ``name`` and rewrite
    the manifest atomically; ``prompts``: the whole prompt list (its answered prefix is hashed);
    ``made``: how the shard was sampled beyond the settings (precision, batch size), recorded with it."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    t = {"input_ids": tensors["input_ids"].to(torch.int32).contiguous(),
         "offsets": tensors["offsets"].to(torch.int64).contiguous(),
         "prompt_lens": tensors["prompt_lens"].to(torch.int32).contiguous()}
    save_file(t, str(folder / (name + ".tmp")))
    (folder / (name + ".tmp")).replace(folder / name)
    seqs, toks = len(t["prompt_lens"]), int(t["offsets"][-1])
    done = manifest["prompts_done"] + seqs  # one sequence per prompt
    manifest["shards"].append({"file": name, "sequences": seqs, "tokens": toks, **(made or {})})
    manifest.update(format=TOKENS_FORMAT, settings=settings, prompts_done=done, tokens=manifest["tokens"] + toks,
                    prompts_sha256=prompts_hash(prompts[:done]))
    write_json(manifest, folder / "manifest.json", indent=1)
    return manifest


@torch.no_grad()
def featurize(model, seqs: list[torch.Tensor], layers: tuple[int, ...] = (),
              max_tokens: int = FEATURIZE_TOKENS, backend=None) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
    """The features the sampling pass keeps, recomputed from the tokens: per sequence ``ids (n,)``,
    ``(hidden (n, H), fused (n, k*H) or None)`` in float16: the final-norm feature at every position,
    and the hidden states entering ``layers`` (transformers' ``hidden_states`` indices), concatenated.
    Sequences of similar length share a right-padded batch of at most ``max_tokens`` positions
    (at most ``STREAM_TOKENS`` on a weight-sharing copy of the model whose products take the
    small-row kernel, where timing the model's layers at that row count finds it faster).
    ``backend``: the one that decides that (default: ``auto`` for the model's device)."""
    if max_tokens > STREAM_TOKENS:
        if model not in _RUNNERS:
            from ..backends import make_backend

            backend = backend or make_backend("auto", next(model.parameters()).device)
            twin = backend.fast_linears(model, STREAM_TOKENS, upto=STREAM_TOKENS)
            _RUNNERS[model] = (twin, STREAM_TOKENS) if twin is not None else (model, max_tokens)
        model, max_tokens = _RUNNERS[model]
    base = model.get_decoder()
    dev = next(model.parameters()).device
    out: list = [None] * len(seqs)
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))
    i = 0
    while i < len(order):
        T = len(seqs[order[i]])
        j = i + 1  # grow the batch while (rows x longest) stays within budget (ascending lengths)
        while j < len(order) and (j - i + 1) * len(seqs[order[j]]) <= max_tokens:
            j += 1
        chunk = order[i:j]
        T = len(seqs[chunk[-1]])
        ids = torch.zeros(len(chunk), T, dtype=torch.long)  # (b, T), right padding
        att = torch.zeros(len(chunk), T, dtype=torch.long)
        for r, k in enumerate(chunk):
            ids[r, : len(seqs[k])] = seqs[k]
            att[r, : len(seqs[k])] = 1
        res = base(input_ids=ids.to(dev), attention_mask=att.to(dev), output_hidden_states=bool(layers))
        h = res.last_hidden_state  # (b, T, H)
        f = torch.cat([res.hidden_states[li] for li in layers], -1) if layers else None  # (b, T, k*H)
        for r, k in enumerate(chunk):
            n = len(seqs[k])
            out[k] = (h[r, :n].half().cpu(), f[r, :n].half().cpu() if f is not None else None)
        i = j
    return out


def _check_store(tokens_dir: Path, store: dict, settings: dict, prompts: list) -> None:
    if not store["shards"]:
        return
    old = store.get("settings", {})
    diff = [f"{k}: {old.get(k)!r} there, {v!r} here" for k, v in settings.items() if old.get(k) != v]
    if diff:
        raise TokenStoreError(f"{tokens_dir} was sampled with other settings ({'; '.join(diff)}): "
                              "use another tokens_dir or the same settings")
    done = store["prompts_done"]
    if done > len(prompts) or prompts_hash(prompts[:done]) != store.get("prompts_sha256"):
        raise TokenStoreError(f"{tokens_dir} answers other prompts than the first {done} of this run's prompt "
                              "list: use another tokens_dir or the same prompts in the same order")


def mirror_shards(data_dir: str | Path, tokens_dir: str | Path, prompts: list, settings: dict,
                  made: dict | None = None) -> dict:
    """Copy the tokens of the shards of ``data_dir`` that ``tokens_dir`` lacks (after checking that
    the shards both hold are the same data); returns the token manifest. ``made``: recorded with
    each copied shard (how it was sampled), when known."""
    data_dir, tokens_dir = Path(data_dir), Path(tokens_dir)
    m, store = load_manifest(data_dir), load_token_manifest(tokens_dir)
    _check_store(tokens_dir, store, settings, prompts)
    for i in range(min(len(m["shards"]), len(store["shards"]))):
        a, b = m["shards"][i], store["shards"][i]
        same = (a["sequences"], a["tokens"]) == (b["sequences"], b["tokens"]) and torch.equal(
            read_tensors(data_dir / a["file"], ("input_ids",))["input_ids"],
            read_tensors(tokens_dir / b["file"], ("input_ids",))["input_ids"])
        if not same:
            raise TokenStoreError(f"{data_dir} and {tokens_dir} differ at shard {i} ({a['tokens']} against "
                                  f"{b['tokens']} tokens): they hold different data; use a fresh data_dir")
    for s in m["shards"][len(store["shards"]):]:
        t = read_tensors(data_dir / s["file"], ("input_ids", "offsets", "prompt_lens"))
        store = write_token_shard(tokens_dir, store, s["file"], t, settings, prompts, made)
    return store


def sync_token_store(model, data_dir: str | Path, tokens_dir: str | Path, prompts: list, settings: dict,
                     store_hidden: bool, layers: tuple[int, ...] = (), max_tokens: int = 0,
                     progress: bool = True) -> dict:
    """Bring ``data_dir`` (features) and ``tokens_dir`` (tokens) level, see the module docstring;
    ``max_tokens`` > 0: rebuild shards only until ``data_dir`` holds that many tokens. Returns the
    token manifest. The caller holds ``data_dir``'s writer lock."""
    data_dir, tokens_dir = Path(data_dir), Path(tokens_dir)
    store = mirror_shards(data_dir, tokens_dir, prompts, settings)
    m = load_manifest(data_dir)
    missing = store["shards"][len(m["shards"]):]
    if not missing or (max_tokens and m["tokens"] >= max_tokens):
        return store
    if m["shards"] and tuple(m.get("feature_layers", ())) != tuple(layers):
        raise ValueError(f"{data_dir} holds shards with feature layers {list(m.get('feature_layers', []))}, "
                         f"this run asks for {list(layers)}: use another data_dir or the same layers")
    m.setdefault("hidden_size", int(model.config.get_text_config(decoder=True).hidden_size))
    m["feature_layers"] = list(layers)
    bar = tqdm(total=sum(s["tokens"] for s in missing), desc="features from the token store", unit="tok",
               dynamic_ncols=True, disable=not progress)
    for s in missing:  # tokens -> data, shard by shard (an interruption keeps the finished ones)
        if max_tokens and m["tokens"] >= max_tokens:
            break
        t = read_tensors(tokens_dir / s["file"], ("input_ids", "offsets", "prompt_lens"))
        off = t["offsets"].tolist()
        ids = [t["input_ids"][off[i]: off[i + 1]].long() for i in range(len(off) - 1)]
        feats = featurize(model, ids, layers) if store_hidden else None
        m = write_shard(data_dir, m, ids, [f[0] for f in feats] if feats else None, t["prompt_lens"].tolist(),
                        prompts_done=m["prompts_done"] + len(ids),
                        layers=[f[1] for f in feats] if feats and layers else None)
        bar.update(s["tokens"])
    bar.close()
    return store
