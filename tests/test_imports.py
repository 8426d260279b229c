"""The package's imports (scripts/check_imports.py): no cycles, and the layer order docs/design.md
writes (## Layers) holds; the checker finds a cycle, an upward import and an unplaced module when
there is one."""
import subprocess
import sys
from pathlib import Path


ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "check_imports.py"
sys.path.insert(0, str(SCRIPT.parent))
import check_imports  # noqa: E402

def test_no_import_cycles():
    r = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert not check_imports.cycles(check_imports.graph(ROOT / "draftwise"))


def test_checker_finds_function_local_and_relative_cycles(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from pkg.a import f\n")  # a re-export: not a cycle with a
    (pkg / "a.py").write_text("import os\nfrom pkg.sub import b\n\ndef f():\n    return b\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "b.py").write_text("def g():\n    from ..a import f  # hidden in a function\n    return f\n")
    (pkg / "c.py").write_text("from . import a\n")
    g = check_imports.graph(pkg)
    assert g["pkg.a"] == {"pkg.sub.b": 2} and g["pkg.sub.b"] == {"pkg.a": 2} and g["pkg.c"] == {"pkg.a": 1}
    assert check_imports.cycles(g) == [["pkg.a", "pkg.sub.b"]]
    r = subprocess.run([sys.executable, str(SCRIPT), str(pkg)], capture_output=True, text=True)
    assert r.returncode == 1 and "pkg/sub/b.py:2: pkg.sub.b -> pkg.a" in r.stdout
    (pkg / "sub" / "b.py").write_text("def g():\n    return 1\n")
    assert subprocess.run([sys.executable, str(SCRIPT), str(pkg)], capture_output=True).returncode == 0


# --- the layer order (docs/design.md, ## Layers) -------------------------------------------------

def test_layer_order_is_read_from_design_md_and_holds():
    layers = check_imports.read_layers(ROOT / "docs" / "design.md")
    names = [n for n, _ in layers]
    assert names[0] == "core" and names[-1] == "cli"
    g = check_imports.graph(ROOT / "draftwise")
    level, _, _ = check_imports.assign(sorted(g), "draftwise", layers)
    assert set(level) == set(g)  # every module placed

    def below(a, b):
        return level[f"draftwise.{a}"] < level[f"draftwise.{b}"]
    # the order as docs/design.md writes it: maths -> backends -> drafters -> planning -> loop -> build -> harness -> cli
    for a, b in (("sampling", "backends.base"), ("verify", "backends.base"), ("backends.base", "drafters.base"),
                 ("drafters.base", "planner"), ("acceptance", "scheduler"), ("policy", "scheduler"),
                 ("engine", "build"), ("build", "bench.run"), ("build", "server.app"), ("bench", "plan"),
                 ("plan", "cli"), ("extras", "cli")):
        assert below(a, b), (a, b)
    assert check_imports.layer_errors(ROOT / "draftwise", g, layers) == []
    r = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True)
    assert r.returncode == 0 and "0 layer error(s)" in r.stdout, r.stdout + r.stderr


LAYERS_DOC = """# Design
## Layers
text
```
low:   base, util.*      # comment
mid:   sub.*, util.special
high:  top
```
## Next
"""


def _layered(tmp_path, files: dict[str, str], doc: str = LAYERS_DOC) -> Path:
    pkg = tmp_path / "pkg"
    for name, text in {"__init__.py": "", "base.py": "", "util/__init__.py": "", "util/x.py": "",
                       "util/special.py": "", "sub/__init__.py": "", "sub/m.py": "", "top.py": "", **files}.items():
        (pkg / name).parent.mkdir(parents=True, exist_ok=True)
        (pkg / name).write_text(text)
    (tmp_path / "docs").mkdir(exist_ok=True)
    (tmp_path / "docs" / "design.md").write_text(doc.replace("low:   base", "low:   pkg, base"))
    return pkg


def _check(pkg):
    r = subprocess.run([sys.executable, str(SCRIPT), str(pkg)], capture_output=True, text=True)
    return r.returncode, r.stdout


def test_layer_patterns_exact_names_win_over_packages(tmp_path):
    pkg = _layered(tmp_path, {})
    layers = check_imports.read_layers(tmp_path / "docs" / "design.md")
    assert layers == [("low", ["pkg", "base", "util.*"]), ("mid", ["sub.*", "util.special"]), ("high", ["top"])]
    level, by, stale = check_imports.assign(sorted(check_imports.graph(pkg)), "pkg", layers)
    assert level == {"pkg": 0, "pkg.base": 0, "pkg.util": 0, "pkg.util.x": 0, "pkg.util.special": 1,
                     "pkg.sub": 1, "pkg.sub.m": 1, "pkg.top": 2}
    assert by["pkg.util.special"] == "util.special" and stale == []
    assert _check(pkg)[0] == 0


def test_an_import_of_a_higher_layer_fails_naming_the_line_and_the_fix(tmp_path):
    pkg = _layered(tmp_path, {"util/x.py": "import os\n\ndef f():\n    from pkg.sub import m  # hidden in a function\n",
                              "sub/m.py": "from pkg import top\nfrom pkg.util import special\n"})
    rc, out = _check(pkg)
    assert rc == 1
    assert ("pkg/util/x.py:4: pkg.util.x (low) imports pkg.sub.m (mid, a higher layer); fix: pkg.util.x may import "
            "only low and the layers below it") in out
    assert "pkg/sub/m.py:1: pkg.sub.m (mid) imports pkg.top (high, a higher layer)" in out
    assert "special" not in out.split("layer error")[0]  # same layer: allowed
    assert "2 layer error(s)" in out and "0 cycle(s)" in out


def test_a_module_without_a_layer_fails_with_where_it_fits(tmp_path):
    pkg = _layered(tmp_path, {"new.py": "from pkg.util import special\n", "top.py": "from pkg import new\n"})
    rc, out = _check(pkg)
    assert rc == 1
    assert ("pkg/new.py: pkg.new has no layer: add `new` to a line of ") in out
    assert ("the layers it fits: mid .. high (its highest import is pkg.util.special (mid); pkg.top (high) "
            "imports it)") in out
    pkg = _layered(tmp_path, {"new.py": "from pkg import top\n", "base.py": "from pkg import new\n"})
    assert "no layer fits as it stands (its highest import is pkg.top (high); pkg.base (low) imports it" \
        in _check(pkg)[1]


def test_a_name_placing_no_module_is_noted_and_a_malformed_list_fails(tmp_path):
    pkg = _layered(tmp_path, {}, LAYERS_DOC.replace("high:  top", "high:  top, coming"))
    rc, out = _check(pkg)
    assert rc == 0 and "`coming` in " in out and "places no module of pkg" in out  # another change may add it
    pkg = _layered(tmp_path, {}, LAYERS_DOC.replace("high:  top", "high:  top, base"))
    rc, out = _check(pkg)
    assert rc == 1 and "'base' is in layer 'low' already" in out
    pkg = _layered(tmp_path, {}, LAYERS_DOC.replace("high:  top", "high top"))
    rc, out = _check(pkg)
    assert rc == 1 and "expected 'layer: module, pkg.*, ...'" in out
