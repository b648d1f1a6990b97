"""Typed decoding configs loaded from YAML with strict validation (an unknown key is an error).

The ``drafter:`` and ``tree:`` sections name a registered class (``drafter.type``, ``tree.shape``;
:func:`eagle.register_drafter`, :func:`eagle.register_tree_shape`) and fill that class's nested
``Options`` dataclass from the section's other keys. An ``Options`` field whose metadata has
``path`` is a path resolved from the config file's folder (``{"path": "model"}``: unless it names
an embedded model)."""
from __future__ import annotations

import dataclasses
import importlib
import typing
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from .draft.base import DRAFTERS, Drafter
from .draft.shape import TREE_SHAPES, TreeShape
from .fallback import FallbackConfig
from .models import EMBEDDED
from .runtime import DTYPES, RuntimeConfig

__all__ = ["ConfigError", "DrafterConfig", "DecodeConfig", "load_config", "config_from_dict", "from_dict", "read_yaml",
           "resolve_path", "as_config", "drafter_class", "tree_shape_class", "SHIPPED_CONFIGS", "DTYPES"]

ATTENTION = ("auto", "triton", "reference")

# the modules the shipped drafters and tree shapes register from, imported on the first lookup of
# their name (so a config finds them without the caller importing anything)
SHIPPED_DRAFTERS = {"none": "eagle.draft.base", "self": "eagle.draft.selfdraft", "ngram": "eagle.draft.ngram",
                    "lookahead": "eagle.draft.lookahead", "eagle": "eagle.heads.drafter", "eagle3": "eagle.heads.drafter",
                    "hybrid": "eagle.heads.hybrid", "medusa": "eagle.heads.medusa", "model": "eagle.draft_model"}
SHIPPED_SHAPES = {"chain": "eagle.draft.shape", "static": "eagle.draft.shape", "dynamic": "eagle.draft.shape",
                  "auto": "eagle.draft.auto"}


class ConfigError(ValueError):
    """A config file that cannot be used; the message names the file and the offending key."""


def _lookup(registry, shipped: dict, name: str, key: str):
    cls = registry.get(name)
    if cls is None and name in shipped:
        importlib.import_module(shipped[name])
        cls = registry.get(name)
    if cls is None:
        names = sorted(set(registry.names()) | set(shipped))
        raise ConfigError(f"{key} must be one of the registered {registry.kind}s ({', '.join(names)}), got '{name}'")
    return cls


def drafter_class(name: str) -> type[Drafter]:
    """The drafter registered as ``name`` (a shipped one is imported here on first use);
    :class:`ConfigError` listing the registered names otherwise."""
    return _lookup(DRAFTERS, SHIPPED_DRAFTERS, name, "drafter.type")


def tree_shape_class(name: str) -> type[TreeShape]:
    """The tree shape registered as ``name``, as :func:`drafter_class` finds drafters."""
    return _lookup(TREE_SHAPES, SHIPPED_SHAPES, name, "tree.shape")


@dataclass
class DrafterConfig:
    """The ``drafter:`` section: ``type``, a registered drafter's name (shipped: none = plain
    decoding, self, ngram, lookahead, eagle, eagle3, medusa, model), and ``options``, that drafter's
    ``Options`` (its defaults when None)."""

    type: str = "none"
    options: typing.Any = None

    def __post_init__(self):
        if self.options is None:
            self.options = drafter_class(self.type).Options()

    @property
    def cls(self) -> type[Drafter]:
        return drafter_class(self.type)

    def build(self, target, tree: TreeShape) -> Drafter:
        """The drafter, bound to ``target``, drafting ``tree``."""
        return self.cls(target, tree, self.options)


def _default_tree() -> TreeShape:
    return tree_shape_class("chain")()


@dataclass
class DecodeConfig:
    """One decoding setup: the drafter, the tree shape it drafts (a registered
    :class:`eagle.TreeShape`; chain of 4 by default), the attention, the fallback and the target's
    runtime. Built by :func:`load_config` / :func:`config_from_dict` (strict, checked) or in Python."""

    name: str = "plain"
    drafter: DrafterConfig = field(default_factory=DrafterConfig)
    tree: TreeShape = field(default_factory=_default_tree)  # a registered shape with its options
    attention: str = "auto"  # auto: Triton kernel on CUDA, SDPA reference elsewhere
    fallback: FallbackConfig = field(default_factory=FallbackConfig)  # plain steps when drafting loses
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)  # the target forward's cache/buckets/dtype/compile

    def validate(self) -> None:
        if self.attention not in ATTENTION:
            raise ConfigError(f"attention must be one of {ATTENTION}, got '{self.attention}'")
        try:
            self.tree.validate()
            self.drafter.cls.check(self.tree, self.drafter.options)
            self.fallback.validate()
            self.runtime.validate()
        except ConfigError:
            raise
        except ValueError as e:
            raise ConfigError(str(e)) from None

    def max_tree_nodes(self) -> int:
        """The most nodes (root included) a tree of this config's drafter can have
        (:meth:`eagle.Drafter.max_nodes`: 1 for plain decoding, the tree shape's for most)."""
        return self.drafter.cls.max_nodes(self.tree, self.drafter.options)

    def build_drafter(self, target) -> Drafter:
        """The drafter this config asks for, bound to ``target``."""
        return self.drafter.build(target, self.tree)

    def as_dict(self) -> dict:
        """The config as its YAML mapping (the drafter's and the shape's options beside ``type`` and
        ``shape``): what sweeps record, fingerprint and look dotted keys up in."""
        out = dataclasses.asdict(self)
        out["drafter"] = {"type": self.drafter.type, **dataclasses.asdict(self.drafter.options)}
        out["tree"] = {"shape": self.tree.shape, **dataclasses.asdict(self.tree.options)}
        return out


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


def _section(data: dict, key: str, name_key: str, default: str, lookup, label: str):
    """``(name, cls, options)`` of the ``key:`` section: the class its ``name_key`` names and its
    ``Options`` filled strictly from the other keys."""
    section = {} if data.get(key) is None else data[key]
    if not isinstance(section, dict):
        raise ConfigError(f"'{key}' must be a mapping, got {type(section).__name__}")
    name = section.get(name_key, default)
    if not isinstance(name, str):
        raise ConfigError(f"'{key}.{name_key}' must be str, got {name!r}")
    cls = lookup(name)
    try:
        options = from_dict(cls.Options, {k: v for k, v in section.items() if k != name_key}, key + ".")
    except ConfigError as e:
        raise ConfigError(f"{label} '{name}': {e}") from None
    return name, cls, options


def _resolve_paths(options, path: Path) -> None:
    """Resolve ``options``' path fields (metadata ``path``) from the config file at ``path``."""
    for f in dataclasses.fields(options):
        kind, value = f.metadata.get("path"), getattr(options, f.name)
        if kind and value and not (kind == "model" and value in EMBEDDED):
            setattr(options, f.name, str(resolve_path(value, path)))


def config_from_dict(data, path: str | Path, where: str = "") -> DecodeConfig:
    """Validate the mapping ``data`` as a decoding config that lives at ``path`` (its name defaults
    to the file's stem; relative head/model paths resolve from the file's folder). Errors name
    ``path`` and ``where`` (e.g. a sweep cell)."""
    path = Path(path)
    try:
        if not isinstance(data, dict):
            raise ConfigError(f"'config' must be a mapping, got {type(data).__name__}")
        data = {"name": path.stem, **data}
        dtype, _, options = _section(data, "drafter", "type", "none", drafter_class, "drafter")
        _, tcls, tree_options = _section(data, "tree", "shape", "chain", tree_shape_class, "tree shape")
        try:
            tree = tcls(tree_options)
        except ValueError as e:
            raise ConfigError(str(e)) from None
        cfg = from_dict(DecodeConfig, {k: v for k, v in data.items() if k not in ("drafter", "tree")})
        cfg.drafter, cfg.tree = DrafterConfig(dtype, options), tree
        cfg.validate()
        _resolve_paths(options, path)
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
