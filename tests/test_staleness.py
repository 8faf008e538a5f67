"""Facts kept in their meaning: per-fact staleness, rejected values, pre-created counters,
headroom for metrics-only sources, and the sidecar's own process_*/python_* series (issue 13)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families
from waiting import wait_until

from kvwatch.analysis.predictor import Predictor
from kvwatch.core.events import UsageSample
from kvwatch.export import names
from kvwatch.export.collector import KvwatchCollector
from kvwatch.sidecar.app import Sidecar
from kvwatch.sources.pipeline import LinePipeline
from kvwatch.state.fleet import DISAGREEMENT_FACTS, Fleet

TESTS = Path(__file__).parent
LLAMA_8B = TESTS / "model_configs" / "meta-llama--Meta-Llama-3.1-8B.json"
QWEN_7B = TESTS / "model_configs" / "Qwen--Qwen2.5-7B.json"
STARTUP = (
    (TESTS / "log_samples" / "vllm" / "001-llama31-8b-rtx3090-profiling-20k.log").read_text().splitlines()
)
# A real V1 stats line (tests/log_samples/vllm/007-...), and the same line with a usage past 100 %.
STATS = (
    "(APIServer pid=11574) INFO 03-17 15:38:30 [loggers.py:259] Engine 000: Avg prompt throughput: "
    "23999.8 tokens/s, Avg generation throughput: 52.6 tokens/s, Running: 22 reqs, Waiting: 78 reqs, "
    "GPU KV cache usage: 42.5%, Prefix cache hit rate: 0.0%"
)
LAB = {"source": "v", "dp_rank": "0"}


class _Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


def _registry(fleet: Fleet, model_config: Path = LLAMA_8B) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(KvwatchCollector(fleet.snapshot, Predictor(model_config=lambda source: model_config)))
    return registry


def _get(reg: CollectorRegistry, metric: names.Metric, **labels: str) -> float | None:
    for family in reg.collect():
        for sample in family.samples:
            if sample.name == metric.sample_name and all(
                sample.labels.get(k) == v for k, v in labels.items()
            ):
                return float(sample.value)
    return None


def _feed(fleet: Fleet, lines: list[str]) -> None:
    pipeline = LinePipeline("v", fleet, "auto")
    for line in lines:
        pipeline.feed(line)


def test_a_log_that_stops_carrying_stats_goes_stale_and_stops_being_exported() -> None:
    clock = _Clock()
    fleet = Fleet(clock=clock, fact_ttl=60)
    _feed(fleet, [*STARTUP, STATS])
    reg = _registry(fleet)
    assert _get(reg, names.KV_USAGE_RATIO, **LAB) == pytest.approx(0.425)
    assert _get(reg, names.FACTS_STALE, **LAB, origin="log", fact="kv_usage_ratio") == 0
    clock.now += 59
    assert _get(reg, names.KV_USAGE_RATIO, **LAB) == pytest.approx(0.425)
    clock.now += 2  # past the TTL, with no event in between
    for metric in (names.KV_USAGE_RATIO, names.KV_USED_TOKENS, names.KV_HEADROOM_TOKENS,
                   names.KV_HEADROOM_REQUESTS, names.REQUESTS_RUNNING, names.REQUESTS_WAITING):  # fmt: skip
        assert _get(reg, metric, **LAB) is None, metric.name
    for fact in ("kv_usage_ratio", "running", "waiting"):
        assert _get(reg, names.FACTS_STALE, **LAB, origin="log", fact=fact) == 1
    # The pool the log printed at startup is a once-printed fact: still exported.
    assert _get(reg, names.KV_POOL_TOKENS, **LAB) == 1952 * 16
    # A new stats line makes the facts fresh again.
    _feed(fleet, [STATS])
    assert _get(reg, names.KV_USAGE_RATIO, **LAB) == pytest.approx(0.425)
    assert _get(reg, names.FACTS_STALE, **LAB, origin="log", fact="kv_usage_ratio") == 0


def test_a_fact_that_vanished_from_metrics_goes_stale_while_the_others_stay() -> None:
    clock = _Clock()
    fleet = Fleet(clock=clock, fact_ttl=30)
    both = UsageSample(engine="vllm", instance="0", origin="metrics", kv_usage_ratio=0.4, running=3)
    fleet.apply("v", both)
    for _ in range(10):  # /metrics renamed its KV series: scrapes keep bringing the other facts
        clock.now += 5
        fleet.apply("v", UsageSample(engine="vllm", instance="0", origin="metrics", running=3))
    reg = _registry(fleet)
    assert _get(reg, names.KV_USAGE_RATIO, **LAB) is None
    assert _get(reg, names.REQUESTS_RUNNING, **LAB) == 3
    assert _get(reg, names.FACTS_STALE, **LAB, origin="metrics", fact="kv_usage_ratio") == 1
    assert _get(reg, names.FACTS_STALE, **LAB, origin="metrics", fact="running") == 0


def test_an_unwatched_fact_that_goes_stale_without_an_event_leaves_the_next_scrape() -> None:
    """The collector's cached rows of an instance with no new event still drop a usage fact past
    its TTL when it is not one whose staleness is flagged (the flags alone did not change)."""
    clock = _Clock()
    fleet = Fleet(clock=clock, fact_ttl=30)
    fleet.apply(
        "v",
        UsageSample(
            engine="vllm", instance="0", origin="metrics", kv_usage_ratio=0.4, running=3,
            prefix_cache_hit_ratio=0.5,
        ),
    )  # fmt: skip
    clock.now += 20  # the next scrapes no longer carry the prefix-cache rate
    fleet.apply(
        "v", UsageSample(engine="vllm", instance="0", origin="metrics", kv_usage_ratio=0.4, running=3)
    )
    reg = _registry(fleet)
    assert _get(reg, names.PREFIX_CACHE_HIT_RATIO, **LAB) == 0.5
    clock.now += 15  # past the rate's TTL, not the others': no event, no stale flag changes
    assert _get(reg, names.PREFIX_CACHE_HIT_RATIO, **LAB) is None
    assert _get(reg, names.KV_USAGE_RATIO, **LAB) == pytest.approx(0.4)
    assert _get(reg, names.FACTS_STALE, **LAB, origin="metrics", fact="kv_usage_ratio") == 0


def test_a_usage_outside_zero_to_one_is_rejected_and_counted() -> None:
    fleet = Fleet(clock=_Clock())
    _feed(fleet, [*STARTUP, STATS, STATS.replace("42.5%", "193.0%")])
    reg = _registry(fleet)
    # The last good value stays; the bad one is counted, never exported as 1.93.
    assert _get(reg, names.KV_USAGE_RATIO, **LAB) == pytest.approx(0.425)
    assert _get(reg, names.BAD_VALUES, **LAB, fact="kv_usage_ratio") == 1
    assert _get(reg, names.BAD_VALUES, **LAB, fact="running") == 0
    assert _get(reg, names.REQUESTS_RUNNING, **LAB) == 22  # the line's other facts are kept


def test_disagreement_counters_exist_at_zero_before_the_first_disagreement() -> None:
    fleet = Fleet(clock=_Clock())
    _feed(fleet, [*STARTUP, STATS])
    reg = _registry(fleet)
    for fact in DISAGREEMENT_FACTS:
        assert _get(reg, names.DISAGREEMENTS, **LAB, fact=fact) == 0, fact


class _Engine:
    """An engine /metrics endpoint on 127.0.0.1 serving whatever text the test sets."""

    def __init__(self, text: str) -> None:
        import http.server
        import threading

        engine = self
        self.text = text

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = engine.text.encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/metrics"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _page(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    import urllib.request

    with urllib.request.urlopen(url, timeout=5) as resp:
        text = resp.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): float(s.value)
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }


def _find(
    page: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str
) -> float | None:
    for (n, lab), value in page.items():
        if n == name and labels.items() <= dict(lab).items():
            return value
    return None


def test_metrics_only_source_headroom_staleness_and_own_process_metrics(
    sidecar_factory: Callable[..., Sidecar],
) -> None:
    text = (TESTS / "metrics_fixtures" / "vllm-0.10.1-v1.txt").read_text()
    engine = _Engine(text)
    try:
        car = sidecar_factory(metrics_url=[f"e={engine.url}"], model_config=[str(QWEN_7B)], scrape_interval=0.1,
                      fact_ttl=1.0)  # fmt: skip
        lab = {"source": "e", "dp_rank": "0", "model_name": "Qwen/Qwen2.5-7B-Instruct"}
        url = car.url
        deadline = time.monotonic() + 15
        page = _page(url)
        while _find(page, "kvwatch_kv_headroom_requests", **lab) is None and time.monotonic() < deadline:
            time.sleep(0.1)
            page = _page(url)
        # /metrics gives no max_model_len: the model's default context from its config.json does.
        pool, used = 27153 * 16, round(0.412 * 27153 * 16)
        assert _find(page, "kvwatch_kv_headroom_requests", **lab) == (pool - used) // 131072
        assert _find(page, "process_cpu_seconds_total") is not None
        assert _find(page, "process_resident_memory_bytes") is not None
        assert _find(page, "python_info") is not None
        assert _find(page, "kvwatch_log_metrics_disagreements_total", **lab, fact="kv_usage_ratio") == 0
        # The engine renames its KV usage series and keeps the others: kv usage goes stale.
        engine.text = text.replace("vllm:gpu_cache_usage_perc", "vllm:renamed_a").replace(
            "vllm:kv_cache_usage_perc", "vllm:renamed_b"
        )
        while time.monotonic() < deadline:
            page = _page(url)
            if _find(page, "kvwatch_source_facts_stale", **lab, origin="metrics", fact="kv_usage_ratio") == 1:
                break
            time.sleep(0.1)
        assert _find(page, "kvwatch_source_facts_stale", **lab, origin="metrics", fact="kv_usage_ratio") == 1
        assert _find(page, "kvwatch_kv_usage_ratio", **lab) is None
        assert _find(page, "kvwatch_kv_headroom_requests", **lab) is None
        assert _find(page, "kvwatch_source_facts_stale", **lab, origin="metrics", fact="running") == 0
        assert _find(page, "kvwatch_requests_running", **lab) is not None
    finally:
        engine.close()


# --- Issue 21: staleness by kind of fact -----------------------------------------------------------

# An access line vLLM writes for every request: the log grows although no stats line comes.
ACCESS = '(APIServer pid=11574) INFO:     127.0.0.1:40312 - "POST /v1/completions HTTP/1.1" 200 OK'


def _stale_series(car: Sidecar) -> dict[tuple[str, str], float]:
    body, _ = car.render_metrics("text/plain")
    return {
        (s.labels["origin"], s.labels["fact"]): float(s.value)
        for family in text_string_to_metric_families(body.decode())
        for s in family.samples
        if s.name == names.FACTS_STALE.sample_name
    }


def test_a_live_log_with_fact_ttl_5_has_no_stale_fact_until_its_stats_lines_stop(tmp_path: Path) -> None:
    """The engine prints its start once, then a stats line every 2 s for a minute: with --fact-ttl 5
    nothing is stale (the pool, budget and settings were printed once and are never stale while the
    log is read); when the stats lines stop while the log keeps growing, the periodic facts go stale
    and the pool is still exported."""
    from kvwatch.sidecar.config import load_settings

    clock = _Clock()
    log = tmp_path / "vllm.log"
    log.write_text("\n".join(STARTUP) + "\n", encoding="utf-8")
    settings = load_settings(
        {"log": [f"v={log}"], "model_config": str(LLAMA_8B), "listen": "127.0.0.1:0", "fact_ttl": 5},
        environ={},
    )
    car = Sidecar(settings, environ={"HOME": str(tmp_path)}, clock=clock)
    car.start()
    try:
        # The tailer opens the log on its own thread: wait (bounded) until it read the start.
        wait_until(
            lambda: car.render_metrics("text/plain") and _get(car.registry, names.KV_POOL_TOKENS, **LAB), 15
        )
        for _ in range(30):
            clock.now += 2
            with log.open("a", encoding="utf-8") as fh:
                fh.write(STATS + "\n")
            stale = _stale_series(car)
            assert stale and not any(stale.values()), stale
        assert {fact for _, fact in stale} == {"kv_usage_ratio", "running", "waiting"}
        reg = car.registry
        assert _get(reg, names.KV_POOL_TOKENS, **LAB) == 1952 * 16
        for _ in range(4):  # requests keep coming, the stats lines stop
            clock.now += 2
            with log.open("a", encoding="utf-8") as fh:
                fh.write(ACCESS + "\n")
        stale = _stale_series(car)
        assert stale == {("log", "kv_usage_ratio"): 1, ("log", "running"): 1, ("log", "waiting"): 1}
        assert _get(reg, names.KV_USAGE_RATIO, **LAB) is None
        assert _get(reg, names.KV_POOL_TOKENS, **LAB) == 1952 * 16
    finally:
        car.stop()


def test_a_pool_only_metrics_reported_stays_while_metrics_answers_and_goes_when_it_is_silent() -> None:
    """The pool is a startup fact: a scrape that no longer carries it (renamed series) leaves it
    exported and never flagged; once /metrics delivers nothing for the TTL, it is left out."""
    from kvwatch.core.events import PoolSized

    clock = _Clock()
    fleet = Fleet(clock=clock, fact_ttl=30)
    fleet.apply("v", PoolSized(engine="vllm", instance="0", origin="metrics", tokens=434448, blocks=27153))
    for _ in range(20):
        clock.now += 5
        fleet.apply(
            "v", UsageSample(engine="vllm", instance="0", origin="metrics", kv_usage_ratio=0.4, running=3)
        )
    reg = _registry(fleet)
    assert _get(reg, names.KV_POOL_TOKENS, **LAB) == 434448
    assert _get(reg, names.FACTS_STALE, **LAB, fact="pool_tokens") is None
    assert _get(reg, names.FACTS_STALE, **LAB, origin="metrics", fact="kv_usage_ratio") == 0
    clock.now += 31  # the endpoint went silent (its scrapes fail)
    assert _get(reg, names.KV_POOL_TOKENS, **LAB) is None
    assert _get(reg, names.KV_USAGE_RATIO, **LAB) is None
    assert _get(reg, names.FACTS_STALE, **LAB, origin="metrics", fact="kv_usage_ratio") == 1


def test_only_watched_periodic_facts_are_flagged_and_startup_groups_have_none() -> None:
    from kvwatch.state import facts

    assert facts.UsageFacts.CADENCE == "periodic"
    for group in (facts.SettingsFacts, facts.MemoryFacts, facts.PoolFacts, facts.Failure):
        assert group.CADENCE == "startup" and facts.periodic_facts(group) == ()
    from kvwatch.state.fleet import STALE_FACTS

    assert STALE_FACTS == ("kv_usage_ratio", "used_tokens", "running", "waiting")


def test_a_pool_timed_by_an_older_kvwatch_is_never_flagged_after_a_restore(tmp_path: Path) -> None:
    """State files of earlier releases timed the pool as 'log:pool_tokens': restored, it is a
    startup fact like any other and never stale, however old."""
    from kvwatch.state.persist import STATE_FILE, StateStore, restore

    old = (TESTS / "state_files" / "format1-main-8bd9b45.json").read_text()
    assert '"log:pool_tokens"' in old
    (tmp_path / STATE_FILE).write_text(old)
    late = Fleet(clock=lambda: 5000.0)
    restore(late, StateStore(tmp_path).load())
    snap = {(s.source, s.instance): s for s in late.snapshot()}[("v", "0")]
    assert snap.stale and all(fact != "pool_tokens" for _, fact in snap.stale)
    assert snap.pool.tokens == 428560
