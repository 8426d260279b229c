"""Optional packages (draftwise/extras.py): the README's first command installs every extra a user
runs next, at the pins the tests run; a missing one ends a command in one line naming the extra
(exit status 2), never a traceback; bench still writes its report without plots and says so once."""
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from draftwise import extras

ROOT = Path(__file__).resolve().parent.parent

# A sitecustomize that makes the named top-level packages absent: `import fastapi` raises
# ModuleNotFoundError(name='fastapi'), as on a machine without the extra
BLOCKER = """import sys
BLOCKED = set({names!r})
class _Absent:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
sys.meta_path.insert(0, _Absent())
"""


def run_cli(tmp_path, blocked, *args, timeout=300):
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(BLOCKER.format(names=sorted(blocked)))
    env = {**__import__("os").environ, "PYTHONPATH": str(site)}
    return subprocess.run([sys.executable, "-m", "draftwise.cli", *args], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=timeout)


def _pyproject():
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]


def _pins(reqs):
    return dict(re.fullmatch(r"([A-Za-z0-9_.-]+)==(\S+)", r).groups() for r in reqs)


# --- set-up ---------------------------------------------------------------------------------------

def test_the_readme_first_command_installs_every_extra_a_command_needs():
    default = re.search(r'^extras="\$\{1:-([a-z,]+)\}"$', (ROOT / "scripts" / "setup.sh").read_text(), re.M)
    assert default, "scripts/setup.sh: extras=\"${1:-...}\" not found"
    assert set(extras.EXTRAS.values()) <= set(default.group(1).split(","))  # llama, server, bench
    block = re.search(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.S).group(1).splitlines()
    assert block[0].startswith("bash scripts/setup.sh && .venv/bin/draftwise generate")  # one line, the defaults
    test_cmd = "bash scripts/setup.sh llama,test && .venv/bin/python -m pytest -q"
    assert block[1] == test_cmd and test_cmd in (ROOT / ".ci" / "run").read_text()


def test_each_extra_is_pinned_and_the_tests_run_the_same_pins():
    opt = _pyproject()
    for extra in set(extras.EXTRAS.values()):
        assert all("==" in r for r in opt[extra]), (extra, opt[extra])
    test = _pins(r for r in opt["test"] if "==" in r)
    for extra in ("server", "bench"):  # the test extra holds what serve and bench run, at the same versions
        assert _pins(opt[extra]).items() <= test.items(), extra


def test_each_optional_module_belongs_to_its_extra():
    from importlib.metadata import packages_distributions

    dists = packages_distributions()
    opt = _pyproject()
    for module, extra in extras.EXTRAS.items():
        names = {re.split(r"[=<>\[]", r)[0].lower().replace("_", "-") for r in opt[extra]}
        if module not in dists:
            continue  # not installed here: its distribution cannot be looked up
        assert {d.lower().replace("_", "-") for d in dists[module]} & names, (module, extra, dists[module])


# --- the one-line error ---------------------------------------------------------------------------

def _one_line(r, command, extra, missing):
    assert r.returncode == 2, r.stdout + r.stderr
    assert "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0] == f"draftwise {command} needs the {extra} extra: {extras.install_command(extra)} (missing: {missing})"
    assert f"[{extra}]'" in lines[0] and "pip install" in lines[0]


@pytest.mark.parametrize("module", ["fastapi", "uvicorn", "prometheus_client"])
def test_serve_without_the_server_extra_is_one_line(tmp_path, module):
    _one_line(run_cli(tmp_path, {module}, "serve", "--port", "0"), "serve", "server", module)


def test_a_broken_optional_package_names_what_it_lacks(tmp_path):
    pytest.importorskip("fastapi")
    _one_line(run_cli(tmp_path, {"starlette"}, "serve"), "serve", "server", "fastapi's dependency starlette")


def test_llama_backend_without_the_llama_extra_is_one_line(tmp_path):
    r = run_cli(tmp_path, {"llama_cpp"}, "generate", "--backend", "llama.cpp", "--drafter", "none",
                "--prompt", "hi", "--max-tokens", "1")
    _one_line(r, "generate", "llama", "llama_cpp")


def test_a_missing_module_that_is_no_extra_is_a_bug_and_propagates(monkeypatch):
    from draftwise import cli

    def broken(a):
        raise ModuleNotFoundError("No module named 'nowhere'", name="nowhere")

    monkeypatch.setattr(cli, "cmd_generate", broken)
    with pytest.raises(ModuleNotFoundError):
        cli.main(["generate"])
    assert extras.message("generate", ModuleNotFoundError(name="nowhere")) is None
    assert extras.message("x", ModuleNotFoundError(name="matplotlib.pyplot")) == \
        str(extras.MissingExtra("x", "bench", "matplotlib"))


def test_bench_without_the_bench_extra_writes_its_report_without_plots_and_says_so_once(tmp_path):
    pytest.importorskip("matplotlib")
    from test_bench import config, fake_engines

    from draftwise.bench import run_bench
    from fakes import CharTokenizer

    out = tmp_path / "out"
    run_bench(config(tmp_path), engines=fake_engines(), tokenizer=CharTokenizer(), progress=False)
    r = run_cli(tmp_path, {"matplotlib"}, "bench", "--report-only", "--out", str(out))
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stdout + r.stderr
    page = (out / "report.html").read_text()
    assert "data:image/png;base64," not in page and "</html>" in page  # written, without plots
    note = [line for line in r.stderr.splitlines() if "extra" in line]
    assert note == [f"draftwise bench: the report has no plots: they need the bench extra: "
                    f"{extras.install_command('bench')} (missing: matplotlib)"], r.stderr
    r = run_cli(tmp_path, set(), "bench", "--report-only", "--out", str(out))  # with matplotlib: plots, no note
    assert r.returncode == 0 and "extra" not in r.stderr, r.stderr
    assert "data:image/png;base64," in (out / "report.html").read_text()
