"""Named registries (samplers, advantage estimators, evaluators, neighbourhood indexes).

    SAMPLERS = Registry("selection sampler")

    @SAMPLERS.register("uniform")
    class UniformSelection: ...

    SAMPLERS.lookup("uniform")   # the class; an unknown name lists the known ones

A registry is a dict from name to object; registering a name twice is an error (STYLE.md: a
duplicate name is an error, not a silent override). A name can be declared before its module is
imported (`declare(name, "module:attr")`): the registry then knows the name, so a module that
only validates one (the config, in every process) imports no plug-in, and the first `lookup`
imports the module, whose decorator registers the object in the declaration's place.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable


class Registry(dict):
    def __init__(self, kind: str):
        super().__init__()
        self.kind = kind

    def declare(self, name: str, where: str) -> None:
        """Know `name` before its module is imported: `where` is "module:attr"."""
        self.register(name)(where)

    def names(self) -> list[str]:
        return sorted(self)

    def register(self, name: str) -> Callable:
        """Decorator adding the decorated object under `name` (ValueError if already there,
        unless as this object's own declaration)."""

        def add(obj):
            declared = self.get(name)
            own = isinstance(declared, str) and declared == _where(obj)
            if name in self and not own:
                raise ValueError(
                    f"{self.kind} {name!r} is already registered (by "
                    f"{getattr(declared, '__qualname__', declared)}); pick another name"
                )
            self[name] = obj
            return obj

        return add

    def lookup(self, name: str):
        """The object under `name` (importing its module if it was only declared); an unknown
        name is a ValueError listing the known ones."""
        if name not in self:
            raise ValueError(f"unknown {self.kind} {name!r}; known: {', '.join(sorted(self))}")
        if isinstance(self[name], str):
            module, _, attr = self[name].partition(":")
            self[name] = getattr(importlib.import_module(module), attr)
        return self[name]


def import_spec(spec: str):
    """The object `package.module:attr` or `path/to/file.py:attr` names, imported (a user's
    plug-in); ValueError says what is wrong."""
    import importlib.util
    from pathlib import Path

    where, _, attr = spec.rpartition(":")
    if not where or not attr:
        raise ValueError(f"{spec!r}: give package.module:Name or path/file.py:Name")
    try:
        if where.endswith(".py"):
            path = Path(where).resolve()
            found = importlib.util.spec_from_file_location(path.stem, path)
            module = importlib.util.module_from_spec(found)
            found.loader.exec_module(module)
        else:
            module = importlib.import_module(where)
    except Exception as exc:  # noqa: BLE001  (the user's module: whatever it raises is theirs)
        raise ValueError(f"{spec!r}: importing {where!r} failed ({exc!r:.200})") from None
    if not hasattr(module, attr):
        raise ValueError(f"{spec!r}: {where!r} has no {attr!r}")
    return getattr(module, attr)


def _where(obj) -> str | None:
    module, name = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    return f"{module}:{name}" if module and name else None


SELECTION_SAMPLERS = Registry("selection sampler")
"""Prompt samplers by name (`selection.sampler`), declared here and registered by their modules
in `rlstream.trainers.selection` (`register_sampler`)."""
SELECTION_SAMPLERS.declare("uniform", "rlstream.trainers.selection.base:UniformSelection")
SELECTION_SAMPLERS.declare("dapo", "rlstream.trainers.selection.dapo:DynamicSamplingSampler")
SELECTION_SAMPLERS.declare("greso", "rlstream.trainers.selection.greso:GresoSampler")
SELECTION_SAMPLERS.declare("mopps", "rlstream.trainers.selection.mopps:MoppsSampler")
SELECTION_SAMPLERS.declare("ppm", "rlstream.trainers.selection.predictive:PredictiveSampler")


def register_sampler(name: str):
    """Class decorator that adds a sampler under `name` (and sets `cls.name`)."""

    def add(cls: type) -> type:
        cls.name = name
        return SELECTION_SAMPLERS.register(name)(cls)

    return add


SETTING_CHECKS = Registry("setting check")
"""Checks of settings whose meaning a module above the config owns: the config calls them by
name (a ValueError is the message), the modules that know the meaning hold them."""
SETTING_CHECKS.declare("data.tasks", "rlstream.trainers.envs.base:check_task_mix")
SETTING_CHECKS.declare("rl.reward_fn", "rlstream.trainers.rewards:check_reward_fn")
