"""The benchmark plots of a report (matplotlib, Agg backend: no display needed).

throughput.png  output tok/s vs concurrency, one line per configuration
speedup.png     each configuration's output tok/s over the baseline's, 1.0 marked
latency.png     TTFT and ITL, p50 (solid) and p99 (dashed), vs concurrency
accept.png      accept length per concurrency (speculative configurations)
"""

from __future__ import annotations

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
    base = s.label.split(" @")[0] == "baseline"
    return {"color": "black" if base else f"C{i % 10}", "lw": 2.4 if base else 1.6,
            "marker": "s" if base else "o", "ms": 5}


def _xaxis(ax: Any, cs: list[int]) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xticks(cs, [str(c) for c in cs])
    ax.minorticks_off()
    ax.set_xlabel("concurrent requests (--max-concurrency)")
    ax.grid(alpha=0.3)


def _line(ax: Any, s: Series, key: str, i: int, **kw: Any) -> None:
    cs = [c for c in sorted(s.points) if s.value(c, key) is not None]
    if cs:
        ax.plot(cs, [s.value(c, key) for c in cs], **{**_style(s, i), **kw})


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    _plt().close(fig)
    return path


def throughput(series: list[Series], cs: list[int], out: Path) -> Path:
    """Output tok/s vs concurrency."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(9, 5.5))
    for i, s in enumerate(series):
        _line(ax, s, "output_throughput", i, label=s.label)
    _xaxis(ax, cs)
    ax.set_ylabel("output tokens/s (all requests)")
    ax.set_title("Output throughput vs concurrency")
    ax.legend(fontsize=8)
    return _save(fig, out / "throughput.png")


def speedup(series: list[Series], base: Series, cs: list[int], out: Path) -> Path:
    """Output tok/s over the baseline's at the same concurrency."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(9, 5.5))
    ax.axhline(1.0, color="black", lw=1.2, ls="--", label=f"{base.label} (1.0x)")
    for i, s in enumerate(series):
        if s is base:
            continue
        pts = [(c, s.value(c, "output_throughput"), base.value(c, "output_throughput"))
               for c in sorted(s.points)]
        pts = [(c, v / b) for c, v, b in pts if v is not None and b]
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], label=s.label, **_style(s, i))
            for c, r in pts:
                ax.annotate(f"{r:.2f}", (c, r), textcoords="offset points", xytext=(0, 6),
                            ha="center", fontsize=7, color=f"C{i % 10}")
    _xaxis(ax, cs)
    ax.set_ylabel(f"speedup over {base.label} (output tok/s ratio)")
    ax.set_title("Speculation pays above 1.0")
    ax.legend(fontsize=8)
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
    a2.legend(fontsize=7, ncol=1, loc="upper left")
    return _save(fig, out / "latency.png")


def accept(series: list[Series], cs: list[int], out: Path) -> Path | None:
    """Accept length per concurrency for the configurations that report one."""
    spec = [(i, s) for i, s in enumerate(series)
            if any(s.value(c, "accept_length") for c in s.points)]
    if not spec:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(9, 4.5))
    for i, s in spec:
        _line(ax, s, "accept_length", i, label=s.label)
    _xaxis(ax, cs)
    ax.set_ylim(bottom=1.0)
    ax.set_ylabel("accept length (tokens per verify step)")
    ax.set_title("Accept length reported by the benchmark (server's avg_spec_accept_length)")
    ax.legend(fontsize=8)
    return _save(fig, out / "accept.png")


def bench_plots(series: list[Series], base: Series | None, out: Path) -> list[Path]:
    """Every bench plot that has data; the speedup plot needs a baseline."""
    from orchestrator.bench.report import concurrencies

    cs = concurrencies(series)
    pngs = [throughput(series, cs, out)]
    if base is not None and len(series) > 1:
        pngs.append(speedup(series, base, cs, out))
    pngs.append(latency(series, cs, out))
    acc = accept(series, cs, out)
    if acc is not None:
        pngs.append(acc)
    return pngs
