"""Named registries (samplers, advantage estimators, evaluators, neighbourhood indexes).

    SAMPLERS = Registry("selection sampler")

    @SAMPLERS.register("uniform")
    class UniformSelection: ...

    SAMPLERS.lookup("uniform")   # the class; an unknown name lists the known ones

A registry is a dict from name to object; registering a name twice is an error (STYLE.md: a
duplicate name is an error, not a silent override). A registry declared with `fill=MODULE`
imports that module (whose plug-ins register themselves) the first time its names are asked
for, so a module that only validates a name (the config) need not import the plug-ins.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable


class Registry(dict):
    def __init__(self, kind: str, fill: str | None = None):
        super().__init__()
        self.kind = kind
        self._fill = fill

    def filled(self) -> Registry:
        """The registry after its plug-ins module (if any) has been imported once."""
        if self._fill is not None:
            module, self._fill = self._fill, None
            importlib.import_module(module)
        return self

    def names(self) -> list[str]:
        return sorted(self.filled())

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
        self.filled()
        if name not in self:
            raise ValueError(f"unknown {self.kind} {name!r}; known: {', '.join(sorted(self))}")
        return self[name]


SELECTION_SAMPLERS = Registry("selection sampler", fill="rlstream.trainers.selection")
"""Prompt samplers by name (`selection.sampler`); filled by `rlstream.trainers.selection`."""


def register_sampler(name: str):
    """Class decorator that adds a sampler under `name` (and sets `cls.name`)."""

    def add(cls: type) -> type:
        cls.name = name
        return SELECTION_SAMPLERS.register(name)(cls)

    return add
