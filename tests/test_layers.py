"""The import graph of tokenwire's own modules: no cycles, and no arrow up.

Every `import` of a tokenwire module counts, wherever it is written: at module level, inside a
function ("lazy": an import put off to dodge a cycle is still the cycle), and under
`TYPE_CHECKING` ("typing": a type that must not be imported is a dependency all the same).

The layers, top to bottom; a module imports only from its own unit (the subpackage, or the
module itself for a top-level module) and from units in layers below it, never from a sibling
in its own layer:

    __main__                            `python -m tokenwire`
    cli                                 `tokenwire serve | tokenize | ...`
    api, rl                             HTTP app, workers, startup; RL tools (rollout export)
    tokenwire                           the package root: the public surface, `__version__`
    serving, client                     one service per API family; the Python SDK
    metrics                             prometheus series
    engines                             prompt ids in, sampled ids out
    tokenizers, storage                 tokenizer versions; stored ids
    protocol, config                    wire models; settings
    errors, weights, policy, packaged,  leaves: the exception tree, weight bounds, the content
    _heap                               policy, the packaged model, the heap's trim
"""

from __future__ import annotations

import ast
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "tokenwire"

LAYERS: tuple[frozenset[str], ...] = tuple(frozenset(s.split()) for s in (
    "__main__",
    "cli",
    "api rl",
    "tokenwire",
    "serving client",
    "metrics",
    "engines",
    "tokenizers storage",
    "protocol config",
    "errors weights policy packaged _heap",
))

Edge = tuple[str, str]


def _modules() -> dict[str, tuple[Path, bool]]:
    """Each module's dotted name: its file, and whether it is a package's `__init__`."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        found[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return found


def _targets(node: ast.Import | ast.ImportFrom, name: str, is_package: bool,
             modules: dict[str, tuple[Path, bool]]) -> Iterator[str]:
    """The tokenwire modules an import statement in module `name` imports."""
    if isinstance(node, ast.Import):
        yield from (a.name for a in node.names if a.name.split(".")[0] == "tokenwire")
        return
    base = node.module or ""
    if node.level:
        parts = name.split(".")[:len(name.split(".")) - node.level + is_package]
        base = ".".join([*parts, *([node.module] if node.module else [])])
    if base.split(".")[0] != "tokenwire":
        return
    for alias in node.names:  # `from pkg import sub` imports the submodule
        sub = f"{base}.{alias.name}"
        yield sub if sub in modules else base


def _imports() -> dict[Edge, set[str]]:
    """Every edge of the graph, with how it is imported: module, lazy, typing."""
    modules = _modules()
    edges: dict[Edge, set[str]] = defaultdict(set)
    for name, (path, is_package) in modules.items():
        def walk(nodes: list[ast.AST], kind: str, name: str = name,
                 is_package: bool = is_package) -> None:
            for node in nodes:
                if isinstance(node, ast.Import | ast.ImportFrom):
                    for target in _targets(node, name, is_package, modules):
                        if target != name:
                            edges[(name, target)].add(kind)
                elif isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                    walk(list(node.body), "typing")
                    walk(list(node.orelse), kind)
                elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                    walk(list(ast.iter_child_nodes(node)),
                         "typing" if kind == "typing" else "lazy")
                else:
                    walk(list(ast.iter_child_nodes(node)), kind)

        walk([ast.parse(path.read_text(encoding="utf-8"))], "module")
    return edges


def _cycles(edges: dict[Edge, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's)."""
    graph: dict[str, set[str]] = defaultdict(set)
    for a, b in edges:
        graph[a].add(b)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _unit(module: str) -> str:
    """`tokenwire.engines.upstream.board` -> `engines`; the root package -> `tokenwire`."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def _layer(unit: str) -> int:
    for rank, layer in enumerate(LAYERS):
        if unit in layer:
            return rank
    raise AssertionError(f"{unit} is in no layer: place it in LAYERS (and the docstring)")


def _show(edge: Edge, kinds: set[str]) -> str:
    a, b = (m.removeprefix("tokenwire.") for m in edge)
    return f"{a} -> {b} ({', '.join(sorted(kinds))})"


def test_no_import_cycles() -> None:
    edges = _imports()
    report = []
    for component in _cycles(edges):
        inside = [_show(e, k) for e, k in sorted(edges.items())
                  if e[0] in component and e[1] in component]
        report.append(f"{len(component)} modules:\n    " + "\n    ".join(inside))
    assert not report, "import cycles:\n" + "\n".join(report)


def test_no_arrow_up() -> None:
    up = [_show(e, k) for e, k in sorted(_imports().items())
          if _unit(e[0]) != _unit(e[1]) and _layer(_unit(e[0])) >= _layer(_unit(e[1]))]
    assert not up, "imports of a layer above or beside:\n    " + "\n    ".join(up)


def test_every_unit_has_a_layer() -> None:
    units = {_unit(m) for m in _modules()}
    assert units == set().union(*LAYERS), "LAYERS names exactly the package's units"
