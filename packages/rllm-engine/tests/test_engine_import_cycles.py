"""No import cycle among rllm.engine's modules (docs/architecture.md, "The engine's layout").

Every import counts: at module level, inside a function (imported late) and under
``TYPE_CHECKING``: each is a dependency a reader follows, and a cycle of them is a knot no module
of which can be read, tested or moved without the others. A module importing its own package's
``__init__`` is not counted for the package's sake alone (``from rllm.engine.sandbox import
stale`` is an import of ``stale``). Where a cycle appears, break it as the existing ones were:
a protocol for what one side uses of the other (``training.async_loop.StepperTrainer``), a
factory handed down instead of a class imported up (``rollout.worker_pool.EngineFactory``), or
the shared piece moved into a module both import (``rollout.worker_pool``, ``rollout.frames``).
"""

from __future__ import annotations

import ast
from pathlib import Path

import rllm.engine

ENGINE = Path(rllm.engine.__file__).parent


def module_names(package_dir: Path, package: str) -> dict[str, Path]:
    """Every module under ``package_dir`` by dotted name (a package by its own name)."""
    out: dict[str, Path] = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = [package, *path.relative_to(package_dir).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the modules of ``modules`` it imports (any import statement anywhere in it)."""
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    here = name.split(".") if is_package else name.split(".")[:-1]
                    anchor = here[: len(here) - node.level + 1]
                    base = ".".join([*anchor, *([node.module] if node.module else [])])
                # `from pkg import sub` imports the module pkg.sub; `from pkg import name` pkg itself.
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            for target in targets:
                while target and target not in modules:  # `import a.b.c` where only a.b is ours
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph[name].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def describe(graph: dict[str, set[str]], component: list[str]) -> str:
    members = set(component)
    return "; ".join(f"{m} -> {', '.join(sorted(graph[m] & members))}" for m in component)


def test_the_engine_has_no_import_cycle() -> None:
    modules = module_names(ENGINE, "rllm.engine")
    assert "rllm.engine.rollout.rollout_engine" in modules and len(modules) > 50  # it found them
    graph = import_graph(modules)
    found = cycles(graph)
    assert found == [], "import cycles in rllm.engine (break them; see this file's docstring): " + " | ".join(
        describe(graph, c) for c in found
    )


def test_the_check_sees_a_cycle_through_type_checking_and_late_imports(tmp_path: Path) -> None:
    """The detector itself: a cycle held only by a TYPE_CHECKING import, one by an import inside a
    function, a relative one, and the package-__init__ pattern that is not a cycle."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from pkg.a import A\n")
    (pkg / "a.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.b import B\nA = 1\n"
    )
    (pkg / "b.py").write_text("import pkg.a\nB = 2\n")
    (pkg / "sub" / "__init__.py").write_text("from pkg.sub.c import C\n")
    (pkg / "sub" / "c.py").write_text("from pkg.sub import d\nC = 3\n")
    (pkg / "sub" / "d.py").write_text("def late():\n    from . import e\n")
    (pkg / "sub" / "e.py").write_text("from .d import late\n")
    graph = import_graph(module_names(pkg, "pkg"))
    assert cycles(graph) == [["pkg.a", "pkg.b"], ["pkg.sub.d", "pkg.sub.e"]]
