"""The rooms hold (docs/architecture.md): a crawl loop one can read, no import circle."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
MODULES = {
    ".".join(p.relative_to(SRC).with_suffix("").parts).removesuffix(".__init__"): p
    for p in sorted((SRC / "courtly").rglob("*.py"))
}


def imports(name: str) -> set[str]:
    """The courtly modules `name` imports when it runs (anywhere in it, but not for types)."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    stack: list[ast.AST] = [ast.parse(path.read_text())]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            stack.extend(node.orelse)
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
        stack.extend(ast.iter_child_nodes(node))
    return {m for m in found if m in MODULES and m != name}


def test_the_crawl_loop_is_short_and_no_class_is_long() -> None:
    assert len((SRC / "courtly" / "crawler.py").read_text().splitlines()) <= 350
    long = [f"{name}.{node.name}: {node.end_lineno - node.lineno + 1} lines"
            for name, path in MODULES.items() for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.ClassDef) and node.end_lineno is not None
            and node.end_lineno - node.lineno + 1 > 300]
    assert long == []


def test_no_import_circle() -> None:
    graph = {name: imports(name) for name in MODULES}
    assert "courtly.distributed" not in graph["courtly.crawler"]
    assert "courtly.store.base" not in graph["courtly.model"]
    circles = []
    for start in graph:  # a path from a module back to itself
        seen, todo = set(), list(graph[start])
        while todo:
            module = todo.pop()
            if module == start:
                circles.append(start)
                break
            if module not in seen:
                seen.add(module)
                todo.extend(graph[module])
    assert circles == []
