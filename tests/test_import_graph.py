"""No import circle among keras_attn's modules (issue 32: the front door's circle is gone).

The graph is built from module-level imports (`import a.b`, `from a import b`, relative
ones), read with `ast`: what Python runs when a module is first imported. Imports inside
functions run later, when everything they name is loaded, and cannot form a circle at
import time, so they are left out.
"""

import ast
import pathlib

import keras_attn

PACKAGE = pathlib.Path(keras_attn.__file__).parent


def _module_name(path):
    parts = ("keras_attn", *path.relative_to(PACKAGE).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules():
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _resolve(name, modules):
    """`name` or its longest prefix that is a module of the package (None: not ours)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def import_graph():
    """`{module: {modules it imports at module level}}` within keras_attn."""
    modules = _modules()
    graph = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges = set()
        for node in ast.parse(path.read_text()).body:
            targets = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")
                    anchor = anchor[:len(anchor) - node.level + 1]
                    base = ".".join(anchor + ([base] if base else []))
                targets = [f"{base}.{alias.name}" for alias in node.names] + [base]
            for target in targets:
                found = _resolve(target, modules)
                if found and found != name and not name.startswith(found + "."):
                    edges.add(found)  # a submodule importing its own package is no circle
        graph[name] = edges
    return graph


def find_cycle(graph):
    """One import circle as a list `[a, b, ..., a]`, or None."""
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_the_graph_sees_the_package():
    graph = import_graph()
    assert "keras_attn.layers.multi_head_attention" in graph
    assert "keras_attn.attention" in graph["keras_attn.layers.multi_head_attention"]


def test_no_import_circle():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import circle: " + " -> ".join(cycle)


def test_the_check_finds_a_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
