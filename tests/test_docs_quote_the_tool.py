"""Docs quote the tool: every ```console block of README.md and docs/*.md is a promise.

Each ``$ kvwatch ...`` line (``\\`` continues it) runs against the bundled files, in the repository
root, with a fresh HF_HOME and a stand-in Hub on 127.0.0.1 (tests/hub_standin.py) serving the
real configs of the Hub names the docs use. It must exit 0, and the lines quoted under it must be
what it printed: each run of quoted lines appears, in that order, as consecutive lines of the
output; a ``...`` line skips any number of lines. Commands that cannot run here (a sidecar against
a production host's paths, kubectl, docker) are shown in ```sh blocks, never as transcripts: a
``$ `` prompt outside a console block, or a console block that runs anything but kvwatch, fails.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from hub_standin import Repo, StandInHub

from kvwatch.export import names

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
VENV_BIN = Path(sys.executable).parent
LIMIT_S = 120
COMMIT = "d" * 40
# The Hub names the docs use, each served from a bundled config.
HUB = {"Qwen/Qwen3-32B": "Qwen--Qwen3-32B.json"}
_BLOCK = re.compile(r"^```(?P<lang>[\w-]*)\n(?P<body>.*?)^```", re.S | re.M)


@dataclass(frozen=True)
class Example:
    doc: str
    line: int
    command: str
    quoted: tuple[str, ...]

    @property
    def id(self) -> str:
        return f"{self.doc}:{self.line}"


def _examples(path: Path) -> list[Example]:
    text = path.read_text(encoding="utf-8")
    doc = path.relative_to(ROOT).as_posix()
    out: list[Example] = []
    for block in _BLOCK.finditer(text):
        if block["lang"] != "console":
            continue
        first = text[: block.start()].count("\n") + 2
        lines = block["body"].splitlines()
        i = 0
        while i < len(lines):
            line = lines[i]
            if line.startswith("$ "):
                start = first + i
                command = line[2:]
                while command.endswith("\\") and i + 1 < len(lines):
                    i += 1
                    command = command[:-1].rstrip() + " " + lines[i].strip()
                out.append(Example(doc, start, command, ()))
            elif out and out[-1].line >= first:
                ex = out[-1]
                out[-1] = Example(ex.doc, ex.line, ex.command, (*ex.quoted, line.rstrip()))
            else:
                raise AssertionError(
                    f"{doc}:{first + i}: a console block starts with output, not a '$ ' line"
                )
            i += 1
    return out


EXAMPLES = [ex for path in DOCS for ex in _examples(path)]


def _chunks(quoted: tuple[str, ...]) -> list[list[str]]:
    """The quoted lines as runs between ``...`` lines (trailing blank lines dropped)."""
    chunks: list[list[str]] = [[]]
    for line in quoted:
        if line.strip() == "...":
            chunks.append([])
        else:
            chunks[-1].append(line)
    for chunk in chunks:
        while chunk and not chunk[-1].strip():
            chunk.pop()
        while chunk and not chunk[0].strip():
            chunk.pop(0)
    return [c for c in chunks if c]


def unquoted(quoted: tuple[str, ...], printed: list[str]) -> list[str] | None:
    """None when every run of quoted lines is in ``printed`` in order; else the first run that is not."""
    at = 0
    for chunk in _chunks(quoted):
        n = len(chunk)
        found = next((i for i in range(at, len(printed) - n + 1) if printed[i : i + n] == chunk), None)
        if found is None:
            return chunk
        at = found + n
    return None


def test_the_matcher_keeps_order_and_skips_only_at_dots() -> None:
    printed = ["a", "b", "c", "d"]
    assert unquoted(("a", "b"), printed) is None
    assert unquoted(("a", "...", "d"), printed) is None
    assert unquoted(("a", "c"), printed) == ["a", "c"]  # not consecutive, no '...'
    assert unquoted(("c", "...", "a"), printed) == ["a"]  # out of order


def test_every_doc_example_is_found() -> None:
    # The README's first ten minutes, explain, plan and predict each show transcripts.
    docs = {ex.doc for ex in EXAMPLES}
    assert {"README.md", "docs/explain-plan.md", "docs/predict.md"} <= docs
    assert all(ex.command.startswith("kvwatch ") for ex in EXAMPLES), [
        ex.id for ex in EXAMPLES if not ex.command.startswith("kvwatch ")
    ]


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_a_prompt_is_only_in_a_console_block(path: Path) -> None:
    """A ``$ `` line, or a block of kvwatch commands with no language, says 'run this and see':
    only a console block may (the others are ```sh, and are not run)."""
    text = path.read_text(encoding="utf-8")
    for block in _BLOCK.finditer(text):
        line = text[: block.start()].count("\n") + 1
        body = block["body"]
        if block["lang"] != "console":
            assert not re.search(r"^\$ ", body, re.M), f"{path.name}:{line}: a '$ ' prompt outside ```console"
        if not block["lang"]:
            assert not re.search(r"^\s*kvwatch ", body, re.M), (
                f"{path.name}:{line}: kvwatch commands in a block with no language: ```console (run by "
                "this test), ```sh (not run) or ```text (a synopsis)"
            )


@pytest.mark.parametrize(
    ("doc", "opening"),
    [("README.md", "Per-instance labels:"), ("docs/sidecar.md", "Per engine instance the labels are")],
)
def test_the_docs_name_the_labels_the_metrics_carry(doc: str, opening: str) -> None:
    text = (ROOT / doc).read_text(encoding="utf-8")
    start = text.index(opening)
    sentence = text[start : text.index(").", start)]  # (up to dp_rank's own parenthesis)
    named = re.findall(r"`([a-z_]+)`", sentence)
    assert [n for n in named if n not in ("vllm", "sglang", "NAME")] == list(names.INSTANCE_LABELS)


@pytest.fixture(scope="module")
def hub() -> Iterator[StandInHub]:
    repos = {}
    for name, config in HUB.items():
        data = (ROOT / "tests" / "model_configs" / config).read_bytes()
        repos[name] = Repo(refs={"main": COMMIT, "v1.0": COMMIT}, commits={COMMIT: {"config.json": data}})
    server = StandInHub(repos)
    try:
        yield server
    finally:
        server.close()


@pytest.fixture(scope="module")
def env(hub: StandInHub, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    out = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_", "KVWATCH_"))}
    out.update(
        PYTHONPATH=str(ROOT),
        PATH=f"{VENV_BIN}{os.pathsep}{out.get('PATH', '')}",
        HF_HOME=str(tmp_path_factory.mktemp("hf")),
        HF_ENDPOINT=hub.url,
        COLUMNS="100",
    )
    return out


@pytest.mark.integration
@pytest.mark.parametrize("example", EXAMPLES, ids=lambda ex: ex.id)
def test_the_doc_quotes_what_the_command_prints(example: Example, env: dict[str, str]) -> None:
    out = subprocess.run(
        ["bash", "-c", example.command],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=LIMIT_S,
        check=False,
    )
    assert out.returncode == 0, f"{example.id} `{example.command}` exit {out.returncode}: {out.stderr}"
    printed = [line.rstrip() for line in out.stdout.splitlines()]
    missing = unquoted(example.quoted, printed)
    assert missing is None, (
        f"{example.id} `{example.command}`: the doc quotes lines the tool did not print (in order):\n"
        + "\n".join(missing)
        + "\n--- printed:\n"
        + out.stdout
    )
