"""Command line entry point: parses flags and hands over to one module per subcommand.

Each subcommand lives in ``kvwatch/commands/<name>.py`` and exposes ``HELP``,
``add_arguments(parser)`` and ``run(args) -> int``. A KvwatchError anywhere becomes one line on
stderr and exit code 2 (bad input or configuration), and so does a bad flag (one line, not
argparse's usage block). An error nobody foresaw is one line and exit 1 (KVWATCH_TRACEBACK=1
shows the traceback): no input makes kvwatch print a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import sys
from collections.abc import Sequence
from typing import NoReturn, Protocol, cast

from kvwatch import __version__
from kvwatch.core.errors import KvwatchError

# Subcommand name -> its one-line help, in the order shown in --help. The module is
# kvwatch.commands.<name>; its HELP is the same text (tests/test_cli_startup.py keeps them equal), held here
# so that `kvwatch --help` lists every command without importing any of them.
COMMAND_HELP: dict[str, str] = {
    "predict": "predict the KV-cache pool vLLM or SGLang will allocate for a model (config.json or Hub name)",
    "plan": "check a workload of retained lengths against every rank, and find the smallest card it fits",
    "parse": "Read vLLM/SGLang logs ('-' for stdin) and print the KV-cache pool, budget and usage they report.",
    "explain": "rebuild an engine's memory budget from its startup log and explain the gap to the prediction",
    "dashboards": "Write the Grafana dashboards (JSON, and optionally a Kubernetes ConfigMap) to a folder.",
    "rules": "Write the Prometheus recording and alerting rules (and optionally a PrometheusRule) to a folder.",
    "run": "Run the sidecar: tail engine logs, scrape engine /metrics, export KV-cache metrics for Prometheus.",
    "demo": "Run the sidecar on bundled vLLM and SGLang sample logs written live into temporary files.",
}
COMMANDS: tuple[str, ...] = tuple(COMMAND_HELP)


class _Command(Protocol):
    HELP: str

    def add_arguments(self, parser: argparse.ArgumentParser) -> None: ...

    def run(self, args: argparse.Namespace) -> int: ...


class _Parser(argparse.ArgumentParser):
    """argparse, but a bad flag is one line on stderr (exit 2), not the usage block."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The argparse tree: every command's subparser with its flags, or with ``only`` given, that command's
    flags and the others by name and help alone (their modules are not imported)."""
    parser = _Parser(
        prog="kvwatch",
        description="Predict, observe and explain the KV-cache pool of vLLM and SGLang servers.",
    )
    parser.add_argument("--version", action="version", version=f"kvwatch {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, text in COMMAND_HELP.items():
        sp = sub.add_parser(name, help=text, description=text)
        if only is None or name == only:
            module = cast(_Command, importlib.import_module(f"kvwatch.commands.{name}"))
            module.add_arguments(sp)
            sp.set_defaults(_run=module.run)
    return parser


def _reexec_without_docstrings(arglist: list[str]) -> None:
    """Restart this process as ``python -OO -m kvwatch run ...`` (same PID) unless it already is.

    The sidecar never shows a docstring, and the docstrings of everything it imports (pydantic,
    prometheus_client, the stdlib) are ~1.4 MiB of its resident memory, against a 40 MiB budget.
    Only done for a real command-line start (``argv is None``), never when main() is called from
    Python; KVWATCH_KEEP_DOCSTRINGS=1 turns it off; if exec fails, kvwatch simply runs as it is.
    """
    if sys.flags.optimize >= 2 or os.environ.get("KVWATCH_KEEP_DOCSTRINGS") or not sys.executable:
        return
    with contextlib.suppress(OSError):
        os.execv(sys.executable, [sys.executable, "-OO", "-m", "kvwatch", *arglist])


def _join_negative_values(parser: argparse.ArgumentParser, command: str, args: list[str]) -> list[str]:
    """``--gpu-memory -5GB`` -> ``--gpu-memory=-5GB``: argparse reads a value that starts with '-'
    and a digit as a flag of its own ('expected one argument'); joined, the flag's own check says
    what is wrong with it (e.g. 'size must be positive')."""
    takes_value: set[str] = set()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and command in action.choices:
            sub = action.choices[command]
            takes_value = {o for a in sub._actions if a.nargs != 0 for o in a.option_strings}
    out: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            return out + args[i:]
        nxt = args[i + 1] if i + 1 < len(args) else ""
        if arg in takes_value and len(nxt) > 1 and nxt[0] == "-" and (nxt[1].isdigit() or nxt[1] == "."):
            out.append(f"{arg}={nxt}")
            i += 2
            continue
        out.append(arg)
        i += 1
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Run kvwatch with ``argv`` (default: sys.argv[1:]) and return the exit code."""
    arglist = list(sys.argv[1:] if argv is None else argv)
    if argv is None and arglist[:1] == ["run"]:
        _reexec_without_docstrings(arglist)
    # Import only the named command's module: `kvwatch run` is a long-lived sidecar and should not
    # carry every other command's dependencies in its memory, and `kvwatch --help` (or a mistyped
    # command) imports none of them. "" names no command: argparse then answers with the list.
    only = arglist[0] if arglist and arglist[0] in COMMANDS else ""
    parser = build_parser(only)
    # `kvwatch predict MODEL ... -- <the engine's own flags>`: what follows `--` is the engine's.
    engine_argv: list[str] | None = None
    if "--" in arglist:
        cut = arglist.index("--")
        arglist, engine_argv = arglist[:cut], arglist[cut + 1 :]
    args = parser.parse_args(_join_negative_values(parser, only, arglist))
    if engine_argv is not None:
        if not hasattr(args, "engine_flags"):
            parser.error(f"'--' (the engine's own flags) is not taken by '{args.command}'")
        args.engine_flags = engine_argv
    try:
        return int(args._run(args))
    except KvwatchError as exc:
        print(f"kvwatch {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0
    except KeyboardInterrupt:
        return 130
    except (RecursionError, MemoryError, OverflowError, UnicodeError) as exc:
        # Input past what kvwatch can hold or compute: bad input, said in one line.
        print(
            f"kvwatch {args.command}: error: input kvwatch cannot handle ({type(exc).__name__})",
            file=sys.stderr,
        )
        return 2
    except Exception as exc:
        if os.environ.get("KVWATCH_TRACEBACK"):
            raise
        print(
            f"kvwatch {args.command}: internal error: {type(exc).__name__}: {exc} "
            "(a bug: please report it; KVWATCH_TRACEBACK=1 shows where)",
            file=sys.stderr,
        )
        return 1
