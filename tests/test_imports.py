"""Imports go one way: no import cycle among the modules of the checked packages.

The graph is read from the source with ``ast`` (nothing is imported): every ``import`` /
``from ... import`` of an arrowload module, at module level or inside a function (an
import deferred into a function is still a dependency back up the flow), and the package
``__init__`` each imported submodule runs first. Cycles are the strongly connected
components with more than one module of the graph among the modules of ``CHECKED``
(``CHECKED`` holds every package: the check covers the whole of arrowload).
"""

from __future__ import annotations

import ast
from pathlib import Path

import arrowload

#: Packages (and modules) whose modules must sit on no import cycle: all of arrowload.
CHECKED = ("arrowload",)

#: The planner's layers, lowest first: across them, a module imports only from the layers
#: below its own (source <- plan <- optimize <- scan <- sql <- api). A plan node computes its
#: schema from its own data when it is built; it never calls back into the scan or SQL layer.
LAYERS = ("source", "plan", "optimize", "scan", "sql", "api")

ROOT = Path(arrowload.__file__).resolve().parent


def _modules() -> dict[str, Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def import_graph() -> dict[str, set[str]]:
    """arrowload module -> the arrowload modules it imports."""
    mods = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = package[:len(package) - node.level + 1] if node.level else []
                module = ".".join(base + ([node.module] if node.module else []))
                targets = [f"{module}.{a.name}" if f"{module}.{a.name}" in mods else module for a in node.names]
            else:
                continue
            for target in targets:
                # importing a.b.c runs a.b's __init__ first: count the packages on the way
                parts = target.split(".")
                for i in range(2, len(parts) + 1):
                    dotted = ".".join(parts[:i])
                    if dotted in mods and dotted != name and not name.startswith(dotted + "."):
                        found.add(dotted)
        graph[name] = found
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                component = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    component.append(w)
                    if w == v:
                        break
                if len(component) > 1:
                    out.append(sorted(component))
    return out


def _checked(module: str) -> bool:
    return any(module == c or module.startswith(c + ".") for c in CHECKED)


def test_no_import_cycles():
    graph = import_graph()
    among = {m: {w for w in ws if _checked(w)} for m, ws in graph.items() if _checked(m)}
    bad = cycles(among)
    assert not bad, "import cycles (one module of each must stop importing another): " + "; ".join(
        " <-> ".join(c) for c in bad)


def test_the_cycle_finder_finds_cycles():
    """The finder itself, on a known graph: a -> b -> c -> a is one cycle; d -> a is not on it."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_graph_sees_deferred_imports():
    """An import inside a function counts: the loader imports its profile lazily, and the
    graph has that edge (the profile must therefore never import the loader)."""
    graph = import_graph()
    assert "arrowload.pipeline.profile" in graph["arrowload.pipeline.loader"]
    assert "arrowload.pipeline.loader" not in graph["arrowload.pipeline.profile"]


def _layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else None


def test_the_graph_sees_the_planner():
    graph = import_graph()
    assert "arrowload.plan.nodes" in graph["arrowload.scan.execute"]  # edges are found
    assert "arrowload.scan.execute" in graph["arrowload.api"]
    planted = {m: set(e) for m, e in graph.items()}  # a cycle planted in a copy is found
    planted["arrowload.plan.nodes"].add("arrowload.api")
    assert any("arrowload.plan.nodes" in c and "arrowload.api" in c for c in cycles(planted))


def test_imports_flow_from_source_to_api():
    """Across the planner's layers, a module imports only from the layers below its own."""
    rank = {p: i for i, p in enumerate(LAYERS)}
    upward = [(m, t) for m, targets in sorted(import_graph().items()) if _layer(m)
              for t in sorted(targets) if _layer(t) and rank[_layer(t)] > rank[_layer(m)]]
    assert not upward, f"imports that go back up the flow ({' <- '.join(LAYERS)}): {upward}"
