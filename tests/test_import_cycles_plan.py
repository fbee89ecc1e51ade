"""The planner's imports flow one way: source <- plan <- optimize <- scan <- sql <- api.

Read from the source files (every ``import`` statement, module level or inside a
function, as written), not from ``sys.modules``: an import inside a function is a
dependency all the same. A plan node computes its schema from its own data when it is
built; it never calls back into the scan or the SQL layer.
"""

from __future__ import annotations

import ast
from pathlib import Path

import arrowload

ROOT = Path(arrowload.__file__).resolve().parent

#: The packages (and top-level modules) of the planner, lowest layer first: each may
#: import only from the ones before it.
PACKAGES = ("source", "plan", "optimize", "scan", "sql", "api")


def _modules() -> dict[str, tuple[Path, bool]]:
    """Dotted name -> (file, is a package ``__init__``) of every arrowload module."""
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        if is_pkg:
            parts = parts[:-1]
        out[".".join(parts)] = (path, is_pkg)
    return out


def _imports(name: str, path: Path, is_pkg: bool, known: set[str]) -> set[str]:
    """The arrowload modules ``name`` imports anywhere in its file."""
    here = name.split(".") if is_pkg else name.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[:len(here) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:  # ``from pkg import submodule`` imports the submodule
                sub = f"{target}.{alias.name}"
                found.add(sub if sub in known else target)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {m for m in found if m in known and m != name}


def _package(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in PACKAGES else None


def _graph() -> dict[str, set[str]]:
    """Import edges between the modules of ``PACKAGES``."""
    mods = _modules()
    ours = {m for m in mods if _package(m) is not None}
    return {m: _imports(m, *mods[m], known=ours) for m in sorted(ours)}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    component.append(top)
                    if top == node:
                        break
                if len(component) > 1:
                    out.append(sorted(component))
    return out


def test_the_graph_sees_the_planner():
    graph = _graph()
    assert {"arrowload.api", "arrowload.plan.nodes", "arrowload.scan.execute", "arrowload.sql.builder",
            "arrowload.source.files", "arrowload.optimize.prune_row_groups"} <= set(graph)
    assert "arrowload.plan.nodes" in graph["arrowload.scan.execute"]  # edges are found
    assert "arrowload.scan.execute" in graph["arrowload.api"]
    # a cycle planted in a copy of the graph is found
    planted = {m: set(e) for m, e in graph.items()}
    planted["arrowload.plan.nodes"].add("arrowload.api")
    assert any("arrowload.plan.nodes" in c and "arrowload.api" in c for c in _cycles(planted))


def test_no_import_cycles():
    cycles = _cycles(_graph())
    assert not cycles, f"import cycles among {PACKAGES}: {cycles}"


def test_imports_flow_from_source_to_api():
    """Across packages, a module imports only from the layers below its own."""
    rank = {p: i for i, p in enumerate(PACKAGES)}
    upward = [(m, t) for m, targets in _graph().items() for t in sorted(targets)
              if rank[_package(t)] > rank[_package(m)]]
    assert not upward, "imports that go back up the flow (source <- plan <- optimize <- scan <- sql " \
                       f"<- api): {upward}"
