"""Tuning overrides shared by every kernel family: ``LOWBIT_<FAMILY>_<FIELD>`` environment
variables that replace one field of a heuristic's launch configuration.

Each family lists the config fields it lets users override; `env_key` is part of every
heuristic's memo key (so changing a variable changes the answer, and the host side still costs
one dict lookup); `apply_env_overrides` parses and applies the values, appending
``NAME=value`` to the config's ``reason`` so ``show-config``-style explanations say why.
Values are parsed by the type of the field they replace (bool: 1/0/true/false/yes/no; int;
str); a malformed value raises ValueError naming the variable.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, TypeVar

__all__ = ["override_names", "env_key", "overridden", "parse_override", "apply_env_overrides"]

C = TypeVar("C")

_TRUE = ("1", "true", "yes")
_FALSE = ("0", "false", "no")


def override_names(family: str, fields: tuple[str, ...]) -> list[str]:
    """``LOWBIT_<FAMILY>_<FIELD>`` for each field (the documented knobs of a family)."""
    return [f"LOWBIT_{family}_{f.upper()}" for f in fields]


def overridden(family: str, field: str) -> bool:
    """Whether ``LOWBIT_<FAMILY>_<FIELD>`` is set: a heuristic that moves a config onto another
    engine's tile keeps the fields the user asked for."""
    return bool(os.environ.get(override_names(family, (field,))[0]))


def env_key(family: str, fields: tuple[str, ...]) -> tuple[str, ...]:
    """The overrides' current raw values ("" when unset): part of every memo key."""
    return tuple(os.environ.get(n, "") for n in override_names(family, fields))


def parse_override(name: str, raw: str, current: Any) -> Any:
    """Parse `raw` (the value of variable `name`) as the type of the field's `current` value."""
    if isinstance(current, bool):
        if raw.lower() not in _TRUE + _FALSE:
            raise ValueError(f"{name}={raw!r}: expected 0/1 (or true/false)")
        return raw.lower() in _TRUE
    if isinstance(current, int):
        try:
            return int(raw)
        except ValueError:
            raise ValueError(f"{name}={raw!r} is not an integer") from None
    return raw


def apply_env_overrides(cfg: C, family: str, fields: tuple[str, ...]) -> C:
    """`cfg` (a dataclass with a ``reason`` field) with every set override of `fields` applied."""
    for name, field in zip(override_names(family, fields), fields):
        raw = os.environ.get(name)
        if raw:
            val = parse_override(name, raw, getattr(cfg, field))
            cfg = dataclasses.replace(cfg, **{field: val}, reason=f"{cfg.reason}; {name}={raw}")
    return cfg
