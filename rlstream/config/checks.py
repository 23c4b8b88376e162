"""The one error every bad setting raises, and the checks the sections share."""

from __future__ import annotations


class ConfigError(ValueError):
    """A setting that is unknown or has a bad value; the message names the field and the fix."""


def choice(section: str, name: str, value, allowed) -> None:
    if value not in allowed:
        raise ConfigError(
            f"{section}.{name}: {value!r} is not one of {', '.join(map(str, allowed))}"
        )


def at_least(section: str, name: str, value, low) -> None:
    if value is not None and value < low:
        raise ConfigError(f"{section}.{name}: {value!r} must be >= {low}")
