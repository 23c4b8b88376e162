"""Named registries (samplers, advantage estimators, evaluators, neighbourhood indexes).

    SAMPLERS = Registry("selection sampler")

    @SAMPLERS.register("uniform")
    class UniformSelection: ...

    SAMPLERS.lookup("uniform")   # the class; an unknown name lists the known ones

A registry is a dict from name to object; registering a name twice is an error (STYLE.md: a
duplicate name is an error, not a silent override).
"""

from __future__ import annotations

from collections.abc import Callable


class Registry(dict):
    def __init__(self, kind: str):
        super().__init__()
        self.kind = kind

    def register(self, name: str) -> Callable:
        """Decorator adding the decorated object under `name` (ValueError if already there)."""

        def add(obj):
            if name in self:
                raise ValueError(
                    f"{self.kind} {name!r} is already registered (by "
                    f"{getattr(self[name], '__qualname__', self[name])}); pick another name"
                )
            self[name] = obj
            return obj

        return add

    def lookup(self, name: str):
        """The object under `name`; an unknown name is a ValueError listing the known ones."""
        if name not in self:
            raise ValueError(f"unknown {self.kind} {name!r}; known: {', '.join(sorted(self))}")
        return self[name]
