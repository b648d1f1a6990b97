"""Typed decoding configs loaded from YAML with strict validation (an unknown key is an error)."""
from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from .draft.shape import TreeShape
from .fallback import FallbackConfig
from .models import EMBEDDED
from .runtime import DTYPES, RuntimeConfig

__all__ = ["ConfigError", "DrafterConfig", "DecodeConfig", "load_config", "config_from_dict", "from_dict", "read_yaml",
           "resolve_path", "as_config", "SHIPPED_CONFIGS"]

DRAFTERS = ("none", "self", "ngram", "eagle", "eagle3", "model", "medusa")
ATTENTION = ("auto", "triton", "reference")
DRAFT_DTYPES = ("", "auto") + DTYPES  # "" = the target's; auto: float32 or bfloat16, measured (eagle/heads/drafter.py)


class ConfigError(ValueError):
    """A config file that cannot be used; the message names the file and the offending key."""


@dataclass
class DrafterConfig:
    """``type``: none (plain decoding), self (the target as its own oracle drafter), ngram, eagle
    (an EAGLE-1/2 head), eagle3 (an EAGLE-3 head), model (a separate small causal LM sharing the target's tokenizer),
    medusa (Medusa-1 heads, eagle/heads/medusa.py)."""

    type: str = "none"
    head: str = ""  # eagle: a head checkpoint folder (relative paths: cwd, then the repo root)
    model: str = ""  # model: an embedded target name or a local HF folder
    sample: bool = False  # sample children without replacement from q (temperature > 0) instead of top-k
    max_ngram: int = 3
    min_ngram: int = 1
    branches: int = 1  # ngram: distinct continuations kept as tree branches
    dtype: str = ""  # eagle: run the head in this precision (float32 | bfloat16 | float16 | auto); "" = the target's
    prompt_vocab: bool = False  # eagle (EAGLE-1/2 head): the prompt's tokens join the draft vocabulary per generation


@dataclass
class DecodeConfig:
    name: str = "plain"
    drafter: DrafterConfig = field(default_factory=DrafterConfig)
    tree: TreeShape = field(default_factory=TreeShape)
    attention: str = "auto"  # auto: Triton kernel on CUDA, SDPA reference elsewhere
    fallback: FallbackConfig = field(default_factory=FallbackConfig)  # plain steps when drafting loses
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)  # the target forward's cache/buckets/dtype/compile

    def validate(self) -> None:
        if self.drafter.type not in DRAFTERS:
            raise ConfigError(f"drafter.type must be one of {DRAFTERS}, got '{self.drafter.type}'")
        if self.attention not in ATTENTION:
            raise ConfigError(f"attention must be one of {ATTENTION}, got '{self.attention}'")
        if self.drafter.type == "ngram":
            d = self.drafter
            if not 1 <= d.min_ngram <= d.max_ngram:
                raise ConfigError("drafter needs 1 <= min_ngram <= max_ngram")
            if d.branches < 1:
                raise ConfigError("drafter.branches must be >= 1")
        if self.drafter.dtype not in DRAFT_DTYPES:
            raise ConfigError(f"drafter.dtype must be one of {DRAFT_DTYPES[1:]} (or empty for the target's), "
                              f"got '{self.drafter.dtype}'")
        if self.drafter.dtype and self.drafter.type not in ("eagle", "eagle3", "medusa"):
            raise ConfigError(f"drafter.dtype applies to the eagle, eagle3 and medusa drafters only, not '{self.drafter.type}'")
        if self.drafter.dtype == "auto" and self.drafter.type == "medusa":
            raise ConfigError("drafter.dtype 'auto' applies to the eagle and eagle3 drafters only; "
                              "give medusa a precision (float32 | bfloat16 | float16)")
        if self.drafter.prompt_vocab and self.drafter.type != "eagle":
            raise ConfigError(f"drafter.prompt_vocab applies to the eagle drafter (an EAGLE-1/2 head), not "
                              f"'{self.drafter.type}'")
        if self.drafter.type in ("eagle", "eagle3") and not self.drafter.head:
            raise ConfigError(f"drafter.type '{self.drafter.type}' needs drafter.head (a head checkpoint folder)")
        if self.drafter.type == "medusa" and not self.drafter.head:
            raise ConfigError("drafter.type 'medusa' needs drafter.head (a Medusa head folder)")
        if self.drafter.type == "model" and not self.drafter.model:
            raise ConfigError("drafter.type 'model' needs drafter.model (a model name or folder)")
        if self.drafter.sample and self.tree.shape in ("dynamic", "auto"):
            raise ConfigError(f"drafter.sample: true needs a chain or static tree (the {self.tree.shape} tree "
                              "is always grown from the draft's top-k)")
        if self.tree.shape == "auto" and self.drafter.type in ("none", "ngram"):
            raise ConfigError(f"tree.shape 'auto' needs a drafter that grows a tree (self, eagle, eagle3, medusa, "
                              f"model), not '{self.drafter.type}'")
        try:
            self.fallback.validate()
            self.tree.validate()
            self.runtime.validate()
        except ValueError as e:
            raise ConfigError(str(e)) from None

    def max_tree_nodes(self) -> int:
        """The most nodes (root included) a tree of this config's drafter can have: 1 for plain
        decoding, ``1 + depth * branches`` for the n-gram drafter, the tree shape's otherwise."""
        if self.drafter.type == "none":
            return 1
        if self.drafter.type == "ngram":
            return 1 + self.tree.depth * self.drafter.branches
        return self.tree.max_nodes


def _check(value, hint, where: str):
    origin = typing.get_origin(hint)
    if dataclasses.is_dataclass(hint):
        return from_dict(hint, value, where + ".")
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"'{where}' must be a list, got {type(value).__name__}")
        (inner,) = typing.get_args(hint) or (typing.Any,)
        return [_check(v, inner, f"{where}[{i}]") for i, v in enumerate(value)]
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if hint in (int, float, str, bool):
        if not isinstance(value, hint) or (hint is int and isinstance(value, bool)):
            raise ConfigError(f"'{where}' must be {hint.__name__}, got {value!r}")
    return value


def from_dict(cls, data, where: str = ""):
    """Build dataclass ``cls`` from a mapping, rejecting unknown keys and wrong types."""
    if not isinstance(data, dict):
        raise ConfigError(f"'{where.rstrip('.') or 'config'}' must be a mapping, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    for key in data:
        if key not in names:
            raise ConfigError(f"unknown key '{where}{key}' (allowed: {', '.join(sorted(names))})")
    return cls(**{k: _check(v, hints[k], where + k) for k, v in data.items()})


def resolve_path(rel: str, config_path: Path) -> Path:
    """A path from a config: as given if it exists, else relative to the config's folder or the
    folders above it (so configs work from any working directory)."""
    p = Path(rel).expanduser()
    if p.is_absolute() or p.exists():
        return p
    for base in [config_path.parent, *config_path.resolve().parents]:
        if (base / p).exists():
            return base / p
    raise ConfigError(f"path not found: {rel}")


def read_yaml(path: Path):
    """The parsed YAML of a config file (None when empty); a missing file or invalid YAML is a
    ConfigError that names the file."""
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        return yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML ({e})") from None


def load_config(path: str | Path) -> DecodeConfig:
    """Load and validate a decoding config; the name defaults to the file's stem."""
    path = Path(path)
    data = read_yaml(path)
    return config_from_dict({} if data is None else data, path)


def config_from_dict(data, path: str | Path, where: str = "") -> DecodeConfig:
    """Validate the mapping ``data`` as a decoding config that lives at ``path`` (its name defaults
    to the file's stem; relative head/model paths resolve from the file's folder). Errors name
    ``path`` and ``where`` (e.g. a sweep cell)."""
    path = Path(path)
    try:
        if isinstance(data, dict):
            data = {"name": path.stem, **data}
        cfg = from_dict(DecodeConfig, data)
        cfg.validate()
        if cfg.drafter.head:
            cfg.drafter.head = str(resolve_path(cfg.drafter.head, path))
        if cfg.drafter.model and cfg.drafter.model not in EMBEDDED:
            cfg.drafter.model = str(resolve_path(cfg.drafter.model, path))
    except ConfigError as e:
        raise ConfigError(f"{path}{where}: {e}") from None
    return cfg


# the shipped decoding configs (a source checkout's experiments/configs), usable by name ("eagle2-cpu")
SHIPPED_CONFIGS = Path(__file__).resolve().parents[1] / "experiments" / "configs"


def as_config(config) -> DecodeConfig:
    """A :class:`DecodeConfig` from a DecodeConfig, a mapping (relative head paths resolve from the
    working directory, then from the shipped configs' folder), a YAML file's path, or the name of a
    shipped config (``"eagle2-cpu"``: ``experiments/configs/eagle2-cpu.yaml``)."""
    if isinstance(config, DecodeConfig):
        return config
    if isinstance(config, dict):
        return config_from_dict(dict(config), SHIPPED_CONFIGS / "config.yaml")
    if isinstance(config, (str, Path)):
        path = Path(config)
        if path.suffix in (".yaml", ".yml") or path.is_file():
            return load_config(path)
        preset = SHIPPED_CONFIGS / f"{config}.yaml"
        if preset.is_file():
            return load_config(preset)
        names = sorted(p.stem for p in SHIPPED_CONFIGS.glob("*.yaml")) if SHIPPED_CONFIGS.is_dir() else []
        raise ConfigError(f"'{config}' is neither a config file nor a shipped config"
                          + (f" (shipped: {', '.join(names)})" if names else ""))
    raise ConfigError(f"a decoding config is a DecodeConfig, a mapping, a YAML path or a shipped config's name, "
                      f"not {type(config).__name__}")
