"""The engines kvwatch knows, by name: the only place code finds an engine.

Adding an engine is adding a package under kvwatch/engines that builds an ``Engine`` (base.py),
naming it in kinds.EngineName and one line here. Detection and the log pre-filter derive from
the engines' own tables.
"""

from __future__ import annotations

import functools
import re

from kvwatch.core.errors import ConfigError
from kvwatch.core.kinds import ENGINE_NAMES, EngineName
from kvwatch.core.versions import version_tuple
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
    """The engine called ``name``; ConfigError naming the known ones otherwise."""
    for engine in ENGINES.values():
        if engine.name == name:
            return engine
    raise ConfigError(f"unknown engine {name!r} (use {' or '.join(ENGINE_NAMES)})")


def check_version(name: str, version: str | None) -> None:
    """ConfigError unless ``version`` (a user's --engine-version; None = newest) is a release of
    engine ``name`` kvwatch knows, naming the range it knows."""
    if version is None:
        return
    engine = get(name)
    oldest, newest = engine.known_versions
    label = {"vllm": "vLLM", "sglang": "SGLang"}.get(engine.name, engine.name)
    known = f"kvwatch knows {label} {oldest} to {newest}"
    parsed = version_tuple(version)
    text = version.strip().lstrip("v")
    if (
        parsed is None
        or len(text) > 40  # (first: the pattern below is quadratic in a long near miss)
        or not re.fullmatch(r"[0-9]+(\.[0-9]+)*([.+-]?[A-Za-z0-9.+-]*)?", text)
    ):
        raise ConfigError(f"engine version {version!r} is not a version number ({known})")
    low, high = version_tuple(oldest), version_tuple(newest)
    assert low is not None and high is not None
    # A release newer than any kvwatch has read is predicted with the newest rules it knows, and the
    # prediction says so (capacity/envelope.py widens its band); a jump of two majors is a typo.
    newer = parsed[: len(high)] > high and parsed[0] <= high[0] + 1
    if not newer and not low <= parsed[: len(high)] <= high and parsed[: len(low)] != low:
        raise ConfigError(
            f"{label} {version} is not a release kvwatch knows ({label} {oldest} to {newest}); "
            "omit --engine-version for the newest"
        )


def detect_engine(line: str) -> EngineName | None:
    """The engine a line reveals, or None when it could come from either (or neither).

    A source is one engine's log, so the first decisive line settles it for the rest of the file
    (the user can force it with ``--engine``). Phrases are plain substrings of the raw line, checked
    only on lines that already passed the anchor filter.
    """
    found = [e.name for e in ENGINES.values() if any(p in line for p in e.phrases)]
    return found[0] if len(found) == 1 else None
