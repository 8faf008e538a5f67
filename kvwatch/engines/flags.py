"""Reading an engine's own command line (``vllm serve …``, ``python -m sglang.launch_server …``).

``kvwatch predict MODEL -- <flags>`` takes the flags users already type, in the engine's spelling.
Each engine lists its flags as ``Flag`` rows (engines/<engine>/flags.py); ``read_flags`` turns an
argv into Deployment fields by that table, accepts ``--flag value`` and ``--flag=value``, and returns
every flag it does not model as ignored (listed, never fatal). A value that cannot be read is a
ConfigError naming the flag.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from kvwatch.core.errors import ConfigError


def human_int(text: str) -> int:
    """An integer as vLLM's argparse reads sizes: '32768', '32k' (x1000), '32K' (x1024), '1m', '1M'."""
    multipliers = {"k": 1000, "K": 1024, "m": 1000**2, "M": 1024**2, "g": 1000**3, "G": 1024**3}
    body, scale = text, 1
    if text and text[-1] in multipliers:
        body, scale = text[:-1], multipliers[text[-1]]
    try:
        value = float(body) * scale
    except ValueError:
        raise ValueError(f"not a number: {text!r}") from None
    if value != int(value) or not 0 < value < 2**63:
        raise ValueError(f"not a positive whole number: {text!r}")
    return int(value)


def positive_int(value: str) -> int:
    n = int(value)
    if n < 1:
        raise ValueError(f"must be positive, got {value}")
    return n


def fraction(text: str) -> float:
    value = float(text)
    if not 0 < value <= 1:
        raise ValueError(f"must be in (0, 1], got {text}")
    return value


def text(value: str) -> str:
    return value


def json_object(value: str) -> dict[str, object]:
    """A flag whose value is a JSON object (vLLM's --speculative-config, --mm-processor-kwargs,
    --limit-mm-per-prompt): the object, or ValueError naming what was given."""
    try:
        parsed = json.loads(value)
    except ValueError:
        raise ValueError(f"{value!r} is not a JSON object") from None
    if not isinstance(parsed, dict):
        raise ValueError(f"{value!r} is not a JSON object")
    return parsed


@dataclass(frozen=True)
class Flag:
    """One engine flag: its spellings, the Deployment field it sets, how its value reads.

    ``switch`` flags take no value and set ``constant``; ``inverse`` names (``--no-…``) set ``not
    constant``.
    """

    names: tuple[str, ...]
    target: str
    convert: Callable[[str], object] = text
    switch: bool = False
    constant: object = True
    inverse: tuple[str, ...] = ()


@dataclass
class FlagReading:
    """What an engine command line says: Deployment fields, and the flags kvwatch does not model."""

    fields: dict[str, object] = field(default_factory=dict)
    ignored: list[str] = field(default_factory=list)
    model: str | None = None


def read_flags(argv: Sequence[str], table: Sequence[Flag], positional_model: bool = True) -> FlagReading:
    """Deployment fields from an engine argv, by ``table``."""
    by_name: dict[str, tuple[Flag, bool]] = {}
    for flag in table:
        for name in flag.names:
            by_name[name] = (flag, False)
        for name in flag.inverse:
            by_name[name] = (flag, True)
    out = FlagReading()
    args = list(argv)
    i = 0
    while i < len(args):
        arg = args[i]
        i += 1
        if not arg.startswith("-"):
            if positional_model and out.model is None:
                out.model = arg
            else:
                out.ignored.append(arg)
            continue
        name, eq, inline = arg.partition("=")
        known = by_name.get(name)
        if known is None:
            # An unmodelled flag: skip its value too when it has one (the next token is no flag).
            has_value = not eq and i < len(args) and not args[i].startswith("-")
            out.ignored.append(f"{arg} {args[i]}" if has_value else arg)
            i += 1 if has_value else 0
            continue
        flag, inverse = known
        if flag.switch:
            if eq:
                raise ConfigError(f"{name} takes no value")
            out.fields[flag.target] = (not flag.constant) if inverse else flag.constant
            continue
        if eq:
            value = inline
        elif i < len(args):
            value = args[i]
            i += 1
        else:
            raise ConfigError(f"{name} needs a value")
        if flag.target == "model":
            out.model = value
            continue
        try:
            out.fields[flag.target] = flag.convert(value)
        except ValueError as exc:
            raise ConfigError(f"{name}: {exc}") from None
    return out
