"""The HTML report in headless Chromium (Debian's chromium package; skipped where it is not
installed — .ci/run installs it when it can): it opens without errors, and at a typical window
(1280x800) its first screen shows the verdicts and the speedup chart, with the divergence rows
folded until their <details> is opened. The screenshot of that first screen is kept beside the
test's report (pytest's tmp_path; `--basetemp DIR` puts it where you want it)."""
import html
import json
import re
import shutil
import struct
import subprocess

import pytest

from draftwise.bench import run_bench, summarise, write_report
from fakes import CharTokenizer
from test_bench import AcceptAll, SevenDrafter, config, fake_engines

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed")
WINDOW = (1280, 800)


def chromium(path, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                           f"--window-size={WINDOW[0]},{WINDOW[1]}", "--virtual-time-budget=2000", *flags,
                           f"file://{path}"], capture_output=True, text=True, timeout=120)


def open_in_chromium(path) -> tuple[str, list[str]]:
    """The rendered DOM and the console messages of errors (uncaught exceptions, console.error)."""
    run = chromium(path, "--enable-logging=stderr", "--log-level=0", "--dump-dom")
    console = [line for line in run.stderr.splitlines() if ":CONSOLE" in line]
    errors = [line for line in console if "Uncaught" in line or "rror" in line]
    return run.stdout, errors


# Page coordinates (top and bottom, CSS pixels) of the parts a reader must see first, and whether the
# first divergence row is rendered before and after its <details> is opened (a closed details keeps
# its content laid out but hidden); written into the DOM for --dump-dom.
PROBE = """<script>
addEventListener('load', () => {
  const box = sel => { const e = document.querySelector(sel); if (!e) return null;
    const b = e.getBoundingClientRect();
    return {top: b.top + scrollY, bottom: b.bottom + scrollY, height: b.height, visible: e.checkVisibility()}; };
  const details = document.querySelector('#divergences');
  const out = {viewport: [innerWidth, innerHeight], verdicts: box('#verdicts'), chart: box('#speedup-chart'),
               closed: !details.open, row_closed: box('#divergences tr:nth-child(2)')};
  details.open = true;
  out.row_open = box('#divergences tr:nth-child(2)');
  const pre = document.createElement('pre'); pre.id = 'probe'; pre.textContent = JSON.stringify(out);
  document.body.append(pre);
});
</script>"""


def layout(page, tmp_path) -> dict:
    probe = tmp_path / "probe.html"
    probe.write_text(page.read_text(encoding="utf-8").replace("</body>", PROBE + "</body>"), encoding="utf-8")
    dom, errors = open_in_chromium(probe.resolve())
    assert errors == []
    return json.loads(html.unescape(re.search(r'<pre id="probe">(.*?)</pre>', dom, re.S).group(1)))


def png_size(path) -> tuple[int, int]:
    return struct.unpack(">II", path.read_bytes()[16:24])


def broken_run_report(tmp_path):
    """A report of synthetic bench rows: plain, a working n-gram, one that keeps every draft token (its
    outputs differ), at concurrency 1 and 2, judged against a goal."""
    eng = fake_engines(extra={"ngram:2": lambda r, t: AcceptAll(r, t, SevenDrafter(), 2)})
    path = run_bench(config(tmp_path, concurrency=(1, 2)), engines=eng, tokenizer=CharTokenizer(), progress=False)
    return write_report(summarise(path, n_boot=200, goal="speedup>=1.0,itl_p99<=1"), tmp_path / "report.html")


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


def test_first_screen_shows_verdicts_and_speedup_chart_with_divergences_folded(tmp_path):
    pytest.importorskip("matplotlib")
    page = broken_run_report(tmp_path).resolve()
    at = layout(page, tmp_path)
    width, height = at["viewport"]
    assert width == WINDOW[0] and 600 < height <= WINDOW[1]  # a window's height less its frame, if any
    assert 0 <= at["verdicts"]["top"] and at["verdicts"]["bottom"] <= height  # the whole verdict table
    assert at["chart"]["height"] > 100 and at["chart"]["bottom"] <= height  # the whole speedup chart
    assert at["closed"] and not at["row_closed"]["visible"]  # a divergence row is not shown ...
    assert at["row_open"]["visible"] and at["row_open"]["height"] > 0  # ... until the details is opened
    shot = tmp_path / "first_screen.png"
    chromium(page, f"--screenshot={shot}")
    assert shot.is_file() and png_size(shot)[0] == WINDOW[0]
    print(f"first screen: {shot}")
