"""Automatic fallback to plain decoding when drafting stops paying for itself.

Speculation wins only while (tokens per drafting step) / (drafting step time) beats
1 / (plain step time). Both rates are measured on the running decoder, as exponentially decayed
sums of (tokens, seconds) over recent steps: ``memory`` steps for drafting, so a few unlucky steps
do not flip the verdict, and the plain steps for the plain rate (``calibrate`` plain steps start a
decoder that knows nothing yet). After ``min_steps`` drafting steps the policy compares the two at
every drafting step; when drafting is slower it runs ``backoff`` plain steps and then probes
drafting again for ``probe`` steps on a fresh estimate (the back-off doubles after each failed
probe, up to ``max_backoff``), so a drafter that never helps costs little more than its probes.

The estimates live on the :class:`FallbackPolicy`, which a decoder keeps across ``generate`` calls:
a deployment learns once whether drafting pays instead of re-learning it on every prompt.
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["FallbackConfig", "FallbackPolicy"]


@dataclass
class FallbackConfig:
    enabled: bool = False
    memory: int = 16  # drafting steps the drafting-rate estimate averages over (exponential decay)
    min_steps: int = 6  # drafting steps before the first verdict
    probe: int = 4  # drafting steps of a probe after a back-off
    calibrate: int = 2  # plain steps that measure the plain rate before any drafting
    backoff: int = 16  # plain steps after drafting lost; doubles per failed probe
    max_backoff: int = 256
    margin: float = 1.0  # keep drafting while drafting rate >= margin x plain rate

    def validate(self) -> None:
        if min(self.memory, self.min_steps, self.probe, self.calibrate, self.backoff) < 1 \
                or self.max_backoff < self.backoff:
            raise ValueError("fallback needs memory, min_steps, probe, calibrate, backoff >= 1 and "
                             "max_backoff >= backoff")
        if self.margin <= 0:
            raise ValueError("fallback.margin must be > 0")


class _Rate:
    """Tokens per second over recent steps: sums decayed by ``1 - 1/memory`` per recorded step."""

    def __init__(self, memory: int):
        self.keep = 1.0 - 1.0 / memory
        self.clear()

    def clear(self) -> None:
        self.tokens = self.seconds = 0.0
        self.steps = 0

    def add(self, tokens: int, seconds: float) -> None:
        self.tokens = self.tokens * self.keep + tokens
        self.seconds = self.seconds * self.keep + seconds
        self.steps += 1

    @property
    def value(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else float("inf")


class FallbackPolicy:
    """Decides, step by step, whether to draft; fed with each step's tokens and wall time."""

    def __init__(self, cfg: FallbackConfig):
        self.cfg = cfg
        self.plain = _Rate(cfg.memory)
        self.draft = _Rate(cfg.memory)
        self.plain_left = cfg.calibrate if cfg.enabled else 0  # plain steps before drafting (again)
        self.needed = cfg.min_steps  # drafting steps before the next verdict
        self.backoff = cfg.backoff

    def use_draft(self) -> bool:
        return not self.cfg.enabled or self.plain_left == 0

    def record(self, drafted: bool, tokens: int, seconds: float) -> None:
        if not self.cfg.enabled:
            return
        if not drafted:
            self.plain.add(tokens, seconds)
            self.plain_left = max(self.plain_left - 1, 0)
            return
        self.draft.add(tokens, seconds)
        if self.draft.steps < self.needed:
            return
        if self.draft.value >= self.cfg.margin * self.plain.value:
            self.backoff = self.cfg.backoff  # drafting pays: keep going (judged again every step)
            return
        self.plain_left = self.backoff  # drafting lost: plain steps, then a probe on a fresh estimate
        self.backoff = min(2 * self.backoff, self.cfg.max_backoff)
        self.draft.clear()
        self.needed = self.cfg.probe
