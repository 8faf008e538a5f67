"""The package's shape, as rules the type checker cannot state.

- No import cycle anywhere (function-local and TYPE_CHECKING imports count). Read from the source
  with ast, so an import hidden inside a function to dodge a circle at run time still fails here.
- No string-keyed bag of Any crosses a module boundary. A fact read back by string key from a
  ``dict[str, Any]`` is invisible to mypy: renaming an event field leaves every reader type-clean
  and silently wrong. Facts cross modules as typed dataclasses (kvwatch/state/facts.py); a JSON document
  is a ``kvwatch.core.jsontypes.JsonObject``. Every module of kvwatch/ is parsed, and a public function
  or method signature, a public class's field or a public module-level value annotated with
  ``dict[str, Any]``, ``Mapping[str, Any]`` (or any other mapping with ``Any`` keys or values, at
  any depth) or ``**kwargs: Any`` fails. Names starting with ``_`` (and everything inside a private
  class or a function body) are private and exempt.
- Importing a submodule counts as importing every package above it (their ``__init__`` runs first),
  so a package that re-exports its submodules and a submodule that imports a sibling through it
  form a cycle.
- Every module stays under MAX_LINES lines: split by concern, not by size.
- No module outside kvwatch/engines (and core/kinds.py, where the names are declared) spells an engine's name: code reaches an engine through the
  ``Engine`` object (kvwatch/engines/base.py, found in kvwatch/engines/registry.py), never by comparing names.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "kvwatch"
MAX_LINES = 500


# --- no import cycle ------------------------------------------------------------------------------
def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                head = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*head, base] if base else head)
            targets = [base, *(f"{base}.{alias.name}" for alias in node.names)]
        for target in targets:
            parts = target.split(".")
            # The target and every package above it: their __init__ modules run on this import.
            found |= {".".join(parts[: i + 1]) for i in range(len(parts))} & known
    found.discard(name)
    return found


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a path, or None (depth-first search with colours)."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)) is not None:
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)) is not None:
            return found
    return None


@functools.cache
def _package_graph() -> dict[str, frozenset[str]]:
    """kvwatch's import graph, read once for the checks on it (parsing every module takes a while)."""
    modules = _modules()
    return {name: frozenset(_imports(name, path, set(modules))) for name, path in modules.items()}


def test_no_import_cycle() -> None:
    graph = {name: set(targets) for name, targets in _package_graph().items()}
    cycle = _cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_the_cycle_check_sees_function_local_imports() -> None:
    graph = {"a": {"b"}, "b": {"a"}}
    assert _cycle(graph) == ["a", "b", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_a_package_reexporting_a_submodule_that_imports_a_sibling_is_a_cycle(tmp_path: Path) -> None:
    pkg = tmp_path / "kvwatch" / "pkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("from kvwatch.pkg.a import A\n", encoding="utf-8")
    (pkg / "a.py").write_text("from kvwatch.pkg.b import B\nA = 1\n", encoding="utf-8")
    (pkg / "b.py").write_text("B = 2\n", encoding="utf-8")
    known = {"kvwatch.pkg", "kvwatch.pkg.a", "kvwatch.pkg.b"}
    graph = {
        "kvwatch.pkg": _imports("kvwatch.pkg", pkg / "__init__.py", known),
        "kvwatch.pkg.a": _imports("kvwatch.pkg.a", pkg / "a.py", known),
        "kvwatch.pkg.b": _imports("kvwatch.pkg.b", pkg / "b.py", known),
    }
    assert _cycle(graph) is not None


# --- layers: imports run downward only ---------------------------------------------------------------
# docs/architecture.md's table, lowest first: a module may import its own package and the packages
# below it, never one above (function-local and TYPE_CHECKING imports count, as for cycles).
LAYERS: tuple[tuple[str, ...], ...] = (
    ("kvwatch", "kvwatch.core"),
    ("kvwatch.parsers",),
    ("kvwatch.state",),
    ("kvwatch.capacity",),
    ("kvwatch.engines",),
    ("kvwatch.sources",),
    ("kvwatch.analysis",),
    ("kvwatch.export",),
    ("kvwatch.mixin",),
    ("kvwatch.sidecar",),
    ("kvwatch.commands",),
    ("kvwatch.cli", "kvwatch.__main__"),
)


def layer_of(module: str) -> int:
    """The layer a module belongs to: the deepest LAYERS prefix it lies under."""
    best, depth = -1, -1
    for rank, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and prefix.count(".") > depth:
                best, depth = rank, prefix.count(".")
    assert best >= 0, f"{module} is in no layer of LAYERS"
    return best


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    return sorted(
        f"{name} (layer {layer_of(name)}) imports {target} (layer {layer_of(target)})"
        for name, targets in graph.items()
        for target in targets
        if layer_of(target) > layer_of(name)
    )


def test_imports_run_down_the_layer_table() -> None:
    graph = {name: set(targets) for name, targets in _package_graph().items()}
    assert upward_imports(graph) == []


def test_the_layer_check_sees_an_upward_import() -> None:
    graph = {"kvwatch.capacity.x": {"kvwatch.analysis.y"}, "kvwatch.analysis.y": {"kvwatch.core.z"}}
    assert upward_imports(graph) == ["kvwatch.capacity.x (layer 3) imports kvwatch.analysis.y (layer 6)"]


def test_the_top_level_holds_only_packages_and_the_cli_entry() -> None:
    modules = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert modules == ["__init__.py", "__main__.py", "cli.py"]


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_modules_stay_small(path: Path) -> None:
    lines = len(path.read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_LINES, f"{path} has {lines} lines (at most {MAX_LINES}): split it by concern"


# --- engine names only inside kvwatch/engines -------------------------------------------------------
def _engine_names() -> tuple[str, ...]:
    from kvwatch.core.kinds import ENGINE_NAMES

    return ENGINE_NAMES


def engine_literals(path: Path) -> list[str]:
    """String constants equal to an engine's name (docstrings are prose and exempt)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docs: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            first = node.body[0] if node.body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docs.add(id(first.value))
    names = _engine_names()
    return [
        f"{path}:{node.lineno}: {node.value!r}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in docs
        and node.value.lower() in names
    ]


def test_engine_names_are_spelled_only_in_engines() -> None:
    # core/kinds.py spells each name once, as the EngineName literal the rest of the tree uses.
    kinds = PACKAGE / "core" / "kinds.py"
    outside = [
        p for p in PACKAGE.rglob("*.py") if "engines" not in p.relative_to(PACKAGE).parts and p != kinds
    ]
    assert [hit for p in sorted(outside) for hit in engine_literals(p)] == []


def test_the_engine_name_check_sees_a_literal(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text('"""vllm in a docstring is prose."""\nX = {"vllm": 1}\n', encoding="utf-8")
    assert [hit.rsplit(": ", 1)[1] for hit in engine_literals(probe)] == ["'vllm'"]


# --- no Any-valued mapping in a public signature -------------------------------------------------
_MAPPINGS = frozenset(
    {"dict", "Dict", "Mapping", "MutableMapping", "DefaultDict", "defaultdict", "OrderedDict", "ChainMap"}
)


def _name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):  # typing.Any, collections.abc.Mapping
        return node.attr
    return None


def _is_any(node: ast.expr) -> bool:
    """``Any`` itself, or a union with ``Any`` in it (``Any | None``, ``Optional[Any]``)."""
    if _name(node) == "Any":
        return True
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return _is_any(node.left) or _is_any(node.right)
    if isinstance(node, ast.Subscript) and _name(node.value) in ("Optional", "Union"):
        args = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        return any(_is_any(a) for a in args)
    return False


def _parsed(annotation: ast.expr) -> ast.expr:
    """String annotations ('dict[str, Any]') as the expression they hold."""
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
        return ast.parse(annotation.value, mode="eval").body
    return annotation


def any_mapping(annotation: ast.expr) -> bool:
    """Whether an annotation holds a mapping with Any keys or values anywhere in it."""
    for node in ast.walk(_parsed(annotation)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if any_mapping(node):
                return True
        if isinstance(node, ast.Subscript) and _name(node.value) in _MAPPINGS:
            args = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
            if any(_is_any(a) for a in args):
                return True
    return False


def _public(name: str) -> bool:
    return not name.startswith("_") or (name.startswith("__") and name.endswith("__"))


def _signature_problems(fn: ast.FunctionDef | ast.AsyncFunctionDef, where: str) -> Iterator[str]:
    a = fn.args
    for arg in (*a.posonlyargs, *a.args, *a.kwonlyargs, *(x for x in (a.vararg,) if x is not None)):
        if arg.annotation is not None and any_mapping(arg.annotation):
            yield f"{where}: parameter {arg.arg!r}"
    if a.kwarg is not None and a.kwarg.annotation is not None:
        if _is_any(_parsed(a.kwarg.annotation)) or any_mapping(a.kwarg.annotation):
            yield f"{where}: **{a.kwarg.arg}"
    if fn.returns is not None and any_mapping(fn.returns):
        yield f"{where}: return type"


def _body_problems(body: list[ast.stmt], prefix: str, in_class: bool) -> Iterator[str]:
    for stmt in body:
        if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef) and _public(stmt.name):
            yield from _signature_problems(stmt, f"{prefix}{stmt.name}()")
        elif isinstance(stmt, ast.ClassDef) and _public(stmt.name):
            yield from _body_problems(stmt.body, f"{prefix}{stmt.name}.", in_class=True)
        elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            if _public(stmt.target.id) and any_mapping(stmt.annotation):
                kind = "field" if in_class else "module-level value"
                yield f"{prefix}{stmt.target.id}: {kind}"
        elif isinstance(stmt, ast.If):  # if TYPE_CHECKING: ... / version branches
            yield from _body_problems(stmt.body + stmt.orelse, prefix, in_class)


def module_problems(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    module = path.relative_to(PACKAGE.parent).with_suffix("").as_posix().replace("/", ".")
    return [f"{module}.{p}" for p in _body_problems(tree.body, "", in_class=False)]


MODULES = sorted(PACKAGE.rglob("*.py"))


@pytest.mark.parametrize("path", MODULES, ids=[str(p.relative_to(PACKAGE)) for p in MODULES])
def test_no_any_valued_mapping_crosses_a_module_boundary(path: Path) -> None:
    problems = module_problems(path)
    assert not problems, (
        "Any-valued mappings in public signatures or fields (use a typed dataclass from "
        "kvwatch/state/facts.py, or kvwatch.core.jsontypes.JsonObject for a JSON document):\n  "
        + "\n  ".join(problems)
    )


@pytest.mark.parametrize(
    ("source", "found"),
    [
        ("def f(x: dict[str, Any]) -> None: ...", True),
        ("def f(x: 'Mapping[str, Any]') -> None: ...", True),
        ("def f() -> list[dict[str, Any | None]]: ...", True),
        ("def f(**kw: Any) -> None: ...", True),
        ("class C:\n    facts: typing.Dict[str, typing.Any]", True),
        ("X: dict[str, Optional[Any]] = {}", True),
        ("def _f(x: dict[str, Any]) -> None: ...", False),
        ("class _C:\n    def f(self, x: dict[str, Any]) -> None: ...", False),
        ("def f() -> None:\n    x: dict[str, Any] = {}", False),
        ("def f(x: dict[str, int | None], y: Any) -> JsonObject: ...", False),
    ],
)
def test_the_rule_itself(source: str, found: bool, tmp_path: Path) -> None:
    tree = ast.parse(source)
    assert bool(list(_body_problems(tree.body, "", in_class=False))) is found
