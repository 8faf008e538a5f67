"""A newcomer's first ten minutes, from a clean clone: the README's commands as written.

The repository is cloned into tmp_path (what is committed, nothing else) and every command of the
README's Quick start and "First ten minutes" sections runs there with a time limit, using this
test's interpreter and installed dependencies with the clone's own sources first on PYTHONPATH:
each must exit 0, and each output line the README quotes must be in what the command printed
(``...`` skips lines). Hub names resolve against a stand-in Hub on 127.0.0.1 (tests/hub_standin.py)
serving the real Qwen3-32B config.json, with HF_HOME in tmp_path. Skipped as written: `make test`
(this test runs inside it) and the sidecar example, whose paths are a production host's.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hub_standin import Repo, StandInHub

ROOT = Path(__file__).resolve().parent.parent
VENV = Path(sys.executable).parent.parent
COMMIT = "c" * 40
LIMIT_S = 60

pytestmark = pytest.mark.integration


def _section(readme: str, title: str) -> str:
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## )", readme, re.S | re.M)
    assert match, f"README has no section {title!r}"
    return match[1]


def _blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", text, re.S | re.M)


def examples(readme: str) -> list[tuple[str, list[str]]]:
    """(command, quoted output lines) of each ``$ `` line of the console blocks of First ten minutes."""
    out: list[tuple[str, list[str]]] = []
    for block in _blocks(_section(readme, "First ten minutes"), "console"):
        for line in block.splitlines():
            if line.startswith("$ "):
                out.append((line[2:], []))
            elif out and line.strip() and line.strip() != "...":
                out[-1][1].append(line.rstrip())
    return out


@pytest.fixture(scope="module")
def clone(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    dest = tmp_path_factory.mktemp("newcomer") / "kvwatch"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(dest)], check=True, timeout=LIMIT_S)
    return dest


@pytest.fixture(scope="module")
def hub() -> Iterator[StandInHub]:
    config = (ROOT / "tests" / "model_configs" / "Qwen--Qwen3-32B.json").read_bytes()
    server = StandInHub(
        {"Qwen/Qwen3-32B": Repo(refs={"main": COMMIT}, commits={COMMIT: {"config.json": config}})}
    )
    try:
        yield server
    finally:
        server.close()


@pytest.fixture(scope="module")
def env(clone: Path, hub: StandInHub, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    out = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_", "KVWATCH_"))}
    out.update(
        PYTHONPATH=str(clone),
        PATH=f"{VENV / 'bin'}{os.pathsep}{out.get('PATH', '')}",
        HF_HOME=str(tmp_path_factory.mktemp("hf")),
        HF_ENDPOINT=hub.url,
    )
    return out


def _run(command: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-c", command],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=LIMIT_S,
        check=False,
    )


def test_the_clone_runs_its_own_sources(clone: Path, env: dict[str, str]) -> None:
    out = _run("python -c 'import kvwatch; print(kvwatch.__file__)'", clone, env)
    assert out.stdout.strip() == str(clone / "kvwatch" / "__init__.py"), out.stderr


def test_quick_start(clone: Path, env: dict[str, str]) -> None:
    readme = (clone / "README.md").read_text(encoding="utf-8")
    commands = [
        line.split("#", 1)[0].strip()
        for block in _blocks(_section(readme, "Quick start"), "sh")
        for line in block.splitlines()
        if line.strip()
    ]
    assert "make demo" in commands
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for command in commands:
        if command == "make test":
            continue  # this test runs inside `make test`
        assert command == "make demo", f"README Quick start has a command this test does not know: {command}"
        # The Makefile's own venv is this test's (never reinstalled from here: -o); the demo stops by itself.
        demo_args = f"--duration 5 --listen 127.0.0.1:{port}"
        make = f"make -o {shlex.quote(str(VENV / '.installed'))} VENV={shlex.quote(str(VENV))} "
        out = _run(make + f"demo DEMO_ARGS={shlex.quote(demo_args)}", clone, env)
        assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
        assert "KV pool" in out.stdout


def test_first_ten_minutes(clone: Path, env: dict[str, str]) -> None:
    cases = examples((clone / "README.md").read_text(encoding="utf-8"))
    assert len(cases) >= 3
    for command, quoted in cases:
        assert command.startswith("kvwatch "), command
        out = _run(command, clone, env)
        assert out.returncode == 0, f"{command}: {out.stderr}"
        printed = [line.rstrip() for line in out.stdout.splitlines()]
        missing = [line for line in quoted if line not in printed]
        assert not missing, f"{command}: README quotes lines the tool did not print: {missing}\n{out.stdout}"
