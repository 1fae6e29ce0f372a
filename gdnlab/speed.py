"""Speed results from device runs (data/<device>/<run>/bench.csv and variants_*.csv, written by
benchmarks/h200.py; which run is which is data/<device>/RUNS.csv, read through :mod:`gdnlab.runs`): the tables, the
issue's targets judged row by row by a rule fixed before the data (:func:`judge`), the findings the data supports
(:class:`~gdnlab.findings.Finding`, raising when a rerun breaks them), descriptive summaries labelled as such
(:class:`~gdnlab.findings.Summary`), and the figures."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from gdnlab import runs as registry
from gdnlab.findings import Finding, Summary, _fail


__all__ = ["default_bench", "timing_file", "timed_runs", "load_bench", "load_bench_frame", "speed_table",
           "Verdict", "paired_ratio_interval", "judge", "targets", "meets_target", "target_summary", "fix_is_free",
           "faster_eager", "versus", "time_vs_tokens", "floor_fraction", "far_from_floor", "stage_breakdown",
           "kernel_times", "gives_back", "stage_figure", "run_to_run", "ratio_by_run", "held_in_runs",
           "eager_over_graph", "paired_hides_host", "dispatch_cost", "provenance"]

TIMINGS = {"ms": "eager", "graph_ms": "graph"}
#: The timing method (RUNS.csv; bench.csv's eager_method column) of runs whose every eager sample starts from an
#: idle GPU.
SYNCED = "synced"
#: benchmarks/auto_overhead.py's host rows: a do-nothing backend called through the entry point, and through auto.
DISPATCH_DIRECT, DISPATCH_AUTO = "entry -> noop", "entry -> auto -> noop"


#: The kinds of run (RUNS.csv purpose) whose files time backends against each other.
TIMED_KINDS = ("bench", "variants")


def default_bench(device: str = "h200") -> Path:
    """bench.csv of the latest run whose purpose is "bench" (RUNS.csv): the benchmark the notebook reads unless told
    otherwise, chosen by the registry so that a new run needs no new file name."""
    return registry.path(registry.latest(device, purpose="bench", has="bench.csv"), "bench.csv", device)


def timing_file(run_id: str, device: str = "h200") -> Path:
    """The file in which run `run_id` timed backends against each other: its bench.csv, else its one
    variants_*.csv (benchmarks/h200.py writes exactly one of them per call)."""
    folder = registry.data_dir(device) / run_id
    if (folder / "bench.csv").exists():
        return registry.path(run_id, "bench.csv", device)
    found = sorted(folder.glob("variants_*.csv"))
    if len(found) != 1:
        raise registry.RunError(f"run {run_id!r} holds no bench.csv and {len(found)} variants_*.csv files")
    return found[0]


def timed_runs(device: str = "h200", since: str | None = None, before: str | None = None,
               timing_method: str | tuple[str, ...] | None = None) -> pd.DataFrame:
    """RUNS.csv's rows for the runs that timed backends (purpose bench or variants) from run `since` up to (not
    including) run `before`, in time order, each with its timing file in column `file`: the run lists of the
    run-to-run tables, taken from the registry instead of written by hand."""
    sel = registry.select(device, purpose=TIMED_KINDS, timing_method=timing_method, since=since, before=before)
    return sel.assign(file=[timing_file(r, device) for r in sel.run_id])


def _files(runs: Mapping[str, str | Path] | pd.DataFrame) -> dict[str, str | Path]:
    """name -> timing file, from a mapping or from :func:`timed_runs`'s table."""
    return dict(zip(runs.run_id, runs.file)) if isinstance(runs, pd.DataFrame) else dict(runs)


def load_bench(path: str | Path | None = None) -> pd.DataFrame:
    """The benchmark rows that ran, with a `shape` label ("1x512", "8x2048", "varlen") and `tokens` as int."""
    return load_bench_frame(pd.read_csv(path or default_bench()))


def shape_label(B: Any, T: Any) -> str:
    """A bench shape's label: "8x2048" for B sequences of T tokens, "varlen" for the ragged batch."""
    return "varlen" if str(B) == "varlen" else f"{B}x{int(T)}"


def _shape_labels(df: pd.DataFrame) -> list[str]:
    """Each row's shape_label from its B and T."""
    return [shape_label(b, t) for b, t in zip(df.B, df["T"])]


def load_bench_frame(df: pd.DataFrame) -> pd.DataFrame:
    """:func:`load_bench` on a table already in memory."""
    if "error" in df:
        df = df[df["error"].isna() | (df["error"] == "")]
    df = df.copy()
    df["shape"] = _shape_labels(df)
    df["tokens"] = df["tokens"].astype(int)
    if "seed" not in df:  # benchmarks/h200.py rotates input sets drawn with seeds 0 .. n-1 (n <= 8)
        df["seed"] = "0..n-1 (rotated sets)"
    return df


def _order(df: pd.DataFrame) -> list[str]:
    """Shapes as benchmarked: one sequence by length, then batches, then the ragged batch."""
    first = df.drop_duplicates("shape")
    key = {r.shape: (str(r.B) == "varlen", 0 if str(r.B) == "varlen" else int(r.B), r.tokens)
           for r in first.itertuples()}
    return sorted(key, key=key.get)


def speed_table(bench: pd.DataFrame, timing: str = "graph_ms") -> pd.DataFrame:
    """Milliseconds per shape (rows, in benchmark order) and backend (columns); the median where a file has
    several rounds."""
    t = bench.pivot_table(index="shape", columns="backend", values=timing, aggfunc="median")
    return t.loc[[s for s in _order(bench) if s in t.index]]


def _ratio(bench: pd.DataFrame, a: str, b: str, timing: str) -> pd.Series:
    t = speed_table(bench, timing)
    return (t[a] / t[b]).dropna() if a in t and b in t else pd.Series(dtype=float)


def ratio_table(bench: pd.DataFrame, backends: Sequence[str], baseline: str = "fast",
                timing: str = "graph_ms") -> pd.DataFrame:
    """Each of `backends`' time over `baseline`'s at each shape (rows in benchmark order, columns "b / baseline");
    NaN where either was not timed. How a candidate of the speed notes is shown beside fast."""
    t = speed_table(bench, timing)
    missing = [b for b in (*backends, baseline) if b not in t]
    if missing:
        raise ValueError(f"ratio_table: no {timing} of {', '.join(missing)} in the bench (has {', '.join(t.columns)})")
    return pd.DataFrame({f"{b} / {baseline}": t[b] / t[baseline] for b in backends})


def _to_fastest(bench: pd.DataFrame, backend: str, timing: str) -> pd.Series:
    """`backend`'s time over the fastest other backend's, per shape, against the backends timed in the same device
    run as `backend` (empty when it was not timed)."""
    same_run = bench[bench.date.isin(bench[bench.backend == backend].date)] if "date" in bench else bench
    t = speed_table(same_run, timing)
    return (t[backend] / t.drop(columns=backend).min(axis=1)).dropna() if backend in t else pd.Series(dtype=float)


@dataclass(frozen=True)
class Verdict:
    """One speed target judged by :func:`judge`: the ratio, its interval where samples gave one, the rule used."""

    ratio: float
    low: float
    high: float
    rule: str
    met: bool


#: The confidence of the paired bootstrap interval in :func:`judge`.
CONFIDENCE = 0.95


def paired_ratio_interval(a: np.ndarray, b: np.ndarray, confidence: float = CONFIDENCE, resamples: int = 4000,
                          seed: int = 0) -> tuple[float, float, float]:
    """The median of the per-sample ratios a[i] / b[i] (sample i of both backends taken together, as
    benchmarks/h200.py's eager_paired takes them) and its percentile bootstrap interval at `confidence`: the
    samples are resampled in pairs, so drift that hits both backends alike cancels in each ratio."""
    r = np.asarray(a, dtype=float) / np.asarray(b, dtype=float)
    if r.ndim != 1 or len(r) < 2 or not np.isfinite(r).all():
        raise ValueError(f"paired_ratio_interval needs two equal-length 1-d sample arrays of finite ratios, got {r!r}")
    rng = np.random.default_rng(seed)
    boot = np.concatenate([np.median(r[rng.integers(0, len(r), (n, len(r)))], axis=1)
                           for n in np.diff(np.r_[0:resamples:500, resamples])])
    lo, hi = np.quantile(boot, [(1 - confidence) / 2, (1 + confidence) / 2])
    return float(np.median(r)), float(lo), float(hi)


def judge(goal: float, at_most: bool = True, *, ratio: float | None = None,
          samples: tuple[np.ndarray, np.ndarray] | None = None) -> Verdict:
    """The acceptance rule for a speed target, fixed before any data is read.

    With paired per-sample times (`samples` = (a, b), the target being a / b): the target is met iff the paired
    bootstrap 95% interval of the median per-sample ratio (:func:`paired_ratio_interval`) lies wholly on the goal's
    side: its upper bound <= goal for an "at most" goal, its lower bound >= goal for an "at least" one. Where only
    medians exist (`ratio`, the ratio of medians or a median of ratios): met iff ratio <= goal (>= for "at least").
    A miss stays a miss: the samples' spread widens the interval and so makes a target harder to meet, never easier.
    """
    if (ratio is None) == (samples is None):
        raise ValueError("judge takes either ratio or samples")
    if samples is not None:
        mid, lo, hi = paired_ratio_interval(*samples)
        return Verdict(mid, lo, hi, f"paired bootstrap {CONFIDENCE:.0%}", bool(hi <= goal if at_most else lo >= goal))
    r = float(ratio)
    return Verdict(r, float("nan"), float("nan"), "median", bool(r <= goal if at_most else r >= goal))


def judged(target: str, ratios: pd.Series, timing: str, goal: float, at_most: bool = True) -> list[dict]:
    """One row per shape of `ratios` (shape -> measured ratio) judged by :func:`judge`'s median rule: target, timing
    label, shape, ratio, goal, rule, met. A ratio that is not finite (a backend that did not run) is a miss, with
    rule "not measured"."""
    rows = []
    for shape, r in ratios.items():
        row = dict(target=target, timing=timing, shape=shape, goal=("<= " if at_most else ">= ") + f"{goal:g}")
        if not np.isfinite(r):
            rows.append(dict(row, ratio=float(r), rule="not measured", met=False))
            continue
        v = judge(goal, at_most, ratio=float(r))
        rows.append(dict(row, ratio=v.ratio, rule=v.rule, met=v.met))
    return rows


def targets(bench: pd.DataFrame, small_tokens: int = 4096) -> pd.DataFrame:
    """Issue 6's targets, one row per (target, shape, timing): the measured ratio, the goal, the rule and whether
    the target is met by :func:`judge` (bench files hold medians, so the median rule).

    - fix free: fused_fixed / fused_shipped <= 1.05, both timings;
    - fast vs FLA: fast / fla <= 1 in graph timing; fla / fast >= 1.2 eagerly for B*T <= small_tokens;
    - auto: auto / fastest <= 1.05 eagerly and <= 1.10 in graph timing (against the backends of auto's own run).
    """
    rows = []
    env = bench[[c for c in ("device", "torch", "triton", "date", "seed") if c in bench]].iloc[0].to_dict()

    def add(name: str, ratios: pd.Series, timing: str, goal: float, at_most: bool) -> None:
        rows.extend(dict(env, **r) for r in judged(name, ratios, TIMINGS[timing], goal, at_most))

    for tm in TIMINGS:
        add("fused_fixed / fused_shipped", _ratio(bench, "fused_fixed", "fused_shipped", tm), tm, 1.05, True)
    add("fast / fla", _ratio(bench, "fast", "fla", "graph_ms"), "graph_ms", 1.0, True)
    small = bench[bench.tokens <= small_tokens]
    add("fla / fast", _ratio(small, "fla", "fast", "ms"), "ms", 1.2, False)
    for tm, goal in (("ms", 1.05), ("graph_ms", 1.10)):
        add("auto / fastest", _to_fastest(bench, "auto", tm), tm, goal, True)
    return pd.DataFrame(rows)


def _misses(rows: pd.DataFrame) -> str:
    return ", ".join(f"{r.shape} {r.ratio:.3f}x (goal {r.goal})" for r in rows[~rows.met].itertuples())


def meets_target(tg: pd.DataFrame, target: str, timing: str | None = None) -> Finding:
    """Target `target` (in `timing`, "eager" or "graph", or both) is met at every size of a :func:`targets`
    table, by the table's rule; raises with the misses otherwise."""
    rows = tg[(tg.target == target) & ((tg.timing == timing) if timing else True)]
    if rows.empty:
        raise _fail(f"meets_target: no rows for {target!r} ({timing or 'any timing'})", sorted(set(tg.target)))
    if not rows.met.all():
        raise _fail(f"{target} ({timing or 'any timing'}) is not met at every size: {_misses(rows)}",
                    rows.set_index("shape").ratio.round(3).to_dict())
    lo, hi = float(rows.ratio.min()), float(rows.ratio.max())
    return Finding(f"Target {target} {rows.goal.iloc[0]} ({timing or 'eager and graph'}) is met at all {len(rows)} "
                   f"sizes by the {rows.rule.iloc[0]} rule: {lo:.3f}-{hi:.3f}x.",
                   dict(low=lo, high=hi, sizes=len(rows)))


def target_summary(tg: pd.DataFrame) -> Summary:
    """How many sizes meet each target of a :func:`targets` table, and every miss with its ratio: the misses
    shown, not explained away (a descriptive summary: it asserts nothing)."""
    parts, counts = [], {}
    for (target, timing), rows in tg.groupby(["target", "timing"], sort=False):
        measured = rows[rows.rule != "not measured"]
        counts[f"{target} ({timing})"] = (int(measured.met.sum()), len(measured))
        if measured.empty:
            parts.append(f"{target} ({timing}): not measured in this run")
            continue
        txt = f"{target} {rows.goal.iloc[0]} ({timing}): met at {int(measured.met.sum())} of {len(measured)} sizes"
        parts.append(txt + (f"; not met at {_misses(measured)}" if not measured.met.all() else "")
                     + (f"; not measured at {len(rows) - len(measured)}" if len(measured) < len(rows) else ""))
    rules = sorted(set(tg.rule) - {"not measured"})
    return Summary("By the acceptance rule (" + ", ".join(rules) + "): " + "; ".join(parts) + ".", counts)


def fix_is_free(bench: pd.DataFrame, tol: float = 0.05) -> Finding:
    """fused_fixed is within `tol` of fused_shipped at every size, eager and graph-replayed."""
    worst = {TIMINGS[tm]: _ratio(bench, "fused_fixed", "fused_shipped", tm) for tm in TIMINGS}
    if any(r.empty for r in worst.values()):
        raise _fail("fix_is_free: the benchmark lacks fused_fixed or fused_shipped", list(bench.backend.unique()))
    hi = {k: float(r.max()) for k, r in worst.items()}
    if max(hi.values()) > 1 + tol:
        raise _fail(f"the fix costs more than {tol:.0%} somewhere", {k: r.round(3).to_dict() for k, r in worst.items()})
    return Finding(f"The fix is free: fused_fixed takes at most {hi['eager']:.3f}x (eager) and {hi['graph']:.3f}x "
                   f"(graph) the time of fused_shipped across {len(worst['graph'])} sizes.", hi)


def faster_eager(bench: pd.DataFrame, a: str = "fast", b: str = "fla", factor: float = 1.2,
                 small_tokens: int = 4096) -> Finding:
    """`a` is at least `factor` times faster than `b` in eager calls at every size of B*T <= small_tokens."""
    r = _ratio(bench[bench.tokens <= small_tokens], b, a, "ms")
    if r.empty or r.min() < factor:
        raise _fail(f"{a} is not {factor}x faster than {b} eagerly at every B*T <= {small_tokens}", r.round(3).to_dict())
    return Finding(f"Called eagerly, {a} is {r.min():.2f}-{r.max():.2f}x faster than {b} at every size with "
                   f"B*T <= {small_tokens} ({len(r)} sizes): {b} spends most of a short call on the host.",
                   r.to_dict())


def versus(bench: pd.DataFrame, a: str, b: str, timing: str = "graph_ms") -> Summary:
    """Where `a` is faster than `b` and by how much it trails elsewhere, as measured: a descriptive summary (it
    asserts nothing; the targets are judged by :func:`targets` and :func:`meets_target`)."""
    r = _ratio(bench, a, b, timing)
    if r.empty:
        raise _fail(f"versus: no sizes with both {a} and {b}", list(bench.backend.unique()))
    wins, loses = r[r <= 1], r[r > 1]
    txt = f"In {TIMINGS[timing]} timing {a} is faster than {b} at {len(wins)} of {len(r)} sizes"
    txt += f" ({', '.join(wins.index)})" if len(wins) else ""
    if len(loses):
        txt += (f"; elsewhere it takes {loses.min():.2f}-{loses.max():.2f}x {b}'s time "
                f"(worst at {loses.idxmax()})")
    return Summary(txt + ".", r.to_dict())


def far_from_floor(bench: pd.DataFrame, at_most: float = 0.25, timing: str = "graph_ms") -> Finding:
    """Every backend at every size takes at least 1/at_most times the memory floor: none is memory-bound."""
    fr = floor_fraction(bench, timing)
    hi = float(fr.max().max())
    if not hi <= at_most:
        raise _fail(f"some backend reaches more than {at_most:.0%} of the memory floor", fr.round(3).to_dict())
    return Finding(f"No path is memory-bound: the bytes that must move take {float(fr.min().min()):.1%}-{hi:.1%} of "
                   f"the measured ({TIMINGS[timing]}) time, for every backend and size.", dict(max=hi))


def time_vs_tokens(bench: pd.DataFrame, backends: list[str] | None = None) -> Figure:
    """Milliseconds vs tokens per backend, eager and graph-replayed, one sequence per call (B = 1, lines) and the
    batched / ragged shapes (markers); the memory floor dashed."""
    backends = backends or list(dict.fromkeys(bench.backend))
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.6), sharey=True)
    colors = dict(zip(backends, plt.rcParams["axes.prop_cycle"].by_key()["color"] * 3))
    dense = bench[bench.B.astype(str) == "1"].sort_values("tokens")
    other = bench[bench.B.astype(str) != "1"]
    for ax, (tm, label) in zip(axes, TIMINGS.items()):
        for be in backends:
            d = dense[dense.backend == be]
            ax.plot(d.tokens, d[tm], marker="o", ms=4, color=colors[be], label=be)
            o = other[(other.backend == be) & other[tm].notna()]
            ax.scatter(o.tokens, o[tm], marker="s", s=28, color=colors[be], edgecolor="k", lw=0.5)
        fl = dense.drop_duplicates("tokens")
        ax.plot(fl.tokens, fl.floor_ms, ls="--", color="0.4", label="memory floor")
        for _, o in other.drop_duplicates("shape").iterrows():
            ax.annotate(o["shape"], (o.tokens, o.floor_ms), fontsize=7, color="0.3", xytext=(3, -10),
                        textcoords="offset points")
        ax.set(xscale="log", yscale="log", xlabel="tokens (B x T)", title=f"{label}")
        ax.grid(True, which="both", alpha=0.25)
    axes[0].set_ylabel("ms per call")
    axes[1].legend(fontsize=8, loc="upper left")
    dev = bench.device.iloc[0] if "device" in bench else ""
    fig.suptitle(f"GDN prefill time vs tokens, {dev} (squares: 8x2048 and a ragged batch)")
    fig.tight_layout()
    return fig


def floor_fraction(bench: pd.DataFrame, timing: str = "graph_ms") -> pd.DataFrame:
    """Memory floor / measured time per shape and backend: how far each is from moving bytes at copy speed."""
    t = speed_table(bench, timing)
    fl = bench.drop_duplicates("shape").set_index("shape").floor_ms.reindex(t.index)
    return t.rdiv(fl, axis=0)


#: Kernel-name fragments -> the pipeline stage they belong to (the lab's kernels and FLA 0.6's).
STAGES = (("l2norm", "l2-norm"), ("log_norm", "l2-norm"), ("prologue", "prologue"), ("cumsum", "prologue"),
          ("kkt", "prologue"), ("recompute_w_u", "prologue"), ("wu_kernel", "prologue"),
          ("fwd_h", "state kernel"), ("kernel_h", "state kernel"), ("fwd_o", "output kernel"),
          ("kernel_o", "output kernel"))


def _stage(kernel: str) -> str:
    return next((st for frag, st in STAGES if frag in kernel), "other (torch)")


def stage_breakdown(in_situ: str | Path | pd.DataFrame) -> pd.DataFrame:
    """Device microseconds per call and stage (l2-norm, prologue, state kernel, output kernel, other) for every
    shape and backend of an in-situ profile (benchmarks/h200.py --parts in_situ: each kernel's time inside one
    graph-replayed call), with the call's graph time beside them."""
    df = in_situ if isinstance(in_situ, pd.DataFrame) else pd.read_csv(in_situ)
    df = df[df["kernel"].notna()].copy()
    df["shape"] = _shape_labels(df)
    df["stage"] = df.kernel.map(_stage)
    t = df.pivot_table(index=["shape", "backend"], columns="stage", values="us_per_call", aggfunc="sum").fillna(0)
    t["kernels"] = t.sum(axis=1)
    t["call (profiled)"] = df.groupby(["shape", "backend"]).call_ms_profiled.first() * 1e3
    order = [s for s in _order(df.assign(tokens=df["tokens"].astype(int))) if s in t.index.get_level_values(0)]
    return t.loc[order]


def kernel_times(in_situ: pd.DataFrame, kernel: str) -> pd.DataFrame:
    """Microseconds per call of one kernel of an in-situ profile (rows: shapes in benchmark order, columns:
    backends)."""
    df = in_situ[in_situ.kernel == kernel]
    if df.empty:
        held = ", ".join(sorted(set(in_situ.kernel.dropna())))
        raise ValueError(f"kernel_times: no {kernel!r} in the profile (it has {held})")
    df = df.assign(shape=_shape_labels(df))
    t = df.pivot_table(index="shape", columns="backend", values="us_per_call", aggfunc="sum", sort=False)
    return t.loc[[s for s in _order(df.assign(tokens=df["tokens"].astype(int))) if s in t.index]]


def gives_back(in_situ: pd.DataFrame, candidate: str, shapes: Sequence[str], *, baseline: str = "fast",
               saves: str = "prologue_kernel", costs: str = "fwd_h_kernel") -> Finding:
    """At each of `shapes`, `candidate`'s `saves` kernel takes less time than `baseline`'s and its `costs` kernel
    more, by more than that saving: what the candidate moves from one kernel to another costs it more than it
    saves (an in-situ profile: each kernel's device time inside one call; the kernels run one after another, so
    their times add)."""
    if not len(shapes):
        raise _fail("gives_back: no shapes to judge", {})
    try:
        a, b = kernel_times(in_situ, saves), kernel_times(in_situ, costs)
    except ValueError as e:
        raise _fail(f"gives_back: {e}", {}) from e
    for t, kernel in ((a, saves), (b, costs)):
        absent = [x for x in (candidate, baseline) if x not in t] + [s for s in shapes if s not in t.index]
        if absent:
            raise _fail(f"gives_back: no {kernel} time of {', '.join(absent)}", dict(backends=list(t.columns),
                                                                                    shapes=list(t.index)))
    saved = (a[baseline] - a[candidate]).loc[list(shapes)]
    cost = (b[candidate] - b[baseline]).loc[list(shapes)]
    numbers = pd.DataFrame({"saved_us": saved, "cost_us": cost}).round(1).to_dict("index")
    if not ((saved > 0) & (cost > saved)).all():
        raise _fail(f"gives_back: {candidate} does not lose in {costs} more than it saves in {saves} at every shape",
                    numbers)
    return Finding(f"{candidate} saves {', '.join(f'{v:.0f}' for v in saved)} us in {saves} at {', '.join(shapes)} "
                   f"and loses {', '.join(f'{v:.0f}' for v in cost)} us in {costs}: more than it saves at each.",
                   numbers)


def stage_figure(breakdown: pd.DataFrame, shapes: list[str] | None = None) -> Figure:
    """Stacked bars: each backend's device time per stage, one panel per shape."""
    shapes = shapes or list(dict.fromkeys(breakdown.index.get_level_values(0)))
    stages = [c for c in ("l2-norm", "prologue", "state kernel", "output kernel", "other (torch)") if c in breakdown]
    backends = list(dict.fromkeys(breakdown.index.get_level_values(1)))
    label_in = max(map(len, backends)) * 0.075  # the backends' names, once, left of the first panel
    fig, axes = plt.subplots(1, len(shapes), figsize=(label_in + 3.1 * len(shapes), 1.8 + 0.45 * len(backends)),
                             squeeze=False, sharey=True)
    colors = dict(zip(stages, plt.rcParams["axes.prop_cycle"].by_key()["color"]))
    for ax, shape in zip(axes[0], shapes):
        b = breakdown.loc[shape].reindex(backends).fillna(0.0)
        left = pd.Series(0.0, index=b.index)
        for st in stages:
            ax.barh(b.index, b[st], left=left, color=colors[st], label=st)
            left += b[st]
        ax.set(title=shape, xlabel="us per call")
    axes[0][0].invert_yaxis()
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(stages), fontsize=8, frameon=False)
    fig.suptitle("Where the device time of one call goes (in situ, graph-replayed)")
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    return fig


def run_to_run(runs: Mapping[str, str | Path] | pd.DataFrame, backends: tuple[str, ...] = ("fla", "fast"),
               min_tokens: int = 0) -> pd.DataFrame:
    """Graph ms of each backend per shape in every given run (:func:`timed_runs`'s table, or name -> CSV with
    backend, B, T, tokens, graph_ms: bench or variants files, medians over a file's rounds), and its spread
    max / min across the runs that timed it."""
    rows = []
    for name, path in _files(runs).items():
        d = load_bench(path)
        d = d[d.backend.isin(backends) & (d.tokens >= min_tokens) & d.graph_ms.notna()]
        for (be, shape), g in d.groupby(["backend", "shape"]):
            rows.append(dict(backend=be, shape=shape, run=name, graph_ms=float(g.graph_ms.median())))
    t = pd.DataFrame(rows).pivot_table(index=["backend", "shape"], columns="run", values="graph_ms")
    t["spread"] = t.max(axis=1) / t.min(axis=1)
    return t


def ratio_by_run(runs: Mapping[str, str | Path] | pd.DataFrame, a: str, b: str, timing: str = "ms",
                 max_tokens: int | None = None) -> pd.DataFrame:
    """b's time over a's (how many times faster a is) per shape (rows) in every given run (columns;
    :func:`timed_runs`'s table or name -> bench or variants CSV, medians over a file's rounds), for shapes of at
    most `max_tokens` tokens."""
    frames = {name: load_bench(path) for name, path in _files(runs).items()}
    if max_tokens is not None:
        frames = {name: d[d.tokens <= max_tokens] for name, d in frames.items()}
    t = pd.DataFrame({name: _ratio(d, b, a, timing) for name, d in frames.items()})
    return t.loc[[s for s in _order(next(iter(frames.values()))) if s in t.index]]


def held_in_runs(ratios: pd.DataFrame, factor: float, what: str) -> Summary:
    """In how many runs (columns of ratio_by_run) the ratio reached `factor` at every shape, and per shape: a
    descriptive summary (it asserts nothing beyond that every cell was measured)."""
    if ratios.empty or ratios.isna().any().any():
        raise _fail("held_in_runs: a run lacks a shape", ratios.round(3).to_dict())
    every = int((ratios >= factor).all().sum())
    per = {s: int((r >= factor).sum()) for s, r in ratios.iterrows()}
    weakest = ratios.min(axis=1)
    txt = (f"{what} held at every size in {every} of {ratios.shape[1]} machine starts; by size: "
           + ", ".join(f"{s} {n}/{ratios.shape[1]} (lowest {weakest[s]:.3f})" for s, n in per.items()) + ".")
    return Summary(txt, dict(every=every, runs=ratios.shape[1], per_shape=per))


def eager_over_graph(runs: pd.DataFrame, backend: str, shape: str) -> pd.DataFrame:
    """`backend`'s eager ms over its graph ms at `shape` in every run of :func:`timed_runs`'s table (run_id, file,
    timing_method), with the run's timing method from RUNS.csv: ~1 where the eager call is device-bound, more where
    the host's work shows."""
    rows = []
    for r in runs.itertuples():
        d = load_bench(r.file)
        e, g = speed_table(d, "ms"), speed_table(d, "graph_ms")
        if backend in e and shape in e.index:
            rows.append(dict(run=r.run_id, method=r.timing_method, eager_ms=float(e.loc[shape, backend]),
                             graph_ms=float(g.loc[shape, backend]),
                             ratio=float(e.loc[shape, backend] / g.loc[shape, backend])))
    return pd.DataFrame(rows).set_index("run")


def paired_hides_host(table: pd.DataFrame, backend: str, shape: str) -> Finding:
    """In every run sampled paired without synchronisation `backend`'s eager call at `shape` measured closer to its
    graph time than in any run sampled otherwise (do_bench windows, or paired from an idle GPU): a table of
    eager_over_graph with "paired" runs and others."""
    paired = table[table.method == "paired"].ratio
    others = table[table.method != "paired"]
    if paired.empty or others.empty:
        raise _fail("paired_hides_host: needs runs sampled paired and runs sampled otherwise", table.to_dict())
    hi_paired, lo_others = float(paired.max()), float(others.ratio.min())
    if not hi_paired < lo_others:
        raise _fail(f"{backend}'s eager/graph at {shape} does not separate by method", table.round(3).to_dict())
    labels = {"windows": "timed in do_bench windows", "rounds": "timed in interleaved do_bench rounds",
              SYNCED: "sampled paired, each call from an idle GPU"}

    def span(r: pd.Series, label: str) -> str:
        lo, hi = float(r.min()), float(r.max())
        return (f"{lo:.2f}x" if f"{lo:.2f}" == f"{hi:.2f}" else f"{lo:.2f}-{hi:.2f}x") + \
            f" in the {len(r)} run{'s' if len(r) > 1 else ''} {label}"

    parts = [span(paired, "sampled paired without synchronisation")] + [
        span(r, labels.get(m, f"sampled {m}")) for m, r in others.groupby("method").ratio]
    return Finding(f"{backend}'s eager call at {shape} took, over its graph time, {'; '.join(parts)}. Only sampled "
                   f"between the other backends' calls with the GPU still busy did its host work hide behind their "
                   f"queued device work (docs/speed-notes.md items 18 and 19).",
                   dict(paired_max=hi_paired, others_min=lo_others))


def dispatch_cost(table: str | Path | pd.DataFrame, goal: float = 1.05) -> Finding:
    """What auto's dispatch layer costs (benchmarks/auto_overhead.py's table): its host time per call (auto routed
    to a do-nothing backend, less that backend called directly) and auto's eager time over the configuration it
    runs from many paired samples, judged against `goal` at every size by :func:`judge` (the table holds the
    median of the per-sample ratios, so the median rule)."""
    df = table if isinstance(table, pd.DataFrame) else pd.read_csv(table)
    us = df.set_index("what").us
    eager = df[df.what.str.startswith("eager")].set_index("T")
    if eager.empty or not {DISPATCH_DIRECT, DISPATCH_AUTO} <= set(us.index):
        raise _fail("dispatch_cost: the table lacks the host or the eager rows", list(df.what))
    layer = float(us[DISPATCH_AUTO] - us[DISPATCH_DIRECT])
    worst = float(eager.median_paired_ratio.max())
    if not all(judge(goal, ratio=r).met for r in eager.median_paired_ratio):
        raise _fail(f"auto's eager time is not within {goal:g}x of what it runs", eager.median_paired_ratio.to_dict())
    sizes = ", ".join(f"{r:.3f}x ({int(t)} tokens)" for t, r in eager.median_paired_ratio.items())
    return Finding(f"auto's dispatch layer costs {layer:.1f} us of host time a call; over "
                   f"{int(eager.samples.min())} paired eager samples auto takes {sizes} the time of the "
                   f"configuration it runs (median of the per-sample ratios).", dict(layer_us=layer, worst=worst))


def provenance(table: str | Path | pd.DataFrame) -> dict[str, str]:
    """Device, torch, Triton and seed of a device run's table (for the rows of a derived table)."""
    df = table if isinstance(table, pd.DataFrame) else pd.read_csv(table)
    row = df.iloc[0]
    return dict(device=str(row["device"]), torch=str(row["torch"]), triton=str(row["triton"]),
                seed=str(row["seed"]) if "seed" in df else "0..n-1 (rotated sets)")
