"""Small file-system helpers shared by the checkpoint and result writers."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

__all__ = ["replace_dir", "existing_dir", "write_json", "save_figure", "check_safetensors"]


def write_json(obj, path: str | Path, indent: int = 2) -> None:
    """Write ``obj`` as JSON atomically (a temporary file renamed into place), so an interruption
    never leaves a truncated file; the parent folder is created if needed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=indent))
    os.replace(tmp, path)


def save_figure(fig, path: str | Path, dpi: int = 110) -> Path:
    """Save a matplotlib figure as ``path`` (its folder created if needed) and close it."""
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path


def check_safetensors(path: str | Path, error: type[Exception]) -> None:
    """Read the header of the safetensors file ``path``; a truncated or corrupt file raises
    ``error`` with one line naming it (safetensors' own error is not a ValueError, so the CLI would
    print a traceback)."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), "pt"):
            pass
    except SafetensorError as e:
        raise error(f"{path}: truncated or corrupt, not a readable safetensors file ({e})") from None


def replace_dir(tmp: Path, folder: Path) -> None:
    """Put the fully written folder ``tmp`` in place of ``folder``.

    The old copy is first renamed to ``<folder>.old`` and deleted only once the new one is in
    place, so a crash at any point leaves a complete copy under one of the two names (see
    :func:`existing_dir`).
    """
    old = folder.with_name(folder.name + ".old")
    if folder.exists():
        shutil.rmtree(old, ignore_errors=True)  # a leftover of a save interrupted before its cleanup
        os.replace(folder, old)
    os.replace(tmp, folder)
    shutil.rmtree(old, ignore_errors=True)


def existing_dir(folder: Path) -> Path | None:
    """``folder``, or its ``.old`` copy when a save was interrupted between the two renames."""
    if folder.exists():
        return folder
    old = folder.with_name(folder.name + ".old")
    return old if old.exists() else None
