"""Generated worst cases for a regular expression: the hostile-input corpus of tests/test_hostile_input.py.

A backtracking regex is slow on text that almost matches: a long run of what one of its repeats
accepts (so that two repeats, or one repeat and every start position of a search, can share it in
many ways) followed by a character that makes the match fail. ``worst_cases`` builds such text from
the pattern itself: for every unbounded repeat it writes the shortest text that reaches the repeat
(taking the branches that lead to it), the repeat's body over and over up to the wanted length
(once per kind of character the body accepts, and once mixing them), and then each of a few
breakers instead of the rest of the match. One more case grows every repeat at once (nested
repeats). Nothing here knows kvwatch's patterns: a new pattern gets its worst cases for free.
"""

from __future__ import annotations

import importlib
import re
import re._constants as c  # type: ignore[import-not-found]
import re._parser as p  # type: ignore[import-not-found]
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

# What follows the grown run instead of the rest of a match: nothing, a character few classes
# accept, a letter, a digit, a space, a closing quote and brace (the found /metrics case was 'z').
BREAKERS = ("", "\x00", "z", "9", " ", '"', "}")
_UNBOUNDED = c.MAXREPEAT
_REPEATS = (c.MAX_REPEAT, c.MIN_REPEAT, c.POSSESSIVE_REPEAT)
_CATEGORY_CHARS = {
    c.CATEGORY_DIGIT: "1",
    c.CATEGORY_NOT_DIGIT: "a",
    c.CATEGORY_SPACE: " ",
    c.CATEGORY_NOT_SPACE: "a",
    c.CATEGORY_WORD: "a_1",
    c.CATEGORY_NOT_WORD: " .",
    c.CATEGORY_LINEBREAK: "\n",
    c.CATEGORY_NOT_LINEBREAK: "a",
}
# Characters tried for a negated set or '.': the first few it accepts stand for it.
_PROBE = "a1 _.-:,=\"'/\\()[]{}|\tZ%+#\x00"


def _set_chars(items: list[tuple[Any, Any]]) -> str:
    """A few characters a character set accepts (its literals, range ends, a category's examples)."""
    if items and items[0][0] is c.NEGATE:
        return _accepted(items)
    out = ""
    for op, av in items:
        if op is c.LITERAL:
            out += chr(av)
        elif op is c.RANGE:
            out += chr(av[0]) + chr(av[1])
        elif op is c.CATEGORY:
            out += _CATEGORY_CHARS.get(av, "")
    return "".join(dict.fromkeys(out))[:4]


def _accepted(items: list[tuple[Any, Any]]) -> str:
    pattern = re.compile(p_str([(c.IN, items)]))
    return "".join(ch for ch in _PROBE if pattern.fullmatch(ch))[:4]


def p_str(items: list[tuple[Any, Any]]) -> str:
    """Source text of a one-item character set (enough for ``_accepted``'s probe)."""
    (op, av) = items[0]
    assert op is c.IN
    negate = av and av[0][0] is c.NEGATE
    body = ""
    for iop, iav in av[1:] if negate else av:
        if iop is c.LITERAL:
            body += re.escape(chr(iav))
        elif iop is c.RANGE:
            body += re.escape(chr(iav[0])) + "-" + re.escape(chr(iav[1]))
        elif iop is c.CATEGORY:
            body += {
                c.CATEGORY_DIGIT: r"\d",
                c.CATEGORY_NOT_DIGIT: r"\D",
                c.CATEGORY_SPACE: r"\s",
                c.CATEGORY_NOT_SPACE: r"\S",
                c.CATEGORY_WORD: r"\w",
                c.CATEGORY_NOT_WORD: r"\W",
            }[iav]
    return f"[{'^' if negate else ''}{body}]"


class _Writer:
    """Writes text that a parsed pattern matches, growing one chosen repeat (or all of them)."""

    def __init__(self, target: int | None, length: int, choice: int) -> None:
        self.target = target  # id() of the repeat to grow; None grows every unbounded repeat
        self.length = length
        self.choice = choice  # which of the body's characters to repeat (-1: mix them)
        self.grow_all = 1

    def seq(self, items: Any) -> Iterator[str]:
        for op, av in items:
            yield from self.item(op, av)

    def item(self, op: Any, av: Any) -> Iterator[str]:
        if op is c.LITERAL:
            yield chr(av)
        elif op is c.NOT_LITERAL:
            yield "a" if av != ord("a") else "b"
        elif op is c.ANY:
            yield "a"
        elif op is c.IN:
            chars = _set_chars(av)
            yield chars[0] if chars else ""
        elif op is c.BRANCH:
            alts = av[1]
            chosen = next((a for a in alts if self._holds_target(a)), alts[0])
            yield from self.seq(chosen)
        elif op is c.SUBPATTERN:
            yield from self.seq(av[3])
        elif op is c.ATOMIC_GROUP:
            yield from self.seq(av)
        elif op in _REPEATS:
            yield from self._repeat(av)
        # AT, ASSERT, ASSERT_NOT, GROUPREF...: no text of their own

    def _repeat(self, av: Any) -> Iterator[str]:
        low, high, body = av
        unbounded = high == _UNBOUNDED
        if self.target is None and unbounded:
            yield "".join(self.seq(body)) * max(low, self.grow_all)
        elif self.target is not None and id(body) == self.target:
            yield self._grown(body, low, high)
            raise _Grown
        else:
            count = max(low, 1) if self._holds_target(body) else low
            for _ in range(count):
                yield from self.seq(body)

    def _grown(self, body: Any, low: int, high: int) -> str:
        units = [u for u in self._units(body) if u] or [""]
        if not units[0]:
            return ""
        unit = "".join(units) if self.choice < 0 else units[self.choice % len(units)]
        count = max(low, min(high, self.length // len(unit) + 1))
        return unit * count

    def _units(self, body: Any) -> list[str]:
        """One text of the body per character its first character set accepts."""
        base = "".join(_Writer(None, 0, 0)._quiet(body))
        first = _first_set(body)
        if first is None or not base:
            return [base]
        return [ch + base[1:] for ch in first] or [base]

    def _quiet(self, body: Any) -> Iterator[str]:
        self.grow_all = 0
        yield from self.seq(body)

    def _holds_target(self, items: Any) -> bool:
        return self.target is not None and self.target in _repeat_id_set(items)


class _Grown(Exception):
    """The chosen repeat has been written: the text stops there (a breaker follows)."""


def _first_set(items: Any) -> str | None:
    for op, av in items:
        if op is c.IN:
            return _set_chars(av)
        if op is c.LITERAL:
            return chr(av)
        if op in (c.ANY, c.NOT_LITERAL):
            return "a1 "
        if op is c.SUBPATTERN:
            return _first_set(av[3])
        if op not in (c.AT, c.ASSERT, c.ASSERT_NOT):
            return None
    return None


def _repeat_ids(items: Any) -> list[int]:
    """id() of the body of every unbounded (or long) repeat in a parsed pattern, outermost first."""
    out: list[int] = []
    for op, av in items:
        if op in _REPEATS:
            if av[1] == _UNBOUNDED or av[1] > 64:
                out.append(id(av[2]))
            out.extend(_repeat_ids(av[2]))
        elif op is c.BRANCH:
            for alt in av[1]:
                out.extend(_repeat_ids(alt))
        elif op is c.SUBPATTERN:
            out.extend(_repeat_ids(av[3]))
        elif op in (c.ATOMIC_GROUP,):
            out.extend(_repeat_ids(av))
        elif op in (c.ASSERT, c.ASSERT_NOT):
            out.extend(_repeat_ids(av[1]))
    return out


_ID_SETS: dict[int, tuple[Any, frozenset[int]]] = {}


def _repeat_id_set(items: Any) -> frozenset[int]:
    """``_repeat_ids`` as a set, kept per parsed sub-pattern (the items are kept alive with it)."""
    found = _ID_SETS.get(id(items))
    if found is None or found[0] is not items:
        found = _ID_SETS[id(items)] = (items, frozenset(_repeat_ids(items)))
    return found[1]


def _write(parsed: Any, target: int | None, length: int, choice: int) -> str:
    writer = _Writer(target, length, choice)
    out: list[str] = []
    try:
        for piece in writer.seq(parsed):
            out.append(piece)
    except _Grown:
        pass
    return "".join(out)


def _grow_all(parsed: Any, length: int) -> str:
    """Every unbounded repeat written as often as fits ``length`` (nested repeats multiply)."""
    count, text = 1, _write_all(parsed, 1)
    while len(text) < length and count < length:
        count *= 2
        text = _write_all(parsed, count)
    return text[: length + 64]


def _write_all(parsed: Any, count: int) -> str:
    writer = _Writer(None, 0, 0)
    writer.grow_all = count
    return "".join(writer.seq(parsed))


def _parsed(pattern: re.Pattern[Any]) -> Any:
    """The parse tree of a str or bytes pattern (a bytes one read as Latin-1 text, byte for byte)."""
    source = pattern.pattern
    return p.parse(source if isinstance(source, str) else source.decode("latin-1"), pattern.flags)


def has_unbounded_repeat(pattern: re.Pattern[Any]) -> bool:
    """True when the pattern repeats something without bound (a bounded repeat may write less than
    half the wanted length, and then has no case of its own)."""
    return _unbounded(_parsed(pattern).data)


def _unbounded(items: Any) -> bool:
    for op, av in items:
        if op in _REPEATS and (av[1] == _UNBOUNDED or _unbounded(av[2])):
            return True
        if op is c.BRANCH and any(_unbounded(alt) for alt in av[1]):
            return True
        if op is c.SUBPATTERN and _unbounded(av[3]):
            return True
        if op is c.ATOMIC_GROUP and _unbounded(av):
            return True
    return False


def worst_cases(pattern: re.Pattern[Any], length: int) -> Iterator[tuple[str, str]]:
    """(name, text) pairs of about ``length`` characters that ``pattern`` nearly matches."""
    parsed = _parsed(pattern)
    seen: set[str] = set()
    for n, target in enumerate(_repeat_ids(parsed.data)):
        for choice in (-1, 0, 1, 2, 3):
            grown = _write(parsed.data, target, length, choice)
            if len(grown) < length // 2:
                continue  # a repeat whose body writes nothing (an empty unit)
            for breaker in BREAKERS:
                text = grown + breaker
                if text not in seen:
                    seen.add(text)
                    yield f"repeat {n} unit {choice} then {breaker!r}", text
    grown = _grow_all(parsed.data, length)
    for breaker in BREAKERS:
        text = grown + breaker
        if len(grown) >= length // 2 and text not in seen:
            seen.add(text)
            yield f"all repeats then {breaker!r}", text


_USE = re.compile(
    r"\b(?P<name>_?[A-Za-z_][A-Za-z0-9_]*)\.(?P<how>match|fullmatch|search|finditer|findall|sub|subn|split)\("
)
# How a pattern is applied -> the Pattern method that costs the same (every finditer step is a search).
_HOW = {"match": "match", "fullmatch": "fullmatch", "search": "search"}


def package_patterns(root: Path) -> Iterator[tuple[str, re.Pattern[Any], str]]:
    """(where, pattern, method) for every compiled pattern of the package at ``root``, with each way
    the package's source applies it (a pattern held in a class or passed around: 'search', the
    costliest)."""
    uses: dict[tuple[str, str], set[str]] = {}
    for path in sorted(root.rglob("*.py")):
        for m in _USE.finditer(path.read_text(encoding="utf-8")):
            how = _HOW.get(m.group("how"), "search")
            uses.setdefault((str(path), m.group("name")), set()).add(how)
            uses.setdefault(("", m.group("name")), set()).add(how)
    seen: set[int] = set()
    for path in sorted(root.rglob("*.py")):
        if path.name == "__main__.py":
            continue
        module = importlib.import_module(
            ".".join(path.relative_to(root.parent).with_suffix("").parts).removesuffix(".__init__")
        )
        holders: list[tuple[str, Mapping[str, Any]]] = [(module.__name__, vars(module))]
        holders += [
            (f"{module.__name__}.{k}", vars(v))
            for k, v in vars(module).items()
            if isinstance(v, type) and v.__module__ == module.__name__
        ]
        for where, names in holders:
            for name, value in names.items():
                if isinstance(value, re.Pattern) and id(value) not in seen:
                    seen.add(id(value))
                    how_used = uses.get((str(path), name)) or uses.get(("", name)) or {"search"}
                    for how in sorted(how_used):
                        yield f"{where}.{name}", value, how
