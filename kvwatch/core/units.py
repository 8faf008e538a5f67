"""Byte sizes as users and engines write them.

Engines print GiB while calling them GB (vLLM's 'GiB', SGLang's 'GB' that is really GiB), users type
'80GB' meaning decimal gigabytes, and nvidia-smi reports MiB. These helpers keep the distinction in
one place so every command reads and writes sizes the same way.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction

from kvwatch.core.errors import ConfigError

KiB = 1024
MiB = 1024**2
GiB = 1024**3

_UNITS: dict[str, int] = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "m": 1000**2,
    "mb": 1000**2,
    "g": 1000**3,
    "gb": 1000**3,
    "t": 1000**4,
    "tb": 1000**4,
    "ki": KiB,
    "kib": KiB,
    "mi": MiB,
    "mib": MiB,
    "gi": GiB,
    "gib": GiB,
    "ti": 1024**4,
    "tib": 1024**4,
}

# (Possessive blanks and unit: a long run of blanks is refused in one pass.)
_SIZE = re.compile(
    r"^\s*(?P<sign>[-+]?)(?P<num>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE](?P<exp>[+-]?[0-9]+))?\s*+(?P<unit>[A-Za-z]*+)\s*+$"
)


# No size kvwatch reads is near this (16 PiB); past it a number is a typo, refused before arithmetic.
MAX_SIZE = 2**54


def parse_size(
    text: str, *, allow_zero: bool = False, maximum: int = MAX_SIZE, minimum: int | None = None
) -> int:
    """Parse '52.31566GiB', '80GB', '81559MiB' or '1234' into whole bytes (rounded down).

    Capacities must be positive; ``allow_zero`` is for terms that can really be nothing (an
    activation allowance in a "before activations" plan). Over ``maximum`` or under ``minimum``
    (zero excepted where allowed) is a ConfigError that names the bound; a number without a unit
    under it is bytes the user did not mean ('80': did you mean 80GiB?). Exact arithmetic: no
    float overflow, whatever the exponent.
    """
    m = _SIZE.match(text)
    if m is None:
        raise ConfigError(f"not a size: {text!r} (examples: 80GB, 81559MiB, 52.3GiB, 1073741824)")
    unit = m.group("unit").lower()
    if unit not in _UNITS:
        raise ConfigError(
            f"unknown size unit {m.group('unit')!r} in {text!r} (use B, KB, MB, GB, KiB, MiB, GiB)"
        )
    exp_text = m.group("exp") or "0"
    exp = int(exp_text) if len(exp_text.lstrip("+-0")) <= 4 else (1 if exp_text[0] != "-" else -1) * 10**5
    number = Fraction(m.group("num")) if exp >= -400 else Fraction(0)
    if m.group("sign") == "-" and number > 0:
        raise ConfigError(f"size must be positive: {text!r}")
    if exp > 30 or number * 10**exp * _UNITS[unit] > maximum:
        raise ConfigError(f"size {text.strip()!r} is over the plausible maximum of {_bound(maximum)}")
    value = math.floor(number * Fraction(10) ** exp * _UNITS[unit])
    if value == 0 and not allow_zero:
        raise ConfigError(f"size must be positive: {text!r}")
    if minimum is not None and value < minimum and not (allow_zero and value == 0):
        said = text.strip()
        hint = f": did you mean {said}GiB?" if not unit else ""
        raise ConfigError(
            f"size {said!r} is {value:,} bytes, under the plausible minimum of {_bound(minimum)}{hint}"
        )
    return value


def _bound(n_bytes: int) -> str:
    """A bound in the largest binary unit it is a whole number of ('16 TiB')."""
    for unit, size in (("PiB", 2**50), ("TiB", 2**40), ("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if n_bytes >= size and n_bytes % size == 0:
            return f"{n_bytes // size} {unit}"
    return f"{n_bytes} B"


def gib(n_bytes: float) -> float:
    """Bytes as GiB."""
    return n_bytes / GiB


def format_bytes(n_bytes: float | None) -> str:
    """Human form with binary units, e.g. '52.32 GiB'; '-' for None."""
    if n_bytes is None:
        return "-"
    sign = "-" if n_bytes < 0 else ""
    value = abs(float(n_bytes))
    for unit, size in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if value >= size:
            return f"{sign}{value / size:.2f} {unit}"
    return f"{sign}{value:.0f} B"
