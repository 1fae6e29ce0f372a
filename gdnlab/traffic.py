"""The bytes fast's four kernels move, and how close each kernel's measured time comes to moving them at copy speed.

fast (gdnlab.backends.FAST, the norm folded into the gates) runs log_norm_kernel, prologue_kernel, fwd_h_kernel and
fwd_o_kernel. Every tensor between them goes through device memory: the prologue writes W and U, the state kernel
reads them and writes every chunk's state h and V_new, the output kernel reads those back. :func:`fast_tensors`
lists each tensor with the kernel that writes it and the kernels that read it, each kernel argument named as the
kernel names it, so a test can hold the list against the launches a fast call really makes
(gdnlab.interp.recorded_launches). Counting is by unique bytes: a kernel that reads a tensor reads it once (repeat
reads by other programs of the same kernel, k by the value heads that share a key head and the state kernel's V
tiles, are taken to hit the L2), which makes these bytes a lower bound on what each kernel moves. Where fast takes
output blocks of `out_chunks` chunks (docs/speed-notes.md item 54) only each block's first h is written and read;
where fast's state kernel writes the output itself (`fused_output`, batches: item 55) there is no h, V_new or
output kernel, and with `walk_t` (batches: item 56) the prologue stores T instead of W and U. An in-situ table says
which per row in its `out_chunks`, `fused_output` and `walk_t` columns (runs without them predate these options:
1, False and False).

:func:`stage_traffic` sets those bytes beside an in-situ profile (benchmarks --parts in_situ): bytes per
microsecond, as a fraction of the run's copy bandwidth (bench.csv's copy_bw_GBps). A kernel near 1 is bound by its
bytes, and only moving fewer of them makes it faster; one far below has time to find elsewhere.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.figure import Figure

from gdnlab import runs
from gdnlab.findings import Finding, Summary, _fail
from gdnlab.kernel_params import BT, cdiv
from gdnlab.speed import _shape_labels, provenance

#: fast's kernels in launch order (the names in_situ.csv gives them).
FAST_KERNELS = ("log_norm_kernel", "prologue_kernel", "fwd_h_kernel", "fwd_o_kernel")
BF16, FP32 = 2, 4
#: How a fast call lays out its output (fast_tensors's options), each with its value for an in-situ run that
#: predates its column: the in-situ part writes these columns (benchmarks.in_situ.output_layout).
LAYOUT = {"out_chunks": 1, "fused_output": False, "walk_t": False}


@dataclass(frozen=True)
class Tensor:
    """One tensor of a fast call: its bytes, the (kernel, argument) that writes it (None for the call's inputs) and
    the (kernel, argument) pairs that read it."""

    name: str
    nbytes: int
    written_by: tuple[str, str] | None
    read_by: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Shape:
    """What the byte counts depend on: tokens, chunks and sequences of a call, and its heads and head dims."""

    tokens: int
    chunks: int
    seqs: int
    H: int = 16
    HV: int = 32
    K: int = 128
    V: int = 128
    seq_chunks: tuple[int, ...] = ()  # chunks of each sequence (empty: one sequence of `chunks`)

    def states(self, out_chunks: int = 1) -> int:
        """The per-chunk states h a call stores: one per block of `out_chunks` chunks of each sequence."""
        return sum(cdiv(n, out_chunks) for n in (self.seq_chunks or (self.chunks,)))

    @classmethod
    def of(cls, lengths: Sequence[int], **heads: int) -> Shape:
        """The shape of a batch of sequences of these lengths (each split into chunks of BT tokens)."""
        if not lengths or min(lengths) < 1:
            raise ValueError(f"lengths: must be one or more positive sequence lengths, got {list(lengths)!r}")
        per = tuple(cdiv(n, BT) for n in lengths)
        return cls(tokens=sum(lengths), chunks=sum(per), seqs=len(lengths), seq_chunks=per, **heads)


def fast_tensors(s: Shape, *, initial_state: bool = True, final_state: bool = True,
                 out_chunks: int = 1, fused_output: bool = False, walk_t: bool = False) -> list[Tensor]:
    """Every tensor a fast call moves through device memory, in bytes (bf16 q, k, v, beta, o and intermediates; fp32
    g, gates, log-norms and states), with who writes and who reads it; h as the states stored with output blocks of
    `out_chunks` chunks (its buffer keeps a slot for every chunk). With `fused_output` the state kernel writes o
    from q and there is no h, V_new or output kernel; with `walk_t` the prologue stores T instead of W and U, and
    the state kernel reads T, v, beta and log|k| (docs/speed-notes.md items 43, 55 and 56)."""
    t, H, HV, K, V = s.tokens, s.H, s.HV, s.K, s.V
    ln, pro, walk, out = FAST_KERNELS
    if walk_t:
        also = {"v": "v_ptr", "beta": "beta_ptr", "log|k|": "lk_ptr"}
        return [Tensor("T", t * HV * BT * BF16, (pro, "t_ptr"), ((walk, "t_ptr"),)) if x.name == "W" else
                Tensor(x.name, x.nbytes, x.written_by, x.read_by + ((walk, also[x.name]),)) if x.name in also else x
                for x in fast_tensors(s, initial_state=initial_state, final_state=final_state, out_chunks=out_chunks,
                                      fused_output=fused_output) if x.name != "U"]
    if fused_output:
        return [_in_walk(x, walk, out) for x in fast_tensors(s, initial_state=initial_state, final_state=final_state)
                if x.name not in ("h", "V_new")]
    rows = [
        Tensor("q", t * H * K * BF16, None, ((ln, "q_ptr"), (out, "q_ptr"))),
        Tensor("k", t * H * K * BF16, None, ((ln, "k_ptr"), (pro, "k_ptr"), (walk, "k_ptr"), (out, "k_ptr"))),
        Tensor("v", t * HV * V * BF16, None, ((pro, "v_ptr"),)),
        Tensor("g", t * HV * FP32, None, ((pro, "g_ptr"),)),
        Tensor("beta", t * HV * BF16, None, ((pro, "beta_ptr"),)),
        Tensor("log|q|", t * H * FP32, (ln, "lq_ptr"), ((pro, "lq_ptr"),)),
        Tensor("log|k|", t * H * FP32, (ln, "lk_ptr"), ((pro, "lk_ptr"),)),
        Tensor("G", t * HV * FP32, (pro, "gcum_ptr"), ((walk, "gcum_ptr"),)),
        Tensor("G - log|q|", t * HV * FP32, (pro, "gq_ptr"), ((out, "gq_ptr"),)),
        Tensor("G + log|k|", t * HV * FP32, (pro, "gk_ptr"), ((walk, "gk_ptr"), (out, "gk_ptr"))),
        Tensor("W", t * HV * K * BF16, (pro, "w_ptr"), ((walk, "w_ptr"),)),
        Tensor("U", t * HV * V * BF16, (pro, "u_ptr"), ((walk, "u_ptr"),)),
        Tensor("h", max(s.states(out_chunks), 1) * HV * K * V * BF16, (walk, "h_ptr"), ((out, "h_ptr"),)),
        Tensor("V_new", t * HV * V * BF16, (walk, "vnew_ptr"), ((out, "vnew_ptr"),)),
        Tensor("o", t * HV * V * BF16, (out, "o_ptr"), ()),
    ]
    state = s.seqs * HV * K * V * FP32
    if initial_state:
        rows.append(Tensor("initial state", state, None, ((walk, "h0_ptr"),)))
    if final_state:
        rows.append(Tensor("final state", state, (walk, "ht_ptr"), ()))
    return rows


def _in_walk(x: Tensor, walk: str, out: str) -> Tensor:
    """`x` with the output kernel's accesses made by the state kernel, under the same argument names (fwd_h_kernel's
    OUTPUT), each (kernel, argument) once."""
    def moved(a: tuple[str, str]) -> tuple[str, str]:
        return (walk, a[1]) if a[0] == out else a
    return Tensor(x.name, x.nbytes, None if x.written_by is None else moved(x.written_by),
                  tuple(dict.fromkeys(moved(a) for a in x.read_by)))


def kernel_bytes(tensors: Sequence[Tensor]) -> pd.DataFrame:
    """Bytes read, written and in all per kernel (FAST_KERNELS order), from :func:`fast_tensors`."""
    rows = {k: dict(read=0, written=0) for k in FAST_KERNELS}
    for x in tensors:
        if x.written_by is not None:
            rows[x.written_by[0]]["written"] += x.nbytes
        for kernel, _ in x.read_by:
            rows[kernel]["read"] += x.nbytes
    df = pd.DataFrame.from_dict(rows, orient="index")
    df["total"] = df.read + df.written
    df.index.name = "kernel"
    return df


def load(device: str = "h200", run: str | None = None) -> tuple[str, pd.DataFrame, float]:
    """The id, in-situ profile and copy bandwidth (its bench.csv's copy_bw_GBps) of `run`; None: the latest run
    of kind bench or check that holds both an in_situ.csv and a bench.csv."""
    if run is None:
        held = runs.select(device, purpose=("bench", "check"), has="in_situ.csv")
        held = held[[(runs.data_dir(device) / r / "bench.csv").exists() for r in held.run_id]]
        if held.empty:
            raise runs.RunError(f"no {device} bench or check run holds both in_situ.csv and bench.csv")
        run = str(held.run_id.iloc[-1])
    bw = runs.load(run, "bench.csv", device).copy_bw_GBps.dropna()
    if bw.empty:
        raise runs.RunError(f"run {run!r}: its bench.csv has no copy_bw_GBps")
    return run, runs.load(run, "in_situ.csv", device), float(bw.iloc[0])


def stage_traffic(in_situ: pd.DataFrame, copy_bw_GBps: float, *, backend: str = "fast",
                  lengths: Mapping[str, Sequence[int]] | None = None, heads: Mapping[str, int] | None = None
                  ) -> pd.DataFrame:
    """Per shape and fast kernel of an in-situ profile: its microseconds per call, the MB :func:`fast_tensors`
    counts for it (with the layout its `out_chunks`, `fused_output` and `walk_t` columns name; 1, False and False
    without them), the GB/s that makes, and
    that as a fraction of `copy_bw_GBps`. Dense rows (integer B and T)
    are B sequences of T tokens; a row whose B is not an integer (the ragged batch) needs its sequence lengths in
    `lengths` (keyed by that B, e.g. {"varlen": [...]}) and is left out without them. `heads`: Shape's H, HV, K,
    V (default: the Qwen3-Next layer's)."""
    if copy_bw_GBps <= 0:
        raise ValueError(f"copy_bw_GBps: must be positive, got {copy_bw_GBps!r}")
    df = in_situ[(in_situ.backend == backend) & in_situ.kernel.isin(FAST_KERNELS)]
    if df.empty:
        raise ValueError(f"in_situ: no rows of backend {backend!r} with kernels {', '.join(FAST_KERNELS)}")
    out = []
    for (B, T), g in df.groupby(["B", "T"], sort=False):
        lens = _lengths(B, T, lengths or {})
        if lens is None:
            continue
        layout = {n: type(d)(g[n].iloc[0]) if n in g and g[n].notna().any() else d for n, d in LAYOUT.items()}
        by_kernel = kernel_bytes(fast_tensors(Shape.of(lens, **(heads or {})), **layout))
        for _, r in g.iterrows():
            mb = by_kernel.total[r.kernel] / 1e6
            gbps = mb / r.us_per_call * 1e3  # MB per us is TB/s
            out.append(dict(B=B, T=T, tokens=sum(lens), kernel=r.kernel, us=r.us_per_call, MB=mb, GBps=gbps,
                            of_copy_bw=gbps / copy_bw_GBps))
    if not out:
        raise ValueError("in_situ: no shape whose sequence lengths are known (pass `lengths` for ragged rows)")
    return pd.DataFrame(out)


def from_run(device: str = "h200", run: str | None = None, *,
             lengths: Mapping[str, Sequence[int]] | None = None) -> tuple[str, pd.DataFrame, float]:
    """:func:`load` then :func:`stage_traffic`: the run's id, its traffic table (with the run's device, torch,
    Triton and seed columns, so it can be saved as derived data) and its copy bandwidth."""
    run, in_situ, bw = load(device, run)
    return run, stage_traffic(in_situ, bw, lengths=lengths).assign(**provenance(in_situ)), bw


def slowest_mover(traffic: pd.DataFrame, kernel: str = "prologue_kernel") -> Finding:
    """`kernel` moves its bytes at the lowest fraction of copy speed of fast's kernels at every shape of
    :func:`stage_traffic`'s table: the kernel whose time its bytes explain least."""
    t = traffic.pivot_table(index=["B", "T"], columns="kernel", values="of_copy_bw", sort=False)  # not by tokens:
    # 1x32768 and 4x8192 have the same tokens and would be averaged
    lowest = t.idxmin(axis=1)
    if not (lowest == kernel).all():
        raise _fail(f"slowest_mover: {kernel} is not the slowest mover at every shape", lowest.to_dict())
    k = t[kernel]
    rest = t.drop(columns=kernel).min(axis=1)
    return Finding(f"{kernel} moves its bytes at {k.min():.0%}-{k.max():.0%} of the copy bandwidth at every shape, "
                   f"the lowest of fast's kernels (the next lowest: {rest.min():.0%}-{rest.max():.0%}): its time is "
                   f"not its bytes.", dict(lowest=k.round(3).to_dict(), next_lowest=rest.round(3).to_dict()))


def design_floor(traffic: pd.DataFrame, copy_bw_GBps: float) -> pd.Series:
    """Per shape (labelled as gdnlab.speed labels bench rows: "1x512", "varlen"), ms that fast's counted bytes (all
    four kernels) take at `copy_bw_GBps`: what no tuning of these kernels can go below without moving fewer bytes."""
    mb = traffic.groupby(["B", "T"], sort=False).MB.sum()
    mb.index = _shape_labels(mb.index.to_frame(index=False))
    return (mb / copy_bw_GBps).rename("floor_ms")


def floor_summary(traffic: pd.DataFrame, copy_bw_GBps: float) -> Summary:
    """fast's counted bytes and their time at copy speed beside its kernels' measured time, per shape."""
    fl = design_floor(traffic, copy_bw_GBps)
    mb = fl * copy_bw_GBps
    us = traffic.groupby(["B", "T"], sort=False).us.sum()
    share = fl.to_numpy() * 1e3 / us.to_numpy()
    return Summary(f"fast's four kernels move {mb.min():.0f}-{mb.max():.0f} MB per call over these shapes; at copy "
                   f"speed those bytes take {share.min():.0%}-{share.max():.0%} of the kernels' measured time.",
                   dict(floor_ms=fl.round(4).to_dict(), kernels_us=dict(zip(fl.index, us.round(1)))))


def floor_beaten(floor_ms: pd.Series, bench: pd.DataFrame, backend: str, timing: str = "graph_ms") -> Finding:
    """The shapes where `backend`'s measured time (a bench table with a "shape" label column, e.g. from
    gdnlab.speed.load_bench) is below fast's design floor: there no tuning of fast's four kernels can match it.
    Raises when there is no such shape (or no shape in common)."""
    t = bench[bench.backend == backend].set_index("shape")[timing]
    if t.index.has_duplicates:
        raise ValueError(f"bench: more than one {backend} row for a shape ({sorted(set(t.index[t.index.duplicated()]))})")
    both = pd.concat([floor_ms, t.rename("time")], axis=1, join="inner").dropna()
    if both.empty:
        raise _fail(f"floor_beaten: no shape has both fast's floor and a {backend} time", list(floor_ms.index))
    below = both[both.time < both.floor_ms]
    if below.empty:
        raise _fail(f"floor_beaten: {backend} is above fast's design floor at every shape",
                    both.round(4).to_dict("index"))
    ratio = below.floor_ms / below.time
    return Finding(f"At {len(below)} of {len(both)} shapes ({', '.join(below.index)}) {backend} takes less time than "
                   f"fast's four kernels' bytes take at copy speed ({ratio.min():.2f}-{ratio.max():.2f}x its time): "
                   f"there only moving fewer bytes can match it.",
                   dict(floor_ms=below.floor_ms.round(4).to_dict(), time=below.time.round(4).to_dict()))


def traffic_figure(traffic: pd.DataFrame) -> Figure:
    """Each kernel's bytes per second as a fraction of the copy bandwidth against tokens (one sequence: lines;
    batches: markers)."""
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    one = traffic[traffic.B.astype(str) == "1"]
    more = traffic[traffic.B.astype(str) != "1"]
    colors = dict(zip(FAST_KERNELS, plt.rcParams["axes.prop_cycle"].by_key()["color"]))
    for k in FAST_KERNELS:
        o = one[one.kernel == k].sort_values("tokens")
        ax.plot(o.tokens, o.of_copy_bw, marker="o", ms=3, color=colors[k], label=k.replace("_kernel", ""))
        m = more[more.kernel == k]
        ax.scatter(m.tokens, m.of_copy_bw, marker="s", s=22, color=colors[k], edgecolors="k", linewidths=0.4)
    ax.axhline(1.0, ls="--", color="0.4", lw=0.8)
    ax.set(xscale="log", ylim=(0, 1.1), xlabel="tokens per call (squares: batches)",
           ylabel="bytes / time, fraction of copy bandwidth",
           title="fast's kernels: their bytes over their time")
    ax.legend(fontsize=8, frameon=False, loc="lower right")
    fig.tight_layout()
    return fig


def _lengths(B: Any, T: Any, lengths: Mapping[str, Sequence[int]]) -> list[int] | None:
    """The sequence lengths of an in-situ row's shape, or None when they are not known."""
    try:
        b, t = int(B), int(float(T))
    except (TypeError, ValueError):
        known = lengths.get(str(B))
        return list(known) if known is not None else None
    return [t] * b
