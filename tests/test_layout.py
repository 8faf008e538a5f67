"""The package's shape, as rules the type checker cannot state.

- No import cycle anywhere (function-local and TYPE_CHECKING imports count). Read from the source
  with ast, so an import hidden inside a function to dodge a circle at run time still fails here.
- No string-keyed bag of Any crosses a module boundary. A fact read back by string key from a
  ``dict[str, Any]`` is invisible to mypy: renaming an event field leaves every reader type-clean
  and silently wrong. Facts cross modules as typed dataclasses (kvwatch/facts.py); a JSON document
  is a ``kvwatch.jsontypes.JsonObject``. Every module of kvwatch/ is parsed, and a public function
  or method signature, a public class's field or a public module-level value annotated with
  ``dict[str, Any]``, ``Mapping[str, Any]`` (or any other mapping with ``Any`` keys or values, at
  any depth) or ``**kwargs: Any`` fails. Names starting with ``_`` (and everything inside a private
  class or a function body) are private and exempt.
- The capacity model's modules stay under MAX_LINES lines.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "kvwatch"
# Modules the capacity model keeps under this many lines (the rest of the tree has its own step).
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
        found |= {t for t in targets if t in known and t != name}
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


def test_no_import_cycle() -> None:
    modules = _modules()
    graph = {name: _imports(name, path, set(modules)) for name, path in modules.items()}
    cycle = _cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_the_cycle_check_sees_function_local_imports() -> None:
    graph = {"a": {"b"}, "b": {"a"}}
    assert _cycle(graph) == ["a", "b", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_capacity_modules_stay_small() -> None:
    for path in sorted((PACKAGE / "capacity").glob("*.py")):
        lines = len(path.read_text(encoding="utf-8").splitlines())
        assert lines <= MAX_LINES, f"{path.name} has {lines} lines (at most {MAX_LINES})"


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
        "kvwatch/facts.py, or kvwatch.jsontypes.JsonObject for a JSON document):\n  " + "\n  ".join(problems)
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
