"""The package's imports checked: the layer order written in docs/design.md, and no import cycles.

The module graph comes from `ast`. Every `import` and `from ... import` counts, at module level or
inside a function (a function-local import still ties the two modules together, it only hides it).
An edge goes to the most specific module named: `from draftwise.bench import report` is an edge to
draftwise.bench.report, `from draftwise.bench import Summary` one to draftwise.bench (its __init__).
A parent package run on the way to a submodule is not an edge: that would make every package with
re-exports a cycle.

Layers: docs/design.md's section `## Layers` holds, in its first fenced block, one line a layer,
lowest first: `name: pattern, pattern, ...`, a pattern being a module name relative to the package
(`models.load`) or `pkg.*` (the package `pkg` and every module under it); an exact name wins over a
`pkg.*`, a longer `pkg.*` over a shorter; `#` starts a comment. A module may import modules of its
own layer or of lower ones. It fails, naming the file, line and fix, on an import of a higher layer
and on a module that no pattern places (saying which layers would fit it); a name placing no module
is only noted (a module removed, or one that another change is about to add).

    python scripts/check_imports.py [PACKAGE_DIR] [--layers FILE]

Default: draftwise/ beside this script with docs/design.md's layers. Given a PACKAGE_DIR, the layers
come from --layers, else from PACKAGE_DIR/../docs/design.md if it has the section, else only cycles
are checked. Exits 1 on any cycle or layer error.
"""
from __future__ import annotations

import argparse
import ast
import re
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


LAYERS_HEADING = "## Layers"


class LayerError(ValueError):
    """The layer list cannot be read."""


def read_layers(doc: Path) -> list[tuple[str, list[str]]] | None:
    """[(layer name, [pattern, ...]), ...], lowest layer first, from the first fenced block of the
    doc's `## Layers` section; None when the doc has no such section."""
    lines = doc.read_text(encoding="utf-8").splitlines()
    try:
        start = next(i for i, line in enumerate(lines) if line.strip() == LAYERS_HEADING)
    except StopIteration:
        return None
    block: list[tuple[int, str]] | None = None
    for i in range(start + 1, len(lines)):
        line = lines[i]
        if block is None:
            if line.startswith("## ") or line.startswith("# "):
                break
            if line.startswith("```"):
                block = []
        elif line.startswith("```"):
            break
        else:
            block.append((i + 1, line))
    if not block:
        raise LayerError(f"{doc}: no fenced block of layers under {LAYERS_HEADING!r}")
    out: list[tuple[str, list[str]]] = []
    seen: dict[str, str] = {}
    for n, line in block:
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        m = re.fullmatch(r"([A-Za-z][\w-]*)\s*:\s*(.*)", text)
        if not m:
            raise LayerError(f"{doc}:{n}: expected 'layer: module, pkg.*, ...', got {line.strip()!r}")
        name, pats = m.group(1), [p.strip() for p in m.group(2).split(",") if p.strip()]
        if any(name == layer for layer, _ in out):
            raise LayerError(f"{doc}:{n}: layer {name!r} appears twice")
        for p in pats:
            if not re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*(\.\*)?", p):
                raise LayerError(f"{doc}:{n}: {p!r} is neither a module name nor 'pkg.*'")
            if p in seen:
                raise LayerError(f"{doc}:{n}: {p!r} is in layer {seen[p]!r} already")
            seen[p] = name
        out.append((name, pats))
    return out


def _relative(module: str, package: str) -> str:
    return module[len(package) + 1:] if module.startswith(package + ".") else module


def assign(modules: list[str], package: str,
           layers: list[tuple[str, list[str]]]) -> tuple[dict[str, int], dict[str, str], list[str]]:
    """(module -> layer index, module -> the pattern placing it, patterns placing no module). The
    package itself is called by its own name (`draftwise`), its modules relative to it."""
    level: dict[str, int] = {}
    by: dict[str, str] = {}
    used: set[str] = set()
    for m in modules:
        rel = _relative(m, package)
        best: tuple[int, int, str] | None = None  # (specificity, layer, pattern)
        for i, (_, pats) in enumerate(layers):
            for p in pats:
                if p.endswith(".*"):
                    stem = p[:-2]
                    hit = rel == stem or rel.startswith(stem + ".")
                    rank = len(stem.split("."))
                else:
                    hit, rank = rel == p, 1000
                if hit and (best is None or rank > best[0]):
                    best = (rank, i, p)
        if best is not None:
            level[m], by[m] = best[1], best[2]
            used.add(best[2])
    stale = [p for _, pats in layers for p in pats if p not in used]
    return level, by, stale


def layer_errors(pkg: Path, g: dict[str, dict[str, int]], layers: list[tuple[str, list[str]]],
                 doc: str = "docs/design.md") -> list[str]:
    """One message per upward import and per module without a layer."""
    files = module_names(pkg)
    root, package = pkg.parent, pkg.name
    level, _, _ = assign(sorted(g), package, layers)
    names = [name for name, _ in layers]
    where = f"{doc} ({LAYERS_HEADING}, lowest layer first)"
    out = []
    for m in sorted(g):
        if m in level:
            continue
        placed = sorted((level[t], t) for t in g[m] if t in level)
        lo = placed[-1][0] if placed else 0
        users = sorted((level[u], u) for u in g if m in g[u] and u in level)
        hi = users[0][0] if users else len(layers) - 1
        why = (f"its highest import is {placed[-1][1]} ({names[lo]})" if placed
               else f"it imports no module of {package}")
        if users:
            why += f"; {users[0][1]} ({names[hi]}) imports it"
        if lo <= hi:
            fits = f"the layer it fits: {names[lo]}" if lo == hi else f"the layers it fits: {names[lo]} .. {names[hi]}"
            hint = f"{fits} ({why}); choose the one its job belongs to"
        else:
            hint = f"no layer fits as it stands ({why}, a lower layer): one of those imports must go"
        out.append(f"{files[m].relative_to(root)}: {m} has no layer: add `{_relative(m, package)}` to a line of "
                   f"{where}; {hint}")
    for m in sorted(g):
        if m not in level:
            continue
        for t, line in sorted(g[m].items(), key=lambda kv: kv[1]):
            if t in level and level[t] > level[m]:
                a, b = names[level[m]], names[level[t]]
                out.append(f"{files[m].relative_to(root)}:{line}: {m} ({a}) imports {t} ({b}, a higher layer); "
                           f"fix: {m} may import only {a} and the layers below it: move what it needs from {t} "
                           f"into {a} or lower, or have its caller pass it in (an argument, a callback); if the "
                           f"order itself is what should change, move a module to another line of {where}")
    return out


def stale_names(pkg: Path, g: dict[str, dict[str, int]], layers: list[tuple[str, list[str]]]) -> list[str]:
    """Names of the layer list that place no module (a module removed, renamed or not yet written)."""
    return assign(sorted(g), pkg.name, layers)[2]


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("package", nargs="?", default=None, help="the package directory (default: draftwise/)")
    ap.add_argument("--layers", default=None, help="the doc holding the layer list (default: docs/design.md)")
    a = ap.parse_args(argv)
    here = Path(__file__).resolve().parent.parent
    pkg = Path(a.package) if a.package else here / "draftwise"
    doc = Path(a.layers) if a.layers else (pkg.resolve().parent / "docs" / "design.md" if a.package
                                            else here / "docs" / "design.md")
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
    layers = None
    if doc.is_file():
        try:
            layers = read_layers(doc)
        except LayerError as e:
            print(f"layer list: {e}")
            return 1
    if layers is None and (a.layers or not a.package):
        print(f"{doc}: no {LAYERS_HEADING!r} section with the layer list")
        return 1
    errors = layer_errors(pkg, g, layers, _shown(doc)) if layers is not None else []
    for e in errors:
        print(e)
    for p in stale_names(pkg, g, layers) if layers is not None else []:  # a warning: a module may be on its way
        print(f"note: `{p}` in {_shown(doc)}'s layer list places no module of {pkg.name} (removed or renamed?)")
    n_edges = sum(len(v) for v in g.values())
    order = f"{len(layers)} layers ({' < '.join(n for n, _ in layers)}), {len(errors)} layer error(s)" \
        if layers is not None else "no layer list: cycles only"
    print(f"{len(g)} modules, {n_edges} imports, {len(found)} cycle(s); {order}")
    return 1 if found or errors else 0


def _shown(doc: Path) -> str:
    try:
        return str(doc.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(doc)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
