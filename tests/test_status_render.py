"""The status page's renderer without a browser: its bound, its escaping, explain --html's errors.
(tests/test_status_page.py opens the page in chromium.)"""

from __future__ import annotations

import dataclasses
from html.parser import HTMLParser
from pathlib import Path

import pytest

from kvwatch.analysis.predictor import PredictionResult
from kvwatch.cli import main
from kvwatch.export import status
from kvwatch.sources.pipeline import replay
from kvwatch.state.instance import InstanceSnapshot

ROOT = Path(__file__).resolve().parent.parent
DEMO_LOG = ROOT / "kvwatch" / "data" / "demo" / "vllm.log"
TAG = "<b onmouseover=x>"


class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.attrs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        self.attrs += [name for name, _ in attrs]


def _snap() -> InstanceSnapshot:
    return replay([str(DEMO_LOG)]).snapshots()[0]


def test_the_page_is_bounded_and_says_what_it_left_out() -> None:
    snaps = [dataclasses.replace(_snap(), source=f"s{i:02d}") for i in range(status.MAX_SHOWN + 5)]
    page = status.render(snaps, lambda s: PredictionResult(state="no_model_config"))
    assert page.count('<section class="instance"') == status.MAX_SHOWN
    assert f"{status.MAX_SHOWN + 5} instances; showing the first {status.MAX_SHOWN}, 5 left out" in page
    assert 's04"' in page and f's{status.MAX_SHOWN:02d}"' not in page


def test_every_string_from_a_log_is_escaped_and_cut() -> None:
    snap = _snap()
    settings = dataclasses.replace(
        snap.settings, model=TAG * 100, served_model_name=TAG, version=TAG, kv_cache_dtype=TAG
    )
    snap = dataclasses.replace(snap, settings=settings, source=TAG, instance=TAG)
    page = status.render([snap], lambda s: PredictionResult(state="bad_model_config", reason=TAG), title=TAG)
    parser = _Tags()
    parser.feed(page)
    assert "b" not in parser.tags and "onmouseover" not in parser.attrs
    assert "&lt;b onmouseover=x&gt;" in page
    # A string is cut to MAX_TEXT characters before escaping: the 100-fold model name is not all there.
    assert page.count("&lt;b onmouseover") < 100


def test_explain_html_to_an_unwritable_path_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "missing" / "page.html"
    assert main(["explain", str(DEMO_LOG), "--html", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cannot write" in err[0]
    assert not out.exists()
