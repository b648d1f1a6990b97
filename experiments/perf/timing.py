"""The speed probes' one timing loop: arms run in interleaved rounds, medians and paired ratios.

A machine's speed drifts (other jobs, clocks, caches), often by more than the difference a probe is
after. So every probe runs its arms A, B, ... one right after the other in each round and compares
them round by round: a slow spell hits all arms of a round alike. The order alternates (A B, B A,
...) or rotates (A B C, B C A, ...) so no arm always runs first.

    from timing import Arm, interleave
    t = interleave({"plain": run_plain, "packed": Arm(run_packed, before=flush)}, rounds=15, warmup=2)
    t.median("packed") / t.median("plain"), t.median_ratio("packed", "plain")
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, Mapping

__all__ = ["Arm", "Timings", "interleave", "round_order"]

ORDERS = ("alternate", "rotate", "fixed")


@dataclass
class Arm:
    """One side of a comparison. Only ``run`` is timed; ``before`` (put the process in this arm's
    state, flush a cache) and ``after`` (given ``run``'s result: crop a cache, keep an output) are not."""

    run: Callable[[], Any]
    before: Callable[[], Any] | None = None
    after: Callable[[Any], Any] | None = None


@dataclass
class Timings:
    """Seconds per arm, one entry per timed round, in round order; ``results``: each arm's last result."""

    times: dict[Hashable, list[float]]
    results: dict[Hashable, Any] = field(default_factory=dict)

    def median(self, arm: Hashable, scale: float = 1.0) -> float:
        return statistics.median(self.times[arm]) * scale

    def best(self, arm: Hashable, scale: float = 1.0) -> float:
        return min(self.times[arm]) * scale

    def ratios(self, num: Hashable, den: Hashable) -> list[float]:
        """Round by round, ``num``'s time over ``den``'s (the pairs the interleaving makes comparable)."""
        return [a / b for a, b in zip(self.times[num], self.times[den])]

    def median_ratio(self, num: Hashable, den: Hashable) -> float:
        return statistics.median(self.ratios(num, den))


def round_order(names: list, r: int, order: str) -> list:
    """The arms' order in round ``r``: ``alternate`` reverses every other round, ``rotate`` starts
    one arm later each round, ``fixed`` keeps the given order."""
    if order == "alternate":
        return list(names) if r % 2 == 0 else list(names)[::-1]
    if order == "rotate":
        k = r % len(names)
        return list(names[k:]) + list(names[:k])
    if order == "fixed":
        return list(names)
    raise ValueError(f"order must be one of {', '.join(ORDERS)}, got {order!r}")


def interleave(arms: Mapping[Hashable, Arm | Callable[[], Any]], rounds: int, *, warmup: int = 1,
               order: str = "alternate", each_round: Callable[[int], Any] | None = None,
               progress: Callable[[int, Hashable, float], Any] | None = None,
               clock: Callable[[], float] = time.perf_counter) -> Timings:
    """Run ``warmup + rounds`` rounds of every arm (a bare callable is an ``Arm`` without hooks) and
    return the seconds of the last ``rounds``. ``each_round(r)`` runs at the start of round ``r``
    (0-based, warm-up rounds included; e.g. draw this round's inputs, shared by all arms);
    ``progress(r, arm, seconds)`` after each timed run (``r`` counts timed rounds from 0)."""
    if rounds < 1 or warmup < 0:
        raise ValueError(f"need rounds >= 1 and warmup >= 0, got rounds={rounds}, warmup={warmup}")
    if not arms:
        raise ValueError("no arms to time")
    named = {k: a if isinstance(a, Arm) else Arm(a) for k, a in arms.items()}
    names = list(named)
    round_order(names, 0, order)  # an unknown order fails before anything runs
    out = Timings({k: [] for k in names})
    for r in range(warmup + rounds):
        if each_round is not None:
            each_round(r)
        for k in round_order(names, r, order):
            arm = named[k]
            if arm.before is not None:
                arm.before()
            t0 = clock()
            res = arm.run()
            dt = clock() - t0
            if arm.after is not None:
                arm.after(res)
            out.results[k] = res
            if r >= warmup:
                out.times[k].append(dt)
                if progress is not None:
                    progress(r - warmup, k, dt)
    return out
