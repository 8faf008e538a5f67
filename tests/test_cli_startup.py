"""kvwatch answers at once: `--help` imports no command module, a prediction imports no log or
/metrics machinery (no pydantic, prometheus_client, watchdog, huggingface_hub). Import times are
measured in `make bench` (bench/bench_startup.py), never here; these tests check what is imported."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

from kvwatch import cli

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "tests" / "model_configs" / "Qwen--Qwen3-32B.json"


@pytest.mark.parametrize("name", cli.COMMANDS)
def test_the_help_table_is_each_commands_help(name: str) -> None:
    assert importlib.import_module(f"kvwatch.commands.{name}").HELP == cli.COMMAND_HELP[name]


def _modules_after(*args: str) -> set[str]:
    code = (
        "import sys, contextlib, io\n"
        "from kvwatch.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    try:\n"
        f"        main({list(args)!r})\n"
        "    except SystemExit:\n"
        "        pass\n"
        "print(' '.join(sorted(sys.modules)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    return set(out.stdout.split())


def test_help_imports_no_command() -> None:
    loaded = _modules_after("--help")
    assert not {m for m in loaded if m.startswith("kvwatch.commands.")}
    assert "kvwatch.commands.predict" in _modules_after("predict", "--help")


def test_predict_json_imports_only_the_capacity_model() -> None:
    loaded = {m.split(".")[0] for m in _modules_after("predict", str(CONFIG), "--gpu", "h100", "--json")}
    assert not loaded & {"pydantic", "prometheus_client", "watchdog", "huggingface_hub", "yaml"}
