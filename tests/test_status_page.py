"""The status page (the sidecar's /, `kvwatch explain --html`) in a real browser: Debian's chromium
driven by Playwright.

The bars are measured in the DOM and held against the figures /metrics exports for the same
instance; the page sits behind /metrics' basic auth; strings from a hostile log stay text.
"""

from __future__ import annotations

import base64
import functools
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from prometheus_client.parser import text_string_to_metric_families
from waiting import wait_until

from kvwatch.analysis.predictor import Predictor
from kvwatch.capacity import gpus
from kvwatch.cli import main
from kvwatch.core.units import GiB
from kvwatch.export.collector import KvwatchCollector
from kvwatch.export.status import STACK
from kvwatch.sources.pipeline import replay

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Dialog, Page, Response

    from kvwatch.sidecar.app import Sidecar

pytestmark = pytest.mark.integration


def _record_status(seen: list[int], response: Response) -> None:
    seen.append(response.status)


def _dismiss(seen: list[str], dialog: Dialog) -> None:
    """Keep an alert's text and close it (an open dialog would block the page)."""
    seen.append(dialog.message)
    dialog.dismiss()


ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "kvwatch" / "data" / "demo"
LLAMA = DEMO / "models" / "meta-llama--Meta-Llama-3.1-8B.json"
# The demo's vLLM 0.19.0 start (kvwatch/data/demo/demo.json: its first 745 lines), H100 80 GB.
STARTUP = (DEMO / "vllm.log").read_text(encoding="utf-8").splitlines()[:745]
GPU = "H100-SXM-80GB"
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
STATS = (
    "(APIServer pid=1) INFO 04-22 00:08:09 [v1/metrics/loggers.py:259] Engine 000: Avg prompt throughput: "
    "812.4 tokens/s, Avg generation throughput: 95.1 tokens/s, Running: 12 reqs, Waiting: 3 reqs, "
    "GPU KV cache usage: 37.5%, Prefix cache hit rate: 0.0%"
)
HOSTILE = (
    "<script>window.pwned=1</script>",
    '"><img src=x onerror=window.pwned=2>',
    "</svg><script>window.pwned=3</script>",
)
STACKED = tuple(term for term, _, _ in STACK)
# The page writes SVG lengths with two decimals.
PX = 0.011


def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def _get(url: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return int(resp.status), resp.read().decode()
    except urllib.error.HTTPError as exc:
        exc.close()
        return int(exc.code), ""


def _samples(text: str, source: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of one source: (name, sorted labels without the instance's own) -> value."""
    own = {"source", "engine_kind", "model_name", "dp_rank"}
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.labels.get("source") == source:
                rest = tuple(sorted((k, v) for k, v in s.labels.items() if k not in own))
                out[(s.name, rest)] = float(s.value)
    return out


def _memory(m: dict[tuple[str, tuple[tuple[str, str], ...]], float], basis: str) -> dict[str, float]:
    return {
        dict(labels)["term"]: v
        for (name, labels), v in m.items()
        if name == "kvwatch_memory_bytes" and dict(labels)["basis"] == basis
    }


def _geometry(page: Page) -> dict[str, object]:
    """What was drawn, read back from the DOM: segments, markers, band, ticks, the usage bar."""
    return dict(
        page.evaluate(
            """() => {
        const len = (el, a) => el[a].baseVal.value;
        const svg = document.querySelector('section.instance svg.budget');
        const rect = el => ({basis: el.dataset.basis, term: el.dataset.term,
                             x: len(el, 'x'), width: len(el, 'width')});
        const pool = document.querySelector('svg.usage rect.pool');
        const used = document.querySelector('svg.usage rect.used');
        return {
          segments: [...svg.querySelectorAll('rect.seg')].map(rect),
          band: [...svg.querySelectorAll('rect.band')].map(rect),
          markers: [...svg.querySelectorAll('line.marker')].map(el => ({
              basis: el.dataset.basis, term: el.dataset.term, x: len(el, 'x1')})),
          ticks: [...svg.querySelectorAll('text.tick')].map(el => ({
              gib: Number(el.dataset.gib), x: el.x.baseVal[0].value, text: el.textContent})),
          pool: pool ? len(pool, 'width') : null,
          used: used ? len(used, 'width') : null,
        };
    }"""
        )
    )


def _check_bars(page: Page, m: dict[tuple[str, tuple[tuple[str, str], ...]], float]) -> None:
    """Every bar, marker, tick and the band on one scale that turns /metrics' bytes into pixels."""
    g = _geometry(page)
    segments = g["segments"]
    assert isinstance(segments, list)
    exported = {
        basis: {t: v for t, v in _memory(m, basis).items() if t in STACKED}
        for basis in ("observed", "predicted")
    }
    drawn = {basis: [s for s in segments if s["basis"] == basis] for basis in exported}
    for basis in exported:
        # The stack's order is the legend's, and every exported term is drawn, nothing else.
        assert [s["term"] for s in drawn[basis]] == [t for t in STACKED if t in exported[basis]]
    biggest = max(segments, key=lambda s: s["width"])
    px_per_byte = biggest["width"] / exported[biggest["basis"]][biggest["term"]]
    origin = drawn["observed"][0]["x"]
    for basis, segs in drawn.items():
        x = origin
        for s in segs:
            assert s["x"] == pytest.approx(x, abs=2 * PX * len(segs))
            assert s["width"] == pytest.approx(exported[basis][s["term"]] * px_per_byte, abs=PX)
            x = s["x"] + s["width"]
    markers = g["markers"]
    assert isinstance(markers, list) and markers
    for mk in markers:
        assert mk["x"] - origin == pytest.approx(_memory(m, mk["basis"])[mk["term"]] * px_per_byte, abs=PX)
    # The axis: each tick's label is its distance from 0 in GiB, on the bars' scale.
    ticks = g["ticks"]
    assert isinstance(ticks, list) and len(ticks) >= 3
    assert any(t["text"] == "0" for t in ticks)
    for t in ticks:
        assert t["x"] - origin == pytest.approx(t["gib"] * GiB * px_per_byte, abs=PX)
        assert float(t["text"]) == t["gib"]
    # The band: the predicted KV term's end, give or take the exported prediction error.
    ratio = m[("kvwatch_kv_pool_prediction_error_ratio", (("basis", "config"),))]
    band = g["band"]
    assert isinstance(band, list) and len(band) == 1
    kv = exported["predicted"]["kv"]
    end = origin + sum(exported["predicted"].values()) * px_per_byte
    assert band[0]["width"] == pytest.approx(2 * ratio * kv * px_per_byte, abs=2 * PX)
    assert band[0]["x"] + band[0]["width"] / 2 == pytest.approx(end, abs=2 * PX)
    # The pool bar: used over pool is the exported usage.
    pool, used = g["pool"], g["used"]
    assert isinstance(pool, int | float) and pool > 0 and isinstance(used, int | float)
    usage = m[("kvwatch_kv_usage_ratio", ())]
    assert used / pool == pytest.approx(usage, abs=PX / pool)


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1000, "height": 900})
    yield context.new_page()
    context.close()


def test_status_page_draws_what_metrics_exports(
    tmp_path: Path, sidecar_factory: Callable[..., Sidecar], page: Page
) -> None:
    log = _write(tmp_path / "vllm.log", [*STARTUP, STATS])
    car = sidecar_factory(log=[f"v={log}"], model_config=[str(LLAMA)], gpu=GPU)
    wait_until(lambda: _samples(_get(car.url)[1], "v").get(("kvwatch_kv_usage_ratio", ())) == 0.375)
    m = _samples(_get(car.url)[1], "v")
    requests: list[str] = []
    page.on("request", lambda r: requests.append(r.url))
    response = page.goto(car.url.removesuffix("metrics"))
    assert response is not None and response.status == 200
    # No external asset, no second request of any kind: the page is one document.
    assert requests == [car.url.removesuffix("metrics")]
    _check_bars(page, m)
    section = page.locator("section.instance")
    assert section.count() == 1
    assert MODEL in section.locator("h2").inner_text()
    rows = {
        row.locator("td").nth(0).inner_text(): row.locator("td").nth(1).inner_text()
        for row in section.locator("table.pool tr").all()
    }
    assert rows["pool"].startswith(f"{m[('kvwatch_kv_pool_tokens', ())]:,.0f} tokens")
    assert rows["used"] == f"{m[('kvwatch_kv_used_tokens', ())]:,.0f} tokens"
    assert rows["headroom"] == f"{m[('kvwatch_kv_headroom_tokens', ())]:,.0f} tokens"
    assert rows["headroom in requests"].startswith(f"{m[('kvwatch_kv_headroom_requests', ())]:,.0f} (")
    assert rows["usage"] == "37.5%"
    assert rows["running / waiting"] == "12 / 3"
    assert rows["preemptions"] == f"{m[('kvwatch_preemptions_total', ())]:,.0f}"
    assert "last startup failure: none" in section.inner_text()
    legend = page.locator("p.legend").inner_text()
    assert all(label in legend for _, label, _ in STACK)
    assert "GiB per rank" in (page.locator("svg.budget").text_content() or "")
    shot = tmp_path / "status.png"
    page.screenshot(path=str(shot), full_page=True)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_status_page_is_behind_basic_auth(
    tmp_path: Path, sidecar_factory: Callable[..., Sidecar], browser: Browser
) -> None:
    import bcrypt
    from playwright.sync_api import Error as PlaywrightError

    hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4)).decode()
    web = tmp_path / "web.yml"
    web.write_text(f"basic_auth_users:\n  prom: '{hashed}'\n", encoding="utf-8")
    log = _write(tmp_path / "vllm.log", STARTUP)
    car = sidecar_factory(log=[f"v={log}"], model_config=[str(LLAMA)], gpu=GPU, web_config=str(web))
    root = car.url.removesuffix("metrics")
    good = {"Authorization": "Basic " + base64.b64encode(b"prom:s3cret").decode()}
    bad = {"Authorization": "Basic " + base64.b64encode(b"prom:wrong").decode()}
    assert _get(root)[0] == 401
    assert _get(root, bad)[0] == 401
    assert _get(root + "healthz")[0] == 200  # probes need no credentials
    status, body = _get(root, good)
    assert status == 200 and body.startswith("<!DOCTYPE html>")
    # Chromium, without credentials or with wrong ones, is answered 401 and shows no page.
    for credentials in (None, {"username": "prom", "password": "wrong"}):
        context = browser.new_context(http_credentials=credentials)  # type: ignore[arg-type]
        refused = context.new_page()
        statuses: list[int] = []
        refused.on("response", functools.partial(_record_status, statuses))
        with pytest.raises(
            PlaywrightError, match="ERR_INVALID_AUTH_CREDENTIALS|ERR_HTTP_RESPONSE_CODE_FAILURE"
        ):
            refused.goto(root)
        assert statuses and set(statuses) == {401}
        assert refused.locator("section.instance").count() == 0
        context.close()
    context = browser.new_context(http_credentials={"username": "prom", "password": "s3cret"})
    page = context.new_page()
    response = page.goto(root)
    assert response is not None and response.status == 200
    wait_until(lambda: page.reload() is not None and page.locator("svg.budget rect.seg").count() > 0)
    assert MODEL in page.locator("section.instance h2").inner_text()
    context.close()


def _assert_inert(page: Page, dialogs: list[str]) -> None:
    assert page.evaluate("typeof window.pwned") == "undefined"
    assert dialogs == []
    # Nothing the payloads spell became an element: no script, no image, no element of another kind.
    assert page.evaluate("document.querySelectorAll('script, img, iframe, object, embed').length") == 0
    tags = set(page.evaluate("[...document.querySelectorAll('*')].map(e => e.localName)"))
    allowed = {"html", "head", "meta", "title", "style", "body", "h1", "h2", "p", "section", "span", "i"}
    allowed |= {"table", "tbody", "tr", "td", "th", "svg", "rect", "line", "text"}
    assert tags <= allowed, tags - allowed
    assert page.evaluate("document.querySelectorAll('svg').length") == page.evaluate(
        "document.querySelectorAll('svg.budget, svg.usage').length"
    )


def test_hostile_strings_stay_text(
    tmp_path: Path, sidecar_factory: Callable[..., Sidecar], page: Page
) -> None:
    payload = "".join(HOSTILE)
    lines = [
        line.replace(MODEL, payload).replace("kv_cache_dtype=auto", f"kv_cache_dtype={HOSTILE[0]}")
        for line in STARTUP
    ]
    # Lines no parser owns, carrying markup too: whatever becomes of them, nothing of them runs.
    lines += [f"(APIServer pid=1) INFO 04-22 00:08:00 [api_server.py:1] {p}" for p in HOSTILE]
    log = _write(tmp_path / "vllm.log", lines)
    car = sidecar_factory(log=[f"v={log}"], model_config=[str(LLAMA)], gpu=GPU)
    wait_until(lambda: "kvwatch_kv_pool_tokens{" in _get(car.url)[1])
    dialogs: list[str] = []
    page.on("dialog", functools.partial(_dismiss, dialogs))
    response = page.goto(car.url.removesuffix("metrics"))
    assert response is not None and response.status == 200
    _assert_inert(page, dialogs)
    text = page.locator("section.instance").inner_text()
    # The model (the full payload) and the prediction error quoting the cache dtype, verbatim.
    assert payload in text
    assert f"unknown kv cache dtype '{HOSTILE[0]}'" in text
    assert HOSTILE[0] in page.locator("section.instance h2").inner_text()
    # The SVG's own title and label carry the name too (text inside the SVG, and an attribute).
    served = page.locator("section.instance h2").inner_text()
    assert page.locator("svg.budget > title").text_content() == f"memory budget per rank of {served}"
    assert (
        page.locator("svg.budget").get_attribute("aria-label") == f"memory budget per rank of {served}, GiB"
    )


def test_explain_html_opens_in_chromium(
    tmp_path: Path, page: Page, capsys: pytest.CaptureFixture[str]
) -> None:
    log = _write(tmp_path / "vllm.log", [*STARTUP, STATS])
    out = tmp_path / "budget.html"
    assert main(["explain", str(log), "--model-config", str(LLAMA), "--gpu", GPU, "--html", str(out)]) == 0
    assert "KV pool tokens" in capsys.readouterr().out  # the text report still goes to stdout
    # The figures the collector exports for the same log, model config and GPU.
    snaps = replay([str(log)]).snapshots()
    predictor = Predictor(
        model_config=lambda source: LLAMA, gpu_memory_bytes=int(gpus.lookup(GPU).total_bytes)
    )
    m = _samples(KvwatchCollector(lambda: snaps, predictor).render().decode(), str(log))
    requests: list[str] = []
    page.on("request", lambda r: requests.append(r.url))
    page.goto(out.as_uri())
    assert requests == [out.as_uri()]
    _check_bars(page, m)
    assert page.locator("section.instance").count() == 1
    assert page.title() == f"kvwatch explain: {log}"


def test_explain_html_startup_failure_and_hostile_model(tmp_path: Path, page: Page) -> None:
    failed = (
        Path(__file__).parent / "log_samples" / "vllm" / "002-llama31-8b-rtx3090-maxlen-too-large-29k.log"
    )
    hostile = _write(tmp_path / "hostile.log", [line.replace(MODEL, "".join(HOSTILE)) for line in STARTUP])
    cfg = Path(__file__).parent / "model_configs" / "meta-llama--Meta-Llama-3.1-8B.json"
    dialogs: list[str] = []
    page.on("dialog", functools.partial(_dismiss, dialogs))
    for log, expect in ((failed, "max_model_len_too_large"), (hostile, "".join(HOSTILE))):
        out = tmp_path / f"{log.stem}.html"
        assert main(["explain", str(log), "--model-config", str(cfg), "--html", str(out)]) == 0
        page.goto(out.as_uri())
        _assert_inert(page, dialogs)
        assert expect in page.locator("section.instance").inner_text()


def test_an_idle_sidecar_never_imports_the_page(tmp_path: Path) -> None:
    """The page's module loads on the first request of /, not before (the idle memory budget)."""
    log = _write(tmp_path / "vllm.log", STARTUP)
    code = f"""
import sys, urllib.request
from kvwatch.sidecar.app import Sidecar
from kvwatch.sidecar.config import load_settings
flags = {{"listen": "127.0.0.1:0", "log": [{f"v={log}"!r}]}}
car = Sidecar(load_settings(flags, environ={{}}), environ={{"HOME": {str(tmp_path)!r}}})
car.start()
try:
    urllib.request.urlopen(car.url, timeout=5).read()
    before = "kvwatch.export.status" in sys.modules
    urllib.request.urlopen(car.url.removesuffix("metrics"), timeout=5).read()
    print(before, "kvwatch.export.status" in sys.modules)
finally:
    car.stop()
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "True"]
