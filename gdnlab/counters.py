"""What Nsight Compute says bounds each of a call's kernels (benchmarks --parts ncu, ncu.csv).

ncu.csv holds every metric ncu printed, one row per kernel and metric; :func:`table` keeps, per shape and kernel,
the few that say whether a kernel waits on memory or on itself: its duration, DRAM and SM throughput against the
card's peaks, registers, theoretical and achieved occupancy, cycles between a warp's instructions, and the stall
reason that holds its warps longest (:func:`stalls`: warps stalled for each reason per issued instruction, ncu's
``smsp__average_warps_issue_stalled_*_per_issue_active.ratio``). :func:`stalls_figure` draws the stall reasons of
each kernel side by side. ncu replays each kernel with the clocks as they are, so durations compare with the
in-situ profile's only roughly; the ratios and counts are the point.
"""
from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.figure import Figure

from gdnlab.findings import Finding, Summary, _fail

#: Column of :func:`table` -> the metric's name as ncu's details page prints it.
METRICS = {
    "duration_us": "Duration",
    "dram_pct": "DRAM Throughput",
    "sm_pct": "Compute (SM) Throughput",
    "registers": "Registers Per Thread",
    "theoretical_occupancy_pct": "Theoretical Occupancy",
    "achieved_occupancy_pct": "Achieved Occupancy",
    "cycles_per_issue": "Warp Cycles Per Issued Instruction",
}
#: Microseconds per unit of ncu's duration units.
_TO_US = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3, "s": 1e6, "second": 1e6}
STALL_PREFIX = "smsp__average_warps_issue_stalled_"
STALL_SUFFIX = "_per_issue_active.ratio"
#: A kernel's rows: ncu's launch index keeps apart two launches of one kernel in a call (two l2-norm launches).
_KEYS = ["backend", "B", "T", "launch", "kernel"]
#: Where a run's rows say what ran (device, versions, date, the inputs' seed): carried into :func:`table`.
PROVENANCE = ("device", "torch", "triton", "date", "seed")
#: Reasons ncu counts that are not waiting: "selected" is the issuing warp itself (about 1 per issue).
NOT_STALLS = ("selected",)


def _profiled(ncu: pd.DataFrame) -> pd.DataFrame:
    """The rows of ncu.csv that hold a metric (rows of a failed shape carry only `error`)."""
    got = ncu[ncu.metric.notna()] if "metric" in ncu else ncu.iloc[:0]
    if got.empty and "error" in ncu:  # every shape failed: its rows carry only `error`
        errors = ncu["error"].dropna().unique().tolist()
        raise ValueError(f"ncu: no kernel was profiled ({'; '.join(errors)[:300] or 'no rows'})")
    missing = [c for c in (*_KEYS, "metric", "value", "unit") if c not in ncu]
    if missing:
        raise ValueError(f"ncu: not an ncu.csv table (no column {', '.join(missing)})")
    if got.empty:
        raise ValueError("ncu: no kernel was profiled (no rows)")
    return got


def stalls(ncu: pd.DataFrame) -> pd.DataFrame:
    """Per backend, shape and kernel (rows) the warps stalled for each reason per issued instruction (columns,
    by reason: long_scoreboard, math_pipe_throttle, ...); empty when the run did not ask for them."""
    got = _profiled(ncu)
    s = got[got.metric.str.startswith(STALL_PREFIX) & got.metric.str.endswith(STALL_SUFFIX)]
    s = s.assign(reason=s.metric.str[len(STALL_PREFIX):-len(STALL_SUFFIX)])
    return s.pivot_table(index=_KEYS, columns="reason", values="value", aggfunc="first", sort=False)


def table(ncu: pd.DataFrame) -> pd.DataFrame:
    """Per backend, shape and kernel launch (in launch order): METRICS's columns (duration in us whatever unit ncu
    printed), the run's PROVENANCE columns it has, and, where the run has them, the longest stall reason and its
    share of all stalls ("selected", the issuing warp, left out of both)."""
    got = _profiled(ncu)
    rows = []
    for keys, g in got.groupby(_KEYS, sort=False):
        by = g.drop_duplicates("metric").set_index("metric")
        row = dict(zip(_KEYS, keys))
        row.update({c: g[c].iloc[0] for c in PROVENANCE if c in g})
        for col, name in METRICS.items():
            row[col] = float(by.value[name]) if name in by.index else float("nan")
        if "Duration" in by.index:
            unit = str(by.unit["Duration"])
            if unit not in _TO_US:
                raise ValueError(f"ncu: duration of {keys[-1]} in an unknown unit {unit!r}")
            row["duration_us"] *= _TO_US[unit]
        rows.append(row)
    out = pd.DataFrame(rows)
    st = stalls(ncu).drop(columns=list(NOT_STALLS), errors="ignore")
    if not st.empty:
        top = st.idxmax(axis=1).rename("top_stall")
        share = (st.max(axis=1) / st.sum(axis=1)).rename("top_stall_share")
        out = out.merge(pd.concat([top, share], axis=1).reset_index(), on=_KEYS, how="left")
    return out


def counters_summary(tab: pd.DataFrame, kernel: str = "prologue_kernel") -> Summary:
    """`kernel`'s row of :func:`table` at each shape, in words (nothing asserted)."""
    k = tab[tab.kernel == kernel]
    if k.empty:
        raise ValueError(f"table: no rows of {kernel!r} (kernels: {', '.join(tab.kernel.unique())})")
    parts = []
    for _, r in k.iterrows():
        stall = (f", longest stall {r.top_stall} ({r.top_stall_share:.0%} of stalls)"
                 if "top_stall" in r and isinstance(r.top_stall, str) else "")
        parts.append(f"{r.B}x{r['T']}: {r.registers:.0f} registers, occupancy {r.achieved_occupancy_pct:.1f}% "
                     f"achieved of {r.theoretical_occupancy_pct:.1f}%, DRAM {r.dram_pct:.0f}% and SM "
                     f"{r.sm_pct:.0f}% of peak{stall}")
    return Summary(f"{kernel} under ncu: " + "; ".join(parts) + ".",
                   k.set_index(["B", "T", "launch"]).drop(columns=["backend", "kernel"]).round(3).to_dict("index"))


#: ncu's per-program limits on resident programs a multiprocessor (Occupancy section): the smallest binds.
BLOCK_LIMITS = ("Block Limit Registers", "Block Limit Shared Mem", "Block Limit Warps", "Block Limit SM",
                "Block Limit Barriers")


def register_bound(ncu: pd.DataFrame, kernel: str = "prologue_kernel") -> Finding:
    """Finding: at every profiled shape `kernel`'s resident programs are limited by its registers (ncu's register
    block limit is the smallest of its limits) and its longest stall is waiting on memory (long scoreboard: global
    and spilled local loads); the numbers carry its local-memory spill requests."""
    got = _profiled(ncu)
    rows = got[got.kernel == kernel]
    if rows.empty:
        raise ValueError(f"ncu: no rows of {kernel!r} (kernels: {', '.join(got.kernel.unique())})")
    tops = table(ncu).set_index(_KEYS)
    numbers, bad = {}, []
    for keys, g in rows.groupby(_KEYS, sort=False):
        by = g.drop_duplicates("metric").set_index("metric").value
        limits = {n: float(by[n]) for n in BLOCK_LIMITS if n in by.index}
        if "Block Limit Registers" not in limits:
            raise ValueError(f"ncu: {kernel} at {keys[1]}x{keys[2]} has no register block limit (Occupancy section)")
        top = tops.top_stall.get(keys) if "top_stall" in tops else None
        shape = f"{keys[1]}x{keys[2]}"
        numbers[shape] = dict(programs_by_registers=limits["Block Limit Registers"], top_stall=top,
                              spill_requests=float(by.get("Local Memory Spilling Requests", float("nan"))))
        if limits["Block Limit Registers"] > min(limits.values()) or top != "long_scoreboard":
            bad.append(shape)
    if bad:
        raise _fail(f"register_bound: {kernel} is not register-bound and waiting on memory at {', '.join(bad)}",
                    numbers)
    return Finding(f"{kernel}: at {', '.join(numbers)} its registers limit its resident programs "
                   f"({', '.join(str(int(n['programs_by_registers'])) for n in numbers.values())} a multiprocessor) "
                   f"and its warps wait longest on memory (long scoreboard).", numbers)


def stalls_figure(ncu: pd.DataFrame, *, top: int = 6) -> Figure:
    """Stall reasons (warps per issued instruction) of each kernel, one panel per shape: the `top` reasons over
    all kernels, the rest summed as "other" ("selected", the issuing warp, is no stall and left out)."""
    st = stalls(ncu).drop(columns=list(NOT_STALLS), errors="ignore")
    if st.empty:
        raise ValueError("ncu: the run has no stall metrics (benchmarks.ncu.STALL_METRICS)")
    keep = st.sum().sort_values(ascending=False).index[:top]
    st = st[keep].assign(other=st.drop(columns=keep).sum(axis=1))
    shapes = list(dict.fromkeys(zip(st.index.get_level_values("B"), st.index.get_level_values("T"))))
    fig, axes = plt.subplots(1, len(shapes), figsize=(4.2 * len(shapes), 3.4), squeeze=False, sharex=True)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, (B, T) in zip(axes[0], shapes):
        s = st.xs((B, T), level=("B", "T")).droplevel(["backend", "launch"])
        left = pd.Series(0.0, index=s.index)
        for i, reason in enumerate(s.columns):
            ax.barh([k.replace("_kernel", "") for k in s.index], s[reason], left=left,
                    color=colors[i % len(colors)] if reason != "other" else "0.75", label=reason)
            left += s[reason]
        ax.invert_yaxis()
        ax.set(title=f"{B} x {T}", xlabel="warps stalled per issued instruction")
    axes[0][-1].legend(fontsize=7, frameon=False, loc="lower right")
    fig.suptitle("Where each kernel's warps wait (Nsight Compute)", fontsize=10)
    fig.tight_layout()
    return fig
