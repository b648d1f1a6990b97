"""Named extension points: a class registers under a name with a decorator and is found by it.

Drafters (:data:`eagle.draft.base.DRAFTERS`) and tree shapes (:data:`eagle.draft.shape.TREE_SHAPES`)
are two such registries. A registered class carries a nested dataclass ``Options``: what its config
section may hold besides its name (``drafter.type`` / ``tree.shape``), filled strictly by the config
loader (:mod:`eagle.config`)."""
from __future__ import annotations

import dataclasses

__all__ = ["Registry"]


class Registry:
    """Classes of one kind (subclasses of ``base``) by name.

    ``register(name)`` is the class decorator; it sets ``cls.name`` and checks that ``cls.Options``
    is a dataclass. A name belongs to one class: another class under it is an error (two plugins
    cannot silently replace each other), except the same definition run again (a reloaded module,
    a notebook cell), which replaces the old one."""

    def __init__(self, kind: str, base: type):
        self.kind, self.base = kind, base
        self._classes: dict[str, type] = {}

    def register(self, name: str):
        if not isinstance(name, str) or not name:
            raise ValueError(f"a {self.kind} name must be a non-empty string, got {name!r}")

        def decorate(cls: type) -> type:
            if not (isinstance(cls, type) and issubclass(cls, self.base)):
                raise TypeError(f"register {self.kind} '{name}': {cls!r} is not a subclass of {self.base.__name__}")
            if not dataclasses.is_dataclass(getattr(cls, "Options", None)):
                raise TypeError(f"register {self.kind} '{name}': {cls.__name__}.Options must be a dataclass")
            held = self._classes.get(name)
            rerun = held is not None and (held.__module__, held.__qualname__) == (cls.__module__, cls.__qualname__)
            if held is not None and held is not cls and not rerun:
                raise ValueError(f"{self.kind} '{name}' is already registered ({held.__module__}.{held.__qualname__})")
            cls.name = name
            self._classes[name] = cls
            return cls

        return decorate

    def get(self, name: str) -> type | None:
        """The class registered as ``name``, or None."""
        return self._classes.get(name)

    def names(self) -> list[str]:
        return sorted(self._classes)

    def __contains__(self, name: str) -> bool:
        return name in self._classes
