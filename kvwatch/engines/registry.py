"""The engines kvwatch knows, by name: the only place code finds an engine.

A command looks its engine up here once (``get`` for a name a user typed, ``ENGINES[name]`` for an
``EngineName``) and carries the ``Engine`` object down. Adding an engine is adding a package under
kvwatch/engines that declares an ``Engine`` (base.py), naming it in kinds.EngineName and one line
here. Detection and the log pre-filter derive from the engines' own tables.
"""

from __future__ import annotations

import functools

from kvwatch.core.errors import ConfigError
from kvwatch.core.kinds import ENGINE_NAMES, EngineName
from kvwatch.engines.base import Engine
from kvwatch.engines.sglang.engine import ENGINE as SGLANG
from kvwatch.engines.vllm.engine import ENGINE as VLLM

ENGINES: dict[EngineName, Engine] = {e.name: e for e in (VLLM, SGLANG)}
if tuple(ENGINES) != ENGINE_NAMES:  # pragma: no cover - a packaging mistake, caught by any test
    raise RuntimeError(f"engine packages {tuple(ENGINES)} do not match kinds.EngineName {ENGINE_NAMES}")


@functools.cache
def all_anchors() -> tuple[str, ...]:
    """Every anchor of every engine, for sources whose engine is not known yet (the engines' own
    copies: no log dialect is built, and so no line table imported, before a line names its engine)."""
    return tuple(dict.fromkeys(a for e in ENGINES.values() for a in e.anchors))


def get(name: str) -> Engine:
    """The engine called ``name`` (a user's --engine, a config file's); ConfigError naming the known
    ones otherwise."""
    for engine in ENGINES.values():
        if engine.name == name:
            return engine
    raise ConfigError(f"unknown engine {name!r} (use {' or '.join(ENGINE_NAMES)})")


def detect_engine(line: str) -> EngineName | None:
    """The engine a line reveals, or None when it could come from either (or neither).

    A source is one engine's log, so the first decisive line settles it for the rest of the file
    (the user can force it with ``--engine``). Phrases are plain substrings of the raw line, checked
    only on lines that already passed the anchor filter.
    """
    found = [e.name for e in ENGINES.values() if any(p in line for p in e.phrases)]
    return found[0] if len(found) == 1 else None
