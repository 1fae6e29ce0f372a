"""The findings the notebooks state, each computed from a table and asserted, and the summaries they show beside them.

A finding function takes a table from :mod:`gdnlab.experiments`, checks one claim, and returns a :class:`Finding`
whose sentence is written from the same numbers (a notebook displays it as Markdown). When a rerun disagrees, it
raises AssertionError with the numbers instead of printing a sentence that is no longer true. A summary function
(:class:`Summary`: regime_fit_summary, compare_to_report) only describes its table and asserts nothing about the
numbers; it is shown as a summary, never as a finding (docs/design.md §9).
"""
from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from gdnlab.experiments import ratio_table

__all__ = [
    "Finding", "reproduces_report", "regime_fit_summary", "ratio_grows_with_chunks", "slow_gate_larger_ratio",
    "final_state_bit_equal", "one_chunk_no_h0_exact", "excess_when_state_enters", "bit_equal_to_baseline",
    "bv_does_not_matter", "intra_operand_explains", "compare_to_report", "candidate_summary", "candidate_verdict",
    "candidate_isolation", "bv8_by_release", "KNOWN_DEFECTIVE", "Summary",
]


@dataclass
class Finding:
    """A checked claim: the sentence and the numbers it rests on."""

    claim: str
    numbers: dict[str, Any] = field(default_factory=dict)
    #: The function that checked the claim (filled in from the caller): how the index finds a notebook's answers.
    source: str = ""
    #: How a notebook labels it.
    label = "Finding"

    def __post_init__(self) -> None:
        if not self.source:
            self.source = sys._getframe(2).f_code.co_name

    def _repr_markdown_(self) -> tuple[str, dict[str, str]]:
        return f"**{self.label}.** {self.claim}", {"gdnlab_source": self.source}

    def __str__(self) -> str:
        return self.claim


@dataclass
class Summary(Finding):
    """A description of a table: the sentence and its numbers, with no rule checked (shown as a summary)."""

    label = "Summary (descriptive, not asserted)"


def _fail(msg: str, numbers: Any) -> AssertionError:
    return AssertionError(f"{msg}\nnumbers: {numbers}")


def _x(v: float) -> str:
    return f"{v:.3g}x" if math.isfinite(v) else "inf"


def _one_per_chunk_count(df: pd.DataFrame) -> pd.DataFrame:
    """Rows whose seq_len is the longest of its chunk count (64 n where present)."""
    longest = df.groupby("n_chunks").seq_len.transform("max")
    return df[df.seq_len == longest]


# ------------------------------------------------------------------------------------------- notebook 1: seq-len

def reproduces_report(table: pd.DataFrame, factor: float = 2.0, seq_lens: Sequence[int] | None = None) -> Finding:
    """Every number of the report's first table (for ``seq_lens``, default all four rows) is matched within
    ``factor`` by ``table`` (from :func:`gdnlab.experiments.report_table`, one regime)."""
    rows = table if seq_lens is None else table[table.seq_len.isin(list(seq_lens))]
    if rows.empty:
        raise _fail("reproduces_report: no rows to compare", table)
    off = rows[(rows.factor > factor) | (rows.factor < 1 / factor) | rows.factor.isna()]
    nums = {(int(r.seq_len), r.quantity): (float(r.measured), float(r.report), round(float(r.factor), 3))
            for r in rows.itertuples()}
    if not off.empty:
        bad = [(int(r.seq_len), r.quantity, f"{r.measured:.3g} vs report {r.report:.3g}") for r in off.itertuples()]
        raise _fail(f"report rows not matched within {factor:g}x: {bad}", nums)
    worst = float(rows.factor.map(lambda f: max(f, 1 / f)).max())
    lens = sorted(int(x) for x in rows.seq_len.unique())
    parts = []
    for n in lens:
        r = rows[rows.seq_len == n].set_index("quantity")
        parts.append(f"seq_len {n}: {r.measured['two_kernel max err']:.2e} / {r.measured['fused max err']:.2e} "
                     f"= {r.measured['ratio']:.1f}x (report {r.report['ratio']:g}x)")
    first = rows.iloc[0]
    regime = f"regime {first.regime!r}" + (f", mean(-g) = {first.decay:g}" if pd.notna(first.get("decay")) else "")
    return Finding(f"With {regime} and initial-state scale {first.h0_scale:g}, all {len(rows)} numbers of the "
                   f"report's rows {lens} are within {factor:g}x of the report (worst {worst:.2f}x): "
                   + "; ".join(parts) + ".", dict(worst_factor=worst, rows=nums))


def regime_fit_summary(fit: pd.DataFrame, factor: float = 2.0) -> Summary:
    """Which regimes of :func:`gdnlab.experiments.report_fit` match the report's table within ``factor``, and which
    comes closest. A summary, not a finding: it ranks whatever the grid holds and asserts only that the grid is not
    empty (the claim that one regime reproduces the report is :func:`reproduces_report`'s)."""
    if fit.empty:
        raise _fail("regime_fit_summary: empty fit", fit)
    per = (fit.groupby([fit.decay.fillna(-1.0), "h0_scale"], dropna=False)
           .agg(worst=("worst_factor", "first"), gate=("gate_decay", "first")).reset_index())
    per["decay"] = per.decay.where(per.decay >= 0)
    best = per.loc[per.worst.idxmin()]
    name = lambda r: (f"mean(-g) = {r.decay:g}" if pd.notna(r.decay) else f"the regime's own gate "
                      f"(mean(-g) = {r.gate:.2g})") + f", h0 scale {r.h0_scale:g}"
    ok = [name(r) for r in per.itertuples() if r.worst <= factor]
    far = [f"{name(r)}: worst {r.worst:.1f}x" for r in per.itertuples() if r.worst > factor]
    return Summary(f"Closest to the report of the {len(per)} regimes tried: {name(best)} (every number within "
                   f"{best.worst:.2f}x). Within {factor:g}x on all rows: {', '.join(ok) or 'none'}. "
                   f"Not within {factor:g}x: {'; '.join(far) or 'none'}.",
                   dict(best=name(best), worst_by_regime={name(r): float(r.worst) for r in per.itertuples()}))


def ratio_grows_with_chunks(sweep: pd.DataFrame, candidate: str = "fused_shipped", baseline: str = "two_kernel",
                            initial_state: bool = True, min_growth: float = 2.0) -> Finding:
    """The candidate/baseline max-error ratio at every chunk count >= 2 is above its 1-chunk value, and at the most
    chunks at least ``min_growth`` times it."""
    sub = _one_per_chunk_count(sweep[sweep.initial_state == initial_state])
    r = ratio_table(sub, candidate, baseline, by=("n_chunks",)).sort_values("n_chunks")
    ratios = dict(zip(r.n_chunks.astype(int), r.ratio.astype(float)))
    if 1 not in ratios or len(ratios) < 2:
        raise _fail("ratio_grows_with_chunks: need 1 chunk and more", ratios)
    r1, nmax = ratios[1], max(ratios)
    low = {n: v for n, v in ratios.items() if n > 1 and not v > r1}
    if low or not ratios[nmax] >= min_growth * r1:
        raise _fail(f"{candidate}/{baseline} ratio does not grow with chunk count "
                    f"(1 chunk {r1:.3g}; at or below it: {low}; at {nmax} chunks {ratios[nmax]:.3g}, "
                    f"needed >= {min_growth:g}x the 1-chunk ratio)", ratios)
    peak = max(ratios, key=ratios.get)
    n2 = min(n for n in ratios if n > 1)
    later = [v for n, v in ratios.items() if n > 1]
    h0 = "with" if initial_state else "without"
    return Finding(f"{h0.capitalize()} an initial state, the {candidate}/{baseline} max-error ratio is {_x(r1)} at 1 "
                   f"chunk, {_x(ratios[n2])} at {n2} chunks and {_x(ratios[nmax])} at {nmax} chunks "
                   f"({ratios[nmax] / r1:.3g}x the 1-chunk ratio). From {n2} chunks on it stays between "
                   f"{_x(min(later))} and {_x(max(later))} (largest at {peak} chunks).", dict(ratios=ratios))


def slow_gate_larger_ratio(grid: pd.DataFrame, candidate: str = "fused_shipped", baseline: str = "two_kernel",
                           min_factor: float = 2.0) -> Finding:
    """A slow gate shows the defect more: at every chunk count >= 2 the ratio at the slowest gate in the grid is at
    least ``min_factor`` times the ratio at the fastest (gate speed = measured mean(-g))."""
    r = ratio_table(_one_per_chunk_count(grid), candidate, baseline, by=("n_chunks",))
    table = r.pivot_table(index="gate_decay", columns="n_chunks", values="ratio")
    slow, fast = table.index.min(), table.index.max()
    cols = [n for n in table.columns if n >= 2]
    if not cols or slow == fast:
        raise _fail("slow_gate_larger_ratio: need two gate speeds and >= 2 chunks", table)
    bad = {n: (table.at[slow, n], table.at[fast, n]) for n in cols if not table.at[slow, n] >= min_factor * table.at[fast, n]}
    if bad:
        raise _fail(f"ratio at the slowest gate (mean(-g) {slow:.3g}) not >= {min_factor:g}x the fastest "
                    f"({fast:.3g}) at chunk counts {sorted(bad)}", table.round(3).to_dict())
    n = max(cols)
    by_gate = ", ".join(f"{_x(table.at[gd, n])} at mean(-g) {gd:.2g}" for gd in table.index)
    return Finding(f"The slower the gate, the larger the excess: at {n} chunks the {candidate}/{baseline} ratio is "
                   f"{by_gate}. At every chunk count from {min(cols)} to {n} the slowest gate's ratio is at least "
                   f"{min((table.at[slow, c] / table.at[fast, c]) for c in cols):.3g}x the fastest's.",
                   dict(table=table.round(4).to_dict()))


# ------------------------------------------------------------------------------------------ notebook 3: isolation

def final_state_bit_equal(iso: pd.DataFrame, candidate: str = "fused_shipped") -> Finding:
    """The candidate's final state equals the baseline's bit for bit in every case."""
    rows = iso[iso.backend == candidate]
    diffs = dict(zip(rows.case, rows.state_diff_vs_baseline.astype(float)))
    if rows.empty or any(d != 0.0 for d in diffs.values()):
        raise _fail(f"{candidate} final state differs from the baseline's", diffs)
    return Finding(f"{candidate}'s final state is bit-equal to the two-kernel path's in all {len(diffs)} cases "
                   f"(largest difference 0.0): the register-resident state carry is not where the error is.",
                   dict(state_diff=diffs))


def one_chunk_no_h0_exact(iso: pd.DataFrame, candidate: str = "fused_shipped") -> Finding:
    """With one chunk and no initial state (the inter-chunk term is zero) the candidate's output equals the
    baseline's exactly."""
    rows = iso[(iso.backend == candidate) & (iso.n_chunks == 1) & (~iso.initial_state.astype(bool))]
    diffs = dict(zip(rows.case, rows.output_diff_vs_baseline.astype(float)))
    if rows.empty or any(d != 0.0 for d in diffs.values()):
        raise _fail(f"{candidate} output not exactly the baseline's for 1 chunk without initial state", diffs)
    return Finding(f"One chunk without an initial state: {candidate}'s output is exactly the two-kernel path's "
                   f"(largest difference 0.0 in {', '.join(diffs)}).", dict(output_diff=diffs))


def excess_when_state_enters(iso: pd.DataFrame, candidate: str = "fused_shipped", baseline: str = "two_kernel",
                             min_ratio: float = 4.0) -> Finding:
    """In every case where a non-zero state enters a chunk (initial state, or a second chunk) the candidate's output
    error is at least ``min_ratio`` times the baseline's."""
    cases = iso[(iso.n_chunks > 1) | iso.initial_state.astype(bool)].case.unique()
    nums = {}
    for c in cases:
        e = iso[iso.case == c].set_index("backend").max_abs_err
        nums[c] = (float(e[baseline]), float(e[candidate]), float(e[candidate] / e[baseline]))
    bad = {c: v for c, v in nums.items() if not v[2] >= min_ratio}
    if not nums or bad:
        raise _fail(f"{candidate} error not >= {min_ratio:g}x {baseline}'s where the state enters: {bad}", nums)
    parts = "; ".join(f"{c}: {b:.2e} vs {f:.2e} ({_x(r)})" for c, (b, f, r) in nums.items())
    return Finding(f"Once a non-zero state enters a chunk, {candidate}'s output error is far above the two-kernel "
                   f"path's ({baseline} vs {candidate}): {parts}.", dict(errors=nums))


def bit_equal_to_baseline(df: pd.DataFrame, backend: str = "fused_fixed",
                          columns: Sequence[str] = ("output_diff_vs_baseline", "state_diff_vs_baseline")) -> Finding:
    """Every row of ``backend`` has a zero difference from the baseline in ``columns`` (those present)."""
    rows = df[df.backend == backend]
    cols = [c for c in columns if c in df.columns]
    if rows.empty or not cols:
        raise _fail(f"bit_equal_to_baseline: no {backend} rows or no difference columns", list(df.columns))
    worst = {c: float(rows[c].abs().max()) for c in cols}
    if any(v != 0.0 for v in worst.values()):
        raise _fail(f"{backend} is not bit-equal to the baseline", worst)
    what = " and ".join({"diff_vs_baseline": "output"}.get(c, c.replace("_diff_vs_baseline", "")) for c in cols)
    return Finding(f"{backend} is bit-equal to the two-kernel path ({what}) in all {len(rows)} rows "
                   f"(largest difference 0.0).", dict(worst=worst))


def compare_to_report(iso: pd.DataFrame, candidate: str = "fused_shipped", factor: float = 2.0) -> Summary:
    """How the candidate's isolation errors compare with the report's: for the cases whose report value is non-zero,
    measured / report, and which are within ``factor``. A summary, not a finding: the report ran other inputs on
    other hardware, so no agreement is asserted; only that there are cases to compare."""
    rows = iso[(iso.backend == candidate) & (iso.report_max_abs_err > 0)]
    if rows.empty:
        raise _fail(f"compare_to_report: no {candidate} rows with a report value", list(iso.backend.unique()))
    nums = {r.case: (float(r.max_abs_err), float(r.report_max_abs_err), float(r.max_abs_err / r.report_max_abs_err))
            for r in rows.itertuples()}
    inside = [c for c, v in nums.items() if 1 / factor <= v[2] <= factor]
    parts = "; ".join(f"{c}: {m:.2e} vs report {rep:.2e} ({f:.2f}x)" for c, (m, rep, f) in nums.items())
    return Summary(f"Against the report's isolation numbers ({candidate}): {parts}. Within {factor:g}x: "
                   f"{', '.join(inside) or 'none'}; not within: {', '.join(c for c in nums if c not in inside) or 'none'}.",
                   dict(ratios=nums))


# ---------------------------------------------------------------------------------------------- notebook 2: BV

def bv_does_not_matter(bv: pd.DataFrame, backend: str = "fused_shipped", max_spread: float = 1.5) -> Finding:
    """The backend's output error varies by less than ``max_spread``x across the BVs that ran.

    This holds by construction for the lab's kernels: BV only splits the V columns between programs, and no output
    element's reduction (over K in Q.h, over the chunk's rows in the intra-chunk term) crosses a V tile, so every
    element is computed by the same operations whatever BV is. It can fail only if a build changes how a dot is
    lowered at some BV (e.g. an FMA fallback for a small tile), which is what it guards against; it does not test
    the report's hypothesis that the excess is a tiling effect, which the kernels' structure already rules out."""
    rows = bv[(bv.backend == backend) & (bv.status == "ok")]
    errs = dict(zip(rows.BV.astype(int), rows.max_abs_err.astype(float)))
    if len(errs) < 2:
        raise _fail(f"bv_does_not_matter: fewer than two BVs ran for {backend}", errs)
    spread = max(errs.values()) / min(errs.values())
    if not spread < max_spread:
        raise _fail(f"{backend} error varies {spread:.3g}x across BV (limit {max_spread:g}x)", errs)
    base = bv[(bv.backend != backend) & (bv.status == "ok")]
    parts = ", ".join(f"BV={k}: {v:.3e}" for k, v in sorted(errs.items()))
    same = "identical" if spread == 1.0 else f"within {spread:.3g}x of each other"
    return Finding(f"{backend}'s output error is {same} across BV ({parts}); the two-kernel path's is "
                   f"{base.max_abs_err.min():.3e}. The excess does not depend on the V tiling.",
                   dict(errors=errs, spread=spread))


# ------------------------------------------------------------------------------------------ notebook 4: ablation

def intra_operand_explains(abl: pd.DataFrame, baseline: str = "two_kernel", tol: float = 1.25) -> Finding:
    """At every seq_len with an excess: fixing the intra-chunk operand alone (downcast kept) brings the error to the
    two-kernel level (within ``tol``x), removing the downcast alone does not (error stays within ``tol``x of the
    shipped kernel's), and with both changed the error is at the two-kernel level too."""
    nums: dict[int, dict[str, float]] = {}
    bad = []
    for n, g in abl.groupby("seq_len"):
        base = float(g[g.downcast.isna() & (g.backend == baseline)].max_abs_err.iloc[0])
        v = {(bool(r.downcast), r.intra_operand): (float(r.max_abs_err), float(r.diff_vs_baseline))
             for r in g[g.downcast.notna()].itertuples()}
        shipped, intra_only, down_only, both = v[(True, "U")], v[(True, "V_new")], v[(False, "U")], v[(False, "V_new")]
        nums[int(n)] = dict(two_kernel=base, shipped=shipped[0], intra_fixed=intra_only[0],
                            intra_fixed_diff=intra_only[1], downcast_off=down_only[0], both=both[0],
                            both_diff=both[1])
        if shipped[0] <= tol * base:
            continue  # no excess at this length (e.g. 1 chunk without an initial state)
        if not intra_only[0] <= tol * base:
            bad.append((n, "intra operand alone does not reach the two-kernel level"))
        if not down_only[0] >= shipped[0] / tol:
            bad.append((n, "removing the downcast alone changes the error by more than the tolerance"))
        if not both[0] <= tol * base:
            bad.append((n, "both switches together do not reach the two-kernel level"))
    if bad or not nums:
        raise _fail(f"intra_operand_explains: {bad}", nums)
    n = max(nums)
    x = nums[n]
    eq = "bit-identical to it" if x["intra_fixed_diff"] == 0 else f"max difference {x['intra_fixed_diff']:.2e}"
    return Finding(
        f"The intra-chunk operand explains the excess; the downcast does not. At seq_len {n}: as shipped "
        f"{x['shipped']:.2e} ({_x(x['shipped'] / x['two_kernel'])} the two-kernel {x['two_kernel']:.2e}); "
        f"V_new instead of U with the downcast kept: {x['intra_fixed']:.2e} ({eq}), "
        f"{_x(x['shipped'] / x['intra_fixed'])} lower; removing the downcast alone: {x['downcast_off']:.2e} "
        f"({x['downcast_off'] / x['shipped']:.3f}x the shipped error); both: {x['both']:.2e} (differs from the "
        f"two-kernel output by at most {x['both_diff']:.2e}). The same holds at every seq_len "
        f"{sorted(nums)} with an excess.", dict(by_seq_len=nums))


# --------------------------------------------------------------------------------------------------- candidate

def candidate_summary(sweep: pd.DataFrame, candidate: str, baseline: str = "two_kernel",
                      rule: float = 2.0) -> Finding:
    """Where a candidate kernel stands against the baseline (a measurement, not a claim: nothing is asserted about an
    unknown kernel): at how many (seq_len, initial state) points its max error is within ``rule``x the baseline's
    (FlashAttention's rule)."""
    r = ratio_table(sweep, candidate, baseline)
    within = int((r.ratio <= rule).sum())
    worst = r.loc[r.ratio.idxmax()]
    return Finding(f"{candidate}: max error within {rule:g}x of {baseline}'s at {within} of {len(r)} points; worst "
                   f"{_x(float(worst.ratio))} at seq_len {int(worst.seq_len)} "
                   f"({'with' if worst.initial_state else 'without'} initial state).",
                   dict(within=within, points=len(r), worst=float(worst.ratio)))



#: The lab's own kernel known to be defective: its verdict must FAIL (any other candidate's must PASS).
KNOWN_DEFECTIVE = ("fused_shipped",)


def candidate_verdict(v: Any) -> Finding:
    """Assert a candidate's :class:`gdnlab.verdict.Verdict`: a kernel the lab knows to be defective
    (:data:`KNOWN_DEFECTIVE`) must fail it, any other kernel must pass it. The sentence names every failed check."""
    expect_pass = v.backend not in KNOWN_DEFECTIVE
    failed = list(dict.fromkeys(c.check for c in v.failures))
    nums = dict(ok=v.ok, failed=failed, checks=len(v.checks))
    if v.ok != expect_pass:
        want = "pass" if expect_pass else "fail (the lab's known-defective kernel)"
        raise _fail(f"candidate {v.backend} was expected to {want} its verdict: {v.summary()}", nums)
    if v.ok:
        return Finding(f"Verdict on the candidate {v.backend}: PASS, all {len(v.checks)} conformance checks "
                       f"(`gdnlab check --backend {v.backend}`).", nums)
    reasons = "; ".join(f"{c.check} [{c.case}]: {c.reason}" for c in v.failures[:3])
    return Finding(f"Verdict on the candidate {v.backend}: FAIL, as expected of the shipped kernel: "
                   f"{len(v.failures)} of {len(v.checks)} checks fail ({', '.join(failed)}). First: {reasons}.", nums)


def candidate_isolation(iso: pd.DataFrame, candidate: str, baseline: str = "two_kernel") -> Finding:
    """The candidate's isolation errors next to the baseline's, case by case (a measurement: the verdict asserts)."""
    nums = {}
    for c in iso.case.unique():
        e = iso[iso.case == c].set_index("backend")
        if candidate in e.index and baseline in e.index:
            nums[c] = (float(e.max_abs_err[baseline]), float(e.max_abs_err[candidate]),
                       float(e.state_max_abs_err[baseline]), float(e.state_max_abs_err[candidate]))
    if not nums:
        raise _fail(f"candidate_isolation: no rows for {candidate} and {baseline}", list(iso.backend.unique()))
    parts = "; ".join(f"{c}: output {b:.2e} vs {k:.2e}, state {sb:.2e} vs {sk:.2e}"
                      for c, (b, k, sb, sk) in nums.items())
    return Finding(f"Measured, candidate {candidate} against {baseline} ({baseline} vs {candidate}): {parts}.",
                   dict(errors=nums))


def bv8_by_release(rel: pd.DataFrame, kernel: str = "fused_shipped", target: str = "hip:gfx1151") -> Finding:
    """What each Triton release does with the fused kernel at BV = 8 on ``target`` (the report's gfx1151): asserts
    that some release rejects it (the report's failure) and that BV >= 16 builds on matrix instructions in every
    release tried."""
    from gdnlab import compile_matrix as cm
    from gdnlab.dot_shapes import _vkey
    piv = cm.legality_pivot(rel, kernel, by=["target", "release"])
    piv.columns = [int(float(c)) for c in piv.columns]
    if target not in piv.index.get_level_values(0) or 8 not in piv.columns:
        raise _fail(f"bv8_by_release: no BV=8 builds of {kernel} on {target}", piv)
    t = piv.loc[target]
    by = {r: str(t.at[r, 8]) for r in sorted(t.index, key=_vkey)}
    wide = {(tg, r): str(v) for (tg, r), row in piv.iterrows() for bv, v in row.items() if bv >= 16 and v != "MATRIX"}
    if "REJECTED" not in by.values() or wide:
        raise _fail(f"bv8_by_release: expected some release to reject BV=8 on {target} and BV>=16 on matrix "
                    f"instructions everywhere", dict(bv8=by, not_matrix=wide))
    groups: list[tuple[str, list[str]]] = []
    for r, v in by.items():
        if groups and groups[-1][0] == v:
            groups[-1][1].append(r)
        else:
            groups.append((v, [r]))
    words = {"REJECTED": "rejected at build (the report's failure)", "FMA": "built with its 8-wide dots as FMA loops "
             "(no matrix instruction: silently different numerics)", "FMA+ERRMSG": "built as FMA loops while printing "
             "the report's error message", "MATRIX": "built on matrix instructions"}
    parts = "; ".join(f"Triton {rs[0]}{'-' + rs[-1] if len(rs) > 1 else ''}: {words.get(v, v)}" for v, rs in groups)
    return Finding(f"BV = 8 on {target} ({kernel}): {parts}. BV = 16, 32 and 64 build on matrix instructions on every "
                   f"target and release tried, so restricting the autotune list to BV >= 16 (as the report did) is "
                   f"the portable choice.", dict(bv8=by))
