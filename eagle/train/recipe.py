"""What the training loop (:func:`eagle.train.trainer.train`) and the head types' recipes share:
the training config (:class:`TrainConfig`, ``eagle train``'s YAML), the :class:`Recipe` interface a
head type implements, and the draft vocabulary. The recipes (trainer.EagleRecipe, eagle3.py,
medusa.py) import this module; the loop imports the recipes.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..config import ConfigError
from .common import check_optimization, load_yaml_config
from .data import Sequence, token_counts

__all__ = ["TrainConfig", "load_train_config", "Recipe", "draft_vocabulary", "HEAD_TYPES"]


HEAD_TYPES = ("eagle", "eagle3", "medusa")
GEN_DTYPES = ("", "auto", "float32", "bfloat16", "float16")
TRAIN_DTYPES = ("float32", "bfloat16", "auto")


@dataclass
class TrainConfig:
    """Everything ``eagle train`` does, end to end (data, features, training, export)."""

    target: str = "smollm2-135m"
    head: str = "eagle"  # eagle (EAGLE-1/2) | eagle3 (eagle/train/eagle3.py) | medusa (eagle/train/medusa.py)
    # --- medusa (eagle/train/medusa.py)
    medusa_heads: int = 4  # K heads; head k predicts the token k + 1 steps ahead (tree depth k)
    medusa_lm_head: str = "own"  # own: a trained LM head per head over the draft vocabulary | shared: the target's, frozen
    medusa_decay: float = 1.0  # loss weight of head k: medusa_decay ** (k - 1) (Medusa-1 used 0.8)
    # --- data: the target answers these prompts (ours, plus optional ShareGPT/UltraChat files)
    prompts: str = "experiments/data/prompts/train.jsonl"
    extra_data: list[str] = field(default_factory=list)
    num_prompts: int = 2500  # how many prompts to self-distill (0 = all)
    data_dir: str = "experiments/data/smollm2-selfdistill"
    # "" or a folder (in the repository) mirroring the tokens of every data shard, ~4 bytes per token
    # (eagle/train/tokens.py): a machine without data_dir rebuilds its features from them with one
    # forward pass instead of sampling the answers again
    tokens_dir: str = ""
    gen_batch_size: int = 32
    gen_max_new_tokens: int = 160
    gen_temperature: float = 0.6
    # precision of the sampling pass: "" = the target as loaded; float32 | bfloat16 | float16; "auto" =
    # bfloat16 where products in it are native (AVX512-BF16 / AMX CPUs, CUDA), else as loaded: faster,
    # with sampling distributions close to float32's (docs/cpu-backend.md, gen-bf16); each shard
    # records the precision it was sampled in
    gen_dtype: str = ""
    # train on the first shards only, up to this many tokens (0 = all the data): a learning curve,
    # or training while a long data stage is still adding shards to data_dir
    data_tokens: int = 0
    # prompts per data shard: the data stage writes (and an interrupted one resumes after) whole shards,
    # and seeds each shard's sampling by its first prompt, so another size draws other answers
    shard_prompts: int = 96
    extraction: str = "offline"  # offline: features stored in shards; online: recomputed while training
    # also store the hidden states entering these target layers (transformers' hidden_states indices;
    # EAGLE-3 reads [2, L//2, L-3]), so one data folder serves both head types
    feature_layers: list[int] = field(default_factory=list)
    # the data of another training config (its data_dir, rebuilt from its token store where missing)
    # joins the training set, its first ``replay_tokens`` tokens (0 = all of it): fine-tuning on new
    # data without forgetting the old
    replay_config: str = ""
    replay_tokens: int = 0
    # --- head
    draft_vocab_size: int = 8192  # 0 = the full target vocabulary
    # "" or a head folder (head: eagle) whose weights the run starts from (fine-tuning); the draft
    # vocabulary is chosen again on this run's data
    init_from: str = ""
    # --- optimization
    epochs: float = 4.0
    batch_size: int = 16  # sequences per global batch (split across processes)
    max_seq_len: int = 320
    lr: float = 5e-4
    warmup_steps: int = 100
    weight_decay: float = 0.0
    grad_clip: float = 0.5
    noise: float = 0.1  # uniform feature noise U(-noise, noise) on the head's input features
    cls_weight: float = 0.1
    unroll: int = 1  # >1: EAGLE-3-style training-time test, feeding the head its own predictions
    # --- eagle3 (eagle/train/eagle3.py): the training-time test drafts this many steps per position,
    # step j's loss weighted ttt_decay ** j
    ttt_steps: int = 7
    ttt_decay: float = 0.8
    train_on_prompt: bool = False
    # batches of similar lengths (each run of 50 random batches sorted by length, batch order
    # shuffled): ~2% padding instead of ~25% on the self-distilled data
    group_by_length: bool = True
    heldout_fraction: float = 0.03
    eval_every: int = 200
    checkpoint_every: int = 100
    max_steps: int = 0  # 0 = derived from epochs
    # precision of the training step's products: float32 | bfloat16 (autocast: bf16 matrix products,
    # float32 weights, optimizer, softmax and loss) | auto = bfloat16 where its products are native
    # (eagle.backends.native_bf16), else float32. The target's distributions stay float32 either way.
    # Measured: docs/cpu-backend.md, train-bf16
    train_dtype: str = "float32"
    seed: int = 0
    out_dir: str = "runs/smollm2-head"
    export: str = "heads/smollm2-135m"
    export_dtype: str = "float32"  # float32 | float16 | bfloat16 (storage of the exported weights)

    def validate(self) -> None:
        # "~/..." folders: long data and training runs can live outside the work tree (e.g. under
        # ~/.cache/eagle), where a fresh checkout of the repository does not remove them
        for name in ("data_dir", "out_dir", "tokens_dir", "export", "init_from"):
            setattr(self, name, os.path.expanduser(getattr(self, name)))
        if self.head not in HEAD_TYPES:
            raise ConfigError(f"head must be one of {', '.join(HEAD_TYPES)}, got '{self.head}'")
        if self.medusa_heads < 1:
            raise ConfigError(f"medusa_heads must be >= 1, got {self.medusa_heads}")
        if self.medusa_lm_head not in ("own", "shared"):
            raise ConfigError(f"medusa_lm_head must be 'own' or 'shared', got '{self.medusa_lm_head}'")
        if not 0 < self.medusa_decay <= 1:
            raise ConfigError(f"medusa_decay must be in (0, 1], got {self.medusa_decay}")
        if self.head == "medusa" and self.extraction != "offline":
            raise ConfigError("head: medusa trains on the stored features: it needs extraction: offline")
        if self.gen_dtype not in GEN_DTYPES:
            raise ConfigError(f"gen_dtype must be one of {', '.join(repr(d) for d in GEN_DTYPES)}, got '{self.gen_dtype}'")
        if self.train_dtype not in TRAIN_DTYPES:
            raise ConfigError(f"train_dtype must be one of {', '.join(TRAIN_DTYPES)}, got '{self.train_dtype}'")
        if self.extraction not in ("offline", "online"):
            raise ConfigError(f"extraction must be 'offline' or 'online', got '{self.extraction}'")
        if self.ttt_steps < 1 or not 0 < self.ttt_decay <= 1:
            raise ConfigError("ttt_steps must be >= 1 and ttt_decay in (0, 1]")
        if self.init_from and self.head != "eagle":
            raise ConfigError(f"init_from fine-tunes an EAGLE-1/2 head (head: eagle), not head: {self.head}")
        if self.replay_tokens < 0:
            raise ConfigError("replay_tokens must be >= 0 (0 = all the replayed data)")
        if self.replay_tokens and not self.replay_config:
            raise ConfigError("replay_tokens needs replay_config (the training config whose data is replayed)")
        if self.data_tokens < 0:
            raise ConfigError("data_tokens must be >= 0 (0 = all the data)")
        if any(i < 0 for i in self.feature_layers) or len(set(self.feature_layers)) != len(self.feature_layers):
            raise ConfigError(f"feature_layers must be distinct layer indices >= 0, got {self.feature_layers}")
        if self.feature_layers and self.extraction != "offline":
            raise ConfigError("feature_layers are stored by the data stage: they need extraction: offline")
        check_optimization(self, ("batch_size", "max_seq_len", "unroll", "gen_batch_size", "gen_max_new_tokens",
                                  "shard_prompts", "checkpoint_every", "eval_every"))


def load_train_config(path: str | Path) -> TrainConfig:
    """The strictly checked :class:`TrainConfig` of a YAML file (errors name the file)."""
    return load_yaml_config(TrainConfig, path)


class Recipe:
    """What one head type brings to the shared training loop of :func:`eagle.train.trainer.train`:
    the trainable module (``self.module``), which features it reads from the shards, how a batch is
    collated, its loss, and its export. Subclasses: ``EagleRecipe`` (eagle/train/trainer.py),
    ``Eagle3Recipe`` (eagle/train/eagle3.py), ``MedusaRecipe`` (eagle/train/medusa.py)."""

    load_hidden = True  # the final feature of the shards
    load_layers = False  # the fused feature layers (EAGLE-3)
    module: torch.nn.Module

    def batch(self, seqs: list[Sequence], idx: list[int], step: int, device, train: bool = True):
        raise NotImplementedError

    def loss(self, module, batch) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
        """``(summed loss, number of counted tokens, summed top-1 hits per step)`` of a batch."""
        raise NotImplementedError

    def export(self, cfg, model) -> None:
        raise NotImplementedError


def draft_vocabulary(cfg, train_set: list[Sequence], vocab: int) -> torch.Tensor | None:
    """The ``cfg.draft_vocab_size`` most frequent target ids of the training data, sorted (None = all)."""
    if cfg.draft_vocab_size and cfg.draft_vocab_size < vocab:
        return token_counts(train_set, vocab).topk(cfg.draft_vocab_size).indices.sort().values
    return None
