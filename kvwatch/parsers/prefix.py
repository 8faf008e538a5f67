"""Prefix stripping: one raw log line -> (message body, LineMeta).

Engine lines reach kvwatch wrapped in layers that differ by deployment and release: container
runtimes add RFC3339 stamps (Docker ``--timestamps``, Kubernetes, the CRI ``... stdout F`` form),
log shippers wrap the line in JSON, Ray and vLLM's multiprocess executors prefix the process
(``(EngineCore_DP0 pid=1)``, ``(Worker_TP1 pid=2)``, ``(pid=3, ip=10.0.0.1)``), torch prefixes
``[rank0]:``, vLLM prints its own ``INFO 06-05 10:00:00 [file.py:12]`` and SGLang its
``[2025-01-01 10:00:00 DP0 TP0]``; launchers re-emit the message with the file:line moved to the end.
Layers are peeled from the left in a loop, so any nesting order works. What the layers say about
the printing process goes into LineMeta: ``instance`` is the data-parallel rank / V1 engine index,
``rank`` the TP (or worker) rank. Pure: no I/O, no clock.
"""

from __future__ import annotations

import json
import re
from typing import Any

from kvwatch.parsers.base import LineMeta

# --- the prefix grammar -------------------------------------------------------------------------
# Each layer below is written once, as a tuple of atoms in syntax both stdlib ``re`` and ``regex``
# read. This module compiles them (Unicode, one layer at a time, in _peel's loop); the engines'
# whole-line fast paths compose the same atoms into one bytes pattern with ``fast_prefix`` (ANSI
# escapes allowed between atoms, ASCII lines only). tests/test_prefix_grammar.py holds the two
# readings equal.
Atoms = tuple[str, ...]

# ANSI SGR and other CSI sequences (vLLM always coloured its process prefix up to 0.11.2).
ANSI_TEXT = r"\x1b\[[0-9;?]*[A-Za-z]"

# Container runtimes: '2026-05-12T08:01:39.331095044Z ' (docker --timestamps, kubectl --timestamps)
# optionally followed by the CRI stream and tag: '... stdout F ' (containerd/cri-o log files).
CONTAINER: Atoms = (
    r"(?P<ts>\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:[.,]\d+)?(?:Z|[+-]\d{2}:?\d{2})?)\s+"
    r"(?:(?:stdout|stderr)\s+[FP]\s)?",
)

# Process prefixes: vLLM '(EngineCore_DP0 pid=5012)', '(VllmWorker rank=0 pid=4312)',
# '(VllmWorker PP0_TP1 pid=7)', '(Worker_DP0_TP0_EP0 pid=8)', '(VllmWorkerProcess pid=6496)',
# '(APIServer pid=4801)'; Ray '(pid=123, ip=10.0.0.1)', '(RayWorkerWrapper pid=9, ip=10.0.0.2)',
# SGLang under Ray '(SchedulerActor pid=123, ip=10.0.0.1)'.
PROCESS: Atoms = (
    r"\((?:(?P<name>[A-Za-z_][\w.\-]*(?: [\w=]+)*) )?pid=\d+(?:,\s*ip=[^)\s]+)?\)",
    r"\s?",
)

# vLLM's own level prefix: '<= 0.7.3: INFO 06-05 10:00:00 gpu_executor.py:122] ', 0.8+: with '[' and
# at DEBUG a path; ColoredFormatter output (0.11+ colours each part) is plain once ANSI is gone.
# Continuation lines of a multi-line record repeat it and may be empty after it.
VLLM_LEVEL: Atoms = (
    r"(?P<level>DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL)",
    " ",
    r"(?P<ts>\d{2}-\d{2} \d{2}:\d{2}:\d{2}(?:[.,]\d+)?)",
    " ",
    r"\[?[^\s\]]+:\d+\]",
    r"(?: |$)",
)

# SGLang: '[2025-01-01 10:00:00 DP0 TP0] ', '[16:43:29 TP0] ' (0.2.x time only), '[ts.mmm ATTN_CP0 TP0] '.
# Launchers using Python's default '%(asctime)s' look the same with ',mmm'.
SGLANG: Atoms = (
    r"\[(?P<ts>(?:\d{4}-\d{2}-\d{2} )?\d{2}:\d{2}:\d{2}(?:[.,]\d{3,6})?)"
    r"(?P<tags>(?: [A-Z]+(?:_[A-Z]+)*\d+)*+)\]",
    r"(?::)?",
    r"(?: |$)",
)

_GROUP = re.compile(r"\(\?P<(\w++)>")


def layer(atoms: Atoms, between: str = "", group_prefix: str = "") -> str:
    """One layer's pattern text: its atoms joined by ``between``, its groups renamed ``group_prefix + name``."""
    text = between.join(atoms)
    if group_prefix:
        text = _GROUP.sub(lambda m: f"(?P<{group_prefix}{m.group(1)}>", text)
    return text


# Processes a fast path reads before the engine's own prefix (a Ray actor's, then vLLM's).
FAST_PROCESSES = 2


def fast_prefix(engine_layer: Atoms) -> str:
    """Pattern text, for a bytes pattern, of the prefixes ``strip_prefixes`` reads most often in front
    of ``engine_layer``: ANSI escapes, an optional container stamp (``cts``), up to two process
    prefixes (``p1name``, ``p2name``), then the engine's layer (its own group names).

    Only ASCII lines without control characters other than TAB, CR and ESC can match (on those the
    bytes and Unicode readings of every class agree), ANSI escapes only between atoms (where
    removing them, as strip_prefixes does first, leaves exactly the layers' text). Where this
    matches, strip_prefixes peels the same layers in the same order, into the same groups.
    """
    a = f"(?:{ANSI_TEXT})*+"  # possessive: adjacent runs of escapes must not share them (linear)
    processes = "".join(f"(?:{layer(PROCESS, a, f'p{i}')}{a})?" for i in range(1, FAST_PROCESSES + 1))
    return (
        r"(?=[\t\r\x1b\x20-\x7e]*$)"
        + a
        + f"(?:{layer(CONTAINER, a, 'c')}{a})?"
        + processes
        + layer(engine_layer, a)
        + a
    )


def fast_identity(p1name: str | None, p2name: str | None, tags: str = "") -> tuple[str | None, int | None]:
    """(instance, rank) that the process names of a ``fast_prefix`` match give, as _peel reads them;
    ``tags``: the SGLANG layer's tags (' DP0 TP1'), read after the processes, as _peel reads them."""
    meta = _Meta()
    for name in (p1name, p2name):
        if name:
            _process_name(name, meta)
    if tags:
        _sglang_tags(tags, meta)
    return meta.instance, meta.rank


_ANSI = re.compile(ANSI_TEXT)
_RFC3339 = re.compile(layer(CONTAINER))

# kubectl logs --prefix: '[pod/vllm-0/vllm] '.
_KUBECTL = re.compile(r"\[pod/[^\]\s]+\]\s")

# syslog / journald short format: 'Nov 30 10:00:00 host vllm[123]: '.
_SYSLOG = re.compile(r"(?P<ts>[A-Z][a-z]{2} [ \d]\d \d{2}:\d{2}:\d{2}) [\w.\-]+ [\w.\-/@]+(?:\[\d+\])?: ")

_PROCESS = re.compile(layer(PROCESS))

# torch.distributed elastic: '[rank0]: '.
_TORCH_RANK = re.compile(r"\[rank(?P<rank>\d+)\]:\s?")

_VLLM_LEVEL = re.compile(layer(VLLM_LEVEL))

# The shape of nearly every line of a vLLM server log, process prefix and level prefix in one match
# (stdlib re: this runs on every claimed line and is faster than the general loop, which would
# peel the same two layers).
_VLLM_COMMON = re.compile(f"(?:{layer(PROCESS)})?{layer(VLLM_LEVEL)}")

# A bare '[file.py:123] ' left when a user stripped only the level and time.
_FILE_LINE = re.compile(r"\[[\w./\-]+\.py:\d+\](?: |$)")

_SGLANG = re.compile(layer(SGLANG))
# (finditer: the lookbehind keeps an attempt from starting again inside a run an earlier one read.)
_SGLANG_TAG = re.compile(r"(?<![A-Z_])(?P<kind>[A-Z]++(?:_[A-Z]++)*+)(?P<n>\d++)")

# Launcher level brackets after a timestamp: lighteval '[    INFO]: ', Python 'name - INFO - ',
# logging.basicConfig 'INFO:vllm.engine:'.
_LAUNCHER_LEVEL = re.compile(
    r"(?:\[\s*(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL)\s*\]:?"
    r"|(?:- )?[\w.]+ - (?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL) -"
    r"|(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL):[A-Za-z_][\w.]*:)\s?"
)

# Bare timestamps: '2025-03-27 14:19:15,991 ' (Python logging asctime) and time-only '10:00:00 '.
_PLAIN_TS = re.compile(r"(?P<ts>(?:\d{4}-\d{2}-\d{2} )?\d{2}:\d{2}:\d{2}(?:[.,]\d+)?)(?: - | \| | )")

# Launchers that move the location to the end: '... per request: 66.08x (executor_base.py:115)'.
# (search, as in _RAY_REPEATED: one attempt per run of blanks, not one per blank.)
_TRAILING_LOCATION = re.compile(r"(?<!\s)\s++\([\w./\-]+\.py:\d++\)\s*+$")

# Ray log deduplication: '... [repeated 7x across cluster]' (+ an explanation the first time).
# (search: the lookbehind fails at once inside a run of blanks, which the attempt at its start has
# read to the end; the match still starts where the blanks do.)
_RAY_REPEATED = re.compile(r"(?<!\s)\s*+\[repeated (?P<n>\d++)x across cluster\].*$")

# A known timestamped prefix somewhere inside the line, for lines pasted with junk glued in front
# ('[Bug] [2026-06-28 15:16:45] ...', '@c:\\path\\file.txt [2026-08-23 09:05:37 TP0 EP0] ...').
_EMBEDDED = re.compile(
    r"(?:(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \d{2}-\d{2} \d{2}:\d{2}:\d{2} \[?[^\s\]]+:\d+\] "
    r"|\[(?:\d{4}-\d{2}-\d{2} )?\d{2}:\d{2}:\d{2}(?:[.,]\d{3,6})?(?: [A-Z]+(?:_[A-Z]+)*\d+)*+\] "
    r"|\((?:[A-Za-z_][\w.\-]*(?: [\w=]+)* )?pid=\d+(?:,\s*ip=[^)\s]+)?\) )"
)

_LEVELS = ("DEBUG", "INFO", "WARN", "ERROR", "CRITICAL")
_MONTHS = frozenset(("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"))
_MAX_LAYERS = 12
_JSON_MESSAGE_KEYS = ("message", "msg", "log")


class _Meta:
    """Mutable accumulator used while peeling one line."""

    __slots__ = ("instance", "rank", "ts", "repeated")

    def __init__(self) -> None:
        self.instance: str | None = None
        self.rank: int | None = None
        self.ts: str | None = None
        self.repeated = 1

    def freeze(self) -> LineMeta:
        return LineMeta(
            instance=self.instance if self.instance is not None else "0",
            rank=self.rank,
            ts=self.ts,
            repeated=self.repeated,
        )


def _process_name(name: str, meta: _Meta) -> None:
    """Read the engine instance and worker rank out of a process name.

    'EngineCore_DP1' / 'EngineCore_1' (0.8.5-0.10.1) / 'Worker_DP1_TP0' carry the instance; 'TP3',
    'rank=3' the rank. The outermost prefix owns the instance (an engine core that forwards a Ray
    worker's line knows which engine it is); the innermost names the rank.
    """
    instance: str | None = None
    rank: int | None = None
    for part in name.replace("_", " ").split():
        if part.startswith("DP") and part[2:].isdigit():
            instance = str(int(part[2:]))
        elif part.startswith("TP") and part[2:].isdigit():
            rank = int(part[2:])
        elif part.startswith("rank=") and part[5:].isdigit():
            rank = int(part[5:])
        elif part.isdigit() and name.startswith("EngineCore_"):
            instance = str(int(part))
    if instance is not None and meta.instance is None:
        meta.instance = instance
    if rank is not None:
        meta.rank = rank


def _sglang_tags(tags: str, meta: _Meta) -> None:
    for m in _SGLANG_TAG.finditer(tags):
        kind, n = m.group("kind"), int(m.group("n"))
        if kind == "DP" and meta.instance is None:
            meta.instance = str(n)
        elif kind == "TP":
            meta.rank = n


def _json_body(line: str, meta: _Meta) -> str | None:
    """The message of a JSON log record (vLLM's json formatter, Docker json-file, shippers)."""
    try:
        record: Any = json.loads(line)
    except ValueError:
        return None
    if not isinstance(record, dict):
        return None
    for key in _JSON_MESSAGE_KEYS:
        value = record.get(key)
        if isinstance(value, str):
            break
    else:
        return None
    process = record.get("processName")
    if isinstance(process, str):
        _process_name(process, meta)
    for ts_key in ("asctime", "time", "timestamp", "@timestamp"):
        ts = record.get(ts_key)
        if isinstance(ts, str):
            meta.ts = ts
            break
    return value.rstrip("\r\n")


def _peel(text: str, meta: _Meta) -> str:
    """Remove every known wrapper from the left of ``text`` (and the known suffixes)."""
    for _ in range(_MAX_LAYERS):
        if not text:
            return text
        first = text[0]
        m: re.Match[str] | None = None
        if first == "{":
            body = _json_body(text, meta)
            if body is None:
                break
            text = body
            continue
        if first == "(":
            m = _PROCESS.match(text)
            if m is not None:
                name = m.group("name")
                if name:
                    _process_name(name, meta)
                text = text[m.end() :]
                continue
            break
        if first == "[":
            m = _SGLANG.match(text)
            if m is not None:
                meta.ts = m.group("ts")
                _sglang_tags(m.group("tags"), meta)
                text = text[m.end() :]
                continue
            m = _TORCH_RANK.match(text)
            if m is not None:
                meta.rank = int(m.group("rank"))
                text = text[m.end() :]
                continue
            m = _KUBECTL.match(text) or _LAUNCHER_LEVEL.match(text) or _FILE_LINE.match(text)
            if m is not None:
                text = text[m.end() :]
                continue
            break
        if first.isdigit():
            m = _RFC3339.match(text) or _PLAIN_TS.match(text)
            if m is not None:
                meta.ts = m.group("ts")
                text = text[m.end() :]
                continue
            break
        if first in "DIWEC" and text.startswith(_LEVELS):
            m = _VLLM_LEVEL.match(text) or _LAUNCHER_LEVEL.match(text)
            if m is not None:
                if "ts" in m.re.groupindex:
                    meta.ts = m.group("ts")
                text = text[m.end() :]
                continue
            break
        if first in "JFMASOND" and text[3:4] == " " and text[:3] in _MONTHS:
            m = _SYSLOG.match(text)
            if m is not None:
                meta.ts = m.group("ts")
                text = text[m.end() :]
                continue
            break
        if (first == "-" or first.isalpha()) and " - " in text[:80]:
            m = _LAUNCHER_LEVEL.match(text)
            if m is not None:
                text = text[m.end() :]
                continue
        break
    return text


def strip_prefixes(line: str) -> tuple[str, LineMeta]:
    """Split one physical line into its message body and what its prefixes say about the printer.

    The line may still carry its terminator; a trailing CR (vLLM's multi-line records are CRLF
    separated) is removed. Never raises.
    """
    text = line.rstrip("\r\n")
    if "\x1b" in text:
        text = _ANSI.sub("", text)
    meta = _Meta()
    if text[:1] in ("(", "D", "I", "W", "E", "C"):
        common = _VLLM_COMMON.match(text)
        if common is not None:
            name = common.group("name")
            if name:
                _process_name(name, meta)
            meta.ts = common.group("ts")
            text = text[common.end() :]
    text = _peel(text, meta)
    if "[repeated " in text:
        m = _RAY_REPEATED.search(text)
        if m is not None:
            meta.repeated = int(m.group("n"))
            text = text[: m.start()]
    if text and text[-1] == ")" and ".py:" in text:
        m = _TRAILING_LOCATION.search(text)
        if m is not None:
            text = text[: m.start()]
    return text, meta.freeze()


def strip_embedded(body: str, meta: LineMeta) -> tuple[str, LineMeta] | None:
    """Second chance for a line with junk glued before a real prefix.

    Returns the text after the first timestamped/process prefix found inside ``body`` (peeled like a
    fresh line) or None when there is none. The pipeline calls it only for anchor lines whose body
    does not start like a message or that no pattern claimed, so a clean line never pays for it.
    """
    m = _EMBEDDED.search(body, 1)
    if m is None:
        return None
    rest, inner = strip_prefixes(body[m.start() :])
    instance = inner.instance if inner.instance != "0" else meta.instance
    rank = inner.rank if inner.rank is not None else meta.rank
    return rest, LineMeta(
        instance=instance,
        rank=rank,
        ts=inner.ts or meta.ts,
        repeated=max(inner.repeated, meta.repeated),
    )
