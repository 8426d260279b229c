"""The HTML report opens in headless Chromium without errors (Debian's chromium package; skipped
where it is not installed — .ci/run installs it when it can)."""
import shutil
import subprocess

import pytest

from draftwise.bench import run_bench, summarise, write_report
from fakes import CharTokenizer
from test_bench import config, fake_engines

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed")


def open_in_chromium(path) -> tuple[str, list[str]]:
    """The rendered DOM and the console messages of errors (uncaught exceptions, console.error)."""
    run = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr",
                          "--log-level=0", "--virtual-time-budget=2000", "--dump-dom", f"file://{path}"],
                         capture_output=True, text=True, timeout=120)
    console = [line for line in run.stderr.splitlines() if ":CONSOLE" in line]
    errors = [line for line in console if "Uncaught" in line or "rror" in line]
    return run.stdout, errors


def test_the_check_sees_a_broken_page(tmp_path):
    bad = tmp_path / "bad.html"
    bad.write_text("<html><body><script>throw new Error('boom')</script></body></html>")
    _, errors = open_in_chromium(bad)
    assert any("boom" in e for e in errors)


def test_report_opens_without_errors(tmp_path):
    path = run_bench(config(tmp_path), engines=fake_engines(), tokenizer=CharTokenizer(), progress=False)
    page = write_report(summarise(path), tmp_path / "report.html")
    dom, errors = open_in_chromium(page.resolve())
    assert errors == []
    assert "Output check" in dom and "ngram:4" in dom and "<img" in dom  # tables and the embedded plots rendered
