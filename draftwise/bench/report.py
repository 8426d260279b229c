"""Reports of a Summary: a text table for the terminal, and one self-contained HTML file (plots as
embedded PNGs). Output mismatches come first, before any speed figure, and are never folded away;
with a service goal, the verdict per configuration comes next."""
from __future__ import annotations

import html
import json
from pathlib import Path

from draftwise.bench.plots import figures
from draftwise.bench.summary import Row, Summary, in_noise

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


def check_text(s: Summary) -> str:
    if s.checked is None:
        return "output check: not done (temperature > 0: outputs differ by design)"
    if not s.mismatches:
        return f"output check: all {s.checked} outputs identical to the baseline ({s.baseline})"
    return f"output check: {len(s.mismatches)} of {s.checked} outputs DIFFER from the baseline ({s.baseline})"


def conditions_text(s: Summary) -> str:
    """The fixed conditions in two lines, for the terminal."""
    c, r = s.conditions, s.resolved
    env = (s.sessions[-1] if s.sessions else {}).get("environment", {})
    pk = env.get("packages", {})
    sampling = "greedy" if c["temperature"] == 0 else \
        f"T={c['temperature']} top_p={c['top_p']} top_k={c['top_k']} seed={c['sample_seed']}"
    tok = (r.get("tokenizer") or "-")[:12]
    kern = f", {r['kernels']}" if r.get("kernels") else ""
    return (f"target {c['target']} ({r.get('backend')}, {r.get('precision')}{kern}, tokenizer {tok}), {sampling}, "
            f"max {c['max_tokens']} tokens, baseline {s.baseline}\n"
            f"{env.get('cpu')}, {env.get('logical_cpus')} CPUs, "
            f"threads {c.get('threads') or env.get('torch_threads')}; "
            f"torch {pk.get('torch')}, transformers {pk.get('transformers')}, "
            f"llama-cpp-python {pk.get('llama-cpp-python')}")


def _table(head: list[str], rows: list[list[str]]) -> str:
    th = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><tr>{th}</tr>{body}</table>"


def _check_section(s: Summary) -> str:
    ok = s.checked is None or not s.mismatches
    out = [f'<h2>Output check</h2><p class="{"ok" if ok else "bad"}">{html.escape(check_text(s))}</p>']
    if s.mismatches:
        rows = [[m.config, m.prompt_id, m.repeat, m.concurrency, f"{m.unit} {m.position}", m.baseline, m.other,
                 _f(m.margin_single, "{:.4f}"), _f(m.margin_batched, "{:.4f}")] for m in s.mismatches]
        out.append(_table(["config", "prompt", "repeat", "conc", "first difference", "baseline", "other",
                           "top-2 margin (single)", "top-2 margin (batched)"], rows))
        out.append("<p>A near-zero margin means the target's two best tokens were tied within rounding, "
                   "so a batched and a single-token forward can pick differently.</p>")
    return "".join(out)


def _conditions_section(s: Summary) -> str:
    out = ["<h2>Conditions</h2>", _table(["setting", "value"], [[k, json.dumps(v)] for k, v in
                                                           (s.conditions | s.resolved).items()])]
    for i, sess in enumerate(s.sessions):
        env = sess.get("environment", {})
        rows = [["started", sess.get("started")], ["plan", json.dumps(sess.get("plan"))],
                ["prompts", sess.get("prompts")], ["skipped (too long)", ", ".join(sess.get("skipped_prompts", []))]]
        rows += [[k, json.dumps(v)] for k, v in env.items()]
        rows += [[f"config {n}", json.dumps(d)] for n, d in sess.get("targets", {}).items()]
        out += [f"<h3>Session {i + 1}</h3>", _table(["", ""], rows)]
    return "".join(out)


def _verdict_section(s: Summary) -> str:
    if s.goal is None:
        return ""
    rows = [[name, text] for name, text in verdicts(s)]
    return (f"<h2>Verdict</h2><p>Service goal: <code>{html.escape(s.goal)}</code>. Keep a configuration only if "
            "it meets every condition (all prompts); the first condition missed decides. Speedup is judged by "
            "its point estimate; a caveat says when its 95% interval reaches past the bound.</p>"
            + _table(["configuration", "verdict"], rows))


def _step_cells(r: Row) -> list[str]:
    st = r.step_ms or {}
    return [_f(st.get("steps"), "{}"), _f(st.get("prefill_per_request"), "{:.1f}"),
            *(_f(st.get(k), "{:.2f}") for k in ("draft", "verify", "other"))]


def _results_section(s: Summary) -> str:
    out = ["<h2>Results</h2><p>Latencies from submission; speedup = baseline ms per emitted token ÷ the "
           "configuration's, with a bootstrap 95% interval over prompts (≈noise: the interval holds 1); "
           "after 1st token: the same for the time per output token after the first (TPOT). "
           "RSS+ = most resident memory one request added while it ran. * = sequential.</p>"]
    for scope in dict.fromkeys(r.scope for r in s.rows):
        cells = [_cells(r, s) for r in s.rows if r.scope == scope]
        out += [f"<h3>{html.escape(scope)}</h3>", _table(list(_cols(s)), cells)]
    extra = [[r.config, r.concurrency, json.dumps([round(a, 3) for a in r.per_position_acceptance]),
              *_step_cells(r), _f(r.kv_peak_bytes and r.kv_peak_bytes / 2**20, "{:.1f}"),
              _f(r.draft_kv_peak_bytes and r.draft_kv_peak_bytes / 2**20, "{:.1f}"),
              _f(r.draft_weight_bytes and r.draft_weight_bytes / 2**20, "{:.0f}"),
              _f(r.rss_peak_bytes and r.rss_peak_bytes / 2**20, "{:.0f}")]
             for r in s.rows if r.scope == "all"]
    out += ["<h3>Speculation and memory (all prompts)</h3>",
            "<p>Per target step after prefill (verification rounds and plain steps): mean ms drafting, "
            "verifying and other; prefill in ms per request.</p>",
            _table(["config", "conc", "per-position acceptance", "steps", "prefill ms/request", "draft ms/step",
                    "verify ms/step", "other ms/step", "KV peak MB", "draft KV MB", "draft weights MB",
                    "RSS peak MB"], extra)]
    return "".join(out)


_CSS = ("body{font-family:sans-serif;max-width:1200px;margin:auto}table{border-collapse:collapse;margin:8px 0}"
        "td,th{border:1px solid #ccc;padding:2px 6px;font-size:13px;text-align:right}"
        ".ok{color:#060}.bad{color:#b00;font-weight:bold}img{max-width:100%}")


def write_report(summary: Summary, path: str | Path) -> Path:
    """One HTML file with everything embedded; the mismatch section comes first, the verdicts next."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    figs = "".join(f"<h3>{html.escape(title)}</h3><img src=\"data:image/png;base64,{png}\"/>"
                   for title, png in figures(summary))
    body = (f"<h1>draftwise bench: {html.escape(str(summary.conditions.get('target')))}</h1>"
            + _check_section(summary) + _verdict_section(summary) + _results_section(summary) + "<h2>Plots</h2>" + figs
            + _conditions_section(summary))
    p.write_text(f"<!doctype html><html><head><meta charset='utf-8'><title>draftwise bench</title>"
                 f"<style>{_CSS}</style></head><body>{body}</body></html>", encoding="utf-8")
    return p
