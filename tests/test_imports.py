"""The package's import graph has no cycles (scripts/check_imports.py), and the checker finds one
when there is one."""
import subprocess
import sys
from pathlib import Path

import pytest

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
