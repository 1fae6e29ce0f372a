"""The sweeps and tables every notebook and test calls.

Each function runs backends against the float64 reference and returns a long-format ``pandas.DataFrame``: one row
per measurement, and in every row the columns ``device, torch, triton, seed, regime, backend``. Every backend runs
with ``poison=True`` where it takes options (outputs and intermediates pre-filled with NaN) and its outputs are
checked fully written and finite before any error is measured.

Sequence-length sweeps measure *prefixes* of one long sequence: the kernels are causal, so the first ``n`` output rows
of a run of ``T >= n`` tokens are the output of a run of the first ``n`` tokens (tests/test_experiments.py checks
this bit for bit). One run of ``max(seq_lens)`` tokens therefore gives every row of a sweep.
"""
from __future__ import annotations

import importlib
import inspect
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from tqdm import tqdm

from gdnlab import backends as _backends
from gdnlab import metrics
from gdnlab.inputs import GDNInputs, make_inputs
from gdnlab.interp import triton_version
from gdnlab.kernel_params import BT, FUSED_VARIANTS
from gdnlab.reference import chunk_gated_delta_rule_ref, recurrent_gated_delta_rule_ref

__all__ = [
    "BT", "REPORT_SEQ_LEN", "REPORT_BV", "REPORT_ISOLATION", "CUTEDSL_SHAPE", "Problem",
    "device_name", "env_columns", "load_plugins", "run_backend", "check_written", "reference",
    "seq_len_sweep", "decay_grid", "ratio_table", "report_table", "regime_sweep", "report_fit", "report_view",
    "fit_view", "run_info", "sweep_view", "bv_view", "isolation_view", "ablation_view", "bv_sweep", "isolation_table",
    "ablation", "save_table", "save_timings", "output_path", "WALL_TIME_COLUMN",
]

#: The report's first table: seq_len -> (two-kernel max err, fused max err, ratio as printed).
REPORT_SEQ_LEN: dict[int, tuple[float, float, float]] = {
    63: (4.61e-04, 4.38e-03, 9.5),
    64: (4.20e-04, 5.18e-03, 12.0),
    128: (5.95e-04, 3.78e-02, 64.0),
    192: (7.19e-04, 5.47e-02, 76.0),
}
#: The report's BV table at seq_len 128 (fused max err).
REPORT_BV: dict[int, float] = {16: 3.33e-02, 32: 3.14e-02, 64: 3.10e-02}
#: The report's isolation table: case -> (output error, final-state error) of the fused kernel.
REPORT_ISOLATION: dict[str, tuple[float, float]] = {
    "iso_1chunk_noh0": (0.0, 0.0),
    "iso_1chunk_h0": (4.76e-03, 0.0),
    "iso_2chunk_noh0": (2.88e-02, 0.0),
}
#: The lab's own Triton backends (they take BV and poison).
_LAB_TRITON = ("two_kernel", "fused_shipped", "fused_fixed")
#: The CuteDSL test's head shape (Hk, Hv, K, V), the report's presumed shape.
CUTEDSL_SHAPE: dict[str, int] = dict(H=4, HV=8, K=128, V=128)


# ---------------------------------------------------------------------------------------------------- environment

def device_name(device: str | torch.device) -> str:
    """``"cpu"``, or the CUDA device's name (``"NVIDIA H200"``)."""
    dev = torch.device(device)
    if dev.type == "cuda":
        return torch.cuda.get_device_name(dev)
    return dev.type


def env_columns(device: str | torch.device, seed: int) -> dict[str, Any]:
    """The columns every table row carries: device, torch and Triton versions, seed."""
    return dict(device=device_name(device), torch=torch.__version__, triton=triton_version(), seed=seed)


def load_plugins(plugins: Iterable[str]) -> list[str]:
    """Import each module path (it registers its backends with ``gdnlab.backends.register_backend``).

    Returns the names of the backends the imports added.
    """
    before = set(_backends.BACKENDS)
    for mod in plugins:
        if mod.endswith(".py"):
            raise ImportError(f"{mod!r} is a file name; name the module: {mod[:-3].replace('/', '.')!r}")
        importlib.import_module(mod)
    return [b for b in _backends.BACKENDS if b not in before]


# ------------------------------------------------------------------------------------------------------- running

def takes_option(fn: Any, name: str) -> bool:
    """Whether backend callable `fn` accepts keyword `name` (a named parameter or **options)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return True
    return any(p.kind is p.VAR_KEYWORD or p.name == name for p in params)


def check_written(o: torch.Tensor, ht: torch.Tensor | None, inputs: GDNInputs, backend: str) -> None:
    """Raise AssertionError unless every valid output row and the final state are finite (a NaN left by poison
    means an element no kernel wrote) and padding rows of a ragged buffer are zero."""
    pad = None
    valid = o
    if inputs.cu_seqlens is not None:
        mask = metrics.valid_rows(inputs.cu_seqlens, o.shape[1]).to(o.device)
        valid, pad = o[0][mask], o[0][~mask]
    bad = int((~torch.isfinite(valid.float())).sum())
    if bad:
        raise AssertionError(f"{backend}: {bad} of {valid.numel()} output elements not written or not finite")
    if pad is not None and bool((pad != 0).any()):
        raise AssertionError(f"{backend}: {int((pad != 0).sum())} padding output elements are not zero")
    if ht is not None:
        bad = int((~torch.isfinite(ht.float())).sum())
        if bad:
            raise AssertionError(f"{backend}: {bad} of {ht.numel()} final-state elements not written or not finite")


def poisoned_call(kwargs: dict[str, Any], backend: str, **options: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One call of `backend` with ``poison=True`` where it takes it (outputs pre-filled with NaN, so an element it
    never writes stays NaN); a wrapper that forwards ``**options`` to a library which refuses ``poison`` is called
    again without it."""
    import gdnlab

    if "poison" not in options and takes_option(_backends.get_backend(backend), "poison"):
        try:
            return gdnlab.chunk_gated_delta_rule(**kwargs, backend=backend, poison=True, **options)
        except TypeError as e:
            if "poison" not in str(e):
                raise
    return gdnlab.chunk_gated_delta_rule(**kwargs, backend=backend, **options)


def run_backend(inputs: GDNInputs, backend: str, **options: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Run one backend on ``inputs`` (:func:`poisoned_call`) and check its outputs (:func:`check_written`)."""
    o, ht = poisoned_call(inputs.kwargs(), backend, **options)
    check_written(o, ht, inputs, backend)
    return o, ht


def reference(inputs: GDNInputs, per_token: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Float64 ground truth: the chunked form by default (it agrees with the per-token recurrence to ~1e-13 and is
    ~10x faster), the per-token recurrence with ``per_token=True``."""
    fn = recurrent_gated_delta_rule_ref if per_token else chunk_gated_delta_rule_ref
    return fn(**inputs.kwargs())


def _err(out: torch.Tensor, ref: torch.Tensor, prefix: str = "") -> dict[str, float]:
    e = metrics.errors(out, ref)
    return {f"{prefix}max_abs_err": e["max_abs"], f"{prefix}mean_abs_err": e["mean_abs"], f"{prefix}rel_rms": e["rel_rms"]}


def _bar(it: Iterable, total: int, desc: str, progress: bool) -> Iterable:
    return tqdm(it, total=total, desc=desc, disable=not progress, leave=False)


@dataclass(frozen=True)
class Problem:
    """What to draw: everything of ``make_inputs`` that the sweeps vary or record."""

    regime: str = "decay"
    decay: float | None = None
    h0_scale: float = 0.05
    H: int = 4
    HV: int = 8
    K: int = 128
    V: int = 128
    seed: int = 0
    state_dtype: torch.dtype = torch.float32

    def inputs(self, T: int, device: str | torch.device, initial_state: bool = True) -> GDNInputs:
        """Inputs of one sequence of ``T`` tokens."""
        return make_inputs(T=T, H=self.H, HV=self.HV, K=self.K, V=self.V, regime=self.regime, seed=self.seed,
                           decay=self.decay, h0_scale=self.h0_scale, initial_state=initial_state,
                           state_dtype=self.state_dtype, device=device)

    def columns(self, inputs: GDNInputs) -> dict[str, Any]:
        """Columns describing the draw, including the measured mean of -g (the gate's decay per token)."""
        return dict(regime=self.regime, decay=self.decay, gate_decay=float(-inputs.g.double().mean()),
                    h0_scale=self.h0_scale, H=self.H, HV=self.HV, K=self.K, V=self.V)


# ------------------------------------------------------------------------------------------------------- sweeps

def seq_len_sweep(seq_lens: Sequence[int], backends: Sequence[str], *, problem: Problem = Problem(),
                  initial_state: Sequence[bool] = (True, False), baseline: str = "two_kernel",
                  device: str | torch.device = "cpu", progress: bool = True, **options: Any) -> pd.DataFrame:
    """Output error of each backend at each sequence length, with and without an initial state.

    One sequence of ``max(seq_lens)`` tokens is run per backend and initial-state setting; the row for ``seq_len``
    measures its first ``seq_len`` output rows (``max_abs_err``, ``mean_abs_err``, ``rel_rms``) and, separately,
    the rows of its last chunk (``last_chunk_max_abs_err``), and the largest difference from the baseline's output
    (``diff_vs_baseline``, when the baseline is among ``backends``). ``options`` go to every backend (e.g. ``BV``).
    """
    seq_lens = sorted(set(int(n) for n in seq_lens))
    if not seq_lens or seq_lens[0] < 1:
        raise ValueError(f"seq_lens: must be positive ints, got {seq_lens!r}")
    T = seq_lens[-1]
    rows = []
    order = list(dict.fromkeys([baseline, *backends])) if baseline in backends else list(dict.fromkeys(backends))
    jobs = [(h0, b) for h0 in initial_state for b in order]
    env = env_columns(device, problem.seed)
    refs: dict[bool, tuple[GDNInputs, torch.Tensor]] = {}
    base: dict[bool, torch.Tensor] = {}
    for h0, b in _bar(jobs, len(jobs), f"seq-len sweep T={T}", progress):
        if h0 not in refs:
            inp = problem.inputs(T, device, initial_state=h0)
            refs[h0] = (inp, reference(inp)[0])
        inp, o_ref = refs[h0]
        o, _ = run_backend(inp, b, **options)
        if b == baseline:
            base[h0] = o
        for n in seq_lens:
            last = (n - 1) // BT * BT
            diff = float((o[:, :n].double() - base[h0][:, :n].double()).abs().max()) if h0 in base else math.nan
            rows.append(dict(env, **problem.columns(inp), backend=b, seq_len=n, n_chunks=-(-n // BT),
                             initial_state=h0, BV=options.get("BV", 64), **_err(o[:, :n], o_ref[:, :n]),
                             last_chunk_max_abs_err=metrics.errors(o[:, last:n], o_ref[:, last:n])["max_abs"],
                             diff_vs_baseline=diff))
    return pd.DataFrame(rows)


def decay_grid(decays: Sequence[float | None], n_chunks: Sequence[int], backends: Sequence[str], *,
               problem: Problem = Problem(), device: str | torch.device = "cpu", progress: bool = True,
               **options: Any) -> pd.DataFrame:
    """:func:`seq_len_sweep` (with an initial state) at each gate decay strength and ``seq_len = 64 * n_chunks``.

    A decay of None keeps ``problem.regime``'s own gate (the "cutedsl" regime's is fast, mean(-g) about 7.7;
    docs/design.md §6).
    """
    frames = []
    for d in _bar(decays, len(decays), "decay grid", progress):
        p = replace(problem, decay=d)
        frames.append(seq_len_sweep([BT * n for n in n_chunks], backends, problem=p, initial_state=(True,),
                                    device=device, progress=False, **options))
    return pd.concat(frames, ignore_index=True)


def ratio_table(df: pd.DataFrame, candidate: str, baseline: str = "two_kernel", metric: str = "max_abs_err",
                by: Sequence[str] = ("seq_len", "n_chunks", "initial_state")) -> pd.DataFrame:
    """One row per group of ``by``: the baseline's and the candidate's ``metric`` and their ratio."""
    keys = [c for c in ("device", "torch", "triton", "seed", "regime", "decay", "gate_decay", "h0_scale", *by)
            if c in df.columns]
    keys = list(dict.fromkeys(keys))
    have = set(df.backend)
    if baseline not in have or candidate not in have:
        raise ValueError(f"ratio_table: need rows of both {baseline!r} and {candidate!r}, have {sorted(have)}")
    pick = lambda b: df[df.backend == b][keys + [metric]].rename(columns={metric: f"{b}_{metric}"})
    wide = pick(baseline).merge(pick(candidate), on=keys, how="inner")  # NaN keys (decay None) match each other
    base = wide[f"{baseline}_{metric}"]
    cand = wide[f"{candidate}_{metric}"]
    wide["ratio"] = [c / b if b > 0 else (1.0 if c == 0 else math.inf) for b, c in zip(base, cand)]
    wide["baseline"], wide["candidate"], wide["metric"] = baseline, candidate, metric
    return wide


_ANY: Any = object()


def report_table(df: pd.DataFrame, candidate: str = "fused_shipped", baseline: str = "two_kernel", *,
                 decay: float | None = _ANY, h0_scale: float = _ANY) -> pd.DataFrame:
    """The report's first table next to ours (long format): for each report seq_len and quantity
    (``baseline max err``, ``fused max err``, ``ratio``) the measured value, the report's, and measured/report.

    ``decay`` / ``h0_scale`` pick one regime out of a table holding several (``decay=None``: the regime's own gate).
    """
    if decay is not _ANY:
        df = df[df.decay.isna()] if decay is None else df[df.decay == decay]
    if h0_scale is not _ANY:
        df = df[df.h0_scale == h0_scale]
    if df.empty:
        raise ValueError(f"report_table: no rows for decay={decay!r}, h0_scale={h0_scale!r} (is it among the "
                         f"regimes that were run?)")
    r = ratio_table(df[df.initial_state] if "initial_state" in df else df, candidate, baseline)
    rows = []
    for _, x in r[r.seq_len.isin(list(REPORT_SEQ_LEN))].iterrows():
        rep = REPORT_SEQ_LEN[int(x.seq_len)]
        measured = (x[f"{baseline}_max_abs_err"], x[f"{candidate}_max_abs_err"], x.ratio)
        for q, m, rv in zip(("two_kernel max err", "fused max err", "ratio"), measured, rep):
            rows.append(dict({k: x[k] for k in ("device", "torch", "triton", "seed", "regime", "decay",
                                                "gate_decay", "h0_scale") if k in x},
                             seq_len=int(x.seq_len), n_chunks=int(x.n_chunks), quantity=q, baseline=baseline,
                             candidate=candidate, measured=float(m), report=rv, factor=float(m) / rv))
    return pd.DataFrame(rows).sort_values("seq_len", kind="stable", ignore_index=True)


def report_view(table: pd.DataFrame) -> pd.DataFrame:
    """:func:`report_table` as the report prints it: one row per seq_len, ours next to the report's."""
    w = table.pivot_table(index="seq_len", columns="quantity", values=["measured", "report"], aggfunc="first")
    cols = [("two_kernel max err", "measured"), ("two_kernel max err", "report"), ("fused max err", "measured"),
            ("fused max err", "report"), ("ratio", "measured"), ("ratio", "report")]
    out = pd.DataFrame({f"{q} ({'ours' if k == 'measured' else 'report'})": w[(k, q)] for q, k in cols})
    f = table.assign(off=table.factor.map(lambda x: max(x, 1 / x) if x > 0 else math.inf))
    out["worst factor"] = f.groupby("seq_len").off.max()
    return out


def fit_view(fit: pd.DataFrame) -> pd.DataFrame:
    """:func:`report_fit` summarised: one row per regime, the measured ratio at each report seq_len and the worst
    factor to the report's numbers."""
    key = [fit.decay.fillna(-1.0).rename("decay"), fit.h0_scale]
    r = fit[fit.quantity == "ratio"]
    w = r.pivot_table(index=[r.decay.fillna(-1.0).rename("decay"), "h0_scale"], columns="seq_len",
                      values="measured", aggfunc="first")
    w.columns = [f"ratio @ {c}" for c in w.columns]
    w["mean(-g) measured"] = fit.groupby(key).gate_decay.first()
    w["worst factor"] = fit.groupby(key).worst_factor.first()
    w = w.reset_index()
    w["decay"] = w.decay.map(lambda d: "regime's own" if d < 0 else f"{d:g}")
    w["h0_scale"] = w.h0_scale.map(lambda s: f"{s:g}")
    return w.set_index(["decay", "h0_scale"])


def regime_sweep(decays: Sequence[float | None], h0_scales: Sequence[float], backends: Sequence[str], *,
                 seq_lens: Sequence[int] = tuple(REPORT_SEQ_LEN), problem: Problem = Problem(),
                 baseline: str = "two_kernel", device: str | torch.device = "cpu",
                 progress: bool = True) -> pd.DataFrame:
    """:func:`seq_len_sweep` (with an initial state) for every (gate decay, initial-state scale): the raw rows
    behind :func:`report_fit`. A decay of None keeps ``problem.regime``'s own gate."""
    frames = []
    grid = [(d, s) for d in decays for s in h0_scales]
    for d, s in _bar(grid, len(grid), "regimes", progress):
        frames.append(seq_len_sweep(seq_lens, backends, problem=replace(problem, decay=d, h0_scale=s),
                                    initial_state=(True,), baseline=baseline, device=device, progress=False))
    return pd.concat(frames, ignore_index=True)


def report_fit(sweep: pd.DataFrame, candidate: str = "fused_shipped", baseline: str = "two_kernel") -> pd.DataFrame:
    """:func:`report_table` for every regime of a :func:`regime_sweep`: how close each comes to the report's rows.

    Adds ``worst_factor`` per regime: the largest of ``max(f, 1/f)`` over its twelve numbers.
    """
    frames = [report_table(g, candidate, baseline) for _, g in sweep.groupby(
        [sweep.decay.fillna(-1.0), sweep.h0_scale], sort=False)]
    fit = pd.concat(frames, ignore_index=True)
    off = fit.factor.map(lambda f: max(f, 1 / f) if f > 0 else math.inf)
    fit["worst_factor"] = off.groupby([fit.decay.fillna(-1), fit.h0_scale]).transform("max")
    return fit


def bv_sweep(bvs: Sequence[int], backends: Sequence[str], *, baseline: str = "two_kernel", seq_len: int = 128,
             problem: Problem = Problem(), device: str | torch.device = "cpu", progress: bool = True,
             num_warps: int | None = None) -> pd.DataFrame:
    """Output error of each backend at each BV (the baseline at its default BV only), one sequence of ``seq_len``.
    ``num_warps`` (if given) goes to the lab's Triton backends (on the H200 with Triton 3.6, BV < 64 needs 8 warps:
    data/h200/2026-12-02T1441-bench/probe_configs.csv).

    A BV that a compiled target (or a user's backend) refuses becomes a row with ``status`` holding the error's first
    line and NaN errors.
    """
    inp = problem.inputs(seq_len, device)
    o_ref, s_ref = reference(inp)
    env = env_columns(device, problem.seed)
    rows = []
    jobs = [(baseline, None)] + [(b, bv) for b in backends if b != baseline for bv in bvs]
    for b, bv in _bar(jobs, len(jobs), f"BV sweep T={seq_len}", progress):
        opts = {} if bv is None else {"BV": bv}
        if num_warps is not None and b in _LAB_TRITON:
            opts["num_warps"] = num_warps
        try:
            o, ht = run_backend(inp, b, **opts)
        except AssertionError:
            raise
        except Exception as e:  # noqa: BLE001 - a compile failure is a result, recorded in the row
            if torch.device(device).type == "cpu" and b in _LAB_TRITON:
                raise  # the interpreter runs every BV of the lab's kernels: a failure there is a bug
            rows.append(dict(env, **problem.columns(inp), backend=b, BV=bv, seq_len=seq_len, n_chunks=-(-seq_len // BT),
                             status=(str(e).strip().splitlines() or [type(e).__name__])[0],
                             max_abs_err=math.nan, mean_abs_err=math.nan, rel_rms=math.nan))
            continue
        rows.append(dict(env, **problem.columns(inp), backend=b, BV=64 if bv is None else bv, seq_len=seq_len,
                         n_chunks=-(-seq_len // BT), status="ok", **_err(o, o_ref),
                         **_err(ht, s_ref, "state_"),
                         report_max_abs_err=REPORT_BV.get(bv, math.nan) if b != baseline else math.nan))
    return pd.DataFrame(rows)


def isolation_table(cases: Sequence[Any], backends: Sequence[str], *, baseline: str = "two_kernel",
                    decay: float | None = None, h0_scale: float | None = None, regime: str | None = None,
                    shape: dict[str, int] | None = None, device: str | torch.device = "cpu",
                    progress: bool = True) -> pd.DataFrame:
    """Output and final-state error of each backend on each case (``gdnlab.cases.Case``), and each backend's
    largest difference from the baseline's output and state (0.0 means bit-equal).

    ``decay``, ``h0_scale``, ``regime`` and ``shape`` (H, HV, K, V; None: the case's own) change how the case's
    inputs are drawn; every other case field (length, batch, initial state, state dtype, seed) is kept.
    """
    overrides = {k: v for k, v in (("decay", decay), ("h0_scale", h0_scale), ("regime", regime)) if v is not None}
    overrides.update(shape or {})
    rows = []
    jobs = [(c, b) for c in cases for b in dict.fromkeys([baseline, *backends])]
    done: dict[str, tuple[GDNInputs, Any, dict[str, tuple[torch.Tensor, torch.Tensor]]]] = {}
    for c, b in _bar(jobs, len(jobs), "isolation", progress):
        if c.name not in done:
            inp = c.inputs(device)
            if overrides:
                inp = make_inputs(**{**{k: inp.meta[k] for k in ("B", "T", "H", "HV", "K", "V", "seqlens", "pad",
                                                                 "dtype", "state_dtype", "h0_scale", "decay")},
                                     "regime": c.regime, **overrides}, seed=c.seed, initial_state=c.initial_state,
                                  device=device)
            done[c.name] = (inp, reference(inp), {})
        inp, (o_ref, s_ref), outs = done[c.name]
        o, ht = run_backend(inp, b)
        outs[b] = (o, ht)
        ob, hb = outs[baseline]
        rep = REPORT_ISOLATION.get(c.name, (math.nan, math.nan))
        rows.append(dict(env_columns(device, c.seed), regime=inp.regime, decay=inp.meta.get("decay"),
                         h0_scale=inp.meta.get("h0_scale"), **{k: inp.meta[k] for k in ("H", "HV", "K", "V")},
                         case=c.name, T=c.T, n_chunks=c.n_chunks,
                         initial_state=c.initial_state, backend=b, **_err(o, o_ref), **_err(ht, s_ref, "state_"),
                         output_diff_vs_baseline=float((o.double() - ob.double()).abs().max()),
                         state_diff_vs_baseline=float((ht.double() - hb.double()).abs().max()),
                         report_max_abs_err=rep[0] if b.startswith("fused") else math.nan,
                         report_state_max_abs_err=rep[1] if b.startswith("fused") else math.nan))
    return pd.DataFrame(rows)


#: The fused kernel's two switches: (downcast, intra_vnew) -> variant label, for every named variant.
ABLATION_VARIANTS: dict[tuple[bool, bool], str] = {(f.downcast, f.intra_vnew): f.label
                                                   for f in FUSED_VARIANTS.values()}


def ablation(seq_lens: Sequence[int], *, fused_backend: str = "fused_shipped", baseline: str = "two_kernel",
             extra: Sequence[str] = (), problem: Problem = Problem(), device: str | torch.device = "cpu",
             progress: bool = True) -> pd.DataFrame:
    """Every combination of the fused kernel's switches (bf16 downcast of the state before Q·h on/off; the
    intra-chunk term's operand U or V_new) on the same inputs, plus the baseline and any ``extra`` backends.

    Rows per (variant, seq_len prefix): the output error against the float64 reference, the largest difference from
    the baseline's output, and the final-state error of the full run.
    """
    T = max(seq_lens)
    inp = problem.inputs(T, device)
    o_ref, s_ref = reference(inp)
    env = env_columns(device, problem.seed)
    jobs: list[tuple[str, str, dict[str, Any]]] = [(baseline, baseline, {})]
    jobs += [(fused_backend, label, dict(downcast=d, intra_vnew=iv)) for (d, iv), label in ABLATION_VARIANTS.items()]
    jobs += [(b, b, {}) for b in extra if b not in (baseline, fused_backend)]
    rows = []
    o_base = None
    for b, label, opts in _bar(jobs, len(jobs), "ablation", progress):
        o, ht = run_backend(inp, b, **opts)
        if o_base is None:
            o_base = o
        for n in sorted(set(seq_lens)):
            rows.append(dict(env, **problem.columns(inp), backend=b, variant=label,
                             downcast=opts.get("downcast"), intra_operand=None if not opts else
                             ("V_new" if opts["intra_vnew"] else "U"), seq_len=n, n_chunks=-(-n // BT),
                             **_err(o[:, :n], o_ref[:, :n]),
                             diff_vs_baseline=float((o[:, :n].double() - o_base[:, :n].double()).abs().max()),
                             state_max_abs_err=metrics.errors(ht, s_ref)["max_abs"]))
    return pd.DataFrame(rows)


# -------------------------------------------------------------------------------------------------------- views

def run_info(device: str | torch.device, **params: Any) -> pd.DataFrame:
    """What a notebook ran on and with: device, versions, the interpreter's dot model on CPU, and ``params``."""
    import platform

    from gdnlab.interp import current_dot_model
    # No date: a report rerun on unchanged code must read the same (gdnlab reproduce records when it ran).
    info = dict(device=device_name(device), torch=torch.__version__, triton=triton_version(),
                python=platform.python_version(),
                execution="compiled" if torch.device(device).type == "cuda" else
                f"Triton interpreter, dot model {current_dot_model().name!r}")
    info.update({k: v for k, v in params.items()})
    return pd.DataFrame({"value": [str(v) for v in info.values()]}, index=list(info))


def sweep_view(sweep: pd.DataFrame, candidate: str = "fused_shipped", baseline: str = "two_kernel") -> pd.DataFrame:
    """Max error per chunk count (rows) and initial state / backend (columns), with the candidate/baseline ratio."""
    longest = sweep.groupby(["initial_state", "n_chunks"]).seq_len.transform("max")
    d = sweep[sweep.seq_len == longest]
    w = d.pivot_table(index="n_chunks", columns=["initial_state", "backend"], values="max_abs_err", aggfunc="first")
    for h0 in d.initial_state.unique():
        if (h0, baseline) in w and (h0, candidate) in w:
            w[(h0, f"ratio {candidate}/{baseline}")] = w[(h0, candidate)] / w[(h0, baseline)]
    w = w.sort_index(axis=1, level=0, sort_remaining=False)
    w.columns = [f"{'h0' if h0 else 'no h0'}: {b}" for h0, b in w.columns]
    return w


def bv_view(bv: pd.DataFrame) -> pd.DataFrame:
    """Max output error per BV (rows) and backend (columns), with the report's fused numbers."""
    w = bv.pivot_table(index="BV", columns="backend", values="max_abs_err", aggfunc="first")
    w["report (fused)"] = bv.groupby("BV").report_max_abs_err.max()
    if (bv.status != "ok").any():
        w["status"] = bv[bv.status != "ok"].groupby("BV").status.first()
    return w


def isolation_view(iso: pd.DataFrame) -> pd.DataFrame:
    """One row per (case, backend): output and final-state max error, difference from the baseline, the report's."""
    cols = ["max_abs_err", "state_max_abs_err", "output_diff_vs_baseline", "state_diff_vs_baseline",
            "report_max_abs_err", "report_state_max_abs_err"]
    return iso.set_index(["case", "backend"])[cols]


def ablation_view(abl: pd.DataFrame) -> pd.DataFrame:
    """Max output error per variant (rows) and seq_len (columns), and each variant's error over the baseline's."""
    w = abl.pivot_table(index="variant", columns="seq_len", values="max_abs_err", aggfunc="first", sort=False)
    base = w.loc[abl.backend.iloc[0]]
    ratio = w / base
    w.columns = [f"max err @ {c}" for c in w.columns]
    ratio.columns = [f"/ baseline @ {c}" for c in ratio.columns]
    return pd.concat([w, ratio], axis=1)


# ------------------------------------------------------------------------------------------------------- output

#: Columns holding wall times (``model_seconds``, ``seconds``): they change on every run, so :func:`save_table` keeps
#: them out of the result table (which must not change when nothing changed) and writes them to timings/.
WALL_TIME_COLUMN = re.compile(r"(^|_)seconds$")


#: How tables write floats: 10 significant digits, so that float64 results whose last digits depend on the CPU's
#: summation order (vector width, BLAS paths) rewrite the same bytes on another machine (12 were not enough between
#: an AVX-512 machine and the one before it). Values that are round-off themselves (notebook 09's run with no
#: rounding, about 1e-16) still differ between machines.
TABLE_FLOAT = "%.10g"


def save_table(df: pd.DataFrame | Sequence[pd.DataFrame], out_dir: str | Path | None, name: str) -> Path | None:
    """Write ``df`` (or several tables, concatenated) to ``out_dir/tables/<name>.csv`` (nothing when ``out_dir`` is
    None); returns the path. Wall-time columns (:data:`WALL_TIME_COLUMN`) go to ``out_dir/timings/<name>.csv``
    instead, beside the table's text columns, and floats are written to TABLE_FLOAT, so that a rerun of unchanged code
    rewrites the table byte for byte."""
    path = output_path(out_dir, "tables", name, "csv")
    if path is None:
        return None
    if not isinstance(df, pd.DataFrame):
        df = pd.concat(list(df), ignore_index=True)
    walls = [c for c in df.columns if WALL_TIME_COLUMN.search(str(c))]
    if walls:
        keys = [c for c in df.columns if c not in walls and df[c].dtype == object]
        save_timings(df[keys + walls], out_dir, name)
        df = df.drop(columns=walls)
    df.to_csv(path, index=False, float_format=TABLE_FLOAT)
    return path


def save_timings(df: pd.DataFrame, out_dir: str | Path | None, name: str) -> Path | None:
    """Write wall times to ``out_dir/timings/<name>.csv`` (not committed: they differ on every run)."""
    path = output_path(out_dir, "timings", name, "csv")
    if path is not None:
        df.to_csv(path, index=False)
    return path


def output_path(out_dir: str | Path | None, sub: str, name: str, ext: str) -> Path | None:
    """``out_dir/<sub>/<name>.<ext>`` with its folder created, None when ``out_dir`` is None; ValueError unless
    ``name`` is a plain file name (a notebook parameter must not write outside its folder)."""
    if out_dir is None:
        return None
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
        raise ValueError(f"name: must be a plain file name, got {name!r}")
    path = Path(out_dir) / sub / f"{name}.{ext}"
    path.parent.mkdir(parents=True, exist_ok=True)
    return path
