"""One prefix grammar: strip_prefixes and the engines' fast paths read the same layer definitions.

prefix.py writes each layer once (CONTAINER, PROCESS, VLLM_LEVEL, SGLANG); it compiles them for
strip_prefixes and ``fast_prefix`` composes them for the fast paths. Here: the compiled patterns
are those layers, and on lines built from any stack of the layers (ANSI colour, Docker and CRI
stamps, Ray and vLLM process prefixes, vLLM's level prefix, damage) the fast path answers the
clean shapes and always agrees with prefix peeling + the general parser.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from lanes import examples

from kvwatch.core.events import Event, event_to_json
from kvwatch.engines.vllm import fastpath, log
from kvwatch.parsers import prefix
from kvwatch.parsers.base import ParseError
from kvwatch.parsers.prefix import strip_prefixes

STATS = (
    "Engine 001: Avg prompt throughput: 1.5 tokens/s, Avg generation throughput: 2.0 tokens/s, "
    "Running: 3 reqs, Waiting: 4 reqs, Preemptions: 5, GPU KV cache usage: 6.1%, Prefix cache hit rate: 7.0%"
)
V0_STATS = (
    "Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: 41.7 tokens/s, Running: 1 reqs, "
    "Swapped: 0 reqs, Pending: 0 reqs, GPU KV cache usage: 2.0%, CPU KV cache usage: 0.0%."
)
ANSI = ["", "\x1b[0m", "\x1b[1;36m", "\x1b[90m"]
CONTAINERS = [
    "",
    "2026-03-17T15:00:10.123456789Z ",
    "2024-01-01T00:00:00.000000000Z stdout F ",
    "2026-03-17T15:00:10+02:00 ",
]
PROCESSES = [
    "",
    "(APIServer pid=7)",
    "(EngineCore_DP1 pid=8)",
    "(RayWorkerWrapper pid=9, ip=10.0.0.2)",
    "(pid=3, ip=10.0.0.1)",
    "(VllmWorker rank=2 pid=4)",
    "(Worker_DP1_TP3 pid=5)",
]
PROPS = settings(max_examples=examples(600), deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _fast(line: str) -> tuple[Event, ...] | None:
    raw = line.encode("utf-8", "surrogatepass")
    return None if b"\n" in raw else fastpath.parse_lines([raw])[0]


def _json(events: tuple[Event, ...]) -> list[str]:
    return [event_to_json(e) for e in events]


def test_compiled_patterns_are_the_layers() -> None:
    assert prefix._RFC3339.pattern == prefix.layer(prefix.CONTAINER)
    assert prefix._PROCESS.pattern == prefix.layer(prefix.PROCESS)
    assert prefix._VLLM_LEVEL.pattern == prefix.layer(prefix.VLLM_LEVEL)
    assert prefix._SGLANG.pattern == prefix.layer(prefix.SGLANG)
    assert prefix._ANSI.pattern == prefix.ANSI_TEXT
    fast = fastpath._FAST_STATS_LINES.pattern.decode()
    for atoms in (prefix.CONTAINER, prefix.PROCESS, prefix.VLLM_LEVEL):
        for atom in atoms:
            assert (
                prefix.layer((atom,), group_prefix="c") in fast
                or prefix.layer((atom,), group_prefix="p1") in fast
                or atom in fast
            )


@st.composite
def layered_line(draw: st.DrawFn) -> tuple[str, bool]:
    """A stats line behind a random stack of layers; True when nothing was damaged."""

    def a() -> str:
        return draw(st.sampled_from(ANSI))

    parts = [a(), draw(st.sampled_from(CONTAINERS)), a()]
    for _ in range(draw(st.integers(0, 2))):
        name = draw(st.sampled_from(PROCESSES))
        if name:
            parts += [name, a(), " ", a()]
    level = draw(st.sampled_from(["INFO", "DEBUG", "WARNING"]))
    ts = draw(st.sampled_from(["03-17 15:00:10", "03-17 15:00:10.123"]))
    location = draw(st.sampled_from(["[loggers.py:259]", "metrics.py:341]", "[v1/metrics/loggers.py:12]"]))
    parts += [level, a(), " ", a(), ts, a(), " ", a(), location, a(), " ", a()]
    parts.append(draw(st.sampled_from([STATS, V0_STATS])))
    line = "".join(parts)
    clean = True
    for _ in range(draw(st.integers(0, 2))):
        at = draw(st.integers(0, len(line)))
        noise = draw(
            st.sampled_from(["", " ", "\x1b[0m", "\x1b", "٣", "x", "(", ")", "\t", "\x1c", "]", "é"])
        )
        cut = draw(st.integers(0, 1))
        line = line[:at] + noise + line[at + cut :]
        clean = False
    return line, clean


@PROPS
@given(layered_line())
def test_fast_path_agrees_with_prefix_peeling(case: tuple[str, bool]) -> None:
    line, clean = case
    fast = _fast(line)
    try:
        general = log.parse(*strip_prefixes(line))
    except ParseError:
        assert fast is None  # the general path counts a parse error; the fast path must not answer
        return
    if clean:
        assert fast is not None, repr(line)
    if fast is not None:
        assert fast == general
        assert _json(fast) == _json(general)
        for a, b in zip(fast, general, strict=True):
            assert list(a.__dict__.items()) == list(b.__dict__.items())
            assert a.model_fields_set == b.model_fields_set
