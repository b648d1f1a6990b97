"""Parsing helpers shared by the command-line scripts (kernels/bench_*, experiments/); a leaf, importable from both."""
from __future__ import annotations

__all__ = ["positive_ints"]


def positive_ints(text: str, flag: str) -> list[int]:
    """``"1,4,8"`` -> ``[1, 4, 8]``; a ``ValueError`` naming ``flag`` for anything else (empty
    items, non-integers, values below 1)."""
    try:
        values = [int(item) for item in text.split(",")]
        if not values or min(values) < 1:
            raise ValueError
    except ValueError:
        raise ValueError(f"{flag} must be positive integers separated by commas, got '{text}'") from None
    return values
