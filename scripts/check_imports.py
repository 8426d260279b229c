"""Import cycles inside a package: the module graph from `ast`, its strongly connected components.

Every `import` and `from ... import` counts, at module level or inside a function (a function-local
import still ties the two modules together, it only hides it). An edge goes to the most specific
module named: `from draftwise.bench import report` is an edge to draftwise.bench.report, `from
draftwise.bench import Summary` one to draftwise.bench (its __init__). A parent package run on the
way to a submodule is not an edge: that would make every package with re-exports a cycle.

    python scripts/check_imports.py [PACKAGE_DIR]    # default: draftwise/ beside this script

Prints each cycle (a component of more than one module) with the imports that close it, and exits
1 if there is any.
"""
from __future__ import annotations

import ast
import sys
from pathlib import Path


def module_names(pkg: Path) -> dict[str, Path]:
    """Dotted name -> file, for every .py file under the package directory."""
    out = {}
    for f in sorted(pkg.rglob("*.py")):
        parts = list(f.relative_to(pkg.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = f
    return out


def _target(name: str, modules: dict[str, Path]) -> str | None:
    """The longest prefix of `name` that is a module of the package."""
    parts = name.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in modules:
            return ".".join(parts[:n])
    return None


def imports(module: str, path: Path, modules: dict[str, Path]) -> list[tuple[str, int]]:
    """(imported module, line) for each import in the file that names a module of the package."""
    is_pkg = path.name == "__init__.py"
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: strip `level` trailing parts (one fewer from a package's __init__)
                base = module.split(".")[: len(module.split(".")) - node.level + is_pkg]
                stem = ".".join(base + ([node.module] if node.module else []))
            else:
                stem = node.module or ""
            names = [f"{stem}.{a.name}" for a in node.names]  # a submodule, or a name in `stem`
        else:
            continue
        for name in names:
            t = _target(name, modules)
            if t is not None and t != module:
                out.append((t, node.lineno))
    return out


def graph(pkg: Path) -> dict[str, dict[str, int]]:
    """module -> {imported module: first line importing it}."""
    modules = module_names(pkg)
    g: dict[str, dict[str, int]] = {}
    for m, path in modules.items():
        g[m] = {}
        for t, line in imports(m, path, modules):
            g[m].setdefault(t, line)
    return g


def cycles(g: dict[str, dict[str, int]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted, sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in g.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(g) + 100))
    for v in sorted(g):
        if v not in index:
            visit(v)
    return sorted(out)


def main(argv: list[str]) -> int:
    pkg = Path(argv[0]) if argv else Path(__file__).resolve().parent.parent / "draftwise"
    g = graph(pkg)
    found = cycles(g)
    root = pkg.parent
    for comp in found:
        print(f"cycle of {len(comp)} modules: {', '.join(comp)}")
        members = set(comp)
        for m in comp:
            f = module_names(pkg)[m].relative_to(root)
            for t, line in sorted(g[m].items()):
                if t in members:
                    print(f"  {f}:{line}: {m} -> {t}")
    n_edges = sum(len(v) for v in g.values())
    print(f"{len(g)} modules, {n_edges} imports, {len(found)} cycle(s)")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
