"""Self-distilled training data: the target writes the answers, and we keep its last hidden state
at every position from that same generation pass (no second forward).

Output: a folder of shards plus ``manifest.json``. Each shard is a safetensors file holding
``input_ids (N,) int32`` (the sequences concatenated), ``hidden (N, H) float16`` (target feature
after the final norm, position-aligned with ``input_ids``), optionally ``layers (N, k*H) float16``
(the hidden states entering the manifest's ``feature_layers``, concatenated: what an EAGLE-3 head
reads), ``offsets (S+1,) int64`` (sequence boundaries) and ``prompt_lens (S,) int32``. The manifest
is rewritten atomically after every shard, so an interrupted run resumes after the last finished
shard. Both kinds of features come from the generation pass itself (transformers records every
layer's input when asked): keeping the three extra layers costs disk and copies, no forward.
"""
from __future__ import annotations

import json
import os
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from tqdm import tqdm

from ..io import write_json
from ..prompts import PromptFileError, encode_chat, encode_conversation, question_row

# what the target answers: one user message, or a conversation ``(user, assistant, ..., user)`` whose
# last user turn it answers (a multi-turn follow-up)
Prompt = str | tuple[str, ...]

__all__ = ["Prompt", "encode_prompt", "eos_and_pad", "prompt_chars", "sample_next", "read_prompt_records", "read_conversations", "generate_shards", "write_shard", "ShardDataset", "load_manifest", "token_counts", "read_tensors",
           "writer_lock"]


def encode_prompt(tok, prompt: Prompt) -> torch.Tensor:
    """Token ids ``(N,)`` of a prompt through the chat template, ending with the generation prompt."""
    if isinstance(prompt, str):
        return encode_chat(tok, prompt)
    return encode_conversation(tok, prompt[0::2], prompt[1::2])


def prompt_chars(prompt: Prompt) -> int:
    """The length of a prompt in characters (all its turns)."""
    return len(prompt) if isinstance(prompt, str) else sum(len(t) for t in prompt)


def read_prompt_records(path: str | Path) -> list[Prompt]:
    """Prompts from our JSONL (``{"prompt": ...}`` per line, or ``{"turns": [user, ...], "answers":
    [assistant, ...]}`` for a follow-up: the target answers the last turn after the conversation so
    far, one answer fewer than turns) or a ShareGPT/UltraChat-style JSON file.

    ShareGPT: a list of ``{"conversations": [{"from": "human", "value": ...}, ...]}``; UltraChat:
    ``{"messages": [{"role": "user", "content": ...}, ...]}`` (a list, or one object per line).
    The first user turn of each conversation becomes a prompt (the target writes its own answer).

    Raises :class:`eagle.prompts.PromptFileError` naming the file (and the line of a JSONL file) for
    a missing or empty file, a line that is not JSON, or a record without a user prompt.
    """
    path = Path(path)
    if not path.is_file():
        raise PromptFileError(f"prompts file not found: {path}")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise PromptFileError(f"{path}: not a UTF-8 text file ({e.reason} at byte {e.start})") from None
    if not text.strip():
        raise PromptFileError(f"{path}: empty prompts file (expected JSONL with a \"prompt\" per line, or a "
                              "ShareGPT/UltraChat JSON file)")
    records = _json_records(path, text)  # [(where, record)]: "file:line" or "file: record i"
    prompts = []
    for where, rec in records:
        if isinstance(rec, dict) and "turns" in rec and "prompt" not in rec:
            prompt = _follow_up(rec, where)
        else:
            prompt = read_conversations(rec) if isinstance(rec, dict) else None
        if prompt is None:
            raise PromptFileError(f"{where}: no prompt (expected a JSON object with a \"prompt\" string, ShareGPT "
                                  "'conversations' or UltraChat 'messages' with a user turn)")
        prompts.append(prompt)
    if not prompts:
        raise PromptFileError(f"{path}: no prompts (an empty JSON list)")
    return prompts


def _json_records(path: Path, text: str) -> list[tuple[str, object]]:
    """The records of one JSON document (a list, or one object) or of JSONL, each with where it is
    for error messages: ``file:line`` or ``file: record i``."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        first = next(line for line in text.splitlines() if line.strip()).strip()
        # JSONL: a first record followed by more ("Extra data"), or a first line that opens an object on
        # it; otherwise one broken document, whose own error position is the useful one
        if e.msg != "Extra data" and not (first.startswith("{") and len(first) > 1):
            raise PromptFileError(f"{path}:{e.lineno}: not valid JSON ({e.msg})") from None
        records = []
        for n, line in enumerate(text.splitlines(), start=1):
            if line.strip():
                try:
                    records.append((f"{path}:{n}", json.loads(line)))
                except json.JSONDecodeError as e:
                    raise PromptFileError(f"{path}:{n}: not valid JSON ({e.msg})") from None
        return records
    if isinstance(data, list):
        return [(f"{path}: record {i}", rec) for i, rec in enumerate(data)]
    return [(f"{path}:1", data)]


def _follow_up(rec: dict, where: str) -> tuple[str, ...]:
    """``{"turns": [...], "answers": [...]}`` -> ``(user, assistant, ..., user)``, checked (the turns
    as a bench question's are)."""
    turns, answers = question_row(rec, where).turns, rec.get("answers", [])
    if not (isinstance(answers, list) and all(isinstance(a, str) for a in answers)) or len(answers) != len(turns) - 1:
        raise PromptFileError(f"{where}: 'answers' must be a list of {len(turns) - 1} strings (one per turn "
                              "before the last)")
    if len(turns) == 1:
        return turns[0]
    return tuple(x for pair in zip(turns, answers) for x in pair) + (turns[-1],)


def read_conversations(rec: dict) -> str | None:
    """The first user message of one record in any of the supported formats."""
    if isinstance(rec.get("prompt"), str):
        return rec["prompt"]
    for key, who, role_key, text_key in (("conversations", ("human", "user"), "from", "value"),
                                         ("messages", ("user", "human"), "role", "content")):
        turns = rec.get(key)
        if isinstance(turns, list):
            for t in turns:
                if isinstance(t, dict) and t.get(role_key) in who and isinstance(t.get(text_key), str):
                    return t[text_key]
    return None


def load_manifest(folder: str | Path) -> dict:
    path = Path(folder) / "manifest.json"
    if not path.exists():
        return {"shards": [], "prompts_done": 0, "tokens": 0}
    return json.loads(path.read_text())


def _write_manifest(folder: Path, manifest: dict) -> None:
    write_json(manifest, folder / "manifest.json", indent=1)


# Sampling looks at the SAMPLE_TOP_K most likely tokens only: sorting the whole vocabulary for
# top-p and drawing from it cost more than the forward itself at 48 x 49,152;
# at the data stage's temperatures the mass beyond the first 256 tokens is negligible.
SAMPLE_TOP_K = 256


def sample_next(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """``logits (B, V)`` -> ``(B,)`` next tokens: greedy at temperature 0, else temperature + top-p
    sampling among the ``SAMPLE_TOP_K`` most likely tokens (top-p applied within them)."""
    if temperature <= 0:
        return logits.argmax(-1)
    top = logits.topk(min(SAMPLE_TOP_K, logits.shape[-1]), dim=-1)  # sorted, (B, K)
    probs = torch.softmax(top.values.float() / temperature, dim=-1)  # (B, K)
    if top_p < 1.0:  # keep a token if the mass strictly before it is < top_p
        probs = probs.masked_fill((probs.cumsum(-1) - probs) >= top_p, 0.0)
    pick = torch.multinomial(probs, 1)  # (B, 1); multinomial renormalizes
    return top.indices.gather(-1, pick)[:, 0]


@torch.no_grad()
def _generate_batch(model, tok, prompts: list[str], max_new_tokens: int, temperature: float, top_p: float,
                    eos: int, pad: int, store_hidden: bool = True, layers: tuple[int, ...] = ()):
    """One batched sampling pass; yields ``(ids (n,), hidden (n, H), fused (n, k*H) or None,
    prompt_len)`` per sequence (``fused``: the hidden states entering ``layers``, concatenated).

    Our own loop over the unmodified model (not ``generate``): sampling among the top tokens only
    (:func:`sample_next`), the LM head on the last position only, and finished sequences leave the
    batch: whenever at most half of its rows are still running, the batch shrinks to half (running
    rows first, finished ones as filler), so a long answer does not keep many short ones computing
    and the packed GEMM needs copies for a few row counts only (B, B/2, B/4, ...).
    """
    from ..backends import make_backend
    from ..kv import SlotCache

    enc = [encode_prompt(tok, p) for p in prompts]
    B, L = len(enc), max(len(e) for e in enc)
    ids = torch.full((B, L), pad, dtype=torch.long)
    att = torch.zeros((B, L), dtype=torch.long)
    for i, e in enumerate(enc):  # left padding: every sequence's prompt ends at column L-1
        ids[i, L - len(e):] = e
        att[i, L - len(e):] = 1
    lm_w = model.get_output_embeddings().weight
    want = bool(layers) and store_hidden
    toks = [list(e) for e in enc]  # prompt + sampled tokens, per sequence
    hid: list[list[torch.Tensor]] = [[] for _ in enc]  # (n_j, H) pieces per sequence
    fus: list[list[torch.Tensor]] = [[] for _ in enc]  # (n_j, k*H) pieces
    rows = torch.arange(B)  # batch row -> sequence
    running = torch.ones(B, dtype=torch.bool)  # per batch row
    # a preallocated cache written by slot: appending to a DynamicCache copies every layer's whole
    # K/V each step
    cache = SlotCache(model.config.get_text_config(decoder=True).num_hidden_layers, L + max_new_tokens)
    pos = (att.cumsum(-1) - 1).clamp(min=0)  # (B, L) positions of the left-padded prompts
    causal = torch.ones(L, L, dtype=torch.bool).tril()  # (L, L)
    x, n = ids, 0  # n: slots written
    sizes = [B]
    while sizes[-1] // 2 >= 1:
        sizes.append(sizes[-1] // 2)
    # every step multiplies b rows by each weight: the backend's faster twin for those row counts
    # where it has one (same results up to rounding), which keeps its copies for later batches
    backend = make_backend("auto", lm_w.device)
    runner = backend.fast_model(model, sizes)
    base = runner.get_decoder()
    # the LM head on the last position: b rows, through the twin's head when it runs (packed too)
    head = (lambda x: runner.get_output_embeddings()(x)) if runner is not model else (lambda x: backend.project(x, lm_w))
    for step in range(max_new_tokens):
        t = x.shape[1]
        mask = att.bool()[:, None, None, :]  # (b, 1, 1, n + t): real tokens only (not the left padding)
        if n == 0:  # causal; a padding column attends to itself (no all-masked row, no NaN)
            mask = (mask & causal[None, None]) | torch.eye(L, dtype=torch.bool)[None, None]  # (b, 1, L, L)
        out = base(input_ids=x, attention_mask=mask, position_ids=pos, cache=cache, use_cache=True,
                   output_hidden_states=want, cache_slots=torch.arange(n, n + t), cache_kv_len=n + t)
        n += t
        h = out.last_hidden_state  # (b, t, H)
        nxt = sample_next(head(h[:, -1]).float(), temperature, top_p)  # (b,)
        f = torch.cat([out.hidden_states[i] for i in layers], -1).half() if want else None  # (b, t, k*H)
        for r in running.nonzero()[:, 0].tolist():
            j = int(rows[r])
            lo = L - len(enc[j]) if step == 0 else 0  # the prompt's own columns only
            if store_hidden:
                hid[j].append(h[r, lo:])
                if want:
                    fus[j].append(f[r, lo:])
            toks[j].append(int(nxt[r]))
        running &= (nxt != eos)
        n_run = int(running.sum())
        if n_run == 0 or step + 1 == max_new_tokens:
            break
        if n_run <= len(rows) // 2:  # shrink to half: running rows first, finished ones as filler
            keep = torch.cat([running.nonzero()[:, 0], (~running).nonzero()[:, 0]])[: len(rows) // 2]
            cache.select_rows(keep)  # (L, b, H_kv, C, D) -> (L, b', H_kv, C, D)
            rows, running, nxt, att, pos = rows[keep], running[keep], nxt[keep], att[keep], pos[keep]
        x = nxt[:, None]  # (b, 1)
        att = torch.cat([att, att.new_ones(len(rows), 1)], dim=1)
        pos = pos[:, -1:] + 1
    for j, e in enumerate(enc):
        # the feature of the final token (EOS or cut-off) was never computed: drop that token
        seq = torch.tensor(toks[j][:-1], dtype=torch.long)  # (n,)
        hj = torch.cat(hid[j]) if store_hidden else torch.zeros(len(seq), 0)  # (n, H)
        yield seq, hj, torch.cat(fus[j]) if want else None, len(e)


def generate_shards(model, tok, prompts: list[str], out_dir: str | Path, batch_size: int = 32,
                    max_new_tokens: int = 192, temperature: float = 0.6, top_p: float = 0.95,
                    shard_prompts: int = 96, seed: int = 0, store_hidden: bool = True,
                    feature_layers: tuple[int, ...] | list[int] = (), on_shard=None) -> dict:
    """Self-distill ``prompts`` into shards under ``out_dir`` (resumable; see module docstring).
    ``feature_layers``: also store the hidden states entering these target layers (``hidden_states``
    indices); a folder keeps the layers it was started with (a resume with others is an error).
    ``on_shard()``: called after each shard is written (the token store mirrors it)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    with writer_lock(out_dir):
        return _generate_shards(model, tok, prompts, out_dir, batch_size, max_new_tokens, temperature, top_p,
                                shard_prompts, seed, store_hidden, feature_layers, on_shard)


@contextmanager
def writer_lock(out_dir: str | Path):
    """One writer per data folder: a second data stage on the same folder (another `eagle train` while
    a long one runs in the background) stops with a message instead of interleaving shards."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    lock = out_dir / ".writer.lock"
    try:
        fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        try:
            pid = int(lock.read_text().strip() or 0)
        except (OSError, ValueError):
            pid = 0
        if pid and _alive(pid):
            raise ValueError(f"{out_dir} is being written by process {pid} (a data stage already running); "
                               "wait for it, or train on what is there with data_tokens") from None
        lock.unlink(missing_ok=True)  # left by a process that died
        fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    os.write(fd, str(os.getpid()).encode())
    os.close(fd)
    try:
        yield
    finally:
        lock.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def eos_and_pad(model, tok) -> tuple[int, int]:
    """The end-of-sequence id a sampling pass stops at (the first, where the model lists several) and
    the id it left-pads prompts with (the tokenizer's, else EOS)."""
    eos = model.generation_config.eos_token_id
    eos = int(eos[0] if isinstance(eos, list) else eos)
    return eos, tok.pad_token_id if tok.pad_token_id is not None else eos


def _generate_shards(model, tok, prompts, out_dir: Path, batch_size, max_new_tokens, temperature, top_p,
                     shard_prompts, seed, store_hidden, feature_layers, on_shard=None) -> dict:
    manifest = load_manifest(out_dir)
    eos, pad = eos_and_pad(model, tok)
    done = manifest["prompts_done"]
    manifest.setdefault("hidden_size", int(model.config.get_text_config(decoder=True).hidden_size))
    layers = tuple(int(i) for i in feature_layers) if store_hidden else ()
    if manifest["shards"] and tuple(manifest.get("feature_layers", ())) != layers:
        raise ValueError(f"{out_dir} holds shards with feature layers {list(manifest.get('feature_layers', []))}, "
                         f"this run asks for {list(layers)}: use another data_dir or the same layers")
    manifest["feature_layers"] = list(layers)
    bar = tqdm(total=len(prompts), initial=done, desc="self-distill", unit="prompt", dynamic_ncols=True)
    while done < len(prompts):
        chunk = prompts[done: done + shard_prompts]
        torch.manual_seed(seed + done)  # a resumed run draws the same samples for this shard
        # similar lengths in one batch waste less compute on padding
        order = sorted(range(len(chunk)), key=lambda i: prompt_chars(chunk[i]))
        ids_l, hid_l, lay_l, plen = [], [], [], []
        for b in range(0, len(order), batch_size):
            batch = [chunk[i] for i in order[b: b + batch_size]]
            for ids, hid, fused, pl in _generate_batch(model, tok, batch, max_new_tokens, temperature, top_p, eos,
                                                         pad, store_hidden, layers):
                ids_l.append(ids)
                hid_l.append(hid)
                lay_l.append(fused)
                plen.append(pl)
            bar.update(len(batch))
            bar.set_postfix(tokens=manifest["tokens"] + sum(len(x) for x in ids_l))
        done += len(chunk)
        write_shard(out_dir, manifest, ids_l, hid_l if store_hidden else None, plen, prompts_done=done,
                    layers=lay_l if layers else None)
        if on_shard is not None:
            on_shard()
    bar.close()
    return manifest


def write_shard(out_dir: str | Path, manifest: dict, ids: list[torch.Tensor], hidden: list[torch.Tensor] | None,
                prompt_lens: list[int], prompts_done: int, layers: list[torch.Tensor] | None = None) -> dict:
    """Append one shard (sequences ``ids[i] (n_i,)``, features ``hidden[i] (n_i, H)`` or None,
    optionally ``layers[i] (n_i, k*H)``) and rewrite the manifest atomically; returns the updated
    manifest."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    lens = torch.tensor([len(x) for x in ids])
    name = f"shard-{len(manifest['shards']):05d}.safetensors"
    tensors = {"input_ids": torch.cat(ids).to(torch.int32),
               "offsets": torch.cat([torch.zeros(1, dtype=torch.long), lens.cumsum(0)]),
               "prompt_lens": torch.tensor(prompt_lens, dtype=torch.int32)}
    if hidden is not None:
        tensors["hidden"] = torch.cat(hidden).to(torch.float16)
        manifest["hidden_size"] = int(tensors["hidden"].shape[1])
    if layers is not None:
        tensors["layers"] = torch.cat(layers).to(torch.float16)
    save_file(tensors, str(out_dir / (name + ".tmp")))
    os.replace(out_dir / (name + ".tmp"), out_dir / name)
    manifest["shards"].append({"file": name, "sequences": len(ids), "tokens": int(lens.sum())})
    manifest.update(prompts_done=prompts_done, tokens=manifest["tokens"] + int(lens.sum()),
                    has_hidden=hidden is not None, has_layers=layers is not None)
    _write_manifest(out_dir, manifest)
    return manifest


@dataclass
class Sequence:
    input_ids: torch.Tensor  # (n,) int64
    hidden: torch.Tensor | None  # (n, H) float16; None when features are computed online
    prompt_len: int
    layers: torch.Tensor | None = None  # (n, k*H) float16, when asked for (EAGLE-3)


class ShardDataset:
    """All sequences of a shard folder, in memory (fp16 features: ~1.2 KB per token at H = 576, and
    3x that for three fused layers); ``load_hidden`` / ``load_layers`` choose which are read."""

    def __init__(self, folder: str | Path, load_hidden: bool = True, load_layers: bool = False, max_tokens: int = 0):
        """``max_tokens``: only the first shards, up to the first one that reaches this many tokens in
        all (0 = every shard): the same data in smaller amounts, e.g. for a learning curve."""
        folder = Path(folder)
        manifest = load_manifest(folder)
        if not manifest["shards"]:
            raise ValueError(f"no shards in {folder} (the data stage of `eagle train` writes them, from the "
                             "prompts of a training config with this data_dir)")
        if load_hidden and not manifest.get("has_hidden", True):
            raise ValueError(f"{folder} holds no features (made with extraction: online)")
        if load_layers and not manifest.get("has_layers", False):
            raise ValueError(f"{folder} holds no multi-layer features (an EAGLE-3 head needs data made with "
                             "feature_layers set)")
        self.sequences: list[Sequence] = []
        names = ("input_ids", "offsets", "prompt_lens") + (("hidden",) if load_hidden else ()) \
            + (("layers",) if load_layers else ())
        seen = 0
        for s in manifest["shards"]:
            if max_tokens and seen >= max_tokens:
                break
            seen += s["tokens"]
            t = read_tensors(folder / s["file"], names)
            off = t["offsets"].tolist()
            for i in range(len(off) - 1):
                a, b = off[i], off[i + 1]
                self.sequences.append(Sequence(t["input_ids"][a:b].long(), t["hidden"][a:b] if load_hidden else None,
                                               int(t["prompt_lens"][i]), t["layers"][a:b] if load_layers else None))
        self.hidden_size = manifest.get("hidden_size")  # None: featureless shards of unknown width
        self.feature_layers = tuple(manifest.get("feature_layers", ()))

    def __len__(self) -> int:
        return len(self.sequences)

    def __iter__(self) -> Iterator[Sequence]:
        return iter(self.sequences)


def read_tensors(path: str | Path, names) -> dict[str, torch.Tensor]:
    """Only the named tensors of a safetensors file (the features of a shard are most of its bytes)."""
    with safe_open(str(path), framework="pt") as f:
        return {n: f.get_tensor(n) for n in names}


def token_counts(sequences, vocab_size: int) -> torch.Tensor:
    """How often each token id occurs in ``sequences`` (for choosing a reduced draft vocabulary)."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for s in sequences:
        counts += torch.bincount(s.input_ids, minlength=vocab_size)
    return counts
