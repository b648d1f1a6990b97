"""``eagle sweep``: an ablation grid over any dotted config key, run as one bench, written as
JSON, CSV, a markdown table and plots.

A grid axis is a dotted key of a decoding config (``tree.total_tokens``), the pseudo key
``temperature`` (the bench's sampling temperature), or ``config`` (named variants merged into the
whole config). A value that is a mapping is merged into the config at its key (one naming another
``drafter.type`` or ``tree.shape`` replaces that section); any other value replaces it. Every cell
is validated before anything runs. Cells of one temperature run as one bench (prompts outer, cells
inner, plain decoding and transformers ``generate`` once); each run is recorded in
``DIR/state.json`` as it finishes, so an interrupted sweep resumes and skips what is done.
"""
from __future__ import annotations

import copy
import csv
import dataclasses
import hashlib
import itertools
import json
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from .config import ConfigError, DecodeConfig, config_from_dict, from_dict, read_yaml, resolve_path
from .io import write_json

__all__ = ["Axis", "SweepSpec", "Cell", "parse_axis", "is_ablation_file", "load_ablation", "expand", "check_plot_keys", "sweep_settings", "config_fingerprint", "forget_changed", "load_state", "run_sweep",
           "write_outputs", "format_table"]

TEMPERATURE = "temperature"  # the bench's sampling temperature, not a config key
ROOT = "config"  # an axis of whole-config variants (mappings merged at the root)
NODES = "nodes"  # x axis: tree nodes verified per step, as measured


def label(value, key: str = "") -> str:
    """Short text for one grid value of ``key`` (a named variant by its name, a config file by its stem)."""
    if isinstance(value, dict) and "name" in value:
        return str(value["name"])
    if key == ROOT and isinstance(value, str):
        return Path(value).stem
    if isinstance(value, (dict, list)):
        return yaml.safe_dump(value, default_flow_style=True, width=10_000).strip()
    return str(value)


@dataclass
class Axis:
    key: str
    values: list


@dataclass
class SweepSpec:
    """An ablation file (``experiments/ablations/*.yaml``); every field may be overridden by a flag."""

    base: str = ""  # the decoding config every cell starts from
    set: dict = field(default_factory=dict)  # dotted key -> value, applied to the base for every cell
    grid: dict = field(default_factory=dict)  # dotted key -> list of values
    description: str = ""
    prompts: str = ""
    limit: int = 0  # 0 = all prompts
    per_category: int = 0  # > 0: the first N rows of each category (a stratified subset)
    subtasks: list[str] = field(default_factory=list)  # only these Spec-Bench subtasks (empty: all)
    max_new_tokens: int = 0  # 0 = the command's default
    temperature: float = 0.0
    top_p: float = 1.0
    x: str = NODES  # plots: x axis (``nodes`` or a numeric grid key)
    lines: list[str] = field(default_factory=list)  # plots: one line per value of these keys

    def updated(self, other: "SweepSpec") -> tuple["SweepSpec", list[Axis]]:
        """This spec with ``other``'s non-default fields laid over it, and ``other``'s axes."""
        default = SweepSpec()
        merged = dataclasses.replace(self, **{f.name: getattr(other, f.name) for f in dataclasses.fields(self)
                                              if f.name != "grid" and getattr(other, f.name) != getattr(default, f.name)})
        merged.set = {**self.set, **other.set}
        return merged, [Axis(str(k), list(v)) for k, v in other.grid.items()]


@dataclass
class Cell:
    """One point of the grid: its validated config, the bench temperature and the grid values."""

    config: DecodeConfig
    temperature: float
    values: dict  # axis key -> value

    @property
    def name(self) -> str:
        return self.config.name


def parse_axis(text: str) -> Axis:
    """``key=v1,v2,...`` (each value read as YAML: numbers, booleans, ``[0, 1]`` lists...)."""
    key, sep, rest = text.partition("=")
    key = key.strip()
    if not sep or not key or not rest.strip():
        raise ConfigError(f"--grid '{text}': expected KEY=V1,V2,... or an ablation YAML file")
    values = []
    for part in _split_top(rest):
        try:
            values.append(yaml.safe_load(part))
        except yaml.YAMLError:
            raise ConfigError(f"--grid '{text}': value '{part}' is not valid YAML") from None
    return Axis(key, values)


def _split_top(text: str) -> list[str]:
    """Split at commas outside brackets/braces, so ``tree.choices=[[0]],[[0],[1]]`` works."""
    parts, depth, cur = [], 0, ""
    for ch in text:
        depth += ch in "[{"
        depth -= ch in "]}"
        if ch == "," and depth == 0:
            parts.append(cur.strip())
            cur = ""
        else:
            cur += ch
    parts.append(cur.strip())
    return [p for p in parts if p]


def is_ablation_file(text: str) -> bool:
    """A ``--grid`` argument naming a YAML file rather than ``KEY=V1,V2``."""
    if "=" not in text:
        return True
    try:
        return Path(text).is_file()
    except OSError:  # e.g. a name too long for the file system: an axis, not a file
        return False


def load_ablation(path: str | Path) -> SweepSpec:
    """Read and check an ablation YAML file (unknown keys and empty grids are errors)."""
    path = Path(path)
    data = read_yaml(path)
    try:
        spec = from_dict(SweepSpec, data or {})
        if not isinstance(spec.grid, dict) or not spec.grid:
            raise ConfigError("'grid' must be a non-empty mapping of key -> list of values")
        if not isinstance(spec.set, dict):
            raise ConfigError("'set' must be a mapping of key -> value")
        for key, vals in spec.grid.items():
            if not isinstance(vals, list) or not vals:
                raise ConfigError(f"grid key '{key}' needs a non-empty list of values")
        for name in ("base", "prompts"):  # relative to the file's folder or above, like paths inside configs
            if getattr(spec, name):
                setattr(spec, name, str(resolve_path(getattr(spec, name), path)))
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None
    return spec


# a config section that names its kind: a mapping naming another kind replaces the section (the old
# kind's options mean nothing to the new one), one naming the same kind is merged into it
_KINDS = {"drafter": ("type", "none"), "tree": ("shape", "chain")}


def _merge(into: dict, value: dict, root: bool = True) -> dict:
    out = dict(into)
    for k, v in value.items():
        sub = out.get(k)
        if isinstance(v, dict) and isinstance(sub, dict) and not (root and _other_kind(k, sub, v)):
            out[k] = _merge(sub, v, False)
        else:
            out[k] = copy.deepcopy(v)
    return out


def _other_kind(key: str, section: dict, value: dict) -> bool:
    """Whether ``value`` names another kind of the ``key`` section than ``section`` is."""
    if key not in _KINDS:
        return False
    name, default = _KINDS[key]
    return name in value and value[name] != section.get(name, default)


def _variant(value, near: Path) -> dict:
    """A ``config`` axis value as a mapping: as given, or a config file's contents (named by its stem)."""
    if isinstance(value, str):
        path = resolve_path(value, near)
        data = read_yaml(path) or {}
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: a config must be a mapping")
        return {"name": path.stem, **data}
    if not isinstance(value, dict):
        raise ConfigError(f"grid key '{ROOT}' takes mappings or config files (whole-config variants), got {value!r}")
    return value


def _set(data: dict, key: str, value) -> dict:
    """``data`` with the dotted ``key`` set to ``value`` (mappings merged)."""
    if key == ROOT:
        return _merge(data, value)
    head, _, rest = key.partition(".")
    if not rest:
        return _merge(data, {head: value})
    sub = data.get(head, {})
    if not isinstance(sub, dict):
        raise ConfigError(f"grid key '{key}': '{head}' is not a mapping")
    return {**data, head: _set(sub, rest, value)}


def expand(base: str | Path, axes: list[Axis], temperature: float = 0.0, fixed: dict | None = None) -> list[Cell]:
    """Every combination of the axes' values as a validated cell (first axis outermost);
    ``fixed`` (dotted key -> value) is applied to the base first.

    Cell names are the base config's name (or a ``config`` variant's) followed by the other
    axes' values, e.g. ``eagle2-dynamic[tree.total_tokens=8 tree.depth=3]``.
    """
    base = Path(base)
    raw = read_yaml(base)
    raw = {} if raw is None else raw
    if not isinstance(raw, dict):
        raise ConfigError(f"{base}: a config must be a mapping")
    raw.setdefault("name", base.stem)
    for k, v in (fixed or {}).items():
        if k in (TEMPERATURE, ROOT):
            raise ConfigError(f"'set' takes config keys, not '{k}'")
        raw = _set(raw, str(k), v)
    keys = [a.key for a in axes]
    for k in keys:
        if keys.count(k) > 1:
            raise ConfigError(f"grid key '{k}' is given twice")
    cells, names = [], set()
    for combo in itertools.product(*(a.values for a in axes)):
        values = dict(zip(keys, combo))
        data, temp, tags, named = raw, temperature, [], False
        for axis, v in zip(axes, combo):
            if axis.key == TEMPERATURE:
                if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
                    raise ConfigError(f"grid key 'temperature' needs numbers >= 0, got {v!r}")
                temp = float(v)
            elif axis.key == ROOT:
                variant = _variant(v, base)
                named = "name" in variant
                data = _set(data, ROOT, variant)
            else:
                data = _set(data, axis.key, v)
            if axis.key != ROOT:
                tags.append(f"{axis.key}={label(v, axis.key)}")
        if not named:
            data = {**data, "name": raw["name"]}
        data = {**data, "name": data["name"] + (f"[{' '.join(tags)}]" if tags else "")}
        where = f" (sweep cell {' '.join(f'{a.key}={label(v, a.key)}' for a, v in zip(axes, combo))})"
        cfg = config_from_dict(data, base, where)
        if cfg.name in names:
            raise ConfigError(f"two sweep cells are both named '{cfg.name}'")
        names.add(cfg.name)
        cells.append(Cell(cfg, temp, values))
    return cells


def check_plot_keys(cells: list[Cell], axes: list[str], x: str, lines: list[str]) -> None:
    """``x`` must be ``nodes``, ``temperature`` or a numeric grid/config key; ``lines`` keys must
    exist in every cell (checked before anything runs)."""
    for c in cells:
        probe = {"grid": c.values, "temperature": c.temperature, "config": c.config.as_dict(),
                 "mean_tree_nodes": 0.0}
        try:
            if x != NODES:
                _x_of(probe, x)
            _line_key(probe, lines)
        except (KeyError, TypeError):
            raise ConfigError(f"plot key not found in cell '{c.name}' (x: {x}, lines: {lines}); use a grid key "
                              f"({', '.join(axes)}), a dotted config key or '{NODES}'") from None
        except ValueError:
            raise ConfigError(f"x axis '{x}' is not numeric in cell '{c.name}'") from None


def _fingerprint(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _prompts_key(prompts) -> list:
    """What identifies a prompt set: the strings of one-turn prompts without a category (as files of
    plain prompts always were), else every question's turns and category."""
    from .bench import as_questions

    qs = as_questions(prompts)
    if all(len(q.turns) == 1 and not q.category for q in qs):
        return [q.turns[0] for q in qs]
    return [[list(q.turns), q.category] for q in qs]


def sweep_settings(prompts: list, max_new_tokens: int, top_p: float, target_name: str, **extra) -> dict:
    """What must not change for a sweep (or a bench) to resume from its records."""
    return dict(extra, prompts_sha=_fingerprint(_prompts_key(prompts)), max_new_tokens=max_new_tokens, top_p=top_p,
                target=target_name)


def config_fingerprint(config: DecodeConfig) -> str:
    return _fingerprint(config.as_dict())


def forget_changed(records: dict, seen: dict, configs) -> None:
    """Drop the ``records`` of every config whose settings changed since ``seen`` (name ->
    fingerprint) was written, so it runs again; ``seen`` is updated to the configs now."""
    for cfg in configs:
        fp = config_fingerprint(cfg)
        if seen.get(cfg.name) not in (None, fp):
            records.pop(cfg.name, None)
        seen[cfg.name] = fp


def load_state(out: str | Path, settings: dict) -> dict:
    """The records of an earlier run of the same sweep in folder ``out`` (its ``state.json``; or a
    path ending in ``.json``: that file) or a fresh state; a state with other settings is an error."""
    out = Path(out)
    path = out if out.suffix == ".json" else out / "state.json"
    if not path.exists():
        return {"settings": settings, "records": {}, "configs": {}}
    try:
        state = json.loads(path.read_text())
    except json.JSONDecodeError:
        raise ConfigError(f"{path}: not valid JSON (delete it to start the sweep over)") from None
    if state.get("settings") != settings:
        old = state.get("settings", {})
        diff = ", ".join(f"{k} {old.get(k)!r} -> {v!r}" for k, v in settings.items() if old.get(k) != v)
        raise ConfigError(f"{out} holds runs with other settings ({diff}); use another output or delete it")
    return state


def run_sweep(model, tokenizer, prompts: list, cells: list[Cell], out: str | Path, max_new_tokens: int,
              top_p: float = 1.0, target_name: str = "", log=print, **extra_settings) -> dict:
    """Run every cell (one bench per temperature), recording each run in ``out/state.json``;
    return ``{"settings", "baselines": {temperature: plain}, "cells": [...], "device"}``.

    The settings (:func:`sweep_settings`: prompt set, token budget, target, ``extra_settings``)
    must equal those of an earlier run in ``out`` for it to resume; cells whose config changed
    since are run again.
    """
    from .bench import run_bench

    out = Path(out)
    settings = sweep_settings(prompts, max_new_tokens, top_p, target_name, **extra_settings)
    state = load_state(out, settings)
    out.mkdir(parents=True, exist_ok=True)
    temps = sorted({c.temperature for c in cells})
    summary = {"settings": settings, "baselines": {}, "cells": []}
    by_name = {}
    for t in temps:
        group = [c for c in cells if c.temperature == t]
        key = str(t)
        recs = state["records"].setdefault(key, {})
        seen = state["configs"].setdefault(key, {})
        forget_changed(recs, seen, [c.config for c in group])  # a cell whose config changed starts over
        n_done = sum(len(recs.get(c.name, {})) >= len(prompts) for c in group)
        if n_done:
            log(f"sweep: temperature {t}: {n_done} of {len(group)} cells already done in {out}, skipped")

        def on_record(method, i, rec, recs=recs):
            recs.setdefault(method, {})[str(i)] = rec
            write_json(state, out / "state.json", indent=1)

        res = run_bench(model, tokenizer, prompts, [c.config for c in group], max_new_tokens, t, top_p,
                        target_name=target_name, records=recs, on_record=on_record)
        summary["baselines"][key] = res["plain"]
        summary["device"] = res["device"]
        for c, run in zip(group, res["runs"]):
            by_name[c.name] = {"cell": c.name, "grid": c.values, "temperature": t,
                               "config": c.config.as_dict(),
                               "tau": run["mean_accepted"], **{k: v for k, v in run.items() if k != "config"}}
    summary["cells"] = [by_name[c.name] for c in cells]
    return summary


# ---------------------------------------------------------------------------------------- outputs

CSV_FIELDS = ["cell", "temperature", "tau", "alpha", "tokens_per_s", "speedup", "speedup_vs_hf", "identical_to_plain",
              "prompts", "mean_tree_nodes", "mean_side_rows", "plain_steps", "draft_ms", "verify_ms", "other_ms",
              "per_depth_acceptance", "accepted_hist"]


def format_table(summary: dict, axes: list[str]) -> str:
    """Markdown: the baselines per temperature, then one row per cell."""
    s = summary["settings"]
    subset = ((f"subtasks {', '.join(s['subtasks'])}, " if s.get("subtasks") else "")
              + (f"first {s['per_category']} rows per category, " if s.get("per_category") else "")
              + f"{s.get('limit') or 'all'} prompts")
    lines = [f"target `{s['target']}`, {s.get('prompt_file', '')} ({subset}), "
             f"{s['max_new_tokens']} new tokens, top_p {s['top_p']}", ""]
    for t, b in summary["baselines"].items():
        lines.append(f"- temperature {t}: plain {b['tokens_per_s']:.2f} tok/s, transformers generate "
                     f"{b['hf_tokens_per_s']:.2f} tok/s (speedup: against the faster of the two)")
    cols = [a for a in axes if a != ROOT]
    # identical turns out of all turns (a Spec-Bench question has one or two)
    same = (lambda c: f"{c['identical_to_plain']}/{c.get('turns', c['prompts'])}" if c["temperature"] == 0 else "n/a")  # noqa: E731
    # rows a forward ran beside the tree (a lookahead window): a column only where some cell has them
    side = any(c.get("mean_side_rows") for c in summary["cells"])
    lines += ["", "| cell | " + " | ".join(cols) + (" | " if cols else "")
              + "tau | alpha | tok/s | speedup | identical | nodes/step | " + ("side rows/step | " if side else "")
              + "draft ms | verify ms | other ms |",
              "|---|" + "---|" * len(cols) + "---:|" * (9 + side)]
    for c in summary["cells"]:
        vals = " | ".join(label(c["grid"][a]) for a in cols)
        ms = c["step_ms"]
        lines.append(f"| {c['cell']} | " + (vals + " | " if cols else "")
                     + f"{c['tau']:.2f} | {c['alpha']:.2f} | {c['tokens_per_s']:.2f} | {c['speedup']:.2f}x | "
                     f"{same(c)} | {c['mean_tree_nodes']:.1f} | " + (f"{c.get('mean_side_rows', 0.0):.1f} | " if side else "")
                     + f"{ms['draft']:.1f} | {ms['verify']:.1f} | {ms['bookkeeping']:.1f} |")
    return "\n".join(lines)


def _csv_rows(summary: dict, axes: list[str]) -> tuple[list[str], list[dict]]:
    cols = [a for a in axes if a not in (ROOT, TEMPERATURE)]
    rows = []
    for c in summary["cells"]:
        row = {k: c.get(k) for k in CSV_FIELDS}
        row.update(draft_ms=c["step_ms"]["draft"], verify_ms=c["step_ms"]["verify"],
                   other_ms=c["step_ms"]["bookkeeping"],
                   per_depth_acceptance=" ".join(f"{a:.4f}" for a in c["per_depth_acceptance"]),
                   accepted_hist=" ".join(map(str, c["accepted_hist"])))
        row.update({a: label(c["grid"][a]) for a in cols})
        rows.append(row)
    return ["cell", *cols, *CSV_FIELDS[1:]], rows


def _cell_value(cell: dict, key: str):
    """A cell's value of ``key``: the bench temperature, its grid value, or a dotted key of its config."""
    if key == TEMPERATURE:
        return cell["temperature"]
    v = cell["grid"].get(key)
    if v is None:
        v = cell["config"]
        for part in key.split("."):
            v = v[part]
    return v


def _x_of(cell: dict, x: str) -> float:
    return cell["mean_tree_nodes"] if x == NODES else float(_cell_value(cell, x))


def _line_key(cell: dict, lines: list[str]) -> str:
    return ", ".join(f"{k}={label(_cell_value(cell, k))}" for k in lines) or "all cells"


def default_lines(axes: list[str], x: str, lines: list[str] | None = None) -> list[str]:
    """The keys whose values make one plot line: ``lines`` (default: none), plus every grid key that
    is neither on the x axis nor in ``lines`` (with x = the measured node count, the first grid key
    is taken as the one that sets it), so no line mixes cells that differ in a grid key."""
    lines = list(lines or [])
    skip = set(lines) | {x} | ({axes[0]} if x == NODES and axes else set())
    return lines + [a for a in axes if a not in skip]


def _cell_label(cell: dict) -> str:
    """The cell's grid values, for legends (a ``config`` variant by its name)."""
    parts = [label(v, k) if k == ROOT else f"{k}={label(v, k)}" for k, v in cell["grid"].items()]
    return " ".join(parts) or cell["cell"]


def plot(summary: dict, out: Path, x: str, lines: list[str]) -> list[Path]:
    """tau and speedup vs ``x``, per-depth acceptance and accepted-length histograms (PNG files)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = summary["cells"]
    xlabel = "tree nodes verified per step (measured)" if x == NODES else x
    groups: dict[str, list] = {}
    for c in cells:
        groups.setdefault(_line_key(c, lines), []).append(c)
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4))
    for label, cs in groups.items():
        cs = sorted(cs, key=lambda c: _x_of(c, x))
        xs = [_x_of(c, x) for c in cs]
        a1.plot(xs, [c["tau"] for c in cs], "o-", label=label)
        a2.plot(xs, [c["speedup"] for c in cs], "o-", label=label)
    a1.set(xlabel=xlabel, ylabel="tau (tokens per target forward)", title="acceptance")
    a2.set(xlabel=xlabel, ylabel="speedup (vs the faster of plain / generate)", title="wall clock")
    a2.axhline(1.0, color="grey", lw=0.8, ls="--")
    for a in (a1, a2):
        a.grid(alpha=0.3)
        a.legend(fontsize=7)
    fig.tight_layout()
    paths = [out / "tau_speedup.png"]
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

    rows = (len(cells) + 1) // 2  # legend rows below the plots, two cells per row
    fig, (b1, b2) = plt.subplots(1, 2, figsize=(11, 4 + 0.2 * rows))
    cmap = plt.get_cmap("tab10" if len(cells) <= 10 else "tab20")
    for i, c in enumerate(cells):
        style = dict(color=cmap(i % cmap.N), ls="-" if i < cmap.N else "--", marker="o", ms=3)
        d = c["per_depth_acceptance"]
        b1.plot(range(1, len(d) + 1), d, label=_cell_label(c), **style)
        h = c["accepted_hist"]
        total = sum(h) or 1
        b2.plot(range(len(h)), [v / total for v in h], **style)
    b1.set(xlabel="tree depth d", ylabel="acceptance at depth d", title="per-depth acceptance", ylim=(0, 1.02))
    b2.set(xlabel="drafted tokens accepted in a step", ylabel="fraction of steps", title="accepted length")
    for b in (b1, b2):
        b.grid(alpha=0.3)
    fig.legend(loc="lower center", ncol=2, fontsize=7, frameon=False)
    fig.tight_layout(rect=(0, 0.2 * rows / (4 + 0.2 * rows) + 0.02, 1, 1))
    paths.append(out / "acceptance.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)
    return paths


def write_outputs(summary: dict, out: str | Path, axes: list[str], x: str = NODES,
                  lines: list[str] | None = None) -> list[Path]:
    """``results.json``, ``results.csv``, ``table.md`` and the plots under ``out``."""
    out = Path(out)
    lines = default_lines(axes, x, lines)
    write_json(summary, out / "results.json", indent=1)
    fields, rows = _csv_rows(summary, axes)
    with open(out / "results.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)
    (out / "table.md").write_text(format_table(summary, axes) + "\n")
    return [out / "results.json", out / "results.csv", out / "table.md", *plot(summary, out, x, lines)]
