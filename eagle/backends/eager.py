"""The eager backend: transformers' forward as it is, on any device (the reference)."""
from .base import Backend

__all__ = ["EagerBackend", "BACKEND"]


class EagerBackend(Backend):
    """See :class:`eagle.backends.base.Backend` (its defaults are this backend's behaviour)."""


BACKEND = EagerBackend
