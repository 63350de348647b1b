"""The benchmark plots of a report (matplotlib, Agg backend: no display needed).

throughput.png  output tok/s vs concurrency, one line per configuration
tradeoff.png    output tok/s (all users) vs per-user tok/s (1000 / median TPOT), one point per
                concurrency, one line per configuration; where speculation stops paying is
                ringed on both lines
speedup.png     each configuration's output tok/s over the baseline's, 1.0 marked
latency.png     TTFT and ITL, p50 (solid) and p99 (dashed), vs concurrency
accept.png      accept length per concurrency (speculative configurations)

Legends sit under the axes (never over the data); the value labels of the speedup plot are
placed by rank at each concurrency (highest above, lowest below, others beside).
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from orchestrator.bench.report import Series


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _style(s: Series, i: int) -> dict[str, Any]:
    from orchestrator.bench.report import is_baseline

    base = is_baseline(s)
    return {"color": "black" if base else f"C{i % 10}", "lw": 2.4 if base else 1.6,
            "marker": "s" if base else "o", "ms": 5}


def _xaxis(ax: Any, cs: list[int]) -> None:
    ax.set_xscale("log", base=2)
    if cs:  # every concurrency inside the axes, even one no line of this plot reaches
        ax.set_xlim(cs[0] / 1.3, cs[-1] * 1.3)
    ax.set_xticks(cs, [str(c) for c in cs])
    ax.minorticks_off()
    ax.set_xlabel("concurrent requests (--max-concurrency)")
    ax.grid(alpha=0.3)


def _line(ax: Any, s: Series, key: str, i: int, **kw: Any) -> None:
    cs = [c for c in sorted(s.points) if s.value(c, key) is not None]
    if cs:
        ax.plot(cs, [s.value(c, key) for c in cs], **{**_style(s, i), **kw})


def _legend(ax: Any, ncol: int = 2, **kw: Any) -> None:
    """The legend under the axes: it never covers a line or a label."""
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        ax.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, -0.13),
                  ncol=max(1, min(ncol, len(handles))), fontsize=8, frameon=False, **kw)


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    _plt().close(fig)
    return path


def stops_paying(spec: Series, base: Series) -> int | None:
    """The lowest concurrency C measured by both at which the baseline's output tok/s is at
    least SPEC's there and at every higher concurrency measured by both (None: speculation
    pays at the highest one)."""
    both = [c for c in sorted(spec.points) if c in base.points
            and spec.value(c, "output_throughput") is not None
            and base.value(c, "output_throughput") is not None]
    stop = None
    for c in reversed(both):
        if (base.value(c, "output_throughput") or 0.0) < (spec.value(c, "output_throughput")
                                                           or 0.0):
            break
        stop = c
    return stop


def throughput(series: list[Series], cs: list[int], out: Path) -> Path:
    """Output tok/s vs concurrency."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(9, 5.5))
    for i, s in enumerate(series):
        _line(ax, s, "output_throughput", i, label=s.label)
    _xaxis(ax, cs)
    ax.set_ylabel("output tokens/s (all requests)")
    ax.set_title("Output throughput vs concurrency")
    _legend(ax)
    return _save(fig, out / "throughput.png")


def _user_points(s: Series) -> list[tuple[int, float, float]]:
    """(concurrency, per-user tok/s, output tok/s) of every run that has both."""
    out = []
    for c in sorted(s.points):
        user, total = s.points[c].user_tps, s.value(c, "output_throughput")
        if user is not None and total is not None:
            out.append((c, user, total))
    return out


def tradeoff(series: list[Series], base: Series | None, out: Path) -> Path | None:
    """Output tok/s (all users) vs per-user tok/s, a point per concurrency; the concurrency
    from which the baseline is at least as fast is ringed on both lines."""
    pts = {id(s): _user_points(s) for s in series}
    if not any(pts.values()):
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(9, 6))
    notes = []
    for i, s in enumerate(series):
        p = pts[id(s)]
        if not p:
            continue
        ax.plot([x[1] for x in p], [x[2] for x in p], label=s.label, **_style(s, i))
        below = i % 2 == 1  # alternate sides: labels of neighbouring lines do not meet
        for c, user, total in p:
            ax.annotate(f"c={c}", (user, total), textcoords="offset points",
                        xytext=(11, -15) if below else (-11, 10),
                        ha="left" if below else "right",
                        fontsize=7, color=_style(s, i)["color"])
    for s in series:
        if base is None or s is base:
            continue
        stop = stops_paying(s, base)
        if stop is None:
            both = [str(c) for c in sorted(s.points) if c in base.points]
            notes.append(f"{s.label}: pays at every concurrency both measured "
                         f"({', '.join(both) or 'none'})")
            continue
        for t in (s, base):
            user, total = t.points[stop].user_tps, t.value(stop, "output_throughput")
            if user is not None and total is not None:
                ax.plot([user], [total], "o", ms=16, mfc="none", mec="red", mew=1.6)
        notes.append(f"{s.label}: stops paying from concurrency {stop} (ringed)")
    if notes:
        ax.plot([], [], "o", ms=10, mfc="none", mec="red", mew=1.6,
                label="where speculation stops paying")
    ax.set_xlabel("per-user decode speed, tokens/s (1000 / median TPOT)")
    ax.set_ylabel("output tokens/s (all requests)")
    ax.grid(alpha=0.3)
    # from zero, with room for the labels: a small difference must look small
    ax.set_xlim(0, max(x[1] for p in pts.values() for x in p) * 1.12)
    ax.set_ylim(0, max(x[2] for p in pts.values() for x in p) * 1.12)
    title = "Throughput vs per-user speed (one point per concurrency)"
    wrapped = ["\n".join(textwrap.wrap(n, 100)) for n in notes]
    ax.set_title("\n".join([title, *wrapped]), fontsize=10)
    _legend(ax)
    return _save(fig, out / "tradeoff.png")


def speedup(series: list[Series], base: Series, cs: list[int], out: Path) -> Path:
    """Output tok/s over the baseline's at the same concurrency."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(9, 5.5))
    ax.axhline(1.0, color="black", lw=1.2, ls="--", label=f"{base.label} (1.0x)")
    ratios: dict[int, tuple[int, dict[int, float]]] = {}
    for i, s in enumerate(series):
        if s is base:
            continue
        pts = [(c, s.value(c, "output_throughput"), base.value(c, "output_throughput"))
               for c in sorted(s.points)]
        pts = [(c, v / b) for c, v, b in pts if v is not None and b]
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], label=s.label, **_style(s, i))
            ratios[id(s)] = (i, dict(pts))
    for c in cs:  # at each concurrency: highest label above, lowest below, the rest beside
        here = sorted((r[1][c], r[0]) for r in ratios.values() if c in r[1])
        for rank, (r, i) in enumerate(here):
            pos = ((0, 7), "center", "bottom") if rank == len(here) - 1 else \
                ((0, -9), "center", "top") if rank == 0 else ((8, 0), "left", "center")
            ax.annotate(f"{r:.2f}", (c, r), textcoords="offset points", xytext=pos[0],
                        ha=pos[1], va=pos[2], fontsize=7, color=f"C{i % 10}")
    _xaxis(ax, cs)
    ax.margins(y=0.15)
    ax.set_ylabel(f"speedup over {base.label} (output tok/s ratio)")
    ax.set_title("Speedup of output throughput over the baseline (speculation pays above 1.0)")
    _legend(ax)
    return _save(fig, out / "speedup.png")


def latency(series: list[Series], cs: list[int], out: Path) -> Path:
    """TTFT and ITL p50/p99 side by side."""
    plt = _plt()
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(13, 5.5))
    for i, s in enumerate(series):
        _line(a1, s, "median_ttft_ms", i, label=f"{s.label} p50")
        _line(a1, s, "p99_ttft_ms", i, ls="--", marker="x", label=f"{s.label} p99")
        _line(a2, s, "median_itl_ms", i, label=f"{s.label} p50")
        _line(a2, s, "p99_itl_ms", i, ls="--", marker="x", label=f"{s.label} p99")
    for ax, what in ((a1, "time to first token (ms)"), (a2, "inter-token latency (ms)")):
        _xaxis(ax, cs)
        ax.set_ylabel(what)
        ax.set_yscale("log")
        ticker = _plt().matplotlib.ticker
        ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _pos: f"{v:g}"))
        ax.yaxis.set_minor_formatter(ticker.FuncFormatter(  # 20, 50, 200, 500: no crowding
            lambda v, _pos: f"{v:g}" if f"{v:g}"[0] in "25" else ""))
    a1.set_title("TTFT p50 (solid) and p99 (dashed)")
    a2.set_title("ITL p50 (solid) and p99 (dashed)")
    thin = sorted({run.thin("p99_ttft_ms") or 0 for s in series for run in s.points.values()}
                  - {0})
    if thin:
        fig.suptitle(f"p99 from {', '.join(map(str, thin))} requests (fewer than 100): a few "
                     "requests set it, not a tail estimate", fontsize=9, color="#a33", y=1.0)
    handles, labels = a1.get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, 0.0),
               ncol=min(2, max(1, len(handles))), fontsize=8, frameon=False)
    return _save(fig, out / "latency.png")


def accept(series: list[Series], cs: list[int], out: Path) -> Path | None:
    """Accept length per concurrency for the configurations that report one."""
    spec = [(i, s) for i, s in enumerate(series)
            if any(s.value(c, "accept_length") for c in s.points)]
    if not spec:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(9, 4.5))
    missing = set()
    for i, s in spec:
        _line(ax, s, "accept_length", i, label=s.label)
        missing |= {c for c in s.points if not s.value(c, "accept_length")}
    _xaxis(ax, cs)
    ax.set_ylim(bottom=1.0, top=max(s.value(c, "accept_length") or 0 for _, s in spec
                                    for c in s.points) * 1.15)
    for c in sorted(missing):  # the server published none for that run: say so where it goes
        ax.annotate("none reported", (c, 1.0), textcoords="offset points", xytext=(0, 8),
                    ha="center", fontsize=8, color="#555", rotation=90, va="bottom")
    ax.set_ylabel("accept length (tokens per verify step)")
    ax.set_title("Accept length reported by the benchmark (server's avg_spec_accept_length)")
    _legend(ax)
    return _save(fig, out / "accept.png")


def bench_plots(series: list[Series], base: Series | None, out: Path) -> list[Path]:
    """Every bench plot that has data; the speedup plot needs a baseline."""
    from orchestrator.bench.report import concurrencies

    cs = concurrencies(series)
    pngs = [throughput(series, cs, out)]
    trade = tradeoff(series, base, out)
    if trade is not None:
        pngs.append(trade)
    if base is not None and len(series) > 1:
        pngs.append(speedup(series, base, cs, out))
    pngs.append(latency(series, cs, out))
    acc = accept(series, cs, out)
    if acc is not None:
        pngs.append(acc)
    return pngs
