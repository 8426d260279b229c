"""The report's plots, as base64 PNGs (matplotlib, the `bench` extra; without it there are none).
A configuration has one colour in every plot (config_colours); categories and time parts are drawn
in other palettes."""
from __future__ import annotations

import base64
import io

from draftwise.bench.goal import parse_goal
from draftwise.bench.summary import Row, Summary

# matplotlib's tab10, then the lighter halves of tab20's pairs: 20 colours before any repeats
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
           "#17becf", "#aec7e8", "#ffbb78", "#98df8a", "#ff9896", "#c5b0d5", "#c49c94", "#f7b6d2", "#c7c7c7",
           "#dbdb8d", "#9edae5")
# colour means configuration; what is not one (time parts, categories) is drawn in grey
_PARTS = {"draft": "#4d4d4d", "verify": "#969696", "other": "#d9d9d9"}
_GREYS = ("#555555", "#8c8c8c", "#b3b3b3")
_MARKERS = "sv^D<>pP*Xhd8H"


def config_colours(s: Summary) -> dict[str, str]:
    """Configuration name -> colour, in the order configurations first appear in the summary."""
    names = dict.fromkeys(r.config for r in s.rows)
    return {name: PALETTE[i % len(PALETTE)] for i, name in enumerate(names)}


def break_even(points: list[tuple[int, float]]) -> float | None:
    """Concurrency where speedup first falls to 1, linearly interpolated between measured levels;
    None if it never does. points: (concurrency, speedup), any order."""
    pts = sorted(points)
    for (c0, s0), (c1, s1) in zip(pts, pts[1:]):
        if s0 > 1.0 >= s1:
            return c0 + (s0 - 1.0) * (c1 - c0) / (s0 - s1)
    return None


def draft_length(config: str) -> tuple[str, int] | None:
    """('ngram', 4) for 'ngram:4'; None for plain and servers."""
    kind, _, d = config.partition(":")
    return (kind, int(d)) if d.isdigit() else None


def _png(fig) -> str:
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def _err(r: Row) -> list[list[float]]:
    lo = r.speedup - r.speedup_lo if r.speedup_lo is not None else 0.0
    hi = r.speedup_hi - r.speedup if r.speedup_hi is not None else 0.0
    return [[lo], [hi]]


def _pyplot():
    """matplotlib.pyplot drawing off-screen, or None when matplotlib is not installed."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def speedup_chart(s: Summary) -> str | None:
    """Base64 PNG: each configuration's speedup over the baseline (all prompts) with its 95%
    interval, one panel per concurrency; 1 (the baseline) solid, the goal's speedup bound dashed.
    None without matplotlib or without a speedup to draw."""
    plt = _pyplot()
    rows = [r for r in s.rows if r.scope == "all" and r.config != s.baseline and r.speedup is not None]
    if plt is None or not rows:
        return None
    levels = sorted({r.concurrency for r in rows})
    names = list(dict.fromkeys(r.config for r in rows))
    bounds = [c for c in parse_goal(s.goal) if c.metric == "speedup"] if s.goal else []
    right = 1.18 * max([r.speedup_hi or r.speedup for r in rows] + [1.0] + [c.value for c in bounds])
    fig, axes = plt.subplots(1, len(levels), figsize=(max(6.5, 4.8 * len(levels)), 0.4 * len(names) + 1.1),
                             sharey=True, squeeze=False)
    for ax, level in zip(axes[0], levels):
        _speedup_panel(ax, [r for r in rows if r.concurrency == level], names, config_colours(s))
        ax.axvline(1.0, color="black", linewidth=1)
        for c in bounds:
            ax.axvline(c.value, color="#b00000", linestyle="--", linewidth=1.2)
        ax.set(xlim=(0, right), xlabel=f"speedup over {s.baseline} (95% CI)",
               title=f"concurrency {level}" if len(levels) > 1 else None)
    axes[0][0].set_yticks(range(len(names)), names)
    axes[0][0].invert_yaxis()
    return _png(fig)


def _speedup_panel(ax, rows: list[Row], names: list[str], colours: dict[str, str]) -> None:
    for r in rows:
        y = names.index(r.config)
        ax.barh(y, r.speedup, height=0.6, color=colours[r.config])
        if r.speedup_lo is not None:
            ax.errorbar(r.speedup, y, xerr=_err(r), fmt="none", ecolor="black", capsize=3)
        ax.annotate(f"{r.speedup:.2f}×", (r.speedup_hi or r.speedup, y), xytext=(4, 0), textcoords="offset points",
                    va="center", fontsize=8)


def figures(s: Summary) -> list[tuple[str, str]]:
    """(title, base64 PNG) per plot; empty without matplotlib. All but the concurrency plot show
    the lowest concurrency measured (1 unless not run)."""
    plt = _pyplot()
    if plt is None:
        return []
    colours = config_colours(s)
    c1 = min(r.concurrency for r in s.rows)
    base = [r for r in s.rows if r.concurrency == c1]
    alls = [r for r in base if r.scope == "all"]
    out = []
    for title, make, rows in (("Speedup vs draft length, per category", _speedup_vs_d, base),
                              (f"Latency CDFs (all prompts, concurrency {c1})", _cdfs, alls),
                              ("Acceptance per draft position", _per_position, alls),
                              ("Time split per round", _time_split, alls),
                              ("Speedup vs concurrency (break-even marked where concurrency was real)",
                               _concurrency, [r for r in s.rows if r.scope == "all" and r.config != s.baseline])):
        fig = make(rows, plt, colours)
        if fig is not None:
            out.append((title, _png(fig)))
    return out


def _of_kind(rows: list[Row], kind: str) -> list[Row]:
    return sorted((r for r in rows if (draft_length(r.config) or ("",))[0] == kind),
                  key=lambda r: draft_length(r.config)[1])


def _speedup_vs_d(rows: list[Row], plt, colours: dict[str, str]):
    """One panel per drafter, one grey dashed line per category (told apart by marker), all prompts
    in bold black with each configuration's point in its colour; D on the x axis."""
    kinds = sorted({draft_length(r.config)[0] for r in rows if draft_length(r.config)})
    if not kinds:
        return None
    fig, axes = plt.subplots(1, len(kinds), figsize=(6 * len(kinds), 4), squeeze=False)
    for ax, kind in zip(axes[0], kinds):
        scopes = [sc for sc in dict.fromkeys(r.scope for r in rows) if not sc.startswith("bucket:") and sc != "all"]
        for i, scope in enumerate(scopes + ["all"]):
            pts = [r for r in _of_kind(rows, kind) if r.scope == scope and r.speedup is not None]
            ds = [draft_length(r.config)[1] for r in pts]
            colour = "black" if scope == "all" else _GREYS[i % len(_GREYS)]
            ax.plot(ds, [r.speedup for r in pts], label=scope, color=colour, zorder=3 if scope == "all" else 2,
                    linewidth=2.5 if scope == "all" else 1, linestyle="-" if scope == "all" else "--",
                    marker=None if scope == "all" else _MARKERS[i % len(_MARKERS)], markersize=4)
            for d, r in zip(ds, pts):
                ax.errorbar([d], [r.speedup], yerr=_err(r), fmt="none", ecolor=colour, alpha=0.6)
                if scope == "all":
                    ax.plot([d], [r.speedup], marker="o", markersize=8, color=colours[r.config], zorder=4,
                            linestyle="none", label=r.config)
        ax.axhline(1.0, color="black", linestyle=":")
        ax.set_xticks(sorted({draft_length(r.config)[1] for r in _of_kind(rows, kind)}))
        ax.set(title=f"{kind}: speedup vs D (95% CI)", xlabel="draft length D", ylabel="speedup ×")
        ax.legend(fontsize=7)
    return fig


def _cdfs(rows: list[Row], plt, colours: dict[str, str]):
    if not any(r.cdf for r in rows):
        return None
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for ax, key, name in zip(axes, ("ttft_s", "itl_s", "e2e_s"), ("TTFT", "inter-token latency", "end-to-end")):
        for r in rows:
            xs = [1000 * x for x in (r.cdf or {}).get(key, []) if x is not None]
            ax.plot(xs, [q / 100 for q in range(len(xs))], label=r.config, color=colours[r.config])
        ax.set(title=f"{name} CDF", xlabel="ms",
               ylabel="fraction of gaps" if key == "itl_s" else "fraction of requests")
        ax.legend(fontsize=7)
    return fig


def _per_position(rows: list[Row], plt, colours: dict[str, str]):
    rows = [r for r in rows if r.per_position_acceptance]
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(6, 4))
    for r in rows:
        ax.plot(range(1, len(r.per_position_acceptance) + 1), r.per_position_acceptance, marker="o", label=r.config,
                color=colours[r.config])
    ax.set(title="Acceptance per draft position", xlabel="draft position", ylabel="acceptance", ylim=(0, 1.05))
    ax.legend(fontsize=7)
    return fig


def _time_split(rows: list[Row], plt, colours: dict[str, str]):
    """Mean milliseconds per target step after prefill, stacked: draft, verify, other (greys); each
    configuration's label in its colour."""
    rows = [r for r in rows if r.step_ms and r.step_ms.get("verify") is not None]
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(max(5, 1.2 * len(rows)), 4))
    bottom = [0.0] * len(rows)
    for part in ("draft", "verify", "other"):
        vals = [r.step_ms[part] or 0.0 for r in rows]
        ax.bar(range(len(rows)), vals, bottom=bottom, label=part, color=_PARTS[part], edgecolor="black")
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.set_xticks(range(len(rows)))
    for label, r in zip(ax.set_xticklabels([r.config for r in rows]), rows):
        label.set_color(colours[r.config])
    ax.set(title="Time per target step (after prefill)", ylabel="ms")
    ax.legend(fontsize=7)
    return fig


def _concurrency(rows: list[Row], plt, colours: dict[str, str]):
    """Speedup per concurrency level; break-even only from rows measured with real concurrency."""
    rows = [r for r in rows if r.speedup is not None]
    if len({r.concurrency for r in rows}) < 2:
        return None
    fig, ax = plt.subplots(figsize=(6, 4))
    notes = []
    for config in dict.fromkeys(r.config for r in rows):
        pts = sorted((r for r in rows if r.config == config), key=lambda r: r.concurrency)
        seq = any(r.sequential for r in pts)
        ax.plot([r.concurrency for r in pts], [r.speedup for r in pts], marker="o", linestyle="--" if seq else "-",
                label=config + (" (sequential)" if seq else ""), color=colours[config])
        if seq:
            notes.append(f"{config}: sequential, no break-even")
            continue
        be = break_even([(r.concurrency, r.speedup) for r in pts])
        if be is not None:
            ax.axvline(be, linestyle="--", color=colours[config])
            ax.annotate(f"break-even {be:.1f}", (be, 1.0), fontsize=8)
    ax.axhline(1.0, color="black", linestyle=":")
    levels = sorted({r.concurrency for r in rows})
    ax.set(title="Speedup vs concurrency", xlabel="requests in flight", ylabel="speedup ×", xscale="log")
    ax.set_xticks(levels, [str(c) for c in levels])
    ax.tick_params(axis="x", which="minor", labelbottom=False)  # no 2×10⁰ between the levels
    if notes:
        ax.text(0.02, 0.02, "\n".join(notes), transform=ax.transAxes, fontsize=7, va="bottom")
    ax.legend(fontsize=7)
    return fig
