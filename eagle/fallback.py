"""Automatic fallback to plain decoding when drafting stops paying for itself.

Speculation wins only while (tokens per drafting step) / (drafting step time) beats
1 / (plain step time). Both sides are measured in the running generation: a few plain steps
calibrate the plain rate, a window of drafting steps the drafting rate. When drafting is slower,
the decoder runs plain steps for a while and then probes drafting again (the back-off doubles after
each failed probe), so a drafter that never helps costs only the probes.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

__all__ = ["FallbackConfig", "FallbackPolicy"]


@dataclass
class FallbackConfig:
    enabled: bool = False
    window: int = 4  # drafting steps per estimate (and per probe)
    calibrate: int = 2  # plain steps at the start that measure the plain rate
    backoff: int = 32  # plain steps after drafting lost; doubles per failed probe
    max_backoff: int = 256
    margin: float = 1.0  # keep drafting while drafting rate >= margin x plain rate

    def validate(self) -> None:
        if self.window < 1 or self.calibrate < 1 or self.backoff < 1 or self.max_backoff < self.backoff:
            raise ValueError("fallback needs window, calibrate, backoff >= 1 and max_backoff >= backoff")
        if self.margin <= 0:
            raise ValueError("fallback.margin must be > 0")


class FallbackPolicy:
    """Decides, step by step, whether to draft; fed with each step's tokens and wall time."""

    def __init__(self, cfg: FallbackConfig):
        self.cfg = cfg
        self.plain = deque(maxlen=max(cfg.calibrate, 4))  # (tokens, seconds) of plain steps
        self.draft = deque(maxlen=cfg.window)
        self.plain_left = cfg.calibrate if cfg.enabled else 0  # plain steps before drafting (again)
        self.backoff = cfg.backoff

    def use_draft(self) -> bool:
        return not self.cfg.enabled or self.plain_left == 0

    @staticmethod
    def _rate(samples) -> float:
        secs = sum(s for _, s in samples)
        return sum(t for t, _ in samples) / secs if secs > 0 else float("inf")

    def record(self, drafted: bool, tokens: int, seconds: float) -> None:
        if not self.cfg.enabled:
            return
        if not drafted:
            self.plain.append((tokens, seconds))
            self.plain_left = max(self.plain_left - 1, 0)
            if self.plain_left == 0:
                self.draft.clear()  # a fresh window of drafting steps decides the next verdict
            return
        self.draft.append((tokens, seconds))
        if len(self.draft) < self.draft.maxlen:
            return
        if self._rate(self.draft) >= self.cfg.margin * self._rate(self.plain):
            self.backoff = self.cfg.backoff  # drafting pays: keep going, forgive earlier failures
            self.draft.popleft()
            return
        self.plain_left = self.backoff  # drafting lost: plain steps, then probe again
        self.backoff = min(2 * self.backoff, self.cfg.max_backoff)
