"""Small file-system helpers shared by the checkpoint writers."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

__all__ = ["replace_dir", "existing_dir"]


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
