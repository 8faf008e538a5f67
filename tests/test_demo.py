"""`kvwatch demo` tells one true story: real runs, agreeing figures, named models, one labelled fault.

The data (kvwatch/data/demo) is checked against its sources; the demo is run in-process for its
figures, as a subprocess for Ctrl-C (every child it started must be gone), and with the real
Prometheus server past every (scaled) `for:`: the fault's alert must actually fire, and no other.
"""

from __future__ import annotations

import dataclasses
import gzip
import io
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from waiting import wait_until

from kvwatch.export import names
from kvwatch.sidecar.demo import Demo, _demo_files, _sections, explain_fault, fault_report, run_demo
from kvwatch.sidecar.demo_prometheus import find_prometheus
from kvwatch.sources.pipeline import replay

TESTS = Path(__file__).parent
DATA = _demo_files()
APRIORI_LOG = TESTS / "apriori" / "logs" / "meta-llama-llama---h100-80gb--tp1pp1dp1--8192-dtbf16.log.gz"
SGLANG_SAMPLE = TESTS / "log_samples" / "sglang" / "017-dsv32-dp8-mla-kv-size-single-pool.log"


def _wait(check: Callable[[], object], timeout: float = 20.0) -> None:
    wait_until(check, timeout, poll=0.1)


def test_the_vllm_log_is_the_real_run_byte_for_byte() -> None:
    assert (DATA / "vllm.log").read_bytes() == gzip.decompress(APRIORI_LOG.read_bytes())


def test_the_sglang_pool_lines_are_the_real_ones_and_the_notes_are_ignored(tmp_path: Path) -> None:
    text = (DATA / "sglang.log").read_text(encoding="utf-8")
    for line in SGLANG_SAMPLE.read_text(encoding="utf-8").splitlines():
        assert line in text.splitlines()
    assert text.startswith("# ")  # the header says what is real and what is derived
    without = tmp_path / "without-notes.log"
    without.write_text(
        "".join(f"{x}\n" for x in text.splitlines() if not x.startswith("#")), encoding="utf-8"
    )

    # kvwatch skips the notes: the same summary with and without them.
    def read(path: Path) -> list[object]:
        return [dataclasses.replace(s, source="-") for s in replay([str(path)]).fleet.snapshot()]

    assert read(DATA / "sglang.log") == read(without)


def test_sglang_decode_lines_agree_with_their_pool() -> None:
    sections = _sections((DATA / "sglang.log").read_text(encoding="utf-8").splitlines())
    pools = [1462784, 972595]
    stats = [lines for kind, _, lines in sections if kind == "stats"]
    assert len(stats) == 2
    for pool, lines in zip(pools, stats, strict=True):
        for line in lines:
            fields = dict(p.strip().split(": ", 1) for p in line.split("] ", 1)[1].split(",") if ": " in p)
            assert round(int(fields["#token"]) / pool, 2) == float(fields["token usage"]), line


def test_healthy_engines_usage_headroom_models_and_the_fault() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        demo = Demo(Path(tmp), listen="127.0.0.1:0", interval=0.05, fault_after=None)
        demo.start()
        try:
            reg = demo.sidecar.registry

            def both_have_usage() -> bool:
                demo.sidecar.refresh()
                snaps = demo.sidecar.fleet.snapshot()
                return len(snaps) == 2 and all(s.usage.kv_usage_ratio is not None for s in snaps)

            _wait(both_have_usage)
            demo.sidecar.refresh()
            by_source = {s.source: s for s in demo.sidecar.fleet.snapshot()}
            vllm = by_source["vllm"]
            labels = {
                "source": "vllm",
                names.ENGINE_KIND_LABEL: vllm.engine,
                names.MODEL_LABEL: "meta-llama/Llama-3.1-8B-Instruct",
                "dp_rank": "0",
            }
            assert reg.get_sample_value(names.KV_POOL_TOKENS.sample_name, labels) == 476_000
            gap = reg.get_sample_value(names.KV_POOL_GAP_RATIO.sample_name, {**labels, "basis": "config"})
            assert gap is not None and abs(gap) < 0.01  # the a-priori model: within ~0.1% of this run
            # Usage and headroom agree with the pool on both engines.
            for snap in by_source.values():
                model = snap.settings.served_model_name or snap.settings.model
                lab = {"source": snap.source, names.ENGINE_KIND_LABEL: snap.engine, "dp_rank": "0"}
                lab[names.MODEL_LABEL] = str(model)
                pool = reg.get_sample_value(names.KV_POOL_TOKENS.sample_name, lab)
                usage = reg.get_sample_value(names.KV_USAGE_RATIO.sample_name, lab)
                head = reg.get_sample_value(names.KV_HEADROOM_TOKENS.sample_name, lab)
                assert pool and usage is not None and head is not None, snap.source
                assert abs(head - pool * (1 - usage)) <= 0.006 * pool, (snap.source, pool, usage, head)
            # Every kvwatch series that carries a model label names the model.
            for family in reg.collect():
                for sample in family.samples:
                    if names.MODEL_LABEL in sample.labels:
                        assert sample.labels[names.MODEL_LABEL], sample
            # The fault: played now, explained by the term it changed, and its alert named.
            demo._play_fault(1.0)
            assert demo.fault is not None
            assert demo.fault.pool_before == 1_462_784 and demo.fault.pool_after == 972_595
            assert demo.fault.explanation.startswith("non_torch")

            def shrunk() -> bool:
                demo.sidecar.refresh()
                return any(s.pool.tokens == 972_595 for s in demo.sidecar.fleet.snapshot())

            _wait(shrunk)
            report = fault_report(demo, None)
            assert "FAULT (deliberate" in report and "KVPoolShrankSinceLastStart would fire" in report
        finally:
            demo.stop()


@pytest.fixture(scope="module")
def fault_explained(tmp_path_factory: pytest.TempPathFactory) -> tuple[int | None, int | None, str]:
    """explain_fault of the demo's faulty engine. The demo is never started, so its sidecar holds
    nothing to stop (a stop before start would wait out FinalSave's 5 s for a consumer that never ran)."""
    demo = Demo(tmp_path_factory.mktemp("demo"), listen="127.0.0.1:0")
    engine = next(e for e in demo.engines if e.fault is not None)
    return explain_fault(engine)


def test_the_fault_is_explained_by_free_memory_before_weights(
    fault_explained: tuple[int | None, int | None, str],
) -> None:
    before, after, why = fault_explained
    assert (before, after) == (1_462_784, 972_595)
    assert why.startswith("non_torch (GPU total - free memory before weights): 0.60 -> 20.60 GiB"), why


def test_the_alert_is_one_of_the_shipped_rules() -> None:
    text = (TESTS.parent / "rules" / "kvwatch.alerts.yaml").read_text(encoding="utf-8")
    assert "- alert: KVPoolShrankSinceLastStart" in text


@pytest.mark.integration
def test_run_demo_without_prometheus_prints_the_story() -> None:
    out = io.StringIO()
    assert run_demo(6.5, "127.0.0.1:0", 0.05, out, every=1.0, fault_after=3.0, prometheus=False) == 0
    text = out.getvalue()
    assert "model=meta-llama/Llama-3.1-8B-Instruct" in text
    assert "model=deepseek-ai/DeepSeek-V3.2-Exp" in text
    assert "pool=476,000 tokens  usage=0.0%  headroom=476,000 tokens" in text
    assert "FAULT (deliberate, at 3s) sglang" in text
    assert "KVPoolShrankSinceLastStart would fire" in text
    assert text.rstrip().endswith("kvwatch demo: stopped")


def _children(pid: int) -> set[int]:
    """Every live descendant of ``pid`` (from /proc)."""
    out: set[int] = set()
    frontier = [pid]
    while frontier:
        parent = frontier.pop()
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[1].split()
            if int(fields[1]) == parent and fields[0] != "Z":
                out.add(int(entry.name))
                frontier.append(int(entry.name))
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.integration
def test_ctrl_c_stops_everything_the_demo_started() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvwatch", "demo", "--listen", "127.0.0.1:0", "--duration", "60",
         "--interval", "0.1", "--fault-after", "2"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        seen = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            seen.append(line)
            if line.startswith("[") or not line:
                break
        children = _children(proc.pid)
        if find_prometheus() is not None:
            assert children, "Prometheus should run as the demo's child"
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=30)
        assert proc.returncode == 0, "".join(seen) + rest
        assert rest.rstrip().endswith("kvwatch demo: stopped")
        for pid in children:

            def gone(pid: int = pid) -> bool:
                return not _alive(pid)

            _wait(gone, timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# --- Issue 21: only the deliberate fault's alert, calm output, a headline that adds up --------------


def test_the_fault_headline_says_what_the_rest_of_the_change_is(
    fault_explained: tuple[int | None, int | None, str],
) -> None:
    """The headline term moves the budget by part of the change; the rest is named and computed, and
    the parts add up to the change."""
    import re

    _, _, why = fault_explained
    main, gap = (float(x) for x in re.findall(r"by ([+-][\d.]+) GiB \(of ([+-][\d.]+) GiB\)", why)[0])
    (rest,) = (float(x) for x in re.findall(r"the other ([+-][\d.]+) GiB", why))
    assert abs(main + rest - gap) <= 0.011, why
    # SGLang prints no memory fraction: the weight kvwatch took for the card is said with the rest.
    assert "no printed term explains it (kvwatch weighs each term by the memory fraction 0." in why, why
    assert "the engine's default for this card" in why


class _Lines(io.StringIO):
    """The demo's output, read while the demo writes it."""


@pytest.mark.integration
def test_the_demo_past_every_scaled_for_and_ttl_shows_only_the_faults_alert() -> None:
    """`kvwatch demo` shortened with its own flags (every for: / 120, so the longest, 30m, is 15 s;
    --fact-ttl 2; the fault after 22 s): Prometheus never holds an alert but the fault's, which
    fires; the rotation is told once; the summary is printed when it changes, not every tick."""
    import json
    import re
    import threading
    import urllib.request

    if find_prometheus() is None:
        pytest.skip("prometheus not installed")
    out = _Lines()
    done = threading.Event()
    seen: set[tuple[str, str, str]] = set()

    def get(url: str) -> Any:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return json.loads(resp.read())["data"]

    def poll() -> None:
        url = None
        scraped = None  # when Prometheus first had the sidecar's `up`
        while not done.wait(0.5):
            found = re.search(r"Prometheus serving (http://127\.0\.0\.1:\d+)", out.getvalue())
            url = url or (found[1] if found else None)
            if url is None:
                continue
            try:
                if scraped is None:
                    scraped = time.monotonic() if get(f"{url}/api/v1/query?query=up")["result"] else None
                    continue
                alerts = get(f"{url}/api/v1/alerts")["alerts"]
            except OSError:
                continue
            # Before its first scrape a new Prometheus sees no target (KVWatchAbsent pending for an
            # evaluation); from two evaluations after it, everything counts.
            if time.monotonic() - scraped >= 2:
                seen.update(
                    (a["labels"]["alertname"], a["labels"].get("source", ""), a["state"]) for a in alerts
                )

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    try:
        code = run_demo(
            32.0, "127.0.0.1:0", 0.1, out, every=0.5, fault_after=22.0, alert_for="2s", for_scale=120.0,
            fact_ttl=2.0,
        )  # fmt: skip
    finally:
        done.set()
        poller.join(timeout=5)
    text = out.getvalue()
    assert code == 0, text
    assert "Prometheus serving" in text, text

    # The demo stopped the Prometheus it started.
    def cmdline(pid: int) -> bytes:
        try:
            return Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:  # gone since it was listed
            return b""

    assert not [pid for pid in _children(os.getpid()) if b"prometheus" in cmdline(pid)]
    assert {(name, source) for name, source, _ in seen} == {("KVPoolShrankSinceLastStart", "sglang")}, seen
    assert ("KVPoolShrankSinceLastStart", "sglang", "firing") in seen, text
    assert "every other for: / 120" in text
    assert "alert KVPoolShrankSinceLastStart (source=sglang): firing in Prometheus" in text, text
    assert "for: 2s in the demo, 5m as shipped" in text
    assert text.count("vllm log rotated") == 1 and "(vllm log rotated)" not in text, text
    # 64 looks at the summary in 32 s; it is printed on a change (start, fault, alert state) only.
    blocks = re.findall(r"^\[\s*[\d.]+s\]$", text, flags=re.MULTILINE)
    assert 1 <= len(blocks) <= 8, text
