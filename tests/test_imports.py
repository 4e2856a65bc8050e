"""No import cycle between the package's modules, counting the imports inside functions too (a lazy import does
not make a cycle go away; it hides it until the day someone moves the import to the top)."""

import ast
from pathlib import Path

import state_reduction

SRC = Path(state_reduction.__file__).resolve().parents[1]


def import_graph() -> dict[str, set[str]]:
    files = {".".join(f.relative_to(SRC).with_suffix("").parts).removesuffix(".__init__"): f
             for f in (SRC / "state_reduction").rglob("*.py")}

    def module_of(name: str) -> str | None:
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for name, f in files.items():
        deps = set()
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Import):
                deps |= {module_of(a.name) for a in node.names if a.name.startswith("state_reduction")}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("state_reduction"):
                deps |= {f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in files else module_of(node.module)
                         for a in node.names}
        graph[name] = {d for d in deps if d and d != name and not name.startswith(d + ".")}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, found = {}, {}, [], []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(component)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_cycles_are_found():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle():
    graph = import_graph()
    assert "state_reduction.tracking" in graph["state_reduction.wandb_workspace"]  # the graph sees imports
    assert cycles(graph) == [], f"import cycles: {cycles(graph)}"
