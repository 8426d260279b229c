"""Reports of a Summary: a text table for the terminal, and one self-contained HTML file (plots as
embedded PNGs) that reads top-down: the verdict per configuration against the service goal and the
speedup chart first; then the output check, summarised (how many outputs differ, how many at
near-ties, the largest margin) with one row per divergence folded below it; then the tables, the
other plots and the conditions."""
from __future__ import annotations

import html
from pathlib import Path

from draftwise.bench.check import Mismatch, reference_config
from draftwise.bench.goal import parse_goal
from draftwise.bench.page import CSS, Raw, image, plain, sparkline, table
from draftwise.bench.plots import figures, speedup_chart
from draftwise.bench.summary import Row, Summary, in_noise
from draftwise.extras import EXTRAS, missing

_COLS = ("config", "conc", "req", "tok/s", "ms/tok", "speedup [95% CI]", "after 1st token", "pred", "acc", "AL",
         "TTFT p50 ms", "ITL p50 ms", "E2E p95 s", "RSS+ MB", "mism")


def _f(v, fmt: str) -> str:
    return "-" if v is None else fmt.format(v)


def speedup_text(r: Row, baseline: str, field: str = "speedup") -> str:
    """A row's speedup (`field`: "speedup", or "decode_speedup" after the first token) with its
    interval."""
    if r.config == baseline:
        return "1 (baseline)"
    point, lo, hi = (getattr(r, field + k) for k in ("", "_lo", "_hi"))
    if point is None:
        return "-"
    if lo is None:
        return f"{point:.2f}× (1 prompt: no interval)"
    noise = " ≈noise" if in_noise(lo, hi) else ""
    return f"{point:.2f}× [{lo:.2f}, {hi:.2f}]{noise}"


def _cols(s: Summary) -> tuple[str, ...]:
    return _COLS + (("verdict",) if s.goal is not None else ())


def _cells(r: Row, s: Summary) -> list[str]:
    mb = None if r.rss_growth_bytes is None else r.rss_growth_bytes / 2**20
    return [r.config, f"{r.concurrency}{'*' if r.sequential else ''}", str(r.requests),
            _f(r.tokens_per_s, "{:.2f}"), _f(r.ms_per_token, "{:.1f}"), speedup_text(r, s.baseline),
            speedup_text(r, s.baseline, "decode_speedup"), _f(r.predicted_speedup, "{:.2f}×"),
            _f(r.acceptance_rate, "{:.3f}"), _f(r.acceptance_length, "{:.2f}"),
            _f(r.ttft.p50 and 1000 * r.ttft.p50, "{:.0f}"), _f(r.itl.p50 and 1000 * r.itl.p50, "{:.1f}"),
            _f(r.e2e.p95, "{:.2f}"), _f(mb, "{:.0f}"), str(r.mismatches)] + \
        ([r.verdict.short if r.verdict else "-"] if s.goal is not None else [])


def verdicts(s: Summary, scope: str = "all") -> list[tuple[str, str]]:
    """(configuration, verdict text) per row of the scope; the concurrency is named when several were run."""
    rows = [r for r in s.rows if r.scope == scope and r.verdict is not None]
    several = len({r.concurrency for r in rows}) > 1
    return [(r.config + (f" @ concurrency {r.concurrency}" if several else ""), r.verdict.text) for r in rows]


def verdict_text(s: Summary, scope: str = "all") -> str:
    """The goal and one verdict line per configuration; empty without a goal."""
    if s.goal is None:
        return ""
    pairs = verdicts(s, scope)
    width = max((len(name) for name, _ in pairs), default=0)
    return "\n".join([f"goal: {s.goal}"] + [f"  {name.ljust(width)}  {text}" for name, text in pairs])


def format_table(s: Summary, scope: str = "all") -> str:
    """The verdicts against the goal (if any), then one row per configuration and concurrency."""
    cols = _cols(s)
    rows = [cols] + [_cells(r, s) for r in s.rows if r.scope == scope]
    widths = [max(len(row[i]) for row in rows) for i in range(len(cols))]
    left = {0, len(_COLS)}  # names and verdicts read from the left
    lines = ["  ".join(c.ljust(w) if i in left else c.rjust(w)
                       for i, (c, w) in enumerate(zip(row, widths))).rstrip() for row in rows]
    lines.insert(1, "-" * len(lines[0]))
    if any(r.sequential for r in s.rows if r.scope == scope):
        lines.append("* sequential: these requests ran one after another (rows recorded by an older, unbatched harness)")
    head = verdict_text(s, scope)
    return "\n".join(([head, ""] if head else []) + lines)


# a first difference where the target's top-2 margin (logits, or logprobs: the same difference) is at
# most this is a near-tie: rounding that differs between a batched and a single-token forward can flip it
NEAR_TIE = 0.5


def margin(m: Mismatch) -> float | None:
    """The smaller of the top-2 margins at the difference (single and batched); None when neither was read."""
    known = [x for x in (m.margin_single, m.margin_batched) if x is not None]
    return min(known) if known else None


def _counts(ms: list[Mismatch]) -> tuple[int, int, int, float | None]:
    """(near-ties, larger margins, no margin, largest margin) of some divergences."""
    known = [x for x in map(margin, ms) if x is not None]
    near = sum(x <= NEAR_TIE for x in known)
    return near, len(known) - near, len(ms) - len(known), max(known, default=None)


def check_text(s: Summary) -> str:
    """The output check in one line: how many outputs differ, how many of those at near-ties, the largest margin."""
    if s.checked is None:
        return "output check: not done (temperature > 0: outputs differ by design)"
    configs = {r.config for r in s.rows}
    own = sorted({reference_config(c, s.baseline, configs) for c in configs} - {s.baseline})
    base = s.baseline + (f"; rows on another backend: its plain, {', '.join(own)}" if own else "")
    if not s.mismatches:
        return f"output check: all {s.checked} outputs identical to the baseline ({base})"
    near, larger, unknown, top = _counts(s.mismatches)
    parts = [f"{near} at near-ties (top-2 margin ≤ {NEAR_TIE:g})"] + \
        ([f"{larger} with a larger margin"] if larger else []) + ([f"{unknown} without a margin"] if unknown else [])
    largest = "" if top is None else f"; largest margin {top:.3g}"
    return (f"output check: {len(s.mismatches)} of {s.checked} outputs DIFFER from the baseline ({base}): "
            f"{', '.join(parts)}{largest}")


def conditions_text(s: Summary) -> str:
    """The fixed conditions in two lines, for the terminal."""
    c, r = s.conditions, s.resolved
    env = (s.sessions[-1] if s.sessions else {}).get("environment", {})
    pk = env.get("packages", {})
    sampling = "greedy" if c["temperature"] == 0 else \
        f"T={c['temperature']} top_p={c['top_p']} top_k={c['top_k']} seed={c['sample_seed']}"
    tok = (r.get("tokenizer") or "-")[:12]
    how = ", ".join(str(x) for x in (r.get("backend") or c.get("backend"), r.get("precision"), r.get("kernels")) if x)
    return (f"target {c['target']} ({how}, tokenizer {tok}), {sampling}, "
            f"max {c['max_tokens']} tokens, baseline {s.baseline}\n"
            f"{env.get('cpu')}, {env.get('logical_cpus')} CPUs, "
            f"threads {c.get('threads') or env.get('torch_threads')}; "
            f"torch {pk.get('torch')}, transformers {pk.get('transformers')}, "
            f"llama-cpp-python {pk.get('llama-cpp-python')}")


# --- the HTML page, top-down -----------------------------------------------------------------

_NO_PLOTS = f"Plots need matplotlib: pip install 'draftwise[{EXTRAS['matplotlib']}]'"


def _badge(r: Row) -> Raw:
    v = r.verdict
    if v is None or v.keep is None:
        return Raw('<span class="badge base">baseline</span>' if v else "-")
    why = v.text[v.text.find("(") + 1:-1] if v.text.endswith(")") else v.text  # "keep (...)": the conditions
    return Raw(f'<span class="badge {"keep" if v.keep else "drop"}">{"keep" if v.keep else "don&#x27;t keep"}'
               f'</span> <span class="why">{html.escape(why)}</span>')


def _verdict_section(s: Summary) -> str:
    """Keep or not per configuration (rows) and concurrency (columns), all prompts."""
    if s.goal is None:
        return ('<p class="sub">No service goal given: <code>--goal</code> (e.g. '
                '<code>speedup&gt;=1.05,itl_p95&lt;=0.25</code>) marks each configuration keep or don\'t keep.</p>')
    rows = [r for r in s.rows if r.scope == "all"]
    levels = sorted({r.concurrency for r in rows})
    at = {(r.config, r.concurrency): r for r in rows}
    cells = [[name] + [_badge(at[name, c]) if (name, c) in at else "-" for c in levels]
             for name in dict.fromkeys(r.config for r in rows)]
    return (f'<section id="verdicts"><h2>Verdict</h2><p>Service goal <code>{html.escape(s.goal)}</code>: keep a '
            "configuration only if it meets every condition on all prompts; the first condition missed decides. "
            "Speedup is judged by its point estimate, with a caveat when its 95% interval reaches past the bound.</p>"
            + table(["configuration"] + [f"concurrency {c}" for c in levels], cells, "verdicts") + "</section>")


def _speedup_section(s: Summary) -> str:
    """The chart, or the one line saying which extra draws it."""
    head = f"<h2>Speedup over {html.escape(s.baseline)} (all prompts)</h2>"
    if missing("matplotlib") is not None:
        return head + f'<p class="warn">{_NO_PLOTS}</p>'
    png = speedup_chart(s)
    if png is None:
        return head + "<p>No speedup measured.</p>"
    bounds = [str(c) for c in parse_goal(s.goal) if c.metric == "speedup"] if s.goal else []
    base = html.escape(s.baseline)
    caption = (f"Bar: {base}'s ms per emitted token ÷ the configuration's, on the same prompts; whisker: the "
               f"bootstrap 95% interval; solid line: {base} itself (1×)"
               + "".join(f"; red dashed: the goal's <code>{html.escape(b)}</code>" for b in bounds) + ".")
    return head + f'<p class="sub">{caption}</p>' + image(png, f"speedup over {s.baseline}", "speedup-chart")


def _divergence_rows(ms: list[Mismatch]) -> list[list]:
    return [[m.config, m.prompt_id, m.repeat, m.concurrency, f"{m.unit} {m.position}", m.baseline, m.other,
             _f(m.margin_single, "{:.4f}"), _f(m.margin_batched, "{:.4f}")] for m in ms]


def _count_cells(ms: list[Mismatch]) -> list[str]:
    near, larger, unknown, top = _counts(ms)
    return [str(near), str(larger), str(unknown), _f(top, "{:.3g}")]


def _check_section(s: Summary) -> str:
    """The check in one line, a row per configuration that differs, and every divergence folded."""
    if s.checked is None or not s.mismatches:
        return f'<h2>Output check</h2><p class="ok">{html.escape(check_text(s))}</p>'
    larger = _counts(s.mismatches)[1]
    order = {name: i for i, name in enumerate(dict.fromkeys(r.config for r in s.rows))}
    groups: dict[tuple[str, int], list[Mismatch]] = {}
    for m in sorted(s.mismatches, key=lambda m: (m.concurrency, order.get(m.config, len(order)))):
        groups.setdefault((m.config, m.concurrency), []).append(m)
    per = [[c, n, len(ms), *_count_cells(ms)] for (c, n), ms in groups.items()]
    return (f'<h2>Output check</h2><p class="{"bad" if larger else "warn"}">{html.escape(check_text(s))}</p>'
            + table(["config", "conc", "outputs differ", "near-ties", "larger margin", "no margin", "largest margin"],
                    per)
            + f'<details id="divergences"><summary>The {len(s.mismatches)} divergences, one row each</summary>'
            "<p>At each output's first difference: the baseline's token (or character) and this one's, and the "
            "target's top-2 margin there, single and batched. A near-zero margin means the target's two best tokens "
            "were tied within rounding, so a batched and a single-token forward can pick differently.</p>"
            + table(["config", "prompt", "repeat", "conc", "first difference", "baseline", "other",
                     "top-2 margin (single)", "top-2 margin (batched)"], _divergence_rows(s.mismatches))
            + "</details>")


def _step_cells(r: Row) -> list[str]:
    st = r.step_ms or {}
    return [_f(st.get("steps"), "{}"), _f(st.get("prefill_per_request"), "{:.1f}"),
            *(_f(st.get(k), "{:.2f}") for k in ("draft", "verify", "other"))]


def _mb(v, fmt: str = "{:.0f}") -> str:
    return _f(v and v / 2**20, fmt)


def _results_section(s: Summary) -> str:
    out = ["<h2>Results</h2><p>Latencies from submission; speedup = baseline ms per emitted token ÷ the "
           "configuration's, with a bootstrap 95% interval over prompts (≈noise: the interval holds 1); "
           "after 1st token: the same for the time per output token after the first (TPOT). "
           "RSS+ = most resident memory one request added while it ran. * = sequential.</p>"]
    for scope in dict.fromkeys(r.scope for r in s.rows):
        cells = [_cells(r, s) for r in s.rows if r.scope == scope]
        out += [f"<h3>{html.escape(scope)}</h3>", table(list(_cols(s)), cells)]
    extra = [[r.config, r.concurrency, sparkline(r.per_position_acceptance), *_step_cells(r),
              _mb(r.kv_peak_bytes, "{:.1f}"), _mb(r.draft_kv_peak_bytes, "{:.1f}"), _mb(r.draft_weight_bytes),
              _mb(r.rss_peak_bytes)] for r in s.rows if r.scope == "all"]
    out += ["<h3>Speculation and memory (all prompts)</h3>",
            "<p>Acceptance per draft position: one bar per position (full height: always accepted). Per target "
            "step after prefill (verification rounds and plain steps): mean ms drafting, verifying and other; "
            "prefill in ms per request.</p>",
            table(["config", "conc", "per-position acceptance", "steps", "prefill ms/request", "draft ms/step",
                   "verify ms/step", "other ms/step", "KV peak MB", "draft KV MB", "draft weights MB",
                   "RSS peak MB"], extra)]
    return "".join(out)


def _plots_section(s: Summary) -> str:
    figs = figures(s)  # none without matplotlib: the speedup section said which extra draws them
    if not figs:
        return ""
    return "<h2>More plots</h2>" + "".join(f"<h3>{html.escape(t)}</h3>{image(png, t)}" for t, png in figs)


def _conditions_section(s: Summary) -> str:
    out = ["<h2>Conditions</h2>", table(["setting", "value"], [[k, plain(v)] for k, v in
                                                           (s.conditions | s.resolved).items()], "kv")]
    for i, sess in enumerate(s.sessions):
        env = sess.get("environment", {})
        rows = [["started", sess.get("started")], ["plan", plain(sess.get("plan"))], ["prompts", sess.get("prompts")],
                ["skipped (too long)", plain(sess.get("skipped_prompts", []))]]
        rows += [[k, plain(v)] for k, v in env.items()]
        rows += [[f"config {n}", plain(d)] for n, d in sess.get("targets", {}).items()]
        out += [f"<h3>Session {i + 1}</h3>", table(["", "value"], rows, "kv")]
    return "".join(out)


def write_report(summary: Summary, path: str | Path) -> Path:
    """One HTML file with everything embedded, read top-down: verdicts and the speedup chart, the
    output check, the tables, the other plots, the conditions."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    sub = html.escape(conditions_text(summary).partition("\n")[0])
    body = (f"<h1>draftwise bench: {html.escape(str(summary.conditions.get('target')))}</h1><p class=\"sub\">{sub}</p>"
            + _verdict_section(summary) + _speedup_section(summary) + _check_section(summary)
            + _results_section(summary) + _plots_section(summary) + _conditions_section(summary))
    p.write_text(f"<!doctype html><html><head><meta charset='utf-8'><title>draftwise bench</title>"
                 f"<style>{CSS}</style></head><body>{body}</body></html>", encoding="utf-8")
    return p
