"""Configs as data: to and from nested dicts, YAML/JSON files, dotted `--set` overrides, and
the docstring of every setting. Generic over the section dataclasses (`cls`)."""

from __future__ import annotations

import json
import typing
from dataclasses import MISSING, asdict, fields, is_dataclass
from pathlib import Path
from typing import Any

from rlstream.config.checks import ConfigError


def to_dict(cfg) -> dict:
    return asdict(cfg)


def _hints(cls) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def from_dict(cls, data: dict, where: str = ""):
    """A `cls` from nested plain data; an unknown key is a ConfigError listing the known ones."""
    if not isinstance(data, dict):
        raise ConfigError(f"{where or 'config'}: expected a mapping, got {type(data).__name__}")
    hints, known = _hints(cls), {f.name for f in fields(cls)}
    values = {}
    for key, value in data.items():
        path = f"{where}.{key}" if where else key
        if key not in known:
            raise ConfigError(f"unknown setting {path!r}; known here: {', '.join(sorted(known))}")
        kind = hints[key]
        if is_dataclass(kind):
            values[key] = from_dict(kind, value, path)
        else:
            values[key] = _coerce(path, kind, value)
    return cls(**values)


def _coerce(path: str, kind, value):
    """A value of the field's type (from YAML/JSON or a --set string)."""
    args = typing.get_args(kind)
    optional = type(None) in args
    base = next((a for a in args if a is not type(None)), kind) if args else kind
    if isinstance(value, str) and optional and value.lower() in ("", "none", "null"):
        return None
    if value is None:
        if optional:
            return None
        raise ConfigError(f"{path}: needs a {base.__name__}, got nothing")
    try:
        if base is bool:
            if isinstance(value, bool):
                return value
            if str(value).lower() in ("1", "true", "yes", "on"):
                return True
            if str(value).lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError
        if base is int and isinstance(value, float) and value != int(value):
            raise ValueError
        if base in (int, float) and isinstance(value, bool):
            raise ValueError
        return base(value)
    except (TypeError, ValueError):
        article = "an" if base.__name__[0] in "aeiou" else "a"
        raise ConfigError(f"{path}: {value!r} is not {article} {base.__name__}") from None


def leaf_names(cls, where: str = "") -> dict[str, str]:
    """Every setting's dotted name -> its type name."""
    out = {}
    for f in fields(cls):
        path = f"{where}.{f.name}" if where else f.name
        kind = _hints(cls)[f.name]
        if is_dataclass(kind):
            out |= leaf_names(kind, path)
        else:
            out[path] = getattr(kind, "__name__", str(kind))
    return out


def resolve_name(name: str, cls) -> str:
    """A dotted setting name; a bare leaf name (`corpus_docs`) is accepted when unambiguous."""
    names = leaf_names(cls)
    if name in names:
        return name
    matches = [n for n in names if n.rsplit(".", 1)[-1] == name]
    if len(matches) == 1:
        return matches[0]
    if matches:
        raise ConfigError(f"--set {name}: ambiguous; use one of {', '.join(matches)}")
    close = [n for n in names if name in n]
    hint = f" (did you mean {', '.join(close[:4])}?)" if close else " (see `rlstream config show`)"
    raise ConfigError(f"--set {name}: unknown setting{hint}")


def parse_overrides(items: list[str], cls) -> dict:
    """['rl.lr=3e-5', 'corpus_docs=2000'] -> a nested dict of raw values."""
    out: dict = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep:
            raise ConfigError(f"--set {item!r}: expected NAME=VALUE, e.g. --set rl.lr=3e-5")
        node = out
        *parents, leaf = resolve_name(key.strip(), cls).split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = raw
    return out


def merge(base: dict, extra: dict) -> dict:
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def read_file(path: str | Path) -> dict:
    """A YAML (.yaml/.yml) or JSON file's mapping."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"--config {path}: no such file")
    text = path.read_text()
    try:
        if path.suffix in (".yaml", ".yml"):
            import yaml

            data = yaml.safe_load(text) or {}
        else:
            data = json.loads(text)
    except Exception as e:  # noqa: BLE001  (any parse error becomes one line)
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ConfigError(
            f"--config {path}: not valid {path.suffix[1:] or 'JSON'}: {first}"
        ) from None
    return data


def nested(dotted: dict) -> dict:
    """{'rl.steps': 5, 'seed': 1} -> {'rl': {'steps': 5}, 'seed': 1} (None values dropped)."""
    out: dict = {}
    for name, value in dotted.items():
        if value is None:
            continue
        node = out
        *parents, leaf = name.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return out


def with_values(cfg, **dotted) -> Any:
    """A copy of cfg with dotted settings replaced: with_values(cfg, **{"rl.steps": 4})."""
    return from_dict(type(cfg), merge(to_dict(cfg), nested(dotted)))


def show(cfg) -> str:
    """The effective config as YAML (the shape `--config` reads)."""
    import yaml

    return yaml.safe_dump(to_dict(cfg), sort_keys=False)


def describe(cls, where: str = "") -> list[tuple[str, str, str]]:
    """(dotted name, default, docstring) of every setting, from the dataclasses' docstrings."""
    import ast
    import inspect
    import textwrap

    docs: dict[str, str] = {}
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body
    for node, nxt in zip(body, body[1:], strict=False):
        doc = getattr(nxt, "value", None)
        if isinstance(node, ast.AnnAssign) and isinstance(doc, ast.Constant):
            docs[node.target.id] = " ".join(str(doc.value).split())
    out = []
    for f in fields(cls):
        path = f"{where}.{f.name}" if where else f.name
        kind = _hints(cls)[f.name]
        if is_dataclass(kind):
            out += describe(kind, path)
        else:
            default = f.default if f.default is not MISSING else f.default_factory()
            out.append((path, repr(default), docs.get(f.name, "")))
    return out
