"""What every trainer here shares (the EAGLE head, the EAGLE-3 head, Medusa heads and the distilled
draft model): strict YAML configs, the per-process run context (torch.distributed), the learning
rate schedule, the seeded held-out split and batch order, attention masks of padded batches, and
atomic, settings-checked checkpoints.
"""
from __future__ import annotations

import math
import os
import tempfile
from dataclasses import asdict
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from safetensors.torch import load_file, save_file

from ..config import DTYPES, ConfigError, from_dict, read_yaml
from ..io import existing_dir, replace_dir

__all__ = ["check_optimization", "step_precision", "full_precision", "load_yaml_config", "causal_mask", "Run",
           "cosine_lr", "heldout_split", "batch_order", "RESUMABLE_CHANGES", "load_resume_state", "save_checkpoint",
           "read_state", "write_state"]


def check_optimization(cfg, positive: tuple[str, ...]) -> None:
    """The checks a training config shares: the ``positive`` fields >= 1, lr and epochs > 0, a known
    export dtype, a held-out fraction in [0, 1)."""
    for name in positive:
        if getattr(cfg, name) < 1:
            raise ConfigError(f"{name} must be >= 1")
    if cfg.lr <= 0 or cfg.epochs <= 0:
        raise ConfigError("lr and epochs must be > 0")
    if cfg.export_dtype not in DTYPES:
        raise ConfigError(f"export_dtype must be float32, float16 or bfloat16, got '{cfg.export_dtype}'")
    if not 0 <= cfg.heldout_fraction < 1:
        raise ConfigError("heldout_fraction must be in [0, 1)")


def step_precision(train_dtype: str, device):
    """The autocast context of a training step in ``train_dtype`` (float32 | bfloat16 | auto, see
    ``TrainConfig.train_dtype``): bf16 matrix products over float32 weights, or nothing."""
    from ..backends import native_bf16

    device = torch.device(device)
    bf16 = train_dtype == "bfloat16" or (train_dtype == "auto" and native_bf16(device))
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16)


def full_precision(device):
    """Inside :func:`step_precision`: products in the tensors' own precision (the target's distributions)."""
    return torch.autocast(torch.device(device).type, enabled=False)


def load_yaml_config(cls, path: str | Path):
    """A ``cls`` dataclass from a YAML file, strictly checked and validated; errors name the file."""
    path = Path(path)
    data = read_yaml(path) or {}
    try:
        cfg = from_dict(cls, data)
        cfg.validate()
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None
    return cfg


def causal_mask(lengths: list[int], T: int, device) -> torch.Tensor:
    """``(B, 1, T, T)`` bool: causal within each sequence, padding never attended."""
    idx = torch.arange(T, device=device)
    valid = idx[None, :] < torch.tensor(lengths, device=device)[:, None]  # (B, T)
    m = (idx[None, :, None] >= idx[None, None, :]) & valid[:, None, :]  # (B, T, T)
    m |= torch.eye(T, dtype=torch.bool, device=device)[None]  # padded rows attend to themselves (no NaN)
    return m[:, None]


class Run:
    """Holds the per-process setup: rank, world, device."""

    def __init__(self):
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.rank = int(os.environ.get("RANK", "0"))
        self.device = torch.device("cpu")
        if self.world > 1 and not dist.is_initialized():
            backend = "nccl" if torch.cuda.is_available() else "gloo"
            if backend == "nccl":
                self.device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
                torch.cuda.set_device(self.device)
            dist.init_process_group(backend, timeout=timedelta(hours=4))
        elif torch.cuda.is_available():
            self.device = torch.device("cuda")

    @property
    def main(self) -> bool:
        return self.rank == 0

    def barrier(self):
        if self.world > 1:
            dist.barrier()

    def all_sum(self, t: torch.Tensor) -> torch.Tensor:
        if self.world > 1:
            t = t.clone()
            dist.all_reduce(t)
        return t


def cosine_lr(step: int, total: int, warmup: int, lr: float) -> float:
    """Linear warmup, then cosine decay to 10% of ``lr`` at ``total``."""
    if step < warmup:
        return lr * (step + 1) / warmup
    frac = (step - warmup) / max(1, total - warmup)
    return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(frac, 1.0))))


def heldout_split(data: list, fraction: float, seed: int) -> tuple[list, list]:
    """``(train, heldout)``: a seeded random ``fraction`` of the sequences is held out."""
    perm = torch.randperm(len(data), generator=torch.Generator().manual_seed(seed)).tolist()
    n_eval = int(len(data) * fraction)
    return [data[i] for i in perm[n_eval:]], [data[i] for i in perm[:n_eval]]


def batch_order(n: int, batch: int, seed: int, epoch: int, lengths: list[int] | None = None,
                group: int = 50) -> list[list[int]]:
    """The seeded batches of one epoch: a random permutation of ``range(n)`` cut into full batches.

    With ``lengths`` (one per sequence), batches are grouped by length: each run of ``group``
    batches of the permutation is sorted by length before it is cut, and the batches are then put
    in a seeded random order. A padded batch costs its longest sequence times its size, so random
    batches of the self-distilled data waste ~25% of the compute on padding; grouped, ~2%."""
    g = torch.Generator().manual_seed(seed * 1000003 + epoch)
    perm = torch.randperm(n, generator=g).tolist()
    if lengths is None:
        return [perm[i: i + batch] for i in range(0, n - batch + 1, batch)]
    perm = perm[: n - n % batch]  # full batches only, as without lengths
    chunk = group * batch
    grouped = [i for c in range(0, len(perm), chunk) for i in sorted(perm[c: c + chunk], key=lambda i: lengths[i])]
    batches = [grouped[i: i + batch] for i in range(0, len(grouped), batch)]
    return [batches[i] for i in torch.randperm(len(batches), generator=g).tolist()]


# settings that may change between a run and its resumption: they do not touch the trained weights
RESUMABLE_CHANGES = ("eval_every", "checkpoint_every", "export", "export_dtype", "out_dir")


STATE_JSON = "state.json"  # step, settings, the optimizer's hyperparameters and per-parameter numbers
OPTIMIZER = "optimizer.safetensors"  # the optimizer's per-parameter tensors ("<param id>.<name>")


def read_state(folder: Path) -> dict:
    """``{"optimizer", "step", "config"}`` of a checkpoint folder: tensors from safetensors, the rest
    from JSON; nothing is unpickled. A folder holding only an old pickled ``state.pt`` is refused."""
    import json

    if not (folder / STATE_JSON).exists():
        if (folder / "state.pt").exists():
            raise ValueError(f"{folder / 'state.pt'} is a checkpoint in the old pickled format, which resume no "
                             "longer loads (unpickling runs code): delete that folder to start over")
        raise ValueError(f"{folder} holds no {STATE_JSON}: not a training checkpoint")
    try:
        meta = json.loads((folder / STATE_JSON).read_text())
        tensors = load_file(str(folder / OPTIMIZER))
        per_param = {int(pid): dict(values) for pid, values in meta["optimizer"]["state"].items()}
        for key, t in tensors.items():
            pid, name = key.split(".", 1)
            per_param.setdefault(int(pid), {})[name] = t
        optimizer = {"state": per_param, "param_groups": meta["optimizer"]["param_groups"]}
        return {"optimizer": optimizer, "step": int(meta["step"]), "config": meta["config"]}
    except (OSError, KeyError, ValueError, TypeError) as e:
        raise ValueError(f"the checkpoint in {folder} cannot be read ({e}): delete that folder to start over") from None


def write_state(folder: Path, opt, step: int, cfg) -> None:
    """The optimizer state, the step and the settings as safetensors + JSON (see :func:`read_state`)."""
    import json

    sd = opt.state_dict()
    tensors, numbers = {}, {}
    for pid, values in sd["state"].items():
        numbers[str(pid)] = {}
        for name, v in values.items():
            if torch.is_tensor(v):
                tensors[f"{pid}.{name}"] = v.detach().cpu().contiguous()
            else:
                numbers[str(pid)][name] = v
    save_file(tensors, str(folder / OPTIMIZER))
    meta = {"format": 1, "step": step, "config": asdict(cfg),
            "optimizer": {"param_groups": sd["param_groups"], "state": numbers}}
    (folder / STATE_JSON).write_text(json.dumps(meta, indent=1, default=str))


def load_resume_state(folder: Path, cfg, weights: str = "head.safetensors") -> tuple[dict, dict] | None:
    """``(weights, state)`` of the checkpoint in ``folder`` (None when there is none).

    Raises ValueError when the checkpoint was written by a run with other settings (other data, draft
    vocabulary, schedule...): silently continuing it would mix two runs; or when it is an old pickled
    ``state.pt`` (refused: unpickling runs code)."""
    found = existing_dir(folder)
    if found is None or not ((found / STATE_JSON).exists() or (found / "state.pt").exists()):
        return None
    state = read_state(found)
    saved, now = state.get("config", {}), asdict(cfg)
    diff = [f"{k}: {saved.get(k)!r} -> {now[k]!r}" for k in now
            if k not in RESUMABLE_CHANGES and k in saved and saved[k] != _jsonable(now[k])]
    if diff:
        raise ValueError(f"the checkpoint in {found} (step {state['step']}) was written with other settings ("
                         + "; ".join(diff) + "): set another out_dir, or delete that folder to start over")
    return load_file(str(found / weights)), state


def _jsonable(value):
    """``value`` as it reads back from JSON (tuples become lists), to compare settings."""
    import json

    return json.loads(json.dumps(value, default=str))


def save_checkpoint(folder: Path, state: dict, opt, step: int, cfg, weights: str = "head.safetensors") -> None:
    """Atomically replace ``folder`` with the weights ``state``, the optimizer state and the step."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="ckpt.tmp", dir=folder.parent))
    save_file({k: v.detach().cpu().contiguous() for k, v in state.items()}, str(tmp / weights))
    write_state(tmp, opt, step, cfg)
    replace_dir(tmp, folder)
