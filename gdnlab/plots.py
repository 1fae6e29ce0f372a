"""Figures for the notebooks and reports (seaborn / matplotlib). Every function takes a table from
:mod:`gdnlab.experiments` and returns a matplotlib Figure; :func:`save_figure` writes it as PNG."""
from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.colors import LogNorm
from matplotlib.ticker import NullFormatter
from matplotlib.figure import Figure

from gdnlab.metrics import ulp_bf16

__all__ = ["error_vs_chunks", "field_errors", "relative_time_heatmap", "start_ratio_heatmap", "modes_by_start",
           "ratio_vs_chunks", "ratio_vs_decay", "ratio_heatmap", "bv_bars", "ablation_bars", "isolation_bars",
           "error_budget", "save_figure", "show"]

_ULP_LABEL = "bf16 unit roundoff $2^{-8}$"


def _ulp_line(ax: plt.Axes) -> None:
    ax.axhline(ulp_bf16, color="0.4", ls="--", lw=1, label=_ULP_LABEL)


def _chunk_axis(ax: plt.Axes, ticks: list[int]) -> None:
    ax.set_xscale("log")
    ax.set_xticks(ticks, [str(int(t)) for t in ticks])
    ax.xaxis.set_minor_formatter(NullFormatter())


def _per_chunk_count(df: pd.DataFrame) -> pd.DataFrame:
    longest = df.groupby([c for c in ("initial_state", "gate_decay", "backend", "n_chunks") if c in df],
                         dropna=False).seq_len.transform("max")
    return df[df.seq_len == longest]


def error_vs_chunks(sweep: pd.DataFrame, metric: str = "max_abs_err") -> Figure:
    """Output error vs chunk count on log axes, one line per backend, one panel per initial-state setting, with the
    bf16 unit roundoff as a reference line."""
    d = _per_chunk_count(sweep)
    panels = sorted(d.initial_state.unique(), reverse=True) if "initial_state" in d else [None]
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 4), sharey=True, squeeze=False)
    markers = "osx^Dv<>"
    backends = list(dict.fromkeys(d.backend))
    for ax, h0 in zip(axes[0], panels):
        sub = d if h0 is None else d[d.initial_state == h0]
        for i, b in enumerate(backends):  # later lines thinner and smaller, so identical lines stay visible
            line = sub[sub.backend == b].sort_values("n_chunks")
            ax.plot(line.n_chunks, line[metric], marker=markers[i % len(markers)], ms=max(9 - 2 * i, 3),
                    lw=max(3 - 0.8 * i, 0.8), label=b, alpha=0.9)
        _ulp_line(ax)
        _chunk_axis(ax, sorted(sub.n_chunks.unique()))
        ax.set(yscale="log", xlabel="chunks (64 tokens each)", ylabel=metric.replace("_", " "),
               title="with initial state" if h0 else ("no initial state" if h0 is not None else ""))
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def field_errors(sweep: pd.DataFrame, metric: str = "max_abs_err") -> Figure:
    """Output error vs chunk count for every backend of a device sweep, one panel per regime (rows) and
    initial-state setting (columns), log axes, the bf16 unit roundoff as a reference line. Lines that coincide
    (bit-equal paths) are drawn thinner on top of each other, so each stays visible."""
    regimes = list(dict.fromkeys(sweep.regime))
    settings = sorted(sweep.initial_state.unique(), reverse=True)
    fig, axes = plt.subplots(len(regimes), len(settings), figsize=(6 * len(settings), 4.2 * len(regimes)),
                             sharex=True, squeeze=False)
    backends = list(dict.fromkeys(sweep.backend))
    colors = dict(zip(backends, sns.color_palette("tab10", len(backends))))
    for r, regime in enumerate(regimes):
        for c, h0 in enumerate(settings):
            ax, sub = axes[r][c], sweep[(sweep.regime == regime) & (sweep.initial_state == h0)]
            for i, b in enumerate(backends):
                line = sub[sub.backend == b].sort_values("n_chunks")
                ax.plot(line.n_chunks, line[metric], marker="o", ms=max(7 - 0.6 * i, 2.5), lw=max(3 - 0.3 * i, 0.8),
                        color=colors[b], label=b, alpha=0.9)
            _ulp_line(ax)
            _chunk_axis(ax, sorted(sub.n_chunks.unique()))
            ax.set(yscale="log", title=f"{regime.replace('_', ' ')}, {'with' if h0 else 'no'} initial state",
                   xlabel="chunks (64 tokens each)" if r == len(regimes) - 1 else "", ylabel=metric.replace("_", " "))
            ax.grid(True, which="both", alpha=0.25)
    axes[0][-1].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    return fig


def relative_time_heatmap(rel: dict[str, pd.DataFrame]) -> Figure:
    """Time / fastest at each shape (rows: backends, columns: shapes), one panel per timing ({label: table} as
    :func:`gdnlab.field.speed_vs_fastest` gives them); 1.0 marks the fastest, blank cells did not run."""
    fig, axes = plt.subplots(len(rel), 1, figsize=(1.6 + 0.85 * max(t.shape[0] for t in rel.values()),
                                                   1.2 + 2.2 * len(rel)), squeeze=False)
    for ax, (label, t) in zip(axes[:, 0], rel.items()):
        sns.heatmap(t.T, annot=True, fmt=".2f", norm=LogNorm(vmin=1.0, vmax=max(float(np.nanmax(t.values)), 1.01)),
                    cmap="rocket_r", ax=ax, cbar_kws={"label": "time / fastest"})
        ax.set(title=f"{label}: time relative to the fastest at each shape", xlabel="", ylabel="")
        ax.tick_params(axis="y", labelrotation=0)
    fig.tight_layout()
    return fig


def start_ratio_heatmap(ratio: pd.DataFrame, label: str) -> Figure:
    """A later machine start's time over an earlier one's (rows: backends, columns: shapes), coloured on a log scale
    centred on 1: blue ran faster in the later start, red slower."""
    if not np.isfinite(ratio.values).any():
        raise ValueError("start_ratio_heatmap: no finite ratio to draw")
    span = max(float(np.nanmax(np.abs(np.log(ratio.values)))), np.log(1.05))
    fig, ax = plt.subplots(figsize=(1.6 + 0.85 * ratio.shape[1], 1.2 + 0.45 * ratio.shape[0]))
    sns.heatmap(ratio, annot=True, fmt=".2f", norm=LogNorm(vmin=np.exp(-span), vmax=np.exp(span)), cmap="RdBu_r",
                ax=ax, cbar_kws={"label": "later / earlier"})
    bar = ax.collections[0].colorbar
    bar.set_ticks([t for t in (0.5, 0.67, 0.8, 0.9, 1.0, 1.1, 1.25, 1.5, 2.0) if abs(np.log(t)) <= span])
    bar.ax.yaxis.set_major_formatter("{x:g}")
    bar.ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set(title=label, xlabel="", ylabel="")
    ax.tick_params(axis="y", labelrotation=0)
    fig.tight_layout()
    return fig


def modes_by_start(starts: pd.DataFrame, label: str, digits: int = 4) -> Figure:
    """A backend's graph time in each machine start (gdnlab.field.by_start), in start order, coloured by the output
    error the start's sweep gave (to `digits` significant digits; grey: no sweep in that start) and marked by card:
    which computation each start ran, and at what speed."""
    df = starts.dropna(subset=["graph_ms"]).reset_index(drop=True)
    if df.empty:
        raise ValueError("modes_by_start: no start timed the backend")
    name = {e: f"error {e:.{digits - 1}e}" for e in sorted(df.error.dropna().unique())}
    df = df.assign(mode=df.error.map(lambda e: "no sweep" if pd.isna(e) else name[e]),
                   when=df.start.str.slice(0, 15).str.replace("T", " "))
    modes = list(dict.fromkeys(name.values()))  # by error, smallest first
    palette = dict(zip(modes, sns.color_palette("deep", len(modes))), **{"no sweep": (0.6, 0.6, 0.6)})
    fig, ax = plt.subplots(figsize=(3.2 + 0.62 * len(df), 3.4))
    sns.scatterplot(df, x="when", y="graph_ms", hue="mode", style="card", palette=palette, s=90, ax=ax)
    ax.set(title=label, xlabel="machine start (first run, UTC)", ylabel="graph ms", ylim=(0, None))
    ax.tick_params(axis="x", labelrotation=35)
    for t in ax.get_xticklabels():
        t.set_horizontalalignment("right")
    ax.legend(title="", fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    return fig


def ratio_vs_chunks(ratios: pd.DataFrame, hue: str = "gate_decay") -> Figure:
    """Candidate/baseline error ratio vs chunk count (log x), one line per value of ``hue``."""
    d = ratios.copy()
    d[hue] = d[hue].map(lambda v: f"{v:.2g}" if isinstance(v, float) else str(v))
    fig, ax = plt.subplots(figsize=(6, 4))
    sns.lineplot(data=d, x="n_chunks", y="ratio", hue=hue, marker="o", ax=ax)
    ax.axhline(1, color="0.4", ls="--", lw=1)
    _chunk_axis(ax, sorted(d.n_chunks.unique()))
    ax.set(yscale="log", xlabel="chunks", ylabel=f"{d.candidate.iloc[0]} / {d.baseline.iloc[0]} max error",
           title="error ratio vs chunk count")
    ax.legend(title="mean(-g)" if hue == "gate_decay" else hue, fontsize=8)
    fig.tight_layout()
    return fig


def ratio_vs_decay(ratios: pd.DataFrame) -> Figure:
    """Candidate/baseline error ratio vs gate decay strength (measured mean(-g), log x), one line per chunk count."""
    fig, ax = plt.subplots(figsize=(6, 4))
    sns.lineplot(data=ratios, x="gate_decay", y="ratio", hue="n_chunks", marker="o", palette="viridis", ax=ax,
                 legend="full")
    ax.axhline(1, color="0.4", ls="--", lw=1)
    ax.set(xscale="log", yscale="log", xlabel="gate decay strength mean(-g) per token",
           ylabel=f"{ratios.candidate.iloc[0]} / {ratios.baseline.iloc[0]} max error",
           title="error ratio vs gate decay")
    ax.legend(title="chunks", fontsize=8)
    fig.tight_layout()
    return fig


def ratio_heatmap(ratios: pd.DataFrame) -> Figure:
    """Heatmap of the candidate/baseline error ratio over gate decay strength (rows) and chunk count (columns)."""
    t = ratios.pivot_table(index="gate_decay", columns="n_chunks", values="ratio")
    t.index = [f"{v:.2g}" for v in t.index]
    fig, ax = plt.subplots(figsize=(1.0 + 0.75 * t.shape[1], 0.9 + 0.5 * t.shape[0]))
    vmin, vmax = max(float(np.nanmin(t.values)), 1e-3), max(float(np.nanmax(t.values)), 1.01)
    sns.heatmap(t, annot=True, fmt=".3g", norm=LogNorm(vmin=min(vmin, 1.0), vmax=vmax), cmap="rocket_r", ax=ax,
                cbar_kws={"label": "error ratio"})
    ax.set(xlabel="chunks", ylabel="gate decay mean(-g) per token",
           title=f"{ratios.candidate.iloc[0]} / {ratios.baseline.iloc[0]} max error")
    ax.tick_params(axis="y", labelrotation=0)
    fig.tight_layout()
    return fig


def bv_bars(bv: pd.DataFrame, baseline: str = "two_kernel") -> Figure:
    """Output max error per BV for each fused backend (bars, log y); the baseline (run once, at its default BV) as a
    line; the report's fused numbers as black diamonds."""
    d = bv[(bv.status == "ok") & (bv.backend != baseline)].copy()
    d["BV"] = d.BV.astype(int)
    order = sorted(set(bv.BV.dropna().astype(int)))
    fig, ax = plt.subplots(figsize=(7.5, 4))
    sns.barplot(data=d, x="BV", y="max_abs_err", hue="backend", order=order, ax=ax)
    base = bv[bv.backend == baseline]
    if not base.empty:
        ax.axhline(float(base.max_abs_err.iloc[0]), color="C2", lw=2,
                   label=f"{baseline} (BV {int(base.BV.iloc[0])})")
    rep = bv.dropna(subset=["report_max_abs_err"]).drop_duplicates("BV")
    if not rep.empty:
        first = -0.4 + 0.4 / max(d.backend.nunique(), 1)  # centre of the first hue's bar in each BV group
        ax.scatter([order.index(int(b)) + first for b in rep.BV], rep.report_max_abs_err, marker="D", s=40, color="k",
                   zorder=5, label="report (fused, gfx1151)")
    _ulp_line(ax)
    ax.set(yscale="log", ylabel="max abs err", title=f"output error vs BV (seq_len {int(bv.seq_len.iloc[0])})")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    return fig


def ablation_bars(abl: pd.DataFrame) -> Figure:
    """Output max error of each ablation variant (and the baseline) per seq_len, bars on a log axis."""
    fig, ax = plt.subplots(figsize=(8, 4.2))
    d = abl.copy()
    d["seq_len"] = d.seq_len.astype(int)
    sns.barplot(data=d, x="seq_len", y="max_abs_err", hue="variant", ax=ax)
    _ulp_line(ax)
    ax.set(yscale="log", xlabel="seq_len", ylabel="max abs err", title="fused kernel switches: output error")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    return fig


def isolation_bars(iso: pd.DataFrame) -> Figure:
    """Output max error per isolation case and backend (symlog y, so an exact 0 shows as no bar)."""
    fig, ax = plt.subplots(figsize=(7, 4))
    sns.barplot(data=iso, x="case", y="max_abs_err", hue="backend", ax=ax)
    _ulp_line(ax)
    finite = iso.max_abs_err[iso.max_abs_err > 0]
    if len(finite) == len(iso):
        ax.set_yscale("log")
    else:
        ax.set_yscale("symlog", linthresh=float(finite.min()) / 2 if not finite.empty else 1e-6)
    ax.set(xlabel="", ylabel="max abs err", title="isolation: output error")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def error_budget(df: pd.DataFrame, savings: pd.DataFrame) -> Figure:
    """Left: the emulated max error vs chunk count for every rounding set of a gdnlab.error_budget table ("all" and
    "only output" drawn heavier). Right: each set's error over all roundings' at the longest length (below 1:
    leaving that rounding out helps)."""
    fig, (a, b) = plt.subplots(1, 2, figsize=(13, 4.6), gridspec_kw=dict(width_ratios=[1.3, 1]))
    configs = list(dict.fromkeys(df.config))
    colors = dict(zip(configs, sns.color_palette("tab20", len(configs))))
    for c in configs:
        line = df[df.config == c].sort_values("n_chunks")
        heavy = c in ("all", "only output")
        a.plot(line.n_chunks, line.max_abs_err, marker="o", ms=4 if heavy else 2.5, lw=2.6 if heavy else 1.0,
               color="black" if c == "all" else colors[c], label=c, ls="--" if c == "only output" else "-")
    _ulp_line(a)
    _chunk_axis(a, sorted(df.n_chunks.unique()))
    a.set(yscale="log", xlabel="chunks (64 tokens each)", ylabel="max abs error vs float64",
          title="emulated error by rounding set")
    a.grid(True, which="both", alpha=0.25)
    a.legend(fontsize=7, ncol=2)
    s = savings.iloc[::-1]
    b.barh(s.index, s.vs_all, color=[colors.get(i, "grey") for i in s.index])
    b.axvline(1.0, color="black", lw=1)
    for y, v in enumerate(s.vs_all):
        b.text(v, y, f" {v:.3f}", va="center", fontsize=8)
    b.set(xlabel="max error / all roundings'", title=f"at {int(savings.n_chunks.iloc[0])} chunks")
    fig.tight_layout()
    return fig


def show(fig: Figure, out_dir: str | Path | None = None, name: str | None = None) -> None:
    """Save ``fig`` (when ``out_dir`` and ``name`` are given), display it once, and close it."""
    if out_dir is not None and name is not None:
        save_figure(fig, out_dir, name)
    from IPython.display import display
    display(fig)
    plt.close(fig)


def save_figure(fig: Figure, out_dir: str | Path | None, name: str, dpi: int = 110) -> Path | None:
    """Write ``fig`` to ``out_dir/figures/<name>.png`` (nothing when ``out_dir`` is None); returns the path."""
    from gdnlab.experiments import output_path
    path = output_path(out_dir, "figures", name, "png")
    if path is None:
        return None
    fig.savefig(path, dpi=dpi, bbox_inches="tight")
    return path

